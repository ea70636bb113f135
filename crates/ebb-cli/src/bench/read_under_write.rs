//! `ebb bench read-under-write`: a random 4 KiB `O_DIRECT` reader of one file while a
//! streaming writer writes another, in five modes: the reader alone, ebb with wbt on (the
//! kernel's algorithm), with wbt=ebb (ebb's variant), with wbt off, and the kernel's path
//! (the writer's buffered writes through the page cache); plus an ebb mode per `--variant`.
//! Each mode also reports what the device under the directory did while the reader ran
//! (`/proc/diskstats`) and how long the reader waited for a CPU, to tell where a read's time
//! went, and each ebb mode what its wbt did (the pacing duty and the learned target). On an
//! NFS export the reader sends READs (in the ebb modes through ebb's direct reads, on the
//! reader's own thread and the client's connection for READs, beside the one the writeback's
//! WRITEs use) and there is no kernel mode.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebb_backend::{AlignedBuf, Backend, BackendFile, OpenOptions};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::blocktrace::{BlockTrace, Breakdown, ReadRecord, ReadSample, RunDelay, mono_ns};
use super::diskstats::{DeviceWork, DiskStats, device_of};
use super::pace::{Frontier, Pacer, Point, RateTargets, SUSTAINED_SHARE, Tail, WriteRate};
use super::{CREATE, MIB, Target, builder_with, config_error, settle};

/// Options of [`read_under_write`].
#[derive(Clone, Debug)]
pub(crate) struct ReadUnderWriteOptions {
    /// The directory or NFS export under test.
    pub(crate) target: Target,
    /// Length of each mode.
    pub(crate) seconds: f64,
    /// Size of the file the reader reads at random.
    pub(crate) read_file_size: u64,
    /// The writer wraps around at this size.
    pub(crate) write_file_size: u64,
    /// ebb's memory budget.
    pub(crate) memory: u64,
    /// Leave the read file for the next run instead of removing it.
    pub(crate) keep_read_file: bool,
    /// Knobs for the ebb modes (kernel names), applied before each mode's `wbt`.
    pub(crate) knobs: Vec<(String, String)>,
    /// `--memory kernel`: the kernel's dirty and background thresholds (bytes) ebb was given.
    pub(crate) kernel_thresholds: Option<(u64, u64)>,
    /// More ebb modes, `ebb_LABEL`: their knobs, applied after `knobs` and `wbt = ebb`.
    pub(crate) variants: Vec<(String, Vec<(String, String)>)>,
    /// Rounds: the modes take turns (idle, ebb with each wbt, kernel, then again), and
    /// each mode's reads of every round make one histogram, so that every mode samples the
    /// machine's slow moments alike.
    pub(crate) rounds: u32,
    /// `--breakdown`: per read, the reader's CPU wait and (tracing the device's requests) its
    /// time in the IO scheduler and the device and the writes in service beside it, reported
    /// for the reads up to p90, from p90 to p99 and above p99 ([`Breakdown`]).
    pub(crate) breakdown: bool,
    /// `--write-rate`: the writers' rates, each run in every round ([`WriteRate`]).
    pub(crate) write_rates: Vec<WriteRate>,
    /// `--chart DIR`: draw the frontier there.
    pub(crate) chart: Option<std::path::PathBuf>,
}

/// One mode of [`read_under_write`].
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ModeResult {
    /// Read latency percentiles, microseconds.
    pub(crate) read_lat_us_p50: u64,
    /// 90th.
    pub(crate) read_lat_us_p90: u64,
    /// 99th.
    pub(crate) read_lat_us_p99: u64,
    /// 99.9th.
    pub(crate) read_lat_us_p99_9: u64,
    /// 99.99th.
    pub(crate) read_lat_us_p99_99: u64,
    /// Slowest read.
    pub(crate) read_lat_us_max: u64,
    /// Mean read latency, microseconds (to compare with `device_read_us`).
    pub(crate) read_lat_us_mean: f64,
    /// Reads done.
    pub(crate) reads: u64,
    /// The writer: bytes over the time from its first write to the end of its fsync (0 when
    /// there is no writer).
    pub(crate) write_mb_s: f64,
    /// The writer's application rate: bytes over the time from its first write to its last
    /// write's return (its sync left out), MiB/s.
    pub(crate) app_write_mb_s: f64,
    /// A paced writer's target rate, MiB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target_write_mb_s: Option<f64>,
    /// A paced writer reached at least 95% of its target (`app_write_mb_s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sustained: Option<bool>,
    /// Time the reader thread spent runnable but waiting for a CPU, per read, microseconds
    /// (`run_delay` of `/proc/thread-self/schedstat`; 0 where the kernel does not show it):
    /// how much of a read's latency is CPU contention rather than IO.
    pub(crate) reader_run_delay_us_per_read: f64,
    /// The device under the directory while the mode ran (`/proc/diskstats`; zeros on NFS or
    /// where the kernel does not show it): bytes written per second, MB/s.
    pub(crate) device_write_mb_s: f64,
    /// Mean size of the writes it completed, KiB.
    pub(crate) device_write_kib: f64,
    /// Share of the time it had a request in flight, %.
    pub(crate) device_busy_pct: f64,
    /// Mean number of requests in flight (reads and writes, including those waiting in its
    /// scheduler).
    pub(crate) device_queue: f64,
    /// Mean time the device's reads spent in the block layer and the device (from a
    /// request's start to its completion, scheduler queue included), microseconds: the rest
    /// of `read_lat_us_mean` is spent above it (the system call, the filesystem, waiting for
    /// a CPU). All the device's reads count, so on a shared machine other programs' too.
    pub(crate) device_read_us: f64,
    /// ebb's modes: the share of the time `wbt = ebb` let background writes be in service
    /// while reads were active (`BdiStats::wbt_duty_permille`), %, averaged over samples
    /// every 100 ms while the writer ran, from the backend's first completed write on (100:
    /// unpaced, and for the other algorithms).
    pub(crate) wbt_duty_pct: f64,
    /// ebb's modes: the read-latency target wbt had at a round's last sample (learned by
    /// `wbt = ebb`; the largest of the rounds'), microseconds.
    pub(crate) wbt_target_us: u64,
    /// `--breakdown`: where the reads' time went, by class of latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) breakdown: Option<Breakdown>,
}

/// What an ebb mode's wbt did while its writer ran: the pacing duty (per mille) summed over
/// samples, the samples, and the latest target (us).
#[derive(Clone, Copy, Debug, Default)]
struct WbtSamples {
    duty_permille_sum: u64,
    samples: u64,
    target_us: u64,
}

impl WbtSamples {
    /// Every 100 ms: how often the writer looks at the engine's figures.
    const EVERY: Duration = Duration::from_millis(100);

    fn add(&mut self, other: WbtSamples) {
        self.duty_permille_sum += other.duty_permille_sum;
        self.samples += other.samples;
        self.target_us = self.target_us.max(other.target_us);
    }

    /// Sets the `wbt_*` figures of `r` (no samples: none).
    fn fill(&self, r: &mut ModeResult) {
        if self.samples > 0 {
            r.wbt_duty_pct = self.duty_permille_sum as f64 / 10.0 / self.samples as f64;
            r.wbt_target_us = self.target_us;
        }
    }
}

/// Sets the `device_*` figures of `r` from what the device did.
fn fill_device(d: &DeviceWork, r: &mut ModeResult) {
    let secs = d.secs.max(1e-3);
    let bytes = d.bytes as f64;
    r.device_write_mb_s = bytes / MIB / secs;
    r.device_write_kib = bytes / 1024.0 / d.writes.max(1) as f64;
    r.device_busy_pct = d.busy_ms as f64 / 10.0 / secs;
    r.device_queue = d.queue_ms as f64 / 1e3 / secs;
    r.device_read_us = d.read_ms as f64 * 1e3 / d.reads.max(1) as f64;
}

/// What one reader measured: its read latencies, its time waiting for a CPU, and what the
/// device did meanwhile.
struct Reads {
    latencies: Histogram<u64>,
    run_delay_ns: u64,
    device: DeviceWork,
    /// `--breakdown`: every read, joined to the device's trace, and the events it lost.
    records: Vec<ReadRecord>,
    lost_events: u64,
}

/// The calling thread's time spent runnable but not running, nanoseconds (schedstat's second
/// field), if the kernel shows it.
fn run_delay_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// What [`read_under_write`] measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ReadUnderWriteResult {
    /// `idle`, `ebb_wbt_on`, `ebb_wbt_ebb`, `ebb_wbt_off`, `kernel` (not on NFS): the reader
    /// alone and beside the unpaced writers (when `--write-rate` has `unpaced`, the default).
    pub(crate) modes: BTreeMap<String, ModeResult>,
    /// Per paced `--write-rate`, the same writer modes held to that rate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) rates: Vec<RateResult>,
    /// The device's raw sequential write rate measured at the start (`O_DIRECT`, 1 MiB writes,
    /// then a sync), MiB/s, when a rate is a share of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) raw_write_mb_s: Option<f64>,
    /// ebb's frontier of (write rate, read p99.99) over every ebb mode and rate, and each
    /// kernel point against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) frontier: Option<Frontier>,
    /// Per paced rate, `wbt = ebb` against the kernel's writer: the ratios and whether each
    /// target is met.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) targets: Vec<RateTargets>,
    /// Seconds per mode and round.
    pub(crate) seconds: f64,
    /// Rounds.
    pub(crate) rounds: u32,
    /// ebb's memory budget.
    pub(crate) memory_bytes: u64,
    /// The wbt latency target ebb used, microseconds.
    pub(crate) wbt_lat_usec: u64,
    /// `--memory kernel`: the kernel's dirty threshold ebb was given as `dirty_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kernel_dirty_thresh_bytes: Option<u64>,
    /// `--memory kernel`: the background threshold, as `dirty_background_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kernel_dirty_background_thresh_bytes: Option<u64>,
}

fn mode_result(
    h: &Histogram<u64>,
    writer: WriterRate,
    run_delay_ns: u64,
    device: &DeviceWork,
    wbt: &WbtSamples,
    (records, lost_events): (&[ReadRecord], u64),
) -> ModeResult {
    let q = |x: f64| if h.is_empty() { 0 } else { h.value_at_quantile(x) };
    let mut r = ModeResult {
        reader_run_delay_us_per_read: run_delay_ns as f64 / 1e3 / h.len().max(1) as f64,
        read_lat_us_p50: q(0.5),
        read_lat_us_p90: q(0.9),
        read_lat_us_p99: q(0.99),
        read_lat_us_p99_9: q(0.999),
        read_lat_us_p99_99: q(0.9999),
        read_lat_us_max: if h.is_empty() { 0 } else { h.max() },
        read_lat_us_mean: if h.is_empty() { 0.0 } else { h.mean() },
        reads: h.len(),
        write_mb_s: writer.mb_s,
        app_write_mb_s: writer.app_mb_s,
        ..ModeResult::default()
    };
    fill_device(device, &mut r);
    wbt.fill(&mut r);
    if !records.is_empty() {
        let cuts = [r.read_lat_us_p90, r.read_lat_us_p99, r.read_lat_us_p99_9];
        r.breakdown = Some(Breakdown::of(records, cuts, lost_events));
    }
    r
}

/// What a reader watches besides its latencies: the block device under the directory, if any,
/// and (`--breakdown`) every read, joined to a trace of the device's requests.
#[derive(Clone, Copy, Debug)]
struct Watch {
    dev: Option<(u64, u64)>,
    breakdown: bool,
}

/// Random 4 KiB reads until `stop`; `read` performs one read at an offset.
fn reader(
    pages: u64,
    Watch { dev, breakdown }: Watch,
    stop: &AtomicBool,
    mut read: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
) -> io::Result<Reads> {
    let mut h = Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    let per_read = if breakdown { RunDelay::open() } else { None };
    let trace = match (&per_read, dev) {
        (Some(_), Some(dev)) => Some(BlockTrace::start(dev)?),
        _ => None,
    };
    let mut samples: Vec<ReadSample> = Vec::new();
    let delay_before = run_delay_ns();
    let disk_before = dev.and_then(DiskStats::read);
    let mut buf = AlignedBuf::zeroed(4096);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % pages) * 4096;
        if let Some(rd) = &per_read {
            let delay = rd.now();
            let start_ns = mono_ns();
            read(&mut buf, off)?;
            let end_ns = mono_ns();
            let run_delay_ns = rd.now().saturating_sub(delay);
            samples.push(ReadSample { start_ns, end_ns, run_delay_ns });
            let _ = h.record(((end_ns - start_ns) / 1000).max(1));
            continue;
        }
        let t = Instant::now();
        read(&mut buf, off)?;
        let _ = h.record((t.elapsed().as_micros() as u64).max(1));
    }
    let run_delay_ns = match (delay_before, run_delay_ns()) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => 0,
    };
    let device = match (disk_before, dev.and_then(DiskStats::read)) {
        (Some(before), Some(after)) => before.until(&after),
        _ => DeviceWork::default(),
    };
    let (records, lost_events) = match trace {
        Some(trace) => trace.finish(&samples)?,
        None => (Vec::new(), 0),
    };
    Ok(Reads { latencies: h, run_delay_ns, device, records, lost_events })
}

/// A writer's rates, MiB/s: with its final sync, and without it (the application's rate).
#[derive(Clone, Copy, Debug, Default)]
struct WriterRate {
    mb_s: f64,
    app_mb_s: f64,
}

/// A streaming writer of 1 MiB blocks for `seconds` (paced by `pacer`, if any), then `finish`.
fn writer(
    seconds: f64,
    wrap: u64,
    mut pacer: Option<Pacer>,
    mut write: impl FnMut(&[u8], u64) -> io::Result<()>,
    finish: impl FnOnce() -> io::Result<()>,
) -> io::Result<WriterRate> {
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 31) as u8).collect();
    let start = Instant::now();
    let mut written = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        if let Some(pacer) = &mut pacer {
            let wait = pacer.wait(written, start.elapsed());
            let left = Duration::from_secs_f64(seconds).saturating_sub(start.elapsed());
            if wait >= left {
                std::thread::sleep(left);
                break;
            }
            std::thread::sleep(wait);
        }
        write(&block, written % wrap)?;
        written += block.len() as u64;
    }
    let app_secs = start.elapsed().as_secs_f64();
    finish()?;
    let mb = written as f64 / MIB;
    Ok(WriterRate { mb_s: mb / start.elapsed().as_secs_f64(), app_mb_s: mb / app_secs })
}

/// How a mode's writer runs: for how long, where it wraps around, at what rate (MiB/s; `None`:
/// unpaced).
#[derive(Clone, Copy, Debug)]
struct WriterPlan {
    seconds: f64,
    wrap: u64,
    target_mib_s: Option<f64>,
}

/// Random reads (`read`) while a streaming writer (`write`, then `sync`) runs as `plan` says;
/// the reader stops when the writer starts its sync.
fn reader_beside_writer(
    pages: u64,
    watch: Watch,
    plan: WriterPlan,
    read: impl FnMut(&mut [u8], u64) -> io::Result<usize> + Send,
    write: impl FnMut(&[u8], u64) -> io::Result<()>,
    sync: impl FnOnce() -> io::Result<()>,
) -> io::Result<(Reads, WriterRate)> {
    let stop = AtomicBool::new(false);
    let pacer = Pacer::new(plan.target_mib_s);
    let (h, mb_s) = std::thread::scope(|s| {
        let r = s.spawn(|| reader(pages, watch, &stop, read));
        let w = writer(plan.seconds, plan.wrap, pacer, write, || {
            stop.store(true, Ordering::Relaxed);
            sync()
        });
        stop.store(true, Ordering::Relaxed);
        (r.join().expect("reader thread"), w)
    });
    Ok((h?, mb_s?))
}

/// The file the reader reads, in the directory or export under test.
const READ_FILE: &str = "ebb-bench-read";

fn prepare_read_file(target: &Target, size: u64) -> io::Result<Arc<dyn BackendFile>> {
    let backend = target.raw()?;
    let name = READ_FILE;
    if backend.exists(name)? {
        let f = backend.open(name, OpenOptions { create: false, truncate: false })?;
        if f.size()? == size {
            return Ok(f);
        }
    }
    let f = backend.open(name, CREATE)?;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 7) as u8);
    let mut at = 0;
    while at < size {
        f.write_at(&buf, at)?;
        at += buf.len() as u64;
    }
    f.sync()?;
    Ok(f)
}

/// Runs the five modes one after the other, then removes the read file unless asked to keep
/// it (also when a mode failed).
pub(crate) fn read_under_write(
    opts: &ReadUnderWriteOptions,
    progress: &mut dyn FnMut(&str),
) -> io::Result<ReadUnderWriteResult> {
    let size = opts.read_file_size.max(1 << 20) / (1 << 20) * (1 << 20);
    progress("preparing the read file");
    let read_file = prepare_read_file(&opts.target, size)?;
    let result = measure(opts, progress, &read_file, size);
    drop(read_file);
    if !opts.keep_read_file {
        let removed = opts.target.raw().and_then(|backend| backend.remove(READ_FILE));
        if let Err(error) = removed
            && result.is_ok()
        {
            return Err(error);
        }
    }
    result
}

/// The modes' rounds over the prepared read file of `size` bytes: per round the reader alone,
/// then per `--write-rate` each ebb mode and the kernel's writer.
fn measure(
    opts: &ReadUnderWriteOptions,
    progress: &mut dyn FnMut(&str),
    read_file: &Arc<dyn BackendFile>,
    size: u64,
) -> io::Result<ReadUnderWriteResult> {
    let pages = size / 4096;
    let secs = opts.seconds;
    let dev = match &opts.target {
        Target::Dir(dir) => device_of(dir),
        Target::Nfs(_) => None,
    };
    let watch = Watch { dev, breakdown: opts.breakdown };
    let rates =
        if opts.write_rates.is_empty() { &[WriteRate::Unpaced][..] } else { &opts.write_rates };
    let raw_write_mb_s = match rates.iter().any(|r| r.needs_raw()) {
        true => {
            progress("measuring the raw write rate (O_DIRECT, 1 MiB writes)");
            Some(raw_write_rate(&opts.target, secs)?)
        }
        false => None,
    };
    let mut idle = Modes::default();
    let mut per_rate: Vec<Modes> = rates.iter().map(|_| Modes::default()).collect();
    let mut wbt_lat = 0;
    settle();
    for round in 1..=opts.rounds.max(1) {
        progress(&format!("round {round}: idle, the reader alone"));
        let stop = AtomicBool::new(false);
        let h = std::thread::scope(|s| {
            let r = s.spawn(|| reader(pages, watch, &stop, |b, o| read_file.read_at(b, o)));
            std::thread::sleep(Duration::from_secs_f64(secs));
            stop.store(true, Ordering::Relaxed);
            r.join().expect("reader thread")
        })?;
        idle.add("idle", h, WriterRate::default(), WbtSamples::default())?;
        for (rate, runs) in rates.iter().zip(per_rate.iter_mut()) {
            let plan = WriterPlan {
                seconds: secs,
                wrap: opts.write_file_size,
                target_mib_s: rate.target_mib_s(raw_write_mb_s),
            };
            let at = rate.label();
            for (label, knobs) in ebb_modes(opts) {
                let mode = format!("ebb_{label}");
                progress(&format!("round {round}, writer {at}: {mode}"));
                let (h, mb_s, lat, wbt) = ebb_round(opts, &knobs, pages, dev, plan)?;
                wbt_lat = wbt_lat.max(lat);
                runs.add(&mode, h, mb_s, wbt)?;
            }
            let Target::Dir(dir) = &opts.target else { continue };
            progress(&format!(
                "round {round}, writer {at}: kernel, a buffered writer through the page cache"
            ));
            let path = dir.join("ebb-bench-kernel-write");
            let kf = std::fs::File::create(&path)?;
            let (h, mb_s) = reader_beside_writer(
                pages,
                watch,
                plan,
                |b, o| read_file.read_at(b, o),
                |b, o| {
                    use std::os::unix::fs::FileExt;
                    kf.write_all_at(b, o)
                },
                || kf.sync_data(),
            )?;
            runs.add("kernel", h, mb_s, WbtSamples::default())?;
            drop(kf);
            std::fs::remove_file(&path)?;
            settle();
        }
    }
    let mut modes = idle.results(None);
    let mut paced = Vec::new();
    for (rate, runs) in rates.iter().zip(per_rate) {
        let target = rate.target_mib_s(raw_write_mb_s);
        let results = runs.results(target);
        match rate {
            WriteRate::Unpaced => modes.extend(results),
            _ => paced.push(RateResult {
                rate: rate.label(),
                target_write_mb_s: target,
                modes: results,
            }),
        }
    }
    let points = frontier_points(&modes, &paced);
    let frontier = (!points.is_empty()).then(|| Frontier::of(&points));
    let targets = paced.iter().filter_map(RateResult::targets).collect();
    let result = ReadUnderWriteResult {
        modes,
        rates: paced,
        raw_write_mb_s,
        frontier,
        targets,
        seconds: secs,
        rounds: opts.rounds.max(1),
        memory_bytes: opts.memory,
        wbt_lat_usec: wbt_lat,
        kernel_dirty_thresh_bytes: opts.kernel_thresholds.map(|t| t.0),
        kernel_dirty_background_thresh_bytes: opts.kernel_thresholds.map(|t| t.1),
    };
    if let Some(dir) = &opts.chart {
        super::frontier_chart::draw(dir, &points)?;
    }
    Ok(result)
}

/// The device's raw sequential write rate, MiB/s: `O_DIRECT` writes of 1 MiB for `seconds`
/// (at most 4 GiB), then a sync, into a file of the target removed afterwards.
fn raw_write_rate(target: &Target, seconds: f64) -> io::Result<f64> {
    const NAME: &str = "ebb-bench-raw-write";
    let backend = target.raw()?;
    let f = backend.open(NAME, CREATE)?;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 13) as u8);
    let start = Instant::now();
    let mut written = 0u64;
    while start.elapsed().as_secs_f64() < seconds && written < 4 << 30 {
        f.write_at(&buf, written)?;
        written += buf.len() as u64;
    }
    f.sync()?;
    let mb_s = written as f64 / MIB / start.elapsed().as_secs_f64();
    drop(f);
    backend.remove(NAME)?;
    settle();
    Ok(mb_s)
}

/// The writer modes at one paced rate.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RateResult {
    /// `25%`, `200MiB/s`.
    pub(crate) rate: String,
    /// The writers' target, MiB/s.
    pub(crate) target_write_mb_s: Option<f64>,
    /// Per mode (`ebb_wbt_on`, ..., `kernel`).
    pub(crate) modes: BTreeMap<String, ModeResult>,
}

impl RateResult {
    /// `wbt = ebb` (the default) against the kernel's writer at this rate, if both ran.
    fn targets(&self) -> Option<RateTargets> {
        let tail = |m: &ModeResult| Tail {
            percentiles: [
                m.read_lat_us_p50,
                m.read_lat_us_p90,
                m.read_lat_us_p99,
                m.read_lat_us_p99_9,
                m.read_lat_us_p99_99,
            ],
            sustained: m.sustained.unwrap_or(true),
        };
        let ebb = self.modes.get("ebb_wbt_ebb")?;
        let kernel = self.modes.get("kernel")?;
        Some(RateTargets::judge_at(&self.rate, "ebb_wbt_ebb", tail(ebb), tail(kernel)))
    }
}

/// Every writer mode's point (the reader alone has none).
fn frontier_points(modes: &BTreeMap<String, ModeResult>, paced: &[RateResult]) -> Vec<Point> {
    let unpaced = modes.iter().map(|(mode, r)| ("unpaced", mode, r));
    let paced =
        paced.iter().flat_map(|p| p.modes.iter().map(|(mode, r)| (p.rate.as_str(), mode, r)));
    unpaced
        .chain(paced)
        .filter(|(_, mode, _)| *mode != "idle")
        .map(|(rate, mode, r)| Point {
            mode: mode.clone(),
            rate: rate.to_owned(),
            write_mb_s: r.write_mb_s,
            read_lat_us_p99: r.read_lat_us_p99,
            read_lat_us_p99_99: r.read_lat_us_p99_99,
        })
        .collect()
}

/// One mode's rounds: the merged read latencies, the reader's total run delay, each round's
/// writer MB/s, the device's work and what wbt did.
struct ModeRuns {
    latencies: Histogram<u64>,
    run_delay_ns: u64,
    rates: Vec<WriterRate>,
    device: DeviceWork,
    wbt: WbtSamples,
    records: Vec<ReadRecord>,
    lost_events: u64,
}

/// Per mode, its rounds.
#[derive(Default)]
struct Modes(BTreeMap<String, ModeRuns>);

impl Modes {
    /// One round of `mode`: its reads, its writer's MB/s and what wbt did.
    fn add(
        &mut self,
        mode: &str,
        reads: Reads,
        mb_s: WriterRate,
        wbt: WbtSamples,
    ) -> io::Result<()> {
        match self.0.entry(mode.to_owned()) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(ModeRuns {
                    latencies: reads.latencies,
                    run_delay_ns: reads.run_delay_ns,
                    rates: vec![mb_s],
                    device: reads.device,
                    wbt,
                    records: reads.records,
                    lost_events: reads.lost_events,
                });
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let run = o.get_mut();
                let merged = run.latencies.add(&reads.latencies);
                merged.map_err(|e| io::Error::other(e.to_string()))?;
                run.run_delay_ns += reads.run_delay_ns;
                run.rates.push(mb_s);
                run.device.add(reads.device);
                run.wbt.add(wbt);
                run.records.extend(reads.records);
                run.lost_events += reads.lost_events;
            }
        }
        Ok(())
    }

    /// Each mode's result over its rounds: the merged reads, the mean writer rates, and
    /// whether the writer sustained `target` (MiB/s; `None`: unpaced).
    fn results(self, target: Option<f64>) -> BTreeMap<String, ModeResult> {
        self.0
            .into_iter()
            .map(|(mode, run)| {
                let n = run.rates.len().max(1) as f64;
                let rate = WriterRate {
                    mb_s: run.rates.iter().map(|r| r.mb_s).sum::<f64>() / n,
                    app_mb_s: run.rates.iter().map(|r| r.app_mb_s).sum::<f64>() / n,
                };
                let records = (&run.records[..], run.lost_events);
                let mut r = mode_result(
                    &run.latencies,
                    rate,
                    run.run_delay_ns,
                    &run.device,
                    &run.wbt,
                    records,
                );
                if mode != "idle" {
                    r.target_write_mb_s = target;
                    r.sustained = target.map(|t| rate.app_mb_s >= SUSTAINED_SHARE * t);
                }
                (mode, r)
            })
            .collect()
    }
}

/// The ebb modes of a round, each a label and its knobs: wbt on, ebb and off, then each
/// `--variant` (over `wbt = ebb`).
fn ebb_modes(opts: &ReadUnderWriteOptions) -> Vec<(String, Vec<(String, String)>)> {
    let wbt = |value: &str| vec![("wbt".to_owned(), value.to_owned())];
    let builtin = [("wbt_on", wbt("on")), ("wbt_ebb", wbt("ebb")), ("wbt_off", wbt("off"))];
    let builtin = builtin.into_iter().map(|(label, knobs)| (label.to_owned(), knobs));
    let variants = opts.variants.iter().map(|(label, knobs)| {
        (label.clone(), wbt("ebb").into_iter().chain(knobs.iter().cloned()).collect())
    });
    builtin.chain(variants).collect()
}

/// One round of an ebb mode with `knobs`: the reader beside an ebb writer, then the files
/// removed. Returns the reads, the writer's MB/s, the configured wbt latency target and what
/// wbt did while the writer ran (sampled between its writes).
fn ebb_round(
    opts: &ReadUnderWriteOptions,
    knobs: &[(String, String)],
    pages: u64,
    dev: Option<(u64, u64)>,
    plan: WriterPlan,
) -> io::Result<(Reads, WriterRate, u64, WbtSamples)> {
    let mut builder = builder_with(opts.memory, &opts.knobs)?;
    for (name, value) in knobs {
        builder = builder.knob(name, value).map_err(config_error)?;
    }
    let ebb = opts.target.add_to(builder)?.build()?;
    let wbt_lat = ebb.config().backends[0].wbt_target_usec();
    let rf = ebb.open(READ_FILE, OpenOptions { create: false, truncate: false })?;
    let wf = ebb.open("ebb-bench-write", CREATE)?;
    let mut wbt = WbtSamples::default();
    let mut sampled = Instant::now();
    let (h, mb_s) = reader_beside_writer(
        pages,
        Watch { dev, breakdown: opts.breakdown },
        plan,
        |b, o| rf.read_direct_at(b, o),
        |b, o| {
            if sampled.elapsed() >= WbtSamples::EVERY {
                sampled = Instant::now();
                // From the first write on: before it no window is judged, the duty is whole.
                if let Some(bdi) = ebb.stats().bdi.first().filter(|bdi| bdi.written > 0) {
                    wbt.duty_permille_sum += u64::from(bdi.wbt_duty_permille);
                    wbt.samples += 1;
                    wbt.target_us = bdi.wbt_target_us;
                }
            }
            wf.write_at(b, o).map(drop)
        },
        || wf.fsync(),
    )?;
    drop(rf);
    wf.close()?;
    ebb.remove("ebb-bench-write")?;
    drop(ebb);
    settle();
    Ok((h, mb_s, wbt_lat, wbt))
}
