//! Non-blocking writes: `try_write_at` returns at once with the pause the throttle decided,
//! and `write_at_async` waits it out without a thread; both leave the data as `write_at` does.

use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use ebb_backend::{Backend, FaultOp, FaultyBackend, MemBackend, OpenOptions};
use ebb_runtime::{Builder, Ebb, TryWrite};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };
const TOTAL: usize = 48 << 20;
/// The engine's longest pause (MAX_PAUSE, 200 ms) and some scheduling slack.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// A cache of 16 MiB in front of a backend whose writes take 10 ms each, so a writer of
/// 48 MiB is throttled.
fn slow_cache() -> Ebb {
    let faulty = Arc::new(FaultyBackend::new(MemBackend::new()));
    faulty.plan().delay(FaultOp::Write, Duration::from_millis(10));
    let backend: Arc<dyn Backend> = faulty;
    Builder::new().memory(16 << 20).backend("slow", backend).build().unwrap()
}

fn data() -> Vec<u8> {
    (0..TOTAL).map(|i| (i % 251) as u8).collect()
}

fn read_back(ebb: &Ebb) -> Vec<u8> {
    let f = ebb.open("f", CREATE).unwrap();
    let mut back = vec![0u8; TOTAL];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), TOTAL);
    back
}

// A throttled writer polling `try_write_at`: it is told to wait (never longer than the
// engine's longest pause), asking again before the pause ends is told to wait on for no
// longer and records no new pause, and every byte arrives, through fsync, as written.
#[test]
fn try_write_at_returns_the_pause_instead_of_sleeping() {
    let ebb = slow_cache();
    let f = ebb.open("f", CREATE).unwrap();
    let data = data();
    let (mut done, mut would_block) = (0, 0);
    while done < TOTAL {
        match f.try_write_at(&data[done..], done as u64).unwrap() {
            TryWrite::Written(n) => {
                assert!(n > 0, "a write that did nothing must say WouldBlock");
                done += n;
            }
            TryWrite::WouldBlock { retry_after } => {
                would_block += 1;
                assert!(retry_after <= MAX_PAUSE, "told to wait {retry_after:?}");
                let pauses = f.throttle_stats().pauses;
                match f.try_write_at(&data[done..], done as u64).unwrap() {
                    TryWrite::WouldBlock { retry_after: again } => {
                        assert!(again <= retry_after, "{again:?} after {retry_after:?}")
                    }
                    TryWrite::Written(n) => done += n,
                }
                assert_eq!(f.throttle_stats().pauses, pauses, "an early retry paused again");
                std::thread::sleep(retry_after);
            }
        }
    }
    assert!(would_block > 0, "the writer was never throttled");
    assert!(f.throttle_stats().pauses > 0);
    f.fsync().unwrap();
    drop(f);
    assert!(read_back(&ebb) == data, "the data read back differs");
}

// A handle whose non-blocking write owes a pause pays it in its next blocking write, which
// then writes everything.
#[test]
fn a_blocking_write_pays_what_a_try_left_owed() {
    let ebb = slow_cache();
    let f = ebb.open("f", CREATE).unwrap();
    let data = data();
    let mut done = 0;
    while let TryWrite::Written(n) = f.try_write_at(&data[done..], done as u64).unwrap() {
        done += n;
        assert!(done < TOTAL, "the writer was never throttled");
    }
    assert_eq!(f.write_at(&data[done..], done as u64).unwrap(), TOTAL - done);
    f.fsync().unwrap();
    drop(f);
    assert!(read_back(&ebb) == data, "the data read back differs");
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

// The future writes everything with the thread parked between polls (the alarm thread wakes
// it when a pause ends), and reports the pauses it waited out.
#[test]
fn write_at_async_waits_out_pauses_without_blocking() {
    let ebb = slow_cache();
    let f = ebb.open("f", CREATE).unwrap();
    let data = data();
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(f.write_at_async(&data, 0));
    let (mut polls, deadline) = (0u64, std::time::Instant::now() + Duration::from_secs(120));
    let written = loop {
        polls += 1;
        if let Poll::Ready(r) = future.as_mut().poll(&mut cx) {
            break r.unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "the future was never woken");
        std::thread::park_timeout(Duration::from_secs(10));
    };
    assert_eq!(written, TOTAL);
    assert!(polls > 1, "the future never waited");
    assert!(f.throttle_stats().pauses > 0);
    f.fsync().unwrap();
    drop(f);
    assert!(read_back(&ebb) == data, "the data read back differs");
}

// A caller that must not block (a FUSE request loop) writes with `try_poll_write_at`:
// throttled, it gets `Pending` and a wake-up as `poll_write_at` does, and every byte arrives,
// here in pieces that begin and end inside pages, as the kernel sends a stream written from a
// buffer that is not page-aligned: each piece's partial pages are cached (the previous piece
// wrote them) or past the end of the file, so nothing need be read and nothing is declined.
#[test]
fn try_poll_write_at_writes_a_stream_of_partial_pages() {
    let ebb = slow_cache();
    let f = ebb.open("f", CREATE).unwrap();
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let data = data();
    let piece_len = (256 << 10) - 48;
    let (mut done, mut pending) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while done < TOTAL {
        let piece = &data[done..(done + piece_len).min(TOTAL)];
        let poll = f.try_poll_write_at(piece, done as u64, &mut cx);
        match poll.expect("no old bytes to read and one writer: never declined") {
            Poll::Ready(n) => done += n.unwrap(),
            Poll::Pending => {
                pending += 1;
                assert!(std::time::Instant::now() < deadline, "never woken");
                std::thread::park_timeout(Duration::from_secs(10));
            }
        }
    }
    assert!(pending > 0, "the writer was never throttled");
    f.fsync().unwrap();
    drop(f);
    assert!(read_back(&ebb) == data, "the data read back differs");
}

// Where a partial page's old bytes are only in the backend, `try_poll_write_at` would have to
// read them: it declines, writing nothing; whole pages and bytes past the end of the file it
// writes.
#[test]
fn try_poll_write_at_declines_a_write_that_would_read_old_bytes() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let cache = || Builder::new().memory(16 << 20).backend("mem", Arc::clone(&backend)).build();
    let first = cache().unwrap();
    let f = first.open("g", CREATE).unwrap();
    f.write_at(&[7u8; 3 * 4096], 0).unwrap();
    f.fsync().unwrap();
    drop(f);
    drop(first);
    // A new cache over the same backend holds none of the file's pages.
    let second = cache().unwrap();
    let g = second.open("g", CREATE).unwrap();
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    for (offset, len) in [(100, 4096), (0, 4000), (4096, 5000)] {
        let declined = g.try_poll_write_at(&vec![1u8; len], offset, &mut cx);
        assert!(declined.is_none(), "{len} bytes at {offset} need a page's old bytes");
    }
    let whole = g.try_poll_write_at(&[2u8; 4096], 4096, &mut cx);
    assert!(matches!(whole, Some(Poll::Ready(Ok(4096)))), "a whole page needs no read");
    let past_end = g.try_poll_write_at(&[3u8; 100], 3 * 4096, &mut cx);
    assert!(
        matches!(past_end, Some(Poll::Ready(Ok(100)))),
        "past the end there is nothing to read"
    );
    let mut back = vec![0u8; 3 * 4096 + 100];
    assert_eq!(g.read_at(&mut back, 0).unwrap(), back.len());
    let expected: Vec<u8> =
        [[7u8; 4096], [2; 4096], [7; 4096]].concat().into_iter().chain([3; 100]).collect();
    assert!(back == expected, "declined writes wrote nothing; the others landed");
}

// `try_read_at` answers only from the cache: after a fresh cache opens a file written by an
// earlier one it declines (the pages are in the backend only); once `read_at` brought a page
// in, a read within it is answered with the same bytes, and one that reaches a page still
// missing is declined. At and past the end it answers 0 bytes, and it cuts a read at the end.
#[test]
fn try_read_at_answers_only_from_the_cache() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let cache = || Builder::new().memory(16 << 20).backend("mem", Arc::clone(&backend)).build();
    let first = cache().unwrap();
    let f = first.open("r", CREATE).unwrap();
    let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    f.write_at(&data, 0).unwrap();
    let mut buf = vec![0u8; 200];
    assert_eq!(f.try_read_at(&mut buf, 4000), Some(200), "the writer's pages are cached");
    assert_eq!(buf, data[4000..4200]);
    f.fsync().unwrap();
    drop(f);
    drop(first);
    let second = cache().unwrap();
    let g = second.open("r", CREATE).unwrap();
    assert_eq!(g.try_read_at(&mut buf, 0), None, "nothing is cached yet");
    let mut page = vec![0u8; 4096];
    assert_eq!(g.read_at(&mut page, 4096).unwrap(), 4096);
    assert_eq!(g.try_read_at(&mut buf, 4096 + 10), Some(200));
    assert_eq!(buf, data[4106..4306], "the cached page's bytes");
    assert_eq!(g.try_read_at(&mut buf, 8192 - 100), None, "the third page is not cached");
    let mut tail = vec![0u8; 4096];
    assert_eq!(g.read_at(&mut tail, 3 * 4096).unwrap(), 100);
    assert_eq!(g.try_read_at(&mut tail, 3 * 4096), Some(100), "cut at the end of the file");
    assert_eq!(tail[..100], data[3 * 4096..]);
    assert_eq!(g.try_read_at(&mut tail, data.len() as u64), Some(0), "at the end");
    assert_eq!(g.try_read_at(&mut tail, 1 << 20), Some(0), "past the end");
}
