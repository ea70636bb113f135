//! `SimBackend`: the backend conformance suite for every device model, and the durability each
//! model promises (a power cut loses unsynced cached writes, an NFS restart loses uncommitted
//! ones, by the same rules as the `nfs-server` timing model).

use ebb_backend::{Backend, BackendFile, OpenOptions, Stability, conformance};
use ebb_core::Instant;
use ebb_sim::backend::SimBackend;
use ebb_sim::device::{Completion, Device, DeviceRequest, IoOp, MODEL_NAMES, NfsParams, NfsServer};

const PAGE: usize = 4096;
const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };

fn backend(model: &str) -> SimBackend {
    SimBackend::for_device(model).unwrap_or_else(|error| panic!("{error}"))
}

fn read_all(file: &dyn BackendFile) -> Vec<u8> {
    let size = file.size().expect("size") as usize;
    let mut buf = vec![0; size];
    assert_eq!(file.read_at(&mut buf, 0).expect("read"), size);
    buf
}

#[test]
fn every_device_model_passes_conformance() {
    for model in MODEL_NAMES {
        let report = conformance::assert_conformance(&|| Box::new(backend(model)));
        // The two-phase check really ran (restart included) for the NFS model only.
        let two_phase_ran = report.passed.contains(&"two_phase_commit_and_restart");
        assert_eq!(two_phase_ran, model == "nfs-server", "{model}: {report}");
    }
}

#[test]
fn unknown_device_is_an_error_naming_it() {
    let error = SimBackend::for_device("floppy-1987").unwrap_err().to_string();
    assert!(error.contains("floppy-1987") && error.contains("sata-2010"), "{error}");
    let overrides: toml::Table = toml::from_str("write_cache_byte = 0").expect("toml");
    let error = SimBackend::for_device_with_overrides("sata-2010", &overrides).unwrap_err();
    assert!(error.to_string().contains("write_cache_byte"), "{error}");
}

/// A disk acknowledges writes from its volatile cache: a power cut loses what no sync covered
/// (in every file, and the size the lost writes had added), keeps what one did.
#[test]
fn power_cut_loses_unsynced_writes_of_a_cached_disk() {
    let sim = backend("sata-2010");
    let synced = sim.open("synced", CREATE).expect("open");
    let other = sim.open("other", CREATE).expect("open");
    synced.write_at(&[1; 2 * PAGE], 0).expect("write");
    other.write_at(&[2; PAGE], 0).expect("write");
    // One file's sync flushes the device cache, so the other file's write is durable too.
    synced.sync().expect("sync");
    synced.write_at(&[3; PAGE], 0).expect("write");
    let reply = synced.write_at(&[4; PAGE], 2 * PAGE as u64).expect("write");
    assert_eq!(reply.stability, Stability::Stable);
    assert_eq!(synced.size().expect("size"), 3 * PAGE as u64);

    sim.power_cut();
    assert_eq!(read_all(&*synced), vec![1; 2 * PAGE], "unsynced overwrite and extension lost");
    assert_eq!(read_all(&*other), vec![2; PAGE]);
    let reopened = sim.open("synced", OpenOptions { create: false, truncate: false });
    assert_eq!(read_all(&*reopened.expect("reopen")), vec![1; 2 * PAGE]);
}

/// A write the model takes through to the media (no cache, or larger than the cache) is
/// durable as soon as it completes.
#[test]
fn written_through_writes_survive_a_power_cut() {
    let usb = backend("usb-stick");
    let file = usb.open("f", CREATE).expect("open");
    file.write_at(&[5; PAGE], 0).expect("write");
    usb.power_cut();
    assert_eq!(read_all(&*file), vec![5; PAGE]);

    let overrides: toml::Table = toml::from_str("write_cache_bytes = 8192").expect("toml");
    let disk = SimBackend::for_device_with_overrides("sata-2010", &overrides).expect("disk");
    let file = disk.open("f", CREATE).expect("open");
    file.write_at(&[6; 3 * PAGE], 0).expect("write larger than the cache");
    file.write_at(&[7; PAGE], 3 * PAGE as u64).expect("cached write");
    disk.power_cut();
    assert_eq!(read_all(&*file), vec![6; 3 * PAGE]);
}

/// Writes are UNSTABLE under the server's verifier; a COMMIT makes every received write durable
/// (other files' too) and returns the verifier; a restart loses the rest and changes it.
#[test]
fn nfs_restart_loses_uncommitted_writes_and_changes_the_verifier() {
    let sim = backend("nfs-server");
    let a = sim.open("a", CREATE).expect("open");
    let b = sim.open("b", CREATE).expect("open");
    let Stability::Unstable { verifier } = a.write_at(&[1; PAGE], 0).expect("write").stability
    else {
        panic!("nfs-server write was stable");
    };
    b.write_at(&[2; PAGE], 0).expect("write");
    assert_eq!(a.commit(0, PAGE as u64).expect("commit").verifier, verifier);
    a.write_at(&[3; PAGE], PAGE as u64).expect("write");
    b.set_size(3).expect("set_size is synchronous");
    let before = sim.nfs_stats().expect("nfs stats");
    assert_eq!((before.durable_bytes, before.uncommitted_bytes), (2 * PAGE as u64, PAGE as u64));

    sim.server_restart().expect("restart hook").restart();
    let after = sim.nfs_stats().expect("nfs stats");
    assert_ne!(after.verifier, verifier);
    assert_eq!((after.restarts, after.lost_bytes), (1, PAGE as u64));
    assert_eq!(read_all(&*a), vec![1; PAGE]);
    assert_eq!(read_all(&*b), vec![2; 3]);
    let reply = a.write_at(&[3; PAGE], PAGE as u64).expect("rewrite");
    assert_eq!(reply.stability, Stability::Unstable { verifier: after.verifier });
    a.sync().expect("sync commits");
    sim.power_cut();
    assert_eq!(read_all(&*a), [vec![1; PAGE], vec![3; PAGE]].concat());
}

/// Submits one request to the timing model at `now` and advances until it completes.
fn complete(server: &mut NfsServer, now: Instant, id: u64, op: IoOp) -> Completion {
    let len = if op == IoOp::Flush { 0 } else { 1 << 20 };
    server.submit(now, DeviceRequest { id, op, offset: id << 20, len, sync: false });
    let mut done = Vec::new();
    while done.is_empty() {
        let at = server.next_event_time().expect("a pending reply");
        server.advance(at, &mut done);
    }
    done[0]
}

/// The backend and the `nfs-server` timing model apply the same rules: one sequence of
/// WRITE, COMMIT, WRITE, restart, COMMIT gives the same verifiers and leaves identical server
/// counters in both.
#[test]
fn nfs_backend_and_timing_model_agree() {
    let sim = backend("nfs-server");
    let file = sim.open("f", CREATE).expect("open");
    // The backend's model seed is 0.
    let mut server = NfsServer::new("nfs", NfsParams::gigabit_2020(), 0);
    let data = vec![9; 1 << 20];

    let write = complete(&mut server, Instant::ZERO, 1, IoOp::Write);
    let reply = file.write_at(&data, 1 << 20).expect("write");
    assert_eq!(
        Some(reply.stability),
        write.verifier.map(|verifier| Stability::Unstable { verifier })
    );
    let commit = complete(&mut server, write.at, 2, IoOp::Flush);
    assert_eq!(Some(file.commit(0, 0).expect("commit").verifier), commit.verifier);
    let lost = complete(&mut server, commit.at, 3, IoOp::Write);
    file.write_at(&data, 3 << 20).expect("write");
    server.restart(lost.at);
    sim.server_restart().expect("hook").restart();
    let after = complete(&mut server, lost.at, 4, IoOp::Flush);
    assert_eq!(Some(file.commit(0, 0).expect("commit").verifier), after.verifier);
    assert_eq!(sim.nfs_stats(), Some(server.nfs_stats()));
    assert_eq!(file.size().expect("size"), 2 << 20, "the lost write's extension is gone");
}

/// A removed file stays readable and writable through an open handle, as with a descriptor.
#[test]
fn removed_file_lives_while_open() {
    let sim = backend("laptop-ssd");
    let file = sim.open("gone", CREATE).expect("open");
    file.write_at(&[8; PAGE], 0).expect("write");
    sim.remove("gone").expect("remove");
    assert!(!sim.exists("gone").expect("exists"));
    file.write_at(&[8; PAGE], PAGE as u64).expect("write after remove");
    file.sync().expect("sync");
    assert_eq!(read_all(&*file), vec![8; 2 * PAGE]);
    let fresh = sim.open("gone", CREATE).expect("create again");
    assert_eq!(fresh.size().expect("size"), 0);
}
