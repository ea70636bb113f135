//! `ebb bench stream`: a streaming writer through ebb into a directory beside raw `O_DIRECT`
//! sequential writes to the same filesystem (the ceiling ebb's writeback can reach), or into
//! an NFS export beside a raw NFS client: one stream of UNSTABLE WRITEs with as many in flight
//! as ebb has, and one COMMIT at the end.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use ebb_backend::{AlignedBuf, Backend};
use ebb_runtime::{RuntimeStats, ThrottleStats};
use serde::Serialize;

use super::{CREATE, MIB, NFS_IN_FLIGHT, Target, builder_with, dir_backend, nfs, settle};

/// Options of [`stream`].
#[derive(Clone, Debug)]
pub(crate) struct StreamOptions {
    /// The directory or NFS export under test.
    pub(crate) target: Target,
    /// Bytes each run writes.
    pub(crate) size: u64,
    /// ebb's memory budget.
    pub(crate) memory: u64,
    /// Bytes per write call.
    pub(crate) block: usize,
    /// Rounds (raw then ebb, alternating); the means are reported.
    pub(crate) rounds: u32,
    /// At most this many bytes are streamed through the same cache before the timed run, until
    /// its bandwidth estimate and ratelimit settle (the kernel starts the estimate at 100 MB/s
    /// and moves it about 5% per 200 ms: a long-lived cache is past that, a fresh one is not).
    pub(crate) warmup: u64,
    /// Knobs for ebb (kernel names, plus ebb's `initial_write_bandwidth`).
    pub(crate) knobs: Vec<(String, String)>,
    /// Also run ebb traced into this file (`Builder::trace`) each round, to measure the cost.
    pub(crate) trace: Option<std::path::PathBuf>,
}

/// The bound of the benchmark's trace file (the mount's default).
const TRACE_MAX_BYTES: u64 = 1 << 30;

/// What [`stream`] measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct StreamResult {
    /// Through ebb: bytes over the time from the first write to the end of fsync.
    pub(crate) write_mb_s: f64,
    /// Raw `O_DIRECT` sequential writes, same block size, ended by fdatasync, of data copied
    /// before each write from the same ordinary (unaligned) memory ebb's writer passes to
    /// `write_at`: what an application writing its own data with `O_DIRECT` does. On NFS: the
    /// raw client's UNSTABLE WRITEs of the same blocks, then its COMMIT.
    pub(crate) raw_mb_s: f64,
    /// `write_mb_s / raw_mb_s`.
    pub(crate) ratio: f64,
    /// Raw `O_DIRECT` writes of one aligned buffer that never changes: the device's best case.
    /// The gap to [`StreamResult::raw_mb_s`] is the copy (BENCHMARKS.md, "Runtime"). Not on
    /// NFS, whose client copies every block into its request anyway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) raw_static_mb_s: Option<f64>,
    /// `write_mb_s / raw_static_mb_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ratio_static: Option<f64>,
    /// Writes in flight to an NFS server, ebb's IO threads and the raw client's alike.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) in_flight: Option<usize>,
    /// What the last timed ebb run did: `writepages_calls`, `writepages_pages`, `commits`,
    /// and the backend's own counters (NFS: `write_rpcs`, `commit_rpcs`, `retransmits`, ...).
    pub(crate) ebb_counters: BTreeMap<String, u64>,
    /// The ebb writer's pauses (dirty throttling), milliseconds.
    pub(crate) pause_ms_p50: f64,
    /// 99th percentile pause.
    pub(crate) pause_ms_p99: f64,
    /// Longest pause.
    pub(crate) pause_ms_max: f64,
    /// Pauses taken.
    pub(crate) pauses: u64,
    /// Bytes per run.
    pub(crate) bytes: u64,
    /// ebb's memory budget.
    pub(crate) memory_bytes: u64,
    /// Each round's MB/s.
    pub(crate) rounds: Vec<StreamRound>,
    /// Bytes streamed through the cache before each timed ebb run.
    pub(crate) warmup_bytes: u64,
    /// With `--trace`: ebb traced (`Builder::trace`), MB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) traced_mb_s: Option<f64>,
    /// With `--trace`: the median over rounds of traced over untraced MB/s, minus 1 (negative:
    /// tracing cost that fraction of the throughput).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) trace_cost: Option<f64>,
    /// With `--trace`: the size of the last traced run's trace file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) trace_bytes: Option<u64>,
}

/// One round of [`stream`], MB/s.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct StreamRound {
    /// Raw, copying each block into its aligned buffer first.
    pub(crate) raw: f64,
    /// Raw, one unchanged buffer (not on NFS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) raw_static: Option<f64>,
    /// Through ebb.
    pub(crate) ebb: f64,
    /// Through ebb, traced (with `--trace`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ebb_traced: Option<f64>,
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

/// The bytes every streaming writer of the bench writes, block after block (ordinary memory).
fn source_block(block: usize) -> Vec<u8> {
    (0..block).map(|i| i as u8).collect()
}

/// The counters of one ebb run: the engine's writepages calls and pages and COMMITs, and the
/// backend's own counters, each as `after - before`.
fn counters_between(before: &RuntimeStats, after: &RuntimeStats) -> BTreeMap<String, u64> {
    let engine = |stats: &RuntimeStats| {
        let counters = &stats.counters;
        let mut engine = BTreeMap::from([
            ("writepages_calls".to_owned(), counters.writepages_calls),
            ("writepages_pages".to_owned(), counters.writepages_pages),
            ("commits".to_owned(), counters.commits),
        ]);
        if let Some(backend) = stats.backend_counters.first() {
            engine.extend(backend.iter().map(|(name, value)| (name.clone(), *value)));
        }
        engine
    };
    let before = engine(before);
    engine(after)
        .into_iter()
        .map(|(name, value)| {
            let was = before.get(&name).copied().unwrap_or(0);
            (name, value.saturating_sub(was))
        })
        .collect()
}

fn ebb_stream(
    opts: &StreamOptions,
    trace: Option<&Path>,
) -> io::Result<(f64, ThrottleStats, BTreeMap<String, u64>)> {
    let mut builder = builder_with(opts.memory, &opts.knobs)?;
    if let Some(path) = trace {
        builder = builder.trace(path, TRACE_MAX_BYTES);
    }
    let ebb = opts.target.add_to(builder)?.build()?;
    let buf = source_block(opts.block);
    if opts.warmup > 0 {
        // Stream until the bandwidth estimate and the ratelimit have each moved less than 5% in
        // the last second (at most `warmup` bytes).
        let warm = ebb.open("ebb-bench-warmup", CREATE)?;
        let mut at = 0;
        // In kB/s, as `ebb stat` shows them.
        let sample = || {
            let bdi = &ebb.stats().bdi[0];
            let kbps = |pages_per_s: u64| (pages_per_s * ebb_core::PAGE_SIZE / 1024) as f64;
            (kbps(bdi.avg_write_bandwidth), kbps(bdi.dirty_ratelimit))
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
    let before = ebb.stats();
    let start = Instant::now();
    let mut at = 0;
    while at < opts.size {
        let n = (opts.size - at).min(opts.block as u64) as usize;
        file.write_at(&buf[..n], at)?;
        at += n as u64;
    }
    file.fsync()?;
    let secs = start.elapsed().as_secs_f64();
    let counters = counters_between(&before, &ebb.stats());
    let stats = file.throttle_stats();
    file.close()?;
    ebb.remove("ebb-bench-stream")?;
    settle();
    Ok((opts.size as f64 / MIB / secs, stats, counters))
}

/// The raw writers of one round: (copying, static) for a directory, the raw client for NFS.
fn raw_round(opts: &StreamOptions, source: &[u8]) -> io::Result<(f64, Option<f64>)> {
    match &opts.target {
        Target::Dir(dir) => {
            let raw = raw_stream(dir, opts.size, opts.block, Some(source))?;
            Ok((raw, Some(raw_stream(dir, opts.size, opts.block, None)?)))
        }
        Target::Nfs(backend) => {
            let raw = nfs::raw_stream(backend, opts.size, source, NFS_IN_FLIGHT)?;
            settle();
            Ok((raw, None))
        }
    }
}

/// Streams `size` bytes through ebb and with the raw writers, alternating.
pub(crate) fn stream(opts: &StreamOptions) -> io::Result<StreamResult> {
    let mut rounds = Vec::new();
    let mut pauses: Option<ThrottleStats> = None;
    let mut ebb_counters = BTreeMap::new();
    settle();
    let source = source_block(opts.block);
    for _ in 0..opts.rounds.max(1) {
        let (raw, raw_static) = raw_round(opts, &source)?;
        let (ebb, stats, counters) = ebb_stream(opts, None)?;
        let ebb_traced = match &opts.trace {
            Some(path) => Some(ebb_stream(opts, Some(path))?.0),
            None => None,
        };
        rounds.push(StreamRound { raw, raw_static, ebb, ebb_traced });
        pauses = Some(stats);
        ebb_counters = counters;
    }
    let mut costs: Vec<f64> =
        rounds.iter().filter_map(|r| Some(r.ebb_traced? / r.ebb - 1.0)).collect();
    costs.sort_by(f64::total_cmp);
    let trace_cost = (!costs.is_empty()).then(|| costs[costs.len() / 2]);
    let traced: Vec<f64> = rounds.iter().filter_map(|r| r.ebb_traced).collect();
    let traced_mb_s =
        (!traced.is_empty()).then(|| traced.iter().sum::<f64>() / traced.len() as f64);
    let trace_bytes = match &opts.trace {
        Some(path) => Some(std::fs::metadata(path)?.len()),
        None => None,
    };
    let n = rounds.len() as f64;
    let raw_mb_s = rounds.iter().map(|r| r.raw).sum::<f64>() / n;
    let raw_static_mb_s = match &opts.target {
        Target::Dir(_) => Some(rounds.iter().filter_map(|r| r.raw_static).sum::<f64>() / n),
        Target::Nfs(_) => None,
    };
    let write_mb_s = rounds.iter().map(|r| r.ebb).sum::<f64>() / n;
    let p = pauses.unwrap_or_default();
    Ok(StreamResult {
        write_mb_s,
        raw_mb_s,
        ratio: write_mb_s / raw_mb_s,
        raw_static_mb_s,
        ratio_static: raw_static_mb_s.map(|raw_static| write_mb_s / raw_static),
        in_flight: matches!(opts.target, Target::Nfs(_)).then_some(NFS_IN_FLIGHT),
        ebb_counters,
        pause_ms_p50: p.pause_us_p50 as f64 / 1000.0,
        pause_ms_p99: p.pause_us_p99 as f64 / 1000.0,
        pause_ms_max: p.pause_us_max as f64 / 1000.0,
        pauses: p.pauses,
        bytes: opts.size,
        memory_bytes: opts.memory,
        rounds,
        warmup_bytes: opts.warmup,
        traced_mb_s,
        trace_cost,
        trace_bytes,
    })
}
