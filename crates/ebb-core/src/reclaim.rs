//! Frame allocation and reclaim of clean pages (docs/reclaim.md).
//!
//! Allocations take frames while free memory stays above the `min` watermark. Below `low`,
//! background reclaim (kswapd's role) frees pages from the tail of the inactive list until
//! `high`; when an allocation still finds nothing, the allocating writer reclaims directly.
//! Reclaim frees only clean pages. A dirty page at the tail is handled by policy:
//!
//! - `flusher-only` (default, v3.2 and later): it is marked `RECLAIM` and activated (out of
//!   the way until cleaned); when a batch of `SWAP_CLUSTER_MAX` finds only dirty pages the
//!   flushers are woken. Direct reclaim never writes. Background reclaim writes a page itself
//!   only when in trouble: the page was already marked once (seen twice at the tail) and its
//!   last whole pass found only unqueued dirty file pages (the kernel's `PGDAT_DIRTY` rule).
//! - `legacy` (before v3.2): both kinds of reclaim write the dirty page themselves, one page
//!   per write (`pageout`), and mark it so it is freed when the write completes; pages it
//!   leaves stay on the inactive list. Direct reclaim that scanned more than 1.5 times the pages
//!   it wanted wakes the flushers to write as many pages as it scanned (2.6.3x-3.x
//!   `do_try_to_free_pages`, docs/mechanisms.md#6-reclaim); the batch rules above see only
//!   the dirty pages legacy reclaim could not write.
//!
//! Referenced dirty pages (docs/mechanisms.md#6-reclaim, `PAGEREF_RECLAIM_CLEAN`, in the kernel
//! since 2.6.34): every examination of a dirty page at the tail tests and clears its referenced bit,
//! and a page that reclaim would write (any under `legacy`; under `flusher-only` only one
//! background reclaim may write, above) but that was referenced is kept for another trip round
//! the inactive list instead. Writes set the bit: the 2.6.x-3.x buffered write path
//! (`generic_perform_write`) calls `mark_page_accessed` on each page it copies into, so a page
//! written once reaches the tail referenced and is written by reclaim only if it is still dirty
//! on its second trip. (The kernel activates a page accessed a second time while on the LRU; the
//! model does not, and the workloads here write each page once.) Clean pages are freed whether
//! referenced or not (unmapped page cache, `PAGEREF_RECLAIM_CLEAN` again).
//!
//! Throttling (docs/mechanisms.md#6-reclaim): when kswapd finds pages under writeback a second
//! time it
//! stops scanning for HZ/10 or until `SWAP_CLUSTER_MAX` pages have been written (`WRITEBACK`;
//! under both policies, as 2.6.3x kswapd napped HZ/10 in `congestion_wait` when failing); with
//! `flusher-only` (the posting's patch 6), when a direct reclaim pass found only such pages and
//! write-pending pages are more than half of the file LRU, the allocating writer sleeps one
//! jiffy (`CONGESTED`). An allocation that still finds no frame waits until a completion frees
//! memory. Watermarks split the work: an allocation below `low` runs kswapd up to `high`, and
//! one that would go below `min` reclaims directly.
//!
//! Pages under writeback or unstable are marked and rotated; a page whose writeback completes
//! while marked is moved to the tail so the next scan frees it at once.
//!
//! kswapd runs over virtual time, as the kernel's thread does (`Config::kswapd_scan_ns`, the CPU
//! time per page scanned, default 2 us: an assumption, not from the postings; 0 restores an
//! instantaneous kswapd that balances every zone in the event that wakes it). An allocation that
//! finds no zone of its zonelist above `low` plus reserve wakes it; its first batch comes one
//! batch's time (`SWAP_CLUSTER_MAX` pages) later. Each batch (an [`Event::Timer`]) shrinks every
//! zone it balances by at most `SWAP_CLUSTER_MAX` pages, and the next batch follows after
//! `pages scanned * kswapd_scan_ns`, or at the end of its WRITEBACK throttle, or after HZ/10
//! when it could scan nothing; once every zone is at `high` it sleeps. Meanwhile writers keep
//! allocating, down to `min`, and reclaim directly below it. Direct reclaim itself costs no
//! time (the allocating writer's CPU is not modelled): only its throttles and waits do.
//!
//! [`Event::Timer`]: crate::Event::Timer
//!
//! Anonymous memory (a workload's mappings, [`Engine::anon_fault`](crate::Engine::anon_fault)) competes for the same frames.
//! With a swap backend (`Config::swap_backend`) reclaim swaps it out under both policies (there
//! is no flusher for anonymous pages, so even direct reclaim writes them, as in the kernel):
//! each pass scans anonymous and file pages in the proportion of the 2.6.3x-3.x
//! `get_scan_count`, with swappiness 60:
//!
//! ```text
//! ap = (60 + 1)  * (recent_scanned[anon] + 1) / (recent_rotated[anon] + 1)
//! fp = (140 + 1) * (recent_scanned[file] + 1) / (recent_rotated[file] + 1)
//! anon share of the scan = A * ap / (A * ap + F * fp)     A, F: list sizes in pages
//! ```
//!
//! New anonymous pages count as scanned and rotated (they start active in the kernel); a file
//! page added counts as scanned; a file page reclaim leaves on the list (dirty, under
//! writeback) counts as rotated, so skipping dirty pages shifts the scan towards swap (the
//! posting's mmap-strm observation). Each list's pair is halved once its scanned count passes a
//! quarter of the list. When free plus file pages are under the high watermark only anonymous
//! pages are scanned. Swap-outs of one pass go as writes of up to `SWAP_CLUSTER_MAX` pages to
//! consecutive swap slots (the kernel allocates swap in clusters, so its single-page writes
//! merge in the elevator). A page written to swap is freed by the next pass (immediate reclaim).
//! Not modelled: page-table referenced bits (an anonymous page is never found referenced and
//! reactivated) and swap-in (workloads never read back what they wrote to anonymous memory).
//!
//! Zones (`memory`; one by default, where everything below reduces to a single pool). An
//! allocation's class is the highest zone; it takes frames from the highest zone first and
//! falls back to lower ones (the zonelist), each down to its `min` watermark plus the lowmem
//! reserve for the class. kswapd is woken when the zones together cannot serve the request above
//! their `low` watermarks (plus reserve), or when some zone is under `low` on a later wake; it
//! then balances every zone up to the highest unbalanced one (`end_zone`, 2.6.3x-3.x
//! `balance_pgdat`): each zone below `high + reserve[end_zone]` is shrunk from its own LRU by the
//! difference (one batch at a time, above). Direct reclaim shrinks the zones of the allocation,
//! highest first, until the request is met. Because kswapd lags the allocator, the preferred
//! zone is drained and reclaimed directly more often than the others (the imbalance the 3.12
//! fair zone allocator's commit describes). Not modelled: kswapd's `balance_gap`, its priority
//! loop (`lru_size >> priority` per pass: here a fixed batch), and per-zone
//! `recent_scanned`/`recent_rotated` (one pair for all zones).
//!
//! Stalls: a writer that finds no frame even after direct reclaim waits for memory; the number
//! of such waits and their total time are counted (`Stats::reclaim_stalls`,
//! `Stats::reclaim_stall_ns`).
//!
//! This module owns reclaim's state ([`ReclaimState`]: the recent scan counts, swap-outs in
//! flight, stalled writers, the throttles, kswapd's schedule) and its per-page decisions; the
//! engine drives it (`engine/reclaim.rs`, `engine/kswapd.rs`) over its LRU lists and page maps.

use std::collections::BTreeMap;

use crate::config::ReclaimPolicy;
use crate::ids::{IoId, WriterId};
use crate::memory::List;
use crate::time::{Duration, Instant};

/// Pages reclaim isolates per batch (the kernel's `SWAP_CLUSTER_MAX`).
pub(crate) const SWAP_CLUSTER_MAX: u64 = 32;

/// The inode named by the [`crate::Action::Write`] of a swap-out: its run's first page is the swap
/// slot.
pub const SWAP_INODE: crate::ids::InodeId = crate::ids::InodeId(u64::MAX);

/// Swappiness (kernel default 60): the anonymous weight is `SWAPPINESS`, the file weight
/// `200 - SWAPPINESS`.
const SWAPPINESS: u64 = 60;

/// `reclaim_throttle(WRITEBACK)` timeout: HZ/10 (docs/mechanisms.md#6-reclaim).
pub(crate) const WRITEBACK_THROTTLE: Duration = Duration::from_millis(100);

/// Reclaim's own state, apart from the LRU lists.
#[derive(Default)]
pub(crate) struct ReclaimState {
    /// `[anon, file]` pages scanned and rotated recently (`zone_reclaim_stat`).
    recent_scanned: [u64; 2],
    recent_rotated: [u64; 2],
    /// Swap-out writes in flight: io -> (zone, pages).
    swap_ios: BTreeMap<IoId, (usize, u64)>,
    /// Anonymous pages written to swap, ever.
    swap_written: u64,
    /// Next swap slot; wraps at the swap size.
    swap_next: u64,
    /// Writers waiting for memory, since when.
    stalled_since: BTreeMap<WriterId, Instant>,
    /// kswapd is throttled until this instant or until pages written pass the count.
    kswapd_throttled: Option<(Instant, u64)>,
    /// The direct reclaim just done found the LRU congested: the allocating writer sleeps.
    direct_throttle: Option<Instant>,
    /// kswapd is awake (timed mode, `Config::kswapd_scan_ns` > 0): its next batch runs then.
    kswapd_at: Option<Instant>,
}

impl ReclaimState {
    /// File pages were added to the LRU: they count as scanned.
    pub(crate) fn file_added(&mut self, pages: u64) {
        self.recent_scanned[1] += pages;
    }

    /// New anonymous pages start on the active list: scanned and rotated.
    pub(crate) fn anon_added(&mut self, pages: u64) {
        self.recent_scanned[0] += pages;
        self.recent_rotated[0] += pages;
    }

    /// A pass scanned `pages` file pages.
    pub(crate) fn file_scanned(&mut self, pages: u64) {
        self.recent_scanned[1] += pages;
    }

    /// A file page reclaim met stays on the lists (dirty, under writeback): rotated.
    pub(crate) fn file_rotated(&mut self) {
        self.recent_rotated[1] += 1;
    }

    /// Halves a list's recent counts once its scanned count passes a quarter of the list;
    /// `sizes`: the anonymous and the file pages.
    pub(crate) fn age(&mut self, sizes: [u64; 2]) {
        for (i, size) in sizes.into_iter().enumerate() {
            if self.recent_scanned[i] > size / 4 {
                self.recent_scanned[i] /= 2;
                self.recent_rotated[i] /= 2;
            }
        }
    }

    /// How many of `budget` pages a pass scans from `anon` anonymous pages beside `file` file
    /// pages, in the proportion of `get_scan_count` (module doc).
    pub(crate) fn anon_share(&self, anon: u64, file: u64, budget: u64) -> u64 {
        let ap = u128::from(SWAPPINESS + 1) * u128::from(self.recent_scanned[0] + 1)
            / u128::from(self.recent_rotated[0] + 1);
        let fp = u128::from(200 - SWAPPINESS + 1) * u128::from(self.recent_scanned[1] + 1)
            / u128::from(self.recent_rotated[1] + 1);
        let a = u128::from(anon) * ap;
        let f = u128::from(file) * fp;
        let share = (u128::from(budget) * a).div_ceil((a + f).max(1)) as u64;
        share.min(anon).min(budget)
    }

    /// A new allocation: the throttle an earlier direct reclaim set no longer applies.
    pub(crate) fn clear_direct_throttle(&mut self) {
        self.direct_throttle = None;
    }

    /// Direct reclaim found the LRU congested: the allocating writer sleeps until `until`.
    pub(crate) fn throttle_direct(&mut self, until: Instant) {
        self.direct_throttle = Some(until);
    }

    /// The direct reclaim throttle's end, taken, if it is not past at `now`.
    pub(crate) fn take_direct_throttle(&mut self, now: Instant) -> Option<Instant> {
        self.direct_throttle.take().filter(|&until| until >= now)
    }

    /// Writer `w` waits for memory from `now`.
    pub(crate) fn stall(&mut self, w: WriterId, now: Instant) {
        self.stalled_since.insert(w, now);
    }

    /// Writer `w` no longer waits: since when it waited, if it did.
    pub(crate) fn forget(&mut self, w: WriterId) -> Option<Instant> {
        self.stalled_since.remove(&w)
    }

    /// A swap-out write `io` of up to `pages` pages from zone `z` to a swap of `slots` slots:
    /// the consecutive slots it writes (wrapping to 0 when the swap's end is reached), as
    /// (first slot, pages).
    pub(crate) fn swap_slots(&mut self, io: IoId, z: usize, pages: u64, slots: u64) -> (u64, u64) {
        if self.swap_next + pages > slots {
            self.swap_next = 0;
        }
        let n = pages.min(slots);
        let first = self.swap_next;
        self.swap_next += n;
        self.swap_ios.insert(io, (z, n));
        (first, n)
    }

    /// Whether `io` is a swap-out write.
    pub(crate) fn is_swap_io(&self, io: IoId) -> bool {
        self.swap_ios.contains_key(&io)
    }

    /// Whether swap-out writes are in flight.
    pub(crate) fn swapping(&self) -> bool {
        !self.swap_ios.is_empty()
    }

    /// The swap-out write `io` completed (`ok`: it succeeded): its zone and pages.
    pub(crate) fn swap_done(&mut self, io: IoId, ok: bool) -> (usize, u64) {
        let (z, pages) = self.swap_ios.remove(&io).expect("a swap io");
        if ok {
            self.swap_written += pages;
        }
        (z, pages)
    }

    /// Anonymous pages written to swap, ever.
    pub(crate) fn swap_written(&self) -> u64 {
        self.swap_written
    }

    /// When the awake kswapd runs its next batch (timed mode).
    pub(crate) fn kswapd_at(&self) -> Option<Instant> {
        self.kswapd_at
    }

    /// kswapd's next batch runs at `at`.
    pub(crate) fn kswapd_schedule(&mut self, at: Instant) {
        self.kswapd_at = Some(at);
    }

    /// Every zone is balanced: kswapd sleeps, unthrottled.
    pub(crate) fn kswapd_sleep(&mut self) {
        self.kswapd_at = None;
        self.kswapd_throttled = None;
    }

    /// kswapd's WRITEBACK throttle: until `until`, or until `SWAP_CLUSTER_MAX` pages more than
    /// `written` have been written.
    pub(crate) fn kswapd_throttle(&mut self, until: Instant, written: u64) {
        self.kswapd_throttled = Some((until, written));
    }

    /// kswapd's throttle, if any: (until, pages written when it began).
    pub(crate) fn kswapd_throttled(&self) -> Option<(Instant, u64)> {
        self.kswapd_throttled
    }

    /// kswapd's throttle ends.
    pub(crate) fn kswapd_unthrottle(&mut self) {
        self.kswapd_throttled = None;
    }
}

/// What one reclaim pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shrink {
    pub(crate) scanned: u64,
    pub(crate) reclaimed: u64,
    pub(crate) unqueued_dirty: u64,
    pub(crate) writeback: u64,
    /// Pages under writeback found a second time (already marked): the kernel's
    /// `nr_immediate` (kswapd) and `nr_congested`.
    pub(crate) immediate: u64,
}

impl Shrink {
    /// Adds another pass's counts.
    pub(crate) fn add(&mut self, other: Shrink) {
        self.scanned += other.scanned;
        self.reclaimed += other.reclaimed;
        self.unqueued_dirty += other.unqueued_dirty;
        self.writeback += other.writeback;
        self.immediate += other.immediate;
    }
}

/// What reclaim does with a dirty page at the inactive tail ([`dirty_page`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirtyPage {
    /// Reclaim would write it, but it was referenced: another trip round the inactive list.
    Keep,
    /// Write it (`pageout`).
    Write,
    /// Leave it for the flusher.
    Leave,
}

/// The policy for a dirty page at the inactive tail (module doc): under `legacy` any reclaim
/// writes it, under `flusher-only` only background reclaim (not `direct`) that has seen it
/// before (`seen_before`: marked `RECLAIM`) while the node is flagged (`node_dirty`); never a
/// `held` page; and a `referenced` page it would write is kept instead.
pub(crate) fn dirty_page(
    policy: ReclaimPolicy,
    direct: bool,
    seen_before: bool,
    node_dirty: bool,
    held: bool,
    referenced: bool,
) -> DirtyPage {
    let may_write = !held
        && match policy {
            ReclaimPolicy::Legacy => true,
            ReclaimPolicy::FlusherOnly => !direct && seen_before && node_dirty,
        };
    match (may_write, referenced) {
        (true, true) => DirtyPage::Keep,
        (true, false) => DirtyPage::Write,
        (false, _) => DirtyPage::Leave,
    }
}

/// Where a dirty or writeback page reclaim leaves goes: `flusher-only` activates it (out of
/// the way until the flusher has cleaned it, docs/mechanisms.md#6-reclaim); `legacy` (2.6.3x)
/// keeps it at the head of the inactive list, as does a page it has just written itself.
pub(crate) fn skipped_list(policy: ReclaimPolicy, written: bool) -> List {
    match policy {
        ReclaimPolicy::FlusherOnly if !written => List::Active,
        _ => List::Inactive,
    }
}
