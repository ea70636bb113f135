//! The fault swarm: many seeded simulated runs, each a random world with random faults,
//! checked for safety and liveness as it runs (FoundationDB's simulation, TigerBeetle's VOPR).
//!
//! A seed draws a world ([`Draw::generate`], `draw.rs`): the memory budget (4 to 96 MiB) and
//! cache knobs, one to four backends of any device model (the NFS server model with restarts
//! that lose uncommitted data and change its verifier, and clean restarts that keep both, with
//! refused connections while the server is down), writers (dd with or without fsync, rolled
//! back by a truncate partway or unlinked after close; cp, which stops at a read error;
//! fs_mark), maybe a reader or a memory workload, up to four fault windows (EIO bursts,
//! permanent EIO, ENOSPC windows that end, EROFS for a while or for good, latency spikes,
//! connection errors, reads failing with EIO) and maybe a crash (ebb alone, or a power cut
//! that loses volatile write caches). The world is written as
//! an experiment file and loaded through [`crate::experiment`], so the file *is* the
//! reproducer.
//!
//! [`check_spec`] runs it with [`crate::run::run_checked`]: accounting and the memory budget
//! after every event, the durability of every fsync-acknowledged byte after the crash and at
//! the end, the engine's durability watermarks (every page it calls durable is, after each
//! sync of a file, the crash and the end), nothing written missing once the faults are over
//! and the cache drained, errseq at each fsync, close and read, the `ioless` pause bound; then
//! liveness once the
//! run is over: every fsync, close and read answered, every writer finished, and, when every fault
//! ends, the cache drained (no page dirty, under writeback or unstable). An engine panic is a
//! failure too. A failing seed is shrunk (`shrink.rs`) to a smaller world that fails the same
//! checker.
//!
//! A crash may end the run, or ebb may restart after it (`run/restart.rs`): a new engine over
//! what the devices kept, the writers going on; the checkers then go on too, with what the
//! application wrote reset to the devices' image.
//!
//! Not drawn (yet): renames (the engine knows files by inode, so a rename changes nothing it
//! sees; the FUSE layer's renames are tested there).

pub mod draw;
mod shrink;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub use draw::Draw;
pub use shrink::shrink;

use crate::experiment::{ExpandOptions, Experiment};
use crate::run::{PlantedBug, RunSpec, run_checked};

/// The throttle policies a swarm cycles through (seed `s` uses `POLICIES[s % 3]` unless one is
/// chosen).
pub const POLICIES: [&str; 3] = ["legacy", "bandwidth-2010", "ioless"];

/// The policy seed `seed` runs under: `policy` if given, else the seed's turn in [`POLICIES`].
pub fn policy_of(seed: u64, policy: Option<&str>) -> String {
    policy
        .map_or_else(|| POLICIES[(seed % POLICIES.len() as u64) as usize].to_owned(), str::to_owned)
}

/// A seed that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The checker that failed: `accounting`, `durability`, `durable_len`, `lost`, `errseq`,
    /// `pause`, `liveness`, `panic`, or `world` (the drawn world was refused: a bug of the
    /// generator).
    pub checker: String,
    /// What it found.
    pub message: String,
}

/// What a passing seed did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SeedStats {
    /// Events checked.
    pub events: u64,
    /// Successful fsyncs, and the pages they acknowledged.
    pub fsyncs_ok: u64,
    /// Pages acknowledged.
    pub acked_pages: u64,
    /// Write errors the engine saw.
    pub write_errors: u64,
    /// The run ended at a crash.
    pub crashed: bool,
    /// Restarts of ebb after a crash.
    pub restarts: u64,
    /// Pages written to and read from devices.
    pub simulated_pages: u64,
}

/// One seed's result.
#[derive(Clone, Debug)]
pub struct SeedOutcome {
    /// The seed.
    pub seed: u64,
    /// Its policy.
    pub policy: String,
    /// Pass or fail.
    pub result: Result<SeedStats, Failure>,
}

fn failure(checker: &str, message: impl Into<String>) -> Failure {
    Failure { checker: checker.to_owned(), message: message.into() }
}

/// Runs `spec` under the checkers, then checks liveness. An engine panic is a failure.
pub fn check_spec(spec: &RunSpec, planted: Option<PlantedBug>) -> Result<SeedStats, Failure> {
    let ran = catch_unwind(AssertUnwindSafe(|| run_checked(spec, planted)));
    let (result, report) = match ran {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return Err(failure("world", e.to_string())),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned());
            return Err(failure("panic", message));
        }
    };
    if let Some((checker, message)) = report.violation {
        return Err(failure(checker, message));
    }
    let metric = |name: &str| result.metrics.get(name).copied().unwrap_or(0.0);
    let stats = SeedStats {
        events: report.events,
        fsyncs_ok: report.fsyncs_ok,
        acked_pages: report.acked_pages,
        write_errors: metric("write_errors") as u64,
        crashed: report.crashed,
        restarts: report.restarts,
        simulated_pages: result.simulated_pages,
    };
    if report.crashed {
        return Ok(stats);
    }
    let limit = spec.time_limit.as_secs_f64();
    if report.unanswered > 0 {
        return Err(failure(
            "liveness",
            format!(
                "{} fsync, close, read or sync call(s) not answered within {limit} s",
                report.unanswered
            ),
        ));
    }
    // Liveness is owed once every fault has ended: a backend that fails every write forever
    // may keep writers throttled and the cache dirty for good (the pages are kept, never
    // dropped), but what was asked must still be answered.
    if spec.faults.iter().any(|f| f.until.is_none() && f.errno != 0) {
        return Ok(stats);
    }
    if metric("writers_unfinished") > 0.0 {
        return Err(failure(
            "liveness",
            format!("{} writer(s) not finished within {limit} s", metric("writers_unfinished")),
        ));
    }
    if !report.synced {
        return Err(failure("liveness", format!("the final sync did not return within {limit} s")));
    }
    if metric("end_unclean_pages") > 0.0 {
        return Err(failure(
            "liveness",
            format!(
                "the cache did not drain: {} page(s) still dirty, under writeback or unstable \
                 after the final sync, though every fault had ended",
                metric("end_unclean_pages")
            ),
        ));
    }
    Ok(stats)
}

/// Loads an experiment file's text (a swarm reproducer) and checks each of its runs.
pub fn check_toml(
    name: &str,
    text: &str,
    planted: Option<PlantedBug>,
    trace_dir: Option<PathBuf>,
) -> Result<SeedStats, Failure> {
    let experiment = Experiment::parse(Path::new(name), text)
        .map_err(|e| failure("world", format!("the drawn world was refused: {e}")))?;
    let mut last = SeedStats::default();
    for spec in experiment.runs(&ExpandOptions { trace_dir, ..ExpandOptions::default() }) {
        last = check_spec(&spec, planted)?;
    }
    Ok(last)
}

/// Draws and checks the world of `seed`.
pub fn check_seed(
    seed: u64,
    policy: &str,
    planted: Option<PlantedBug>,
    trace_dir: Option<PathBuf>,
) -> Result<SeedStats, Failure> {
    let draw = Draw::generate(seed, policy);
    check_toml(&format!("swarm-{seed}.toml"), &draw.to_toml(), planted, trace_dir)
}

/// What a swarm runs.
#[derive(Clone, Debug, Default)]
pub struct SwarmOptions {
    /// First seed.
    pub from: u64,
    /// Seeds to run.
    pub seeds: u64,
    /// Threads (at least one).
    pub jobs: usize,
    /// One policy for every seed, or each seed's turn in [`POLICIES`].
    pub policy: Option<String>,
    /// A bug to plant in every run (the swarm's own tests).
    pub planted: Option<PlantedBug>,
    /// Where to write trace files (`<dir>/<seed>/...`).
    pub trace_dir: Option<PathBuf>,
}

/// Runs seeds `from..from + seeds` on `jobs` threads; `done` sees each outcome as it comes
/// (in no particular order). Returns the outcomes in seed order.
pub fn run_swarm(options: &SwarmOptions, done: &(dyn Fn(&SeedOutcome) + Sync)) -> Vec<SeedOutcome> {
    let next = AtomicU64::new(0);
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= options.seeds {
                        break;
                    }
                    let seed = options.from + i;
                    let policy = policy_of(seed, options.policy.as_deref());
                    let trace = options.trace_dir.as_ref().map(|d| d.join(seed.to_string()));
                    let result = check_seed(seed, &policy, options.planted, trace);
                    let outcome = SeedOutcome { seed, policy, result };
                    done(&outcome);
                    outcomes.lock().unwrap_or_else(|p| p.into_inner()).push(outcome);
                }
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap_or_else(|p| p.into_inner());
    outcomes.sort_by_key(|o| o.seed);
    outcomes
}

/// The command that replays one seed.
pub fn replay_command(seed: u64, policy: &str) -> String {
    format!("ebb swarm --seeds 1 --from {seed} --policy {policy} --trace")
}
