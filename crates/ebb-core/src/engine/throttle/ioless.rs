//! The `ioless` policy's check (v3.2 on; the module above says its control law): past
//! freerun, the writer's rate at its position and the pause it owes for the pages it dirtied.

use super::{Backend, Global, RatelimitInputs};
use crate::bandwidth::{RATELIMIT_CALC_SHIFT, bandwidth_interval_jiffies};
use crate::engine::Engine;
use crate::event::Verdict;
use crate::ids::BackendId;
use crate::position::PositionInputs;
use crate::time::Duration;
use crate::trace::TraceEvent;
use crate::writer::{CallState, Writer};
use crate::{limits, position};

/// One `ioless` check's rates past freerun, in pages per second, and its pause bounds, in
/// jiffies.
struct Pacing {
    /// The backend's base rate.
    dirty_ratelimit: u64,
    /// The writer's rate at its position.
    task_ratelimit: u64,
    max_pause: u64,
    min_pause: u64,
    /// Pages until the next check after this pause.
    next_pause_pages: u64,
}

/// The pause a `balance_dirty_pages` trace line reports, with its period and the writer's
/// think time, in jiffies.
struct Step {
    pause: i64,
    period: i64,
    think: i64,
}

impl Engine {
    pub(super) fn ioless_step(
        &mut self,
        w: &mut Writer,
        b: BackendId,
        pages_dirtied: u64,
    ) -> Verdict {
        let now_j = self.now.jiffies(self.hz);
        let g = self.read_global();
        let own = self.own_limits(b, g.thresh, g.bg_thresh);
        let strict = own.is_some();
        let own_bg = self.cfg.backends[b.index()].dirty_seconds > 0 && self.over_bg_thresh(b);
        if (g.reclaimable > g.bg_thresh || own_bg) && !self.writeback_in_progress(b) {
            self.wake_flusher(b);
        }
        let wbd = own.map(|(thresh, bg_thresh)| Backend {
            thresh,
            bg_thresh,
            ..self.read_backend(b, &g)
        });
        let (dirty, thresh, bg) = match wbd {
            Some(d) => (d.dirty, d.thresh, d.bg_thresh),
            None => (g.dirty, g.thresh, g.bg_thresh),
        };
        if dirty <= limits::freerun(thresh, bg) {
            w.dirty_paused_when = Some(now_j);
            w.nr_dirtied = 0;
            w.nr_dirtied_pause = limits::dirty_poll_interval(dirty, thresh);
            self.set_ratelimit(w, b);
            return self.end_call(w);
        }
        w.call_throttled = true;
        self.wbs[b.index()].throttled_at = Some(self.now);
        self.wake_past_freerun(b, &g, wbd.as_ref());
        let wbd = match wbd {
            Some(d) => d,
            None => self.read_backend(b, &g),
        };
        let exceeded = wbd.dirty > wbd.thresh && (g.dirty > g.thresh || strict);
        self.wbs[b.index()].dirty_exceeded = exceeded;
        let inputs = PositionInputs {
            thresh: g.thresh,
            bg_thresh: g.bg_thresh,
            limit: g.limit,
            dirty: g.dirty,
            wb_thresh: wbd.thresh,
            wb_bg_thresh: wbd.bg_thresh,
            wb_dirty: wbd.dirty,
            avg_write_bw: self.wbs[b.index()].rates.avg_write_bandwidth,
            strict_limit: strict,
        };
        let pos_ratio = position::wb_position_ratio(&inputs);
        self.bdp_update_bandwidth(b, now_j, &g, &wbd, &inputs, pos_ratio);
        let pace = self.pacing(b, wbd.dirty, pos_ratio);
        self.ioless_pause(w, b, &inputs, &pace, pages_dirtied)
    }

    /// Past freerun writeback must run. Before the 2020 fix this woke the flusher
    /// unconditionally; with the fix (`rfc-2020` as posted, `fixed` as merged: "writeback
    /// scheduled only above the thresholds", the posting `004_*`) only while the reclaimable
    /// pages exceed thresh, so a
    /// client full of unstable pages waits for COMMITs instead of writing tiny batches. Under
    /// `strict_limit` (`wbd`: the backend's own limits) the writer is throttled by its
    /// backend's own counters, so the backend's reclaimable pages over its own threshold need
    /// writeback too: comparing only the global ones left a writer past a fresh backend's tiny
    /// threshold, with global dirty under the background threshold and no periodic writeback,
    /// throttled forever (swarm seed 155).
    fn wake_past_freerun(&mut self, b: BackendId, g: &Global, wbd: Option<&Backend>) {
        let legacy_accounting = self.cfg.unstable_accounting.unstable_is_reclaimable();
        let wb_over = wbd.is_some_and(|d| {
            let c = &self.wbs[b.index()].counters;
            c.writable() + if legacy_accounting { c.unstable() } else { 0 } > d.thresh
        });
        if !self.writeback_in_progress(b)
            && (legacy_accounting || g.reclaimable > g.thresh || wb_over)
        {
            self.wake_flusher(b);
        }
    }

    /// The writer's rate at `pos_ratio` (`dirty_ratelimit * pos_ratio`) and its pause bounds
    /// for a backend with `wb_dirty` pages (`wb_max_pause`, `wb_min_pause`).
    fn pacing(&self, b: BackendId, wb_dirty: u64, pos_ratio: u64) -> Pacing {
        let rates = &self.wbs[b.index()].rates;
        let dirty_ratelimit = rates.dirty_ratelimit;
        let avg_bw = rates.avg_write_bandwidth;
        let task_ratelimit =
            ((u128::from(dirty_ratelimit) * u128::from(pos_ratio)) >> RATELIMIT_CALC_SHIFT) as u64;
        let max_pause = position::wb_max_pause(wb_dirty, avg_bw, self.hz);
        let (min_pause, next_pause_pages) =
            position::wb_min_pause(max_pause, avg_bw, dirty_ratelimit, task_ratelimit, self.hz);
        Pacing { dirty_ratelimit, task_ratelimit, max_pause, min_pause, next_pause_pages }
    }

    /// The pause for `pages_dirtied` pages at the writer's rate, less its think time since the
    /// last pause, at most `max_pause` (the excess carried as debt in `dirty_paused_when`, at
    /// most one more max pause); at or over the limit (rate 0) the longest pause, then look
    /// again. A pause under `min_pause` is not taken ([`Engine::ioless_short_pause`]).
    fn ioless_pause(
        &mut self,
        w: &mut Writer,
        b: BackendId,
        inputs: &PositionInputs,
        pace: &Pacing,
        pages_dirtied: u64,
    ) -> Verdict {
        let hz = self.hz;
        let now_j = self.now.jiffies(hz);
        let max_pause = pace.max_pause as i64;
        let think = w.dirty_paused_when.map_or(0, |p| now_j as i64 - p as i64);
        let mut now_adj = now_j as i64;
        let (period, mut pause): (i64, i64);
        if let Some(jiffies) = (hz * pages_dirtied).checked_div(pace.task_ratelimit) {
            period = jiffies as i64;
            pause = period;
            if w.dirty_paused_when.is_some() {
                pause -= think;
            }
            if pause < pace.min_pause as i64 {
                let step = Step { pause: pause.min(0), period, think };
                self.trace_bdp(w, b, inputs, pace, pages_dirtied, step);
                return self.ioless_short_pause(w, b, pause, period, pages_dirtied);
            }
            if pause > max_pause {
                now_adj += (pause - max_pause).min(max_pause);
                pause = max_pause;
            }
        } else {
            period = max_pause;
            pause = max_pause;
        }
        self.trace_bdp(w, b, inputs, pace, pages_dirtied, Step { pause, period, think });
        w.dirty_paused_when = Some((now_adj + pause) as u64);
        w.nr_dirtied = 0;
        w.nr_dirtied_pause = pace.next_pause_pages.max(1);
        self.set_ratelimit(w, b);
        self.wbs[b.index()].wbt.on_bdp_wait(self.now);
        w.call = if pace.task_ratelimit == 0 {
            CallState::IolessOverLimit { pages_dirtied }
        } else {
            CallState::IolessPaused
        };
        Verdict::Sleep { until: self.now + Duration::from_jiffies(pause as u64, hz) }
    }

    /// A pause under `min_pause` is not taken: the writer goes on. A debt of over a second of
    /// think time is forgiven; otherwise the period is added to `dirty_paused_when` (the
    /// pause is paid later), or, with no period, the next check comes after more pages.
    fn ioless_short_pause(
        &mut self,
        w: &mut Writer,
        b: BackendId,
        pause: i64,
        period: i64,
        pages_dirtied: u64,
    ) -> Verdict {
        let now_j = self.now.jiffies(self.hz);
        if pause < -(self.hz as i64) {
            w.dirty_paused_when = Some(now_j);
            w.nr_dirtied = 0;
        } else if period > 0 {
            w.dirty_paused_when =
                Some((w.dirty_paused_when.unwrap_or(now_j) as i64 + period).max(0) as u64);
            w.nr_dirtied = 0;
        } else if w.nr_dirtied_pause <= pages_dirtied {
            w.nr_dirtied_pause += pages_dirtied;
        }
        self.set_ratelimit(w, b);
        self.end_call(w)
    }

    /// The bandwidth and ratelimit update a throttled writer runs once `BANDWIDTH_INTERVAL` has
    /// passed since the last (the kernel's `wb_update_bandwidth` from `balance_dirty_pages`):
    /// the ratelimit follows the position against the backend's own setpoint under
    /// `strict_limit`, the global setpoint otherwise.
    fn bdp_update_bandwidth(
        &mut self,
        b: BackendId,
        now_j: u64,
        g: &Global,
        wbd: &Backend,
        inputs: &PositionInputs,
        pos_ratio: u64,
    ) {
        if now_j.saturating_sub(self.wbs[b.index()].rates.bw_time_stamp)
            < bandwidth_interval_jiffies(self.hz)
        {
            return;
        }
        let (dirty, setpoint) = if inputs.strict_limit {
            let sp = if wbd.dirty < 8 { wbd.dirty + 1 } else { (wbd.thresh + wbd.bg_thresh) / 2 };
            (wbd.dirty, sp)
        } else {
            (g.dirty, inputs.setpoint())
        };
        let ratelimit = RatelimitInputs { pos_ratio, dirty, setpoint };
        self.update_bandwidth(b, now_j, Some(ratelimit), g.thresh, g.dirty);
    }

    fn trace_bdp(
        &mut self,
        w: &Writer,
        b: BackendId,
        p: &PositionInputs,
        pace: &Pacing,
        dirtied: u64,
        step: Step,
    ) {
        if !self.cfg.trace {
            return;
        }
        let hz = self.hz as i64;
        let ms = |j: i64| j * 1000 / hz;
        self.record(TraceEvent::BalanceDirtyPages {
            writer: w.id,
            bdi: b,
            limit: p.limit,
            setpoint: p.setpoint(),
            dirty: p.dirty,
            bdi_setpoint: (u128::from(p.setpoint()) * u128::from(p.wb_thresh)
                / u128::from(p.thresh + 1)) as u64,
            bdi_dirty: p.wb_dirty,
            dirty_ratelimit_kbps: pace.dirty_ratelimit * 4,
            task_ratelimit_kbps: pace.task_ratelimit * 4,
            dirtied,
            dirtied_pause: pace.next_pause_pages,
            paused_ms: self.now.saturating_since(w.call_start).as_millis() as i64,
            pause_ms: ms(step.pause),
            period_ms: ms(step.period),
            think_ms: ms(step.think),
        });
    }
}
