//! One outage clock per backend: the requests callers wait on (`Engine::request_failed`,
//! `Engine::request_succeeded`) and the engine's write-back run the same clock.

use ebb_core::event::errno::{ECONNREFUSED, EIO};
use ebb_core::outage::Next;
use ebb_core::*;

use crate::harness::config;
use crate::requests::{dirty_pages_with, ms};

const REFUSED: IoError = IoError { errno: ECONNREFUSED };

/// Fires the timers up to `t` and answers every write with `result`; returns the fsync
/// answers.
fn run(engine: &mut Engine, maps: &mut MapStore, t: Instant) -> Vec<Action> {
    while let Some(at) = engine.poll_timeout().filter(|&at| at <= t) {
        engine.handle(at, Event::Timer, maps);
        if engine.poll_timeout() == Some(at) {
            break;
        }
    }
    engine.handle(t, Event::Timer, maps);
    let mut answers = Vec::new();
    while let Some(action) = engine.poll_action() {
        match action {
            Action::Write { io, .. } => {
                engine.handle(t, Event::WriteDone { io, result: Err(REFUSED) }, maps)
            }
            Action::FsyncDone { .. } => answers.push(action),
            _ => {}
        }
    }
    answers
}

/// A lookup fails at 0.1 s and the server stays away: an fsync begun at 1.5 s gets EIO at the
/// backend's deadline counted from the lookup's failure (2.1 s), not from its own writes'
/// (3.5 s): the backend has one notion of "down since".
#[test]
fn a_failed_request_starts_the_outage_for_write_back_too() {
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].retry_timeout_secs = 2;
    let (mut engine, mut maps, _inode, _w) = dirty_pages_with(cfg, 8);
    let b = BackendId(0);
    assert!(!engine.backend_down(b));
    let next = engine.request_failed(ms(100), b, REFUSED, ms(100), ms(100), 0);
    assert!(matches!(next, Next::Retry(_)), "{next:?}");
    assert!(engine.backend_down(b));
    engine.handle(
        ms(1_500),
        Event::Fsync { handle: HandleId(1), request: RequestId(1) },
        &mut maps,
    );
    let mut t = ms(1_500);
    let answer = loop {
        t += Duration::from_millis(50);
        assert!(t < ms(6_000), "fsync not answered");
        if let Some(answer) = run(&mut engine, &mut maps, t).pop() {
            break answer;
        }
    };
    assert_eq!(
        answer,
        Action::FsyncDone { request: RequestId(1), result: Err(IoError { errno: EIO }) }
    );
    assert!(t <= ms(2_200), "EIO at {t}, not at the deadline counted from the request's failure");
    assert_eq!(engine.stats().outage_timeouts, 1);
    // A request that gets an answer ends the outage for write-back too.
    engine.request_succeeded(t, b);
    assert!(!engine.backend_down(b));
    assert!(engine.poll_timeout().is_some_and(|at| at > t), "no deadline pending, retries only");
}

/// A write that succeeds ends the outage for requests: a request failing after it gets a full
/// deadline of its own, not EIO from the clock of before.
#[test]
fn a_successful_write_ends_the_outage_for_requests() {
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].retry_timeout_secs = 2;
    let (mut engine, mut maps, _inode, _w) = dirty_pages_with(cfg, 8);
    let b = BackendId(0);
    let _ = engine.request_failed(ms(100), b, REFUSED, ms(100), ms(100), 0);
    // Write-back meanwhile, answered by the server.
    engine.handle(ms(200), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    while let Some(action) = engine.poll_action() {
        if let Action::Write { io, .. } = action {
            let ok = Ok(Stability::Stable);
            engine.handle(ms(300), Event::WriteDone { io, result: ok }, &mut maps);
        }
    }
    assert!(!engine.backend_down(b));
    // 3 s after the first failure, past its deadline: a new failure starts a new outage.
    let next = engine.request_failed(ms(3_100), b, REFUSED, ms(3_100), ms(3_100), 0);
    assert!(matches!(next, Next::Retry(_)), "{next:?}");
}

/// An error the server gives is an answer: it ends the outage, for write-back too, as a success
/// does. The caller's signal (`EINTR`) says nothing of the server and leaves the clock running.
/// Before, only a success ended it: a lookup answered `ENOENT` left the clock of the outage
/// before, and the next refused call past its deadline got `EIO` at its first try.
#[test]
fn an_error_the_server_gives_ends_the_outage_and_eintr_does_not() {
    use ebb_core::event::errno::{EINTR, ENOENT};
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].retry_timeout_secs = 2;
    let (mut engine, _maps, _inode, _w) = dirty_pages_with(cfg, 8);
    let b = BackendId(0);
    let _ = engine.request_failed(ms(100), b, REFUSED, ms(100), ms(100), 0);
    let eintr = IoError { errno: EINTR };
    assert_eq!(engine.request_failed(ms(200), b, eintr, ms(200), ms(200), 0), Next::Fail(eintr));
    assert!(engine.backend_down(b), "EINTR ended the outage");
    let enoent = IoError { errno: ENOENT };
    let next = engine.request_failed(ms(300), b, enoent, ms(300), ms(300), 0);
    assert_eq!(next, Next::Fail(enoent));
    assert!(!engine.backend_down(b), "the server's ENOENT did not end the outage");
    // 3 s after the first failure, past its deadline: a new outage, waited through.
    let next = engine.request_failed(ms(3_100), b, REFUSED, ms(3_100), ms(3_100), 0);
    assert!(matches!(next, Next::Retry(_)), "{next:?}");
}

/// A write the server refuses for want of space (`ENOSPC`) is its answer: the outage a request
/// started is over for the requests too.
#[test]
fn a_write_the_server_refuses_ends_the_outage_for_requests() {
    use ebb_core::event::errno::ENOSPC;
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].retry_timeout_secs = 2;
    let (mut engine, mut maps, _inode, _w) = dirty_pages_with(cfg, 8);
    let b = BackendId(0);
    let _ = engine.request_failed(ms(100), b, REFUSED, ms(100), ms(100), 0);
    engine.handle(ms(200), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let mut writes = 0;
    while let Some(action) = engine.poll_action() {
        if let Action::Write { io, .. } = action {
            writes += 1;
            let full = Err(IoError { errno: ENOSPC });
            engine.handle(ms(300), Event::WriteDone { io, result: full }, &mut maps);
        }
    }
    assert!(writes > 0, "the fsync wrote nothing");
    assert!(!engine.backend_down(b), "the server's ENOSPC did not end the outage");
    let next = engine.request_failed(ms(3_100), b, REFUSED, ms(3_100), ms(3_100), 0);
    assert!(matches!(next, Next::Retry(_)), "{next:?}");
}

/// The fsync answers among the actions taken now.
fn fsync_answers(engine: &mut Engine) -> Vec<Action> {
    std::iter::from_fn(|| engine.poll_action())
        .filter(|action| matches!(action, Action::FsyncDone { .. }))
        .collect()
}

/// An fsync of the 8 dirty pages at 0.1 s on a backend with `retry_timeout_secs = 2` and a
/// per-try timeout of `try_timeout_ms` (`None`: a local device): the engine, the maps, the
/// file and the writes it issued (left in flight).
fn fsync_with_writes_in_flight(
    try_timeout_ms: Option<u64>,
) -> (Engine, MapStore, InodeId, Vec<IoId>) {
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].retry_timeout_secs = 2;
    cfg.backends[0].try_timeout_ms = try_timeout_ms;
    let (mut engine, mut maps, inode, _w) = dirty_pages_with(cfg, 8);
    engine.handle(ms(100), Event::Fsync { handle: HandleId(1), request: RequestId(1) }, &mut maps);
    let mut ios = Vec::new();
    while let Some(action) = engine.poll_action() {
        if let Action::Write { io, .. } = action {
            ios.push(io);
        }
    }
    assert!(!ios.is_empty(), "the fsync wrote nothing");
    (engine, maps, inode, ios)
}

/// The release swarm's seed 397 (`ebb swarm --seeds 1 --from 397 --policy bandwidth-2010`: a
/// USB stick, `retry_timeout_secs = 2`, writes refused with EROFS from 4.1 to 6.3 s): a write
/// in service on a slow local device for longer than the deadline is no outage, nor is the
/// mount's own EROFS meanwhile (no answer of a server, no failure of one either). The
/// reverted rule (44d9caf: every IO in flight an outage from its issue) answered the fsync
/// EIO at 2.1 s here and set the outage clock running, as it reported EIO at a close in the
/// swarm with no write of the file failed.
#[test]
fn a_slow_write_on_a_local_device_is_no_outage_however_long_it_is_in_flight() {
    let (mut engine, mut maps, inode, ios) = fsync_with_writes_in_flight(None);
    let b = BackendId(0);
    let erofs = IoError { errno: ebb_core::event::errno::EROFS };
    for t in [2_000, 2_100, 4_000, 4_100, 6_300] {
        if t == 4_100 {
            let next = engine.request_failed(ms(t), b, erofs, ms(t), ms(t), 0);
            assert_eq!(next, Next::Fail(erofs));
        }
        engine.handle(ms(t), Event::Timer, &mut maps);
        assert_eq!(fsync_answers(&mut engine), vec![], "answered at {t} ms, writes in service");
        assert!(!engine.backend_unreachable(ms(t), b), "unreachable at {t} ms");
    }
    assert!(!engine.backend_down(b), "an outage without a failure");
    assert_eq!(engine.stats().outage_timeouts, 0);
    assert_eq!(engine.file_errors(inode, &mut maps).unwrap().count, 0, "an error recorded");
    // The device answers at last: the fsync succeeds.
    let mut answers = Vec::new();
    for io in ios {
        engine.handle(ms(6_400), Event::WriteDone { io, result: Ok(Stability::Stable) }, &mut maps);
        answers.extend(fsync_answers(&mut engine));
    }
    assert_eq!(answers, vec![Action::FsyncDone { request: RequestId(1), result: Ok(()) }]);
}

/// On a network backend (NFS `timeo`, S3's per-read timeout: a per-try timeout of 5 s here)
/// a write in flight within its try's timeout is in service, even past the 2 s deadline; once
/// its try outlived the timeout it is evidence of an outage counted from its issue: EIO then.
#[test]
fn a_write_in_flight_counts_as_an_outage_only_once_its_try_timed_out() {
    let (mut engine, mut maps, _inode, _ios) = fsync_with_writes_in_flight(Some(5_000));
    let b = BackendId(0);
    engine.handle(ms(4_000), Event::Timer, &mut maps);
    assert_eq!(fsync_answers(&mut engine), vec![], "EIO within the try's timeout");
    assert!(!engine.backend_unreachable(ms(5_000), b));
    assert!(engine.poll_timeout().is_some_and(|at| at <= ms(5_100)), "no timer at the timeout");
    engine.handle(ms(5_100), Event::Timer, &mut maps);
    let eio = Err(IoError { errno: EIO });
    let answers = fsync_answers(&mut engine);
    assert_eq!(answers, vec![Action::FsyncDone { request: RequestId(1), result: eio }]);
    assert!(engine.backend_unreachable(ms(5_100), b));
}

/// A server that accepts and never answers fails nothing: the writes stay in flight. Once
/// their try outlived the per-try timeout (1 s) the outage counts from the first one's issue
/// (0.1 s): the fsync waiting for them gets EIO at the deadline (2.1 s), a new fsync and a
/// failing request get EIO at once, the data stays, and the writes' answer ends the outage.
/// Before, nothing started the clock: the fsync waited until the client's retries failed a
/// write.
#[test]
fn writes_unanswered_past_the_try_timeout_start_the_outage_at_their_issue() {
    let (mut engine, mut maps, inode, ios) = fsync_with_writes_in_flight(Some(1_000));
    let b = BackendId(0);
    assert!(engine.poll_timeout().is_some_and(|at| at <= ms(2_100)), "no timer by the deadline");
    engine.handle(ms(2_000), Event::Timer, &mut maps);
    assert_eq!(fsync_answers(&mut engine), vec![], "answered before the deadline");
    assert!(!engine.backend_unreachable(ms(2_050), b));
    engine.handle(ms(2_100), Event::Timer, &mut maps);
    let eio = Err(IoError { errno: EIO });
    let answers = fsync_answers(&mut engine);
    assert_eq!(answers, vec![Action::FsyncDone { request: RequestId(1), result: eio }]);
    assert!(engine.backend_unreachable(ms(2_100), b));
    engine.handle(
        ms(2_200),
        Event::Fsync { handle: HandleId(1), request: RequestId(2) },
        &mut maps,
    );
    let answers = fsync_answers(&mut engine);
    assert_eq!(answers, vec![Action::FsyncDone { request: RequestId(2), result: eio }]);
    let next = engine.request_failed(ms(2_300), b, REFUSED, ms(2_300), ms(2_300), 0);
    assert_eq!(next, Next::Fail(IoError { errno: EIO }));
    assert!(maps.with(inode, |m| m.counts().writeback) > 0, "the data was dropped");
    for io in ios {
        engine.handle(ms(2_400), Event::WriteDone { io, result: Ok(Stability::Stable) }, &mut maps);
    }
    assert!(!engine.backend_unreachable(ms(2_400), b));
    assert!(!engine.backend_down(b));
}

/// A request that succeeds while a write is in flight is an answer the clock keeps: the
/// driver is told to report it (`backend_down`), and the backend's silence counts from it,
/// not from the write's issue. Before, a success was reported only while the clock ran, and
/// the write, once past its try's timeout, counted from its issue: EIO at 2.1 s.
#[test]
fn a_request_answered_while_a_write_is_in_flight_moves_the_start_of_the_silence() {
    let (mut engine, mut maps, _inode, _ios) = fsync_with_writes_in_flight(Some(1_000));
    let b = BackendId(0);
    assert!(engine.backend_down(b), "a success now would not be reported");
    engine.request_succeeded(ms(1_500), b);
    engine.handle(ms(2_100), Event::Timer, &mut maps);
    assert_eq!(fsync_answers(&mut engine), vec![], "EIO counted from the write's issue");
    assert!(!engine.backend_unreachable(ms(3_400), b));
    engine.handle(ms(3_500), Event::Timer, &mut maps);
    assert_eq!(fsync_answers(&mut engine).len(), 1, "no EIO 2 s after the last answer");
}

/// A request its driver sees waiting (`Engine::request_waiting`) past the per-try timeout
/// (0.5 s) starts the outage from its start, unless the backend answered since: the timer
/// fires EIO at its deadline. Within the timeout, or without one, it counts for nothing.
#[test]
fn a_request_that_waits_past_the_try_timeout_starts_the_outage_from_its_start() {
    let mut cfg = config(64, ThrottlePolicy::Ioless);
    cfg.backends[0].retry_timeout_secs = 2;
    cfg.backends[0].try_timeout_ms = Some(500);
    let (mut engine, _maps, _inode, _w) = dirty_pages_with(cfg.clone(), 8);
    let b = BackendId(0);
    engine.request_waiting(ms(500), b, ms(100));
    assert!(!engine.backend_down(b), "a request within its try's timeout counted");
    engine.request_waiting(ms(700), b, ms(100));
    assert!(engine.backend_down(b));
    assert!(!engine.backend_unreachable(ms(2_000), b));
    assert!(engine.backend_unreachable(ms(2_100), b));
    engine.request_succeeded(ms(2_200), b);
    assert!(!engine.backend_unreachable(ms(2_200), b));
    // Still waiting, but the backend answered at 2.2 s: silent only since then.
    engine.request_waiting(ms(2_300), b, ms(100));
    assert!(!engine.backend_unreachable(ms(4_100), b));
    assert!(engine.backend_unreachable(ms(4_200), b));
    // A backend without a per-try timeout: a request in service, however long.
    cfg.backends[0].try_timeout_ms = None;
    let (mut engine, _maps, _inode, _w) = dirty_pages_with(cfg, 8);
    engine.request_waiting(ms(60_000), b, ms(100));
    assert!(!engine.backend_down(b));
    assert!(!engine.backend_unreachable(ms(60_000), b));
}
