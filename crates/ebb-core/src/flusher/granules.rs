//! Write granules (ebb's own, for object stores; knobs `write_granule_bytes` and
//! `write_granule_group`): a backend that stores a file in pieces it can only replace whole,
//! such as an S3 multipart upload's parts, declares the pieces, and the chunk selection
//! ([`take_run`]) cuts runs at their ends instead of at `max_write_pages` and the chunk's end,
//! so that a piece goes out in one write and is written once. Background and periodic work
//! also leave the file's last granule alone while it is partly dirty and the file was written
//! within `dirty_expire_centisecs`: it is where a sequential writer is still writing, and
//! writing it now would mean writing it again when it fills. Two bounds keep this safe: a
//! deferred tail is at most the background threshold divided by twice the number of dirty
//! files of granular backends (so the tails together never keep background writeback from
//! reaching the threshold, and a small cache writes its tails as the kernel would), and
//! fsync, sync, close, reclaim and a file idle past the expire interval write the tail like
//! any page. While writers wait for the granule gate (`engine::throttle::gate`), a file that is
//! not admitted cannot grow past its writer's next check, so its tail is measured by what it
//! holds so far rather than by its granule: the small tails of waiting writers stay in the
//! cache instead of going out as short parts. A whole dirty granule, on the other hand, waits
//! for nothing: while the backend holds one beyond the granules being filled, background
//! writeback runs below the background threshold too (`Engine::whole_granules_dirty`), so the
//! backend's request slots stay busy with whole pieces (write-behind).

use super::Submitter;

/// How large a file's last granule may be for the flusher's current work to leave it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TailBudget {
    /// A file the granule gate admitted: its last granule waits while partly dirty, and so
    /// does the granule ending at this page while its writer has not reached that end (its
    /// last page may be dirty, yet only partly written: a request that ends inside a page
    /// leaves the page's rest to the next one, and a granule written before it arrives is
    /// written again for one page).
    Filling(u64),
    /// The whole granule is at most this many pages (the tail may fill it).
    Granule(u64),
    /// The granule's pages up to the file's last dirty one are at most this many (nobody may
    /// fill it without passing the granule gate first).
    Extent(u64),
}

/// The flusher's chunk selection: the next run a submitter writes from its position, up to
/// `max` pages (the backend's largest write, and what is left of the chunk). On a backend
/// with write granules a run ends at its granule's end instead, however far that is, and with
/// a `tail_budget` the file's last granule waits while it is partly dirty and no larger than
/// the budget (module doc).
pub(crate) fn take_run(
    m: &mut crate::pagemap::PageMap,
    backend: &crate::config::BackendConfig,
    sub: &Submitter,
    max: u64,
    tail_budget: Option<TailBudget>,
) -> Option<crate::pagemap::Run> {
    let (tagged, skip) = (sub.tagged_only, sub.skip_held);
    let first = m.next_writeback(sub.next_index, tagged, skip)?;
    let Some(granule) = backend.granule_of(first) else {
        return m.start_writeback(first, max, tagged, skip);
    };
    if let Some(budget) = tail_budget
        && let Some(last) = m.last_dirty()
        && granule.contains(&last)
        && match budget {
            TailBudget::Filling(end) => last + 1 < granule.end || granule.end == end,
            TailBudget::Granule(pages) => {
                last + 1 < granule.end && granule.end - granule.start <= pages
            }
            TailBudget::Extent(pages) => {
                last + 1 < granule.end && last + 1 - granule.start <= pages
            }
        }
    {
        return None;
    }
    m.start_writeback(first, granule.end - first, tagged, skip)
}
