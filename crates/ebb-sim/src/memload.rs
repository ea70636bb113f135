//! Workloads that make reclaim work: many files (fs_mark), anonymous memory (mmap-strm, a
//! desktop's programs starting and exiting), as writer plans the run loop carries out.
//!
//! Each workload expands into one or more writers, each following a plan of segments in order:
//! write a new file (open, sequential writes of `bs`, close), fault in pages of an anonymous
//! mapping, sleep, or free the anonymous memory the writer holds. These are the workloads of
//! Mel Gorman's 2011 reclaim posting (docs/README.md):
//!
//! - `fsmark`: `fs_mark -S0 -s 10485760 -t THREADS`: each thread creates files of
//!   `file_bytes` one after the other, without fsync, until together they have written
//!   `size_bytes` (the posting sized the run to about 3x memory).
//! - `mmap-strm`: a streaming write to a large file mapping, then streaming writes that
//!   alternate, `chunk_bytes` at a time, between an anonymous mapping and a second file
//!   mapping (`mix_bytes` in all, half each). Writes through a shared file mapping dirty the
//!   page cache as `write()` does and are throttled the same way (`page_mkwrite` calls the
//!   dirty throttle); page-table reference bits are not modelled, so mapped file pages age as
//!   written ones do.
//! - `anon-churn`: a program that starts, faults in `size_bytes` of anonymous memory, runs for
//!   `hold` and exits, once every `period`, for as long as the other writers run (the posting's
//!   USB test launched and closed firefox and gnome-terminal all along). It is a background
//!   writer: the run's elapsed time and progress ignore it, and it ends when the other writers
//!   have finished (a `hold` longer than the run makes memory that stays resident, such as a
//!   desktop's).
//!
//! Cost of touching anonymous memory: one page fault that allocates and zeroes a page, taken
//! as 1 µs per page (a 2011 x86-64 minor fault with a page clear is about 1-2 µs).

use std::collections::BTreeMap;

use ebb_core::{Duration, PAGE_SIZE, Stats};

/// CPU time of one anonymous page fault (module doc).
pub(crate) const NS_PER_FAULT: u64 = 1_000;

/// A workload of the memory-pressure family.
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryWorkload {
    /// fs_mark: `threads` writers creating files of `file_bytes` until `size_bytes` in all.
    FsMark {
        /// Backend index.
        backend: usize,
        /// Bytes written by all threads together.
        size_bytes: u64,
        /// Bytes per file.
        file_bytes: u64,
        /// Bytes per write call.
        bs_bytes: u64,
        /// Writer threads.
        threads: u32,
        /// When it starts.
        start: Duration,
    },
    /// mmap-strm: a stream of `size_bytes` to a file mapping, then `mix_bytes` alternating
    /// between an anonymous and a file mapping, `chunk_bytes` at a time.
    MmapStrm {
        /// Backend index.
        backend: usize,
        /// Bytes of the first, file-only stream.
        size_bytes: u64,
        /// Bytes of the mixed phase (half anonymous, half file).
        mix_bytes: u64,
        /// Bytes written to one mapping before switching to the other.
        chunk_bytes: u64,
        /// Bytes per write call (and per batch of faults).
        bs_bytes: u64,
        /// When it starts.
        start: Duration,
    },
    /// A program faulting in `size_bytes` of anonymous memory, holding it for `hold` and
    /// exiting, every `period`, while other writers run.
    AnonChurn {
        /// Anonymous bytes per start.
        size_bytes: u64,
        /// How long the program runs once its memory is in.
        hold: Duration,
        /// Time from one start to the next.
        period: Duration,
        /// When the first starts.
        start: Duration,
    },
}

impl MemoryWorkload {
    /// When it starts.
    pub fn start(&self) -> Duration {
        match *self {
            MemoryWorkload::FsMark { start, .. }
            | MemoryWorkload::MmapStrm { start, .. }
            | MemoryWorkload::AnonChurn { start, .. } => start,
        }
    }

    /// Multiplies the amounts written by `scale` (quick runs), keeping whole files and chunks.
    pub fn scale(&mut self, scale: f64) {
        let whole = |bytes: &mut u64, unit: u64| {
            let units = (*bytes as f64 * scale / unit as f64).round().max(1.0);
            *bytes = units as u64 * unit;
        };
        match self {
            MemoryWorkload::FsMark { size_bytes, file_bytes, .. } => whole(size_bytes, *file_bytes),
            MemoryWorkload::MmapStrm { size_bytes, mix_bytes, chunk_bytes, .. } => {
                whole(size_bytes, *chunk_bytes);
                whole(mix_bytes, 2 * *chunk_bytes);
            }
            MemoryWorkload::AnonChurn { .. } => {}
        }
    }

    /// Checks the sizes, naming the first bad field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let pages = |field: &'static str, bytes: u64| {
            if bytes < PAGE_SIZE {
                Err((field, format!("{bytes} bytes is less than a page")))
            } else {
                Ok(())
            }
        };
        match *self {
            MemoryWorkload::FsMark { size_bytes, file_bytes, bs_bytes, threads, .. } => {
                pages("file_size", file_bytes)?;
                pages("bs", bs_bytes)?;
                if threads == 0 || threads > 1024 {
                    return Err(("threads", format!("{threads} is outside 1..=1024")));
                }
                if size_bytes < file_bytes {
                    return Err(("size", "smaller than one file".to_owned()));
                }
            }
            MemoryWorkload::MmapStrm { size_bytes, mix_bytes, chunk_bytes, bs_bytes, .. } => {
                pages("size", size_bytes)?;
                pages("chunk", chunk_bytes)?;
                pages("bs", bs_bytes)?;
                if mix_bytes < 2 * chunk_bytes {
                    return Err(("mix", "smaller than two chunks".to_owned()));
                }
            }
            MemoryWorkload::AnonChurn { size_bytes, hold, period, .. } => {
                pages("size", size_bytes)?;
                if period <= hold || period == Duration::ZERO {
                    return Err(("period", "must be longer than hold".to_owned()));
                }
            }
        }
        Ok(())
    }

    /// The writers this workload runs.
    pub(crate) fn plans(&self) -> Vec<Plan> {
        let pages = |bytes: u64| bytes.div_ceil(PAGE_SIZE);
        match *self {
            MemoryWorkload::FsMark {
                backend,
                size_bytes,
                file_bytes,
                bs_bytes,
                threads,
                start,
                ..
            } => {
                let files = (size_bytes / file_bytes).max(1);
                let threads = u64::from(threads);
                (0..threads)
                    .map(|t| {
                        // Files dealt round robin: thread t makes files t, t + threads, ...
                        let mine = files / threads + u64::from(t < files % threads);
                        Plan {
                            backend,
                            bs_pages: pages(bs_bytes),
                            start,
                            segs: (0..mine).map(|_| Seg::File(pages(file_bytes))).collect(),
                            cycle: Vec::new(),
                            count_files: true,
                        }
                    })
                    .filter(|p| !p.segs.is_empty())
                    .collect()
            }
            MemoryWorkload::MmapStrm {
                backend,
                size_bytes,
                mix_bytes,
                chunk_bytes,
                bs_bytes,
                start,
                ..
            } => {
                let mut segs = vec![Seg::File(pages(size_bytes))];
                let chunks = (mix_bytes / (2 * chunk_bytes)).max(1);
                for _ in 0..chunks {
                    segs.push(Seg::Anon(pages(chunk_bytes)));
                    segs.push(Seg::Append(pages(chunk_bytes)));
                }
                segs.push(Seg::FreeAnon);
                vec![Plan {
                    backend,
                    bs_pages: pages(bs_bytes),
                    start,
                    segs,
                    cycle: Vec::new(),
                    count_files: false,
                }]
            }
            MemoryWorkload::AnonChurn { size_bytes, hold, period, start } => {
                let cycle = vec![
                    Seg::Anon(pages(size_bytes)),
                    Seg::Sleep(hold),
                    Seg::FreeAnon,
                    Seg::SleepUntilNext(period),
                ];
                // Faults in batches of 1 MiB.
                vec![Plan {
                    backend: 0,
                    bs_pages: 256,
                    start,
                    segs: Vec::new(),
                    cycle,
                    count_files: false,
                }]
            }
        }
    }
}

/// One writer's program.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) backend: usize,
    pub(crate) bs_pages: u64,
    pub(crate) start: Duration,
    /// Segments, in order.
    pub(crate) segs: Vec<Seg>,
    /// Repeated for as long as the other writers run (background writer) when not empty.
    pub(crate) cycle: Vec<Seg>,
    /// Files it completes count in `files_per_s` (fs_mark).
    pub(crate) count_files: bool,
}

/// One step of a plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Seg {
    /// Create a new file and write this many pages to it, then close it.
    File(u64),
    /// Write this many more pages to the writer's second file (created at its first
    /// `Append`; mmap-strm's second file mapping).
    Append(u64),
    /// Fault in this many pages of anonymous memory.
    Anon(u64),
    /// Free every anonymous page the writer holds.
    FreeAnon,
    /// Sleep.
    Sleep(Duration),
    /// Sleep until this long after the current cycle began.
    SleepUntilNext(Duration),
}

/// Reclaim metrics of a run (mmtests names where they exist): who scanned, reclaimed and wrote,
/// swap, stalls, files/s, and iostat's average wait per request of the first device.
pub(crate) fn reclaim_metrics(
    m: &mut BTreeMap<String, f64>,
    stats: &Stats,
    elapsed_s: f64,
    files: u64,
    device_waits: &[(u64, Duration)],
) {
    let mut put = |name: &str, value: f64| {
        m.insert(name.to_owned(), value);
    };
    put("kswapd_scanned", stats.kswapd_scanned as f64);
    put("kswapd_reclaimed", stats.kswapd_reclaimed as f64);
    put("direct_reclaimed", stats.direct_reclaimed as f64);
    put("direct_efficiency", stats.direct_reclaimed as f64 / stats.direct_scanned.max(1) as f64);
    put("swap_out_pages", (stats.kswapd_swapped + stats.direct_swapped) as f64);
    put("direct_swap_out_pages", stats.direct_swapped as f64);
    put("reclaim_immediate", stats.reclaim_immediate as f64);
    put("reclaim_kept_referenced", stats.reclaim_kept_referenced as f64);
    put("reclaim_stalls", stats.reclaim_stalls as f64);
    put("reclaim_stall_s", stats.reclaim_stall_ns as f64 / 1e9);
    if files > 0 {
        put("files", files as f64);
        put("files_per_s", files as f64 / elapsed_s);
    }
    if let Some(&(count, total)) = device_waits.first()
        && count > 0
    {
        put("avg_wait_ms", total.as_millis_f64() / count as f64);
    }
}

impl MemoryWorkload {
    /// The workload as summary.json shows it.
    pub fn to_json(&self, config: &ebb_core::Config) -> serde_json::Value {
        match *self {
            MemoryWorkload::FsMark {
                backend,
                size_bytes,
                file_bytes,
                bs_bytes,
                threads,
                start,
                ..
            } => serde_json::json!({
                "kind": "fsmark",
                "backend": config.backends[backend].name,
                "size_bytes": size_bytes,
                "file_bytes": file_bytes,
                "bs_bytes": bs_bytes,
                "threads": threads,
                "start_s": start.as_secs_f64(),
            }),
            MemoryWorkload::MmapStrm {
                backend,
                size_bytes,
                mix_bytes,
                chunk_bytes,
                bs_bytes,
                start,
                ..
            } => serde_json::json!({
                "kind": "mmap-strm",
                "backend": config.backends[backend].name,
                "size_bytes": size_bytes,
                "mix_bytes": mix_bytes,
                "chunk_bytes": chunk_bytes,
                "bs_bytes": bs_bytes,
                "start_s": start.as_secs_f64(),
            }),
            MemoryWorkload::AnonChurn { size_bytes, hold, period, start } => serde_json::json!({
                "kind": "anon-churn",
                "size_bytes": size_bytes,
                "hold_s": hold.as_secs_f64(),
                "period_s": period.as_secs_f64(),
                "start_s": start.as_secs_f64(),
            }),
        }
    }
}
