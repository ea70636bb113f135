//! ebb's own writeback-throttling variant (`wbt = ebb`): the kernel's depth control, plus a
//! target learned from the device, a tail signal, and smaller or paced background writes
//! while reads are active (docs/wbt.md#ebbs-variant).
//!
//! # Goal
//! Keep the body and the tail of read latency near the device's idle latency beside
//! background writeback, also on a device where writes are few and large (one write in
//! flight at a time, as ebb's per-file lanes issue them), which the kernel's algorithm cannot
//! see: it judges the window's minimum read latency, which stays near idle there, and it can
//! only lower the depth, which is already 1.
//!
//! # Signals
//! Per window: the reads, and how many of them took longer than the target; the minimum read
//! latency of each window with reads (the device's idle latency: the fastest read of a window
//! is one that found nothing ahead of it). Across windows: the latencies of the idle reads,
//! those that found no write in service and none just done (none in flight when the read
//! completed, none completed since one write's service before it was issued): the device's
//! idle tail. Pacing: each write's service time (issue to completion).
//!
//! # Control law
//! ```text
//! idle      = lowest window minimum seen; a window minimum above it raises it by 1/16 of
//!             the difference (a device that got slower is learned in a few seconds)
//! idle_tail = p99 of the last TAIL_SAMPLES..2*TAIL_SAMPLES idle reads (log buckets, 4 an
//!             octave, the lower edge of the p99's; all halved when 2*TAIL_SAMPLES are
//!             counted), at least idle
//! target    = max(min(idle_tail + idle >> MARGIN_SHIFT, TAIL_CAP * idle), TARGET_FLOOR)
//!                                                            (wbt_lat_usec, if set, instead)
//! window    : EXCEEDED as the kernel's (a read stuck for a window), or when more than
//!             1 read in TAIL_ONE_IN took longer than the target (the window's p99 above it)
//! EXCEEDED  : size_shift += 1 (until the size is wbt_min_write_pages) and the kernel's
//!             scale-down (depth halves): either may be what delays reads
//! OK        : size_shift -= 1 while above 0, then the kernel's scale-up
//! background write, while a read completed or was issued in the last 100 ms:
//!             at most max(max_write_pages >> size_shift, wbt_min_write_pages) pages
//! every limit: at least wbt_min_depth writes in flight (1, the kernel's floor, by default)
//!
//! pacing (wbt_min_duty under 100), instead of the size:
//! EXCEEDED  : duty = max(duty / 2, wbt_min_duty)
//! OK        : duty = min(duty + 1/DUTY_STEPS, 1), before the kernel's scale-up
//! while a read completed or was issued in the last 100 ms and duty < 1, background writes:
//!             one in flight, of up to wbt_pace_write_pages pages, and after each completes
//!             (service s) none before  now + min(s * (1 - duty) / duty, GAP_MAX_NS)
//!             (the engine's timer, `Wbt::pace_timer`, lets the next one go)
//!             with wbt_pace_yields, not while a writer was throttled in balance_dirty_pages
//!             in the last second (the kernel's wb_recent_wait: its limits lift then too)
//! ```
//! The target is where the reads' p99 lies with nothing else on the device: the idle tail
//! (the lower edge of its bucket, up to a fifth under the true p99) plus a quarter of the
//! fastest read, about the bucket's width. So a window misses when something else, the
//! writes, pushes more than one read in a hundred past where reads alone put their p99, and
//! the reads' p99 beside the writes is held near the idle one, as the kernel's writeback
//! leaves it (its few long bursts delay few reads). Where reads alone take one time, the tail
//! is the fastest read and the target 1.25 times it. Idle reads may still pay for earlier
//! writes (a filesystem journal, a virtio host writing back what it was sent), the more the
//! more was written, which would let the target follow the writes up: a read issued within
//! one write's service after a write completed is not idle (a paced writer leaves idle reads
//! only while its duty is under one half), and the target is at most TAIL_CAP times the
//! fastest read. (Measured on the development machine with a 50% duty floor: without either
//! rule the target rose to 1.6 ms, without the cap to 2.9 ms. Learning only from whole
//! windows without writes left the tail to the few windows before writeback started, which
//! other IO made noisy: 1.3-2.6 ms.) The margin was the whole fastest read until 2026-11-27:
//! there a target 1.2-1.6 times the kernel writer's p99, near which the controller held the
//! reads' p99 (1.19-1.33 times the kernel writer's where that writer ran under 800 MB/s);
//! with a quarter, 1.00-1.28 times, for about 15% of ebb's writer (BENCHMARKS.md,
//! "read-under-write").
//! Paced, a window is judged with one write in it (the kernel asks for three): at a 12% duty
//! and 4 ms writes three come to a window, and a window judged unknown counts as met, so the
//! duty rose on windows too thin in writes whatever the reads did (its mean was 21-29% for
//! any target on the development machine; 14-18% with the quarter margin once such windows
//! were judged).
//! The duty is the share of the time the device spends on background writes while reads are
//! active: a read that arrives in a gap finds it idle. `wbt_min_duty` is the writer's share
//! where reads miss the target whatever the writes do.
//! Writes of the other classes, and background writes while nobody reads, keep the
//! backend's `max_write_pages`: the variant costs nothing when there is nothing to protect.
//! `wbt_min_depth` is for a backend that serves one file's writes one at a time whatever the
//! depth (the runtime's per-file lanes): there a second write in flight is copied out and
//! waiting when the first completes, so it costs a read no wait and keeps the device busy.
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | TAIL_SAMPLES | 4096 | reads | ebb: the idle tail of the last few thousand idle reads, its p99 from 40 or more reads above it |
//! | TAIL_MIN_SAMPLES | 1000 | reads | ebb: a p99 from at least 10 reads above it |
//! | MARGIN_SHIFT | 2 | 1/4 of the idle latency | ebb: about the width of the idle p99's bucket; with the whole idle latency the reads' p99 was 1.19-1.33x the kernel writer's on the development machine (where that writer ran under 800 MB/s), with a quarter 1.00-1.28x, for about 15% of ebb's writer |
//! | TAIL_CAP | 4 | x idle latency | ebb: the development machine's idle p99 is 2.2x its fastest read (target 3.2x); its idle reads beside a writer in service half the time or more reached 40-70x |
//! | TARGET_FLOOR_NS | 20000 | ns | ebb: below it timer and scheduling noise dominate |
//! | TAIL_ONE_IN | 100 | reads | ebb: the window's p99 |
//! | IDLE_RISE_SHIFT | 4 | 1/16 per window | ebb |
//! | DUTY_STEPS | 16 | windows from the floor to unpaced | ebb: additive increase, as slow as the kernel's one step per window |
//! | GAP_MAX_NS | 20000000 | ns | ebb: a slow write (a journal commit) must not stop writeback for long |
//!
//! # Insufficient data
//! Before any read the target is the kernel's default for the device kind (2 ms solid state,
//! 75 ms rotating) and writes are full size. Until TAIL_MIN_SAMPLES idle reads are counted,
//! the idle tail is the idle latency (the target 1.25 times it: a reader that only ever
//! reads beside unpaced writes keeps that target, until a missed window slows them). Windows with
//! too few samples are judged as the kernel's (UNKNOWN and UNKNOWN_WRITES), and an UNKNOWN
//! window does not change the size.
//! Pacing starts unpaced (duty 1) and slows only on an EXCEEDED window; a gap is sized from
//! the write just completed, so there is no estimate to wait for.

/// The idle tail is the p99 of the last this many to twice this many idle reads.
pub(crate) const TAIL_SAMPLES: u32 = 4096;
/// The target is the idle tail plus the idle latency shifted right this much.
pub(crate) const MARGIN_SHIFT: u32 = 2;
/// The target is at most this many times the idle latency.
pub(crate) const TAIL_CAP: u64 = 4;
/// Idle reads counted before their p99 is the idle tail.
pub(crate) const TAIL_MIN_SAMPLES: u32 = 1000;
/// The lowest target, ns.
pub(crate) const TARGET_FLOOR_NS: u64 = 20_000;
/// A window is EXCEEDED when more than one read in this many missed the target.
pub(crate) const TAIL_ONE_IN: u64 = 100;
/// A window minimum above the idle estimate raises it by 1/2^this of the difference.
pub(crate) const IDLE_RISE_SHIFT: u32 = 4;

use crate::time::{Duration, Instant};

/// A duty of one: background writes unpaced.
pub(crate) const DUTY_ONE: u32 = 1024;
/// A met window adds this share of `DUTY_ONE` back to the duty.
pub(crate) const DUTY_STEPS: u32 = 16;
/// The longest gap after one write, ns.
pub(crate) const GAP_MAX_NS: u64 = 20_000_000;

/// Log buckets of the idle tail: 4 an octave from 1 us (2^10 ns) to 2^34 ns (17 s).
const TAIL_BUCKETS: usize = 4 * 24;

/// The latencies of reads that found no write in service, in log buckets, weighted to the
/// last `TAIL_SAMPLES` to `2 * TAIL_SAMPLES` of them.
#[derive(Clone, Debug)]
pub(super) struct IdleTail {
    counts: [u32; TAIL_BUCKETS],
    total: u32,
}

impl IdleTail {
    fn new() -> IdleTail {
        IdleTail { counts: [0; TAIL_BUCKETS], total: 0 }
    }

    /// The bucket of `ns`: 4 an octave (a quarter of the octave's base wide), under 1 us in
    /// the first, over the range in the last.
    fn bucket(ns: u64) -> usize {
        if ns < 1 << 10 {
            return 0;
        }
        let octave = 63 - ns.leading_zeros() as usize;
        let quarter = ((ns >> (octave - 2)) & 3) as usize;
        ((octave - 10) * 4 + quarter).min(TAIL_BUCKETS - 1)
    }

    /// The lower edge of bucket `i`, ns.
    fn edge(i: usize) -> u64 {
        let (octave, quarter) = (i / 4 + 10, i % 4);
        (4 + quarter as u64) << (octave - 2)
    }

    /// Counts a read of `ns`; halves every count when `2 * TAIL_SAMPLES` are counted.
    pub(super) fn record(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.total += 1;
        if self.total >= 2 * TAIL_SAMPLES {
            self.counts.iter_mut().for_each(|c| *c /= 2);
            self.total = self.counts.iter().sum();
        }
    }

    /// The lower edge of the bucket holding the 99th percentile (at most a fifth under it),
    /// ns; `None` with fewer than `TAIL_MIN_SAMPLES` reads counted.
    pub(super) fn p99(&self) -> Option<u64> {
        if self.total < TAIL_MIN_SAMPLES {
            return None;
        }
        let rank = u64::from(self.total) * 99 / 100;
        let mut seen = 0u64;
        self.counts
            .iter()
            .position(|&c| {
                seen += u64::from(c);
                seen > rank
            })
            .map(Self::edge)
    }
}

/// The variant's state beside the kernel's.
#[derive(Clone, Debug)]
pub(super) struct Adaptive {
    /// The user set `wbt_lat_usec`: keep it rather than learning one.
    explicit_target: bool,
    /// The idle read latency, ns (0: no read seen yet).
    idle_ns: u64,
    /// The latencies of the idle reads.
    idle_tail: IdleTail,
    /// Writes in flight (issued and not completed).
    writes_in_service: u32,
    /// When the last write completed, and its service: a read issued before the end of one
    /// more such service is not idle.
    last_write: Option<(Instant, Duration)>,
    /// Halvings of the background write size while reads are active.
    pub(super) size_shift: u32,
    /// The backend's largest write, pages.
    max_write_pages: u64,
    /// The smallest write, pages (`wbt_min_write_pages`, at most `max_write_pages`).
    min_write_pages: u64,
    /// The halvings that reach `min_write_pages`.
    max_shift: u32,
    /// The fewest background writes kept in flight (`wbt_min_depth`).
    pub(super) min_depth: u32,
    /// The least duty while reads are active, in 1/`DUTY_ONE` (`wbt_min_duty`; `DUTY_ONE`:
    /// no pacing).
    pub(super) min_duty: u32,
    /// The share of the time a background write may be in service while reads are active,
    /// in 1/`DUTY_ONE`.
    pub(super) duty: u32,
    /// No background write is issued before this while paced (the gap after the last one).
    pub(super) pace_until: Option<Instant>,
    /// The largest background write while paced, pages (`wbt_pace_write_pages`).
    pub(super) pace_write_pages: u64,
    /// No pacing while a writer was throttled in the last second (`wbt_pace_yields`).
    pub(super) pace_yields: bool,
}

impl Adaptive {
    pub(super) fn new(
        explicit_target: bool,
        max_write_pages: u64,
        min_write_pages: u64,
    ) -> Adaptive {
        let min_write_pages = min_write_pages.clamp(1, max_write_pages.max(1));
        let mut max_shift = 0;
        while (max_write_pages >> max_shift) > min_write_pages {
            max_shift += 1;
        }
        Adaptive {
            explicit_target,
            idle_ns: 0,
            idle_tail: IdleTail::new(),
            writes_in_service: 0,
            last_write: None,
            size_shift: 0,
            max_write_pages,
            min_write_pages,
            max_shift,
            min_depth: 1,
            min_duty: DUTY_ONE,
            duty: DUTY_ONE,
            pace_until: None,
            pace_write_pages: max_write_pages,
            pace_yields: false,
        }
    }

    /// Whether background writes are paced rather than shrunk (`wbt_min_duty` under 100).
    pub(super) fn pacing(&self) -> bool {
        self.min_duty < DUTY_ONE
    }

    /// Whether a gap follows each background write while reads are active.
    pub(super) fn paced(&self) -> bool {
        self.duty < DUTY_ONE
    }

    /// Halves the duty; false when it is already at `min_duty`.
    pub(super) fn slow(&mut self) -> bool {
        let duty = (self.duty / 2).max(self.min_duty);
        let slowed = duty < self.duty;
        self.duty = duty;
        slowed
    }

    /// Adds a step back to the duty; false when writes are already unpaced.
    pub(super) fn hasten(&mut self) -> bool {
        if self.duty >= DUTY_ONE {
            return false;
        }
        self.duty = (self.duty + DUTY_ONE / DUTY_STEPS).min(DUTY_ONE);
        true
    }

    /// The gap after a write that was in service for `service`: the device then spends
    /// `duty` of the time writing, at most `GAP_MAX_NS` idle.
    pub(super) fn gap(&self, service: Duration) -> Duration {
        let ns = u128::from(service.as_nanos()) * u128::from(DUTY_ONE - self.duty)
            / u128::from(self.duty.max(1));
        Duration::from_nanos((ns as u64).min(GAP_MAX_NS))
    }

    /// A write was issued.
    pub(super) fn write_issued(&mut self) {
        self.writes_in_service += 1;
    }

    /// A write completed at `now` after `service`, `inflight` writes still in flight.
    pub(super) fn write_done(&mut self, now: Instant, service: Duration, inflight: u32) {
        self.writes_in_service = inflight;
        self.last_write = Some((now, service));
    }

    /// A read completed at `now` after `latency`: an idle read, counted in the idle tail, if
    /// no write is in flight and none completed since one write's service before its issue.
    pub(super) fn read_done(&mut self, now: Instant, latency: Duration) {
        let issued_ns = now.as_nanos().saturating_sub(latency.as_nanos());
        let settled = |(done, service): (Instant, Duration)| {
            done.as_nanos().saturating_add(service.as_nanos()) <= issued_ns
        };
        if self.writes_in_service == 0 && self.last_write.is_none_or(settled) {
            self.idle_tail.record(latency.as_nanos());
        }
    }

    /// The device's idle tail: the p99 of the reads that found no write in service, at least
    /// the idle latency (the idle latency until there are enough of them), ns.
    pub(super) fn idle_tail_ns(&self) -> u64 {
        self.idle_tail.p99().unwrap_or(0).max(self.idle_ns)
    }

    /// Learns from a window whose fastest read took `read_min_ns`; returns the new target,
    /// if the target is learned.
    pub(super) fn learn(&mut self, read_min_ns: u64) -> Option<u64> {
        if self.idle_ns == 0 || read_min_ns < self.idle_ns {
            self.idle_ns = read_min_ns;
        } else {
            self.idle_ns += (read_min_ns - self.idle_ns) >> IDLE_RISE_SHIFT;
        }
        let margin = self.idle_ns >> MARGIN_SHIFT;
        let target = (self.idle_tail_ns() + margin).min(TAIL_CAP * self.idle_ns);
        (!self.explicit_target).then(|| target.max(TARGET_FLOOR_NS))
    }

    /// Whether a window with `reads` reads, `over` of them above the target, missed it.
    pub(super) fn tail_exceeded(reads: u64, over: u64) -> bool {
        over * TAIL_ONE_IN > reads
    }

    /// The largest background write while reads are active, pages.
    pub(super) fn write_pages(&self) -> u64 {
        (self.max_write_pages >> self.size_shift).max(self.min_write_pages)
    }

    /// Halves the write size; false when it is already at `min_write_pages`.
    pub(super) fn shrink(&mut self) -> bool {
        let shrunk = self.size_shift < self.max_shift;
        self.size_shift += u32::from(shrunk);
        shrunk
    }

    /// Grows the write size one step; false when it is already whole.
    pub(super) fn grow(&mut self) -> bool {
        if self.size_shift == 0 {
            return false;
        }
        self.size_shift -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wbt::{Wbt, WbtClass};

    /// A device that serves one write at a time, 2 us per page, and serves a read in 25 us
    /// once the write in service (if any) is done: a read waits behind at most one write, as
    /// beside ebb's per-file lane on a virtio disk. A writer keeps one background write in
    /// flight, as large as wbt lets it (256 pages at most); a reader reads every `read_every`
    /// us while `reading`.
    /// With `slow_every` N, every Nth read takes 55 us instead of 25 (reads alone have a p99
    /// 2.2 times their fastest); with `serial` false, reads never wait for the write; with
    /// `writing` false the writer issues nothing; with `aftermath`, a read issued in the
    /// millisecond after a write completed takes 300 us (the write's journal commit). A write
    /// takes `us_per_page` us a page (2).
    struct Lane {
        wbt: Wbt,
        write: Option<(u64, u64)>,
        reads: Vec<(u64, u64, u64)>,
        next_read: u64,
        read_id: u64,
        slow_every: u64,
        serial: bool,
        writing: bool,
        aftermath: bool,
        last_write_end: Option<u64>,
        us_per_page: u64,
    }

    impl Lane {
        fn new(wbt: Wbt) -> Lane {
            let (reads, next_read, read_id) = (Vec::new(), 0, 0);
            let (slow_every, serial, writing, aftermath) = (0, true, true, false);
            Lane {
                wbt,
                write: None,
                reads,
                next_read,
                read_id,
                slow_every,
                serial,
                writing,
                aftermath,
                last_write_end: None,
                us_per_page: 2,
            }
        }

        /// Runs from `from` to `to` us; returns the read latencies (us) and the write sizes.
        fn run(&mut self, from: u64, to: u64, reading: bool) -> (Vec<u64>, Vec<u64>) {
            let at = |us: u64| Instant::ZERO + Duration::from_micros(us);
            let (mut latencies, mut sizes) = (Vec::new(), Vec::new());
            for t in (from..to).step_by(5) {
                if let Some((issued, end)) = self.write.filter(|&(_, end)| end <= t) {
                    self.write = None;
                    self.last_write_end = Some(end);
                    self.wbt.on_write_done(at(end), Duration::from_micros(end - issued), 0);
                }
                self.reads.sort_by_key(|r| std::cmp::Reverse(r.1));
                while let Some(&(issued, done, id)) = self.reads.last().filter(|r| r.1 <= t) {
                    self.reads.pop();
                    latencies.push(done - issued);
                    let latency = Duration::from_micros(done - issued);
                    self.wbt.on_read_done(at(done), latency, Some(id));
                }
                if self.wbt.timer().is_some_and(|due| due <= at(t)) {
                    self.wbt.on_timer(at(t), u32::from(self.write.is_some()));
                }
                if reading && t >= self.next_read {
                    self.read_id += 1;
                    let waits = self.write.filter(|_| self.serial);
                    let start = waits.map_or(t, |(_, end)| end.max(t));
                    let slow = self.slow_every > 0 && self.read_id.is_multiple_of(self.slow_every);
                    let after = self.aftermath
                        && self.write.is_none()
                        && self.last_write_end.is_some_and(|end| t < end + 1_000);
                    let service = if after {
                        300
                    } else if slow {
                        55
                    } else {
                        25
                    };
                    self.reads.push((t, start + service, self.read_id));
                    self.wbt.on_read_issue(at(t), self.read_id);
                    self.next_read = t + 1_000;
                }
                if self.writing
                    && self.write.is_none()
                    && self.wbt.may_issue(WbtClass::Background, 0, at(t))
                {
                    let pages = self.wbt.write_pages(WbtClass::Background, 256, at(t));
                    sizes.push(pages);
                    self.write = Some((t, t + self.us_per_page * pages));
                    self.wbt.on_write_issue(at(t));
                }
            }
            (latencies, sizes)
        }
    }

    fn p99(mut v: Vec<u64>) -> u64 {
        v.sort_unstable();
        v[v.len() * 99 / 100]
    }

    /// Beside one large write at a time the kernel's algorithm sees a low minimum and does
    /// nothing, so the reads' p99 is a whole write's service (about 500 us); ebb's variant
    /// learns the idle latency (25 us: target 31.25 us), sees the p99 miss it, and shrinks the
    /// background writes to 16 pages, which brings the p99 under 100 us. When the reads stop,
    /// the writes are whole again 100 ms later; when they come back, small again within a second.
    #[test]
    fn smaller_writes_while_reads_are_active_cut_the_tail() {
        let mut kernel = Lane::new(Wbt::new(32, 2_000, 100_000, false));
        let (reads, sizes) = kernel.run(0, 3_000_000, true);
        assert!(sizes.iter().all(|&p| p == 256), "the kernel's algorithm keeps the size");
        assert!(p99(reads[1_000..].to_vec()) > 400, "a read waits for a whole write");

        let mut ebb = Lane::new(Wbt::new(32, 2_000, 100_000, false).with_adaptive(false, 256, 16));
        let (reads, sizes) = ebb.run(0, 3_000_000, true);
        assert_eq!(ebb.wbt.min_lat_nsec(), 31_250, "target: 1.25 times the idle latency");
        assert_eq!(*sizes.last().unwrap(), 16, "writes shrunk to the floor");
        let tail = p99(reads[1_000..].to_vec());
        assert!(tail < 100, "p99 {tail} us beside 16-page writes");

        ebb.run(3_000_000, 3_101_000, false);
        let (_, sizes) = ebb.run(3_101_000, 3_500_000, false);
        assert!(sizes.iter().all(|&p| p == 256), "no read for 100 ms: whole writes");
        let (reads, sizes) = ebb.run(3_500_000, 5_000_000, true);
        assert_eq!(*sizes.last().unwrap(), 16);
        assert!(p99(reads[1_000..].to_vec()) < 100);
    }

    /// A target the user set is kept (100 us: the size settles between 32 pages, whose reads
    /// meet it, and 64, whose do not), and writes other than background ones keep their size.
    #[test]
    fn explicit_target_and_other_classes() {
        let mut ebb = Lane::new(Wbt::new(32, 100, 100_000, false).with_adaptive(true, 256, 16));
        ebb.run(0, 2_000_000, true);
        assert_eq!(ebb.wbt.min_lat_nsec(), 100_000);
        let now = Instant::ZERO + Duration::from_micros(2_000_000);
        assert_eq!(ebb.wbt.write_pages(WbtClass::Sync, 256, now), 256);
        assert_eq!(ebb.wbt.write_pages(WbtClass::Normal, 256, now), 256);
        assert!(ebb.wbt.write_pages(WbtClass::Background, 256, now) <= 64);
    }

    /// Scaled all the way down, ebb's variant with `wbt_min_depth` 2 still lets background
    /// writeback keep two writes in flight, and a held write goes as soon as one of two
    /// completes; at the default floor (the kernel's) one, and a held write waits for none.
    #[test]
    fn depth_floor() {
        let now = Instant::ZERO + Duration::from_millis(1);
        for floor in [1, 2] {
            let wbt = Wbt::new(32, 2_000, 100_000, true).with_adaptive(false, 256, 16);
            let mut w = wbt.with_min_depth(floor);
            for _ in 0..8 {
                w.scale_down(true);
            }
            assert_eq!(w.max_depth(), 1);
            assert_eq!(w.limit(WbtClass::Background, now), floor);
            assert!(w.may_issue(WbtClass::Background, floor - 1, now));
            assert!(!w.may_issue(WbtClass::Background, floor, now), "held at {floor}");
            w.on_write_done(now, Duration::from_micros(100), floor - 1);
            assert!(w.may_issue(WbtClass::Background, floor - 1, now), "released at {floor}");
        }
        let kernel = Wbt::new(32, 2_000, 100_000, true).with_min_depth(2);
        assert_eq!(kernel.limit(WbtClass::Background, now), 4, "no floor for the kernel's");
    }

    /// Pacing (`wbt_min_duty` 25%) beside a reader that misses the target: background writes
    /// go out whole, 1024 pages (beyond the backend's 256), one at a time with a gap of three
    /// times their service after each, so the device writes a quarter of the time (the floor:
    /// the writer's share) and most reads find it idle. When nobody reads there is no gap, and
    /// writes are the backend's largest, back to back.
    #[test]
    fn paced_writes_are_large_and_leave_the_device_idle() {
        let wbt = Wbt::new(32, 2_000, 100_000, false).with_adaptive(false, 256, 16);
        let mut ebb = Lane::new(wbt.with_min_depth(2).with_pacing(25, 1024));
        ebb.run(0, 2_000_000, true);
        let (mut reads, sizes) = ebb.run(2_000_000, 4_000_000, true);
        assert!(sizes.iter().all(|&p| p == 1024), "paced writes are large: {sizes:?}");
        let busy = sizes.iter().map(|p| 2 * p).sum::<u64>() as f64 / 2e6;
        assert!((0.2..0.3).contains(&busy), "the device wrote {busy} of the time");
        reads.sort_unstable();
        assert_eq!(reads[reads.len() * 7 / 10], 25, "most reads find the device idle");

        ebb.run(4_000_000, 4_101_000, false);
        let (_, sizes) = ebb.run(4_101_000, 4_501_000, false);
        assert!(sizes.iter().all(|&p| p == 256), "nobody reads: the backend's largest");
        let busy = sizes.iter().map(|p| 2 * p).sum::<u64>() as f64 / 4e5;
        assert!(busy > 0.95, "nobody reads: no gap ({busy} busy)");
    }

    /// The gap is armed by a write's completion while reads are active and paced, holds
    /// background writes (not sync ones) until it ends, and is not armed when nobody read in
    /// the last 100 ms or while the duty is whole; the duty never falls under the floor.
    #[test]
    fn gap_only_while_reads_are_active() {
        let ms = |m: u64| Instant::ZERO + Duration::from_millis(m);
        let mut w = Wbt::new(32, 2_000, 100_000, false).with_adaptive(false, 256, 16);
        w = w.with_min_depth(2).with_pacing(25, 1024);
        w.on_read_issue(ms(0), 1);
        w.on_read_done(ms(1), Duration::from_micros(50), Some(1));
        w.on_write_done(ms(2), Duration::from_millis(1), 0);
        assert_eq!(w.pace_timer(), None, "the duty is whole: no gap");
        for _ in 0..8 {
            w.adaptive.as_mut().unwrap().slow();
        }
        assert_eq!(w.adaptive.as_ref().unwrap().duty, DUTY_ONE / 4, "never under the floor");
        w.on_write_done(ms(3), Duration::from_millis(1), 0);
        assert_eq!(w.pace_timer(), Some(ms(6)), "three times the service: a quarter writing");
        assert!(!w.may_issue(WbtClass::Background, 0, ms(5)));
        assert!(w.may_issue(WbtClass::Sync, 0, ms(5)));
        assert_eq!(w.limit(WbtClass::Background, ms(5)), 1, "one at a time, under the floor 2");
        w.end_gap(ms(6));
        assert_eq!(w.pace_timer(), None);
        assert!(w.may_issue(WbtClass::Background, 0, ms(6)));
        assert_eq!(w.write_pages(WbtClass::Background, 256, ms(6)), 1024);
        assert_eq!(w.write_pages(WbtClass::Sync, 256, ms(6)), 256);
        w.on_write_done(ms(200), Duration::from_millis(1), 0);
        assert_eq!(w.pace_timer(), None, "nobody read for 100 ms: no gap");
        assert!(w.may_issue(WbtClass::Background, 0, ms(200)));
        assert_eq!(w.write_pages(WbtClass::Background, 256, ms(200)), 256);
        let mut a = Adaptive::new(false, 256, 16);
        a.min_duty = DUTY_ONE / 8;
        assert!(a.slow() && a.slow() && a.slow() && !a.slow());
        assert!(a.hasten());
        assert_eq!(a.duty, DUTY_ONE / 8 + DUTY_ONE / DUTY_STEPS, "a met window adds a step");
    }

    /// With `wbt_pace_yields`, a writer throttled in `balance_dirty_pages` lifts the pacing for
    /// a second, as the kernel's algorithm lifts its limits (`wb_recent_wait`): background
    /// writes go back to back at the kernel's full depth, and the pacing returns a second after
    /// the last pause. Without it the same pause changes nothing.
    #[test]
    fn a_throttled_writer_lifts_the_pacing_when_it_yields() {
        let ms = |m: u64| Instant::ZERO + Duration::from_millis(m);
        for yields in [false, true] {
            let mut w = Wbt::new(32, 2_000, 100_000, false).with_adaptive(false, 256, 16);
            w = w.with_min_depth(2).with_pacing(25, 1024).with_pace_yield(yields);
            w.on_read_issue(ms(0), 1);
            w.on_read_done(ms(1), Duration::from_micros(50), Some(1));
            for _ in 0..8 {
                w.adaptive.as_mut().unwrap().slow();
            }
            w.on_bdp_wait(ms(2));
            w.on_read_done(ms(3), Duration::from_micros(50), Some(1));
            w.on_write_done(ms(3), Duration::from_millis(1), 0);
            if yields {
                assert_eq!(w.pace_timer(), None, "a writer was throttled: no gap");
                assert!(w.may_issue(WbtClass::Background, 1, ms(4)), "more than one in flight");
                assert_eq!(w.write_pages(WbtClass::Background, 256, ms(4)), 256, "unpaced size");
            } else {
                assert_eq!(w.pace_timer(), Some(ms(6)), "paced whatever the writer");
                assert!(!w.may_issue(WbtClass::Background, 0, ms(4)));
                assert_eq!(w.write_pages(WbtClass::Background, 256, ms(4)), 1024);
            }
            w.end_gap(ms(1_100));
            w.on_read_done(ms(1_100), Duration::from_micros(50), Some(1));
            w.on_write_done(ms(1_101), Duration::from_millis(1), 0);
            assert_eq!(w.pace_timer(), Some(ms(1_104)), "a second after the pause: paced");
            assert_eq!(w.write_pages(WbtClass::Background, 256, ms(1_102)), 1024);
        }
    }

    /// A device whose reads alone have a p99 2.2 times their fastest (every 50th read 55 us,
    /// the others 25) and whose writes cost reads nothing. Until reads alone have taught it
    /// the idle tail, the target is 1.25 times the fastest read, which reads miss beside the
    /// writes as they do alone, so the duty falls to the floor (12%). A second and a half of
    /// reading alone (1,500 reads) teaches it the tail: the target is then the tail plus a
    /// quarter of the fastest read (49 + 6.25 us, 55 us in the bucket from 49 us), reads beside
    /// the writes meet it, and
    /// the duty rises a step a window until writes are unpaced again.
    #[test]
    fn the_target_is_learned_from_the_idle_tail_and_the_duty_rises_when_reads_meet_it() {
        let wbt = Wbt::new(32, 2_000, 100_000, false).with_adaptive(false, 256, 16);
        let mut ebb = Lane::new(wbt.with_min_depth(2).with_pacing(12, 1024));
        (ebb.slow_every, ebb.serial) = (50, false);
        let near_floor = DUTY_ONE * 12 / 100 + 2 * DUTY_ONE / DUTY_STEPS;
        ebb.run(0, 1_000_000, true);
        assert_eq!(ebb.wbt.min_lat_nsec(), 31_250, "no idle tail yet: 1.25 times the fastest");
        assert!(ebb.wbt.duty() <= near_floor, "reads miss it: the floor");
        ebb.writing = false;
        ebb.run(1_000_000, 2_500_000, true);
        assert_eq!(ebb.wbt.min_lat_nsec(), 49_152 + 6_250, "the idle tail and a margin");
        assert!(ebb.wbt.duty() <= near_floor, "no writes: no window judged");
        ebb.writing = true;
        let (_, sizes) = ebb.run(2_500_000, 5_000_000, true);
        assert_eq!(ebb.wbt.min_lat_nsec(), 49_152 + 6_250);
        assert_eq!(ebb.wbt.duty(), DUTY_ONE, "reads meet the target: the duty rose");
        assert!(sizes.iter().rev().take(100).all(|&p| p == 256), "unpaced, back to back");
    }

    /// The same reads beside writes they wait for (a read arriving during a 4 MiB write waits
    /// out its 2 ms, and one issued in the millisecond after it takes 300 us), after a second
    /// and a half of reading alone: a duty over the floor makes more than one read in a
    /// hundred miss the target, so the duty stays at the floor, where most reads find the
    /// device idle. The reads in the gaps between writes, one in fifteen of them delayed by
    /// the write before, do not move the target.
    #[test]
    fn writes_that_make_reads_miss_the_tail_target_keep_the_duty_at_the_floor() {
        let wbt = Wbt::new(32, 2_000, 100_000, false).with_adaptive(false, 256, 16);
        let mut ebb = Lane::new(wbt.with_min_depth(2).with_pacing(12, 1024));
        (ebb.slow_every, ebb.writing, ebb.aftermath) = (50, false, true);
        ebb.run(0, 1_500_000, true);
        ebb.writing = true;
        ebb.run(1_500_000, 2_500_000, true);
        let mut duties = Vec::new();
        let mut reads = Vec::new();
        for from in (2_500_000..5_500_000).step_by(100_000) {
            reads.extend(ebb.run(from, from + 100_000, true).0);
            duties.push(ebb.wbt.duty());
        }
        assert_eq!(ebb.wbt.min_lat_nsec(), 49_152 + 6_250, "learned reading alone");
        let floor = DUTY_ONE * 12 / 100;
        assert!(duties.iter().all(|&d| d <= floor + DUTY_ONE / DUTY_STEPS), "{duties:?}");
        assert!(duties.iter().filter(|&&d| d == floor).count() * 2 > duties.len());
        reads.sort_unstable();
        assert_eq!(reads[reads.len() * 7 / 10], 25, "most reads find the device idle");
    }

    /// Paced writes slow enough that few fit in a window (8 ms each: at the 12% floor, one or
    /// two a window), beside reads that wait for them: a window with a single write is still
    /// judged by its reads, so the duty stays at the floor rather than rising on windows too
    /// thin in writes to count (the kernel's three-write minimum).
    #[test]
    fn windows_with_few_paced_writes_are_judged() {
        let wbt = Wbt::new(32, 2_000, 100_000, false).with_adaptive(false, 256, 16);
        let mut ebb = Lane::new(wbt.with_min_depth(2).with_pacing(12, 1024));
        (ebb.slow_every, ebb.writing, ebb.us_per_page) = (50, false, 8);
        ebb.run(0, 1_500_000, true);
        ebb.writing = true;
        ebb.run(1_500_000, 2_500_000, true);
        let mut duties = Vec::new();
        for from in (2_500_000..5_500_000).step_by(100_000) {
            ebb.run(from, from + 100_000, true);
            duties.push(ebb.wbt.duty());
        }
        let floor = DUTY_ONE * 12 / 100;
        let near = duties.iter().filter(|&&d| d <= floor + DUTY_ONE / DUTY_STEPS).count();
        assert!(near * 10 >= duties.len() * 9, "the duty left the floor: {duties:?}");
    }

    /// Reads that overlapped a write, or were issued within one write's service after it
    /// completed, are not idle reads; the tail is the p99's bucket and forgets old reads.
    #[test]
    fn the_idle_tail_counts_reads_that_found_no_write() {
        let us = |u: u64| Instant::ZERO + Duration::from_micros(u);
        let mut a = Adaptive::new(false, 256, 16);
        for i in 0..2_000u64 {
            a.read_done(us(100 * i), Duration::from_micros(if i % 200 == 0 { 300 } else { 40 }));
        }
        assert_eq!(a.idle_tail.p99(), Some(32_768), "40 us reads' bucket: 1 in 200 over");
        a.write_issued();
        a.read_done(us(300_000), Duration::from_micros(500));
        a.write_done(us(300_010), Duration::from_millis(2), 0);
        a.read_done(us(300_020), Duration::from_micros(500));
        a.read_done(us(302_050), Duration::from_micros(100));
        assert_eq!(a.idle_tail.total, 2_000, "in service, done during, done just before");
        a.read_done(us(302_200), Duration::from_micros(100));
        assert_eq!(a.idle_tail.total, 2_001, "issued a write's service after it");
        for i in 0..20_000u64 {
            a.read_done(us(400_000 + 100 * i), Duration::from_micros(90));
        }
        assert_eq!(a.idle_tail.p99(), Some(81_920), "older reads forgotten");
        assert!(a.idle_tail.total < 2 * TAIL_SAMPLES);
        assert_eq!(IdleTail::bucket(500), 0);
        assert_eq!(IdleTail::bucket(u64::MAX), TAIL_BUCKETS - 1);
    }

    /// The size floor is the backend's own largest write when that is smaller.
    #[test]
    fn floor_and_growth() {
        let mut a = Adaptive::new(false, 8, 16);
        assert!(!a.shrink());
        assert_eq!(a.write_pages(), 8);
        let mut a = Adaptive::new(false, 256, 16);
        for _ in 0..4 {
            assert!(a.shrink());
        }
        assert!(!a.shrink(), "at the floor");
        assert_eq!((a.size_shift, a.write_pages()), (4, 16));
        assert!(a.grow());
        assert_eq!(a.write_pages(), 32);
        assert_eq!(a.learn(30_000), Some(37_500));
        assert_eq!(a.learn(5_000), Some(TARGET_FLOOR_NS), "never under the floor");
        assert_eq!(a.learn(21_000), Some(20_000), "rises by 1/16 of the difference");
        let mut a = Adaptive::new(false, 256, 16);
        (0..TAIL_MIN_SAMPLES).for_each(|_| a.idle_tail.record(400_000));
        assert_eq!(a.learn(30_000), Some(TAIL_CAP * 30_000), "a slow tail: at most the cap");
        (0..100_000).for_each(|_| a.idle_tail.record(40_000));
        assert_eq!(a.learn(30_000), Some(32_768 + 7_500), "the tail plus a quarter of the fastest");
    }
}
