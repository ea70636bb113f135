//! The memory budget: zones, frames, watermarks and the file LRU lists
//! (docs/mechanisms.md#6-reclaim).
//!
//! Every page the cache holds occupies one frame of a fixed budget (`Config::memory_bytes`),
//! so the cache can never exceed it. Anonymous memory of the workload (simulator) shares the
//! same budget, and so does the state of the files the cache knows (the kernel's inode and
//! dentry slab: `engine/forget.rs`). Resident frames sit on an inactive or an active list, linked through the frame
//! table (an intrusive doubly linked list, O(1) per move); reclaim scans the inactive tail.
//!
//! Zones (the 2.6/3.x kernel's `struct zone`, before LRUs moved to the node in 4.8): memory is
//! split by physical address at `Config::zone_bounds_bytes` (x86-64: DMA below 16 MiB, DMA32
//! below 4 GiB, Normal above). Every zone has its own free pages, anonymous pages, LRU lists and
//! watermarks; a frame belongs to one zone for life. With no bounds (the default) there is one
//! zone and everything behaves as a single pool. Zone `i` is higher than zone `i - 1`;
//! allocations prefer the highest zone (the policy lives in `reclaim`).
//!
//! Watermarks follow the kernel: `min_free_kbytes = clamp(sqrt(16 * memory_kbytes), 128,
//! 262144)`, split over the zones in proportion to their pages (`__setup_per_zone_wmarks`);
//! per zone `gap = max(min / 4, pages * watermark_scale_factor / 10000)`, `low = min + gap`,
//! `high = min + 2 * gap`. Below `low` background reclaim runs until `high`; an allocation that
//! would go below `min` reclaims directly.
//!
//! Lowmem reserve (`setup_per_zone_lowmem_reserve`): an allocation that could have used zone
//! `c` but falls back to a lower zone `z` must leave `reserve[z][c] = pages(z+1 ..= c) / 256`
//! pages free there on top of the watermark (the x86-64 `lowmem_reserve_ratio` of DMA and DMA32
//! is 256), so that lower zones keep room for the allocations only they can serve.

use crate::config::Config;
use crate::ids::{FrameId, InodeId};

const NIL: u32 = u32::MAX;

/// `lowmem_reserve_ratio` of the lower zones on x86-64 (DMA and DMA32: 256).
const LOWMEM_RESERVE_RATIO: u64 = 256;

/// Which LRU list a frame is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum List {
    /// Not on a list (free, in a writer's reserve, or not yet added).
    None,
    /// Candidates for reclaim; scanned from the tail.
    Inactive,
    /// Recently used; aged into the inactive list when it grows too small.
    Active,
}

#[derive(Clone, Copy)]
struct FrameMeta {
    inode: u64,
    index: u64,
    prev: u32,
    next: u32,
    list: List,
    zone: u8,
}

#[derive(Clone, Copy)]
struct ListHead {
    head: u32,
    tail: u32,
    len: u64,
}

const EMPTY_LIST: ListHead = ListHead { head: NIL, tail: NIL, len: 0 };

/// The three watermarks, in pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Watermarks {
    /// Below this, allocations reclaim directly.
    pub min: u64,
    /// Below this, background reclaim starts.
    pub low: u64,
    /// Background reclaim stops here.
    pub high: u64,
}

impl Watermarks {
    /// The kernel's watermarks for `config`, all zones together.
    pub(crate) fn for_config(config: &Config) -> Watermarks {
        Watermarks::per_zone(config).into_iter().fold(Watermarks::default(), |a, w| Watermarks {
            min: a.min + w.min,
            low: a.low + w.low,
            high: a.high + w.high,
        })
    }

    /// The watermarks of each zone of `config`, lowest zone first.
    pub(crate) fn per_zone(config: &Config) -> Vec<Watermarks> {
        let pages = config.memory_pages();
        let kbytes = pages * 4;
        let min_kbytes =
            config.min_free_kbytes.unwrap_or_else(|| isqrt(kbytes * 16).clamp(128, 262_144));
        let min_total = (min_kbytes / 4).min(pages / 4);
        zone_pages(config)
            .into_iter()
            .map(|zp| {
                let min =
                    (u128::from(min_total) * u128::from(zp) / u128::from(pages.max(1))) as u64;
                let gap = (min / 4).max(zp * u64::from(config.watermark_scale_factor) / 10_000);
                Watermarks { min, low: min + gap, high: min + 2 * gap }
            })
            .collect()
    }
}

/// The pages of each zone of `config`, lowest first: the bounds that fall inside memory cut it,
/// the rest is the highest zone (as `mem=` trims the zones above the end of memory).
pub(crate) fn zone_pages(config: &Config) -> Vec<u64> {
    let total = config.memory_pages();
    let mut out = Vec::new();
    let mut prev = 0;
    for &bound in &config.zone_bounds_bytes {
        let b = bound / crate::config::PAGE_SIZE;
        if b >= total {
            break;
        }
        out.push(b - prev);
        prev = b;
    }
    out.push(total - prev);
    out
}

struct Zone {
    pages: u64,
    free_ids: Vec<u32>,
    /// Frames handed out (resident, reserved by writers, or in flight to the LRU).
    allocated: u64,
    /// Resident anonymous pages (including those being swapped out or already written).
    anon: u64,
    /// Anonymous pages whose swap-out write is in flight.
    anon_writeback: u64,
    /// Anonymous pages written to swap, waiting for the next reclaim pass to free them.
    anon_swapped: u64,
    /// Pages charged for the state of the files the cache knows ([`Memory::charge_files`]).
    files: u64,
    lists: [ListHead; 2],
    wmark: Watermarks,
    /// `reserve[c]`: pages an allocation of class `c` leaves free here (lowmem reserve).
    reserve: Vec<u64>,
}

/// Zones, frames and LRU lists.
pub(crate) struct Memory {
    total: u64,
    frames: Vec<FrameMeta>,
    zones: Vec<Zone>,
    /// Anonymous pages the workload holds, resident or in swap (what it will free).
    anon_owned: u64,
    /// The workload's anonymous memory was charged beyond memory ([`Memory::add_anon`]): the
    /// cache's frames and anonymous memory together exceed the total until frees and reclaim
    /// bring them back under it (the cache allocates nothing meanwhile: no zone has free pages).
    overcommitted: bool,
    /// The watermarks of all zones together.
    pub(crate) wmark: Watermarks,
}

impl Memory {
    pub(crate) fn new(config: &Config) -> Memory {
        let sizes = zone_pages(config);
        let wmarks = Watermarks::per_zone(config);
        let n = sizes.len();
        let zones = (0..n)
            .map(|z| Zone {
                pages: sizes[z],
                free_ids: Vec::new(),
                allocated: 0,
                anon: 0,
                anon_writeback: 0,
                anon_swapped: 0,
                files: 0,
                lists: [EMPTY_LIST; 2],
                wmark: wmarks[z],
                reserve: (0..n)
                    .map(|c| {
                        if c <= z {
                            0
                        } else {
                            sizes[z + 1..=c].iter().sum::<u64>() / LOWMEM_RESERVE_RATIO
                        }
                    })
                    .collect(),
            })
            .collect();
        Memory {
            total: config.memory_pages(),
            frames: Vec::new(),
            zones,
            anon_owned: 0,
            overcommitted: false,
            wmark: Watermarks::for_config(config),
        }
    }

    /// The number of zones.
    pub(crate) fn zones(&self) -> usize {
        self.zones.len()
    }

    /// The highest zone: the class of every allocation (no request in the model needs low
    /// memory, as none did in the posting's workloads).
    pub(crate) fn top_zone(&self) -> usize {
        self.zones.len() - 1
    }

    /// The watermarks of zone `z`.
    pub(crate) fn zone_wmark(&self, z: usize) -> Watermarks {
        self.zones[z].wmark
    }

    /// Pages an allocation of class `class` leaves free in zone `z` (lowmem reserve).
    pub(crate) fn reserve(&self, z: usize, class: usize) -> u64 {
        self.zones[z].reserve[class]
    }

    /// Free pages of zone `z`.
    pub(crate) fn zone_free(&self, z: usize) -> u64 {
        let zone = &self.zones[z];
        zone.pages.saturating_sub(zone.allocated + zone.anon + zone.files)
    }

    /// The zone a frame belongs to.
    pub(crate) fn zone_of(&self, frame: FrameId) -> usize {
        usize::from(self.frames[frame.index()].zone)
    }

    /// Pages not used by the cache, by anonymous memory or by the files' state.
    pub(crate) fn free_pages(&self) -> u64 {
        (0..self.zones.len()).map(|z| self.zone_free(z)).sum()
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    pub(crate) fn allocated(&self) -> u64 {
        self.zones.iter().map(|z| z.allocated).sum()
    }

    pub(crate) fn anon(&self) -> u64 {
        self.zones.iter().map(|z| z.anon).sum()
    }

    /// Pages charged for the state of the files the cache knows.
    pub(crate) fn files(&self) -> u64 {
        self.zones.iter().map(|z| z.files).sum()
    }

    /// Charges `pages` for the state of the files the cache knows, in place of the previous
    /// charge (the kernel's inode and dentry slab, which comes out of the same memory as the
    /// page cache). Taken from the free pages of the highest zone first, then of lower ones;
    /// what no zone has free is charged to the highest zone beyond memory, overcommitted until
    /// reclaim frees frames (a slab allocation that finds no free page succeeds by reclaiming
    /// cache: the caller wakes kswapd).
    pub(crate) fn charge_files(&mut self, pages: u64) {
        for zone in &mut self.zones {
            zone.files = 0;
        }
        let mut left = pages;
        for z in (0..self.zones.len()).rev() {
            let n = left.min(self.zone_free(z));
            self.zones[z].files += n;
            left -= n;
        }
        let top = self.top_zone();
        self.zones[top].files += left;
        self.overcommitted |= left > 0;
        self.settle_overcommit();
    }

    /// Adds anonymous pages without a zone choice (the simulator's pre-existing memory): the
    /// highest zone first, then lower ones, ignoring watermarks.
    pub(crate) fn add_anon(&mut self, pages: u64) {
        let mut left = pages;
        for z in (0..self.zones.len()).rev() {
            let n = left.min(self.zone_free(z));
            self.zones[z].anon += n;
            left -= n;
        }
        // Beyond memory: charged to the highest zone, as before zones existed.
        let top = self.top_zone();
        self.zones[top].anon += left;
        self.anon_owned += pages;
        self.overcommitted |= left > 0;
    }

    /// Whether anonymous memory or the files' state charged beyond memory still makes frames,
    /// anonymous memory and the files' state exceed the total (the only way they may).
    pub(crate) fn overcommitted(&self) -> bool {
        self.overcommitted
    }

    /// Frames, anonymous memory and the files' state fit in memory, unless anonymous memory or
    /// the files' state was charged beyond it ([`Memory::add_anon`], [`Memory::charge_files`],
    /// the only ways they may not): checked where frames or anonymous memory grow.
    fn check_budget(&self) {
        invariant!(
            self.overcommitted || self.allocated() + self.anon() + self.files() <= self.total,
            "{} frames, {} anonymous pages and {} pages of file state exceed the {} pages of \
             memory",
            self.allocated(),
            self.anon(),
            self.files(),
            self.total
        );
    }

    /// Clears the overcommit once frames, anonymous memory and the files' state fit again.
    fn settle_overcommit(&mut self) {
        if self.overcommitted && self.allocated() + self.anon() + self.files() <= self.total {
            self.overcommitted = false;
        }
    }

    /// Takes up to `want` free pages of zone `z` for anonymous memory while staying at or above
    /// `floor` free pages there.
    pub(crate) fn take_anon(&mut self, z: usize, want: u64, floor: u64) -> u64 {
        let n = want.min(self.zone_free(z).saturating_sub(floor));
        self.zones[z].anon += n;
        self.anon_owned += n;
        self.check_budget();
        n
    }

    /// The workload frees `pages` of the anonymous memory it holds. The anonymous pool keeps no
    /// per-page identity, so the resident part freed is the freed share of what is held:
    /// `pages * swappable / owned` (pages in swap simply leave swap; pages being written or
    /// already written stay until reclaim finishes with them), taken from the zones in
    /// proportion to their swappable pages.
    pub(crate) fn sub_anon(&mut self, pages: u64) {
        let pages = pages.min(self.anon_owned);
        if pages == 0 {
            return;
        }
        let swappable = self.swappable_anon();
        let resident = if pages == self.anon_owned {
            swappable
        } else {
            (u128::from(pages) * u128::from(swappable) / u128::from(self.anon_owned)) as u64
        };
        let mut left = resident;
        for z in 0..self.zones.len() {
            let zs = self.zone_swappable_anon(z);
            let share = if swappable == 0 {
                0
            } else {
                (u128::from(resident) * u128::from(zs) / u128::from(swappable)) as u64
            };
            let n = share.min(left);
            self.zones[z].anon -= n;
            left -= n;
        }
        for z in (0..self.zones.len()).rev() {
            let n = left.min(self.zone_swappable_anon(z));
            self.zones[z].anon -= n;
            left -= n;
        }
        self.anon_owned -= pages;
        self.settle_overcommit();
    }

    /// Anonymous pages of zone `z` whose swap-out write is in flight.
    pub(crate) fn zone_anon_writeback(&self, z: usize) -> u64 {
        self.zones[z].anon_writeback
    }

    /// Resident anonymous pages reclaim may swap out.
    pub(crate) fn swappable_anon(&self) -> u64 {
        (0..self.zones.len()).map(|z| self.zone_swappable_anon(z)).sum()
    }

    /// Resident anonymous pages of zone `z` reclaim may swap out.
    pub(crate) fn zone_swappable_anon(&self, z: usize) -> u64 {
        let zone = &self.zones[z];
        zone.anon - zone.anon_writeback - zone.anon_swapped
    }

    /// Reclaim starts swapping out `pages` anonymous pages of zone `z`.
    pub(crate) fn anon_start_swap(&mut self, z: usize, pages: u64) {
        debug_assert!(pages <= self.zone_swappable_anon(z));
        self.zones[z].anon_writeback += pages;
    }

    /// A swap-out write of `pages` of zone `z` ended; written pages wait for reclaim to free
    /// them.
    pub(crate) fn anon_swap_done(&mut self, z: usize, pages: u64, ok: bool) {
        self.zones[z].anon_writeback -= pages;
        if ok {
            self.zones[z].anon_swapped += pages;
        }
    }

    /// Frees up to `want` anonymous pages of zone `z` already written to swap; returns how many.
    pub(crate) fn free_swapped_anon(&mut self, z: usize, want: u64) -> u64 {
        let zone = &mut self.zones[z];
        let n = want.min(zone.anon_swapped);
        zone.anon_swapped -= n;
        zone.anon -= n;
        self.settle_overcommit();
        n
    }

    /// Pages on `list` in all zones.
    pub(crate) fn list_len(&self, list: List) -> u64 {
        (0..self.zones.len()).map(|z| self.zone_list_len(z, list)).sum()
    }

    /// Pages on `list` of zone `z`.
    pub(crate) fn zone_list_len(&self, z: usize, list: List) -> u64 {
        match list {
            List::None => 0,
            List::Inactive => self.zones[z].lists[0].len,
            List::Active => self.zones[z].lists[1].len,
        }
    }

    /// Takes up to `want` frames of zone `z` while staying at or above `floor` free pages there.
    pub(crate) fn alloc(
        &mut self,
        z: usize,
        want: usize,
        floor: u64,
        out: &mut Vec<FrameId>,
    ) -> usize {
        let available = self.zone_free(z).saturating_sub(floor);
        let n = (want as u64).min(available) as usize;
        for _ in 0..n {
            let id = match self.zones[z].free_ids.pop() {
                Some(id) => id,
                None => {
                    let id = self.frames.len() as u32;
                    self.frames.push(FrameMeta {
                        inode: 0,
                        index: 0,
                        prev: NIL,
                        next: NIL,
                        list: List::None,
                        zone: z as u8,
                    });
                    id
                }
            };
            out.push(FrameId(id));
        }
        self.zones[z].allocated += n as u64;
        self.check_budget();
        n
    }

    /// Returns a frame that is on no list to the free pool of its zone.
    pub(crate) fn release(&mut self, frame: FrameId) {
        let meta = &self.frames[frame.index()];
        assert_eq!(meta.list, List::None, "frame {frame} released while on an LRU list");
        let zone = &mut self.zones[usize::from(meta.zone)];
        invariant!(zone.allocated > 0, "frame {frame} released from a zone with none allocated");
        zone.free_ids.push(frame.0);
        zone.allocated -= 1;
        self.settle_overcommit();
    }

    /// Records the page a frame holds and puts it at the head of the inactive list (new pages
    /// start inactive, so a use-once stream cannot push out the active working set).
    pub(crate) fn add_to_lru(&mut self, frame: FrameId, inode: InodeId, index: u64) {
        let meta = &mut self.frames[frame.index()];
        meta.inode = inode.0;
        meta.index = index;
        self.link_head(frame.0, List::Inactive);
    }

    /// The page a frame holds.
    pub(crate) fn owner(&self, frame: FrameId) -> (InodeId, u64) {
        let meta = &self.frames[frame.index()];
        (InodeId(meta.inode), meta.index)
    }

    pub(crate) fn list_of(&self, frame: FrameId) -> List {
        self.frames[frame.index()].list
    }

    /// The frame at the tail (reclaim end) of `list` of zone `z`.
    pub(crate) fn tail(&self, z: usize, list: List) -> Option<FrameId> {
        let t = self.zones[z].lists[list_slot(list)].tail;
        (t != NIL).then_some(FrameId(t))
    }

    /// Takes a frame off its list.
    pub(crate) fn unlink(&mut self, frame: FrameId) {
        let id = frame.0;
        let FrameMeta { prev, next, list, zone, .. } = self.frames[id as usize];
        if list == List::None {
            return;
        }
        let slot = list_slot(list);
        let lists = &mut self.zones[usize::from(zone)].lists;
        if prev == NIL {
            lists[slot].head = next
        } else {
            self.frames[prev as usize].next = next
        }
        if next == NIL {
            lists[slot].tail = prev
        } else {
            self.frames[next as usize].prev = prev
        }
        lists[slot].len -= 1;
        let meta = &mut self.frames[id as usize];
        meta.prev = NIL;
        meta.next = NIL;
        meta.list = List::None;
    }

    /// Moves a frame to the head (most recent end) of `list`.
    pub(crate) fn move_to_head(&mut self, frame: FrameId, list: List) {
        self.unlink(frame);
        self.link_head(frame.0, list);
    }

    /// Moves a frame to the tail of the inactive list, so the next scan frees it first.
    pub(crate) fn move_to_inactive_tail(&mut self, frame: FrameId) {
        self.unlink(frame);
        let slot = list_slot(List::Inactive);
        let z = self.zone_of(frame);
        let tail = self.zones[z].lists[slot].tail;
        let meta = &mut self.frames[frame.index()];
        meta.prev = tail;
        meta.next = NIL;
        meta.list = List::Inactive;
        if tail == NIL {
            self.zones[z].lists[slot].head = frame.0
        } else {
            self.frames[tail as usize].next = frame.0
        }
        self.zones[z].lists[slot].tail = frame.0;
        self.zones[z].lists[slot].len += 1;
    }

    fn link_head(&mut self, id: u32, list: List) {
        let slot = list_slot(list);
        let z = usize::from(self.frames[id as usize].zone);
        let head = self.zones[z].lists[slot].head;
        let meta = &mut self.frames[id as usize];
        assert_eq!(meta.list, List::None);
        meta.prev = NIL;
        meta.next = head;
        meta.list = list;
        if head == NIL {
            self.zones[z].lists[slot].tail = id
        } else {
            self.frames[head as usize].prev = id
        }
        self.zones[z].lists[slot].head = id;
        self.zones[z].lists[slot].len += 1;
    }
}

fn list_slot(list: List) -> usize {
    match list {
        List::Inactive => 0,
        List::Active => 1,
        List::None => unreachable!("no list"),
    }
}

/// Integer square root.
pub(crate) fn isqrt(x: u64) -> u64 {
    if x < 2 {
        return x;
    }
    let mut r = (x as f64).sqrt() as u64;
    while r * r > x {
        r -= 1;
    }
    while (r + 1) * (r + 1) <= x {
        r += 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendConfig;

    /// Watermarks for 4 GiB follow the kernel formula by hand.
    #[test]
    fn watermarks_by_hand() {
        let config = Config::new(4 << 30, BackendConfig::new("d"));
        let w = Watermarks::for_config(&config);
        // kbytes = 4194304; sqrt(16 * 4194304) = 8192 KiB = 2048 pages; gap = max(512, 1048)
        assert_eq!(w, Watermarks { min: 2048, low: 2048 + 1048, high: 2048 + 2096 });
    }

    /// The posting's 4.5 GiB box with x86-64 zones (DMA to 16 MiB, DMA32 to 3.5 GiB): sizes,
    /// watermarks split by size, lowmem reserves by hand; bounds beyond memory are dropped.
    #[test]
    fn zones_by_hand() {
        let mut config = Config::new(4608 << 20, BackendConfig::new("d"));
        config.zone_bounds_bytes = vec![16 << 20, 3584 << 20];
        assert_eq!(zone_pages(&config), [4096, 913_408, 262_144]);
        let w = Watermarks::per_zone(&config);
        // min_free_kbytes = sqrt(16 * 4718592) = 8688 KiB = 2172 pages, split by zone size.
        assert_eq!(w.iter().map(|w| w.min).collect::<Vec<_>>(), [7, 1681, 482]);
        let total = Watermarks::for_config(&config);
        assert_eq!(total.min, 7 + 1681 + 482);
        let m = Memory::new(&config);
        assert_eq!(m.zones(), 3);
        // DMA keeps (DMA32 + Normal) / 256 from a Normal allocation, DMA32 keeps Normal / 256.
        assert_eq!(m.reserve(0, 2), (913_408 + 262_144) / 256);
        assert_eq!(m.reserve(1, 2), 262_144 / 256);
        assert_eq!((m.reserve(0, 0), m.reserve(2, 2), m.reserve(1, 0)), (0, 0, 0));
        // 512 MiB: the Normal bound lies beyond memory; DMA and DMA32 remain.
        config.memory_bytes = 512 << 20;
        assert_eq!(zone_pages(&config), [4096, 126_976]);
        config.zone_bounds_bytes.clear();
        assert_eq!(zone_pages(&config), [131_072]);
    }

    /// Frames come from the zone asked for, return to it, and each zone has its own lists.
    #[test]
    fn zones_keep_their_frames_and_lists() {
        let mut config = Config::new(64 << 20, BackendConfig::new("d"));
        config.zone_bounds_bytes = vec![16 << 20];
        let mut m = Memory::new(&config);
        let mut low = Vec::new();
        let mut high = Vec::new();
        assert_eq!(m.alloc(0, 2, 0, &mut low), 2);
        assert_eq!(m.alloc(1, 1, 0, &mut high), 1);
        assert_eq!((m.zone_free(0), m.zone_free(1)), (4094, 12_287));
        m.add_to_lru(low[0], InodeId(1), 0);
        m.add_to_lru(high[0], InodeId(1), 1);
        assert_eq!(m.tail(0, List::Inactive), Some(low[0]));
        assert_eq!(m.tail(1, List::Inactive), Some(high[0]));
        assert_eq!(m.list_len(List::Inactive), 2);
        m.unlink(high[0]);
        m.release(high[0]);
        assert_eq!(m.zone_free(1), 12_288);
        // The zone's own floor: zone 0 cannot go below it even with zone 1 free.
        let mut more = Vec::new();
        assert_eq!(m.alloc(0, 10_000, 4000, &mut more), 94);
    }

    /// Frames move between lists in O(1) and the lists keep their order.
    #[test]
    fn lru_lists_keep_order() {
        let mut m = Memory::new(&Config::new(64 << 20, BackendConfig::new("d")));
        let mut frames = Vec::new();
        assert_eq!(m.alloc(0, 3, 0, &mut frames), 3);
        for (i, &f) in frames.iter().enumerate() {
            m.add_to_lru(f, InodeId(1), i as u64);
        }
        // Added at the head: the first added is at the tail.
        assert_eq!(m.tail(0, List::Inactive), Some(frames[0]));
        m.move_to_head(frames[0], List::Active);
        assert_eq!(m.tail(0, List::Inactive), Some(frames[1]));
        assert_eq!(m.list_len(List::Active), 1);
        m.move_to_inactive_tail(frames[2]);
        assert_eq!(m.tail(0, List::Inactive), Some(frames[2]));
        m.unlink(frames[2]);
        m.release(frames[2]);
        assert_eq!(m.allocated(), 2);
    }

    /// Planted: anonymous memory beyond memory without the overcommit that allows it (no
    /// operation makes this; the test sets it by hand) is caught at the next allocation.
    #[test]
    #[should_panic(expected = "exceed the 16384 pages of memory")]
    fn frames_beyond_the_budget_are_caught() {
        let mut m = Memory::new(&Config::new(64 << 20, BackendConfig::new("d")));
        let mut frames = Vec::new();
        assert_eq!(m.alloc(0, 8, 0, &mut frames), 8, "within the budget: no complaint");
        m.zones[0].anon = m.zones[0].pages;
        m.alloc(0, 1, 0, &mut frames);
    }
}
