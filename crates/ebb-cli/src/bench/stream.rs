//! `ebb bench stream`: a streaming writer through ebb into a directory beside raw `O_DIRECT`
//! sequential writes to the same filesystem (the ceiling ebb's writeback can reach).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ebb_backend::{AlignedBuf, Backend};
use ebb_runtime::ThrottleStats;
use serde::Serialize;

use super::{CREATE, MIB, builder_with, dir_backend, settle};

/// Options of [`stream`].
#[derive(Clone, Debug)]
pub(crate) struct StreamOptions {
    /// Directory on the filesystem under test.
    pub(crate) dir: PathBuf,
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
}

/// What [`stream`] measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct StreamResult {
    /// Through ebb: bytes over the time from the first write to the end of fsync.
    pub(crate) write_mb_s: f64,
    /// Raw `O_DIRECT` sequential writes, same block size, ended by fdatasync, of data copied
    /// before each write from the same ordinary (unaligned) memory ebb's writer passes to
    /// `write_at`: what an application writing its own data with `O_DIRECT` does.
    pub(crate) raw_mb_s: f64,
    /// `write_mb_s / raw_mb_s`.
    pub(crate) ratio: f64,
    /// Raw `O_DIRECT` writes of one aligned buffer that never changes: the device's best case.
    /// The gap to [`StreamResult::raw_mb_s`] is the copy (BENCHMARKS.md, "Runtime").
    pub(crate) raw_static_mb_s: f64,
    /// `write_mb_s / raw_static_mb_s`.
    pub(crate) ratio_static: f64,
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
}

/// One round of [`stream`], MB/s.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct StreamRound {
    /// Raw, copying each block into its aligned buffer first.
    pub(crate) raw: f64,
    /// Raw, one unchanged buffer.
    pub(crate) raw_static: f64,
    /// Through ebb.
    pub(crate) ebb: f64,
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

fn ebb_stream(opts: &StreamOptions) -> io::Result<(f64, ThrottleStats)> {
    let ebb = builder_with(opts.memory, &opts.knobs)?.directory(&opts.dir)?.build()?;
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
pub(crate) fn stream(opts: &StreamOptions) -> io::Result<StreamResult> {
    let mut rounds = Vec::new();
    let mut pauses: Option<ThrottleStats> = None;
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
