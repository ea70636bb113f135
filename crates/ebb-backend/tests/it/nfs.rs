//! The NFS backend against a real nfs-ganesha started through `scripts/nfs-server`: the
//! conformance suite, and what the suite cannot see (the export's files on disk, error codes,
//! verifiers across a server restart, an outage, the counters).

use std::collections::BTreeMap;
use std::io;

use ebb_backend::{Backend, NfsBackend, NfsServer, OpenOptions, Stability, errno_of};

const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };
const EXISTING: OpenOptions = OpenOptions { create: false, truncate: false };

/// A server for one test, or `None` (with SKIPPED on stderr) when ganesha is not installed;
/// under `CI` a missing server fails the test instead.
fn server(test: &str) -> Option<NfsServer> {
    if !NfsServer::available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: nfs-ganesha is not installed (scripts/setup installs it)"
        );
        eprintln!("SKIPPED {test}: nfs-ganesha is not installed (scripts/setup installs it)");
        return None;
    }
    Some(NfsServer::start().expect("start nfs-ganesha"))
}

fn counters(backend: &NfsBackend) -> BTreeMap<&'static str, u64> {
    backend.counters().into_iter().collect()
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|index| seed.wrapping_add((index % 251) as u8)).collect()
}

ebb_backend::backend_conformance! {
    /// Everything passes but the restart part of the two-phase check (a real server has no
    /// restart hook; the tests below restart the real one).
    mod conformance_nfs_ganesha {
        setup: { let server = server("conformance_nfs_ganesha")?; },
        backend: NfsBackend::connect(server.url()).expect("connect to ganesha"),
        skipped: [two_phase_commit_and_restart],
    }
}

// What the backend writes and commits is the file on the server's disk, byte for byte, and
// the counters say how it got there: UNSTABLE WRITEs of at most wsize, one COMMIT.
#[test]
fn written_files_are_on_the_export() {
    let Some(server) = server("written_files_are_on_the_export") else { return };
    let backend = NfsBackend::connect(server.url()).unwrap();
    assert_eq!(backend.capabilities().max_io_bytes, 1 << 20, "ganesha's wtmax and rtmax");
    assert!(backend.capabilities().two_phase);
    let file = backend.open("data", CREATE).unwrap();
    let data = bytes(7, 3 << 20);
    let mut verifiers = Vec::new();
    for (index, piece) in data.chunks(1 << 20).enumerate() {
        match file.write_at(piece, (index << 20) as u64).unwrap().stability {
            Stability::Unstable { verifier } => verifiers.push(verifier),
            Stability::Stable => panic!("ganesha answered an UNSTABLE write as stable"),
        }
    }
    file.set_size(data.len() as u64 - 100).unwrap();
    let commit = file.commit(0, 0).unwrap();
    assert!(verifiers.iter().all(|verifier| *verifier == commit.verifier), "{verifiers:?}");
    let on_disk = std::fs::read(server.export_dir().join("data")).unwrap();
    assert_eq!(on_disk.len(), data.len() - 100);
    assert!(on_disk == data[..data.len() - 100], "the export's file differs from what was written");
    let counters = counters(&backend);
    assert_eq!(counters["write_rpcs"], 3, "{counters:?}");
    assert_eq!(counters["commit_rpcs"], 1, "{counters:?}");
    assert_eq!(counters["serverwritebytes"], 3 << 20, "{counters:?}");
    assert_eq!(counters["verifier_changes"], 0, "{counters:?}");
    assert_eq!(counters["retransmits"], 0, "{counters:?}");
}

// Files made on the server are seen through the backend, and the NFS errors arrive as the
// errno a kernel client's program gets.
#[test]
fn server_files_and_errors() {
    let Some(server) = server("server_files_and_errors") else { return };
    let export = server.export_dir();
    std::fs::write(export.join("made-on-server"), b"hello").unwrap();
    std::fs::create_dir(export.join("a-directory")).unwrap();
    let backend = NfsBackend::connect(server.url()).unwrap();
    let file = backend.open("made-on-server", EXISTING).unwrap();
    let mut buf = [0; 16];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert!(backend.exists("made-on-server").unwrap());
    let truncated = backend.open("made-on-server", OpenOptions { create: false, truncate: true });
    assert_eq!(truncated.unwrap().size().unwrap(), 0);
    let error = backend.open("a-directory", CREATE).unwrap_err();
    assert_eq!(errno_of(&error), Some(libc::EISDIR), "{error}");
    let error = backend.open("missing", EXISTING).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
    let error = backend.remove("missing").unwrap_err();
    assert_eq!(errno_of(&error), Some(libc::ENOENT), "{error}");
    let error = backend.remove("a-directory").unwrap_err();
    assert!(errno_of(&error).is_some(), "REMOVE of a directory names an errno: {error}");
    let long = "n".repeat(300);
    let error = backend.open(&long, CREATE).unwrap_err();
    assert_eq!(errno_of(&error), Some(libc::ENAMETOOLONG), "{error}");
}

// The export or the server is wrong: errors that say so.
#[test]
fn bad_exports_and_unreachable_servers() {
    let Some(server) = server("bad_exports_and_unreachable_servers") else { return };
    let wrong = server.url().replace("/export?", "/not-exported?");
    let error = NfsBackend::connect(&wrong).unwrap_err();
    assert!(error.to_string().contains("refused to mount"), "{error}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("nfs://127.0.0.1:{closed}/e?mountport={closed}");
    let error = NfsBackend::connect(&url).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    assert!(error.to_string().contains(&closed.to_string()), "{error}");
}

// A restart between WRITE and COMMIT shows as a new verifier in the COMMIT's reply (what the
// engine needs to rewrite), and the backend carries on over the new connection.
#[test]
fn restart_with_a_new_verifier() {
    let Some(mut server) = server("restart_with_a_new_verifier") else { return };
    let backend = NfsBackend::connect(server.url()).unwrap();
    let file = backend.open("restarted", CREATE).unwrap();
    let Stability::Unstable { verifier: before } =
        file.write_at(&bytes(1, 8192), 0).unwrap().stability
    else {
        panic!("stable write")
    };
    server.restart(NfsServer::fresh_verifier()).unwrap();
    let after = file.commit(0, 0).unwrap().verifier;
    assert_ne!(after, before, "the restart did not change the verifier");
    let Stability::Unstable { verifier: rewrite } =
        file.write_at(&bytes(1, 8192), 0).unwrap().stability
    else {
        panic!("stable write")
    };
    assert_eq!(rewrite, after);
    assert_eq!(file.commit(0, 0).unwrap().verifier, after);
    let counters = counters(&backend);
    assert_eq!(counters["verifier_changes"], 1, "{counters:?}");
    assert!(1 <= counters["reconnects"], "{counters:?}");
}

// While the server is down calls fail promptly with the connection's errno (no endless
// retrying in the backend); once it is back the same backend works again.
#[test]
fn outage_fails_calls_then_recovers() {
    let Some(mut server) = server("outage_fails_calls_then_recovers") else { return };
    let backend = NfsBackend::connect(server.url()).unwrap();
    let file = backend.open("outage", CREATE).unwrap();
    file.write_at(&bytes(2, 4096), 0).unwrap();
    file.sync().unwrap();
    server.kill().unwrap();
    let error = file.write_at(&bytes(3, 4096), 4096).unwrap_err();
    let errno = errno_of(&error);
    assert!(
        matches!(errno, Some(libc::ECONNREFUSED | libc::ECONNRESET)),
        "a write to a killed server: {error}"
    );
    server.restart(NfsServer::fresh_verifier()).unwrap();
    file.write_at(&bytes(3, 4096), 4096).unwrap();
    file.sync().unwrap();
    let on_disk = std::fs::read(server.export_dir().join("outage")).unwrap();
    assert_eq!(on_disk[..4096], bytes(2, 4096)[..]);
    assert_eq!(on_disk[4096..], bytes(3, 4096)[..]);
}

// A server that hangs (SIGSTOP): a call is sent 1 + retrans times, timeo apart, then fails
// with ETIMEDOUT; once the server runs again the backend does too.
#[test]
fn hung_server_times_out_then_recovers() {
    let Some(mut server) = server("hung_server_times_out_then_recovers") else { return };
    let url = format!("{}&timeo=3&retrans=1", server.url());
    let backend = NfsBackend::connect(&url).unwrap();
    let file = backend.open("hung", CREATE).unwrap();
    server.pause().unwrap();
    let error = file.write_at(&bytes(4, 4096), 0).unwrap_err();
    assert_eq!(errno_of(&error), Some(libc::ETIMEDOUT), "{error}");
    assert!(error.to_string().contains("WRITE"), "{error}");
    let counters = counters(&backend);
    assert_eq!((counters["timeouts"], counters["retransmits"]), (2, 1), "{counters:?}");
    server.resume().unwrap();
    file.write_at(&bytes(4, 4096), 0).unwrap();
    file.sync().unwrap();
    assert_eq!(std::fs::read(server.export_dir().join("hung")).unwrap(), bytes(4, 4096));
}

ebb_backend::namespace_conformance! {
    /// The export as a mount's tree passes the namespace suite: every check, hard links and
    /// symlinks included (NFSv3 has both); only RENAME_NOREPLACE is refused (NFSv3 has no
    /// flags).
    mod namespace_conformance_nfs_ganesha {
        setup: { let server = server("namespace_conformance_nfs_ganesha")?; },
        namespace: ebb_backend::NfsNamespace::connect(server.url()).unwrap(),
        skipped: [rename],
    }
}

// What the suite does not check: new objects owned by the caller (and a setgid directory's
// group and bit), special files, a listing longer than one READDIRPLUS reply, a node that
// keeps naming its file across a rename, and statfs.
#[test]
fn namespace_owners_listings_and_handles() {
    use std::ffi::OsStr;
    use std::os::unix::fs::MetadataExt;

    use ebb_backend::{Credentials, FileKind, Namespace, NfsNamespace, RenameFlags};

    let Some(server) = server("namespace_owners_listings_and_handles") else { return };
    let namespace = NfsNamespace::connect(server.url()).unwrap();
    let (root, _) = namespace.root().unwrap();
    let user = Credentials { uid: 1234, gid: 5678, groups: Vec::new() };
    let (_, file) = namespace.create(&root, OsStr::new("owned"), 0o640, &user).unwrap();
    assert_eq!((file.uid, file.gid, file.perm), (1234, 5678, 0o640));
    let on_disk = std::fs::metadata(server.export_dir().join("owned")).unwrap();
    assert_eq!((on_disk.uid(), on_disk.gid(), on_disk.mode() & 0o7777), (1234, 5678, 0o640));
    let (shared, _) = namespace.mkdir(&root, OsStr::new("shared"), 0o2775, &user).unwrap();
    let (inner, dir) =
        namespace.mkdir(&shared, OsStr::new("inner"), 0o755, &Credentials::default()).unwrap();
    assert_eq!((dir.gid, dir.perm), (5678, 0o2755), "a setgid directory's group and bit");
    let (_, fifo) =
        namespace.mknod(&inner, OsStr::new("fifo"), FileKind::Fifo, 0o600, 0, &user).unwrap();
    assert_eq!(fifo.kind, FileKind::Fifo);
    let many = 1500;
    for index in 0..many {
        namespace.create(&inner, OsStr::new(&format!("file-{index:04}")), 0o644, &user).unwrap();
    }
    let mut names: Vec<String> = namespace
        .readdir(&inner)
        .unwrap()
        .map(|entry| entry.unwrap().name.into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), many + 1, "every entry listed once");
    assert_eq!(names[0], "fifo");
    assert_eq!(names[many], format!("file-{:04}", many - 1));
    let readdirplus = counters_of(&namespace)["readdirplus_rpcs"];
    assert!(2 <= readdirplus, "{many} entries in one READDIRPLUS reply");
    let (node, before) = namespace.lookup(&inner, OsStr::new("file-0000")).unwrap();
    let rename = RenameFlags::default();
    namespace
        .rename(&inner, OsStr::new("file-0000"), &root, OsStr::new("moved"), rename, &user)
        .unwrap();
    let after = namespace.getattr(&node).unwrap();
    assert_eq!((after.ino, after.generation), (before.ino, before.generation));
    let statfs = namespace.statfs(&root).unwrap();
    assert!(0 < statfs.blocks && statfs.blocks_free <= statfs.blocks, "{statfs:?}");
    assert_eq!(statfs.name_max, 255);
}

fn counters_of(namespace: &ebb_backend::NfsNamespace) -> BTreeMap<&'static str, u64> {
    use ebb_backend::Namespace;
    namespace.backend().counters().into_iter().collect()
}
