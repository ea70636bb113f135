//! Durability watermarks: `durable_len` never claims more than a crash keeps, on a two-phase
//! backend whose server restarts (losing what was not committed) and on a one-phase backend
//! whose volatile cache a power cut loses (everything since the file's last sync).

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ebb_backend::{
    Backend, BackendFile, Capabilities, CommitReply, MemBackend, OpenOptions, WriteReply,
};
use ebb_runtime::{Builder, Ebb, File};
use parking_lot::Mutex;

const CREATE: OpenOptions = OpenOptions { create: true, truncate: true };
const RECORD: usize = 64 << 10;
const RECORDS: usize = 512;

fn pattern(offset: usize, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        let x = offset + i;
        *b = (x as u8) ^ ((x >> 12) as u8) ^ 0x5a;
    }
}

/// Appends `RECORDS` records on a thread, as a log does, until done.
fn append_log(file: Arc<File>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; RECORD];
        for i in 0..RECORDS {
            pattern(i * RECORD, &mut buf);
            file.write_at(&buf, (i * RECORD) as u64).unwrap();
        }
        done.store(true, Ordering::SeqCst);
    })
}

/// Whether `kept` holds the log's bytes below `len`.
fn holds_prefix(kept: &[u8], len: u64) -> bool {
    let len = len as usize;
    if kept.len() < len {
        return false;
    }
    let mut want = vec![0u8; len];
    pattern(0, &mut want);
    kept[..len] == want[..]
}

fn small_cache(backend: Arc<dyn Backend>) -> Ebb {
    Builder::new().memory(8 << 20).backend("b", backend).build().unwrap()
}

// An NFS-like server restarts every MiB of a log's writing: after each restart, the bytes
// `durable_len` reported before it are on the server, intact. Commits of background writeback
// move the watermark without any fsync; after fsync all of the file is durable.
#[test]
fn durable_len_survives_server_restarts() {
    let backend = Arc::new(MemBackend::two_phase());
    let ebb = small_cache(backend.clone());
    let file = ebb.open("log", CREATE).unwrap();
    let reader = backend.open("log", OpenOptions { create: false, truncate: false }).unwrap();
    let mut buf = vec![0u8; RECORD];
    let mut seen = 0;
    for i in 0..RECORDS {
        pattern(i * RECORD, &mut buf);
        file.write_at(&buf, (i * RECORD) as u64).unwrap();
        if i % 16 != 15 {
            continue;
        }
        let durable = file.durable_len();
        assert!(durable <= file.len());
        backend.server_restart().unwrap().restart();
        let mut kept = vec![0u8; durable as usize];
        let n = reader.read_at(&mut kept, 0).unwrap();
        assert!(n as u64 == durable && holds_prefix(&kept, durable), "lost below {durable}");
        seen = seen.max(durable);
    }
    assert!(seen > 0, "background commits never made anything durable");
    file.fsync().unwrap();
    assert_eq!(file.durable_len(), (RECORDS * RECORD) as u64);
    assert_eq!(file.durable_ranges(), vec![0..(RECORDS * RECORD) as u64]);
}

/// A one-phase backend with a volatile write cache: what a power cut keeps of a file is its
/// image at its last `sync`.
#[derive(Debug)]
struct Volatile {
    inner: MemBackend,
    kept: Mutex<BTreeMap<String, Arc<Mutex<Vec<u8>>>>>,
}

#[derive(Debug)]
struct VolatileFile {
    inner: Arc<dyn BackendFile>,
    kept: Arc<Mutex<Vec<u8>>>,
}

impl Volatile {
    fn power_cut_keeps(&self, name: &str) -> Vec<u8> {
        self.kept.lock().get(name).map(|k| k.lock().clone()).unwrap_or_default()
    }
}

impl Backend for Volatile {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        let inner = self.inner.open(name, options)?;
        let kept = self.kept.lock().entry(name.to_owned()).or_default().clone();
        Ok(Arc::new(VolatileFile { inner, kept }))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        self.inner.exists(name)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

impl BackendFile for VolatileFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        self.inner.write_at(buf, offset)
    }
    fn commit(&self, offset: u64, len: u64) -> io::Result<CommitReply> {
        self.inner.commit(offset, len)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()?;
        let mut image = vec![0u8; self.inner.size()? as usize];
        let n = self.inner.read_at(&mut image, 0)?;
        image.truncate(n);
        *self.kept.lock() = image;
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
    fn set_size(&self, size: u64) -> io::Result<()> {
        self.inner.set_size(size)
    }
}

// A log writer on a backend with a volatile cache, synced now and then by `wait_durable` and
// `fsync`: `durable_len` stays within what a power cut keeps at every moment, grows only with
// syncs, and a watcher hears each growth.
#[test]
fn durable_len_stays_within_what_a_power_cut_keeps() {
    let backend = Arc::new(Volatile { inner: MemBackend::new(), kept: Mutex::default() });
    let ebb = small_cache(backend.clone());
    let file = Arc::new(ebb.open("log", CREATE).unwrap());
    let watch = file.durable_watch();
    let done = Arc::new(AtomicBool::new(false));
    let writer = append_log(file.clone(), done.clone());
    let mut syncs = 0;
    while !done.load(Ordering::SeqCst) {
        let durable = file.durable_len();
        assert!(holds_prefix(&backend.power_cut_keeps("log"), durable), "lost below {durable}");
        let target = file.len() / 2;
        file.wait_durable(target).unwrap();
        assert!(file.durable_len() >= target);
        syncs += 1;
    }
    writer.join().unwrap();
    assert!(syncs > 2, "only {syncs} syncs");
    let len = (RECORDS * RECORD) as u64;
    file.wait_durable(len).unwrap();
    assert_eq!(file.durable_len(), len);
    assert!(holds_prefix(&backend.power_cut_keeps("log"), len));
    let heard: Vec<u64> = watch.try_iter().collect();
    assert!(heard.windows(2).all(|w| w[0] < w[1]), "watch went back: {heard:?}");
    assert_eq!(heard.last(), Some(&len), "the watcher missed the end");
    assert_eq!(file.wait_durable(len + 1).unwrap_err().kind(), io::ErrorKind::InvalidInput);
}
