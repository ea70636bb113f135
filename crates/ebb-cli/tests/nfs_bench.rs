//! `ebb bench ... --backend nfs://...` against a real nfs-ganesha, at small sizes: each bench
//! runs to the end, leaves nothing on the export, and reports what it did in the JSON keys
//! BENCHMARKS.md and scripts/bench-nfs use. Nothing here asserts a speed.

use std::path::Path;
use std::process::Command;

use ebb_backend::NfsServer;
use serde_json::Value;

const EBB: &str = env!("CARGO_BIN_EXE_ebb");

/// A server for one test, or `None` (SKIPPED on stderr; a failure under CI).
fn server() -> Option<NfsServer> {
    if !NfsServer::available() {
        let missing = "nfs-ganesha is not installed (scripts/setup installs it)";
        assert!(std::env::var_os("CI").is_none(), "{missing}, and CI is set");
        eprintln!("SKIPPED: {missing}");
        return None;
    }
    Some(NfsServer::start().expect("start nfs-ganesha"))
}

/// Runs `ebb bench ARGS --backend URL --json FILE` and returns the JSON it wrote.
fn bench(server: &NfsServer, args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("result.json");
    let output = Command::new(EBB)
        .arg("bench")
        .args(args)
        .arg("--backend")
        .arg(server.url())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "ebb bench {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
}

/// The names left in the export's directory.
fn left_on(export: &Path) -> Vec<String> {
    std::fs::read_dir(export)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

// The 2020 dd at 64 MB in a 64 MiB cache, both accountings: every byte goes out as WRITE RPCs
// of at most 1 MiB, each variant makes writepages calls and COMMITs, and the two checks of
// the simulated experiment are reported.
#[test]
fn nfs_commit_batching_reports_both_accountings() {
    let Some(server) = server() else { return };
    let result = bench(&server, &["nfs-commit-batching", "--size", "64MB", "--memory", "64MiB"]);
    for variant in ["legacy-2020", "fixed"] {
        let figures = &result["variants"][variant];
        let calls = figures["writepages_calls"].as_f64().unwrap();
        let pages_per_call = figures["pages_per_writepages_mean"].as_f64().unwrap();
        assert!(1.0 <= calls, "{variant}: {figures}");
        assert!(
            (calls * pages_per_call - 64e6 / 4096.0).abs() < 2.0,
            "{variant}: the calls did not write the 64 MB once: {figures}"
        );
        assert!(61.0 <= figures["write_rpcs"].as_f64().unwrap(), "{variant}: {figures}");
        assert!(1.0 <= figures["commit_rpcs"].as_f64().unwrap(), "{variant}: {figures}");
    }
    let checks = result["checks"].as_array().unwrap();
    let ids: Vec<&str> = checks.iter().map(|check| check["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["legacy-more-calls", "fixed-large-batches"]);
    assert!(checks.iter().all(|check| check["met"].is_boolean()), "{checks:?}");
    assert_eq!(left_on(&server.export_dir()), Vec::<String>::new());
}

// A 32 MiB stream through ebb beside the raw client, and a reader beside a writer: the
// stream's ebb run writes every byte once, in WRITEs of at most 1 MiB, the raw client's
// figures are there, and the
// reader's modes are the reader alone and ebb with wbt on and off (no kernel mode).
#[test]
fn nfs_stream_and_read_under_write_run_against_the_export() {
    let Some(server) = server() else { return };
    let stream = bench(
        &server,
        &["stream", "--size", "32MiB", "--memory", "16MiB", "--rounds", "1", "--warmup", "0"],
    );
    assert!(0.0 < stream["raw_mb_s"].as_f64().unwrap(), "{stream}");
    assert!(0.0 < stream["write_mb_s"].as_f64().unwrap(), "{stream}");
    assert_eq!(stream["in_flight"], 8, "{stream}");
    assert!(stream.get("raw_static_mb_s").is_none(), "{stream}");
    let counters = &stream["ebb_counters"];
    assert!(32 <= counters["write_rpcs"].as_u64().unwrap(), "{counters}");
    assert_eq!(counters["serverwritebytes"], 32 << 20, "{counters}");
    assert_eq!(left_on(&server.export_dir()), Vec::<String>::new());

    let readers = bench(
        &server,
        &["read-under-write", "--seconds", "1", "--read-size", "8MiB", "--memory", "16MiB"],
    );
    let modes: Vec<&String> = readers["modes"].as_object().unwrap().keys().collect();
    assert_eq!(modes, ["ebb_wbt_ebb", "ebb_wbt_off", "ebb_wbt_on", "idle"], "{readers}");
    for mode in modes {
        assert!(0 < readers["modes"][mode]["reads"].as_u64().unwrap(), "{mode}: {readers}");
    }
    assert_eq!(left_on(&server.export_dir()), Vec::<String>::new(), "the read file is removed");
}
