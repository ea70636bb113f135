//! What a run reports: the time series sampled as it goes, and the metrics at its end (the
//! names of product.md's summary.json).

use std::collections::BTreeMap;
use std::io::Write;

use ebb_core::{BackendId, Instant};

use super::writers::WriterState;
use super::{PAGE, RunResult, Sim, TimeSeries};
use crate::output::hist::SampleStats;

/// Points kept of a run's read-latency distribution (enough for a smooth curve).
const READ_CDF_POINTS_MAX: usize = 2000;

impl Sim<'_> {
    pub(super) fn sample(&mut self) {
        let t = self.now.as_secs_f64();
        let m = self.engine.meminfo();
        let bdi = self.engine.bdi_stats(BackendId(0));
        let (freerun, setpoint) = (m.freerun, m.setpoint);
        let dirty = m.dirty + m.writeback + m.unstable;
        self.max_dirty = self.max_dirty.max(dirty);
        self.max_limit = self.max_limit.max(m.limit);
        for (b, max) in self.backend_dirty_max.iter_mut().enumerate() {
            let s = self.engine.bdi_stats(BackendId(b as u32));
            *max = (*max).max(s.dirty + s.writeback + s.unstable);
        }
        let values: [(&'static str, f64); 10] = [
            ("dirty", dirty as f64),
            ("writeback", m.writeback as f64),
            ("setpoint", setpoint as f64),
            ("limit", m.limit as f64),
            ("thresh", m.thresh as f64),
            ("bg_thresh", m.bg_thresh as f64),
            ("freerun", freerun as f64),
            ("dirty_ratelimit", (bdi.dirty_ratelimit * 4) as f64),
            ("write_bw", (bdi.write_bandwidth * 4) as f64),
            ("avg_write_bw", (bdi.avg_write_bandwidth * 4) as f64),
        ];
        for (name, v) in values {
            self.series.entry(name).or_default().push((t, v));
        }
        if bdi.wbt_target_us > 0 {
            // Writeback throttling on the first backend: its limits and the latency it saw.
            let wbt: [(&'static str, f64); 3] = [
                ("wbt_max_depth", f64::from(bdi.wbt_max_depth)),
                ("wbt_background", f64::from(bdi.wbt_background)),
                ("wbt_read_min_us", bdi.wbt_read_min_us as f64),
            ];
            for (name, v) in wbt {
                self.series.entry(name).or_default().push((t, v));
            }
        }
        for (i, sw) in self.writers.iter().enumerate() {
            self.writer_series[i].push((t, sw.w.total_dirtied() as f64));
        }
        if let Some(tr) = &mut self.trace {
            let ts = t * 1e6;
            let _ = tr.json.counter(
                1,
                "pages",
                ts,
                &[
                    ("dirty", dirty as f64),
                    ("setpoint", setpoint as f64),
                    ("limit", m.limit as f64),
                ],
            );
            let _ = tr.json.counter(
                1,
                "KB/s",
                ts,
                &[
                    ("dirty_ratelimit", (bdi.dirty_ratelimit * 4) as f64),
                    ("write_bw", (bdi.write_bandwidth * 4) as f64),
                ],
            );
        }
    }

    /// Ends the run and gathers its metrics, series and distributions.
    pub(super) fn finish(mut self) -> RunResult {
        let mut m = BTreeMap::new();
        let (elapsed, files) = self.writer_metrics(&mut m);
        self.engine_metrics(&mut m, elapsed, files);
        self.server_metrics(&mut m);
        self.per_backend_metrics(&mut m);
        if let Some(band) = self.spec.settle_within {
            self.settle_metrics(band, &mut m);
        }
        if !self.read_latency.is_empty() {
            for (name, value) in self.read_latency.percentiles_us("read_lat_us") {
                m.insert(name, value);
            }
            // The other quantiles Axboe's read-to-pipe-async prints (wbt-read-latency's rows),
            // of the same histogram.
            for (suffix, percentile) in
                [("p75", 75.0), ("p95", 95.0), ("p99_5", 99.5), ("p99_999", 99.999)]
            {
                m.insert(
                    format!("read_lat_us_{suffix}"),
                    self.read_latency.percentile_us(percentile),
                );
            }
            m.insert("read_count".into(), self.read_latency.count() as f64);
        }
        let series = self.take_series();
        if let Some(mut tr) = self.trace.take() {
            let _ = tr.txt.flush();
            let _ = tr.json.finish();
        }
        RunResult {
            name: self.spec.name.clone(),
            metrics: m,
            series,
            pauses: std::mem::take(&mut self.pauses),
            write_failures: std::mem::take(&mut self.write_failures),
            simulated_pages: self.device_pages + self.read_pages,
            read_latency_cdf: self.read_latency.cdf_us(READ_CDF_POINTS_MAX),
            writepages_sizes: self.engine.writepages_sizes().to_vec(),
        }
    }

    /// Runs whose dd writers write to more than one backend: per backend, the most data it
    /// held unwritten (`{name}_dirty_mb_max`), its writers' rate up to their last write
    /// (`{name}_write_mb_s`) and the longest closing fsync of one of them (`{name}_sync_s`,
    /// what a sync or unmount right after the last write waits for).
    fn per_backend_metrics(&self, m: &mut BTreeMap<String, f64>) {
        let fg = || self.writers.iter().filter(|w| w.cycle.is_empty() && !w.planned);
        let written: std::collections::BTreeSet<usize> = fg().map(|w| w.backend).collect();
        if written.len() < 2 {
            return;
        }
        for b in written {
            let name = &self.engine.config().backends[b].name;
            let mine = || fg().filter(|w| w.backend == b);
            let mb = self.backend_dirty_max[b] as f64 * PAGE as f64 / 1e6;
            m.insert(format!("{name}_dirty_mb_max"), mb);
            let start = mine().filter_map(|w| w.started).min().unwrap_or(Instant::ZERO);
            let end =
                mine().filter_map(|w| w.sync_started.or(w.finished)).max().unwrap_or(self.now);
            let secs = end.saturating_since(start).as_secs_f64().max(1e-9);
            let bytes: u64 = mine().map(|w| (w.done_before + w.pos - w.seg_start) * PAGE).sum();
            m.insert(format!("{name}_write_mb_s"), bytes as f64 / 1e6 / secs);
            let sync = mine()
                .filter_map(|w| Some(w.finished?.saturating_since(w.sync_started?).as_secs_f64()))
                .fold(0.0, f64::max);
            m.insert(format!("{name}_sync_s"), sync);
        }
    }

    /// How long the first backend's estimates take to settle within `band` (a fraction) of
    /// the rate its device achieves (bytes written over the time it was busy):
    /// `bw_settle_s` for the smoothed write bandwidth; `ratelimit_settle_s` for the dirty
    /// ratelimit, against that rate shared by the backend's foreground writers (the balanced
    /// rate). Each is the first sample from which the estimate stays within the band until the
    /// writers finish, in seconds from their start; the writers' whole run when it never
    /// settles. `device_write_mb_s` is the rate, `declared_write_mb_s` the device's declared
    /// speed (what `initial_write_bandwidth = auto` starts from).
    fn settle_metrics(&self, band: f64, m: &mut BTreeMap<String, f64>) {
        let device = self.devices[0].stats();
        let busy = device.busy_time.as_secs_f64();
        if busy <= 0.0 {
            return;
        }
        let rate = device.write_bytes as f64 / busy;
        m.insert("device_write_mb_s".to_owned(), rate / 1e6);
        if let Some(declared) = self.engine.config().backends[0].declared_write_bandwidth {
            m.insert("declared_write_mb_s".to_owned(), declared as f64 / 1e6);
        }
        let fg = || self.writers.iter().filter(|w| w.cycle.is_empty() && w.backend == 0);
        let start = fg().filter_map(|w| w.started).min().unwrap_or(Instant::ZERO).as_secs_f64();
        let end = fg().filter_map(|w| w.finished).max().unwrap_or(self.now).as_secs_f64();
        let writers = fg().count().max(1) as f64;
        // The series are in KB/s (pages x 4, KiB).
        let kbps = rate / 1024.0;
        for (series, target, metric) in [
            ("avg_write_bw", kbps, "bw_settle_s"),
            ("dirty_ratelimit", kbps / writers, "ratelimit_settle_s"),
        ] {
            let points = self.series.get(series).map_or(&[][..], Vec::as_slice);
            let within = |v: f64| (v - target).abs() <= band * target;
            let mut settled_at = None;
            for &(t, v) in points.iter().filter(|p| p.0 >= start && p.0 <= end) {
                match (within(v), settled_at) {
                    (true, None) => settled_at = Some(t),
                    (false, _) => settled_at = None,
                    (true, Some(_)) => {}
                }
            }
            m.insert(metric.to_owned(), settled_at.unwrap_or(end) - start);
        }
    }

    /// The foreground writers' rates and pauses; returns the elapsed seconds and the files
    /// they finished.
    fn writer_metrics(&self, m: &mut BTreeMap<String, f64>) -> (f64, u64) {
        let fg = || self.writers.iter().filter(|w| w.cycle.is_empty());
        let start = fg().filter_map(|w| w.started).min().unwrap_or(Instant::ZERO);
        let end = fg().filter_map(|w| w.finished).max().unwrap_or(self.now);
        let elapsed = end.saturating_since(start).as_secs_f64().max(1e-9);
        let bytes: u64 = fg().map(|w| (w.done_before + w.pos - w.seg_start) * PAGE).sum();
        let files: u64 = fg().map(|w| w.files_done).sum();
        let unfinished = fg().filter(|w| w.state != WriterState::Done).count();
        m.insert("elapsed_s".to_string(), elapsed);
        m.insert("writers_unfinished".to_string(), unfinished as f64);
        m.insert("write_mb_s".to_string(), bytes as f64 / 1e6 / elapsed);
        m.insert("read_mb_s".to_string(), (self.read_pages * PAGE) as f64 / 1e6 / elapsed);
        let steady = self.spec.steady_from.as_secs_f64();
        let steady_pauses: Vec<f64> =
            self.pauses.iter().filter(|p| p.0 >= steady).map(|p| p.1).collect();
        let stats_p = SampleStats::new(steady_pauses);
        if !stats_p.is_empty() {
            m.insert("pause_ms_p50".into(), stats_p.percentile(50.0));
            m.insert("pause_ms_p99".into(), stats_p.percentile(99.0));
            m.insert("pause_ms_max".into(), stats_p.max());
            m.insert("pause_ms_min".into(), stats_p.min());
            m.insert("pause_ms_mean".into(), stats_p.mean());
            m.insert("pause_ms_stddev".into(), stats_p.stddev());
        }
        m.insert("pause_count".into(), stats_p.count() as f64);
        if self.writers.len() > 1 {
            m.insert("writer_rate_ratio".into(), self.rate_ratio());
        }
        m.insert("fsync_errors".into(), self.fsync_errors as f64);
        if self.owed_syncs > 0 {
            // Only where a close failed (fault runs): the published runs' metrics stay as
            // they were.
            m.insert("owed_syncs".into(), self.owed_syncs as f64);
        }
        m.insert("fsync_errno".into(), f64::from(self.fsync_errno));
        (elapsed, files)
    }

    /// The engine's counters: dirty peaks, throttle checks, writepages, commits, reclaim,
    /// what is left unclean, write errors.
    fn engine_metrics(&self, m: &mut BTreeMap<String, f64>, elapsed: f64, files: u64) {
        let stats = self.engine.stats().clone();
        m.insert("dirty_pages_max".into(), self.max_dirty as f64);
        m.insert("dirty_limit_pages".into(), self.max_limit as f64);
        m.insert("writer_writeback_pages".into(), stats.writer_writeback_pages as f64);
        m.insert("throttle_checks".into(), stats.throttle_checks as f64);
        m.insert(
            "global_counter_reads_per_check".into(),
            stats.global_counter_reads as f64 / stats.throttle_checks.max(1) as f64,
        );
        let (calls, pages) =
            self.writepages_at_end.unwrap_or((stats.writepages_calls, stats.writepages_pages));
        m.insert("writepages_calls".into(), calls as f64);
        m.insert("pages_per_writepages_mean".into(), pages as f64 / calls.max(1) as f64);
        m.insert("commits".into(), stats.commits as f64);
        if stats.commits > 0 {
            m.insert(
                "pages_per_commit_mean".into(),
                stats.commit_pages as f64 / stats.commits as f64,
            );
        }
        m.insert("kswapd_pages_written".into(), stats.kswapd_written as f64);
        m.insert("direct_reclaim_pages_written".into(), stats.direct_written as f64);
        m.insert("direct_reclaim_scanned".into(), stats.direct_scanned as f64);
        crate::memload::reclaim_metrics(m, &stats, elapsed, files, &self.device_waits);
        m.insert(
            "kswapd_efficiency".into(),
            if stats.kswapd_scanned == 0 {
                1.0
            } else {
                stats.kswapd_reclaimed as f64 / stats.kswapd_scanned as f64
            },
        );
        let mi = self.engine.meminfo();
        m.insert("end_unclean_pages".into(), (mi.dirty + mi.writeback + mi.unstable) as f64);
        m.insert("write_errors".into(), stats.write_errors as f64);
    }

    /// Only runs against an NFS server: what the server holds durably at the end, and the
    /// client's pages that are not clean (the crash-safety checker's inputs).
    fn server_metrics(&self, m: &mut BTreeMap<String, f64>) {
        let servers: Vec<_> = self.devices.iter().filter_map(|d| d.nfs_stats()).collect();
        if servers.is_empty() {
            return;
        }
        let sum = |f: fn(&crate::device::NfsStats) -> u64| -> f64 {
            servers.iter().map(f).sum::<u64>() as f64
        };
        m.insert("server_durable_bytes".into(), sum(|s| s.durable_bytes));
        m.insert("server_uncommitted_bytes".into(), sum(|s| s.uncommitted_bytes));
        m.insert("server_lost_bytes".into(), sum(|s| s.lost_bytes));
        m.insert("server_restarts".into(), sum(|s| s.restarts));
        m.insert("verifier_redirtied".into(), self.engine.stats().verifier_redirtied as f64);
    }

    /// The sampled series with their units, then one dirtied-pages series per writer.
    fn take_series(&mut self) -> Vec<TimeSeries> {
        let mut series: Vec<TimeSeries> = std::mem::take(&mut self.series)
            .into_iter()
            .map(|(name, points)| TimeSeries {
                unit: if name.contains("bw") || name.contains("ratelimit") {
                    "KB/s"
                } else if name.ends_with("_us") {
                    "us"
                } else if name.starts_with("wbt_") {
                    "requests"
                } else {
                    "pages"
                }
                .into(),
                name: name.into(),
                points,
            })
            .collect();
        for (i, points) in std::mem::take(&mut self.writer_series).into_iter().enumerate() {
            series.push(TimeSeries {
                name: format!("writer{i}_dirtied"),
                unit: "pages".into(),
                points,
            });
        }
        series
    }

    /// Fastest over slowest dirtying rate among writers, over the window where all of them
    /// run in steady state: from `steady_from` after the last one started to when the first
    /// one finished.
    pub(super) fn rate_ratio(&self) -> f64 {
        let last_start =
            self.writers.iter().filter_map(|w| w.started).max().unwrap_or(Instant::ZERO);
        let first_end =
            self.writers.iter().map(|w| w.finished.unwrap_or(self.now)).min().unwrap_or(self.now);
        let from = (last_start + self.spec.steady_from).as_secs_f64();
        let to = first_end.as_secs_f64();
        if to <= from {
            return f64::NAN;
        }
        let rates: Vec<f64> = self
            .writer_series
            .iter()
            .map(|s| {
                let at = |t: f64| s.iter().rev().find(|p| p.0 <= t).map_or(0.0, |p| p.1);
                (at(to) - at(from)) / (to - from)
            })
            .collect();
        let max = rates.iter().cloned().fold(f64::MIN, f64::max);
        let min = rates.iter().cloned().fold(f64::MAX, f64::min);
        if min <= 0.0 { f64::INFINITY } else { max / min }
    }
}
