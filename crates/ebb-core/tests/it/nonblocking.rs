//! Non-blocking writers: a writer that comes back before the end of its sleep (an event loop
//! polling `try_write_at`) and continues only once `Writer::paused_until` has passed is
//! throttled exactly as one that slept.

use ebb_core::*;

use crate::harness::{Harness, config, secs};

const PAGES_PER_SEC: u64 = 25_600; // 100 MiB/s

/// Two writers on a fast and a slow backend, with every policy: the run where each writer also
/// comes back halfway through every sleep, finds the pause it owes in `paused_until` and waits
/// on, gives the same sleeps (writer, start, end), the same stalls and the same action
/// sequence as the run where writers sleep.
#[test]
fn early_continues_change_no_pause() {
    for policy in [ThrottlePolicy::Ioless, ThrottlePolicy::Bandwidth2010, ThrottlePolicy::Legacy] {
        let run = |poll_early: bool| {
            let mut c = config(256, policy);
            c.backends.push(BackendConfig::new("usb"));
            let mut h = Harness::new(c, &[PAGES_PER_SEC, 2_000]);
            h.poll_early = poll_early;
            h.add_dd(0, 1 << 17, 256, Instant::ZERO);
            h.add_dd(1, 1 << 14, 64, secs(1));
            h.run_until(secs(30));
            let stalls: Vec<_> = h.dds.iter().map(|d| d.stalls.clone()).collect();
            (h.sleeps.clone(), stalls, h.hash(), h.actions)
        };
        let (blocking, polling) = (run(false), run(true));
        assert!(blocking.0.len() > 100, "{policy:?}: only {} sleeps", blocking.0.len());
        assert_eq!(blocking.0, polling.0, "{policy:?}: sleeps differ");
        assert_eq!(blocking.1, polling.1, "{policy:?}: stalls differ");
        assert_eq!((blocking.2, blocking.3), (polling.2, polling.3), "{policy:?}: actions differ");
    }
}
