//! Writer throttling (`balance_dirty_pages`): the three policies (docs/throttling.md).
//!
//! # Goal
//! Slow each dirtying writer so the cache's dirty pages stay bounded and, for `ioless`, settle
//! at the setpoint with the writers' combined rate equal to the devices' write bandwidth,
//! without a writer ever issuing IO or stalling for long.
//!
//! # Signals
//! One read of the global counters and at most one of the writer's backend per check
//! (`Stats::global_counter_reads`, docs/mechanisms.md#8-cheap-throttle-path); the writer's own
//! `nr_dirtied` and
//! `dirty_paused_when`; the backend's bandwidth and ratelimit estimates.
//!
//! # Control law
//! ```text
//! ioless:          freerun: no pause, next check after sqrt(thresh - dirty) pages
//!                  else task_rate = dirty_ratelimit * pos_ratio
//!                       pause = pages_dirtied / task_rate - think_time,
//!                       clamped to [min_pause, max_pause]; task_rate 0 = max pause, loop
//! bandwidth-2010:  A = bdi_thresh - bdi_thresh/16 (heavy writer), L = A - A/16,
//!                  throttle_bw = 100 MB/s * (A - R) / (A - L) for R in (L, A],
//!                  pause = pages_dirtied / throttle_bw clamped to [1 jiffy, 200 ms];
//!                  200 ms sleeps while a limit is exceeded
//! legacy:          past freerun and over the (task-reduced) backend limit: the writer
//!                  writes 1.5x its ratelimit itself (2.6.24-2.6.31: whenever the backend has
//!                  reclaimable pages), then sleeps 1, 2, 4 .. 100 ms while still over the
//!                  limit; its era's flusher writes fixed 4 MiB chunks and backs off while
//!                  the queue is congested, so writers find files free between chunks
//! ```
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | MAX_PAUSE | 200 ms (HZ/5 jiffies, at least 1) | ms | kernel |
//! | BANDWIDTH_INTERVAL | 200 ms (HZ/5 jiffies, at least 1) | ms | kernel |
//! | dirty_exceeded ratelimit | 8 | pages | kernel (32 KiB) |
//! | legacy pause cap | HZ/10 | jiffies | 2.6.3x |
//! | legacy write_chunk | 1.5 x ratelimit | pages | 2.6.3x `sync_writeback_pages` |
//! | 2010 soft ratio | 16 | - | posting's `DIRTY_SOFT_THROTTLE_RATIO` |
//! | 2010 bandwidth | 100 MB/s | - | hard-coded in the posted draft |
//!
//! # Insufficient data
//! Before any bandwidth sample the estimates are 100 MB/s. A writer with no previous pause
//! gets no think-time credit. Far below the limit no counter is read more than once.
//!
//! # Stability
//! See [`crate::position`] and [`crate::bandwidth`]; the pause is clamped and unpaid time is
//! carried as debt through `dirty_paused_when` (at most one extra max pause), so a sudden drop
//! of the rate does not produce one huge sleep.
//!
//! # Observability
//! `balance_dirty_pages` and `bdi_dirty_ratelimit` trace lines; `Stats::throttle_checks`,
//! `global_counter_reads`, `throttled_calls`, `writer_writeback_pages`.

use crate::bandwidth::{RATELIMIT_CALC_SHIFT, bandwidth_interval_jiffies};
use crate::config::{PAGE_SIZE, ThrottlePolicy};
use crate::engine::{Engine, PageMaps, WaitReason};
use crate::event::{Action, IoError, Issuer, Verdict};
use crate::ids::{BackendId, WriterId};
use crate::limits::{self, DirtyKnobs, Thresholds};
use crate::position::max_pause_jiffies;
use crate::time::{Duration, Instant};
use crate::trace::TraceEvent;
use crate::writer::{CallState, FRAME_BATCH, Writer};

mod gate;
mod ioless;
mod shares;

pub(crate) use gate::GranuleGate;

/// Ratelimit while the backend is over its limit (32 KiB).
const DIRTY_EXCEEDED_RATELIMIT: u64 = 8;
/// The 2010 draft's fixed bandwidth, bytes/s.
const BW2010_BANDWIDTH: u64 = 100 << 20;

/// The global domain as one throttle check reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Global {
    /// Dirty + writeback + unstable: what throttling limits.
    pub(crate) dirty: u64,
    /// What writeback could reduce: dirty pages, plus unstable under legacy-2020 (the throttle's
    /// `nr_reclaimable`).
    pub(crate) reclaimable: u64,
    pub(crate) thresh: u64,
    pub(crate) bg_thresh: u64,
    pub(crate) limit: u64,
}

/// One backend as a throttle check reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backend {
    pub(crate) dirty: u64,
    pub(crate) thresh: u64,
    pub(crate) bg_thresh: u64,
}

/// What a throttle check feeds the ratelimit update ([`Engine::update_bandwidth`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RatelimitInputs {
    /// The writer's position ratio, in `RATELIMIT_CALC_SHIFT` fixed point.
    pub(crate) pos_ratio: u64,
    /// The dirty pages the position was taken against: the backend's under `strict_limit`, the
    /// cache's otherwise.
    pub(crate) dirty: u64,
    /// Their setpoint.
    pub(crate) setpoint: u64,
}

impl Engine {
    pub(crate) fn knobs(&self) -> DirtyKnobs {
        DirtyKnobs {
            dirty_ratio: self.cfg.dirty_ratio,
            dirty_bytes: self.cfg.dirty_bytes,
            dirty_background_ratio: self.cfg.dirty_background_ratio,
            dirty_background_bytes: self.cfg.dirty_background_bytes,
        }
    }

    /// The global thresholds from the current dirtyable memory.
    pub(crate) fn global_thresholds(&self) -> Thresholds {
        let file = self.global.resident.max(0) as u64;
        let avail = limits::dirtyable_memory(self.mem.free_pages(), self.mem.wmark.high, file);
        limits::thresholds(avail, &self.knobs())
    }

    /// The worst-case error of per-CPU backend counters (`wb_stat_error`).
    fn wb_stat_error(&self) -> u64 {
        let n = u64::from(self.cfg.nr_cpus);
        if n == 1 { 1 } else { n * 8 * (1 + u64::from(limits::ilog2(n))) }
    }

    /// One read of the global counters.
    pub(crate) fn read_global(&mut self) -> Global {
        self.stats.global_counter_reads += 1;
        let t = self.global_thresholds();
        let g = &self.global;
        let legacy = self.cfg.unstable_accounting.unstable_is_reclaimable();
        Global {
            dirty: g.writable() + g.writeback() + g.unstable(),
            reclaimable: g.writable() + if legacy { g.unstable() } else { 0 },
            thresh: t.thresh,
            bg_thresh: t.bg_thresh,
            limit: limits::hard_limit(t.thresh, self.dirty_limit),
        }
    }

    /// One read of a backend's counters.
    pub(crate) fn read_backend(&mut self, b: BackendId, g: &Global) -> Backend {
        self.stats.global_counter_reads += 1;
        let c = &self.wbs[b.index()].counters;
        let dirty = c.writable() + c.writeback() + c.unstable();
        let (thresh, bg_thresh) = self.wb_limits(b, g.thresh, g.bg_thresh);
        Backend { dirty, thresh, bg_thresh }
    }

    /// A writer owes a throttle check (`write_pages` returned `NextStep::Check`): fold its
    /// batch in, refill its frames, and decide. Obey the verdict before writing on.
    pub(crate) fn balance_dirty_pages<M: PageMaps>(
        &mut self,
        now: Instant,
        w: &mut Writer,
        maps: &mut M,
    ) -> Verdict {
        self.advance(now);
        w.sleep_until = None;
        self.apply_pending(w, maps);
        if w.frames.len() < FRAME_BATCH / 4 {
            let want = FRAME_BATCH - w.frames.len();
            let mut frames = std::mem::take(&mut w.frames);
            let got = self.alloc_frames(want, &mut frames, maps);
            self.reserved += got as u64;
            w.frames = frames;
        }
        if w.frames.is_empty() {
            if let Some(error) = self.memory_held() {
                // Held pages fill the cache: no memory will come until someone frees space
                // on the backend, so the write fails with their error instead of waiting.
                w.call = CallState::Idle;
                self.stats.writes_failed += 1;
                self.drive_all(maps);
                return Verdict::Fail { error };
            }
            self.memory_wait(w);
            self.drive_all(maps);
            return Verdict::Wait;
        }
        if let Some(wait) = self.granule_gate(w, maps) {
            self.drive_all(maps);
            return wait;
        }
        if let Some(sleep) = self.take_direct_throttle(w) {
            self.drive_all(maps);
            return sleep;
        }
        if w.nr_dirtied < w.ratelimit {
            self.drive_all(maps);
            return Verdict::Proceed { stalled: Duration::ZERO, throttled: false };
        }
        let Some(inode) = w.last_inode else {
            return Verdict::Proceed { stalled: Duration::ZERO, throttled: false };
        };
        let b = self.inodes[&inode].backend;
        self.completions.advance(now);
        self.stats.throttle_checks += 1;
        w.call_start = now;
        w.call_throttled = false;
        let verdict = match self.cfg.throttle {
            ThrottlePolicy::Ioless => {
                let pages = w.nr_dirtied;
                self.ioless_step(w, b, pages)
            }
            ThrottlePolicy::Legacy => {
                let ratelimit = limits::legacy_ratelimit_pages(self.mem.total(), self.cfg.nr_cpus);
                let write_chunk = w.nr_dirtied.max(ratelimit) * 3 / 2;
                w.nr_dirtied = 0;
                self.legacy_loop(w, b, 0, write_chunk, 1)
            }
            ThrottlePolicy::Bandwidth2010 => {
                let pages = w.nr_dirtied;
                w.nr_dirtied = 0;
                self.bw2010_loop(w, b, pages)
            }
        };
        self.drive_all(maps);
        self.finish_verdict(w, b, verdict)
    }

    /// A writer's sleep ended ([`Writer::paused_until`]) or it received [`Action::Resume`]:
    /// continue its throttle call.
    pub(crate) fn throttle_continue<M: PageMaps>(
        &mut self,
        now: Instant,
        w: &mut Writer,
        maps: &mut M,
    ) -> Verdict {
        w.sleep_until = None;
        self.advance(now);
        self.apply_pending(w, maps);
        self.completions.advance(now);
        let Some(b) = w.last_inode.and_then(|i| self.inodes.get(&i)).map(|m| m.backend) else {
            w.call = CallState::Idle;
            return Verdict::Proceed { stalled: Duration::ZERO, throttled: false };
        };
        let verdict = match w.call {
            CallState::Idle => Verdict::Proceed { stalled: Duration::ZERO, throttled: false },
            CallState::IolessPaused | CallState::Blocked => self.end_call(w),
            CallState::IolessOverLimit { pages_dirtied } => {
                let g = self.read_global();
                let wbd = self.read_backend(b, &g);
                if wbd.dirty <= self.wb_stat_error() {
                    // This backend is nearly empty: one stuck device must not block writers
                    // of healthy ones.
                    self.end_call(w)
                } else {
                    self.ioless_step(w, b, pages_dirtied)
                }
            }
            CallState::LegacySleeping { pages_written, write_chunk, pause } => {
                self.legacy_loop(w, b, pages_written, write_chunk, pause)
            }
            CallState::LegacyWriting { pages_written, write_chunk, pause } => {
                let issued = self.writer_written.remove(&w.id).unwrap_or(0);
                w.writeback_pages += issued;
                let pages_written = pages_written + issued;
                if pages_written >= write_chunk {
                    // Done our duty.
                    self.legacy_finish(w, b, pages_written, write_chunk)
                } else {
                    let next = (pause * 2).min((self.hz / 10).max(1));
                    w.call = CallState::LegacySleeping { pages_written, write_chunk, pause: next };
                    Verdict::Sleep { until: self.now + Duration::from_jiffies(pause, self.hz) }
                }
            }
            CallState::Bw2010Paused { pages_dirtied } => {
                self.bw2010_check_exceeded(w, b, pages_dirtied, true)
            }
        };
        self.drive_all(maps);
        self.finish_verdict(w, b, verdict)
    }

    fn finish_verdict(&mut self, w: &mut Writer, b: BackendId, verdict: Verdict) -> Verdict {
        if matches!(verdict, Verdict::Sleep { .. }) && self.wbs[b.index()].outage_reported {
            // The backend has been unreachable past its retry timeout: a writer it would
            // throttle fails instead of pausing on and on (write-error policy, `engine`).
            w.call = CallState::Idle;
            w.total_stalled += self.now.saturating_since(w.call_start);
            self.stats.writes_failed += 1;
            return Verdict::Fail { error: IoError { errno: crate::event::errno::EIO } };
        }
        if let Verdict::Proceed { stalled, .. } = verdict {
            w.total_stalled += stalled;
            if stalled > Duration::ZERO {
                self.stats.throttled_calls += 1;
            }
        }
        w.note(verdict)
    }

    pub(super) fn end_call(&mut self, w: &mut Writer) -> Verdict {
        w.call = CallState::Idle;
        Verdict::Proceed {
            stalled: self.now.saturating_since(w.call_start),
            throttled: w.call_throttled,
        }
    }

    pub(super) fn set_ratelimit(&self, w: &mut Writer, b: BackendId) {
        w.ratelimit = if self.wbs[b.index()].dirty_exceeded {
            w.nr_dirtied_pause.min(DIRTY_EXCEEDED_RATELIMIT)
        } else {
            w.nr_dirtied_pause
        };
    }

    /// One update of the backend's bandwidth (and, from a throttle check, its ratelimit and
    /// the global smoothed limit, against `thresh` and the cache's dirty pages `gdirty`).
    pub(crate) fn update_bandwidth(
        &mut self,
        b: BackendId,
        now_j: u64,
        ratelimit: Option<RatelimitInputs>,
        thresh: u64,
        gdirty: u64,
    ) {
        let hz = self.hz;
        let interval = bandwidth_interval_jiffies(hz);
        if ratelimit.is_some() && now_j.saturating_sub(self.dirty_limit_stamp) >= interval {
            self.dirty_limit = limits::follow_dirty_limit(self.dirty_limit, thresh, gdirty);
            self.dirty_limit_stamp = now_j;
        }
        let wb = &mut self.wbs[b.index()];
        let elapsed = now_j.saturating_sub(wb.rates.bw_time_stamp);
        let (written, dirtied) = (wb.counters.written, wb.counters.dirtied);
        if let Some(RatelimitInputs { pos_ratio, dirty, setpoint }) = ratelimit {
            wb.rates.update_dirty_ratelimit(elapsed, dirtied, pos_ratio, dirty, setpoint, hz);
        }
        wb.rates.update_write_bandwidth(elapsed, written, hz);
        wb.rates.restart(now_j, written, dirtied);
        if ratelimit.is_some() && self.cfg.trace {
            let r = self.wbs[b.index()].rates.clone();
            let task =
                ratelimit.map_or(0, |i| (r.dirty_ratelimit * i.pos_ratio) >> RATELIMIT_CALC_SHIFT);
            self.record(TraceEvent::BdiDirtyRatelimit {
                bdi: b,
                write_bw_kbps: r.write_bandwidth * 4,
                avg_write_bw_kbps: r.avg_write_bandwidth * 4,
                dirty_rate_kbps: r.dirty_rate * 4,
                dirty_ratelimit_kbps: r.dirty_ratelimit * 4,
                task_ratelimit_kbps: task * 4,
                balanced_dirty_ratelimit_kbps: r.balanced_dirty_ratelimit * 4,
            });
        }
    }

    /// Bandwidth upkeep at the start of a `do_writepages`: restart after long idleness, and a
    /// bandwidth-only update every 200 ms of continuous writeback.
    pub(crate) fn bandwidth_at_writepages(&mut self, b: BackendId) {
        let now_j = self.now.jiffies(self.hz);
        let wb = &self.wbs[b.index()];
        let idle = self.now.saturating_since(wb.last_completion) > Duration::from_secs(1)
            && wb.counters.writeback() == 0;
        if idle {
            let (written, dirtied) = (wb.counters.written, wb.counters.dirtied);
            self.wbs[b.index()].rates.restart(now_j, written, dirtied);
        } else {
            self.bandwidth_tick(b);
        }
    }

    /// A bandwidth-only update if 200 ms have passed (the writepages path), unless throttled
    /// writers are updating the estimates (`Engine::writers_update_rates`).
    pub(crate) fn bandwidth_tick(&mut self, b: BackendId) {
        let now_j = self.now.jiffies(self.hz);
        if !self.writers_update_rates(b)
            && now_j.saturating_sub(self.wbs[b.index()].rates.bw_time_stamp)
                >= bandwidth_interval_jiffies(self.hz)
        {
            self.update_bandwidth(b, now_j, None, 0, 0);
        }
    }

    // ----- legacy -----

    fn legacy_loop(
        &mut self,
        w: &mut Writer,
        b: BackendId,
        pages_written: u64,
        write_chunk: u64,
        pause: u64,
    ) -> Verdict {
        let g = self.read_global();
        if self.cfg.throttle_counter_reads.rereads_global_counters() {
            // 2.6.31 read the global counters again for the limits it then clipped the
            // backend's share with; the values are the same in a step of virtual time, only
            // the reads count (docs/throttling.md, Kennedy 2009).
            self.read_global();
        }
        let nr_reclaimable = self.global.writable() + self.global.unstable();
        let nr_writeback = self.global.writeback();
        if nr_reclaimable + nr_writeback <= limits::freerun(g.thresh, g.bg_thresh) {
            return self.legacy_finish(w, b, pages_written, write_chunk);
        }
        w.call_throttled = true;
        let wbd = self.read_backend(b, &g);
        let (num, den) = self.dirty_shares.fraction(&w.dirty_share);
        let bdi_thresh = limits::task_dirty_limit(wbd.thresh, num, den, 8);
        let c = &self.wbs[b.index()].counters;
        let bdi_reclaimable = c.writable() + c.unstable();
        let bdi_writeback = c.writeback();
        let exceeded = bdi_reclaimable + bdi_writeback > bdi_thresh
            || nr_reclaimable + nr_writeback > g.thresh;
        if !exceeded {
            return self.legacy_finish(w, b, pages_written, write_chunk);
        }
        self.wbs[b.index()].dirty_exceeded = true;
        // 2.6.24-2.6.31 wrote whenever the backend had reclaimable pages; 2.6.32-2.6.36 only
        // when they alone exceeded bdi_thresh, which made writer IO rare (the 2010 posting's
        // "before" trace shows pages_written=0 in 14 of 15 calls). The product's legacy policy
        // is the writer that writes back 1.5x its ratelimit: the original form.
        if bdi_reclaimable > 0
            && self.legacy_writeback_start(w.id, b, write_chunk - pages_written.min(write_chunk))
        {
            w.call = CallState::LegacyWriting { pages_written, write_chunk, pause };
            self.waiters.insert(w.id, WaitReason::OwnWriteback);
            return Verdict::Wait;
        }
        let next = (pause * 2).min((self.hz / 10).max(1));
        w.call = CallState::LegacySleeping { pages_written, write_chunk, pause: next };
        Verdict::Sleep { until: self.now + Duration::from_jiffies(pause, self.hz) }
    }

    fn legacy_finish(
        &mut self,
        w: &mut Writer,
        b: BackendId,
        pages_written: u64,
        write_chunk: u64,
    ) -> Verdict {
        let t = self.global_thresholds();
        let c = &self.wbs[b.index()].counters;
        let wb_thresh = self.wb_thresh(b, t.thresh);
        let still = c.writable() + c.unstable() + c.writeback() > wb_thresh;
        if !still {
            self.wbs[b.index()].dirty_exceeded = false;
        }
        self.end_legacy_call(w, b, t.bg_thresh);
        let paused = self.now.saturating_since(w.call_start);
        self.record(TraceEvent::LegacyBalanceDirtyPages {
            writer: w.id,
            bdi: b,
            write_chunk,
            pages_written,
            pause_ms: paused.as_millis(),
        });
        self.end_call(w)
    }

    /// The legacy writer's submitter finished taking pages from a file. The writer goes on
    /// once its writes have completed: the product's legacy writer "submits the IO itself and
    /// waits". (The kernel's `WB_SYNC_NONE` writeback returned after submission, blocking only
    /// for request slots; modelled that way a single dd's stalls measured 0..160 ms instead of
    /// 0..1219 ms, against the posting's 0..324 ms. One file per round is modelled; the kernel's
    /// `writeback_inodes_wb` may go on to further files, here the next round takes the next.)
    pub(crate) fn legacy_writeback_submitted(&mut self, w: WriterId, written: u64) {
        *self.writer_written.entry(w).or_insert(0) += written;
        if self.writer_ios.get(&w).copied().unwrap_or(0) == 0 {
            self.resume_writer(w);
        }
    }

    /// One of a legacy writer's own writes completed.
    pub(crate) fn writer_io_done(&mut self, w: WriterId) {
        let left = self.writer_ios.get_mut(&w).expect("writer io");
        *left -= 1;
        let submitting = self.wbs.iter().any(|wb| wb.submissions.has(Issuer::Writer(w)));
        if *left == 0 && !submitting {
            self.writer_ios.remove(&w);
            self.resume_writer(w);
        }
    }

    fn resume_writer(&mut self, w: WriterId) {
        if self.waiters.get(&w) == Some(&WaitReason::OwnWriteback) {
            self.waiters.remove(&w);
            self.emit(Action::Resume { writer: w });
        }
    }

    // ----- bandwidth-2010 -----

    fn bw2010_loop(&mut self, w: &mut Writer, b: BackendId, pages_dirtied: u64) -> Verdict {
        let g = self.read_global();
        let nr_reclaimable = self.global.writable() + self.global.unstable();
        let nr_writeback = self.global.writeback();
        if nr_reclaimable + nr_writeback <= limits::freerun(g.thresh, g.bg_thresh) {
            return self.bw2010_finish(w, b);
        }
        w.call_throttled = true;
        // Past freerun the writer waits for writeback it does not do itself: make sure the
        // flusher runs (the posting's loop starts background writeback when none is in
        // progress). Without it a writer over its limit could wait for a flusher nobody woke.
        if !self.writeback_in_progress(b) && nr_reclaimable > g.bg_thresh {
            self.wake_flusher(b);
        }
        let wbd = self.read_backend(b, &g);
        let (num, den) = self.dirty_shares.fraction(&w.dirty_share);
        let a = limits::task_dirty_limit(wbd.thresh, num, den, 16);
        let r = wbd.dirty;
        if r > a - a / 16 {
            let gap = a.saturating_sub(r);
            let bw =
                (u128::from(BW2010_BANDWIDTH) * u128::from(gap) / u128::from(a / 16 + 1)) as u64;
            let pause = (u128::from(self.hz) * u128::from(pages_dirtied * PAGE_SIZE)
                / u128::from(bw + 1)) as u64;
            let pause = pause.clamp(1, max_pause_jiffies(self.hz));
            self.record(TraceEvent::Bw2010BalanceDirtyPages {
                writer: w.id,
                bdi: b,
                weight_pct: 100 * num / den.max(1),
                thresh: a,
                gap,
                dirtied: pages_dirtied,
                pause_ms: Duration::from_jiffies(pause, self.hz).as_millis(),
                bw,
            });
            w.call = CallState::Bw2010Paused { pages_dirtied };
            return Verdict::Sleep { until: self.now + Duration::from_jiffies(pause, self.hz) };
        }
        self.bw2010_check_exceeded(w, b, pages_dirtied, false)
    }

    fn bw2010_check_exceeded(
        &mut self,
        w: &mut Writer,
        b: BackendId,
        pages_dirtied: u64,
        paused: bool,
    ) -> Verdict {
        let g = self.read_global();
        let wbd = self.read_backend(b, &g);
        let (num, den) = self.dirty_shares.fraction(&w.dirty_share);
        let a = limits::task_dirty_limit(wbd.thresh, num, den, 16);
        let nr = self.global.writable() + self.global.unstable() + self.global.writeback();
        let exceeded = wbd.dirty > a || nr > g.thresh;
        if !exceeded {
            return self.bw2010_finish(w, b);
        }
        self.wbs[b.index()].dirty_exceeded = true;
        if paused {
            return self.bw2010_loop(w, b, pages_dirtied);
        }
        // Over a limit without a soft pause this round: the posting sleeps 200 ms.
        w.call = CallState::Bw2010Paused { pages_dirtied };
        Verdict::Sleep {
            until: self.now + Duration::from_jiffies(max_pause_jiffies(self.hz), self.hz),
        }
    }

    /// The end of a 2.6.3x-style call (legacy and 2010 policies): wake the flusher if the
    /// reclaimable pages (dirty and unstable, as 2.6.3x counted them) exceed `bg_thresh`, and
    /// set the entry ratelimit: `ratelimit_pages`, or 8 pages while the backend is over its limit.
    fn end_legacy_call(&mut self, w: &mut Writer, b: BackendId, bg_thresh: u64) {
        if self.cfg.throttle_counter_reads.rereads_global_counters() {
            // 2.6.31 re-read the global counters for the background test after the loop;
            // since Kennedy's reorder the loop's copies are reused.
            self.read_global();
        }
        let reclaimable = self.global.writable() + self.global.unstable();
        if !self.writeback_in_progress(b) && reclaimable > bg_thresh {
            self.wake_flusher(b);
        }
        let ratelimit = limits::legacy_ratelimit_pages(self.mem.total(), self.cfg.nr_cpus);
        w.nr_dirtied_pause = ratelimit;
        w.ratelimit =
            if self.wbs[b.index()].dirty_exceeded { DIRTY_EXCEEDED_RATELIMIT } else { ratelimit };
    }

    /// The 2010 call ends below its limits: the backend is no longer exceeded.
    fn bw2010_finish(&mut self, w: &mut Writer, b: BackendId) -> Verdict {
        self.wbs[b.index()].dirty_exceeded = false;
        let bg_thresh = self.global_thresholds().bg_thresh;
        self.end_legacy_call(w, b, bg_thresh);
        self.end_call(w)
    }
}
