//! The data path through ebb's runtime: the namespace's backend is the runtime's one backend
//! (with the settings of its block device for a local directory, see
//! `ebb_runtime::DeviceInfo`), and each file is attached under the key the filesystem chose,
//! its backend file opened (by the namespace) only when the runtime does not cache it yet.

use std::io;
use std::time::Duration;

use ebb_backend::Namespace;
use ebb_core::BackendConfig;
use ebb_runtime::{Builder, DeviceInfo, DrainProgress, Ebb, File, MetricsServer};

use crate::MountConfig;
use crate::data::{DataFile, DataPath, FileReport, Interrupt, Opener, report_of};

/// The heap a cached file costs the mount beside the runtime's own
/// (`ebb_runtime::FILE_STATE_BYTES`), bytes: its anchor and cache key, its kept times, the node
/// the kernel knows it by and the namespace's object behind it. Charged with the runtime's
/// against the memory budget per file the cache knows. Of the 3.4 KB per file measured all
/// told (`ebb_runtime::FILE_STATE_BYTES`), the part estimated to be the mount's.
const FILE_STATE_BYTES: u64 = 1000;

/// ebb's cache and writeback in front of the backend's files.
pub(crate) struct EbbData {
    /// Declared first, so it stops before the cache is dropped.
    _metrics: Option<MetricsServer>,
    ebb: Ebb,
    /// The name of the backend in the runtime.
    backend: String,
}

/// The mount process's own memory beside its buffers, set aside from `--memory`: the code it
/// maps ([`mapped_code_bytes`], read from the process itself), and [`OWN_BYTES`] plus 1/64 of
/// the budget for the rest (its heap beside the cache, thread stacks, read-only data).
pub(crate) fn process_reserve(memory: u64) -> u64 {
    mapped_code_bytes() + OWN_BYTES + memory / 64
}

/// The process's memory beside its code, the cache (the files' state included), the copies of
/// write requests and the IO buffers, bytes: its heap's own tables and queues, fuser's receive
/// buffers, its threads' stacks, bounce buffers, resident read-only data. Measured on a release
/// build at `--memory 64MiB` with 3,000 files then 256 writers (2026-11-29): VmHWM 71.4 MB,
/// less the runtime's 39 MiB, 16 MB of request copies (heaptrack) and 5.6 MB of code resident,
/// leaves about 8 MB.
const OWN_BYTES: u64 = 8 << 20;

/// The code the process maps, bytes: the sizes of its executable file mappings (the binary's
/// and the libraries'), which bound the code it can ever have resident. Read once from
/// `/proc/self/maps`; [`UNKNOWN_CODE_BYTES`] where it cannot be read.
pub(crate) fn mapped_code_bytes() -> u64 {
    static CODE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CODE.get_or_init(|| {
        std::fs::read_to_string("/proc/self/maps")
            .ok()
            .and_then(|maps| executable_file_bytes(&maps))
            .unwrap_or(UNKNOWN_CODE_BYTES)
    })
}

/// The code of a build whose mappings cannot be read, bytes: about what the test profile's build
/// of `ebb` maps with its libraries (its text is 10.4 MB; a release build's 9.5 MB).
const UNKNOWN_CODE_BYTES: u64 = 13 << 20;

/// The bytes of the executable file mappings in `maps` (the format of `/proc/PID/maps`: `START-END
/// PERMS OFFSET DEV INODE PATH`); `None` if it lists none.
pub(crate) fn executable_file_bytes(maps: &str) -> Option<u64> {
    let mut total = None;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let inode = fields.nth(2);
        let file_backed = inode.is_some_and(|inode| inode != "0") && fields.next().is_some();
        if !file_backed || perms.as_bytes().get(2) != Some(&b'x') {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        *total.get_or_insert(0) += end.saturating_sub(start);
    }
    total
}

/// What the runtime gets of the mount's `--memory`: all of it but the process's own memory
/// ([`process_reserve`]) and the kept copies of write requests
/// ([`crate::fs::request_copy_bytes`]), which the mount's process holds beside the cache and
/// its IO buffers; 0 if they take it all.
pub(crate) fn cache_budget(memory: u64) -> u64 {
    let copies = crate::fs::request_copy_bytes(Some(memory));
    memory.saturating_sub(copies + process_reserve(memory))
}

/// The smallest `--memory`, in whole MiB, whose [`cache_budget`] is at least `runtime` bytes.
fn smallest_memory_mib(runtime: u64) -> u64 {
    (1..=1u64 << 30).find(|mib| cache_budget(mib << 20) >= runtime).unwrap_or(1 << 30)
}

/// `bytes` in MiB, as `--memory` takes them (`24MiB`, `24.5MiB`).
fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{:.1}MiB", bytes as f64 / (1 << 20) as f64)
    }
}

impl EbbData {
    /// Starts the runtime with the namespace's backend and writeback settings (for a local
    /// directory, its block device's), the memory budget and the knobs (each bad knob is an
    /// `InvalidInput` error naming it), the trace and the metrics endpoint if asked for.
    pub(crate) fn new<N: Namespace>(config: &MountConfig, namespace: &N) -> io::Result<EbbData> {
        let mut builder = Builder::new().file_state_bytes(FILE_STATE_BYTES);
        if let Some(memory) = config.memory {
            // A budget the process's own memory takes whole still goes to the runtime (as one
            // page), so that its refusal says the smallest budget that works.
            builder = builder.memory(cache_budget(memory).max(ebb_core::PAGE_SIZE));
        }
        for (knob, value) in &config.knobs {
            builder = builder.knob(knob, value).map_err(|error| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("knob {knob}={value}: {error}"))
            })?;
        }
        if let Some((path, max_bytes)) = &config.trace {
            builder = builder.trace(path, *max_bytes);
        }
        let name = namespace.describe();
        let mut settings = BackendConfig::new(&name);
        if let Some(directory) = namespace.local_directory() {
            DeviceInfo::for_path(directory).apply(&mut settings);
        }
        namespace.writeback_settings(&mut settings);
        let ebb = builder.backend_with(&name, namespace.backend(), settings).build().map_err(
            |error| match config.memory {
                Some(memory)
                    if error
                        .get_ref()
                        .is_some_and(|inner| inner.is::<ebb_runtime::BudgetTooSmall>()) =>
                {
                    let runtime = error
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<ebb_runtime::BudgetTooSmall>())
                        .map_or(0, |small| small.smallest);
                    let smallest = smallest_memory_mib(runtime);
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "--memory {} is too small: the smallest --memory that works here is \
                             {smallest}MiB (of it {} are the process's own, {} copies of write \
                             requests, the rest IO buffers and a cache of at least 4MiB)",
                            mib(memory),
                            mib(process_reserve(smallest << 20)),
                            mib(crate::fs::request_copy_bytes(Some(smallest << 20))),
                        ),
                    )
                }
                Some(memory) if error.kind() == io::ErrorKind::InvalidInput => io::Error::new(
                    error.kind(),
                    format!(
                        "--memory {memory}: {} bytes are the process's own, {} hold copies \
                         of write requests, the rest goes to ebb's cache: {error}",
                        process_reserve(memory),
                        crate::fs::request_copy_bytes(Some(memory))
                    ),
                ),
                _ => error,
            },
        )?;
        let metrics = config.metrics.map(|addr| ebb.serve_metrics(addr)).transpose()?;
        Ok(EbbData { _metrics: metrics, ebb, backend: name })
    }
}

/// One line about what a drain has left.
fn describe(progress: &DrainProgress) -> String {
    let mib = |pages: u64| pages as f64 * 4096.0 / (1 << 20) as f64;
    format!(
        "{:.1} s: {:.1} MiB dirty, {:.1} MiB under writeback, {:.1} MiB unstable{}",
        progress.elapsed_ms as f64 / 1000.0,
        mib(progress.dirty_pages),
        mib(progress.writeback_pages),
        mib(progress.unstable_pages),
        if progress.done { " (done)" } else { "" }
    )
}

impl DataPath for EbbData {
    fn plant(&self, bug: ebb_core::CoreBug) -> bool {
        self.ebb.plant(bug)
    }

    fn retry_timeout(&self) -> Duration {
        let config = self.ebb.config();
        let backend = config.backends.iter().find(|backend| backend.name == self.backend);
        backend.map_or(Duration::from_secs(60), |b| Duration::from_secs(b.retry_timeout_secs))
    }

    fn try_timeout(&self) -> Option<Duration> {
        let config = self.ebb.config();
        let backend = config.backends.iter().find(|backend| backend.name == self.backend)?;
        backend.try_timeout_ms.map(Duration::from_millis)
    }

    fn request_failed(
        &self,
        error: ebb_core::IoError,
        first: std::time::Instant,
        started: std::time::Instant,
        failures: u32,
    ) -> Option<ebb_core::outage::Next> {
        self.ebb.request_failed(&self.backend, error, first, started, failures).ok()
    }

    fn request_succeeded(&self) {
        self.ebb.request_succeeded(&self.backend);
    }

    fn request_waiting(&self, started: std::time::Instant) -> bool {
        self.ebb.request_waiting(&self.backend, started).is_ok()
    }

    fn backend_unreachable(&self) -> Option<bool> {
        self.ebb.backend_unreachable(&self.backend).ok()
    }

    fn attach(&self, key: u64, open: Opener<'_>) -> io::Result<Box<dyn DataFile>> {
        let file = self.ebb.attach_with(&self.backend, key, open)?;
        Ok(Box::new(EbbFile(file)))
    }

    fn sync(&self) -> io::Result<()> {
        self.ebb.sync()
    }

    fn drain(&self, deadline: Duration, progress: &mut dyn FnMut(&str, bool)) -> io::Result<()> {
        self.ebb.drain(deadline, &mut |state| progress(&describe(state), state.done))
    }

    fn unwritten(&self) -> String {
        let meminfo = self.ebb.stats().meminfo;
        let kib = |pages: u64| pages * ebb_core::PAGE_SIZE / 1024;
        format!(
            "{} KiB dirty, {} KiB under writeback, {} KiB unstable",
            kib(meminfo.dirty),
            kib(meminfo.writeback),
            kib(meminfo.unstable)
        )
    }

    fn discard(&self, key: u64) {
        if let Err(error) = self.ebb.discard(&self.backend, key) {
            eprintln!("ebb mount: forgetting a deleted file: {error}");
        }
    }

    fn write_errors(&self) -> u64 {
        self.ebb.stats().counters.write_errors
    }

    fn engine_config(&self) -> Option<ebb_core::Config> {
        Some(self.ebb.config())
    }

    fn stats_json(&self) -> String {
        serde_json::to_string_pretty(&self.ebb.stats())
            .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
    }
}

struct EbbFile(File);

impl DataFile for EbbFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_direct_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.0.write_at(buf, offset)
    }

    fn set_len(&self, size: u64) -> io::Result<()> {
        self.0.set_len(size)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.len())
    }

    fn fsync(&self) -> io::Result<()> {
        self.0.fsync()
    }

    fn close(self: Box<Self>) -> io::Result<()> {
        self.0.close()
    }

    fn check_error(&self) -> io::Result<()> {
        self.0.check_error()
    }

    fn is_clean(&self) -> bool {
        self.0.is_clean()
    }

    fn backend_changed(&self) -> io::Result<()> {
        self.0.backend_changed()
    }

    fn report(&self) -> Option<FileReport> {
        Some(report_of(&self.0, self.0.errors()))
    }

    fn ebb_file(&self) -> Option<&File> {
        Some(&self.0)
    }

    fn zero_range(
        &self,
        offset: u64,
        len: u64,
        backend: &mut dyn FnMut() -> io::Result<()>,
    ) -> io::Result<()> {
        self.0.zero_range_with(offset, len, backend)
    }

    fn poll_write_at(
        &self,
        buf: &[u8],
        offset: u64,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<usize>> {
        self.0.poll_write_at(buf, offset, cx)
    }

    fn try_poll_write_at(
        &self,
        buf: &[u8],
        offset: u64,
        cx: &mut std::task::Context<'_>,
    ) -> Option<std::task::Poll<io::Result<usize>>> {
        self.0.try_poll_write_at(buf, offset, cx)
    }

    fn read_at_interruptible(
        &self,
        buf: &mut [u8],
        offset: u64,
        interrupted: Interrupt<'_>,
    ) -> io::Result<usize> {
        self.0.read_at_interruptible(buf, offset, interrupted)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<usize> {
        self.0.try_read_at(buf, offset)
    }

    fn fsync_interruptible(&self, interrupted: Interrupt<'_>) -> io::Result<()> {
        self.0.fsync_interruptible(interrupted)
    }

    fn flush(&self, interrupted: Interrupt<'_>) -> io::Result<()> {
        self.0.flush_interruptible(interrupted)
    }

    fn close_writes_back(&self) -> bool {
        self.0.flushes_on_close()
    }
}
