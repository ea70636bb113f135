//! Where the bandwidth estimate starts (`initial_write_bandwidth`), and what a start near a
//! fast device's speed must not break: the global dirty limit under `dirty_seconds`.

use ebb_core::INIT_BW;
use ebb_core::*;

use crate::harness::*;

/// 2 GB/s and 6 MB/s, in pages/s.
const FAST: u64 = 2_000_000_000 / PAGE_SIZE;
const SLOW: u64 = 6_000_000 / PAGE_SIZE;

/// A cache of `memory_mib` in front of a fast and a slow backend, both declaring their speed
/// and capped at `dirty_seconds`, their estimates starting as `initial` says.
fn two_backends(memory_mib: u64, dirty_seconds: u64, initial: &str) -> Config {
    let mut c = config(memory_mib, ThrottlePolicy::Ioless);
    let mut slow = c.backends[0].clone();
    slow.name = "slow".into();
    c.backends.push(slow);
    for (backend, pages_per_sec) in c.backends.iter_mut().zip([FAST, SLOW]) {
        backend.declared_write_bandwidth = Some(pages_per_sec * PAGE_SIZE);
        backend.dirty_seconds = dirty_seconds;
    }
    c.set_knob("initial_write_bandwidth", initial).unwrap();
    c
}

/// With `auto` every estimate starts at the declared speed; with `kernel`, or `auto` and no
/// declared speed, at the kernel's 100 MB/s.
#[test]
fn auto_starts_every_estimate_at_the_declared_speed() {
    let estimates = |engine: &Engine, b: u32| {
        let s = engine.bdi_stats(BackendId(b));
        [s.write_bandwidth, s.avg_write_bandwidth, s.dirty_ratelimit, s.balanced_dirty_ratelimit]
    };
    let auto = Engine::new(two_backends(1024, 0, "auto"), Instant::ZERO).unwrap();
    assert_eq!(estimates(&auto, 0), [FAST; 4]);
    assert_eq!(estimates(&auto, 1), [SLOW; 4]);
    let kernel = Engine::new(two_backends(1024, 0, "kernel"), Instant::ZERO).unwrap();
    assert_eq!(estimates(&kernel, 1), [INIT_BW; 4]);
    let mut undeclared = two_backends(1024, 0, "auto");
    undeclared.backends[1].declared_write_bandwidth = None;
    let undeclared = Engine::new(undeclared, Instant::ZERO).unwrap();
    assert_eq!(estimates(&undeclared, 1), [INIT_BW; 4]);
}

/// A fast backend's `dirty_seconds` cap (2 s of 2 GB/s, known from the start with `auto`) is
/// far above the global threshold: its writer still obeys the global limit. (Its own limits
/// used to be the cap itself, so below half of it the writer ran free: 3.5x the limit dirty
/// in the simulator's `seeded-bandwidth` experiment, 5x here.)
///
/// Not asserted: with the kernel's start both caps begin at 2 s of 100 MB/s, each near the
/// global threshold, and each writer obeys only its own below its freerun point (as under
/// `strict_limit`), so together they overshoot the global limit by ~5% here.
#[test]
fn a_fast_backends_seconds_cap_does_not_lift_the_global_limit() {
    let mut h = Harness::new(two_backends(1024, 2, "auto"), &[FAST, SLOW]);
    h.add_dd(0, 1 << 19, 256, Instant::ZERO); // 2 GiB
    h.add_dd(1, 1 << 14, 256, Instant::ZERO); // 64 MiB
    h.run_until(secs(5));
    let slack = 2 * 256 + 8 * 32;
    assert!(
        h.max_dirty <= h.max_limit + slack,
        "dirty {} pages against a limit of {}",
        h.max_dirty,
        h.max_limit
    );
}

/// A small cache in front of a fast device: the flusher's background passes end below the
/// threshold every few milliseconds, each ending the file's writeback and arming the delayed
/// bandwidth update, and starts a writepages call. The throttled writer still gets its
/// ratelimit update about every 200 ms: 9 of 9 here, 1 of 9 when those bandwidth-only updates
/// restarted the 200 ms interval under it.
#[test]
fn ratelimit_updates_while_files_end_their_writeback_often() {
    let mut c = config(64, ThrottlePolicy::Ioless);
    c.trace = true;
    let mut h = Harness::new(c, &[FAST / 2]);
    h.add_dd(0, 1 << 19, 256, Instant::ZERO); // 2 GiB, ~2 s at 1 GB/s
    h.run_until(secs(2));
    let trace = h.engine.drain_trace();
    let updates =
        trace.iter().filter(|(_, e)| matches!(e, TraceEvent::BdiDirtyRatelimit { .. })).count();
    let mut throttled =
        trace.iter().filter(|(_, e)| matches!(e, TraceEvent::BalanceDirtyPages { .. }));
    let (first, last) = (throttled.clone().next(), throttled.next_back());
    let span = match (first, last) {
        (Some((a, _)), Some((b, _))) => b.saturating_since(*a).as_secs_f64(),
        _ => 0.0,
    };
    assert!(span >= 1.0, "the writer was throttled for {span:.2} s only");
    let due = (span / 0.2) as usize;
    assert!(updates * 10 >= due * 7, "{updates} ratelimit updates in {span:.2} s ({due} due)");
}
