//! The runtime's threads as the scheduler sees them.

use std::sync::Arc;

use ebb_backend::MemBackend;
use ebb_runtime::Builder;

/// The nice value in a `/proc/.../stat` file.
fn nice_in(stat: &std::path::Path) -> Option<i64> {
    let stat = std::fs::read_to_string(stat).ok()?;
    // Fields after the parenthesised name: state is field 3, nice field 19.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19 - 3)?.parse().ok()
}

/// The nice value of each thread of this process whose name starts with `prefix`.
fn nice_of_threads(prefix: &str) -> Vec<i64> {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    tasks
        .flatten()
        .filter(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            comm.starts_with(prefix)
        })
        .filter_map(|task| nice_in(&task.path().join("stat")))
        .collect()
}

/// By default the IO threads, which copy pages out and wait for the backend, run at nice 10
/// (`io_thread_nice`), so a reader or writer woken on a busy machine runs before them; the
/// timer thread, which runs the engine's decisions, keeps the caller's priority.
#[test]
fn io_threads_run_at_a_lower_priority() {
    let base = nice_in("/proc/thread-self/stat".as_ref()).expect("this thread's nice value");
    if base > 10 {
        eprintln!(
            "SKIPPED io_threads_run_at_a_lower_priority: the tests run at nice {base}, above the IO threads' 10"
        );
        assert!(std::env::var_os("CI").is_none(), "CI must run the tests at nice 0..=10");
        return;
    }
    let ebb = Builder::new().memory(8 << 20).backend("mem", Arc::new(MemBackend::new()));
    let ebb = ebb.io_threads(3).build().unwrap();
    // Other tests start caches too. A thread just spawned names itself and sets its nice
    // value first thing, so until it has run it is not found or not yet at 10.
    let mut io = nice_of_threads("ebb-io-");
    for _ in 0..1000 {
        if io.len() >= 3 && io.iter().all(|&n| n == 10) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        io = nice_of_threads("ebb-io-");
    }
    assert!(io.len() >= 3, "the IO threads are found by name: {io:?}");
    assert!(io.iter().all(|&n| n == 10), "IO threads at nice 10: {io:?}");
    let timer = nice_of_threads("ebb-timer");
    assert!(timer.iter().all(|&n| n == base), "the timer thread at {base}: {timer:?}");
    drop(ebb);
}
