//! `read-under-write --write-rate`: writers held to one application rate, so that every mode's
//! reads are compared at equal write work, and the frontier of (write rate, read tail) points
//! the modes reach.
//!
//! A rate is a share of the device's raw write rate (`25%`, measured at the start of the run by
//! sequential `O_DIRECT` writes of 1 MiB and a sync), a number of MiB/s (`200`, the unit of the
//! results' `write_mb_s`), or `unpaced` (the writer writes as fast as its path lets it).
//!
//! A paced writer issues its n-th byte no earlier than `start + n / rate`. One that falls behind
//! (a throttle pause, a slow device) catches up by writing without pauses, but owes at most
//! [`MAX_DEBT`] of writing: beyond it the schedule moves forward, so a long stall does not turn
//! into a long burst afterwards. A mode *sustains* a rate when its application rate (bytes over
//! the time to its last write's return) is at least [`SUSTAINED_SHARE`] of it.

use std::time::Duration;

use serde::Serialize;

/// The most writing a paced writer that fell behind may still owe: one second's worth.
pub(crate) const MAX_DEBT: Duration = Duration::from_secs(1);

/// A paced mode sustains its rate when it reaches this share of it (the pacing's own sleeps
/// and the last write's return cost a little).
pub(crate) const SUSTAINED_SHARE: f64 = 0.95;

/// One `--write-rate` value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum WriteRate {
    /// As fast as the path lets the writer.
    Unpaced,
    /// This share (0 to 1] of the device's raw write rate.
    Share(f64),
    /// This many MiB/s.
    MibPerSec(f64),
}

impl WriteRate {
    /// `rates` if none is given twice.
    pub(crate) fn distinct(rates: Vec<WriteRate>) -> Result<Vec<WriteRate>, String> {
        for (i, rate) in rates.iter().enumerate() {
            if rates[..i].contains(rate) {
                return Err(format!("--write-rate: {} is given twice", rate.label()));
            }
        }
        Ok(rates)
    }

    /// Parses one `--write-rate` value.
    pub(crate) fn parse(text: &str) -> Result<WriteRate, String> {
        let text = text.trim();
        let bad = |why: &str| {
            Err(format!(
                "{text:?}: {why}; expected a share of the raw write rate (25%), \
                 MiB/s (200) or unpaced"
            ))
        };
        if text == "unpaced" {
            return Ok(WriteRate::Unpaced);
        }
        if let Some(percent) = text.strip_suffix('%') {
            return match percent.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => Ok(WriteRate::Share(p / 100.0)),
                Ok(_) => bad("a share must be above 0% and at most 100%"),
                Err(_) => bad("not a number"),
            };
        }
        match text.parse::<f64>() {
            Ok(mib) if mib > 0.0 && mib.is_finite() => Ok(WriteRate::MibPerSec(mib)),
            Ok(_) => bad("a rate must be above 0"),
            Err(_) => bad("not a number"),
        }
    }

    /// Whether this rate needs the device's raw write rate.
    pub(crate) fn needs_raw(self) -> bool {
        matches!(self, WriteRate::Share(_))
    }

    /// How the results name it: `unpaced`, `25%`, `200MiB/s`.
    pub(crate) fn label(self) -> String {
        match self {
            WriteRate::Unpaced => "unpaced".to_owned(),
            WriteRate::Share(share) => format!("{}%", round2(share * 100.0)),
            WriteRate::MibPerSec(mib) => format!("{}MiB/s", round2(mib)),
        }
    }

    /// The target in MiB/s (`None`: unpaced), given the raw write rate in MiB/s.
    pub(crate) fn target_mib_s(self, raw_mib_s: Option<f64>) -> Option<f64> {
        match self {
            WriteRate::Unpaced => None,
            WriteRate::Share(share) => raw_mib_s.map(|raw| raw * share),
            WriteRate::MibPerSec(mib) => Some(mib),
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The schedule of a paced writer: how long to wait before the next write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pacer {
    bytes_per_sec: f64,
    /// How far the schedule has moved forward after stalls longer than [`MAX_DEBT`].
    shift: Duration,
}

impl Pacer {
    /// A schedule of `mib_s` MiB/s (`None` or not positive: unpaced, never waits).
    pub(crate) fn new(mib_s: Option<f64>) -> Option<Pacer> {
        let mib_s = mib_s.filter(|r| *r > 0.0 && r.is_finite())?;
        Some(Pacer { bytes_per_sec: mib_s * 1024.0 * 1024.0, shift: Duration::ZERO })
    }

    /// With `written` bytes issued and `elapsed` since the writer's start: how long to sleep
    /// before issuing more. A writer more than [`MAX_DEBT`] behind has its schedule moved so
    /// that it owes exactly that.
    pub(crate) fn wait(&mut self, written: u64, elapsed: Duration) -> Duration {
        let due = Duration::from_secs_f64(written as f64 / self.bytes_per_sec) + self.shift;
        if due >= elapsed {
            return due - elapsed;
        }
        let behind = elapsed - due;
        if behind > MAX_DEBT {
            self.shift += behind - MAX_DEBT;
        }
        Duration::ZERO
    }
}

/// One point of the frontier: a mode at a rate, its writer's rate and its reads' tail.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Point {
    /// `kernel`, `ebb_wbt_ebb`, `ebb_LABEL`, ...
    pub(crate) mode: String,
    /// The `--write-rate` it ran at.
    pub(crate) rate: String,
    /// The writer's rate, MiB/s (bytes over the time to the end of its sync).
    pub(crate) write_mb_s: f64,
    /// The reads' p99, microseconds.
    pub(crate) read_lat_us_p99: u64,
    /// The reads' p99.99, microseconds.
    pub(crate) read_lat_us_p99_99: u64,
}

/// A kernel point against ebb's points: whether some ebb point writes at least as fast with a
/// lower p99.99 (the kernel's point does not dominate ebb's frontier), and which.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct KernelPoint {
    /// The kernel's point.
    pub(crate) kernel: Point,
    /// The ebb point that reaches its write rate with the lowest p99.99, if any does.
    pub(crate) best_ebb_at_its_rate: Option<Point>,
    /// That ebb point's p99.99 is lower.
    pub(crate) reached: bool,
}

/// ebb's Pareto frontier (no other ebb point writes at least as fast with a p99.99 at most
/// as low, one of them strictly), ordered by write rate, and each kernel point against it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Frontier {
    /// ebb's points on the frontier.
    pub(crate) ebb: Vec<Point>,
    /// Each kernel point.
    pub(crate) kernel: Vec<KernelPoint>,
}

impl Frontier {
    /// The frontier of `points` (the kernel's are those of mode `kernel`).
    pub(crate) fn of(points: &[Point]) -> Frontier {
        let (kernel, ebb): (Vec<&Point>, Vec<&Point>) =
            points.iter().partition(|p| p.mode == "kernel");
        let dominates = |a: &Point, b: &Point| {
            a.write_mb_s >= b.write_mb_s
                && a.read_lat_us_p99_99 <= b.read_lat_us_p99_99
                && (a.write_mb_s > b.write_mb_s || a.read_lat_us_p99_99 < b.read_lat_us_p99_99)
        };
        let mut front: Vec<Point> = ebb
            .iter()
            .filter(|p| !ebb.iter().any(|q| dominates(q, p)))
            .map(|p| (*p).clone())
            .collect();
        front.sort_by(|a, b| a.write_mb_s.total_cmp(&b.write_mb_s));
        let kernel = kernel
            .into_iter()
            .map(|k| {
                let best = ebb
                    .iter()
                    .filter(|p| p.write_mb_s >= k.write_mb_s)
                    .min_by_key(|p| p.read_lat_us_p99_99)
                    .map(|p| (*p).clone());
                let reached =
                    best.as_ref().is_some_and(|p| p.read_lat_us_p99_99 < k.read_lat_us_p99_99);
                KernelPoint { kernel: k.clone(), best_ebb_at_its_rate: best, reached }
            })
            .collect();
        Frontier { ebb: front, kernel }
    }
}

/// The targets at one paced rate, for one ebb mode against the kernel: ebb's
/// percentile over the kernel's, and whether each is met.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RateTargets {
    /// The rate (`25%`).
    pub(crate) rate: String,
    /// The ebb mode judged.
    pub(crate) mode: String,
    /// Both writers sustained the rate (else the comparison is not at equal write work).
    pub(crate) both_sustained: bool,
    /// p50 and p90 over the kernel's; target at most [`TARGET_BODY`].
    pub(crate) p50_ratio: f64,
    /// p90 over the kernel's.
    pub(crate) p90_ratio: f64,
    /// p99 over the kernel's; target at most [`TARGET_P99`].
    pub(crate) p99_ratio: f64,
    /// p99.9 over the kernel's; target at most [`TARGET_TAIL`].
    pub(crate) p99_9_ratio: f64,
    /// p99.99 over the kernel's; target at most [`TARGET_TAIL`].
    pub(crate) p99_99_ratio: f64,
    /// Every target met, both writers sustaining the rate.
    pub(crate) met: bool,
}

/// ebb's p50 and p90 at most this many times the kernel's.
pub(crate) const TARGET_BODY: f64 = 1.2;
/// ebb's p99 at most this many times the kernel's.
pub(crate) const TARGET_P99: f64 = 1.1;
/// ebb's p99.9 and p99.99 at most this share of the kernel's.
pub(crate) const TARGET_TAIL: f64 = 1.0 / 3.0;

/// A mode's read percentiles (p50, p90, p99, p99.9, p99.99) and whether it sustained its rate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tail {
    pub(crate) percentiles: [u64; 5],
    pub(crate) sustained: bool,
}

impl RateTargets {
    /// `ebb` (mode `mode`) against `kernel` at `rate`.
    pub(crate) fn judge_at(rate: &str, mode: &str, ebb: Tail, kernel: Tail) -> RateTargets {
        let r = |i: usize| ebb.percentiles[i] as f64 / kernel.percentiles[i].max(1) as f64;
        let (p50, p90, p99, p99_9, p99_99) = (r(0), r(1), r(2), r(3), r(4));
        let both_sustained = ebb.sustained && kernel.sustained;
        let met = both_sustained
            && p50 <= TARGET_BODY
            && p90 <= TARGET_BODY
            && p99 <= TARGET_P99
            && p99_9 <= TARGET_TAIL
            && p99_99 <= TARGET_TAIL;
        RateTargets {
            rate: rate.to_owned(),
            mode: mode.to_owned(),
            both_sustained,
            p50_ratio: round2(p50),
            p90_ratio: round2(p90),
            p99_ratio: round2(p99),
            p99_9_ratio: round2(p99_9),
            p99_99_ratio: round2(p99_99),
            met,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_bad_ones_are_named() {
        let parse_list = |text: &str| {
            let rates: Result<Vec<_>, _> = text.split(',').map(WriteRate::parse).collect();
            WriteRate::distinct(rates?)
        };
        let rates = parse_list("25%, 50%,200,unpaced").unwrap();
        assert_eq!(
            rates,
            [
                WriteRate::Share(0.25),
                WriteRate::Share(0.5),
                WriteRate::MibPerSec(200.0),
                WriteRate::Unpaced
            ]
        );
        assert_eq!(
            rates.iter().map(|r| r.label()).collect::<Vec<_>>(),
            ["25%", "50%", "200MiB/s", "unpaced"]
        );
        for (bad, why) in [
            ("0%", "above 0%"),
            ("150%", "at most 100%"),
            ("fast", "not a number"),
            ("-3", "above 0"),
            ("25%,25%", "twice"),
            ("", "not a number"),
        ] {
            let error = parse_list(bad).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
        assert_eq!(WriteRate::Share(0.5).target_mib_s(Some(800.0)), Some(400.0));
        assert_eq!(WriteRate::Unpaced.target_mib_s(Some(800.0)), None);
    }

    #[test]
    fn a_paced_writer_keeps_its_rate_and_owes_at_most_a_second() {
        let mib = 1 << 20;
        let mut pacer = Pacer::new(Some(100.0)).unwrap();
        // On time: 100 MiB are due at 1 s.
        assert_eq!(pacer.wait(100 * mib, Duration::from_millis(400)), Duration::from_millis(600));
        // Half a second behind: no wait, the writer catches up.
        assert_eq!(pacer.wait(100 * mib, Duration::from_millis(1500)), Duration::ZERO);
        // Three seconds behind: no wait, and the schedule moves so that it owes one second.
        assert_eq!(pacer.wait(100 * mib, Duration::from_secs(4)), Duration::ZERO);
        // It may write the second it owes at once; the next second's writes wait.
        assert_eq!(pacer.wait(200 * mib, Duration::from_secs(4)), Duration::ZERO);
        assert_eq!(pacer.wait(300 * mib, Duration::from_secs(4)), Duration::from_secs(1));
        assert!(Pacer::new(None).is_none() && Pacer::new(Some(0.0)).is_none());
    }

    fn point(mode: &str, write_mb_s: f64, p99_99: u64) -> Point {
        Point {
            mode: mode.to_owned(),
            rate: "unpaced".to_owned(),
            write_mb_s,
            read_lat_us_p99: p99_99 / 2,
            read_lat_us_p99_99: p99_99,
        }
    }

    #[test]
    fn the_frontier_keeps_undominated_points_and_judges_the_kernels() {
        let points = [
            point("ebb_a", 100.0, 1_000),
            point("ebb_b", 300.0, 5_000),
            point("ebb_c", 200.0, 6_000), // dominated by b
            point("kernel", 250.0, 9_000),
            point("kernel", 400.0, 2_000),
        ];
        let f = Frontier::of(&points);
        let modes: Vec<&str> = f.ebb.iter().map(|p| p.mode.as_str()).collect();
        assert_eq!(modes, ["ebb_a", "ebb_b"]);
        assert!(f.kernel[0].reached, "b writes faster with a lower tail");
        assert_eq!(f.kernel[0].best_ebb_at_its_rate.as_ref().unwrap().mode, "ebb_b");
        assert!(!f.kernel[1].reached, "no ebb point reaches 400 MiB/s");
    }

    #[test]
    fn targets_need_both_writers_at_the_rate() {
        let kernel = Tail { percentiles: [100, 200, 1_000, 9_000, 30_000], sustained: true };
        let ebb = Tail { percentiles: [110, 200, 1_050, 2_000, 9_000], sustained: true };
        let t = RateTargets::judge_at("25%", "ebb_wbt_ebb", ebb, kernel);
        assert!(t.met, "{t:?}");
        let slow =
            RateTargets::judge_at("25%", "ebb_wbt_ebb", Tail { sustained: false, ..ebb }, kernel);
        assert!(!slow.met && !slow.both_sustained);
        let tail = Tail { percentiles: [110, 200, 1_050, 4_000, 9_000], ..ebb };
        assert!(
            !RateTargets::judge_at("25%", "ebb_wbt_ebb", tail, kernel).met,
            "p99.9 over a third"
        );
    }
}
