//! A backend's share of the thresholds (the control law is `crate::limits`'): its completion
//! fraction's share, capped by `max_ratio` and by `dirty_seconds` of its write bandwidth.

use crate::engine::Engine;
use crate::ids::BackendId;
use crate::limits;

impl Engine {
    /// A backend's share of `thresh`.
    pub(crate) fn wb_thresh(&self, b: BackendId, thresh: u64) -> u64 {
        let (num, den) = self.completions.fraction(&self.wbs[b.index()].share);
        let cfg = &self.cfg.backends[b.index()];
        limits::wb_thresh(thresh, num, den, self.min_ratio_sum, cfg.min_ratio, cfg.max_ratio)
    }

    /// A backend's thresholds: its shares of `thresh` and `bg_thresh`, each capped at its
    /// `dirty_seconds` / `dirty_background_seconds` of write bandwidth (`limits::seconds_cap`).
    pub(crate) fn wb_limits(&self, b: BackendId, thresh: u64, bg_thresh: u64) -> (u64, u64) {
        let cfg = &self.cfg.backends[b.index()];
        let bw = self.wbs[b.index()].rates.avg_write_bandwidth;
        let wb = self.wb_thresh(b, thresh).min(limits::seconds_cap(cfg.dirty_seconds, bw));
        let bg = limits::wb_bg_thresh(wb, bg_thresh, thresh)
            .min(limits::seconds_cap(cfg.dirty_background_seconds, bw));
        (wb, bg)
    }

    /// The limits `b`'s writers obey below the global freerun point, if any: under
    /// `strict_limit` its thresholds; with only a `dirty_seconds` cap, the cap itself while it
    /// binds (below the global threshold: a slow backend's), and none once it is at or above
    /// the global threshold (a fast backend's), whose writers then obey the global limits as
    /// without the cap. Own limits above the global ones would let a writer run free past the
    /// global limit.
    pub(crate) fn own_limits(
        &self,
        b: BackendId,
        thresh: u64,
        bg_thresh: u64,
    ) -> Option<(u64, u64)> {
        let cfg = &self.cfg.backends[b.index()];
        if cfg.strict_limit {
            return Some(self.wb_limits(b, thresh, bg_thresh));
        }
        if cfg.dirty_seconds == 0 {
            return None;
        }
        let bw = self.wbs[b.index()].rates.avg_write_bandwidth;
        let cap = limits::seconds_cap(cfg.dirty_seconds, bw);
        if cap >= thresh {
            return None;
        }
        let bg = limits::wb_bg_thresh(cap, bg_thresh, thresh)
            .min(limits::seconds_cap(cfg.dirty_background_seconds, bw));
        Some((cap, bg))
    }
}
