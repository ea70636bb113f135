//! The fault swarm over real threads (issue 17): per seed, a cache of a drawn size over
//! `FaultyBackend` on a one- or two-phase `MemBackend`, one to three writers on their own
//! threads, each writing its own file in drawn blocks with an fsync now and then, while the
//! test thread arms a drawn fault schedule (EIO bursts and windows, ENOSPC windows, failing
//! COMMITs, slow writes). Timing is not deterministic here: a seed names a workload and a
//! schedule, not a run. The checkers are the simulator's, as far as the public API shows them:
//! every byte an fsync acknowledged is on the backend at once (no lost fsync'ed byte); once
//! the faults are cleared every writer's fsync succeeds, an error is reported at most once to
//! a handle (a second fsync after the first success succeeds), the whole of every file reaches
//! the backend, and the cache ends with nothing dirty, under writeback, unstable or held
//! (accounting), its counters equal to a recount of every file's pages and its frames within
//! the budget (`Ebb::check_accounting`, the simulator's `Engine::check_accounting`); every
//! writer finishes (liveness, within a generous bound). With the engine changed by hand to
//! drop held pages as if written, 6 of the 24 seeds fail (2026-11-26); with the `held` count
//! skipped (`CoreBug::SkipHeldCount`, planted) the recount finds it
//! (`planted_accounting_break_is_caught`).

use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::Duration;

use ebb_backend::{Backend, FaultOp, FaultPlan, FaultyBackend, MemBackend, OpenOptions};
use ebb_core::CoreBug;
use ebb_runtime::{Builder, Ebb, File};

use crate::io::backend_bytes;

/// Seeds the test runs (each takes well under a second on an idle machine); `EBB_SWARM_SEEDS`
/// asks for more.
const SEEDS: u64 = 24;

/// How long a writer may take before liveness fails: far beyond any seed's work.
const LIVENESS_BOUND: Duration = Duration::from_secs(120);

/// splitmix64: the seed's draws.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The byte at `offset` of file `file` in seed `seed`.
fn byte(seed: u64, file: u64, offset: u64) -> u8 {
    (offset.wrapping_mul(31).wrapping_add(file * 7 + seed) % 251) as u8
}

/// One writer's drawn work: its file's size, block size and fsync interval (0: only at the end).
#[derive(Clone, Copy)]
struct Work {
    file: u64,
    size: u64,
    bs: u64,
    fsync_every: u64,
}

/// Writes `work`'s file, fsyncing now and then; after each successful fsync the acknowledged
/// prefix must be on the backend. Returns the bytes written (a write the cache fails, with
/// held pages filling it, ends the writer as it ends dd).
fn write_file(seed: u64, f: &File, backend: &dyn Backend, work: Work) -> Result<u64, String> {
    let name = format!("f{}", work.file);
    let (mut pos, mut calls) = (0, 0);
    while pos < work.size {
        let n = work.bs.min(work.size - pos);
        let buf: Vec<u8> = (pos..pos + n).map(|o| byte(seed, work.file, o)).collect();
        if f.write_at(&buf, pos).is_err() {
            break;
        }
        pos += n;
        calls += 1;
        if work.fsync_every > 0 && calls % work.fsync_every == 0 && f.fsync().is_ok() {
            let on_backend = backend_bytes(backend, &name);
            let acked = (0..pos).map(|o| byte(seed, work.file, o));
            if on_backend.len() < pos as usize
                || !on_backend.iter().copied().take(pos as usize).eq(acked)
            {
                return Err(format!(
                    "{name}: bytes below {pos} acknowledged by fsync are not on the backend"
                ));
            }
        }
    }
    Ok(pos)
}

/// Arms one drawn fault on `plan`.
fn arm(rng: &mut Rng, plan: &FaultPlan, two_phase: bool) {
    let window = Duration::from_millis(20 + rng.below(300));
    match rng.below(5) {
        0 => plan.fail_next(FaultOp::Write, libc::EIO, 1 + rng.below(4)),
        1 => plan.fail_for(FaultOp::Write, libc::EIO, window),
        2 => plan.fail_for(FaultOp::Write, libc::ENOSPC, window),
        3 if two_phase => plan.fail_next(FaultOp::Commit, libc::EIO, 1 + rng.below(3)),
        _ => plan.delay(FaultOp::Write, Duration::from_millis(1 + rng.below(5))),
    }
}

/// fsyncs `f` until it succeeds (faults are cleared; an error still owed may come first), then
/// once more: an error must not be reported twice.
fn settle(f: &File, what: &str) -> Result<(), String> {
    let mut errors = 0;
    while let Err(e) = f.fsync() {
        errors += 1;
        if errors > 2 {
            return Err(format!("{what}: fsync keeps failing after the faults ended: {e}"));
        }
    }
    f.fsync().map_err(|e| format!("{what}: an error reported again after a success: {e}"))
}

fn check_seed(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let two_phase = rng.below(2) == 1;
    // From 6 MiB: a budget must leave a 4 MiB cache beside the IO buffers.
    let memory = (6 + rng.below(27)) << 20;
    let inner = if two_phase { MemBackend::two_phase() } else { MemBackend::new() };
    let faulty = Arc::new(FaultyBackend::new(inner));
    let plan = faulty.plan().clone();
    let backend: Arc<dyn Backend> = faulty;
    let ebb: Ebb = Builder::new().memory(memory).backend("b", backend.clone()).build().unwrap();
    let create = OpenOptions { create: true, truncate: true };
    let works: Vec<Work> = (0..1 + rng.below(3))
        .map(|file| Work {
            file,
            size: (1 + rng.below(96)) << 16,
            bs: 4096 << rng.below(9),
            fsync_every: rng.below(6),
        })
        .collect();
    let (done, finished) = channel();
    let mut handles = Vec::new();
    for &work in &works {
        let name = format!("f{}", work.file);
        let (f, watcher) = (ebb.open(&name, create).unwrap(), ebb.open(&name, create).unwrap());
        let (backend, done) = (backend.clone(), done.clone());
        std::thread::spawn(move || {
            let _ = done.send((work.file, write_file(seed, &f, &*backend, work), f));
        });
        handles.push(watcher);
    }
    for _ in 0..1 + rng.below(4) {
        std::thread::sleep(Duration::from_millis(rng.below(80)));
        arm(&mut rng, &plan, two_phase);
    }
    std::thread::sleep(Duration::from_millis(rng.below(200)));
    plan.clear();
    let mut written = Vec::new();
    for _ in &works {
        let (file, result, f) = finished
            .recv_timeout(LIVENESS_BOUND)
            .map_err(|_| "liveness: a writer did not finish".to_owned())?;
        written.push((file, result?));
        settle(&f, &format!("f{file}, writer"))?;
        f.close().map_err(|e| format!("f{file}: close after a success failed: {e}"))?;
    }
    for (i, watcher) in handles.iter().enumerate() {
        settle(watcher, &format!("f{i}, watcher"))?;
    }
    ebb.sync().map_err(|e| format!("sync after the faults ended: {e}"))?;
    for (file, pos) in written {
        let want: Vec<u8> = (0..pos).map(|o| byte(seed, file, o)).collect();
        if backend_bytes(&*backend, &format!("f{file}")) != want {
            return Err(format!("f{file}: the backend does not hold the {pos} bytes written"));
        }
    }
    ebb.check_accounting().map_err(|e| format!("accounting (check_accounting): {e}"))?;
    let m = ebb.stats().meminfo;
    if m.dirty + m.writeback + m.unstable + m.held > 0 {
        return Err(format!("accounting: after the final sync {m:?}"));
    }
    Ok(())
}

/// A CI-sized budget of seeds passes every checker. `EBB_SWARM_FROM` and `EBB_SWARM_SEEDS`
/// choose other seeds (a failing seed prints the command that replays it).
#[test]
fn seeds_pass_over_faulty_backends() {
    let env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    let from = env("EBB_SWARM_FROM").unwrap_or(0);
    let failed: Vec<String> = (from..from + env("EBB_SWARM_SEEDS").unwrap_or(SEEDS))
        .filter_map(|seed| {
            let e = check_seed(seed).err()?;
            Some(format!(
                "seed {seed}: {e}\n  replay: EBB_SWARM_FROM={seed} EBB_SWARM_SEEDS=1 cargo test \
                 -p ebb-runtime --test it seeds_pass_over_faulty_backends"
            ))
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Planted: a write refused with ENOSPC holds its pages but skips the `held` count
/// (`CoreBug::SkipHeldCount`); the check the swarm runs at the end of each seed finds the
/// counter off a recount. (Run over the swarm's seeds instead, it took 14 seeds and six
/// minutes on a loaded machine to hit an ENOSPC window; this plants it directly.)
#[test]
fn planted_accounting_break_is_caught() {
    let faulty = Arc::new(FaultyBackend::new(MemBackend::new()));
    let plan = faulty.plan().clone();
    let backend: Arc<dyn Backend> = faulty;
    let ebb: Ebb = Builder::new().memory(16 << 20).backend("b", backend).build().unwrap();
    let f = ebb.open("f", OpenOptions { create: true, truncate: true }).unwrap();
    f.write_at(&[7; 1 << 16], 0).unwrap();
    ebb.check_accounting().expect("the accounting holds before the bug");
    assert!(ebb.plant(CoreBug::SkipHeldCount), "ebb-core's planted-bugs feature is on for tests");
    plan.fail_next(FaultOp::Write, libc::ENOSPC, 1_000);
    assert!(f.fsync().is_err(), "the backend refuses the pages");
    let e = ebb.check_accounting().expect_err("held pages the counter does not count");
    assert!(e.contains("held"), "{e}");
    plan.clear();
}
