//! ebb over the NFS backend against a real nfs-ganesha started through `scripts/nfs-server`.

use ebb_backend::{NfsBackend, NfsServer, OpenOptions};

const MIB: usize = 1 << 20;
const CREATE: OpenOptions = OpenOptions { create: true, truncate: false };

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

fn ebb_on(backend: &NfsBackend, memory: u64) -> ebb_runtime::Ebb {
    ebb_runtime::Builder::new()
        .memory(memory)
        .nfs_backend("nfs", backend.clone())
        .build()
        .expect("build ebb on NFS")
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|index| (seed as usize).wrapping_mul(31).wrapping_add(index / 4096 + index) as u8)
        .collect()
}

// A 64 MiB stream through a 16 MiB cache: the writer is throttled while the flusher writes
// UNSTABLE and commits; after fsync the export holds every byte, and the stats show the
// backend's RPCs beside the engine's figures.
#[test]
fn stream_through_a_small_cache_lands_on_the_export() {
    let Some(server) = server("stream_through_a_small_cache_lands_on_the_export") else { return };
    let backend = NfsBackend::connect(server.url()).unwrap();
    let ebb = ebb_on(&backend, 16 << 20);
    let file = ebb.open("stream", CREATE).unwrap();
    let data = pattern(5, 64 * MIB);
    for (index, piece) in data.chunks(MIB).enumerate() {
        file.write_at(piece, (index * MIB) as u64).unwrap();
    }
    file.fsync().unwrap();
    file.close().unwrap();
    let on_disk = std::fs::read(server.export_dir().join("stream")).unwrap();
    assert_eq!(on_disk.len(), data.len());
    assert!(on_disk == data, "the export's file differs from what was written");
    let stats = ebb.stats();
    let counters = &stats.bdi[0].backend;
    assert!(64 <= counters["write_rpcs"], "{counters:?}");
    assert!(1 <= counters["commit_rpcs"], "{counters:?}");
    assert_eq!(counters["serverwritebytes"], 64 << 20, "{counters:?}");
    assert_eq!(stats.bdi[0].unstable_kb, 0, "{:?}", stats.bdi[0]);
}
