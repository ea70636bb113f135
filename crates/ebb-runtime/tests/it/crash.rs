//! A process writing through ebb is killed with SIGKILL between write and fsync: everything
//! fsync'ed is on disk, and what was lost is bounded by the memory budget.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use ebb_backend::OpenOptions;

const BUDGET: u64 = 32 << 20;
const CHUNK: usize = 1 << 20;
const SYNCED_LEN: usize = 16 << 20;

fn pattern(seed: u8, offset: usize, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        let x = offset + i;
        *b = (x as u8) ^ ((x >> 12) as u8) ^ seed;
    }
}

/// The child's body, run only by `sigkill_between_write_and_fsync` (as an ignored test of this
/// binary), which sets `EBB_CRASH_DIR` and kills it.
#[test]
#[ignore = "the child process of sigkill_between_write_and_fsync"]
fn crash_child() {
    let dir = std::env::var_os("EBB_CRASH_DIR").expect("EBB_CRASH_DIR names the directory");
    let ebb = ebb_runtime::Builder::new().memory(BUDGET).directory(&dir).unwrap().build().unwrap();
    let create = OpenOptions { create: true, truncate: true };
    let synced = ebb.open("synced", create).unwrap();
    let mut buf = vec![0u8; CHUNK];
    for i in 0..SYNCED_LEN / CHUNK {
        pattern(1, i * CHUNK, &mut buf);
        synced.write_at(&buf, (i * CHUNK) as u64).unwrap();
    }
    synced.fsync().unwrap();
    let mut err = std::io::stderr();
    writeln!(err, "SYNCED").unwrap();
    let unsynced = ebb.open("unsynced", create).unwrap();
    for i in 0.. {
        pattern(2, i * CHUNK, &mut buf);
        unsynced.write_at(&buf, (i * CHUNK) as u64).unwrap();
        writeln!(err, "WROTE {}", (i + 1) * CHUNK).unwrap();
    }
}

#[test]
fn sigkill_between_write_and_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash::crash_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env("EBB_CRASH_DIR", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut synced = false;
    let mut wrote = 0u64;
    // Kill once the child has written twice its budget past the fsync.
    while wrote < 2 * BUDGET {
        let Some(line) = lines.next() else { panic!("child ended early") };
        let line = line.unwrap();
        if line == "SYNCED" {
            synced = true;
        } else if let Some(n) = line.strip_prefix("WROTE ") {
            wrote = n.parse().unwrap();
        }
    }
    assert!(synced);
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();

    let on_disk = std::fs::read(dir.path().join("synced")).unwrap();
    assert_eq!(on_disk.len(), SYNCED_LEN, "fsync'ed file has the wrong size");
    let mut want = vec![0u8; SYNCED_LEN];
    pattern(1, 0, &mut want);
    assert!(on_disk == want, "fsync'ed data is not on disk intact");

    // Data not yet on disk at the kill is bounded by the budget: the cache never held more.
    let unsynced = std::fs::read(dir.path().join("unsynced")).unwrap();
    let mut page = vec![0u8; 4096];
    let mut intact = 0u64;
    for (i, got) in unsynced.chunks(4096).enumerate() {
        pattern(2, i * 4096, &mut page[..got.len()]);
        if got == &page[..got.len()] {
            intact += got.len() as u64;
        }
    }
    assert!(
        intact + BUDGET >= wrote,
        "only {intact} of {wrote} bytes written before the kill reached the disk: more than the \
         {BUDGET}-byte budget was held"
    );
}
