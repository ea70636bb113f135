//! Control dynamics: the published before/after directions on a fixed-rate device.

use ebb_core::*;

use crate::harness::*;

const PAGES_PER_SEC: u64 = 15_000; // ~60 MB/s, the 2010 SATA disk

/// IO-less throttling: one dd settles into steady pauses (stddev at most 25% of the mean),
/// never does writeback itself, and keeps the device busy.
#[test]
fn ioless_single_dd_pauses_are_steady() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 2 << 18, 256, Instant::ZERO); // 2 GiB
    h.run();
    let stalls = h.stalls_ms(0, 20.0, 1e9);
    assert!(stalls.len() > 100, "{} throttled calls", stalls.len());
    let (mean, sd) = mean_stddev(&stalls);
    assert!(sd <= 0.25 * mean, "pause mean {mean:.2} ms stddev {sd:.2} ms");
    assert_eq!(h.engine.stats().writer_writeback_pages, 0);
    let done = h.dds[0].done_at.unwrap().as_secs_f64();
    let ideal = (2u64 << 18) as f64 / PAGES_PER_SEC as f64;
    assert!(done < ideal * 1.05, "dd took {done:.1}s, device needs {ideal:.1}s");
}

/// One dd's ratelimit settles at the device's rate. Write completions do not take the 200 ms
/// bandwidth stamp while the file still has writes in flight (the kernel updates from the
/// completion side only 200 ms after an inode's writeback ends), so the throttled dd's checks
/// get their turns at the ratelimit update.
#[test]
fn ioless_single_dd_ratelimit_tracks_the_device() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 1 << 20, 256, Instant::ZERO); // 4 GiB
    // Measured: 15378 and 15263 pages/s at 40 and 50 s; with a bandwidth-only update at any
    // completion once 200 ms had passed, 16153 and 15875 (5.8-7.7% above the device).
    let mut seen = Vec::new();
    for s in [40, 50] {
        h.run_until(secs(s));
        seen.push(h.engine.bdi_stats(BackendId(0)).dirty_ratelimit);
    }
    for r in &seen {
        assert!(r.abs_diff(PAGES_PER_SEC) <= PAGES_PER_SEC / 20, "ratelimit {seen:?} pages/s");
    }
}

/// The estimate counts a file's last writes: 200 ms after its writeback ends, the bandwidth
/// is updated once more, with no writer or flusher pass to do it.
#[test]
fn bandwidth_updates_after_writeback_ends() {
    let mut h = Harness::new(config(64, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 1 << 14, 256, Instant::ZERO); // 64 MiB; the rest is written when it expires
    let step = Duration::from_millis(50);
    let mut now = Instant::ZERO;
    // Step until everything is written back.
    loop {
        now += step;
        h.run_until(now);
        let b = h.engine.bdi_stats(BackendId(0));
        if h.dds[0].done_at.is_some() && b.dirty == 0 && b.writeback == 0 {
            break;
        }
        assert!(now < secs(120), "still writing at {now}");
    }
    let before = h.engine.bdi_stats(BackendId(0)).write_bandwidth;
    h.run_until(now + Duration::from_millis(300));
    let after = h.engine.bdi_stats(BackendId(0)).write_bandwidth;
    assert_ne!(before, after, "no bandwidth update after the last write ({before} pages/s)");
    assert!(h.engine.poll_timeout().is_none(), "{:?}", h.engine.poll_timeout());
}

/// Dirty pages never exceed the hard limit by more than the writers' batches.
#[test]
fn ioless_dirty_stays_under_the_limit() {
    let mut h = Harness::new(config(512, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    for i in 0..4 {
        h.add_dd(0, 1 << 17, 256, secs(i));
    }
    h.check_every = 97;
    h.run();
    let slack = 4 * 256 + 8 * 32;
    assert!(h.max_dirty <= h.max_limit + slack, "dirty {} limit {}", h.max_dirty, h.max_limit);
}

/// Two equal writers converge to equal rates (the 2010 posting's figures 4-5).
#[test]
fn ioless_two_writers_converge_to_equal_rates() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 1 << 20, 256, Instant::ZERO);
    h.add_dd(0, 1 << 20, 256, secs(10));
    h.run_until(secs(60));
    let (a, b) = (h.rate(0, 30.0, 60.0), h.rate(1, 30.0, 60.0));
    let ratio = a.max(b) / a.min(b);
    assert!(ratio <= 1.1, "rates {a:.0} and {b:.0} pages/s");
    let bdi = h.engine.bdi_stats(BackendId(0));
    assert!(
        bdi.dirty_ratelimit.abs_diff(PAGES_PER_SEC / 2) < PAGES_PER_SEC / 5,
        "dirty_ratelimit {} pages/s",
        bdi.dirty_ratelimit
    );
}

/// Legacy throttling makes the writer do writeback itself, and its stalls spread widely.
#[test]
fn legacy_writer_does_writeback_and_stalls_vary() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Legacy), &[PAGES_PER_SEC]);
    h.add_dd(0, 1 << 19, 256, Instant::ZERO);
    h.run();
    assert!(h.engine.stats().writer_writeback_pages > 0);
    let stalls = h.stalls_ms(0, 15.0, 1e9);
    let max = stalls.iter().cloned().fold(0.0, f64::max);
    let min = stalls.iter().cloned().fold(f64::MAX, f64::min);
    assert!(min < 1.0 && max > 50.0, "legacy stalls from {min} to {max} ms");
}

/// The 2010 bandwidth policy pauses without writer writeback.
#[test]
fn bandwidth_2010_pauses_without_writer_io() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Bandwidth2010), &[PAGES_PER_SEC]);
    h.add_dd(0, 1 << 19, 256, Instant::ZERO);
    h.run();
    assert_eq!(h.engine.stats().writer_writeback_pages, 0);
    assert!(h.dds[0].stalls.iter().any(|(_, d)| *d > Duration::ZERO));
}

/// Same inputs, same actions: a hash of the action sequence is identical across runs.
#[test]
fn same_inputs_same_actions() {
    let run = || {
        let mut c = config(512, ThrottlePolicy::Ioless);
        c.backends.push(BackendConfig::new("usb"));
        let mut h = Harness::new(c, &[PAGES_PER_SEC, 4_000]);
        h.add_dd(0, 1 << 18, 256, Instant::ZERO);
        h.add_dd(1, 1 << 15, 64, secs(1));
        h.run();
        (h.hash(), h.actions)
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b);
    assert!(a.1 > 1000);
}

/// Reclaim that never writes: with `flusher-only`, direct reclaim writes no page even when
/// writers stream several times the memory. Dirty pages reach the LRU tail when dirty memory is
/// most of memory and files age unevenly (two writers, limits at 90% / 80%): `legacy` reclaim
/// meets them too, and keeps each for another trip because its write referenced it; here the
/// flusher cleans them before they come round again, so legacy writes none itself (the second
/// trip's single-page writes: `reclaim::legacy_reclaim_writes_dirty_pages_on_their_second_trip`).
#[test]
fn reclaim_policies_differ_in_who_writes() {
    let run = |policy: ReclaimPolicy| {
        // Each reclaim policy with the throttling of its era (before v3.2: legacy).
        let throttle = if policy == ReclaimPolicy::Legacy {
            ThrottlePolicy::Legacy
        } else {
            ThrottlePolicy::Ioless
        };
        let mut c = config(32, throttle);
        c.reclaim = policy;
        c.dirty_ratio = 90;
        c.dirty_background_ratio = 80;
        let mut h = Harness::new(c, &[2_000]);
        h.add_dd(0, 20_000, 256, Instant::ZERO);
        h.add_dd(0, 20_000, 256, Instant::ZERO);
        h.check_every = 51;
        h.run();
        assert!(h.dds.iter().all(|d| d.done_at.is_some()), "{policy:?}: the writers finished");
        h.engine.stats().clone()
    };
    let new = run(ReclaimPolicy::FlusherOnly);
    assert_eq!(new.direct_written, 0);
    assert!(new.kswapd_reclaimed + new.direct_reclaimed > 0);
    let old = run(ReclaimPolicy::Legacy);
    assert!(old.reclaim_kept_referenced > 0, "legacy met dirty pages at the tail: {old:?}");
}

/// Two-phase backend (the 2020 NFS posting's direction): while unstable pages count as
/// reclaimable (`legacy-2020`), writers' throttle checks keep waking the flusher and each
/// wakeup's pass makes a call for the few pages dirtied since and an empty one, committing per
/// call; counted with writeback (`fixed`), the flusher runs only when dirty pages alone pass
/// the background threshold and takes large batches (`rfc-2020`, the posted form, likewise).
/// Everything ends committed either way.
#[test]
fn unstable_accounting_sets_writepages_batching() {
    let run = |accounting: UnstableAccounting| {
        let mut c = config(512, ThrottlePolicy::Ioless);
        c.unstable_accounting = accounting;
        c.backends[0].queue_depth = 65_536; // no request queue, as an NFS client
        c.backends[0].max_write_pages = 256;
        let mut h = Harness::new(c, &[25_000]);
        h.unstable_backend = Some(1);
        h.check_every = 101;
        h.add_dd(0, 1 << 17, 256, Instant::ZERO); // 512 MiB, four times the dirty limit
        h.run();
        let inode = h.dds[0].inode;
        h.request(Event::Fsync { handle: HandleId(1), request: RequestId(9) });
        h.run();
        assert_eq!(h.done_requests.get(&RequestId(9)), Some(&Ok(())), "{accounting:?}");
        let c = h.maps.get(inode).unwrap().counts();
        assert_eq!((c.dirty, c.writeback, c.unstable), (0, 0, 0), "{accounting:?}");
        let s = h.engine.stats().clone();
        (s.writepages_calls, s.writepages_pages / s.writepages_calls.max(1), s.commits)
    };
    let (legacy_calls, legacy_per_call, legacy_commits) = run(UnstableAccounting::Legacy2020);
    let (fixed_calls, fixed_per_call, fixed_commits) = run(UnstableAccounting::Fixed);
    // The posted RFC: the throttle no longer wakes the flusher for unstable pages, so it
    // batches as the merged form does, though its background passes still count them.
    let (rfc_calls, rfc_per_call, rfc_commits) = run(UnstableAccounting::Rfc2020);
    let detail = format!(
        "legacy-2020 {legacy_calls} calls of {legacy_per_call} pages, {legacy_commits} commits; \
         rfc-2020 {rfc_calls} calls of {rfc_per_call} pages, {rfc_commits} commits; \
         fixed {fixed_calls} calls of {fixed_per_call} pages, {fixed_commits} commits"
    );
    assert!(legacy_calls >= 5 * fixed_calls, "{detail}");
    assert!(fixed_per_call >= 5 * legacy_per_call, "{detail}");
    assert!(legacy_commits > fixed_commits, "{detail}");
    assert!(legacy_calls >= 5 * rfc_calls, "{detail}");
    assert!(rfc_per_call >= 5 * legacy_per_call, "{detail}");
    assert!(legacy_commits > rfc_commits, "{detail}");
}

/// `commit_batch_ratio` (ebb's own): a streaming writer's COMMITs wait until the file's
/// unstable pages reach a share of the backend's threshold instead of following each
/// writepages call, so there are several times fewer; the writer still finishes (unstable
/// pages count against the limit, and a throttled writer's file, with no write in flight,
/// commits), and a file left without an fsync ends committed all the same.
#[test]
fn commit_batch_ratio_batches_commits_and_commits_an_idle_file() {
    let run = |ratio: u32| {
        let mut c = config(512, ThrottlePolicy::Ioless);
        c.backends[0].queue_depth = 65_536; // no request queue, as an NFS client
        c.backends[0].max_write_pages = 256;
        c.backends[0].commit_batch_ratio = ratio;
        let mut h = Harness::new(c, &[25_000]);
        h.unstable_backend = Some(1);
        h.check_every = 101;
        h.add_dd(0, 1 << 17, 256, Instant::ZERO); // 512 MiB, four times the dirty limit
        h.run_until(secs(120));
        assert!(h.dds[0].done_at.is_some(), "ratio {ratio}: the writer finished");
        let c = h.maps.get(h.dds[0].inode).unwrap().counts();
        assert_eq!((c.dirty, c.writeback, c.unstable), (0, 0, 0), "ratio {ratio}: no fsync");
        let s = h.engine.stats().clone();
        (s.commits, s.commit_pages / s.commits.max(1), h.dds[0].done_at.unwrap())
    };
    let (per_call, per_call_pages, per_call_done) = run(0);
    let (batched, batched_pages, batched_done) = run(50);
    let detail = format!(
        "per call: {per_call} commits of {per_call_pages} pages, done at {per_call_done}; \
         batched: {batched} commits of {batched_pages} pages, done at {batched_done}"
    );
    assert!(batched * 2 <= per_call, "{detail}");
    assert!(batched_pages >= 2 * per_call_pages, "{detail}");
}
