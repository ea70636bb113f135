//! The fault swarm: its reproducers (tests/swarm/*.toml) stay fixed, a planted bug is found
//! within the CI seed budget, and a run of seeds across all policies passes every checker.

use std::path::Path;
use std::time::Instant;

use ebb_sim::run::PlantedBug;
use ebb_sim::swarm::{self, Draw, SwarmOptions, check_toml};

/// Every shrunk reproducer the swarm found passes every checker now (each file says the bug
/// it found and its fix).
#[test]
fn reproducers_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/swarm");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/swarm")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no reproducers in {}", dir.display());
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read");
        let name = path.display().to_string();
        if let Err(f) = check_toml(&name, &text, None, None) {
            panic!("{name}: {} failed: {}", f.checker, f.message);
        }
    }
}

/// A seed's world is a valid experiment file, the same every time, and differs by seed.
#[test]
fn a_seed_draws_one_world() {
    let a = Draw::generate(7, "ioless");
    assert_eq!(a, Draw::generate(7, "ioless"));
    assert_ne!(a, Draw::generate(8, "ioless"));
    let mut drawn = std::collections::BTreeMap::new();
    for seed in 0..200 {
        let text = Draw::generate(seed, &swarm::policy_of(seed, None)).to_toml();
        ebb_sim::experiment::Experiment::parse(Path::new("w.toml"), &text)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        for key in [
            "truncate_at",
            "unlink",
            "read_errno",
            "kind = \"cp\"",
            " restart_at_s",
            "clean_restart",
            "restart = true",
        ] {
            *drawn.entry(key).or_insert(0) += u32::from(text.contains(key));
        }
    }
    // Every kind of operation and fault is drawn by some seed.
    assert!(drawn.values().all(|&n| n >= 5), "{drawn:?}");
}

/// Seeds the planted-bug tests may spend: the CI budget of one swarm test.
const PLANTED_SEEDS: u64 = 60;

/// The first seed below the budget that fails with `bug` planted, and its checker.
fn finds(bug: PlantedBug) -> Option<(u64, String)> {
    finds_within(bug, PLANTED_SEEDS)
}

/// The first seed below `budget` that fails with `bug` planted, and its checker.
fn finds_within(bug: PlantedBug, budget: u64) -> Option<(u64, String)> {
    (0..budget).find_map(|seed| {
        let policy = swarm::policy_of(seed, None);
        swarm::check_seed(seed, &policy, Some(bug), None).err().map(|f| (seed, f.checker))
    })
}

/// The checkers of lost data: acknowledged pages missing after a crash or at the end
/// (`durability`), pages the engine called durable missing from the durable image
/// (`durable_len`), or any written page missing once every fault is over and the cache has
/// drained (`lost`).
const DATA_LOSS: [&str; 3] = ["durability", "durable_len", "lost"];

/// A driver that tells the engine a failed write succeeded loses data: a data-loss checker
/// finds it, and the shrunk world still fails the same way.
#[test]
fn planted_swallowed_write_error_is_found() {
    let (seed, checker) = finds(PlantedBug::SwallowWriteError).expect("found within the budget");
    assert!(DATA_LOSS.contains(&checker.as_str()), "seed {seed}: {checker}");
    let draw = Draw::generate(seed, &swarm::policy_of(seed, None));
    let failure =
        swarm::check_toml("s.toml", &draw.to_toml(), Some(PlantedBug::SwallowWriteError), None)
            .expect_err("the seed fails");
    let (small, again, _) = swarm::shrink(&draw, &failure, Some(PlantedBug::SwallowWriteError));
    assert_eq!(again.checker, checker);
    assert!(
        small.workloads.len() <= draw.workloads.len() && small.faults.len() <= draw.faults.len()
    );
}

/// A lost write completion leaves pages under writeback forever: liveness finds it.
#[test]
fn planted_lost_completion_is_found() {
    let (seed, checker) = finds(PlantedBug::LoseCompletion).expect("found within the budget");
    assert_eq!(checker, "liveness", "seed {seed}");
}

/// A cache flush (or COMMIT) that makes nothing durable: a power cut or the end finds pages
/// missing.
#[test]
fn planted_skipped_flush_is_found() {
    let (seed, checker) = finds(PlantedBug::SkipFlush).expect("found within the budget");
    assert!(DATA_LOSS.contains(&checker.as_str()), "seed {seed}: {checker}");
}

/// The CI seed budget (`.ci/run`'s `ebb swarm --seeds 500`): a bug planted in the engine must
/// be found within it.
const CI_SEEDS: u64 = 500;

/// The engine skips the `held` counter update when a write fails with ENOSPC or EROFS: the
/// accounting check finds the counters off a recount.
#[test]
fn planted_skipped_held_count_is_found() {
    let bug = PlantedBug::Core(ebb_core::CoreBug::SkipHeldCount);
    let (seed, checker) = finds_within(bug, CI_SEEDS).expect("found within the CI budget");
    eprintln!("found at seed {seed}");
    assert_eq!(checker, "accounting", "seed {seed}");
}

/// The engine drops the pages of a write that failed with ENOSPC or EROFS as if written: once
/// the faults end and the cache drains, pages the application wrote are missing from the
/// devices (no fsync acknowledged them: the fsync reported the error).
#[test]
fn planted_dropped_held_page_is_found() {
    let bug = PlantedBug::Core(ebb_core::CoreBug::DropHeldPage);
    let (seed, checker) = finds_within(bug, CI_SEEDS).expect("found within the CI budget");
    eprintln!("found at seed {seed}");
    assert_eq!(checker, "lost", "seed {seed}");
}

/// The engine forgets that stable writes wait for a sync of their file: its durability
/// watermarks (`File::durable_len`) call pages durable that sit in a volatile write cache.
#[test]
fn planted_forgotten_unsynced_run_is_found() {
    let bug = PlantedBug::Core(ebb_core::CoreBug::ForgetUnsyncedRun);
    let (seed, checker) = finds_within(bug, CI_SEEDS).expect("found within the CI budget");
    eprintln!("found at seed {seed}");
    assert_eq!(checker, "durable_len", "seed {seed}");
}

/// Seeds across the three throttle policies pass every checker. .ci/run runs 500 with the
/// release binary (`ebb swarm --seeds 500`); this debug-build test runs 90 (with the tests
/// above, about 12 s on two loaded cores, 2026-11-25).
#[test]
fn seeds_across_policies_pass() {
    let started = Instant::now();
    let options = SwarmOptions { from: 0, seeds: 90, jobs: 2, ..Default::default() };
    let outcomes = swarm::run_swarm(&options, &|_| {});
    let failed: Vec<String> = outcomes
        .iter()
        .filter_map(|o| {
            let f = o.result.as_ref().err()?;
            Some(format!("seed {} ({}): {}: {}", o.seed, o.policy, f.checker, f.message))
        })
        .collect();
    eprintln!("{} seeds in {:.1} s", outcomes.len(), started.elapsed().as_secs_f64());
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A fault window and a crash in an experiment file reach the run; a bad one is refused
/// with its key and reason.
#[test]
fn experiment_files_declare_faults() {
    let base = Draw::generate(3, "ioless");
    let mut draw = base.clone();
    draw.faults = vec![swarm::draw::DrawFault {
        backend: 0,
        from_ms: 100,
        until_ms: Some(900),
        errno: 28,
        read_errno: 0,
        delay_ms: 5,
    }];
    draw.crash = Some(swarm::draw::DrawCrash { at_ms: 1500, power_cut: true, restart: true });
    let text = draw.to_toml();
    assert!(text.contains("errno = \"ENOSPC\""), "{text}");
    let experiment = ebb_sim::experiment::Experiment::parse(Path::new("f.toml"), &text)
        .unwrap_or_else(|e| panic!("{e}"));
    let spec = &experiment.runs(&Default::default())[0];
    assert_eq!(spec.faults.len(), 1);
    assert_eq!(spec.faults[0].errno, 28);
    assert_eq!(spec.faults[0].until, Some(ebb_core::Duration::from_millis(900)));
    assert_eq!(
        spec.crash.map(|c| (c.at, c.power_cut, c.restart)),
        Some((ebb_core::Duration::from_millis(1500), true, true))
    );
    for (bad, key, reason) in [
        ("errno = \"ENOSPC\"", "errno = \"ENOPE\"", "unknown errno"),
        ("until = \"900ms\"", "until = \"50ms\"", "must be after `from`"),
    ] {
        let broken = text.replace(bad, key);
        let e = ebb_sim::experiment::Experiment::parse(Path::new("f.toml"), &broken)
            .expect_err("refused");
        let message = e.to_string();
        assert!(message.contains("fault[0]") && message.contains(reason), "{message}");
    }
}
