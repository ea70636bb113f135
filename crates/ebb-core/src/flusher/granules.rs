//! Write granules (ebb's own, for object stores; knobs `write_granule_bytes` and
//! `write_granule_group`): a backend that stores a file in pieces it can only replace whole,
//! such as an S3 multipart upload's parts, declares the pieces, and the chunk selection
//! ([`take_runs`]) cuts runs at their ends instead of at `max_write_pages` and the chunk's
//! end, and sends a piece's dirty pages in one write however scattered they are, so that a
//! piece is written once. Background and periodic work
//! also leave the file's last granule alone while it is partly dirty and the file was written
//! within `dirty_expire_centisecs`: it is where a sequential writer is still writing, and
//! writing it now would mean writing it again when it fills. Two bounds keep this safe: a
//! deferred tail is at most the background threshold divided by twice the number of dirty
//! files of granular backends (so the tails together never keep background writeback from
//! reaching the threshold, and a small cache writes its tails as the kernel would), and
//! fsync, sync, close, reclaim, a file idle past the expire interval and a file retrying a
//! failed write write the tail like any page. While writers wait for the granule gate (`engine::throttle::gate`), a file that is
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

/// The flusher's chunk selection: the next write a submitter sends from its position, as
/// runs of pages. Without write granules it is one run of up to `max` pages (the backend's
/// largest write, and what is left of the chunk). On a backend with write granules it is
/// every dirty page from the first one to its granule's end, however far that is, as one run
/// per stretch of dirty pages: a granule with scattered dirty pages goes out as ONE write (the
/// backend replaces the granule once, filling the clean pages between the runs from what it
/// holds), not as one write per stretch, each of which would replace the granule again (on
/// S3, a commit of the whole object per stretch). With a `tail_budget` the file's last
/// granule waits while it is partly dirty and no larger than the budget (module doc).
pub(crate) fn take_runs(
    m: &mut crate::pagemap::PageMap,
    backend: &crate::config::BackendConfig,
    sub: &Submitter,
    max: u64,
    tail_budget: Option<TailBudget>,
) -> Option<Vec<crate::pagemap::Run>> {
    let (tagged, skip) = (sub.tagged_only, sub.skip_held);
    let first = m.next_writeback(sub.next_index, tagged, skip)?;
    let Some(granule) = backend.granule_of(first) else {
        return m.start_writeback(first, max, tagged, skip).map(|run| vec![run]);
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
    let mut runs = Vec::new();
    let mut from = first;
    while from < granule.end
        && let Some(next) = m.next_writeback(from, tagged, skip).filter(|&p| p < granule.end)
        && let Some(run) = m.start_writeback(next, granule.end - next, tagged, skip)
    {
        from = run.end();
        runs.push(run);
    }
    (!runs.is_empty()).then_some(runs)
}
