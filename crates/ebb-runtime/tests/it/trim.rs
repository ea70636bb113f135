//! Trims of the backend file against writes past the old size: writeback writes whole pages
//! and then trims the backend file back to the logical size; a write of newer pages past that
//! size, landing between the trim's look at the size and the trim itself, must survive it.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ebb_backend::{
    Backend, BackendFile, Capabilities, CommitReply, MemBackend, OpenOptions, WriteReply,
};
use ebb_runtime::Builder;
use parking_lot::{Condvar, Mutex};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: true };
const OPEN: OpenOptions = OpenOptions { create: false, truncate: false };

/// How long an armed trim waits for a write past the size it was given. Before the fix the
/// write lands in well under this; after it the write cannot start until the trim ends, and
/// the trim goes on when this has passed.
const WINDOW: Duration = Duration::from_millis(500);

/// What the armed trim and the writes tell each other.
#[derive(Debug, Default)]
struct Window {
    state: Mutex<WindowState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct WindowState {
    /// The size of the armed trim, once it has begun.
    trimming: Option<u64>,
    /// A write ended past that size while the trim waited.
    landed: bool,
}

/// A memory backend (writes of one file in parallel) whose first trim after `arm` waits, up
/// to [`WINDOW`], for a write past the size it trims to.
#[derive(Debug)]
struct PausingTrims {
    inner: MemBackend,
    armed: Arc<AtomicBool>,
    window: Arc<Window>,
}

#[derive(Debug)]
struct PausingFile {
    inner: Arc<dyn BackendFile>,
    armed: Arc<AtomicBool>,
    window: Arc<Window>,
}

impl Backend for PausingTrims {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        let inner = self.inner.open(name, options)?;
        Ok(Arc::new(PausingFile { inner, armed: self.armed.clone(), window: self.window.clone() }))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        self.inner.exists(name)
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities { serial_writes: false, ..self.inner.capabilities() }
    }
}

impl BackendFile for PausingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        let reply = self.inner.write_at(buf, offset)?;
        let mut state = self.window.state.lock();
        if state.trimming.is_some_and(|size| offset + buf.len() as u64 > size) {
            state.landed = true;
            self.window.cv.notify_all();
        }
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
        if self.armed.swap(false, Ordering::SeqCst) {
            let mut state = self.window.state.lock();
            state.trimming = Some(size);
            self.window.cv.notify_all();
            let _ = self.window.cv.wait_while_for(&mut state, |s| !s.landed, WINDOW);
        }
        self.inner.set_size(size)
    }
}

// A file of 100 bytes is written back (one page, then trimmed to 100 bytes); while that trim
// waits, the file grows by a page (bytes 4096..8192), which is fsynced. Both fsyncs succeed, so the backend file
// must hold all 8 KiB. Before the trims excluded writes, the trim (of a size read before the
// growth) cut the new page off after its write had landed, and the backend kept 100 bytes.
#[test]
fn a_trim_never_cuts_a_write_past_the_size_it_read() {
    let window = Arc::new(Window::default());
    let armed = Arc::new(AtomicBool::new(false));
    let backend = Arc::new(PausingTrims {
        inner: MemBackend::new(),
        armed: armed.clone(),
        window: window.clone(),
    });
    let ebb = Builder::new().memory(16 << 20).backend("b", backend.clone()).build().unwrap();
    let file = Arc::new(ebb.open("f", CREATE).unwrap());
    file.write_at(&[1u8; 100], 0).unwrap();
    armed.store(true, Ordering::SeqCst);
    let first = {
        let file = file.clone();
        std::thread::spawn(move || file.fsync())
    };
    // Wait (bounded) for the trim of page 0's writeback to begin.
    {
        let mut state = window.state.lock();
        let began = !window
            .cv
            .wait_while_for(&mut state, |s| s.trimming.is_none(), Duration::from_secs(30))
            .timed_out();
        assert!(began, "page 0's writeback never trimmed the backend file");
        assert_eq!(state.trimming, Some(100), "the trim is to the logical size");
    }
    // Page 1 only: page 0 is under writeback, and a write into it would wait for the trim.
    file.write_at(&[2u8; 4096], 4096).unwrap();
    file.fsync().unwrap();
    first.join().unwrap().unwrap();
    let mut want = vec![0u8; 8192];
    want[..100].fill(1);
    want[4096..].fill(2);
    let on_backend = backend.inner.open("f", OPEN).unwrap();
    let mut got = vec![0u8; 8192 + 1];
    let n = on_backend.read_at(&mut got, 0).unwrap();
    assert_eq!(n, 8192, "the backend file's size after both fsyncs");
    assert!(got[..n] == want[..], "the backend file lost bytes the fsyncs acknowledged");
    Arc::try_unwrap(file).ok().unwrap().close().unwrap();
}

/// ebb writes 100 bytes to `f` and fsyncs: its last page is trimmed to the logical size. The
/// engine, ebb's file, and another client's handle on the backend's file.
fn a_hundred_bytes_written_and_trimmed()
-> (ebb_runtime::Ebb, ebb_runtime::File, Arc<dyn BackendFile>) {
    let backend = Arc::new(MemBackend::new());
    let ebb = Builder::new().memory(16 << 20).backend("b", backend.clone()).build().unwrap();
    let file = ebb.open("f", CREATE).unwrap();
    file.write_at(&[1u8; 100], 0).unwrap();
    file.fsync().unwrap();
    let other = backend.open("f", OPEN).unwrap();
    assert_eq!(other.size().unwrap(), 100, "ebb's page trimmed to the logical size");
    (ebb, file, other)
}

// Someone else (another NFS client, a process in the backing directory) grows the backend's
// file past ebb's last page after ebb wrote it: ebb's next fsync and close trim only the rest
// of ebb's own last page, never the other's bytes (issue 33: over NFS and S3 the close that
// dropped a stale cache at the next open cut another client's growth back to ebb's old size,
// found by ebb-fuse's random checker). Before the fix the fsync cut the file to 100 bytes.
#[test]
fn a_trim_leaves_what_someone_else_grew() {
    let (_ebb, file, other) = a_hundred_bytes_written_and_trimmed();
    other.write_at(&[2u8; 8192], 8192).unwrap();
    file.fsync().unwrap();
    assert_eq!(other.size().unwrap(), 16384, "the other's growth after ebb's fsync");
    file.close().unwrap();
    assert_eq!(other.size().unwrap(), 16384, "the other's growth after ebb's close");
    let mut got = vec![0u8; 8192];
    assert_eq!(other.read_at(&mut got, 8192).unwrap(), 8192);
    assert!(got.iter().all(|&b| b == 2), "the other's bytes");
}

// Someone else grows the backend's file to an end inside ebb's last page after ebb wrote and
// trimmed it: the growth is theirs, as one past that page is. ebb's next open sees it
// (`backend_changed`: the size becomes the backend's), and neither its fsync nor its close
// cuts it. Before the fix ebb took the excess for its own last page written whole: the size
// stayed 100 and the fsync cut the file back to 100 bytes.
#[test]
fn a_trim_leaves_a_growth_inside_ebbs_last_page() {
    let (_ebb, file, other) = a_hundred_bytes_written_and_trimmed();
    other.write_at(&[2u8; 2000], 100).unwrap();
    file.backend_changed().unwrap();
    assert_eq!(file.len(), 2100, "the size after the other's growth is seen");
    let mut got = vec![0u8; 4096];
    assert_eq!(file.read_at(&mut got, 0).unwrap(), 2100);
    assert!(got[..100].iter().all(|&b| b == 1) && got[100..2100].iter().all(|&b| b == 2));
    file.fsync().unwrap();
    assert_eq!(other.size().unwrap(), 2100, "the other's growth after ebb's fsync");
    // ebb writes its own last page again: its write-back's padding is still trimmed.
    file.write_at(&[3u8; 10], 2100).unwrap();
    file.fsync().unwrap();
    assert_eq!(other.size().unwrap(), 2110, "ebb's own last page trimmed after its write-back");
    file.close().unwrap();
    assert_eq!(other.size().unwrap(), 2110, "after ebb's close");
    let mut got = vec![0u8; 2110];
    assert_eq!(other.read_at(&mut got, 0).unwrap(), 2110);
    assert!(got[100..2100].iter().all(|&b| b == 2), "the other's bytes");
    assert!(got[2100..].iter().all(|&b| b == 3), "ebb's bytes");
}
