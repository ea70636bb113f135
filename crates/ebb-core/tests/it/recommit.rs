//! Owed commits through the engine's boundary: a close that failed on a flush-on-close
//! backend (S3, NFS) leaves the file owed a commit, shown in the backend's stats and the
//! file's error state, asked for ([`Action::SyncFile`]) once the file is written back, tried
//! again with backoff when the driver reports it failed, and cleared by a sync.

use ebb_core::event::errno::{ECONNREFUSED, EIO};
use ebb_core::*;

use crate::harness::config;
use crate::requests::{dirty_pages_with, ms};

/// Feeds the timers up to `t`, then carries out the engine's actions at `t`: its writes
/// answered with `writes`, the rest returned.
fn step(
    engine: &mut Engine,
    maps: &mut MapStore,
    t: Instant,
    writes: Result<Stability, IoError>,
) -> Vec<Action> {
    while let Some(at) = engine.poll_timeout().filter(|&at| at <= t) {
        engine.handle(at, Event::Timer, maps);
        if engine.poll_timeout() == Some(at) {
            break;
        }
    }
    engine.handle(t, Event::Timer, maps);
    let mut others = Vec::new();
    while let Some(action) = engine.poll_action() {
        match action {
            Action::Write { io, .. } => {
                engine.handle(t, Event::WriteDone { io, result: writes }, maps)
            }
            other => others.push(other),
        }
    }
    others
}

fn syncs(actions: &[Action]) -> usize {
    actions.iter().filter(|a| matches!(a, Action::SyncFile { .. })).count()
}

/// The whole rule through the engine (a test of each clause is in `recommit.rs`).
#[test]
fn a_file_whose_close_failed_is_committed_once_written_back_with_backoff_until_it_succeeds() {
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].flush_on_close = true;
    cfg.backends[0].retry_timeout_secs = 2;
    let (mut engine, mut maps, inode, _w) = dirty_pages_with(cfg, 8);
    let down = Err(IoError { errno: ECONNREFUSED });
    let up = Ok(Stability::Stable);
    let owed = |e: &mut Engine, m: &mut MapStore| {
        (e.bdi_stats(BackendId(0)).commits_owed, e.file_errors(inode, m).unwrap().commit_owed)
    };
    assert_eq!(owed(&mut engine, &mut maps), (0, false));
    engine.handle(ms(1), Event::Close { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    // The server is away past the deadline: the close fails, the data stays.
    let mut t = ms(1);
    let mut seen = Vec::new();
    while !seen.iter().any(|a| matches!(a, Action::CloseDone { .. })) {
        assert!(t < ms(5_000), "close not answered by the deadline");
        t += Duration::from_millis(100);
        seen.extend(step(&mut engine, &mut maps, t, down));
    }
    let done = seen.iter().find(|a| matches!(a, Action::CloseDone { .. }));
    assert!(
        matches!(done, Some(Action::CloseDone { result: Err(IoError { errno: EIO }), .. })),
        "{seen:?}"
    );
    assert_eq!(owed(&mut engine, &mut maps), (1, true), "owed, and shown");
    // Still away: no commit of a file with unwritten data.
    let mut during = Vec::new();
    for _ in 0..30 {
        t += Duration::from_millis(100);
        during.extend(step(&mut engine, &mut maps, t, down));
    }
    assert_eq!(syncs(&during), 0, "a commit asked for while the data is unwritten: {during:?}");
    assert_eq!(engine.file_errors(inode, &mut maps).unwrap().dirty_pages, 8);
    // Back: the retries write the data, then the commit is asked for, once.
    let mut asked = Vec::new();
    while syncs(&asked) == 0 {
        assert!(t < ms(20_000), "no commit asked for after the server came back");
        t += Duration::from_millis(100);
        asked.extend(step(&mut engine, &mut maps, t, up));
    }
    assert_eq!(engine.file_errors(inode, &mut maps).unwrap().dirty_pages, 0);
    assert_eq!(asked.last(), Some(&Action::SyncFile { backend: BackendId(0), inode }), "{asked:?}");
    for _ in 0..50 {
        t += Duration::from_millis(100);
        assert_eq!(syncs(&step(&mut engine, &mut maps, t, up)), 0, "asked twice while it runs");
    }
    // The commit fails twice: asked again 1 s, then 2 s later.
    let mut gaps = Vec::new();
    for _ in 0..2 {
        let failed_at = t;
        let error = IoError { errno: ECONNREFUSED };
        engine.handle(t, Event::FileSyncFailed { inode, error }, &mut maps);
        loop {
            t += Duration::from_millis(100);
            if syncs(&step(&mut engine, &mut maps, t, up)) > 0 {
                break;
            }
            assert!(t < failed_at + Duration::from_secs(10), "not asked again");
        }
        gaps.push(t.saturating_since(failed_at).as_millis());
    }
    assert_eq!(gaps, vec![1_000, 2_000], "backoff after failed commits");
    assert_eq!(owed(&mut engine, &mut maps), (1, true));
    // It succeeds: the debt is paid and nothing more is asked.
    let mark = engine.durable_mark(inode);
    engine.handle(t, Event::FileSynced { inode, mark }, &mut maps);
    assert_eq!(owed(&mut engine, &mut maps), (0, false));
    assert_eq!(engine.stats().owed_commits, 3);
    assert_eq!(engine.stats().file_sync_failures, 2);
    for _ in 0..100 {
        t += Duration::from_millis(100);
        assert_eq!(syncs(&step(&mut engine, &mut maps, t, up)), 0);
    }
}

/// A backend without `flush_on_close` (a local directory): a failed close or sync owes
/// nothing (its fsync is the only commit, and the application was told).
#[test]
fn a_failed_sync_on_a_backend_that_does_not_flush_at_close_owes_nothing() {
    let cfg = config(64, ThrottlePolicy::Ioless);
    let (mut engine, mut maps, inode, _w) = dirty_pages_with(cfg, 8);
    let error = IoError { errno: EIO };
    engine.handle(ms(1), Event::FileSyncFailed { inode, error }, &mut maps);
    assert_eq!(engine.bdi_stats(BackendId(0)).commits_owed, 0);
    assert!(!engine.file_errors(inode, &mut maps).unwrap().commit_owed);
}

/// A failed backend sync after a close that succeeded (S3: the pages were uploaded, the
/// CompleteMultipartUpload failed) owes the commit too; a file deleted meanwhile owes
/// nothing.
#[test]
fn a_failed_backend_sync_owes_a_commit_and_a_deleted_file_owes_none() {
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].flush_on_close = true;
    let (mut engine, mut maps, inode, _w) = dirty_pages_with(cfg, 8);
    engine.handle(ms(1), Event::Close { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let answers = step(&mut engine, &mut maps, ms(2), Ok(Stability::Stable));
    assert!(answers.contains(&Action::CloseDone { request: RequestId(1), result: Ok(()) }));
    let error = IoError { errno: EIO };
    engine.handle(ms(3), Event::FileSyncFailed { inode, error }, &mut maps);
    assert_eq!(engine.bdi_stats(BackendId(0)).commits_owed, 1);
    let asked = step(&mut engine, &mut maps, ms(1_003), Ok(Stability::Stable));
    assert_eq!(syncs(&asked), 1, "{asked:?}");
    engine.handle(ms(1_004), Event::FileSyncFailed { inode, error }, &mut maps);
    engine.handle(ms(1_005), Event::Truncate { inode, first_page: 0 }, &mut maps);
    assert_eq!(engine.bdi_stats(BackendId(0)).commits_owed, 0, "deleted: nothing owed");
    assert_eq!(syncs(&step(&mut engine, &mut maps, ms(60_000), Ok(Stability::Stable))), 0);
}
