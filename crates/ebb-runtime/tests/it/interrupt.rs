//! Blocking calls give up when their caller does (a FUSE request whose process was killed):
//! a writer throttled or waiting for memory, an fsync waiting for the backend.

use std::io::ErrorKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ebb_backend::{Backend, FaultOp, FaultyBackend, MemBackend, OpenOptions};
use ebb_runtime::Builder;

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };

/// Runs `call` on a thread, sets its interrupt flag after `after`, and returns what `call`
/// returned (a hang detector fails the test if it never does).
fn interrupted_after<T: Send + 'static>(
    after: Duration,
    call: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> T {
    let flag = Arc::new(AtomicBool::new(false));
    let (done, result) = std::sync::mpsc::channel();
    let thread_flag = Arc::clone(&flag);
    std::thread::spawn(move || {
        let _ = done.send(call(&thread_flag));
    });
    std::thread::sleep(after);
    flag.store(true, Ordering::SeqCst);
    result.recv_timeout(Duration::from_secs(120)).expect("the call never gave up")
}

// A writer that a slow backend holds (the cache full of pages under writeback) returns when
// it is interrupted, with the count of bytes it copied; an fsync waiting for the same backend
// returns Interrupted. The cache stays usable: the data written is there and drains.
#[test]
fn waiting_calls_give_up_when_interrupted() {
    let faulty = Arc::new(FaultyBackend::new(MemBackend::new()));
    let plan = faulty.plan().clone();
    let backend: Arc<dyn Backend> = faulty;
    let ebb = Builder::new().memory(8 << 20).backend("slow", backend).build().unwrap();
    plan.delay(FaultOp::Write, Duration::from_secs(2));
    let file = Arc::new(ebb.open("f", CREATE).unwrap());
    let data = vec![7u8; 64 << 20];
    let writer = Arc::clone(&file);
    let written = interrupted_after(Duration::from_millis(300), move |flag| {
        writer.write_at_interruptible(&data, 0, &|| flag.load(Ordering::SeqCst))
    });
    match written {
        Ok(count) => assert!(count < 64 << 20, "the writer was never held"),
        Err(error) => assert_eq!(error.kind(), ErrorKind::Interrupted, "{error}"),
    }
    let syncer = Arc::clone(&file);
    let synced = interrupted_after(Duration::from_millis(100), move |flag| {
        syncer.fsync_interruptible(&|| flag.load(Ordering::SeqCst))
    });
    assert_eq!(synced.unwrap_err().kind(), ErrorKind::Interrupted);
    plan.clear();
    file.fsync().unwrap();
}
