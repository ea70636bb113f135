//! Writeback throttling of a network backend (`ebb_backend::network_writeback_throttling`, the
//! NFS and S3 backends' setting): a server whose reads wait behind the writes it is serving,
//! as an NFS server's or an S3 gateway's do. While a reader's reads miss their target, wbt
//! lowers the background writes in flight to its floor; when the reads stop, it lets them
//! back up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ebb_backend::{
    Backend, BackendFile, Capabilities, CommitReply, MemBackend, NETWORK_WBT_MIN_DEPTH,
    OpenOptions, WriteReply, network_writeback_throttling,
};
use ebb_core::BackendConfig;
use ebb_runtime::{Builder, Ebb};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: true };
/// A write takes this long at the server.
const WRITE_TIME: Duration = Duration::from_millis(20);
/// A read takes this long alone, and [`READ_PER_WRITE`] more per write queued behind the one
/// the server is writing (it writes one at a time and serves a read after the queued ones).
const READ_TIME: Duration = Duration::from_micros(200);
const READ_PER_WRITE: Duration = Duration::from_millis(2);
/// The IO threads (the builder's default).
const IO_THREADS: u32 = 8;

/// The server: a `MemBackend` whose writes take [`WRITE_TIME`] and whose reads wait for the
/// writes queued at it; it counts the writes in flight.
#[derive(Debug)]
struct Server {
    inner: MemBackend,
    state: Arc<Load>,
}

#[derive(Debug, Default)]
struct Load {
    writes: AtomicU32,
}

impl Load {
    /// The mean of the writes in flight over `time`, sampled every millisecond.
    fn mean_writes(&self, time: Duration) -> f64 {
        let (start, mut sum, mut samples) = (Instant::now(), 0u64, 0u64);
        while start.elapsed() < time {
            sum += u64::from(self.writes.load(Ordering::SeqCst));
            samples += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        sum as f64 / samples.max(1) as f64
    }
}

#[derive(Debug)]
struct ServerFile {
    inner: Arc<dyn BackendFile>,
    state: Arc<Load>,
}

impl Backend for Server {
    fn open(&self, name: &str, options: OpenOptions) -> std::io::Result<Arc<dyn BackendFile>> {
        let inner = self.inner.open(name, options)?;
        Ok(Arc::new(ServerFile { inner, state: self.state.clone() }))
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
    fn exists(&self, name: &str) -> std::io::Result<bool> {
        self.inner.exists(name)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

impl BackendFile for ServerFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let queued = self.state.writes.load(Ordering::SeqCst).saturating_sub(1);
        std::thread::sleep(READ_TIME + READ_PER_WRITE * queued);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<WriteReply> {
        self.state.writes.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(WRITE_TIME);
        let reply = self.inner.write_at(buf, offset);
        self.state.writes.fetch_sub(1, Ordering::SeqCst);
        reply
    }
    fn commit(&self, offset: u64, len: u64) -> std::io::Result<CommitReply> {
        self.inner.commit(offset, len)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn size(&self) -> std::io::Result<u64> {
        self.inner.size()
    }
    fn set_size(&self, size: u64) -> std::io::Result<()> {
        self.inner.set_size(size)
    }
}

/// Waits (at most a minute: a hang fails) until `done`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within a minute");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wbt_max_depth(ebb: &Ebb) -> u32 {
    ebb.stats().bdi[0].wbt_max_depth
}

/// Clears its flags when dropped, so the reader and writer stop also when a check fails.
struct Stop<'a>(&'a [&'a AtomicBool]);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.iter().for_each(|flag| flag.store(false, Ordering::Relaxed));
    }
}

#[test]
fn reads_missing_their_target_lower_the_writes_in_flight_until_they_stop() {
    let load = Arc::new(Load::default());
    let server = Server { inner: MemBackend::new(), state: load.clone() };
    let read_file = server.open("r", CREATE).unwrap();
    read_file.write_at(&vec![7u8; 1 << 20], 0).unwrap();
    // The settings an NFS backend gets: WRITEs of 1 MiB, its own queue, wbt as the network
    // backends have it.
    let mut config = BackendConfig::new("server");
    config.max_write_pages = 256;
    network_writeback_throttling(&mut config);
    let ebb = Builder::new()
        .memory(64 << 20)
        .backend_with("server", Arc::new(server), config)
        .build()
        .unwrap();
    let reader_file = ebb.open("r", OpenOptions { create: false, truncate: false }).unwrap();
    let writer_file = ebb.open("w", CREATE).unwrap();
    let (reading, writing) = (AtomicBool::new(true), AtomicBool::new(true));
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = vec![0u8; 4096];
            let mut page = 0u64;
            while reading.load(Ordering::Relaxed) {
                page = (page * 7 + 13) % 256;
                reader_file.read_direct_at(&mut buf, page * 4096).unwrap();
            }
        });
        let _stop = Stop(&[&reading, &writing]);
        // The reader alone first: wbt learns the server's idle read latency.
        std::thread::sleep(Duration::from_millis(500));
        s.spawn(|| {
            let block = vec![3u8; 1 << 20];
            let mut at = 0u64;
            while writing.load(Ordering::Relaxed) {
                writer_file.write_at(&block, at % (64 << 20)).unwrap();
                at += 1 << 20;
            }
        });
        // Beside the reader the writes hold the reads up: wbt scales to its floor, and the
        // background writes in flight stay about there.
        wait_until("wbt scaled down to its floor", || wbt_max_depth(&ebb) == 1);
        let beside_reads = load.mean_writes(Duration::from_secs(1));
        let depth = wbt_max_depth(&ebb);
        // The reads stop: wbt restores the writes in flight, to every IO thread.
        reading.store(false, Ordering::Relaxed);
        wait_until("wbt restored its depth", || wbt_max_depth(&ebb) >= IO_THREADS);
        eprintln!("writes in flight beside the reads: {beside_reads:.2}");
        assert!(
            beside_reads <= f64::from(NETWORK_WBT_MIN_DEPTH) + 0.5,
            "{beside_reads:.2} writes in flight beside the reads (wbt's floor \
             {NETWORK_WBT_MIN_DEPTH}, depth {depth} after)"
        );
        // The writes in flight grow again, to twice the floor and more (with them the
        // writer's rate, which follows the writeback's, and so on up to the IO threads).
        wait_until("the writes in flight restored", || {
            let alone = load.mean_writes(Duration::from_millis(500));
            eprintln!("writes in flight alone: {alone:.2}");
            alone >= f64::from(2 * NETWORK_WBT_MIN_DEPTH)
        });
        writing.store(false, Ordering::Relaxed);
    });
    writer_file.fsync().unwrap();
}
