//! The S3 backend against a real versitygw (started through `scripts/s3-server`): the
//! conformance suite, then what only S3 has (invisible parts until sync, carried ranges, lost
//! uploads, journaled uploads aborted at the next start, errors with their S3 codes).

use std::io;
use std::sync::Arc;

use ebb_backend::s3::test_server::TestServer;
use ebb_backend::{Backend, BackendFile, OpenOptions, S3Backend, S3Options, errno_of};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };
const EXISTING: OpenOptions = OpenOptions { create: false, truncate: false };
const MIB: usize = 1 << 20;
/// The smallest layout, so that multi-part files stay small.
const PART: usize = 5 * MIB;

fn options(server: &TestServer, prefix: &str) -> S3Options {
    let mut options = server.options(prefix);
    options.part_size = PART as u64;
    options
}

fn backend(server: &TestServer, prefix: &str) -> S3Backend {
    S3Backend::open(options(server, prefix)).expect("open the S3 backend")
}

/// Bytes that differ with `seed` and position, never zero.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((seed.wrapping_mul(31) ^ i ^ (i >> 11)) % 251) as u8 + 1).collect()
}

fn read_all(file: &dyn BackendFile) -> Vec<u8> {
    let size = file.size().expect("size") as usize;
    let mut buf = vec![0; size];
    let mut done = 0;
    while done < size {
        let chunk = (size - done).min(PART);
        let count = file.read_at(&mut buf[done..done + chunk], done as u64).expect("read");
        assert_eq!(count, chunk, "short read at {done} of {size}");
        done += chunk;
    }
    buf
}

/// What another client sees: the object as the server holds it.
fn on_server(observer: &S3Backend, name: &str) -> Option<Vec<u8>> {
    let file = match observer.open(name, EXISTING) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
        Err(error) => panic!("observer open {name}: {error}"),
    };
    Some(read_all(&*file))
}

fn counter(backend: &S3Backend, name: &str) -> u64 {
    backend.counters().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v).expect(name)
}

ebb_backend::backend_conformance! {
    /// Every check but the two-phase one (S3 parts are stable writes), on handles of one
    /// backend; once every handle is gone, nothing may be left as a multipart upload.
    mod conformance_s3_versitygw {
        setup: {
            let server = TestServer::start("ebb-conformance")?;
            let shared = backend(&server, "conformance/");
        },
        backend: shared.clone(),
        skipped: [two_phase_commit_and_restart],
        after: {
            drop(shared);
            assert_eq!(backend(&server, "conformance/").multipart_uploads().unwrap(), []);
        },
    }
}

// Parts written back are invisible until sync, which makes the whole file visible at once.
#[test]
fn s3_parts_are_invisible_until_sync() {
    let Some(server) = TestServer::start("ebb-invisible") else { return };
    let writer = backend(&server, "");
    // Another client sees changes up to its metadata lifetime late: none here.
    let observer = S3Backend::open(S3Options {
        metadata_ttl: std::time::Duration::ZERO,
        ..options(&server, "")
    })
    .unwrap();
    let file = writer.open("stream", CREATE).unwrap();
    let data = pattern(1, 2 * PART + MIB);
    for (index, chunk) in data.chunks(PART).enumerate() {
        file.write_extent(
            (index * PART) as u64,
            chunk.len() as u64,
            &[((index * PART) as u64, chunk)],
        )
        .unwrap();
    }
    assert_eq!(on_server(&observer, "stream").unwrap(), b"", "parts visible before sync");
    assert_eq!(writer.multipart_uploads().unwrap().len(), 1);
    file.sync().unwrap();
    assert_eq!(on_server(&observer, "stream").unwrap(), data);
    assert_eq!(writer.multipart_uploads().unwrap(), []);
    // Streamed whole parts: each uploaded once, nothing read back, nothing copied.
    assert_eq!(counter(&writer, "upload_part_requests"), 3);
    assert_eq!(counter(&writer, "get_object_requests"), 0);
    assert_eq!(counter(&writer, "upload_part_copy_requests"), 0);
}

/// The counters of the requests a file's commit can make, in one tuple: PutObject,
/// CreateMultipartUpload, UploadPart, CompleteMultipartUpload, HeadObject.
fn commit_requests(backend: &S3Backend) -> [u64; 5] {
    [
        "put_object_requests",
        "create_multipart_upload_requests",
        "upload_part_requests",
        "complete_multipart_upload_requests",
        "head_object_requests",
    ]
    .map(|name| counter(backend, name))
}

// A small file (up to 1 MiB, no upload open) written back is kept whole until its commit,
// which is one PutObject: no upload, nothing visible before sync, reads and truncates served
// from the kept bytes. A file that outgrows it is committed at its old size and goes on as
// parts, its bytes intact.
#[test]
fn s3_small_file_is_committed_by_one_put() {
    let Some(server) = TestServer::start("ebb-small-put") else { return };
    let s3 = backend(&server, "");
    let observer = S3Backend::open(S3Options {
        metadata_ttl: std::time::Duration::ZERO,
        ..options(&server, "")
    })
    .unwrap();
    let file = s3.open("small", CREATE).unwrap();
    let before = commit_requests(&s3);
    let mut model = pattern(20, 10_000);
    file.write_at(&model, 0).unwrap();
    let patch = pattern(21, 100);
    file.write_at(&patch, 5000).unwrap();
    model[5000..5100].copy_from_slice(&patch);
    assert_eq!(commit_requests(&s3), before, "a request before the commit");
    assert_eq!(on_server(&observer, "small").unwrap(), b"", "visible before sync");
    assert_eq!(read_all(&*file), model, "the kept bytes, read back");
    file.set_size(8000).unwrap();
    model.truncate(8000);
    file.sync().unwrap();
    let after = commit_requests(&s3);
    assert_eq!(after, [before[0] + 1, before[1], before[2], before[3], before[4]]);
    assert_eq!(on_server(&observer, "small").unwrap(), model);
    assert_eq!(s3.multipart_uploads().unwrap(), []);

    // Kept, then outgrown: committed at its old size (one PutObject), then written as a part.
    let file = s3.open("grows", CREATE).unwrap();
    let head = pattern(22, 1000);
    file.write_at(&head, 0).unwrap();
    let tail = pattern(23, 2 * MIB);
    file.write_at(&tail, 1000).unwrap();
    assert_eq!(on_server(&observer, "grows").unwrap(), head, "not committed at its old size");
    file.sync().unwrap();
    let mut expected = head.clone();
    expected.extend_from_slice(&tail);
    assert_eq!(on_server(&observer, "grows").unwrap(), expected);
    assert_eq!(s3.multipart_uploads().unwrap(), []);
}

// A small overwrite in a large object carries the untouched parts by server-side copy.
#[test]
fn s3_overwrite_carries_untouched_parts_by_copy() {
    let Some(server) = TestServer::start("ebb-carry") else { return };
    let s3 = backend(&server, "");
    let file = s3.open("big", CREATE).unwrap();
    let mut model = pattern(2, 3 * PART + 1234);
    for (index, chunk) in model.chunks(PART).enumerate() {
        file.write_at(chunk, (index * PART) as u64).unwrap();
    }
    file.sync().unwrap();
    let copies_before = counter(&s3, "upload_part_copy_requests");
    let patch = pattern(3, 100);
    file.write_at(&patch, (PART + 10) as u64).unwrap();
    model[PART + 10..PART + 110].copy_from_slice(&patch);
    file.sync().unwrap();
    assert_eq!(
        counter(&s3, "upload_part_copy_requests") - copies_before,
        3,
        "parts 1, 3, 4 copied"
    );
    assert_eq!(on_server(&backend(&server, ""), "big").unwrap(), model);
}

// Bytes cut by a truncate read as zeros when the file grows again, before and after sync.
#[test]
fn s3_truncate_then_grow_reads_zeros() {
    let Some(server) = TestServer::start("ebb-truncate") else { return };
    let s3 = backend(&server, "");
    let file = s3.open("t", CREATE).unwrap();
    let data = pattern(4, PART + 5000);
    file.write_at(&data[..PART], 0).unwrap();
    file.write_at(&data[PART..], PART as u64).unwrap();
    file.sync().unwrap();
    file.set_size(1000).unwrap();
    file.set_size((PART + 5000) as u64).unwrap();
    let mut expected = vec![0; PART + 5000];
    expected[..1000].copy_from_slice(&data[..1000]);
    assert_eq!(read_all(&*file), expected);
    file.sync().unwrap();
    assert_eq!(on_server(&backend(&server, ""), "t").unwrap(), expected);
}

// The server losing the upload (here: aborted behind the backend's back) loses the parts
// written back to it; the next sync says so once, with EIO, and later writes work.
#[test]
fn s3_lost_upload_fails_the_next_sync_once() {
    let Some(server) = TestServer::start("ebb-lost") else { return };
    let s3 = backend(&server, "");
    let file = s3.open("lost", CREATE).unwrap();
    file.write_at(&pattern(5, PART), 0).unwrap();
    let uploads = s3.multipart_uploads().unwrap();
    assert_eq!(uploads.len(), 1);
    s3.abort_multipart_upload(&uploads[0].0, &uploads[0].1).unwrap();
    let later = pattern(6, 1000);
    file.write_at(&later, PART as u64).unwrap();
    let error = file.sync().expect_err("a sync after a lost upload must fail");
    assert_eq!(errno_of(&error), Some(5), "{error}");
    assert!(error.to_string().contains("lost upload"), "{error}");
    file.sync().expect("the loss is reported once");
    // The part written after the loss is there; the lost one reads as what the object had.
    let mut expected = vec![0; PART + 1000];
    expected[PART..].copy_from_slice(&later);
    assert_eq!(on_server(&backend(&server, ""), "lost").unwrap(), expected);
    assert_eq!(s3.multipart_uploads().unwrap(), []);
}

// An upload left by a process that died (its journal's lock free) is aborted at the next start.
#[test]
fn s3_journaled_uploads_of_a_dead_backend_are_aborted_at_start() {
    let Some(server) = TestServer::start("ebb-journal") else { return };
    let options = options(&server, "j/");
    let first = S3Backend::open(options.clone()).unwrap();
    let file = first.open("f", CREATE).unwrap();
    file.write_at(&pattern(7, PART), 0).unwrap();
    assert_eq!(first.multipart_uploads().unwrap().len(), 1);
    // A process that dies runs no destructor but the kernel releases its lock: leak the file
    // (so no commit runs) and drop the rest. The journal file closes with its backend's last
    // handle, which the leaked file keeps: simulate death by copying the journal aside.
    let state = options.state_dir.clone().unwrap();
    let journal = std::fs::read_dir(&state).unwrap().next().unwrap().unwrap().path();
    let copy = state.join("journal-1-dead.log");
    std::fs::copy(&journal, &copy).unwrap();
    std::mem::forget(file);
    std::mem::forget(first);
    let second = S3Backend::open(options).unwrap();
    assert_eq!(second.multipart_uploads().unwrap(), [], "the dead journal's upload survived");
    assert_eq!(counter(&second, "uploads_aborted_at_start"), 1);
    assert!(!copy.exists(), "the dead journal was not removed");
    assert!(journal.exists(), "the live journal was removed");
}

// Errors the engine must hold are mapped to their errnos with the S3 code in the message.
#[test]
fn s3_errors_name_the_code_and_map_to_errnos() {
    let Some(server) = TestServer::start("ebb-errors") else { return };
    let mut wrong_key = options(&server, "");
    wrong_key.credentials = Some(("nobody".to_owned(), "nothing".to_owned()));
    let error = S3Backend::open(wrong_key).expect_err("wrong credentials accepted");
    assert_eq!(errno_of(&error), Some(13), "{error}");
    let mut missing = options(&server, "");
    missing.bucket = "no-such-bucket".to_owned();
    let error = S3Backend::open(missing).expect_err("a missing bucket accepted");
    assert_eq!(errno_of(&error), Some(2), "{error}");
    assert!(error.to_string().contains("no-such-bucket"), "{error}");
    let error = S3Options::new("s3://Bad_Bucket", &server.endpoint()).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("Bad_Bucket"), "{error}");
}

// Several handles of one key share one state: a write through one is read through another.
#[test]
fn s3_handles_of_one_key_share_the_file() {
    let Some(server) = TestServer::start("ebb-handles") else { return };
    let s3 = backend(&server, "");
    let first: Arc<dyn BackendFile> = s3.open("shared", CREATE).unwrap();
    let second = s3.open("shared", EXISTING).unwrap();
    first.write_at(&pattern(8, 3000), 0).unwrap();
    assert_eq!(second.size().unwrap(), 3000);
    assert_eq!(read_all(&*second), pattern(8, 3000));
}

ebb_backend::namespace_conformance! {
    /// The bucket as a tree for the mount: the namespace suite, with what S3 cannot do skipped
    /// by the errnos the contract allows (modes EOPNOTSUPP, hard links EPERM, symlinks
    /// EOPNOTSUPP).
    ///
    /// FIXME: objects carry no mode yet (x-amz-meta-mode, kept through every upload, as s3fs
    /// does), so a file created with 0640 shows 0644: `create_lookup_getattr` fails today, and
    /// its test fails once that is fixed, to be taken off `failing`.
    mod namespace_conformance_s3_versitygw {
        setup: { let server = TestServer::start("ebb-namespace")?; },
        namespace: ebb_backend::S3Namespace::new(backend(&server, "tree/")),
        skipped: [setattr, hard_link, symlink],
        failing: [create_lookup_getattr],
    }
}

// Names over NAME_MAX (255 bytes) and paths whose key would pass S3's 1,024 bytes are refused
// with ENAMETOOLONG before anything is made: no object is left behind.
#[test]
fn names_and_keys_s3_cannot_hold_are_enametoolong() {
    use ebb_backend::{Credentials, Namespace, S3Namespace};
    use std::ffi::OsStr;
    let Some(server) = TestServer::start("ebb-names") else { return };
    let tree = S3Namespace::new(backend(&server, "names/"));
    let me = Credentials { uid: 0, gid: 0, groups: Vec::new() };
    let (root, _) = tree.root().unwrap();
    let name = |len: usize, c: char| std::iter::repeat_n(c, len).collect::<String>();
    let refused = |result: io::Result<_>| result.err().and_then(|e| e.raw_os_error());
    assert_eq!(refused(tree.create(&root, OsStr::new(&name(256, 'a')), 0o644, &me)), Some(36));
    assert_eq!(refused(tree.mkdir(&root, OsStr::new(&name(256, 'b')), 0o755, &me)), Some(36));
    tree.create(&root, OsStr::new(&name(255, 'c')), 0o644, &me).unwrap();
    // Directories of 200-byte names: the key "names/" + 5 of them + 4 slashes + the marker's
    // slash is 1,011 bytes; a sixth level (1,212) cannot be held.
    let mut dir = root.clone();
    for _ in 0..5 {
        dir = tree.mkdir(&dir, OsStr::new(&name(200, 'd')), 0o755, &me).unwrap().0;
    }
    assert_eq!(refused(tree.mkdir(&dir, OsStr::new(&name(200, 'e')), 0o755, &me)), Some(36));
    assert_eq!(refused(tree.create(&dir, OsStr::new(&name(20, 'f')), 0o644, &me)), Some(36));
    tree.create(&dir, OsStr::new(&name(10, 'g')), 0o644, &me).unwrap();
    let mut entries: Vec<_> = tree
        .readdir(&root)
        .unwrap()
        .map(|e| e.unwrap().name.to_string_lossy().len())
        .filter(|&len| len > 2)
        .collect();
    entries.sort_unstable();
    assert_eq!(entries, [200, 255], "only what was made: no object of a refused create");
    let mut deepest: Vec<_> = tree.readdir(&dir).unwrap().map(|e| e.unwrap().name).collect();
    deepest.retain(|n| n != "." && n != "..");
    assert_eq!(deepest, [OsStr::new(&name(10, 'g'))]);
}
