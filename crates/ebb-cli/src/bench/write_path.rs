//! `ebb bench write-path`: nanoseconds per 4 KiB write into the cache with no throttling, from
//! 1 to N threads, and the shared-counter reads per throttle check.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use ebb_backend::MemBackend;
use ebb_runtime::Builder;
use serde::Serialize;

use super::{CREATE, config_error};

/// Options of [`write_path`].
#[derive(Clone, Debug)]
pub(crate) struct WritePathOptions {
    /// Thread counts to measure, e.g. `[1, 2, 4]`.
    pub(crate) threads: Vec<usize>,
    /// Size of each thread's file, rewritten by every pass. Within a core's own cache (1 MiB
    /// here) the figures are the write path's cost; larger files add the cores' contention for
    /// the shared L3 and memory.
    pub(crate) bytes_per_thread: u64,
    /// Passes per measurement.
    pub(crate) passes: u32,
    /// Measurements per thread count, interleaved across counts; the fastest is reported per
    /// count, and the median of the paired ratios as the scaling.
    pub(crate) repeats: u32,
}

/// One thread count of [`write_path`].
#[derive(Clone, Debug, Serialize)]
pub(crate) struct WritePathRun {
    /// Threads writing at once, each to its own file.
    pub(crate) threads: usize,
    /// Wall time per 4 KiB write, per thread, dirtying clean cached pages (passes after a sync,
    /// fastest measurement): the full dirtying path without the page faults of new memory.
    pub(crate) ns_per_write: f64,
    /// All threads' writes per second in that pass.
    pub(crate) writes_per_s: f64,
    /// CPU time of a writer thread per write in the same passes (median over the repeats):
    /// the cost of a write with the machine's availability taken out.
    pub(crate) cpu_ns_per_write: f64,
    /// The first pass: pages new to the cache, including the first touch of their memory
    /// (page faults, which dominate on a VM).
    pub(crate) ns_per_write_cold: f64,
    /// All threads' writes per second in the first pass.
    pub(crate) writes_per_s_cold: f64,
    /// Shared-counter reads per throttle check.
    pub(crate) global_counter_reads_per_check: f64,
    /// Throttle checks made.
    pub(crate) throttle_checks: u64,
    /// Checks that throttled (should be 0: the run stays under the freerun point).
    pub(crate) throttled_calls: u64,
}

/// What [`write_path`] measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct WritePathResult {
    /// One entry per thread count.
    pub(crate) runs: Vec<WritePathRun>,
    /// The first run's figures, under the contract's names.
    pub(crate) ns_per_write: f64,
    /// All threads' writes per second in the first run.
    pub(crate) writes_per_s: f64,
    /// Shared-counter reads per throttle check in the first run.
    pub(crate) global_counter_reads_per_check: f64,
    /// Writes per second with 2 threads over 1 thread, when both were measured: the median of
    /// the repeats' ratios (each repeat measures 1 and 2 threads back to back).
    pub(crate) scaling_1_to_2: Option<f64>,
    /// Every repeat's ratio, sorted.
    pub(crate) scaling_1_to_2_pairs: Vec<f64>,
    /// CPU time per write with 2 threads over 1 thread (median of the repeats' ratios): 1.0
    /// when a write costs a thread the same CPU with another writer beside it, whatever share
    /// of the machine the threads got.
    pub(crate) cpu_cost_2_over_1: Option<f64>,
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
        .map_err(config_error)?
        .backend("mem", Arc::new(MemBackend::new()))
        .build()?;
    let files: Vec<ebb_runtime::File> =
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
pub(crate) fn write_path(opts: &WritePathOptions) -> io::Result<WritePathResult> {
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
