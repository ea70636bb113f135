//! The memory budget: frames, watermarks and the file LRU lists (kernel-reference §8.1).
//!
//! Every page the cache holds occupies one frame of a fixed budget (`Config::memory_bytes`),
//! so the cache can never exceed it. Anonymous memory of the workload (simulator) shares the
//! same budget. Resident frames sit on an inactive or an active list, linked through the frame
//! table (an intrusive doubly linked list, O(1) per move); reclaim scans the inactive tail.
//!
//! Watermarks follow the kernel: `min_free_kbytes = clamp(sqrt(16 * memory_kbytes), 128,
//! 262144)`, `gap = max(min / 4, memory * watermark_scale_factor / 10000)`, `low = min + gap`,
//! `high = min + 2 * gap`. Below `low` background reclaim runs until `high`; an allocation that
//! would go below `min` reclaims directly.

use crate::config::Config;
use crate::ids::{FrameId, InodeId};

const NIL: u32 = u32::MAX;

/// Which LRU list a frame is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum List {
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
}

#[derive(Clone, Copy)]
struct ListHead {
    head: u32,
    tail: u32,
    len: u64,
}

const EMPTY_LIST: ListHead = ListHead { head: NIL, tail: NIL, len: 0 };

/// The three watermarks, in pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermarks {
    /// Below this, allocations reclaim directly.
    pub min: u64,
    /// Below this, background reclaim starts.
    pub low: u64,
    /// Background reclaim stops here.
    pub high: u64,
}

impl Watermarks {
    /// The kernel's watermarks for `config`.
    pub fn for_config(config: &Config) -> Watermarks {
        let pages = config.memory_pages();
        let kbytes = pages * 4;
        let min_kbytes =
            config.min_free_kbytes.unwrap_or_else(|| isqrt(kbytes * 16).clamp(128, 262_144));
        let min = (min_kbytes / 4).min(pages / 4);
        let gap = (min / 4).max(pages * u64::from(config.watermark_scale_factor) / 10_000);
        Watermarks { min, low: min + gap, high: min + 2 * gap }
    }
}

/// Frames and LRU lists.
pub(crate) struct Memory {
    total: u64,
    frames: Vec<FrameMeta>,
    free: Vec<u32>,
    /// Frames handed out (resident, reserved by writers, or in flight to the LRU).
    allocated: u64,
    /// Resident anonymous pages (including those being swapped out or already written).
    anon: u64,
    /// Anonymous pages whose swap-out write is in flight.
    anon_writeback: u64,
    /// Anonymous pages written to swap, waiting for the next reclaim pass to free them.
    anon_swapped: u64,
    /// Anonymous pages the workload holds, resident or in swap (what it will free).
    anon_owned: u64,
    lists: [ListHead; 2],
    pub(crate) wmark: Watermarks,
}

impl Memory {
    pub(crate) fn new(config: &Config) -> Memory {
        Memory {
            total: config.memory_pages(),
            frames: Vec::new(),
            free: Vec::new(),
            allocated: 0,
            anon: 0,
            anon_writeback: 0,
            anon_swapped: 0,
            anon_owned: 0,
            lists: [EMPTY_LIST; 2],
            wmark: Watermarks::for_config(config),
        }
    }

    /// Pages not used by the cache or by anonymous memory.
    pub(crate) fn free_pages(&self) -> u64 {
        self.total.saturating_sub(self.allocated + self.anon)
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    pub(crate) fn allocated(&self) -> u64 {
        self.allocated
    }

    pub(crate) fn anon(&self) -> u64 {
        self.anon
    }

    pub(crate) fn add_anon(&mut self, pages: u64) {
        self.anon += pages;
        self.anon_owned += pages;
    }

    /// Takes up to `want` free pages for anonymous memory while staying at or above `floor`.
    pub(crate) fn take_anon(&mut self, want: u64, floor: u64) -> u64 {
        let n = want.min(self.free_pages().saturating_sub(floor));
        self.add_anon(n);
        n
    }

    /// The workload frees `pages` of the anonymous memory it holds. The anonymous pool keeps no
    /// per-page identity, so the resident part freed is the freed share of what is held:
    /// `pages * swappable / owned` (pages in swap simply leave swap; pages being written or
    /// already written stay until reclaim finishes with them).
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
        self.anon -= resident;
        self.anon_owned -= pages;
    }

    /// Anonymous pages whose swap-out write is in flight.
    pub(crate) fn anon_writeback(&self) -> u64 {
        self.anon_writeback
    }

    /// Resident anonymous pages reclaim may swap out.
    pub(crate) fn swappable_anon(&self) -> u64 {
        self.anon - self.anon_writeback - self.anon_swapped
    }

    /// Reclaim starts swapping out `pages` anonymous pages.
    pub(crate) fn anon_start_swap(&mut self, pages: u64) {
        debug_assert!(pages <= self.swappable_anon());
        self.anon_writeback += pages;
    }

    /// A swap-out write of `pages` ended; written pages wait for reclaim to free them.
    pub(crate) fn anon_swap_done(&mut self, pages: u64, ok: bool) {
        self.anon_writeback -= pages;
        if ok {
            self.anon_swapped += pages;
        }
    }

    /// Frees up to `want` anonymous pages already written to swap; returns how many.
    pub(crate) fn free_swapped_anon(&mut self, want: u64) -> u64 {
        let n = want.min(self.anon_swapped);
        self.anon_swapped -= n;
        self.anon -= n;
        n
    }

    pub(crate) fn list_len(&self, list: List) -> u64 {
        match list {
            List::None => 0,
            List::Inactive => self.lists[0].len,
            List::Active => self.lists[1].len,
        }
    }

    /// Takes up to `want` frames while staying at or above `floor` free pages.
    pub(crate) fn alloc(&mut self, want: usize, floor: u64, out: &mut Vec<FrameId>) -> usize {
        let available = self.free_pages().saturating_sub(floor);
        let n = (want as u64).min(available) as usize;
        for _ in 0..n {
            let id = match self.free.pop() {
                Some(id) => id,
                None => {
                    let id = self.frames.len() as u32;
                    self.frames.push(FrameMeta {
                        inode: 0,
                        index: 0,
                        prev: NIL,
                        next: NIL,
                        list: List::None,
                    });
                    id
                }
            };
            out.push(FrameId(id));
        }
        self.allocated += n as u64;
        n
    }

    /// Returns a frame that is on no list to the free pool.
    pub(crate) fn release(&mut self, frame: FrameId) {
        let meta = &self.frames[frame.index()];
        assert_eq!(meta.list, List::None, "frame {frame} released while on an LRU list");
        self.free.push(frame.0);
        self.allocated -= 1;
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

    /// The frame at the tail (reclaim end) of `list`.
    pub(crate) fn tail(&self, list: List) -> Option<FrameId> {
        let t = self.lists[list_slot(list)].tail;
        (t != NIL).then_some(FrameId(t))
    }

    /// Takes a frame off its list.
    pub(crate) fn unlink(&mut self, frame: FrameId) {
        let id = frame.0;
        let FrameMeta { prev, next, list, .. } = self.frames[id as usize];
        if list == List::None {
            return;
        }
        let slot = list_slot(list);
        if prev == NIL {
            self.lists[slot].head = next
        } else {
            self.frames[prev as usize].next = next
        }
        if next == NIL {
            self.lists[slot].tail = prev
        } else {
            self.frames[next as usize].prev = prev
        }
        self.lists[slot].len -= 1;
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
        let tail = self.lists[slot].tail;
        let meta = &mut self.frames[frame.index()];
        meta.prev = tail;
        meta.next = NIL;
        meta.list = List::Inactive;
        if tail == NIL {
            self.lists[slot].head = frame.0
        } else {
            self.frames[tail as usize].next = frame.0
        }
        self.lists[slot].tail = frame.0;
        self.lists[slot].len += 1;
    }

    fn link_head(&mut self, id: u32, list: List) {
        let slot = list_slot(list);
        let head = self.lists[slot].head;
        let meta = &mut self.frames[id as usize];
        assert_eq!(meta.list, List::None);
        meta.prev = NIL;
        meta.next = head;
        meta.list = list;
        if head == NIL {
            self.lists[slot].tail = id
        } else {
            self.frames[head as usize].prev = id
        }
        self.lists[slot].head = id;
        self.lists[slot].len += 1;
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

    /// Frames move between lists in O(1) and the lists keep their order.
    #[test]
    fn lru_lists_keep_order() {
        let mut m = Memory::new(&Config::new(64 << 20, BackendConfig::new("d")));
        let mut frames = Vec::new();
        assert_eq!(m.alloc(3, 0, &mut frames), 3);
        for (i, &f) in frames.iter().enumerate() {
            m.add_to_lru(f, InodeId(1), i as u64);
        }
        // Added at the head: the first added is at the tail.
        assert_eq!(m.tail(List::Inactive), Some(frames[0]));
        m.move_to_head(frames[0], List::Active);
        assert_eq!(m.tail(List::Inactive), Some(frames[1]));
        assert_eq!(m.list_len(List::Active), 1);
        m.move_to_inactive_tail(frames[2]);
        assert_eq!(m.tail(List::Inactive), Some(frames[2]));
        m.unlink(frames[2]);
        m.release(frames[2]);
        assert_eq!(m.allocated(), 2);
    }
}
