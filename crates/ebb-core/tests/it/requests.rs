//! fsync, sync, periodic writeback, reads, truncate and error reporting.

use ebb_core::*;

use crate::harness::*;

const PAGES_PER_SEC: u64 = 15_000;

/// fsync returns only after every page dirtied before it is clean on the device.
#[test]
fn fsync_makes_the_file_clean() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 10_000, 256, Instant::ZERO);
    h.run_until(secs(1));
    assert!(h.dds[0].done_at.is_some());
    let inode = h.dds[0].inode;
    assert!(h.maps.get(inode).unwrap().counts().dirty > 0, "nothing left for fsync to do");
    h.request(Event::Fsync { handle: HandleId(1), request: RequestId(7) });
    h.run_until(secs(5));
    assert_eq!(h.done_requests.get(&RequestId(7)), Some(&Ok(())));
    let c = h.maps.get(inode).unwrap().counts();
    assert_eq!((c.dirty, c.writeback), (0, 0));
}

/// sync finishes while a writer keeps dirtying the same file (livelock avoidance): it writes
/// only what was dirty when it started.
#[test]
fn sync_is_not_livelocked_by_a_writer() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 1 << 20, 256, Instant::ZERO); // 4 GiB: far longer than the sync
    h.run_until(secs(10));
    h.request(Event::Sync { request: RequestId(9) });
    h.run_until(secs(40));
    assert_eq!(h.done_requests.get(&RequestId(9)), Some(&Ok(())));
    assert!(h.dds[0].done_at.is_none(), "the writer was still writing");
}

/// Data below the background threshold is written by periodic writeback once it is older than
/// dirty_expire_centisecs (30 s), at a 5 s wakeup. A first file warms the backend up: with no
/// completions yet its share of the background threshold is zero (as in the kernel), so a cold
/// backend starts writing at once.
#[test]
fn periodic_writeback_expires_old_data() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 5_000, 256, Instant::ZERO);
    h.run_until(secs(1));
    h.request(Event::Fsync { handle: HandleId(1), request: RequestId(3) });
    h.run_until(secs(2));
    let b = h.add_dd(0, 1_000, 256, secs(2));
    h.run_until(secs(30));
    let inode = h.dds[b].inode;
    assert_eq!(h.maps.get(inode).unwrap().counts().dirty, 1_000, "written too early");
    h.run_until(secs(45));
    let c = h.maps.get(inode).unwrap().counts();
    assert_eq!((c.dirty, c.writeback), (0, 0), "not written by periodic writeback");
}

/// A read of uncached pages issues device reads and answers once the pages are resident; a
/// second read is served from the cache.
#[test]
fn reads_fill_the_cache() {
    let mut h = Harness::new(config(256, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.request(Event::Open { handle: HandleId(50), inode: InodeId(50), backend: BackendId(0) });
    h.request(Event::Read { inode: InodeId(50), first_page: 0, pages: 64, request: RequestId(1) });
    h.run_until(secs(1));
    assert_eq!(h.done_requests.get(&RequestId(1)), Some(&Ok(())));
    assert_eq!(h.maps.get(InodeId(50)).unwrap().counts().clean, 64);
    let reads = h.engine.stats().reads;
    h.request(Event::Read { inode: InodeId(50), first_page: 0, pages: 64, request: RequestId(2) });
    assert_eq!(h.done_requests.get(&RequestId(2)), Some(&Ok(())));
    assert_eq!(h.engine.stats().reads, reads);
}

/// A truncate while a read is in flight: the pages past the cut do not come back when the read
/// completes (they would hold bytes the truncate removed), and their frames are released.
#[test]
fn truncate_during_a_read_keeps_stale_pages_out() {
    let mut h = Harness::new(config(256, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.request(Event::Open { handle: HandleId(50), inode: InodeId(50), backend: BackendId(0) });
    h.request(Event::Read { inode: InodeId(50), first_page: 0, pages: 64, request: RequestId(1) });
    // The read is in flight now: cut the file at page 10.
    h.request(Event::Truncate { inode: InodeId(50), first_page: 10 });
    h.run_until(secs(1));
    assert_eq!(h.done_requests.get(&RequestId(1)), Some(&Ok(())));
    let map = h.maps.get(InodeId(50)).unwrap();
    assert_eq!(map.counts().clean, 10, "only pages before the cut are inserted");
    assert!(map.pages().all(|(i, _)| i < 10));
    let writers: Vec<&Writer> = Vec::new();
    h.engine.check_accounting(&h.maps, &writers).unwrap();
    assert_eq!(h.engine.meminfo().cached, 10, "the stale pages' frames went back to free memory");
}

/// Someone else changed the backend's file (found at an open): its clean pages leave the
/// cache, a read in flight installs none of the pages it brings (they may be from before the
/// change), the dirty pages stay (the cache's data wins), and accounting stays exact.
#[test]
fn a_backend_change_drops_clean_pages_and_keeps_dirty_ones() {
    let mut h = Harness::new(config(256, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    let inode = InodeId(50);
    h.request(Event::Open { handle: HandleId(50), inode, backend: BackendId(0) });
    h.request(Event::Read { inode, first_page: 0, pages: 16, request: RequestId(1) });
    h.run_until(secs(1));
    assert_eq!(h.maps.get(inode).unwrap().counts().clean, 16);
    let mut w = Writer::new(WriterId(1), GroupId(0));
    let mut pos = 0;
    while pos < 4 {
        pos += h.maps.with(inode, |m| write_pages(&mut w, inode, m, pos, 4 - pos)).consumed;
    }
    h.engine.flush_writer(h.now, &mut w, &mut h.maps);
    h.request(Event::Read { inode, first_page: 32, pages: 16, request: RequestId(2) });
    h.request(Event::BackendChanged { inode });
    h.run_until(secs(2));
    assert_eq!(h.done_requests.get(&RequestId(2)), Some(&Ok(())));
    let map = h.maps.get(inode).unwrap();
    assert_eq!(map.counts().dirty, 4, "the dirty pages stay");
    assert!(map.pages().all(|(i, _)| i < 4), "clean or stale pages left: {:?}", map.counts());
    h.engine.check_accounting(&h.maps, &[&w]).unwrap();
    assert_eq!(h.engine.meminfo().cached, 4, "the dropped pages' frames went back");
}

/// Truncate drops dirty pages from the counters at once and keeps accounting exact.
#[test]
fn truncate_drops_dirty_pages() {
    let mut h = Harness::new(config(1024, ThrottlePolicy::Ioless), &[PAGES_PER_SEC]);
    h.add_dd(0, 5_000, 256, Instant::ZERO);
    h.run_until(secs(1));
    let inode = h.dds[0].inode;
    h.request(Event::Truncate { inode, first_page: 0 });
    h.run();
    assert_eq!(h.maps.get(inode).unwrap().counts().resident, 0);
    let writers: Vec<&Writer> = h.dds.iter().map(|d| &d.w).collect();
    h.engine.check_accounting(&h.maps, &writers).unwrap();
    assert_eq!(h.engine.meminfo().dirty, 0);
}

/// A write error reaches every open handle exactly once (at its next fsync or close), the
/// failed pages stay dirty, and a later fsync writes them again and succeeds.
#[test]
fn write_errors_are_reported_once_per_handle_and_never_dropped() {
    let config = config(256, ThrottlePolicy::Ioless);
    let mut engine = Engine::new(config, Instant::ZERO).unwrap();
    let mut maps = MapStore::new();
    let inode = InodeId(1);
    let at = |ms| Instant::ZERO + Duration::from_millis(ms);
    for h in [1, 2] {
        engine.handle(
            at(0),
            Event::Open { handle: HandleId(h), inode, backend: BackendId(0) },
            &mut maps,
        );
    }
    let mut w = Writer::new(WriterId(1), GroupId(0));
    let mut pos = 0;
    while pos < 10 {
        let (consumed, v) = engine.writer_write(at(0), &mut w, inode, (pos, 10 - pos), &mut maps);
        pos += consumed;
        assert!(matches!(v, WriterNext::Done | WriterNext::Proceed { .. }), "{v:?}");
    }
    engine.flush_writer(at(0), &mut w, &mut maps);
    let writes = |engine: &mut Engine| {
        let mut ios = Vec::new();
        let mut answers = Vec::new();
        while let Some(a) = engine.poll_action() {
            match a {
                Action::Write { io, .. } => ios.push(io),
                other => answers.push(other),
            }
        }
        (ios, answers)
    };
    engine.handle(at(1), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let (ios, _) = writes(&mut engine);
    assert!(!ios.is_empty());
    for io in ios {
        engine.handle(
            at(2),
            Event::WriteDone { io, result: Err(IoError { errno: errno_eio() }) },
            &mut maps,
        );
    }
    let (_, answers) = writes(&mut engine);
    assert!(
        answers.contains(&Action::FsyncDone {
            request: RequestId(1),
            result: Err(IoError { errno: 5 })
        })
    );
    assert_eq!(maps.get(inode).unwrap().counts().dirty, 10, "failed pages stay dirty");
    assert_eq!(engine.inode_error(inode), Some(IoError { errno: 5 }));
    // The other handle sees the error once, at close.
    engine.handle(at(3), Event::Close { handle: HandleId(2), request: RequestId(2) }, &mut maps);
    let (_, answers) = writes(&mut engine);
    assert!(
        answers.contains(&Action::CloseDone {
            request: RequestId(2),
            result: Err(IoError { errno: 5 })
        })
    );
    // The first handle already saw it: its next fsync rewrites the pages and succeeds.
    engine.handle(at(4), Event::Fsync { handle: HandleId(1), request: RequestId(3) }, &mut maps);
    let (ios, _) = writes(&mut engine);
    assert!(!ios.is_empty(), "the pages are written again");
    for io in ios {
        engine.handle(at(5), Event::WriteDone { io, result: Ok(Stability::Stable) }, &mut maps);
    }
    let (_, answers) = writes(&mut engine);
    assert!(answers.contains(&Action::FsyncDone { request: RequestId(3), result: Ok(()) }));
    assert_eq!(maps.get(inode).unwrap().counts().clean, 10);
}

fn errno_eio() -> i32 {
    ebb_core::event::errno::EIO
}

pub(crate) fn ms(ms: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(ms)
}

/// An engine with file 1 open (handle 1) and its pages 0..8 dirty, the writer's batch folded in.
fn eight_dirty_pages() -> (Engine, MapStore, InodeId) {
    let (engine, maps, inode, _) = dirty_pages(8);
    (engine, maps, inode)
}

/// An engine with file 1 open (handle 1) and its pages 0..count dirty, the writer's batch
/// folded in; also the writer that dirtied them.
fn dirty_pages(count: u64) -> (Engine, MapStore, InodeId, Writer) {
    dirty_pages_with(config(256, ThrottlePolicy::Ioless), count)
}

/// [`dirty_pages`] with a configuration of the caller's.
pub(crate) fn dirty_pages_with(config: Config, count: u64) -> (Engine, MapStore, InodeId, Writer) {
    let mut engine = Engine::new(config, Instant::ZERO).unwrap();
    let mut maps = MapStore::new();
    let inode = InodeId(1);
    engine.handle(
        ms(0),
        Event::Open { handle: HandleId(1), inode, backend: BackendId(0) },
        &mut maps,
    );
    let mut w = Writer::new(WriterId(1), GroupId(0));
    let mut pos = 0;
    while pos < count {
        let (consumed, _) =
            engine.writer_write(ms(0), &mut w, inode, (pos, count - pos), &mut maps);
        pos += consumed;
    }
    engine.flush_writer(ms(0), &mut w, &mut maps);
    (engine, maps, inode, w)
}

/// Plays a two-phase server whose verifier is 1 for the first writes and 2 after a restart
/// just before the first COMMIT, until the engine has nothing left to ask; returns the answer
/// of the fsync or sync in progress and the COMMITs seen.
fn serve_with_a_restart_before_the_first_commit(
    engine: &mut Engine,
    maps: &mut MapStore,
) -> (Option<Result<(), IoError>>, u32) {
    let mut answer = None;
    let mut verifier = 1;
    let mut commits = 0;
    for step in 2..100 {
        let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        if actions.is_empty() {
            break;
        }
        for a in actions {
            match a {
                Action::Write { io, .. } => {
                    let result = Ok(Stability::Unstable { verifier });
                    engine.handle(ms(step), Event::WriteDone { io, result }, maps);
                }
                Action::Commit { io, .. } => {
                    commits += 1;
                    if commits == 1 {
                        verifier = 2;
                    }
                    engine.handle(ms(step), Event::CommitDone { io, result: Ok(verifier) }, maps);
                }
                Action::FsyncDone { result, .. } | Action::SyncDone { result, .. } => {
                    answer = Some(result)
                }
                _ => {}
            }
        }
    }
    (answer, commits)
}

/// On a two-phase backend, fsync answers only once a COMMIT with the write verifier made the
/// data durable: when the server restarted between the writes and the COMMIT (the verifier
/// changed), the pages are written and committed again first.
#[test]
fn fsync_rewrites_after_a_server_restart() {
    let (mut engine, mut maps, inode) = eight_dirty_pages();
    engine.handle(ms(1), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let (answer, commits) = serve_with_a_restart_before_the_first_commit(&mut engine, &mut maps);
    assert_eq!(answer, Some(Ok(())));
    assert_eq!(commits, 2, "a second commit after the rewrite");
    let c = maps.get(inode).unwrap().counts();
    assert_eq!((c.clean, c.dirty, c.unstable), (8, 0, 0));
}

/// Serves every write the engine asks for with `result` at `t`, until it asks for nothing
/// more; returns the writes served and the answers of fsyncs and closes seen.
fn serve_writes(
    engine: &mut Engine,
    maps: &mut MapStore,
    t: Instant,
    result: Result<ebb_core::Stability, IoError>,
) -> (usize, Vec<Action>) {
    let mut writes = 0;
    let mut answers = Vec::new();
    loop {
        let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        if actions.is_empty() {
            return (writes, answers);
        }
        for a in actions {
            match a {
                Action::Write { io, .. } => {
                    writes += 1;
                    engine.handle(t, Event::WriteDone { io, result }, maps);
                }
                Action::FsyncDone { .. } | Action::CloseDone { .. } => answers.push(a),
                _ => {}
            }
        }
    }
}

/// Moves time to `t`, firing the engine's timers on the way.
fn run_timers_until(engine: &mut Engine, maps: &mut MapStore, t: Instant) {
    while let Some(at) = engine.poll_timeout().filter(|&at| at <= t) {
        engine.handle(at, Event::Timer, maps);
        if engine.poll_timeout() == Some(at) {
            break;
        }
    }
    engine.handle(t, Event::Timer, maps);
}

/// An error that will not pass (ENOSPC) holds the failed pages: the file's error state, the
/// held pages per file, per backend and in total are queryable; background writeback leaves
/// them alone, but they are retried with backoff (1 s, doubling) so that freeing space on the
/// backend drains them; a truncate releases them and the counters stay exact.
#[test]
fn held_pages_are_retried_with_backoff_and_drain_once_the_backend_takes_them() {
    use ebb_core::event::errno::ENOSPC;
    let (mut engine, mut maps, inode, w) = dirty_pages(12);
    let before = engine.file_errors(inode, &mut maps).unwrap();
    assert_eq!(
        (before.error, before.count, before.held_pages, before.dirty_pages),
        (None, 0, 0, 12)
    );
    let enospc = Err(IoError { errno: ENOSPC });
    engine.handle(ms(1), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let (_, answers) = serve_writes(&mut engine, &mut maps, ms(2), enospc);
    assert!(
        matches!(answers[..], [Action::FsyncDone { result: Err(IoError { errno: ENOSPC }), .. }]),
        "the error reaches the user: {answers:?}"
    );
    let state = engine.file_errors(inode, &mut maps).unwrap();
    assert_eq!(state.error, Some(IoError { errno: ENOSPC }));
    assert!(!state.unseen, "fsync reported it");
    assert_eq!(state.retry_at, Some(ms(2) + Duration::from_secs(1)), "first retry after 1 s");
    assert_eq!((state.held_pages, state.dirty_pages), (12, 12), "nothing was dropped");
    assert_eq!((engine.meminfo().held, engine.meminfo().dirty), (12, 12));
    assert_eq!(engine.bdi_stats(BackendId(0)).held, 12);

    // The retry rewrites the held pages; still refused, they are held again, 2 s later next.
    run_timers_until(&mut engine, &mut maps, ms(1002));
    let (writes, _) = serve_writes(&mut engine, &mut maps, ms(1003), enospc);
    assert!(writes > 0, "held pages retried");
    let state = engine.file_errors(inode, &mut maps).unwrap();
    assert_eq!(state.held_pages, 12);
    assert_eq!(state.retry_at, Some(ms(1003) + Duration::from_secs(2)), "backoff doubles");
    assert!(engine.stats().held_retries >= 1);
    assert_eq!(state.count, 1, "a retry refused again is no new error");
    assert_eq!(engine.check_handle_error(HandleId(1)), Ok(()), "reported once, not per retry");
    // An fsync now tries the held pages itself and reports its own failure.
    engine.handle(ms(1004), Event::Fsync { handle: HandleId(1), request: RequestId(2) }, &mut maps);
    let (_, answers) = serve_writes(&mut engine, &mut maps, ms(1005), enospc);
    assert!(
        matches!(answers[..], [Action::FsyncDone { result: Err(IoError { errno: ENOSPC }), .. }]),
        "an fsync that could not write reports it: {answers:?}"
    );

    // Space was freed: the next retry writes everything.
    run_timers_until(&mut engine, &mut maps, ms(3003));
    let (writes, _) = serve_writes(&mut engine, &mut maps, ms(3004), Ok(Stability::Stable));
    assert!(writes > 0);
    let state = engine.file_errors(inode, &mut maps).unwrap();
    assert_eq!((state.held_pages, state.dirty_pages), (0, 0), "held pages drained");
    assert_eq!((engine.meminfo().held, engine.meminfo().dirty), (0, 0));
    engine.check_accounting(&maps, &[&w]).unwrap();
}

/// The user gives up on held data: a truncate releases the held pages, the counters stay
/// exact and the last error stays queryable.
#[test]
fn truncate_releases_held_pages() {
    use ebb_core::event::errno::ENOSPC;
    let (mut engine, mut maps, inode, w) = dirty_pages(12);
    engine.handle(ms(1), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    serve_writes(&mut engine, &mut maps, ms(2), Err(IoError { errno: ENOSPC }));
    assert_eq!(engine.file_errors(inode, &mut maps).unwrap().held_pages, 12);
    engine.handle(ms(3), Event::Truncate { inode, first_page: 0 }, &mut maps);
    let state = engine.file_errors(inode, &mut maps).unwrap();
    assert_eq!((state.held_pages, state.dirty_pages), (0, 0));
    assert_eq!(state.error, Some(IoError { errno: ENOSPC }), "the last error stays queryable");
    assert_eq!((engine.meminfo().held, engine.meminfo().dirty), (0, 0));
    engine.check_accounting(&maps, &[&w]).unwrap();
}

/// A backend that cannot be reached (connection refused) is retried without reporting
/// anything: fsync waits through the outage and answers Ok once the data is written.
#[test]
fn fsync_waits_through_an_outage_shorter_than_the_retry_timeout() {
    use ebb_core::event::errno::ECONNREFUSED;
    let (mut engine, mut maps, inode, w) = dirty_pages(12);
    engine.handle(ms(1), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let refused = Err(IoError { errno: ECONNREFUSED });
    let (_, answers) = serve_writes(&mut engine, &mut maps, ms(2), refused);
    assert!(answers.is_empty(), "fsync answered during the outage: {answers:?}");
    // Each retry fails again for ten seconds.
    let mut t = ms(2);
    while t < ms(10_000) {
        let at = engine.poll_timeout().expect("a retry is scheduled");
        run_timers_until(&mut engine, &mut maps, at);
        t = at + Duration::from_millis(1);
        let (_, answers) = serve_writes(&mut engine, &mut maps, t, refused);
        assert!(answers.is_empty(), "fsync answered during the outage: {answers:?}");
    }
    let state = engine.file_errors(inode, &mut maps).unwrap();
    assert_eq!((state.error, state.held_pages, state.dirty_pages), (None, 0, 12));
    // The server is back.
    let at = engine.poll_timeout().expect("a retry is scheduled");
    run_timers_until(&mut engine, &mut maps, at);
    let (_, answers) = serve_writes(&mut engine, &mut maps, at, Ok(Stability::Stable));
    assert!(
        matches!(answers[..], [Action::FsyncDone { result: Ok(()), .. }]),
        "fsync answers Ok once written: {answers:?}"
    );
    assert_eq!(engine.file_errors(inode, &mut maps).unwrap().dirty_pages, 0);
    assert!(engine.stats().outage_errors > 0);
    engine.check_accounting(&maps, &[&w]).unwrap();
}

/// Past the backend's `retry_timeout_secs` of failed writes, fsync gets EIO (once per handle),
/// the data stays cached, and it is written when the backend returns.
#[test]
fn an_outage_past_the_retry_timeout_reports_eio_and_keeps_the_data() {
    use ebb_core::event::errno::{EIO, ETIMEDOUT};
    let (mut engine, mut maps, inode, w) = dirty_pages(12);
    let timeout = engine.config().backends[0].retry_timeout_secs;
    assert_eq!(timeout, 60, "the default");
    engine.handle(ms(1), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let down = Err(IoError { errno: ETIMEDOUT });
    let mut answers = serve_writes(&mut engine, &mut maps, ms(2), down).1;
    let mut t = ms(2);
    while answers.is_empty() {
        let at = engine.poll_timeout().expect("a retry or the deadline is scheduled");
        assert!(at <= ms(61_000), "nothing answered by the deadline");
        run_timers_until(&mut engine, &mut maps, at);
        t = at;
        answers = serve_writes(&mut engine, &mut maps, t, down).1;
    }
    assert!(t >= ms(60_002), "answered before the timeout, at {t}");
    assert!(
        matches!(answers[..], [Action::FsyncDone { result: Err(IoError { errno: EIO }), .. }]),
        "EIO at the deadline: {answers:?}"
    );
    let state = engine.file_errors(inode, &mut maps).unwrap();
    assert_eq!(state.dirty_pages, 12, "the data is kept");
    // A second fsync on the same handle has seen the error: it waits no more, it reports what
    // is still unwritten only through new errors.
    engine.handle(t, Event::Fsync { handle: HandleId(1), request: RequestId(2) }, &mut maps);
    let answers = serve_writes(&mut engine, &mut maps, t, down).1;
    assert!(matches!(answers[..], [Action::FsyncDone { result: Err(_), .. }]), "{answers:?}");
    // The server is back: the next retry (the engine probes an unreachable backend at most
    // 2 s apart, also past the deadline) writes everything.
    let back = t;
    while engine.file_errors(inode, &mut maps).unwrap().dirty_pages > 0 {
        let at = engine.poll_timeout().expect("a retry is scheduled");
        assert!(at <= back + Duration::from_secs(3), "no retry within the outage probe interval");
        run_timers_until(&mut engine, &mut maps, at);
        serve_writes(&mut engine, &mut maps, at, Ok(Stability::Stable));
    }
    assert_eq!(engine.stats().outage_timeouts, 1);
    engine.check_accounting(&maps, &[&w]).unwrap();
}

/// With `flush_on_close` (network backends), close answers only after the file is written
/// back, with the error if it could not be.
#[test]
fn close_on_a_flush_on_close_backend_writes_the_file_first() {
    let mut cfg = config(256, ThrottlePolicy::Ioless);
    cfg.backends[0].flush_on_close = true;
    let (mut engine, mut maps, inode, _w) = dirty_pages_with(cfg, 8);
    engine.handle(ms(1), Event::Close { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let (writes, answers) = serve_writes(&mut engine, &mut maps, ms(2), Ok(Stability::Stable));
    assert_eq!(writes, 1, "close wrote the file");
    assert!(matches!(answers[..], [Action::CloseDone { result: Ok(()), .. }]), "{answers:?}");
    assert_eq!(maps.get(inode).unwrap().counts().dirty, 0);
}

/// sync(2) on a two-phase backend answers only once every page is durable: when the server
/// restarted before the COMMIT (the verifier changed), the redirtied pages are written and
/// committed again first.
#[test]
fn sync_rewrites_after_a_server_restart() {
    let (mut engine, mut maps, inode) = eight_dirty_pages();
    engine.handle(ms(1), Event::Sync { request: RequestId(1) }, &mut maps);
    let (answer, commits) = serve_with_a_restart_before_the_first_commit(&mut engine, &mut maps);
    let c = maps.get(inode).unwrap().counts();
    assert_eq!(answer, Some(Ok(())));
    assert_eq!((c.clean, c.dirty, c.unstable), (8, 0, 0), "sync answered with data not durable");
    assert_eq!(commits, 2, "a second commit after the rewrite");
}

/// A page written, written back and evicted while a read of it is in flight: the read's older
/// bytes must not come back as that page (the kernel's locked page prevents it).
#[test]
fn a_read_in_flight_does_not_resurrect_an_evicted_newer_page() {
    let mut engine = Engine::new(config(16, ThrottlePolicy::Ioless), Instant::ZERO).unwrap();
    let mut maps = MapStore::new();
    let inode = InodeId(1);
    let mut t = Instant::ZERO;
    let mut tick = || {
        t += Duration::from_millis(1);
        t
    };
    engine.handle(
        tick(),
        Event::Open { handle: HandleId(1), inode, backend: BackendId(0) },
        &mut maps,
    );
    engine.handle(
        tick(),
        Event::Read { inode, first_page: 0, pages: 8, request: RequestId(1) },
        &mut maps,
    );
    let mut reads = Vec::new();
    while let Some(a) = engine.poll_action() {
        if let Action::Read { io, .. } = a {
            reads.push(io);
        }
    }
    assert!(!reads.is_empty());
    // A writer dirties page 3 meanwhile; sync writes it back.
    let mut w = Writer::new(WriterId(1), GroupId(0));
    let _ = check(&mut engine, tick(), &mut w, inode, &mut maps);
    let (consumed, _) = engine.writer_write(tick(), &mut w, inode, (3, 1), &mut maps);
    assert_eq!(consumed, 1);
    engine.flush_writer(tick(), &mut w, &mut maps);
    engine.handle(tick(), Event::Sync { request: RequestId(2) }, &mut maps);
    let mut writes = Vec::new();
    while let Some(a) = engine.poll_action() {
        if let Action::Write { io, .. } = a {
            writes.push(io);
        }
    }
    assert_eq!(writes.len(), 1);
    engine.handle(
        tick(),
        Event::WriteDone { io: writes[0], result: Ok(Stability::Stable) },
        &mut maps,
    );
    assert_eq!(maps.get(inode).unwrap().page(3).unwrap().state, PageState::Clean);
    // Memory pressure evicts it.
    let total = engine.meminfo().total;
    engine.handle(tick(), Event::AnonAlloc { pages: total - 8 }, &mut maps);
    // kswapd reclaims in batches over time: let them run.
    for _ in 0..1000 {
        if maps.get(inode).unwrap().page(3).is_none() {
            break;
        }
        engine.handle(tick(), Event::Timer, &mut maps);
    }
    assert!(maps.get(inode).unwrap().page(3).is_none(), "page 3 was not evicted");
    engine.handle(tick(), Event::AnonFree { pages: total - 8 }, &mut maps);
    // Now the old read completes.
    for io in reads {
        engine.handle(tick(), Event::ReadDone { io, result: Ok(()) }, &mut maps);
    }
    assert!(
        maps.get(inode).unwrap().page(3).is_none(),
        "the read's stale bytes came back as page 3"
    );
    assert!(maps.get(inode).unwrap().page(2).is_some(), "the rest of the read is inserted");
    engine.check_accounting(&maps, &[&w]).unwrap();
}

/// A backend that refuses every write with ENOSPC while a writer keeps writing: once held
/// pages fill the cache, the writer's next throttle check fails with ENOSPC instead of waiting
/// for memory that no writeback can free; nothing is dropped.
#[test]
fn a_writer_fails_with_the_held_error_once_held_pages_fill_the_cache() {
    let mut cfg = config(16, ThrottlePolicy::Ioless);
    // Everything may be dirty: only memory stops the writer.
    cfg.dirty_ratio = 100;
    cfg.dirty_background_ratio = 1;
    writer_against_a_full_backend(cfg);
}

/// The same with the default dirty limits, where the throttle, not memory, stops the writer
/// first: new data after a held failure is written as usual (and held), so the writer is not
/// throttled forever at the bandwidth of a backend that refuses everything.
#[test]
fn a_writer_under_the_default_limits_fails_too_instead_of_being_throttled_forever() {
    writer_against_a_full_backend(config(16, ThrottlePolicy::Ioless));
}

/// A writer writes into a backend that refuses everything with ENOSPC: it must fail with
/// ENOSPC within a minute of virtual time, with every dirty page held and none dropped.
fn writer_against_a_full_backend(cfg: Config) {
    use ebb_core::event::errno::ENOSPC;
    let mut engine = Engine::new(cfg, Instant::ZERO).unwrap();
    let mut maps = MapStore::new();
    let inode = InodeId(1);
    engine.handle(
        ms(0),
        Event::Open { handle: HandleId(1), inode, backend: BackendId(0) },
        &mut maps,
    );
    let mut w = Writer::new(WriterId(1), GroupId(0));
    let enospc = Err(IoError { errno: ENOSPC });
    let (mut pos, mut t, mut failed) = (0u64, ms(0), None);
    for _ in 0..100_000 {
        let (consumed, mut v) = engine.writer_write(t, &mut w, inode, (pos, 64), &mut maps);
        pos += consumed;
        if v == WriterNext::Done {
            continue;
        }
        for _ in 0..1000 {
            serve_writes(&mut engine, &mut maps, t, enospc);
            match v {
                WriterNext::Done | WriterNext::Proceed { .. } => break,
                WriterNext::Fail { error } => {
                    failed = Some(error);
                    break;
                }
                WriterNext::Sleep { until } => t = until,
                WriterNext::Wait { .. } => t += Duration::from_millis(10),
            }
            run_timers_until(&mut engine, &mut maps, t);
            serve_writes(&mut engine, &mut maps, t, enospc);
            v = engine.writer_step(t, &mut w, WriterInput::Continue, &mut maps);
        }
        if failed.is_some() {
            break;
        }
    }
    assert_eq!(failed, Some(IoError { errno: ENOSPC }), "the writer never failed");
    assert!(t < ms(60_000), "it failed only after {t}");
    let memory = engine.meminfo();
    assert!(memory.held * 10 >= memory.total * 8, "held pages fill the cache: {memory:?}");
    assert_eq!(memory.held, memory.dirty, "every dirty page is held, none dropped");
    assert!(engine.stats().writes_failed >= 1);
}

/// A flush-on-close backend with write granules (S3) unreachable while the last handle
/// closes: close waits until `retry_timeout_secs`, then EIO; the data stays, and with no
/// handle open, no fsync and a cache far under its background threshold, it is written within
/// the outage probe interval of the backend's return. Two causes stopped the retries before:
/// they are reclaim-like works, which leave a young file's partly dirty last granule for
/// later, and they started at the writeback index the failed write left at the file's end,
/// so a pass found nothing, failed nothing and scheduled no next retry (until the file
/// expired, 30 s after it was last dirtied). Each fix alone leaves the test failing.
#[test]
fn data_of_a_closed_file_is_written_soon_after_an_outage_past_the_deadline() {
    held_data_is_written_soon_after_an_outage_past_the_deadline(true);
}

/// The same with the handle left open after an fsync that got EIO (ebb-fuse keeps a handle,
/// the anchor, after the last close).
#[test]
fn data_of_an_open_file_is_written_soon_after_an_outage_past_the_deadline() {
    held_data_is_written_soon_after_an_outage_past_the_deadline(false);
}

fn held_data_is_written_soon_after_an_outage_past_the_deadline(close: bool) {
    use ebb_core::event::errno::{ECONNREFUSED, EIO};
    // A 64 MiB mount over S3's default layout: 8 MiB parts, written one part at most per
    // write; the file, 4 MiB and a page, is one partly dirty last granule, which background
    // work leaves for later while the file is young.
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].flush_on_close = true;
    cfg.backends[0].retry_timeout_secs = 2;
    cfg.backends[0].write_granule_bytes = Some(2048 * ebb_core::PAGE_SIZE);
    cfg.backends[0].max_write_pages = 2048;
    let (mut engine, mut maps, inode, w) = dirty_pages_with(cfg, 1025);
    let request = RequestId(1);
    let event = if close {
        Event::Close { handle: HandleId(1), request }
    } else {
        Event::Fsync { handle: HandleId(1), request }
    };
    engine.handle(ms(1), event, &mut maps);
    let down = Err(IoError { errno: ECONNREFUSED });
    let mut answers = serve_writes(&mut engine, &mut maps, ms(2), down).1;
    let mut t = ms(2);
    while answers.is_empty() {
        let at = engine.poll_timeout().expect("a retry or the deadline is scheduled");
        assert!(at <= ms(3_000), "close not answered by the deadline");
        run_timers_until(&mut engine, &mut maps, at);
        t = at;
        answers = serve_writes(&mut engine, &mut maps, t, down).1;
    }
    assert!(
        matches!(
            answers[..],
            [Action::CloseDone { result: Err(IoError { errno: EIO }), .. }]
                | [Action::FsyncDone { result: Err(IoError { errno: EIO }), .. }]
        ),
        "EIO at the deadline: {answers:?}"
    );
    // The outage goes on a while past the deadline: the retries go on too, each writing the
    // file again (the failed write left its writeback index at the file's end).
    let mut retries = 0;
    while t < ms(8_000) {
        let at = engine.poll_timeout().expect("a retry is scheduled during the outage");
        assert!(at <= t + Duration::from_secs(3), "no retry within the probe interval");
        run_timers_until(&mut engine, &mut maps, at);
        t = at + Duration::from_millis(1);
        retries += serve_writes(&mut engine, &mut maps, t, down).0;
    }
    assert!(retries >= 3, "{retries} writes retried in 6 s of outage past the deadline");
    assert_eq!(engine.file_errors(inode, &mut maps).unwrap().dirty_pages, 1025, "the data is kept");
    let back = t;
    while engine.file_errors(inode, &mut maps).unwrap().dirty_pages > 0 {
        let at = engine.poll_timeout().expect("a retry is scheduled");
        assert!(at <= back + Duration::from_secs(3), "no retry within the probe interval");
        run_timers_until(&mut engine, &mut maps, at);
        serve_writes(&mut engine, &mut maps, at, Ok(Stability::Stable));
    }
    engine.check_accounting(&maps, &[&w]).unwrap();
}
