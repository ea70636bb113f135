//! `ebb swarm`: many seeded simulated runs with random faults, checked for safety and
//! liveness (`ebb_sim::swarm`). Prints seeds per second and, per failing seed, what failed,
//! the command that replays it and the shrunk reproducer it wrote (an experiment file).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use ebb_sim::swarm::{self, Draw, POLICIES, SeedOutcome, SwarmOptions, replay_command};

use crate::{Usage, print_out};

#[derive(Args, Debug)]
pub(crate) struct SwarmArgs {
    /// Seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Threads.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// One throttle policy for every seed (legacy, bandwidth-2010, ioless); by default seed
    /// `s` runs the policy at `s % 3` of that list.
    #[arg(long)]
    policy: Option<String>,
    /// Write trace.txt and trace.json for every seed (under --out).
    #[arg(long)]
    trace: bool,
    /// Do not shrink failing seeds.
    #[arg(long)]
    no_shrink: bool,
    /// Print each seed's world (an experiment file) instead of running it.
    #[arg(long)]
    world: bool,
    /// Where reproducers and traces go.
    #[arg(long, default_value = "ebb-swarm")]
    out: PathBuf,
}

impl SwarmArgs {
    /// Where reproducers and traces go (`--out`).
    #[cfg(test)]
    pub(crate) fn out(&self) -> &std::path::Path {
        &self.out
    }
}

pub(crate) fn run(args: SwarmArgs) -> anyhow::Result<ExitCode> {
    if let Some(policy) = &args.policy
        && !POLICIES.contains(&policy.as_str())
    {
        return Err(
            Usage(format!("--policy {policy}: expected one of {}", POLICIES.join(", "))).into()
        );
    }
    if args.seeds == 0 {
        return Err(Usage("--seeds must be at least 1".into()).into());
    }
    if args.world {
        for seed in args.from..args.from.saturating_add(args.seeds) {
            let policy = swarm::policy_of(seed, args.policy.as_deref());
            print_out(&format!("{}\n", Draw::generate(seed, &policy).to_toml()))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let options = SwarmOptions {
        from: args.from,
        seeds: args.seeds,
        jobs: args.jobs.max(1),
        policy: args.policy.clone(),
        planted: None,
        trace_dir: args.trace.then(|| args.out.join("traces")),
    };
    let started = Instant::now();
    let done = AtomicU64::new(0);
    // A progress line every tenth of the seeds (at most every 1000), and after the first.
    let step = (args.seeds / 10).clamp(1, 1000);
    let outcomes = swarm::run_swarm(&options, &|o| {
        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
        if let Err(f) = &o.result {
            eprintln!("seed {} ({}): {} failed: {}", o.seed, o.policy, f.checker, f.message);
        }
        if n.is_multiple_of(step) || n == 1 {
            let elapsed = started.elapsed().as_secs_f64();
            eprintln!("ebb swarm: {n}/{} seeds done, {elapsed:.1} s", args.seeds);
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut text = totals(&outcomes, &args, options.jobs, elapsed);
    let failures: Vec<_> = outcomes.iter().filter(|o| o.result.is_err()).collect();
    for o in &failures {
        text.push_str(&failure_text(o, &args)?);
    }
    print_out(&text)?;
    Ok(if failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The run's line of totals: seeds, rate, failures, crashes, restarts, pages checked.
fn totals(outcomes: &[SeedOutcome], args: &SwarmArgs, jobs: usize, elapsed: f64) -> String {
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let crashed = outcomes.iter().filter(|o| o.result.as_ref().is_ok_and(|s| s.crashed)).count();
    let restarted =
        outcomes.iter().filter(|o| o.result.as_ref().is_ok_and(|s| s.restarts > 0)).count();
    let acked: u64 =
        outcomes.iter().filter_map(|o| o.result.as_ref().ok()).map(|s| s.acked_pages).sum();
    format!(
        "{} seeds ({}..{}) in {elapsed:.1} s: {:.1} seeds/s on {} threads; {} failed; {crashed} \
         ended in a crash, {restarted} restarted ebb after one; {acked} fsync-acknowledged pages \
         checked\n",
        outcomes.len(),
        args.from,
        args.from + args.seeds - 1,
        outcomes.len() as f64 / elapsed.max(1e-9),
        jobs,
        failed,
    )
}

/// A failed seed: its checker, message and replay command, and unless `--no-shrink` the
/// reproducer it shrinks to (written under `--out`).
fn failure_text(o: &SeedOutcome, args: &SwarmArgs) -> anyhow::Result<String> {
    let Err(f) = &o.result else { return Ok(String::new()) };
    let mut text = format!(
        "\nFAILED seed {} ({}): {}: {}\n  replay: {}\n",
        o.seed,
        o.policy,
        f.checker,
        f.message,
        replay_command(o.seed, &o.policy)
    );
    if !args.no_shrink {
        let draw = Draw::generate(o.seed, &o.policy);
        let (small, failure, runs) = swarm::shrink(&draw, f, None);
        std::fs::create_dir_all(&args.out)?;
        let path = args.out.join(format!("swarm-{}.toml", o.seed));
        std::fs::write(&path, small.to_toml())?;
        text.push_str(&format!(
            "  shrunk in {runs} runs: {} workload(s), {} fault(s){}: {}\n  reproducer: {} \
                 (ebb sim {})\n",
            small.workloads.len(),
            small.faults.len(),
            if small.crash.is_some() { ", a crash" } else { "" },
            failure.message,
            path.display(),
            path.display()
        ));
    }
    Ok(text)
}
