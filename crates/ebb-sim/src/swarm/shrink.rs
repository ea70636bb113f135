//! Shrinking a failing world: greedy steps (drop the crash, a fault, an NFS restart, a
//! workload, an unused backend, a knob, a workload's truncate or unlink; shorten a fault; halve
//! a workload), each kept if the
//! smaller world still fails the same checker, until no step is kept or the budget of runs is
//! spent. The result is written as an experiment file by [`Draw::to_toml`].

use super::{Draw, Failure, check_toml};
use crate::run::PlantedBug;

/// Runs a shrink may spend.
const SHRINK_RUNS_MAX: u32 = 400;

/// Every one-step-smaller world of `d`, the biggest cuts first.
fn candidates(d: &Draw) -> Vec<Draw> {
    let mut out = Vec::new();
    let mut with = |f: &dyn Fn(&mut Draw)| {
        let mut c = d.clone();
        f(&mut c);
        if c != *d {
            out.push(c);
        }
    };
    with(&|c| c.crash = None);
    with(&|c| {
        if let Some(crash) = &mut c.crash {
            crash.power_cut = false;
        }
    });
    with(&|c| {
        if let Some(crash) = &mut c.crash {
            crash.restart = false;
        }
    });
    for i in 0..d.workloads.len() {
        if d.workloads.len() > 1 {
            with(&|c| {
                c.workloads.remove(i);
            });
        }
    }
    for i in 0..d.faults.len() {
        with(&|c| {
            c.faults.remove(i);
        });
    }
    for b in (0..d.backends.len()).rev() {
        if d.backends.len() > 1 && d.workloads.iter().all(|w| w.backend != b) {
            with(&|c| remove_backend(c, b));
        }
        for r in 0..d.backends[b].restarts_ms.len() {
            with(&|c| {
                c.backends[b].restarts_ms.remove(r);
            });
        }
        for r in 0..d.backends[b].clean_restarts_ms.len() {
            with(&|c| {
                c.backends[b].clean_restarts_ms.remove(r);
            });
        }
        for k in 0..d.backends[b].knobs.len() {
            with(&|c| {
                c.backends[b].knobs.remove(k);
            });
        }
    }
    for i in 0..d.workloads.len() {
        with(&|c| c.workloads[i].keys.retain(|(k, _)| !k.starts_with("truncate_")));
        with(&|c| c.workloads[i].keys.retain(|(k, _)| k != "unlink"));
        with(&|c| halve_size(&mut c.workloads[i].keys));
    }
    for i in 0..d.faults.len() {
        with(&|c| {
            let f = &mut c.faults[i];
            let len = f.until_ms.map_or(1_000, |u| (u - f.from_ms) / 2).max(1);
            f.until_ms = Some(f.from_ms + len);
        });
        with(&|c| c.faults[i].delay_ms /= 2);
    }
    for k in 0..d.knobs.len() {
        with(&|c| {
            c.knobs.remove(k);
        });
    }
    out
}

fn remove_backend(c: &mut Draw, b: usize) {
    c.backends.remove(b);
    c.faults.retain(|f| f.backend != b);
    for f in &mut c.faults {
        if f.backend > b {
            f.backend -= 1;
        }
    }
    for w in &mut c.workloads {
        if w.backend > b {
            w.backend -= 1;
        }
    }
}

fn halve_size(keys: &mut [(String, String)]) {
    for (k, v) in keys.iter_mut() {
        if k == "size"
            && let Ok(bytes) = v.parse::<u64>()
            && bytes > 4096
        {
            *v = ((bytes / 2).max(4096) / 4096 * 4096).to_string();
        }
    }
}

/// Shrinks `draw`, which fails `failure.checker`; returns the smallest world found that fails
/// the same checker, with its failure, and the runs spent.
pub fn shrink(draw: &Draw, failure: &Failure, planted: Option<PlantedBug>) -> (Draw, Failure, u32) {
    let mut best = (draw.clone(), failure.clone());
    let mut runs = 0;
    'outer: loop {
        for c in candidates(&best.0) {
            if runs >= SHRINK_RUNS_MAX {
                break 'outer;
            }
            runs += 1;
            if let Err(f) = check_toml("shrink.toml", &c.to_toml(), planted, None)
                && f.checker == failure.checker
            {
                best = (c, f);
                continue 'outer;
            }
        }
        break;
    }
    (best.0, best.1, runs)
}
