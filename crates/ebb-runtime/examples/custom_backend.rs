//! A backend of your own, from the trait to a cache in front of it: `cargo run -p ebb-runtime
//! --example custom_backend [DIR]` (a fresh directory under the system's temporary directory
//! by default).
//!
//! `LogDirBackend` keeps each file as an ordinary file of a directory, written with buffered
//! `pwrite` (no `O_DIRECT`), and counts its calls the way a protocol client counts its
//! requests. The example
//!
//! 1. runs the backend conformance suite on it (a backend's tests would use
//!    `ebb_backend::backend_conformance!`, which makes one `#[test]` per check),
//! 2. puts ebb's cache in front of it with `Builder::backend`, writes 8 MiB through the cache,
//!    fsyncs, and reads the file back from the directory,
//! 3. prints what the engine did and the backend's own counters, as `ebb stat` would.
//!
//! What a backend must promise is the contract on `ebb_backend::Backend` and `BackendFile`:
//! blocking, `Send + Sync`, whole writes or an error with the errno the OS gave, a `sync` that
//! makes every acknowledged write durable.
#![expect(clippy::print_stdout, reason = "an example that prints what it did")]

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ebb_backend::{
    Backend, BackendFile, Capabilities, CommitReply, OpenOptions, Stability, WriteReply,
};

/// What the backend can do (`Backend::capabilities`).
const CAPABILITIES: Capabilities = Capabilities {
    // Every write is durable after the next sync: no commit needed.
    two_phase: false,
    // Buffered IO: reads may come from the OS page cache, any alignment works.
    direct_io: false,
    alignment: 1,
    // The largest write or read it takes; the engine sends no larger one.
    max_io_bytes: 1 << 20,
    // ext4 runs one file's buffered writes one at a time.
    serial_writes: true,
};

/// Calls made, per kind: what `Backend::counters` reports.
#[derive(Debug, Default)]
struct Calls {
    writes: AtomicU64,
    reads: AtomicU64,
    syncs: AtomicU64,
}

/// Files of a directory, written with buffered IO.
#[derive(Debug)]
struct LogDirBackend {
    dir: PathBuf,
    calls: Arc<Calls>,
}

impl LogDirBackend {
    fn open(dir: &Path) -> io::Result<LogDirBackend> {
        fs::create_dir_all(dir)?;
        Ok(LogDirBackend { dir: dir.to_path_buf(), calls: Arc::default() })
    }

    /// The path of `name`, once the name passed the contract's rule (one path component).
    fn path(&self, name: &str) -> io::Result<PathBuf> {
        ebb_backend::check_name(name)?;
        Ok(self.dir.join(name))
    }
}

impl Backend for LogDirBackend {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(options.create)
            .truncate(options.truncate)
            .open(self.path(name)?)?;
        Ok(Arc::new(LogFile { file, calls: self.calls.clone() }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.path(name)?)?;
        // The removal is durable when the call returns: sync the directory.
        fs::File::open(&self.dir)?.sync_all()
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        self.path(name)?.try_exists()
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("writes", self.calls.writes.load(Ordering::Relaxed)),
            ("reads", self.calls.reads.load(Ordering::Relaxed)),
            ("syncs", self.calls.syncs.load(Ordering::Relaxed)),
        ]
    }
}

/// One open file.
#[derive(Debug)]
struct LogFile {
    file: fs::File,
    calls: Arc<Calls>,
}

impl BackendFile for LogFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.calls.reads.fetch_add(1, Ordering::Relaxed);
        // Short only at the end of the file, as the contract says.
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(count) => done += count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(done)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        ebb_backend::check_request(&CAPABILITIES, offset, buf.len())?;
        self.calls.writes.fetch_add(1, Ordering::Relaxed);
        // All or error; the OS's errno (ENOSPC, EIO) goes back as it is.
        self.file.write_all_at(buf, offset)?;
        Ok(WriteReply { stability: Stability::Stable })
    }

    fn commit(&self, _offset: u64, _len: u64) -> io::Result<CommitReply> {
        // A one-phase backend's commit is a sync, with verifier 0.
        self.sync()?;
        Ok(CommitReply { verifier: 0 })
    }

    fn sync(&self) -> io::Result<()> {
        self.calls.syncs.fetch_add(1, Ordering::Relaxed);
        self.file.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        self.file.set_len(size)
    }
}

fn main() -> io::Result<()> {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ebb-custom-backend-{}", std::process::id()))
    });

    // 1. The contract: every check of the suite, each on a fresh backend.
    let round = AtomicU64::new(0);
    let make = || {
        let sub = dir.join(format!("conformance-{}", round.fetch_add(1, Ordering::Relaxed)));
        Box::new(LogDirBackend::open(&sub).expect("scratch directory"))
    };
    let report = ebb_backend::conformance::run_all(&make);
    println!("{report}");
    if !report.is_ok() {
        return Err(io::Error::other("the backend breaks the contract"));
    }

    // 2. The cache in front of it.
    let data_dir = dir.join("data");
    let backend = Arc::new(LogDirBackend::open(&data_dir)?);
    let ebb = ebb_runtime::Builder::new()
        .memory(64 << 20)
        .knob("dirty_background_bytes", "4M")
        .map_err(io::Error::other)?
        .backend("log", backend)
        .build()?;
    let file = ebb.open("hello", OpenOptions { create: true, truncate: true })?;
    let block: Vec<u8> = (0..1 << 20).map(|index: u32| (index % 251) as u8).collect();
    for mib in 0..8u64 {
        file.write_at(&block, mib << 20)?;
    }
    file.fsync()?;
    file.close()?;
    let on_disk = fs::read(data_dir.join("hello"))?;
    assert!(on_disk.len() == 8 << 20 && on_disk.chunks(1 << 20).all(|chunk| chunk == block));
    println!("8 MiB written through the cache are in {}", data_dir.display());

    // 3. What happened, as `ebb stat` shows it.
    let stats = ebb.stats();
    let counters = &stats.counters;
    println!(
        "engine: {} writes of {} pages in {} writepages calls",
        counters.writes, counters.write_pages, counters.writepages_calls
    );
    println!("backend: {:?}", stats.backend_counters[0]);
    drop(ebb);
    fs::remove_dir_all(&dir)
}
