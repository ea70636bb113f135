//! Tests that need the crate's insides: a data path whose writes wait at a gate stands for a
//! writer that ebb throttles for as long as the test wants.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::Mount;
use crate::data::{DataFile, DataPath, Opener, PassthroughData};

/// Writes whose data starts with `BLOCK` wait until the gate opens.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl Gate {
    fn wait_for_blocked(&self, count: usize) {
        let mut state = self.state.lock();
        while state.1 < count {
            self.changed.wait(&mut state);
        }
    }

    fn open(&self) {
        self.state.lock().0 = true;
        self.changed.notify_all();
    }
}

struct GatedData(Arc<Gate>);

struct GatedFile(Box<dyn DataFile>, Arc<Gate>);

impl DataPath for GatedData {
    fn attach(&self, key: u64, open: Opener<'_>) -> io::Result<Box<dyn DataFile>> {
        let file = PassthroughData.attach(key, open)?;
        Ok(Box::new(GatedFile(file, Arc::clone(&self.0))))
    }
    fn sync(&self) -> io::Result<()> {
        PassthroughData.sync()
    }
    fn drain(&self, deadline: Duration, progress: &mut dyn FnMut(&str, bool)) -> io::Result<()> {
        PassthroughData.drain(deadline, progress)
    }
    fn unwritten(&self) -> String {
        String::new()
    }
    fn stats_json(&self) -> String {
        "{}".to_owned()
    }
}

impl DataFile for GatedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_direct_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if buf.starts_with(b"BLOCK") {
            let mut state = self.1.state.lock();
            state.1 += 1;
            self.1.changed.notify_all();
            while !state.0 {
                self.1.changed.wait(&mut state);
            }
        }
        self.0.write_at(buf, offset)
    }
    fn set_len(&self, size: u64) -> io::Result<()> {
        self.0.set_len(size)
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn fsync(&self) -> io::Result<()> {
        self.0.fsync()
    }
    fn close(self: Box<Self>) -> io::Result<()> {
        self.0.close()
    }
}

/// A mount of a fresh directory whose data path holds writes at `gate` (two copies of write
/// requests kept): the temporary root (kept alive by the caller), the mountpoint, the gate and
/// the mount.
fn gated_mount(prefix: &str) -> (tempfile::TempDir, std::path::PathBuf, Arc<Gate>, Mount) {
    let root = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").unwrap();
    let (dir, mnt) = (root.path().join("dir"), root.path().join("mnt"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let gate = Arc::new(Gate::default());
    let data = Arc::new(GatedData(Arc::clone(&gate)));
    let namespace = ebb_backend::DirNamespace::open_buffered(&dir).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    let fuse_loop = crate::FuseLoop::from_env().unwrap().unwrap_or_default();
    let kept = (crate::fs::ANCHOR_LIMIT, 2);
    let mount = Mount::start_with(namespace, &mnt, data, false, kept, fuse_loop).unwrap();
    (root, mnt, gate, mount)
}

// While several writers are held inside their write (as ebb holds a throttled writer), other
// processes still stat, create, write, read and list: a paused write holds only its own request.
// (The 120 s bound is a hang detector, not a speed check: the work takes milliseconds.)
#[test]
fn held_writers_do_not_block_other_requests() {
    if !Path::new("/dev/fuse").exists() {
        // Under CI the machine must have FUSE: a skip there would count as a pass.
        assert!(std::env::var_os("CI").is_none(), "/dev/fuse is missing, and CI is set");
        eprintln!("SKIPPED: /dev/fuse is missing, so FUSE cannot be mounted here");
        return;
    }
    let (root, mnt, gate, mount) = gated_mount("ebb-fuse-gate");
    const HELD: usize = 3;
    let writers: Vec<_> = (0..HELD)
        .map(|i| {
            let path = mnt.join(format!("held{i}"));
            std::thread::spawn(move || {
                let file = std::fs::File::create(path).unwrap();
                file.write_all_at(b"BLOCKED WRITE", 0).unwrap();
            })
        })
        .collect();
    gate.wait_for_blocked(HELD);
    let (done, finished) = mpsc::channel();
    let other = mnt.clone();
    std::thread::spawn(move || {
        let path = other.join("free");
        std::fs::write(&path, b"not held").unwrap();
        let read = std::fs::read(&path).unwrap();
        let listed = std::fs::read_dir(&other).unwrap().count();
        let size = std::fs::metadata(&path).unwrap().len();
        let _ = done.send((read, listed, size));
    });
    let (read, listed, size) = finished
        .recv_timeout(Duration::from_secs(120))
        .expect("requests of other processes must be served while writers are held");
    assert_eq!(read, b"not held");
    assert_eq!(listed, HELD + 1);
    assert_eq!(size, 8);
    gate.open();
    for writer in writers {
        writer.join().unwrap();
    }
    mount.unmount().unwrap();
    for i in 0..HELD {
        assert_eq!(
            std::fs::read(root.path().join("dir").join(format!("held{i}"))).unwrap(),
            b"BLOCKED WRITE"
        );
    }
}

// Writers held inside their write (as throttled writers are) each keep a copy of their
// request, and the copies stay within their bound: with room for two requests of 256 KiB, a
// third such writer waits in the kernel, its request unread, until a held one ends; then it is
// served. Before the bound every held writer had a copy of its own however many there were
// (263 with 256 writers on a `--memory 64MiB` mount: about 16 MB beside its 8 MiB).
#[test]
fn copies_of_held_writes_stay_within_their_bound() {
    if !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("CI").is_none(), "/dev/fuse is missing, and CI is set");
        eprintln!("SKIPPED: /dev/fuse is missing, so FUSE cannot be mounted here");
        return;
    }
    // Only a wait that ends by itself counts here, never the bound's way out.
    crate::pool::set_copy_wait(Duration::from_secs(3600));
    let (root, mnt, gate, mount) = gated_mount("ebb-fuse-copies");
    let request = |i: u8| {
        let mut data = vec![i; 256 << 10];
        data[..5].copy_from_slice(b"BLOCK");
        data
    };
    let writers: Vec<_> = (0..3u8)
        .map(|i| {
            let (path, data) = (mnt.join(format!("held{i}")), request(i));
            std::thread::spawn(move || {
                let file = std::fs::File::create(path).unwrap();
                file.write_all_at(&data, 0).unwrap();
            })
        })
        .collect();
    gate.wait_for_blocked(2);
    let copies = || {
        let stats: serde_json::Value = serde_json::from_str(&mount.stats_json()).unwrap();
        stats["fuse"]["copies"].clone()
    };
    let start = std::time::Instant::now();
    while copies()["waits"] == 0 {
        assert!(start.elapsed() < Duration::from_secs(120), "no copy waited: {}", copies());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(gate.state.lock().1, 2, "a third held write got a copy beyond the bound");
    gate.open();
    for writer in writers {
        writer.join().unwrap();
    }
    let copies = copies();
    assert_eq!((copies["beyond"].as_u64(), copies["limit"].as_u64()), (Some(0), Some(512 << 10)));
    assert!(copies["peak"].as_u64().unwrap() <= 512 << 10, "{copies}");
    mount.unmount().unwrap();
    for i in 0..3u8 {
        assert!(
            std::fs::read(root.path().join("dir").join(format!("held{i}"))).unwrap() == request(i),
            "held{i}"
        );
    }
}

// A mount sets an eighth of its budget aside for copies of write requests (256 KiB each),
// 2 to 82 of them.
#[test]
fn request_copies_are_an_eighth_of_the_budget_within_bounds() {
    use crate::fs::kept_request_copies;
    let mib = 1 << 20;
    assert_eq!(kept_request_copies(Some(mib)), 2);
    assert_eq!(kept_request_copies(Some(16 * mib)), 8);
    assert_eq!(kept_request_copies(Some(64 * mib)), 32);
    assert_eq!(kept_request_copies(Some(256 * mib)), 82);
    assert_eq!(kept_request_copies(None), 82);
}

// The runtime gets the budget less the process's own memory (the code it maps, the rest a
// fixed part and 1/64) and the request copies; a budget that leaves nothing gives it nothing
// (the runtime's refusal then names the smallest).
#[test]
fn the_cache_budget_leaves_the_process_its_own_memory() {
    use crate::runtime::{cache_budget, mapped_code_bytes, process_reserve};
    let mib = 1 << 20;
    let code = mapped_code_bytes();
    assert!((1 << 20..1 << 30).contains(&code), "{code} bytes of code mapped");
    assert_eq!(process_reserve(256 * mib) - process_reserve(0), 4 * mib);
    assert!(process_reserve(0) > code);
    let copies = 82 * (256 << 10);
    assert_eq!(cache_budget(256 * mib), 256 * mib - process_reserve(256 * mib) - copies);
    assert_eq!(cache_budget(1024 * mib), 1024 * mib - process_reserve(1024 * mib) - copies);
    assert_eq!(cache_budget(8 * mib), 0);
}

// The code a process maps is the sum of its executable file mappings; anonymous and
// non-executable ones do not count.
#[test]
fn mapped_code_is_the_executable_file_mappings() {
    use crate::runtime::executable_file_bytes;
    let maps = "\
5600a000-5600b000 r--p 00000000 fd:01 1234 /usr/bin/ebb
5600b000-5610b000 r-xp 00001000 fd:01 1234 /usr/bin/ebb
5610b000-5611b000 rw-p 00101000 fd:01 1234 /usr/bin/ebb
7f000000-7f200000 rw-p 00000000 00:00 0
7f200000-7f300000 r-xp 00028000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd000-7ffe000 r-xp 00000000 00:00 0 [vdso]
";
    assert_eq!(executable_file_bytes(maps), Some((1 << 20) + (1 << 20)));
    assert_eq!(executable_file_bytes("7f000000-7f200000 rw-p 00000000 00:00 0\n"), None);
}
