//! Flexible proportions: each backend's share of recent writeback completions.
//!
//! # Goal
//! Measure which fraction of recently completed writeback pages belongs to each backend, with
//! exponential forgetting, so fast devices get a large share of the dirty threshold and slow
//! ones a small share (docs/mechanisms.md#floating-proportions).
//!
//! # Signals
//! One event per completed page, tagged with its backend. Time is divided into periods of
//! `VM_COMPLETIONS_PERIOD_LEN` (3 s); at each period boundary every count is halved.
//!
//! # Control law
//! ```text
//! p_j = sum_i x_{i,j} / 2^(i+1)  /  sum_i x_i / 2^(i+1)
//! ```
//! where `x_{i,j}` is backend j's completions `i` periods ago: a geometric moving average with
//! a 3 s half-life. Aging is lazy (applied when a count is next touched) but gives the same
//! numbers as the kernel's timer, which is what makes it deterministic here.
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | period | 3 | s | kernel `VM_COMPLETIONS_PERIOD_LEN = 3*HZ` |
//! | max fraction base | 1024 | - | kernel `FPROP_FRAC_BASE` |
//!
//! # Insufficient data
//! The global count starts at 1 (never 0/0). A backend with no events has fraction 0. When the
//! global count has aged to at most 1, aging stops (all fractions are already ~0), as the
//! kernel's timer stops re-arming.
//!
//! # Stability
//! Halving per period bounds the memory of the estimate; `max_ratio` stops a backend's count
//! from growing past its cap, so a capped backend cannot starve others of share.
//!
//! # Observability
//! The fraction appears as `wb_thresh` in `balance_dirty_pages` traces (`bdi_setpoint`).

use crate::time::{Duration, Instant};

/// Length of one aging period.
pub(crate) const PERIOD: Duration = Duration::from_secs(3);
/// Fixed-point base of `max_ratio` fractions.
pub(crate) const FRAC_BASE: u64 = 1024;

/// The global count.
#[derive(Clone, Debug)]
pub(crate) struct Proportions {
    events: u64,
    period: u64,
    period_start: Instant,
}

/// One backend's count.
#[derive(Clone, Debug, Default)]
pub(crate) struct Local {
    events: u64,
    period: u64,
}

impl Proportions {
    /// A fresh global count whose first period starts at `now`.
    pub(crate) fn new(now: Instant) -> Proportions {
        Proportions { events: 1, period: 0, period_start: now }
    }

    /// Ages the global count to `now`.
    pub(crate) fn advance(&mut self, now: Instant) {
        let elapsed = now.saturating_since(self.period_start).as_nanos() / PERIOD.as_nanos();
        if elapsed == 0 {
            return;
        }
        self.period_start += PERIOD.saturating_mul(elapsed);
        if self.events <= 1 {
            // Everything has aged to ~0 already: jump periods without changing counts, as the
            // kernel's idle timer does (locals reflect the jump when next touched).
            self.period += elapsed;
            return;
        }
        self.events = if elapsed >= 64 { 0 } else { self.events >> elapsed }.max(1);
        self.period += elapsed;
    }

    fn reflect(&self, local: &Local) -> u64 {
        let gap = self.period.saturating_sub(local.period);
        if gap >= 64 { 0 } else { local.events >> gap }
    }

    /// Records `n` completions for `local` at `now`. With `max_frac < FRAC_BASE` the events
    /// are dropped once the local fraction already exceeds `max_frac / FRAC_BASE`.
    pub(crate) fn add(&mut self, now: Instant, local: &mut Local, n: u64, max_frac: u64) {
        self.advance(now);
        local.events = self.reflect(local);
        local.period = self.period;
        if max_frac < FRAC_BASE {
            // Keep local / global <= max_frac / FRAC_BASE after the add.
            let allowed =
                (u128::from(self.events) * u128::from(max_frac) / u128::from(FRAC_BASE)) as u64;
            if local.events >= allowed {
                return;
            }
        }
        local.events += n;
        self.events += n;
    }

    /// The fraction `(num, den)` of recent completions that are `local`'s, `0 <= num <= den`,
    /// `den >= 1`.
    pub(crate) fn fraction(&self, local: &Local) -> (u64, u64) {
        let den = self.events.max(1);
        let num = self.reflect(local).min(den);
        (num, den)
    }
}

/// The 2.6.3x event-count proportions used by the `legacy` and `bandwidth-2010` policies for
/// each writer's share of recent dirtying (docs/mechanisms.md#floating-proportions): a period is
/// `2^shift` events
/// and counts halve at each period boundary.
#[derive(Clone, Debug)]
pub(crate) struct EventProportions {
    half: u64,
    in_period: u64,
    events: u64,
    period: u64,
}

impl EventProportions {
    /// Periods of `2^shift` events; the kernel chose `shift = 2 + ilog2(dirty_total - 1)`, so
    /// half a period is about the dirty limit. Counts halve every `2^(shift-1)` events.
    pub(crate) fn new(shift: u32) -> EventProportions {
        EventProportions {
            half: 1 << shift.max(1).saturating_sub(1),
            in_period: 0,
            events: 0,
            period: 0,
        }
    }

    fn reflect(&self, local: &Local) -> u64 {
        let gap = self.period.saturating_sub(local.period);
        if gap >= 64 { 0 } else { local.events >> gap }
    }

    /// Records `n` events for `local`, halving every count at each period boundary crossed.
    pub(crate) fn add(&mut self, local: &mut Local, n: u64) {
        let mut left = n;
        while left > 0 {
            local.events = self.reflect(local);
            local.period = self.period;
            let piece = left.min(self.half - self.in_period);
            local.events += piece;
            self.events += piece;
            self.in_period += piece;
            left -= piece;
            if self.in_period == self.half {
                self.in_period = 0;
                self.period += 1;
                self.events >>= 1;
            }
        }
    }

    /// `local`'s fraction of recent events.
    pub(crate) fn fraction(&self, local: &Local) -> (u64, u64) {
        let den = self.events.max(1);
        (self.reflect(local).min(den), den)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Instant {
        Instant::ZERO + Duration::from_secs(secs)
    }

    /// Two backends with a 3:1 completion ratio get fractions 3/4 and 1/4.
    #[test]
    fn fractions_follow_completion_ratio() {
        let mut p = Proportions::new(at(0));
        let (mut a, mut b) = (Local::default(), Local::default());
        for _ in 0..100 {
            p.add(at(1), &mut a, 3, FRAC_BASE);
            p.add(at(1), &mut b, 1, FRAC_BASE);
        }
        let (na, da) = p.fraction(&a);
        let (nb, db) = p.fraction(&b);
        assert!((na * 1000 / da).abs_diff(750) <= 3);
        assert!((nb * 1000 / db).abs_diff(250) <= 3);
    }

    /// A backend that stops completing loses half its weight every period.
    #[test]
    fn idle_backend_decays_by_half_per_period() {
        let mut p = Proportions::new(at(0));
        let (mut a, mut b) = (Local::default(), Local::default());
        p.add(at(0), &mut a, 1000, FRAC_BASE);
        p.add(at(0), &mut b, 1000, FRAC_BASE);
        // Two periods later only b completes.
        p.add(at(6), &mut b, 1000, FRAC_BASE);
        let (na, da) = p.fraction(&a);
        // a: 1000 >> 2 = 250; total: 2001 >> 2 = 500 + 1000 = 1500.
        assert_eq!((na, da), (250, 1500));
    }

    /// A capped backend stops accumulating once its fraction reaches max_ratio.
    #[test]
    fn max_ratio_caps_the_fraction() {
        let mut p = Proportions::new(at(0));
        let (mut a, mut b) = (Local::default(), Local::default());
        for _ in 0..1000 {
            p.add(at(0), &mut a, 10, FRAC_BASE / 10);
            p.add(at(0), &mut b, 1, FRAC_BASE);
        }
        let (na, da) = p.fraction(&a);
        assert!(na * 100 / da <= 11, "{na}/{da}");
    }

    /// Event-count periods halve the counts every 2^shift / 2 events.
    #[test]
    fn event_proportions_age_by_events() {
        let mut p = EventProportions::new(10);
        let (mut a, mut b) = (Local::default(), Local::default());
        p.add(&mut a, 10_000);
        p.add(&mut b, 10_000);
        let (na, da) = p.fraction(&a);
        let (nb, db) = p.fraction(&b);
        assert!(nb * 1000 / db > 900, "recent writer dominates: {nb}/{db}");
        assert!(na * 1000 / da < 100, "old writer faded: {na}/{da}");
    }
}
