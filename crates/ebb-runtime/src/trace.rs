//! The engine's tracepoint events written to a file as the cache runs ([`crate::Builder::trace`],
//! `ebb mount --trace`), in the kernel's text format, the same lines the simulator writes to
//! `trace.txt` (`balance_dirty_pages`, `bdi_dirty_ratelimit`, `writeback_*`, `wbt_*`), so
//! `ebb report` draws a real run as it draws a simulated one.
//!
//! The engine records events only when `Config::trace` is set. The runtime takes them after each
//! engine entry, still under the engine lock but with no formatting (a vector handed over), and
//! one thread writes them out. Another samples the cache's state (`global_dirty_state`: dirty,
//! writeback and unstable pages against the thresholds) every `SAMPLE_INTERVAL`, so the trace
//! shows the whole run, not only the moments a writer was throttled. The trace is bounded twice:
//!
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | `SAMPLE_INTERVAL` | 100 | ms | ten samples a second: a 4 GiB dd at 1 GB/s gets 40 points; 110 bytes each |
//! | `QUEUE_BATCHES` | 4096 | batches | event batches waiting for the writing thread; past it, events are dropped, never waited for |
//! | the file's size | `Builder::trace`'s `max_bytes` | bytes | past it, events are dropped |
//!
//! Dropped events are counted and the last line says how many (`# ebb: ...`).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam::channel::{Receiver, Sender, TrySendError};
use ebb_core::{Instant, TraceEvent};
use parking_lot::Mutex;

/// How often the cache's state is sampled while traced.
pub(crate) const SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Event batches waiting for the writing thread.
const QUEUE_BATCHES: usize = 4096;

type Batch = Vec<(Instant, TraceEvent)>;

/// The engine side: hands the engine's events to the writing thread.
pub(crate) struct Tracer {
    /// `None` once the cache stops (the thread then writes what is left and ends).
    tx: Mutex<Option<Sender<Batch>>>,
    /// Events dropped because the queue was full.
    dropped: std::sync::Arc<AtomicU64>,
}

/// What the writing thread needs.
pub(crate) struct TraceFile {
    file: BufWriter<File>,
    max_bytes: u64,
    backends: Vec<String>,
    rx: Receiver<Batch>,
    dropped: std::sync::Arc<AtomicU64>,
}

impl Tracer {
    /// Creates (truncates) the trace file; its thread is started with [`TraceFile::run`].
    pub(crate) fn create(
        path: &Path,
        max_bytes: u64,
        backends: Vec<String>,
    ) -> io::Result<(Tracer, TraceFile)> {
        let file = File::create(path).map_err(|error| {
            io::Error::new(error.kind(), format!("trace file {}: {error}", path.display()))
        })?;
        let (tx, rx) = crossbeam::channel::bounded(QUEUE_BATCHES);
        let dropped = std::sync::Arc::new(AtomicU64::new(0));
        let tracer = Tracer { tx: Mutex::new(Some(tx)), dropped: dropped.clone() };
        let file = BufWriter::with_capacity(1 << 20, file);
        Ok((tracer, TraceFile { file, max_bytes, backends, rx, dropped }))
    }

    /// Hands over the events the engine recorded (called under the engine lock).
    pub(crate) fn push(&self, events: Batch) {
        if events.is_empty() {
            return;
        }
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else { return };
        if let Err(TrySendError::Full(events) | TrySendError::Disconnected(events)) =
            tx.try_send(events)
        {
            self.dropped.fetch_add(events.len() as u64, Ordering::Relaxed);
        }
    }

    /// No more events: the thread writes what it has and ends.
    pub(crate) fn stop(&self) {
        self.tx.lock().take();
    }
}

/// The kernel's `comm-pid` of an event: the writer's handle, or the flusher.
fn task(event: &TraceEvent) -> String {
    match event.writer() {
        Some(writer) => format!("writer-{}", writer.0),
        None => "ebb-flush-0".to_owned(),
    }
}

impl TraceFile {
    /// Writes batches until the cache stops, then the count of dropped events.
    pub(crate) fn run(mut self) {
        let mut written = 0u64;
        let mut over = 0u64;
        while let Ok(batch) = self.rx.recv() {
            for (at, event) in batch {
                let lines = event.text_lines(at, &task(&event), &self.backends);
                if written + lines.len() as u64 > self.max_bytes {
                    over += 1;
                    continue;
                }
                written += lines.len() as u64;
                if self.file.write_all(lines.as_bytes()).is_err() {
                    over += 1;
                }
            }
            // Readable while the cache runs (`ebb report` of a mount still up).
            if self.rx.is_empty() {
                let _ = self.file.flush();
            }
        }
        let queue = self.dropped.load(Ordering::Relaxed);
        if over + queue > 0 {
            let _ = writeln!(
                self.file,
                "# ebb: {} events not recorded ({over} past the bound of {} bytes, {queue} while \
                 the writing thread was behind)",
                over + queue,
                self.max_bytes
            );
        }
        let _ = self.file.flush();
    }
}
