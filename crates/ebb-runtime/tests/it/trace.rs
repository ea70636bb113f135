//! `Builder::trace`: a traced cache leaves the engine's tracepoint events in the kernel's text
//! format, within the size it was given.

use std::io::Write;
use std::sync::Arc;

use ebb_backend::{MemBackend, OpenOptions};
use ebb_runtime::Builder;

/// Writes 32 MiB through an 8 MiB cache traced into `path` (at most `max_bytes`), then stops it.
fn traced_stream(path: &std::path::Path, max_bytes: u64) {
    let ebb = Builder::new()
        .memory(8 << 20)
        .backend("mem", Arc::new(MemBackend::new()))
        .trace(path, max_bytes)
        .build()
        .unwrap();
    let mut f = ebb.open("f", OpenOptions { create: true, truncate: false }).unwrap();
    let block = vec![7u8; 1 << 20];
    for _ in 0..32 {
        f.write_all(&block).unwrap();
    }
    f.fsync().unwrap();
    // Open until the state was sampled (every 100 ms) once, if the bound leaves room for it: a
    // hang detector, not a speed check.
    let start = std::time::Instant::now();
    while max_bytes > 1 << 20
        && !std::fs::read_to_string(path).unwrap().contains("global_dirty_state")
    {
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "never sampled");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    f.close().unwrap();
    drop(ebb);
}

/// The writer's throttling, the flusher's works and the sampled state are in the file,
/// each line `TASK [000] SECONDS: tracepoint: fields`, times not going back.
#[test]
fn a_traced_cache_writes_the_kernels_tracepoints() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.txt");
    traced_stream(&path, 1 << 30);
    let text = std::fs::read_to_string(&path).unwrap();
    let tracepoints = [
        ": balance_dirty_pages: bdi=mem limit=",
        ": writeback_start: bdi mem:",
        ": global_dirty_state: dirty=",
    ];
    for tracepoint in tracepoints {
        assert!(text.contains(tracepoint), "no {tracepoint:?} in the trace");
    }
    let mut last = 0.0;
    for line in text.lines() {
        let (head, _) = line.split_once(": ").unwrap_or_else(|| panic!("{line}"));
        assert!(head.contains(" [000] "), "{line}");
        let seconds: f64 = head.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(seconds >= last, "time goes back at {line}");
        last = seconds;
    }
    assert!(!text.contains("# ebb:"), "nothing dropped from a 1 GiB bound");
}

/// Past its bound the trace stops growing and says how many events it left out.
#[test]
fn a_trace_stays_within_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.txt");
    traced_stream(&path, 4096);
    let text = std::fs::read_to_string(&path).unwrap();
    let (body, last) = text.trim_end().rsplit_once('\n').unwrap();
    assert!(body.len() < 4096, "{} bytes of events", body.len());
    assert!(last.starts_with("# ebb: ") && last.contains("not recorded"), "{last}");
}
