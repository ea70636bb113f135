//! The NFS benches: the raw client `ebb bench stream --backend nfs://...` compares ebb with,
//! and `ebb bench nfs-commit-batching`, the experiment of NeilBrown's posting "[PATCH/RFC] MM:
//! fix writeback for NFS" (linux-mm, linux-nfs and linux-kernel, 25 March 2020) on a real
//! server.
//!
//! The posting: a dd of 1000 MB to an NFS mount on a client whose dirty threshold is well below
//! that. While unstable pages (written, not yet committed) counted as reclaimable, the throttle
//! kept waking the flusher for them although few pages were dirty, so each writepages call
//! found about a hundred pages (2000 to over 10000 calls); counted with writeback, 200-300
//! calls of about 850 pages. ebb reproduces both accountings (`unstable_accounting`), and the
//! simulator's `experiments/nfs-commit-batching.toml` checks them on a model of the server;
//! this bench runs the same dd through ebb against the real one and applies the same checks.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ebb_backend::{Backend, NfsBackend};
use ebb_runtime::Ebb;
use serde::Serialize;

use super::{CREATE, MIB, Target, builder_with, config_error, settle};

/// The unstable-page accountings compared, as the simulated experiment names them.
const VARIANTS: [&str; 2] = ["legacy-2020", "fixed"];

/// The checks of the simulated experiment: legacy-2020 makes at least this many times the
/// writepages calls of fixed ...
const CALLS_RATIO_MIN: f64 = 5.0;

/// ... and fixed finds at least this many pages per writepages call.
const PAGES_PER_CALL_MIN: f64 = 500.0;

/// Bytes per write of the dd (`bs=1M`).
const BLOCK_BYTES: usize = 1 << 20;

/// kB per page, for the cache's figures (in pages) shown in kB as `/proc/meminfo` does.
const KB_PER_PAGE: u64 = ebb_core::PAGE_SIZE / 1024;

/// How often the sampler reads the cache's dirty and unstable figures.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// One stream of `source`-sized UNSTABLE WRITEs, `in_flight` outstanding (each of that many
/// threads sends the next block when its last one is answered), then one COMMIT of the whole
/// file: the plainest NFS client, with no cache. Returns MB/s (MiB) to the COMMIT's reply; the
/// file is removed afterwards.
pub(crate) fn raw_stream(
    backend: &NfsBackend,
    size: u64,
    source: &[u8],
    in_flight: usize,
) -> io::Result<f64> {
    let name = "ebb-bench-raw";
    let file = backend.open(name, CREATE)?;
    let block = source.len() as u64;
    let next = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        let writers: Vec<_> = (0..in_flight.max(1))
            .map(|_| {
                scope.spawn(|| -> io::Result<()> {
                    loop {
                        let at = next.fetch_add(block, Ordering::Relaxed);
                        if size <= at {
                            return Ok(());
                        }
                        let len = (size - at).min(block) as usize;
                        file.write_at(&source[..len], at)?;
                    }
                })
            })
            .collect();
        writers.into_iter().try_for_each(|writer| {
            writer.join().map_err(|_| io::Error::other("a raw NFS writer panicked"))?
        })
    })?;
    file.commit(0, 0)?;
    let secs = start.elapsed().as_secs_f64();
    drop(file);
    backend.remove(name)?;
    Ok(size as f64 / MIB / secs)
}

/// Options of [`commit_batching`].
#[derive(Clone, Debug)]
pub(crate) struct CommitBatchingOptions {
    /// The export.
    pub(crate) backend: NfsBackend,
    /// Bytes the dd writes.
    pub(crate) size: u64,
    /// ebb's memory budget.
    pub(crate) memory: u64,
    /// Rounds (the variants take turns).
    pub(crate) rounds: u32,
    /// Knobs for both variants.
    pub(crate) knobs: Vec<(String, String)>,
}

/// One dd through ebb under one accounting.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct DdResult {
    /// Writepages calls, those that found nothing to write included (the posting's count,
    /// the VFSWRITEPAGES event of `/proc/self/mountstats`).
    pub(crate) writepages_calls: f64,
    /// Pages written over writepages calls.
    pub(crate) pages_per_writepages_mean: f64,
    /// COMMITs the engine sent.
    pub(crate) commits: f64,
    /// Unstable pages over COMMITs.
    pub(crate) pages_per_commit_mean: f64,
    /// WRITE and COMMIT RPCs on the wire (the backend's counters).
    pub(crate) write_rpcs: f64,
    /// COMMIT RPCs.
    pub(crate) commit_rpcs: f64,
    /// From the first write to the end of fsync, seconds.
    pub(crate) elapsed_s: f64,
    /// Bytes over that time, MB/s (MiB).
    pub(crate) write_mb_s: f64,
    /// The writer's pauses (dirty throttling), milliseconds.
    pub(crate) pause_ms_p50: f64,
    /// 99th percentile pause.
    pub(crate) pause_ms_p99: f64,
    /// Longest pause.
    pub(crate) pause_ms_max: f64,
    /// Pauses taken.
    pub(crate) pauses: f64,
    /// The most unstable data seen (`NFS_Unstable`, sampled every 10 ms), kB.
    pub(crate) unstable_kb_max: f64,
    /// The most dirty data seen, kB.
    pub(crate) dirty_kb_max: f64,
    /// The dirty threshold, kB.
    pub(crate) dirty_thresh_kb: f64,
}

/// A check of the simulated experiment, applied to the means.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Check {
    /// The experiment's check id.
    pub(crate) id: &'static str,
    /// What it requires.
    pub(crate) what: &'static str,
    /// The measured left side.
    pub(crate) left: f64,
    /// The bound it must reach.
    pub(crate) right: f64,
    /// `left >= right`.
    pub(crate) met: bool,
}

/// What [`commit_batching`] measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct CommitBatchingResult {
    /// Per accounting, the means over rounds.
    pub(crate) variants: BTreeMap<String, DdResult>,
    /// Per accounting, each round.
    pub(crate) rounds: BTreeMap<String, Vec<DdResult>>,
    /// The simulated experiment's checks.
    pub(crate) checks: Vec<Check>,
    /// Bytes each dd wrote.
    pub(crate) bytes: u64,
    /// ebb's memory budget.
    pub(crate) memory_bytes: u64,
    /// The export.
    pub(crate) backend: String,
}

/// Runs the dd once per accounting and round, then the checks.
pub(crate) fn commit_batching(
    opts: &CommitBatchingOptions,
    progress: &mut dyn FnMut(&str),
) -> io::Result<CommitBatchingResult> {
    let mut rounds: BTreeMap<String, Vec<DdResult>> = BTreeMap::new();
    settle();
    for round in 1..=opts.rounds.max(1) {
        for variant in VARIANTS {
            progress(&format!("round {round}: unstable_accounting={variant}"));
            let result = dd(opts, variant)?;
            progress(&format!(
                "  {:.0} writepages calls, {:.0} pages per call, {:.0} COMMITs, {:.1} s",
                result.writepages_calls,
                result.pages_per_writepages_mean,
                result.commits,
                result.elapsed_s
            ));
            rounds.entry(variant.to_owned()).or_default().push(result);
            settle();
        }
    }
    let variants: BTreeMap<String, DdResult> =
        rounds.iter().map(|(variant, runs)| (variant.clone(), mean(runs))).collect();
    let legacy = variants.get(VARIANTS[0]).cloned().unwrap_or_default();
    let fixed = variants.get(VARIANTS[1]).cloned().unwrap_or_default();
    let checks = vec![
        check(
            "legacy-more-calls",
            "legacy-2020 makes at least 5x more writepages calls than fixed",
            legacy.writepages_calls,
            CALLS_RATIO_MIN * fixed.writepages_calls,
        ),
        check(
            "fixed-large-batches",
            "fixed finds at least 500 pages per writepages call",
            fixed.pages_per_writepages_mean,
            PAGES_PER_CALL_MIN,
        ),
    ];
    Ok(CommitBatchingResult {
        variants,
        rounds,
        checks,
        bytes: opts.size,
        memory_bytes: opts.memory,
        backend: opts.backend.url().to_owned(),
    })
}

fn check(id: &'static str, what: &'static str, left: f64, right: f64) -> Check {
    Check { id, what, left, right, met: left >= right }
}

/// One dd of `opts.size` bytes in 1 MiB writes and an fsync, through a fresh ebb.
fn dd(opts: &CommitBatchingOptions, variant: &str) -> io::Result<DdResult> {
    let builder = builder_with(opts.memory, &opts.knobs)?
        .knob("unstable_accounting", variant)
        .map_err(config_error)?;
    let ebb = Target::Nfs(opts.backend.clone()).add_to(builder)?.build()?;
    let name = "ebb-bench-dd";
    let file = ebb.open(name, CREATE)?;
    let block: Vec<u8> = (0..BLOCK_BYTES).map(|i| (i * 13) as u8).collect();
    let before = ebb.stats();
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let (written, peaks) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| peaks_until(&ebb, &done));
        let written = (|| {
            let mut at = 0;
            while at < opts.size {
                let len = (opts.size - at).min(BLOCK_BYTES as u64) as usize;
                file.write_at(&block[..len], at)?;
                at += len as u64;
            }
            file.fsync()
        })();
        done.store(true, Ordering::Relaxed);
        (written, sampler.join().unwrap_or_default())
    });
    written?;
    let elapsed_s = start.elapsed().as_secs_f64();
    let after = ebb.stats();
    let pauses = file.throttle_stats();
    file.close()?;
    ebb.remove(name)?;
    let delta = |field: fn(&ebb_core::Stats) -> u64| {
        field(&after.counters).saturating_sub(field(&before.counters)) as f64
    };
    let backend = |name: &str| {
        let of = |stats: &ebb_runtime::RuntimeStats| -> u64 {
            stats
                .backend_counters
                .first()
                .and_then(|counters| counters.get(name).copied())
                .unwrap_or(0)
        };
        of(&after).saturating_sub(of(&before)) as f64
    };
    let calls = delta(|counters| counters.writepages_calls);
    let commits = delta(|counters| counters.commits);
    Ok(DdResult {
        writepages_calls: calls,
        pages_per_writepages_mean: delta(|counters| counters.writepages_pages) / calls.max(1.0),
        commits,
        pages_per_commit_mean: delta(|counters| counters.commit_pages) / commits.max(1.0),
        write_rpcs: backend("write_rpcs"),
        commit_rpcs: backend("commit_rpcs"),
        elapsed_s,
        write_mb_s: opts.size as f64 / MIB / elapsed_s,
        pause_ms_p50: pauses.pause_us_p50 as f64 / 1000.0,
        pause_ms_p99: pauses.pause_us_p99 as f64 / 1000.0,
        pause_ms_max: pauses.pause_us_max as f64 / 1000.0,
        pauses: pauses.pauses as f64,
        unstable_kb_max: peaks.0 as f64,
        dirty_kb_max: peaks.1 as f64,
        dirty_thresh_kb: (after.meminfo.thresh * KB_PER_PAGE) as f64,
    })
}

/// The most unstable and dirty data (kB) seen until `done`.
fn peaks_until(ebb: &Ebb, done: &AtomicBool) -> (u64, u64) {
    let (mut unstable, mut dirty) = (0, 0);
    while !done.load(Ordering::Relaxed) {
        let meminfo = ebb.stats().meminfo;
        unstable = unstable.max(meminfo.unstable);
        dirty = dirty.max(meminfo.dirty);
        std::thread::sleep(SAMPLE_EVERY);
    }
    (unstable * KB_PER_PAGE, dirty * KB_PER_PAGE)
}

/// The field-by-field mean of some runs.
fn mean(runs: &[DdResult]) -> DdResult {
    let n = runs.len().max(1) as f64;
    let sum = |field: fn(&DdResult) -> f64| runs.iter().map(field).sum::<f64>() / n;
    DdResult {
        writepages_calls: sum(|run| run.writepages_calls),
        pages_per_writepages_mean: sum(|run| run.pages_per_writepages_mean),
        commits: sum(|run| run.commits),
        pages_per_commit_mean: sum(|run| run.pages_per_commit_mean),
        write_rpcs: sum(|run| run.write_rpcs),
        commit_rpcs: sum(|run| run.commit_rpcs),
        elapsed_s: sum(|run| run.elapsed_s),
        write_mb_s: sum(|run| run.write_mb_s),
        pause_ms_p50: sum(|run| run.pause_ms_p50),
        pause_ms_p99: sum(|run| run.pause_ms_p99),
        pause_ms_max: sum(|run| run.pause_ms_max),
        pauses: sum(|run| run.pauses),
        unstable_kb_max: sum(|run| run.unstable_kb_max),
        dirty_kb_max: sum(|run| run.dirty_kb_max),
        dirty_thresh_kb: sum(|run| run.dirty_thresh_kb),
    }
}
