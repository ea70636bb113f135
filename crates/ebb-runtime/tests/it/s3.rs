//! ebb over the S3 backend against a real versitygw: random operations checked byte for byte
//! against a model; the process SIGKILLed mid-upload and restarted; the server restarted
//! mid-upload.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use ebb_backend::s3::test_server::TestServer;
use ebb_backend::{Backend, OpenOptions, S3Backend, S3Options};

const MIB: usize = 1 << 20;
/// The smallest part layout, so that files of a few parts stay small.
const PART: u64 = 5 << 20;
/// A budget of an 8 MiB cache beside one part's IO buffer.
const SMALL_BUDGET: u64 = 8 * MIB as u64 + PART;
const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };
const EXISTING: OpenOptions = OpenOptions { create: false, truncate: false };

fn options(server: &TestServer) -> S3Options {
    let mut options = server.options("files/");
    options.part_size = PART;
    options
}

fn ebb_on(backend: &S3Backend, memory: u64) -> ebb_runtime::Ebb {
    ebb_runtime::Builder::new()
        .memory(memory)
        .s3_backend("s3", backend.clone())
        .build()
        .expect("build ebb on S3")
}

/// The object as the server holds it (a fresh backend, so nothing cached), `None` if missing.
fn on_server(server: &TestServer, name: &str) -> Option<Vec<u8>> {
    let observer = S3Backend::open(options(server)).unwrap();
    let file = match observer.open(name, EXISTING) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => panic!("observer open {name}: {error}"),
    };
    let size = file.size().unwrap() as usize;
    let mut data = vec![0; size];
    for start in (0..size).step_by(PART as usize) {
        let end = (start + PART as usize).min(size);
        assert_eq!(file.read_at(&mut data[start..end], start as u64).unwrap(), end - start);
    }
    Some(data)
}

/// A small deterministic generator (xorshift), seeded per run.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// One file under test and its model.
struct Checked {
    name: String,
    file: Option<ebb_runtime::File>,
    model: Vec<u8>,
}

const FILE_BYTES_MAX: u64 = 12 << 20;

/// Runs `steps` random operations on two files and checks every read against the model.
fn random_operations(ebb: &ebb_runtime::Ebb, seed: u64, steps: usize) -> Vec<Checked> {
    let mut random = Random(seed | 1);
    let mut files: Vec<Checked> = (0..2)
        .map(|index| {
            let name = format!("random-{seed}-{index}");
            let file = Some(ebb.open(&name, CREATE).unwrap());
            Checked { name, file, model: Vec::new() }
        })
        .collect();
    for step in 0..steps {
        let checked = &mut files[random.below(2) as usize];
        let file = checked.file.as_ref().unwrap();
        let context = format!("seed {seed} step {step} file {}", checked.name);
        match random.below(100) {
            0..55 => {
                let len = if random.below(4) == 0 {
                    random.below(3 * MIB as u64)
                } else {
                    random.below(64 << 10)
                } + 1;
                let offset = random.below(FILE_BYTES_MAX - len);
                let data = random.bytes(len as usize);
                file.write_at(&data, offset).unwrap_or_else(|e| panic!("{context}: write: {e}"));
                let end = (offset + len) as usize;
                if checked.model.len() < end {
                    checked.model.resize(end, 0);
                }
                checked.model[offset as usize..end].copy_from_slice(&data);
            }
            55..65 => {
                let size = random.below(FILE_BYTES_MAX);
                file.set_len(size).unwrap_or_else(|e| panic!("{context}: set_len {size}: {e}"));
                checked.model.resize(size as usize, 0);
            }
            65..75 => file.fsync().unwrap_or_else(|e| panic!("{context}: fsync: {e}")),
            75..82 => {
                checked
                    .file
                    .take()
                    .unwrap()
                    .close()
                    .unwrap_or_else(|e| panic!("{context}: close: {e}"));
                checked.file = Some(
                    ebb.open(&checked.name, EXISTING)
                        .unwrap_or_else(|e| panic!("{context}: reopen: {e}")),
                );
            }
            _ => {
                let model = &checked.model;
                assert_eq!(file.len(), model.len() as u64, "{context}: size");
                let offset = random.below(model.len() as u64 + 1) as usize;
                let len = random.below(2 * MIB as u64) as usize;
                let mut buf = vec![0; len];
                let count = file
                    .read_at(&mut buf, offset as u64)
                    .unwrap_or_else(|e| panic!("{context}: read: {e}"));
                let expected = &model[offset.min(model.len())..(offset + len).min(model.len())];
                assert!(
                    &buf[..count] == expected,
                    "{context}: read of {len} at {offset} differs from the model"
                );
            }
        }
    }
    files
}

// Random writes, truncates, fsyncs, reopens and reads through ebb on S3 with a cache smaller
// than the files' total, so pages are written back, reclaimed and read again from the server:
// every read matches the model, and after the last fsync so do the objects.
#[test]
fn s3_random_operations_match_the_model() {
    let Some(server) = TestServer::start("ebb-random") else { return };
    let backend = S3Backend::open(options(&server)).unwrap();
    for seed in [1, 2] {
        let ebb = ebb_on(&backend, SMALL_BUDGET);
        let files = random_operations(&ebb, seed, 150);
        for checked in &files {
            checked.file.as_ref().unwrap().fsync().unwrap();
        }
        for checked in files {
            let on_server = on_server(&server, &checked.name).expect("object missing");
            assert!(
                on_server == checked.model,
                "seed {seed}: {} on the server differs from the model ({} bytes, model {})",
                checked.name,
                on_server.len(),
                checked.model.len()
            );
            checked.file.unwrap().close().unwrap();
        }
        drop(ebb);
    }
    eprintln!("S3 requests: {:?}", backend.counters());
    assert_eq!(backend.multipart_uploads().unwrap(), [], "uploads left after every fsync");
}

const CRASH_BUDGET: u64 = 16 << 20;
const SYNCED_LEN: usize = 12 << 20;

fn pattern(seed: u8, offset: usize, out: &mut [u8]) {
    for (index, byte) in out.iter_mut().enumerate() {
        let x = offset + index;
        *byte = ((x as u8) ^ ((x >> 12) as u8) ^ seed) | 1;
    }
}

/// The child's body, run only by `s3_sigkill_mid_upload_then_restart` (as an ignored test of
/// this binary), which passes the server and state directory and kills it.
#[test]
#[ignore = "the child process of s3_sigkill_mid_upload_then_restart"]
fn s3_crash_child() {
    let endpoint = std::env::var("EBB_S3_ENDPOINT").expect("EBB_S3_ENDPOINT");
    let state = std::env::var("EBB_S3_STATE").expect("EBB_S3_STATE");
    let mut options = S3Options::new("s3://ebb-crash/files/", &endpoint).unwrap();
    options.credentials = Some((
        ebb_backend::s3::test_server::ACCESS_KEY_ID.to_owned(),
        ebb_backend::s3::test_server::SECRET_ACCESS_KEY.to_owned(),
    ));
    options.state_dir = Some(state.into());
    options.part_size = PART;
    let ebb = ebb_on(&S3Backend::open(options).unwrap(), CRASH_BUDGET);
    let synced = ebb.open("synced", CREATE).unwrap();
    let mut buf = vec![0u8; MIB];
    for index in 0..SYNCED_LEN / MIB {
        pattern(1, index * MIB, &mut buf);
        synced.write_at(&buf, (index * MIB) as u64).unwrap();
    }
    synced.fsync().unwrap();
    let mut err = std::io::stderr();
    writeln!(err, "SYNCED").unwrap();
    // Overwrite the synced file without fsync, then stream another file until killed.
    for index in 0..SYNCED_LEN / MIB {
        pattern(2, index * MIB, &mut buf);
        synced.write_at(&buf, (index * MIB) as u64).unwrap();
    }
    let unsynced = ebb.open("unsynced", CREATE).unwrap();
    for index in 0.. {
        pattern(3, index * MIB, &mut buf);
        unsynced.write_at(&buf, (index * MIB) as u64).unwrap();
        writeln!(err, "WROTE {}", (index + 1) * MIB).unwrap();
    }
}

// ebb killed with SIGKILL while parts are being uploaded: what was fsync'ed is in the bucket,
// every visible byte is one that was written, and the next start leaves no upload behind.
#[test]
fn s3_sigkill_mid_upload_then_restart() {
    let Some(server) = TestServer::start("ebb-crash") else { return };
    let options = options(&server);
    let state = options.state_dir.clone().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "s3::s3_crash_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env("EBB_S3_ENDPOINT", server.endpoint())
        .env("EBB_S3_STATE", &state)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut synced = false;
    let mut wrote = 0u64;
    while wrote < 3 * CRASH_BUDGET {
        let Some(line) = lines.next() else { panic!("the child ended early") };
        let line = line.unwrap();
        if line == "SYNCED" {
            synced = true;
        } else if let Some(count) = line.strip_prefix("WROTE ") {
            wrote = count.parse().unwrap();
        }
    }
    assert!(synced);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let observer = S3Backend::open({
        let mut other = options.clone();
        other.state_dir = Some(state.join("observer"));
        other
    })
    .unwrap();
    let left = observer.multipart_uploads().unwrap();
    assert!(
        !left.is_empty(),
        "no upload was open at the kill: the test did not test a crash mid-upload"
    );

    // Every byte of the fsync'ed file is the fsync'ed one or the later overwrite's.
    let synced = on_server(&server, "synced").expect("the fsync'ed object is missing");
    assert_eq!(synced.len(), SYNCED_LEN);
    let (mut first, mut second) = (vec![0u8; SYNCED_LEN], vec![0u8; SYNCED_LEN]);
    pattern(1, 0, &mut first);
    pattern(2, 0, &mut second);
    for (index, byte) in synced.iter().enumerate() {
        assert!(
            *byte == first[index] || *byte == second[index],
            "byte {index} of the fsync'ed file is neither version"
        );
    }
    // The streamed file shows only bytes written (or holes: write-back order is free).
    if let Some(unsynced) = on_server(&server, "unsynced") {
        let mut expected = vec![0u8; unsynced.len()];
        pattern(3, 0, &mut expected);
        for (index, byte) in unsynced.iter().enumerate() {
            assert!(
                *byte == expected[index] || *byte == 0,
                "byte {index} of the unsynced file was never written"
            );
        }
    }

    // The restart (a new backend on the same state directory) aborts the dead process's uploads.
    let restarted = S3Backend::open(options).unwrap();
    assert_eq!(restarted.multipart_uploads().unwrap(), [], "uploads left over after the restart");
}

// The server stops and starts again while ebb writes back a file bigger than its cache: the
// writer is throttled meanwhile, ebb retries, and nothing is lost.
#[test]
fn s3_server_restart_mid_upload_loses_nothing() {
    let Some(server) = TestServer::start("ebb-restart") else { return };
    let backend = S3Backend::open(options(&server)).unwrap();
    let ebb = ebb_on(&backend, SMALL_BUDGET);
    let file = ebb.open("through-restart", CREATE).unwrap();
    let total = 24 * MIB;
    let mut buf = vec![0u8; MIB];
    let mut expected = vec![0u8; total];
    pattern(4, 0, &mut expected);
    for index in 0..total / MIB {
        if index == 8 {
            server.stop().unwrap();
            std::thread::spawn({
                let restart = TestServer::script();
                let dir = server.root().parent().unwrap().to_owned();
                let endpoint = server.endpoint();
                move || {
                    std::thread::sleep(std::time::Duration::from_millis(1500));
                    let port = endpoint.rsplit(':').next().unwrap().to_owned();
                    let status = Command::new("bash")
                        .arg(restart)
                        .args(["start", dir.to_str().unwrap(), "--port", &port])
                        .env("AWS_ACCESS_KEY_ID", ebb_backend::s3::test_server::ACCESS_KEY_ID)
                        .env(
                            "AWS_SECRET_ACCESS_KEY",
                            ebb_backend::s3::test_server::SECRET_ACCESS_KEY,
                        )
                        .stdout(Stdio::null())
                        .status()
                        .unwrap();
                    assert!(status.success(), "restarting versitygw failed");
                }
            });
        }
        buf.copy_from_slice(&expected[index * MIB..(index + 1) * MIB]);
        file.write_at(&buf, (index * MIB) as u64).unwrap();
    }
    // A write-back error while the server was down is reported once (errseq); the data stays
    // dirty and is written again, so the next fsync succeeds.
    if let Err(error) = file.fsync() {
        eprintln!("first fsync after the restart reported: {error}");
        file.fsync().expect("the second fsync after a server restart");
    }
    assert!(
        on_server(&server, "through-restart").unwrap() == expected,
        "data lost across the server restart"
    );
    let retries = backend.counters().into_iter().find(|(name, _)| *name == "retries").unwrap().1;
    assert!(0 < retries, "no request failed: the server restart did not hit an upload");
    file.close().unwrap();
    drop(ebb);
    assert_eq!(backend.multipart_uploads().unwrap(), []);
}

/// The backend's counter `name`.
fn counter(backend: &S3Backend, name: &str) -> u64 {
    backend.counters().into_iter().find(|(n, _)| *n == name).map_or(0, |(_, value)| value)
}

/// CompleteMultipartUploads and bytes copied by UploadPartCopy so far.
/// Commits (CompleteMultipartUpload, or the PutObject of a small file: a create's empty
/// PutObject counts too, so count after the open) and bytes copied by UploadPartCopy.
fn commits_and_copies(backend: &S3Backend) -> (u64, u64) {
    let commits = counter(backend, "complete_multipart_upload_requests")
        + counter(backend, "put_object_requests");
    (commits, counter(backend, "bytes_copied"))
}

// Issue 39: scattered 4 KiB overwrites of an object, then fsync: one commit, each touched part
// uploaded once and each untouched part copied once (bytes copied at most the object's size),
// the object right after. Each further dirty stretch of a part used to be a write of its own,
// and each forced a commit copying the whole object (154 commits for 200 writes).
#[test]
fn s3_random_overwrite_then_fsync_commits_once() {
    let Some(server) = TestServer::start("ebb-overwrite") else { return };
    let backend = S3Backend::open(options(&server)).unwrap();
    let size = 64 * MIB;
    let mut model = vec![0u8; size];
    pattern(6, 0, &mut model);
    {
        let direct = backend.open("overwrite", CREATE).unwrap();
        for start in (0..size).step_by(PART as usize) {
            let end = (start + PART as usize).min(size);
            direct.write_at(&model[start..end], start as u64).unwrap();
        }
        direct.sync().unwrap();
    }
    let ebb = ebb_on(&backend, 16 * MIB as u64 + PART);
    let file = ebb.open("overwrite", EXISTING).unwrap();
    let before = commits_and_copies(&backend);
    let mut random = Random(39);
    for _ in 0..200 {
        let offset = random.below((size / 4096) as u64) as usize * 4096;
        let data = random.bytes(4096);
        model[offset..offset + 4096].copy_from_slice(&data);
        file.write_at(&data, offset as u64).unwrap();
    }
    file.fsync().unwrap();
    let after = commits_and_copies(&backend);
    let (commits, copied) = (after.0 - before.0, after.1 - before.1);
    eprintln!("fsync of 200 scattered pages: {commits} commits, {copied} bytes copied");
    assert_eq!(commits, 1, "CompleteMultipartUploads for one fsync");
    assert!(copied <= size as u64, "{copied} bytes copied for an object of {size}");
    file.close().unwrap();
    assert_eq!(commits_and_copies(&backend), after, "close after the fsync committed again");
    drop(ebb);
    assert!(on_server(&server, "overwrite").unwrap() == model, "the object differs");
    assert_eq!(backend.multipart_uploads().unwrap(), []);
}

// Issue 39: a file whose size is not a multiple of 4096 is committed once by fsync, and
// close after it commits nothing more. Writeback wrote the last page whole and trimmed after,
// which re-uploaded the last part at its true length in a second commit copying the rest.
#[test]
fn s3_odd_sizes_commit_once() {
    let Some(server) = TestServer::start("ebb-odd-sizes") else { return };
    let backend = S3Backend::open(options(&server)).unwrap();
    // A cache whose dirty limits hold several parts, so that background writeback sends whole
    // parts (a smaller one writes parts in pieces, each further piece a commit of its own).
    let ebb = ebb_on(&backend, 64 * MIB as u64 + PART);
    for size in [30_000, 100_000, 64 * MIB + 100] {
        let name = format!("odd-{size}");
        let mut model = vec![0u8; size];
        pattern(7, 0, &mut model);
        let file = ebb.open(&name, CREATE).unwrap();
        let before = commits_and_copies(&backend);
        for start in (0..size).step_by(MIB) {
            let end = (start + MIB).min(size);
            file.write_at(&model[start..end], start as u64).unwrap();
        }
        file.fsync().unwrap();
        let synced = commits_and_copies(&backend);
        file.close().unwrap();
        let closed = commits_and_copies(&backend);
        eprintln!("{size} bytes: {before:?} -> fsync {synced:?} -> close {closed:?}");
        assert_eq!(synced.0 - before.0, 1, "{size} bytes: commits by the fsync");
        assert_eq!(closed, synced, "{size} bytes: close after the fsync committed or copied");
        assert!(on_server(&server, &name).unwrap() == model, "{size} bytes: the object differs");
    }
    drop(ebb);
    assert_eq!(backend.multipart_uploads().unwrap(), []);
}
