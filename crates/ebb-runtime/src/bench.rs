//! The runtime's benchmarks (`ebb bench`): what ebb costs and gives on this machine, measured
//! beside the kernel's own paths in the same run.
//!
//! * [`stream`]: a streaming writer through ebb into a directory beside raw `O_DIRECT`
//!   sequential writes to the same filesystem (the ceiling ebb's writeback can reach).
//! * [`read_under_write`]: a random 4 KiB `O_DIRECT` reader of one file while a streaming
//!   writer writes another, in four modes: the reader alone, ebb with wbt on, ebb with wbt off,
//!   and the kernel's path (the writer's buffered writes through the page cache).
//! * [`write_path`]: nanoseconds per 4 KiB write into the cache with no throttling, from 1 to N
//!   threads, and the shared-counter reads per throttle check.
//!
//! Results are plain numbers; nothing here asserts a speed.

use std::collections::BTreeMap;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ebb_backend::{AlignedBuf, Backend, BackendFile, DirBackend, MemBackend, OpenOptions};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::Builder;

const CREATE: OpenOptions = OpenOptions { create: true, truncate: true };
const MIB: f64 = 1024.0 * 1024.0;

/// Options of [`stream`].
#[derive(Clone, Debug)]
pub struct StreamOptions {
    /// Directory on the filesystem under test.
    pub dir: PathBuf,
    /// Bytes each run writes.
    pub size: u64,
    /// ebb's memory budget.
    pub memory: u64,
    /// Bytes per write call.
    pub block: usize,
    /// Rounds (raw then ebb, alternating); the means are reported.
    pub rounds: u32,
    /// At most this many bytes are streamed through the same cache before the timed run, until
    /// its bandwidth estimate and ratelimit settle (the kernel starts the estimate at 100 MB/s
    /// and moves it about 5% per 200 ms: a long-lived cache is past that, a fresh one is not).
    pub warmup: u64,
    /// Knobs for ebb (kernel names, plus ebb's `initial_write_bandwidth`).
    pub knobs: Vec<(String, String)>,
}

/// What [`stream`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct StreamResult {
    /// Through ebb: bytes over the time from the first write to the end of fsync.
    pub write_mb_s: f64,
    /// Raw `O_DIRECT` sequential writes, same block size, ended by fdatasync, of data copied
    /// before each write from the same ordinary (unaligned) memory ebb's writer passes to
    /// `write_at`: what an application writing its own data with `O_DIRECT` does.
    pub raw_mb_s: f64,
    /// `write_mb_s / raw_mb_s`.
    pub ratio: f64,
    /// Raw `O_DIRECT` writes of one aligned buffer that never changes: the device's best case.
    /// The gap to [`StreamResult::raw_mb_s`] is the copy (BENCHMARKS.md, "Runtime").
    pub raw_static_mb_s: f64,
    /// `write_mb_s / raw_static_mb_s`.
    pub ratio_static: f64,
    /// The ebb writer's pauses (dirty throttling), milliseconds.
    pub pause_ms_p50: f64,
    /// 99th percentile pause.
    pub pause_ms_p99: f64,
    /// Longest pause.
    pub pause_ms_max: f64,
    /// Pauses taken.
    pub pauses: u64,
    /// Bytes per run.
    pub bytes: u64,
    /// ebb's memory budget.
    pub memory_bytes: u64,
    /// Each round's MB/s.
    pub rounds: Vec<StreamRound>,
    /// Bytes streamed through the cache before each timed ebb run.
    pub warmup_bytes: u64,
}

/// One round of [`stream`], MB/s.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct StreamRound {
    /// Raw, copying each block into its aligned buffer first.
    pub raw: f64,
    /// Raw, one unchanged buffer.
    pub raw_static: f64,
    /// Through ebb.
    pub ebb: f64,
}

fn dir_backend(dir: &Path) -> io::Result<DirBackend> {
    DirBackend::open(dir)
}

/// Raw `O_DIRECT` sequential writes of `block` bytes; with `source`, each block is copied from
/// it into the aligned buffer before its write.
fn raw_stream(dir: &Path, size: u64, block: usize, source: Option<&[u8]>) -> io::Result<f64> {
    let backend = dir_backend(dir)?;
    let file = backend.open("ebb-bench-raw", CREATE)?;
    let mut buf = AlignedBuf::zeroed(block);
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let start = Instant::now();
    let mut at = 0;
    while at < size {
        let n = (size - at).min(block as u64) as usize;
        if let Some(src) = source {
            buf[..n].copy_from_slice(&src[..n]);
        }
        file.write_at(&buf[..n], at)?;
        at += n as u64;
    }
    file.sync()?;
    let secs = start.elapsed().as_secs_f64();
    drop(file);
    backend.remove("ebb-bench-raw")?;
    settle();
    Ok(size as f64 / MIB / secs)
}

/// Lets the filesystem finish what the last run left (freeing a deleted file's extents, the
/// journal commit), so it does not land in the next run's timed window: runs order-dependent
/// otherwise (measured: the device 100% busy at 10-15% of its write rate for about half a
/// second after a 4 GiB file is removed).
fn settle() {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(Duration::from_secs(1));
}

/// The bytes every streaming writer of the bench writes, block after block (ordinary memory).
fn source_block(block: usize) -> Vec<u8> {
    (0..block).map(|i| i as u8).collect()
}

fn ebb_stream(opts: &StreamOptions) -> io::Result<(f64, crate::ThrottleStats)> {
    let ebb = builder_with(opts.memory, &opts.knobs)?.directory(&opts.dir)?.build()?;
    let buf = source_block(opts.block);
    if opts.warmup > 0 {
        // Stream until the bandwidth estimate and the ratelimit have each moved less than 5% in
        // the last second (at most `warmup` bytes).
        let warm = ebb.open("ebb-bench-warmup", CREATE)?;
        let mut at = 0;
        let sample = || {
            let s = ebb.stats();
            (s.bdi[0].avg_write_bandwidth_kbps as f64, s.bdi[0].dirty_ratelimit_kbps as f64)
        };
        let mut last = (Instant::now(), sample());
        while at < opts.warmup {
            warm.write_at(&buf, at)?;
            at += buf.len() as u64;
            if last.0.elapsed() >= Duration::from_secs(1) {
                let now = sample();
                let moved = |a: f64, b: f64| (a - b).abs() > 0.05 * b.max(1.0);
                if !moved(now.0, last.1.0) && !moved(now.1, last.1.1) {
                    break;
                }
                last = (Instant::now(), now);
            }
        }
        warm.fsync()?;
        warm.close()?;
        ebb.remove("ebb-bench-warmup")?;
    }
    let file = ebb.open("ebb-bench-stream", CREATE)?;
    let start = Instant::now();
    let mut at = 0;
    while at < opts.size {
        let n = (opts.size - at).min(opts.block as u64) as usize;
        file.write_at(&buf[..n], at)?;
        at += n as u64;
    }
    file.fsync()?;
    let secs = start.elapsed().as_secs_f64();
    let stats = file.throttle_stats();
    file.close()?;
    ebb.remove("ebb-bench-stream")?;
    settle();
    Ok((opts.size as f64 / MIB / secs, stats))
}

/// Streams `size` bytes through ebb and with raw `O_DIRECT` writes, alternating.
pub fn stream(opts: &StreamOptions) -> io::Result<StreamResult> {
    let mut rounds = Vec::new();
    let mut pauses: Option<crate::ThrottleStats> = None;
    settle();
    let source = source_block(opts.block);
    for _ in 0..opts.rounds.max(1) {
        let raw = raw_stream(&opts.dir, opts.size, opts.block, Some(&source))?;
        let raw_static = raw_stream(&opts.dir, opts.size, opts.block, None)?;
        let (ebb, stats) = ebb_stream(opts)?;
        rounds.push(StreamRound { raw, raw_static, ebb });
        pauses = Some(stats);
    }
    let n = rounds.len() as f64;
    let raw_mb_s = rounds.iter().map(|r| r.raw).sum::<f64>() / n;
    let raw_static_mb_s = rounds.iter().map(|r| r.raw_static).sum::<f64>() / n;
    let write_mb_s = rounds.iter().map(|r| r.ebb).sum::<f64>() / n;
    let p = pauses.unwrap_or_default();
    Ok(StreamResult {
        write_mb_s,
        raw_mb_s,
        ratio: write_mb_s / raw_mb_s,
        raw_static_mb_s,
        ratio_static: write_mb_s / raw_static_mb_s,
        pause_ms_p50: p.pause_us_p50 as f64 / 1000.0,
        pause_ms_p99: p.pause_us_p99 as f64 / 1000.0,
        pause_ms_max: p.pause_us_max as f64 / 1000.0,
        pauses: p.pauses,
        bytes: opts.size,
        memory_bytes: opts.memory,
        rounds,
        warmup_bytes: opts.warmup,
    })
}

/// Options of [`read_under_write`].
#[derive(Clone, Debug)]
pub struct ReadUnderWriteOptions {
    /// Directory on the filesystem under test.
    pub dir: PathBuf,
    /// Length of each mode.
    pub seconds: f64,
    /// Size of the file the reader reads at random.
    pub read_file_size: u64,
    /// The writer wraps around at this size.
    pub write_file_size: u64,
    /// ebb's memory budget.
    pub memory: u64,
    /// Knobs for the ebb modes (kernel names), applied before each mode's `wbt`.
    pub knobs: Vec<(String, String)>,
    /// Rounds: the modes take turns (idle, ebb wbt on, ebb wbt off, kernel, then again), and
    /// each mode's reads of every round make one histogram, so that every mode samples the
    /// machine's slow moments alike.
    pub rounds: u32,
}

/// One mode of [`read_under_write`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModeResult {
    /// Read latency percentiles, microseconds.
    pub read_lat_us_p50: u64,
    /// 90th.
    pub read_lat_us_p90: u64,
    /// 99th.
    pub read_lat_us_p99: u64,
    /// 99.9th.
    pub read_lat_us_p99_9: u64,
    /// 99.99th.
    pub read_lat_us_p99_99: u64,
    /// Slowest read.
    pub read_lat_us_max: u64,
    /// Reads done.
    pub reads: u64,
    /// The writer: bytes over the time from its first write to the end of its fsync (0 when
    /// there is no writer).
    pub write_mb_s: f64,
}

/// What [`read_under_write`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct ReadUnderWriteResult {
    /// `idle`, `ebb_wbt_on`, `ebb_wbt_off`, `kernel`.
    pub modes: BTreeMap<String, ModeResult>,
    /// Seconds per mode and round.
    pub seconds: f64,
    /// Rounds.
    pub rounds: u32,
    /// ebb's memory budget.
    pub memory_bytes: u64,
    /// The wbt latency target ebb used, microseconds.
    pub wbt_lat_usec: u64,
}

fn mode_result(h: &Histogram<u64>, write_mb_s: f64) -> ModeResult {
    let q = |x: f64| if h.is_empty() { 0 } else { h.value_at_quantile(x) };
    ModeResult {
        read_lat_us_p50: q(0.5),
        read_lat_us_p90: q(0.9),
        read_lat_us_p99: q(0.99),
        read_lat_us_p99_9: q(0.999),
        read_lat_us_p99_99: q(0.9999),
        read_lat_us_max: if h.is_empty() { 0 } else { h.max() },
        reads: h.len(),
        write_mb_s,
    }
}

/// Random 4 KiB reads until `stop`; `read` performs one read at an offset.
fn reader(
    pages: u64,
    stop: &AtomicBool,
    mut read: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
) -> io::Result<Histogram<u64>> {
    let mut h = Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    let mut buf = AlignedBuf::zeroed(4096);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % pages) * 4096;
        let t = Instant::now();
        read(&mut buf, off)?;
        let _ = h.record((t.elapsed().as_micros() as u64).max(1));
    }
    Ok(h)
}

/// A streaming writer of 1 MiB blocks for `seconds`, then `finish`; returns MB/s.
fn writer(
    seconds: f64,
    wrap: u64,
    mut write: impl FnMut(&[u8], u64) -> io::Result<()>,
    finish: impl FnOnce() -> io::Result<()>,
) -> io::Result<f64> {
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 31) as u8).collect();
    let start = Instant::now();
    let mut written = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        write(&block, written % wrap)?;
        written += block.len() as u64;
    }
    finish()?;
    Ok(written as f64 / MIB / start.elapsed().as_secs_f64())
}

/// Random reads (`read`) while a streaming writer (`write`, then `sync`) runs for `seconds`;
/// the reader stops when the writer starts its sync.
fn reader_beside_writer(
    pages: u64,
    seconds: f64,
    wrap: u64,
    read: impl FnMut(&mut [u8], u64) -> io::Result<usize> + Send,
    write: impl FnMut(&[u8], u64) -> io::Result<()>,
    sync: impl FnOnce() -> io::Result<()>,
) -> io::Result<(Histogram<u64>, f64)> {
    let stop = AtomicBool::new(false);
    let (h, mb_s) = std::thread::scope(|s| {
        let r = s.spawn(|| reader(pages, &stop, read));
        let w = writer(seconds, wrap, write, || {
            stop.store(true, Ordering::Relaxed);
            sync()
        });
        stop.store(true, Ordering::Relaxed);
        (r.join().expect("reader thread"), w)
    });
    Ok((h?, mb_s?))
}

/// A builder with ebb's memory budget and the given knobs.
fn builder_with(memory: u64, knobs: &[(String, String)]) -> io::Result<Builder> {
    let mut builder = Builder::new().memory(memory);
    for (name, value) in knobs {
        builder = builder.knob(name, value).map_err(crate::config_error)?;
    }
    Ok(builder)
}

fn prepare_read_file(dir: &Path, size: u64) -> io::Result<Arc<dyn BackendFile>> {
    let backend = dir_backend(dir)?;
    let name = "ebb-bench-read";
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

/// Runs the four modes one after the other.
pub fn read_under_write(
    opts: &ReadUnderWriteOptions,
    progress: &mut dyn FnMut(&str),
) -> io::Result<ReadUnderWriteResult> {
    let size = opts.read_file_size.max(1 << 20) / (1 << 20) * (1 << 20);
    let pages = size / 4096;
    progress("preparing the read file");
    let read_file = prepare_read_file(&opts.dir, size)?;
    let secs = opts.seconds;
    // Per mode: the merged read latencies and each round's writer MB/s.
    let mut runs: BTreeMap<&str, (Histogram<u64>, Vec<f64>)> = BTreeMap::new();
    let mut add = |mode: &'static str, h: Histogram<u64>, mb_s: f64| -> io::Result<()> {
        match runs.entry(mode) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert((h, vec![mb_s]));
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let (merged, rates) = o.get_mut();
                merged.add(&h).map_err(|e| io::Error::other(e.to_string()))?;
                rates.push(mb_s);
            }
        }
        Ok(())
    };
    let mut wbt_lat = 0;
    settle();
    for round in 1..=opts.rounds.max(1) {
        progress(&format!("round {round}: idle, the reader alone"));
        let stop = AtomicBool::new(false);
        let h = std::thread::scope(|s| {
            let r = s.spawn(|| reader(pages, &stop, |b, o| read_file.read_at(b, o)));
            std::thread::sleep(Duration::from_secs_f64(secs));
            stop.store(true, Ordering::Relaxed);
            r.join().expect("reader thread")
        })?;
        add("idle", h, 0.0)?;

        for (mode, wbt) in [("ebb_wbt_on", "on"), ("ebb_wbt_off", "off")] {
            progress(&format!("round {round}: {mode}"));
            let ebb = builder_with(opts.memory, &opts.knobs)?
                .knob("wbt", wbt)
                .map_err(crate::config_error)?
                .directory(&opts.dir)?
                .build()?;
            {
                let core = ebb.inner.shared.core.lock();
                wbt_lat = wbt_lat.max(core.engine.config().backends[0].wbt_target_usec());
            }
            let rf = ebb.open("ebb-bench-read", OpenOptions { create: false, truncate: false })?;
            let wf = ebb.open("ebb-bench-write", CREATE)?;
            let (h, mb_s) = reader_beside_writer(
                pages,
                secs,
                opts.write_file_size,
                |b, o| rf.read_direct_at(b, o),
                |b, o| wf.write_at(b, o).map(drop),
                || wf.fsync(),
            )?;
            add(mode, h, mb_s)?;
            drop(rf);
            wf.close()?;
            ebb.remove("ebb-bench-write")?;
            drop(ebb);
            settle();
        }

        progress(&format!("round {round}: kernel, a buffered writer through the page cache"));
        let path = opts.dir.join("ebb-bench-kernel-write");
        let kf = std::fs::File::create(&path)?;
        let (h, mb_s) = reader_beside_writer(
            pages,
            secs,
            opts.write_file_size,
            |b, o| read_file.read_at(b, o),
            |b, o| {
                use std::os::unix::fs::FileExt;
                kf.write_all_at(b, o)
            },
            || kf.sync_data(),
        )?;
        add("kernel", h, mb_s)?;
        drop(kf);
        std::fs::remove_file(&path)?;
        settle();
    }
    let modes = runs
        .into_iter()
        .map(|(mode, (h, mb_s))| {
            let mean = mb_s.iter().sum::<f64>() / mb_s.len().max(1) as f64;
            (mode.to_owned(), mode_result(&h, mean))
        })
        .collect();
    Ok(ReadUnderWriteResult {
        modes,
        seconds: secs,
        rounds: opts.rounds.max(1),
        memory_bytes: opts.memory,
        wbt_lat_usec: wbt_lat,
    })
}

/// Options of [`write_path`].
#[derive(Clone, Debug)]
pub struct WritePathOptions {
    /// Thread counts to measure, e.g. `[1, 2, 4]`.
    pub threads: Vec<usize>,
    /// Size of each thread's file, rewritten by every pass. Within a core's own cache (1 MiB
    /// here) the figures are the write path's cost; larger files add the cores' contention for
    /// the shared L3 and memory.
    pub bytes_per_thread: u64,
    /// Passes per measurement.
    pub passes: u32,
    /// Measurements per thread count, interleaved across counts; the fastest is reported per
    /// count, and the median of the paired ratios as the scaling.
    pub repeats: u32,
}

/// One thread count of [`write_path`].
#[derive(Clone, Debug, Serialize)]
pub struct WritePathRun {
    /// Threads writing at once, each to its own file.
    pub threads: usize,
    /// Wall time per 4 KiB write, per thread, dirtying clean cached pages (passes after a sync,
    /// fastest measurement): the full dirtying path without the page faults of new memory.
    pub ns_per_write: f64,
    /// All threads' writes per second in that pass.
    pub writes_per_s: f64,
    /// CPU time of a writer thread per write in the same passes (median over the repeats):
    /// the cost of a write with the machine's availability taken out.
    pub cpu_ns_per_write: f64,
    /// The first pass: pages new to the cache, including the first touch of their memory
    /// (page faults, which dominate on a VM).
    pub ns_per_write_cold: f64,
    /// All threads' writes per second in the first pass.
    pub writes_per_s_cold: f64,
    /// Shared-counter reads per throttle check.
    pub global_counter_reads_per_check: f64,
    /// Throttle checks made.
    pub throttle_checks: u64,
    /// Checks that throttled (should be 0: the run stays under the freerun point).
    pub throttled_calls: u64,
}

/// What [`write_path`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct WritePathResult {
    /// One entry per thread count.
    pub runs: Vec<WritePathRun>,
    /// The first run's figures, under the contract's names.
    pub ns_per_write: f64,
    /// All threads' writes per second in the first run.
    pub writes_per_s: f64,
    /// Shared-counter reads per throttle check in the first run.
    pub global_counter_reads_per_check: f64,
    /// Writes per second with 2 threads over 1 thread, when both were measured: the median of
    /// the repeats' ratios (each repeat measures 1 and 2 threads back to back).
    pub scaling_1_to_2: Option<f64>,
    /// Every repeat's ratio, sorted.
    pub scaling_1_to_2_pairs: Vec<f64>,
    /// CPU time per write with 2 threads over 1 thread (median of the repeats' ratios): 1.0
    /// when a write costs a thread the same CPU with another writer beside it, whatever share
    /// of the machine the threads got.
    pub cpu_cost_2_over_1: Option<f64>,
}

/// What one measurement of [`write_path`] saw.
struct WritePathOnce {
    /// The first pass's wall time, seconds.
    cold: f64,
    /// The later passes' mean wall time, seconds.
    warm: f64,
    /// CPU time of the writer threads in the later passes, nanoseconds per write (the mean over
    /// threads).
    cpu_ns_per_write: f64,
    /// Shared-counter reads, throttle checks, throttled checks.
    counters: (u64, u64, u64),
}

/// The calling thread's CPU time, nanoseconds.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Each pass's wall time, from the first thread's start to the last thread's end, as the
/// threads themselves saw them: a main thread timing the barriers would add its own wake-up,
/// or miss part of a short pass when it wakes after the threads started.
struct PassTimes {
    epoch: Instant,
    starts: Vec<AtomicU64>,
    ends: Vec<AtomicU64>,
}

impl PassTimes {
    fn new(rounds: u32) -> PassTimes {
        PassTimes {
            epoch: Instant::now(),
            starts: (0..rounds).map(|_| AtomicU64::new(u64::MAX)).collect(),
            ends: (0..rounds).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn start(&self, round: u32) {
        self.starts[round as usize].fetch_min(self.now(), Ordering::Relaxed);
    }

    fn end(&self, round: u32) {
        self.ends[round as usize].fetch_max(self.now(), Ordering::Relaxed);
    }

    /// Seconds per pass.
    fn seconds(&self) -> Vec<f64> {
        self.starts
            .iter()
            .zip(&self.ends)
            .map(|(s, e)| {
                e.load(Ordering::Relaxed).saturating_sub(s.load(Ordering::Relaxed)) as f64 * 1e-9
            })
            .collect()
    }
}

/// Starts the threads of a pass together. Threads asleep in a barrier start a pass as they wake
/// up, tens of microseconds apart on this VM (more when a vCPU has halted), which is most of a
/// 40-60 us pass of 1 MiB; threads that yield while they wait keep their vCPUs running and give
/// way to whatever else must run (the sync's IO threads). The end is an ordinary barrier: the
/// main thread sleeps through the pass, and the threads time it themselves ([`PassTimes`]).
struct Gate {
    /// Passes opened so far.
    opened: AtomicU32,
    /// No more passes will open (the main thread failed).
    cancelled: AtomicBool,
    end: std::sync::Barrier,
}

impl Gate {
    fn new(threads: usize) -> Gate {
        Gate {
            opened: AtomicU32::new(0),
            cancelled: AtomicBool::new(false),
            end: std::sync::Barrier::new(threads + 1),
        }
    }

    /// Waits until pass `round` opens (true) or the gate is cancelled (false).
    fn wait_open(&self, round: u32) -> bool {
        while self.opened.load(Ordering::Acquire) <= round {
            if self.cancelled.load(Ordering::Acquire) {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// Tells the threads waiting for the next pass that none will open.
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    fn finish(&self) {
        self.end.wait();
    }

    /// Opens pass `round` and returns when its threads have finished it.
    fn open_and_wait(&self, round: u32) {
        self.opened.store(round + 1, Ordering::Release);
        self.end.wait();
    }
}

/// One measurement of [`write_path`]: a fresh cache, `threads` writers each rewriting its own
/// file `1 + passes` times.
fn write_path_once(threads: usize, per: u64, passes: u32) -> io::Result<WritePathOnce> {
    // Freerun point above everything written: memory 4x the data, dirty limits at 90/80%.
    let memory = (per * threads as u64 * 4).max(64 << 20);
    let ebb = Builder::new()
        .memory(memory)
        .knob("dirty_ratio", "90")
        .and_then(|b| b.knob("dirty_background_ratio", "80"))
        .map_err(crate::config_error)?
        .backend("mem", Arc::new(MemBackend::new()))
        .build()?;
    let files: Vec<crate::File> =
        (0..threads).map(|t| ebb.open(&format!("w{t}"), CREATE)).collect::<io::Result<_>>()?;
    // One long-lived thread per file; the main thread opens each pass after a sync made the
    // pages clean again, and the threads time it from the first start to the last end.
    let rounds = 1 + passes;
    let gate = Gate::new(threads);
    let pass = PassTimes::new(rounds);
    let cpu_total = std::thread::scope(|s| -> io::Result<u64> {
        let workers: Vec<_> = files
            .iter()
            .map(|f| {
                let (gate, pass) = (&gate, &pass);
                s.spawn(move || -> io::Result<u64> {
                    let page = [0x5au8; 4096];
                    let mut cpu = 0;
                    // After a failed write the thread still takes part in every pass, so that
                    // nobody waits for it, and reports the error at the end.
                    let mut failed = None;
                    for round in 0..rounds {
                        if !gate.wait_open(round) {
                            break;
                        }
                        pass.start(round);
                        let before = thread_cpu_ns();
                        let mut at = 0;
                        while at < per && failed.is_none() {
                            if let Err(e) = f.write_at(&page, at) {
                                failed = Some(e);
                            }
                            at += 4096;
                        }
                        if round > 0 {
                            cpu += thread_cpu_ns() - before;
                        }
                        pass.end(round);
                        gate.finish();
                    }
                    failed.map_or(Ok(cpu), Err)
                })
            })
            .collect();
        let mut synced = Ok(());
        for round in 0..rounds {
            synced = ebb.sync();
            if synced.is_err() {
                gate.cancel();
                break;
            }
            gate.open_and_wait(round);
        }
        let cpu = workers.into_iter().map(|h| h.join().expect("writer thread")).sum();
        synced.and(cpu)
    })?;
    let stats = ebb.stats().counters;
    for f in files {
        f.close()?;
    }
    // The first pass dirties pages new to the cache (page faults of new memory); the others
    // dirty clean cached pages.
    let times = pass.seconds();
    let warm = times[1..].iter().sum::<f64>() / f64::from(passes);
    let writes = (per / 4096) as f64 * f64::from(passes) * threads as f64;
    Ok(WritePathOnce {
        cold: times[0],
        warm,
        cpu_ns_per_write: cpu_total as f64 / writes,
        counters: (stats.global_counter_reads, stats.throttle_checks, stats.throttled_calls),
    })
}

/// Measures the write path into a memory backend with limits high enough that nobody throttles.
///
/// The thread counts are measured in turn within each repeat (1, 2, 4, 1, 2, 4, ...), so that a
/// repeat's figures saw the same machine: on a shared VM a memory-bound loop's speed drifts by
/// several times over seconds, and the fastest of each count alone compares moments, not counts.
pub fn write_path(opts: &WritePathOptions) -> io::Result<WritePathResult> {
    if opts.threads.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "write-path needs at least one thread count",
        ));
    }
    let per = (opts.bytes_per_thread / 4096 * 4096).max(4096);
    let passes = opts.passes.max(1);
    let writes = (per / 4096) as f64;
    // warm[i][r]: thread count i, repeat r.
    let mut warm = vec![Vec::new(); opts.threads.len()];
    let mut cold = vec![0.0; opts.threads.len()];
    let mut counters = vec![(0, 0, 0); opts.threads.len()];
    let mut cpu = vec![Vec::new(); opts.threads.len()];
    for r in 0..opts.repeats.max(1) {
        for (i, &threads) in opts.threads.iter().enumerate() {
            let m = write_path_once(threads, per, passes)?;
            if r == 0 {
                cold[i] = m.cold;
            }
            warm[i].push(m.warm);
            cpu[i].push(m.cpu_ns_per_write);
            let k = m.counters;
            counters[i] = (counters[i].0 + k.0, counters[i].1 + k.1, counters[i].2 + k.2);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let runs: Vec<WritePathRun> = opts
        .threads
        .iter()
        .enumerate()
        .map(|(i, &threads)| {
            let fastest = warm[i].iter().copied().fold(f64::INFINITY, f64::min);
            let (reads, checks, throttled) = counters[i];
            WritePathRun {
                threads,
                ns_per_write: fastest * 1e9 / writes,
                cpu_ns_per_write: median(&cpu[i]),
                writes_per_s: writes * threads as f64 / fastest,
                ns_per_write_cold: cold[i] * 1e9 / writes,
                writes_per_s_cold: writes * threads as f64 / cold[i],
                global_counter_reads_per_check: reads as f64 / checks.max(1) as f64,
                throttle_checks: checks,
                throttled_calls: throttled,
            }
        })
        .collect();
    let index = |n: usize| opts.threads.iter().position(|&t| t == n);
    // Writes per second with 2 threads over 1 thread, repeat by repeat (pairs measured seconds
    // apart), sorted.
    let mut pairs: Vec<f64> = match (index(1), index(2)) {
        (Some(one), Some(two)) => {
            warm[one].iter().zip(&warm[two]).map(|(w1, w2)| 2.0 * w1 / w2).collect()
        }
        _ => Vec::new(),
    };
    pairs.sort_by(f64::total_cmp);
    let cpu_pairs: Vec<f64> = match (index(1), index(2)) {
        (Some(one), Some(two)) => cpu[two].iter().zip(&cpu[one]).map(|(c2, c1)| c2 / c1).collect(),
        _ => Vec::new(),
    };
    let first = runs[0].clone();
    Ok(WritePathResult {
        ns_per_write: first.ns_per_write,
        writes_per_s: first.writes_per_s,
        global_counter_reads_per_check: first.global_counter_reads_per_check,
        scaling_1_to_2: (!pairs.is_empty()).then(|| pairs[pairs.len() / 2]),
        scaling_1_to_2_pairs: pairs,
        cpu_cost_2_over_1: (!cpu_pairs.is_empty()).then(|| median(&cpu_pairs)),
        runs,
    })
}

/// Writes `value` as pretty JSON to `path` (or nowhere).
pub fn write_json(path: Option<&Path>, value: &impl Serialize) -> io::Result<()> {
    if let Some(path) = path {
        let mut f = std::fs::File::create(path)?;
        serde_json::to_writer_pretty(&mut f, value).map_err(io::Error::other)?;
        writeln!(f)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The write-path bench measures what it reports: every pass timed, the pair ratios and the
    /// CPU cost present, and the throttle path reading the shared counters at most twice per
    /// check (the Kennedy 2009 target) without ever throttling.
    #[test]
    fn write_path_reports_the_shared_counter_reads() -> io::Result<()> {
        let opts = WritePathOptions {
            threads: vec![1, 2],
            bytes_per_thread: 1 << 20,
            passes: 3,
            repeats: 2,
        };
        let r = write_path(&opts)?;
        assert_eq!(r.runs.len(), 2);
        assert_eq!(r.scaling_1_to_2_pairs.len(), 2);
        assert!(r.scaling_1_to_2.is_some_and(|s| s > 0.0 && s.is_finite()));
        assert!(r.cpu_cost_2_over_1.is_some_and(|c| c > 0.0 && c.is_finite()));
        for run in &r.runs {
            assert!(run.ns_per_write > 0.0 && run.ns_per_write.is_finite(), "{run:?}");
            assert!(run.throttle_checks > 0, "{run:?}");
            assert_eq!(run.throttled_calls, 0, "{run:?}");
            assert!(run.global_counter_reads_per_check <= 2.0, "{run:?}");
        }
        Ok(())
    }
}
