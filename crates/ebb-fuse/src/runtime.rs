//! The data path through ebb's runtime: DIR is the runtime's one backend (a `DirBackend`
//! with the settings of its block device, see `ebb_runtime::Builder::directory`), and each
//! backing file is opened by path with `O_DIRECT` and attached under the key the filesystem
//! chose. Each backing file is wrapped so that its mtime is set back to the one the filesystem
//! keeps after every write-back ([`crate::times`]).

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ebb_backend::{BackendFile, CommitReply, WriteReply};
use ebb_runtime::{Builder, DrainProgress, Ebb, File};
use rustix::fs::{Mode, OFlags};

use crate::MountConfig;
use crate::data::{DataFile, DataPath};
use crate::times::FileTimes;

/// ebb's cache and writeback in front of the backing files.
pub(crate) struct EbbData {
    ebb: Ebb,
    /// The name of DIR's backend in the runtime.
    backend: String,
}

impl EbbData {
    /// Starts the runtime with DIR as its backend, the memory budget and the knobs (each bad
    /// knob is an `InvalidInput` error naming it).
    pub(crate) fn new(backend: &Path, config: &MountConfig) -> io::Result<EbbData> {
        let mut builder = Builder::new();
        if let Some(memory) = config.memory {
            builder = builder.memory(memory);
        }
        for (name, value) in &config.knobs {
            builder = builder.knob(name, value).map_err(|error| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("knob {name}={value}: {error}"))
            })?;
        }
        // The runtime's errors about DIR (it writes a probe file there) do not name it.
        let in_backend = |error: io::Error| {
            io::Error::new(error.kind(), format!("backend {}: {error}", backend.display()))
        };
        let ebb = builder.directory(backend).map_err(in_backend)?.build()?;
        let backend = ebb
            .backend_names()
            .into_iter()
            .next()
            .ok_or_else(|| io::Error::other("the runtime started without its backend"))?;
        Ok(EbbData { ebb, backend })
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
    fn attach(
        &self,
        key: u64,
        path: &Path,
        times: &Arc<FileTimes>,
    ) -> io::Result<Box<dyn DataFile>> {
        // The backing file is opened only when ebb does not cache this key yet.
        let file = self.ebb.attach_with(&self.backend, key, || {
            let inner = ebb_backend::open_direct_path(path)?;
            // Its own descriptor: `path` names the filesystem's, which may close first.
            let flags = OFlags::PATH | OFlags::CLOEXEC;
            let fd = rustix::fs::open(path, flags, Mode::empty())?;
            let times = Arc::clone(times);
            Ok(Arc::new(TimedFile { inner, times, fd }) as Arc<dyn BackendFile>)
        })?;
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
        format!(
            "{} KiB dirty, {} KiB under writeback, {} KiB unstable",
            meminfo.dirty_kb, meminfo.writeback_kb, meminfo.unstable_kb
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
}

/// A backing file whose mtime is set back to the kept one after each write and trim.
#[derive(Debug)]
struct TimedFile {
    inner: Arc<dyn BackendFile>,
    times: Arc<FileTimes>,
    /// `O_PATH` on the backing file, for `utimensat`.
    fd: OwnedFd,
}

impl BackendFile for TimedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        let reply = self.inner.write_at(buf, offset)?;
        self.times.restore(&self.fd);
        Ok(reply)
    }

    fn commit(&self, offset: u64, len: u64) -> io::Result<CommitReply> {
        self.inner.commit(offset, len)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        self.inner.set_size(size)?;
        self.times.restore(&self.fd);
        Ok(())
    }
}
