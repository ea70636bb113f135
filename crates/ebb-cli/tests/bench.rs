//! `ebb bench` as a user meets it: wrong input refused at once with the option it names, a
//! run that leaves nothing behind, and output into a pipe that closes early.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const EBB: &str = env!("CARGO_BIN_EXE_ebb");

fn ebb(args: &[&str]) -> Output {
    Command::new(EBB).args(args).output().expect("run ebb")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Bad options fail with exit code 2 and a message naming the option and the value, before
/// anything is measured.
#[test]
fn bad_options_name_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["bench", "stream", "--dir", "/nonexistent/ebb", "--size", "1M"],
            "--dir /nonexistent/ebb",
        ),
        (&["bench", "stream", "--dir", "/etc/hostname", "--size", "1M"], "not a directory"),
        (&["bench", "stream", "--dir", dir, "--size", "0"], "--size 0: at least"),
        (&["bench", "write-path", "--size", "0"], "--size 0: at least"),
        (
            &["bench", "stream", "--dir", dir, "--size", "1M", "--json", "/nonexistent/x.json"],
            "--json /nonexistent/x.json",
        ),
        (&["bench", "read-under-write", "--dir", dir, "--read-size", "4K"], "--read-size 4096"),
        (&["bench", "read-under-write", "--dir", dir, "--variant", "x"], "expected LABEL:"),
        (&["bench", "read-under-write", "--dir", dir, "--variant", "a b:wbt=on"], "the label"),
        (&["bench", "read-under-write", "--dir", dir, "--variant", "a:nope=1"], "nope"),
    ];
    for (args, expected) in cases {
        let out = ebb(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?} measured something");
    }
}

/// read-under-write removes every file it made (the 1 GiB read file too) unless asked to keep
/// the read file for the next run; a `--variant` is one more mode.
#[test]
fn read_under_write_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let args = ["bench", "read-under-write", "--dir", path, "--seconds", "1", "--read-size", "1M"];
    let variant = ["--variant", "deep:wbt_min_depth=4"];
    let out = ebb(&[&args[..], &["--memory", "16M"], &variant].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(names(dir.path()), Vec::<String>::new());
    // Each mode says how long its reader waited for a CPU per read, and what the device did.
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let modes = result["modes"].as_object().unwrap();
    let mut labels: Vec<&str> = modes.keys().map(String::as_str).collect();
    labels.sort_unstable();
    let expected = ["ebb_deep", "ebb_wbt_ebb", "ebb_wbt_off", "ebb_wbt_on", "idle", "kernel"];
    assert_eq!(labels, expected);
    for (mode, figures) in modes {
        let wait = figures["reader_run_delay_us_per_read"].as_f64();
        assert!(wait.is_some_and(|us| us >= 0.0), "{mode}: {figures}");
        let keys = ["device_write_mb_s", "device_write_kib", "device_busy_pct", "device_queue"];
        for key in keys.into_iter().chain(["device_read_us", "read_lat_us_mean"]) {
            assert!(figures[key].as_f64().is_some_and(|x| x >= 0.0), "{mode} {key}: {figures}");
        }
    }
    // The ebb modes say what share of the time wbt let background writes be in service: all
    // of it but for `wbt = ebb`, which paces them while reads are active.
    for mode in ["ebb_wbt_on", "ebb_wbt_off"] {
        assert_eq!(modes[mode]["wbt_duty_pct"].as_f64(), Some(100.0), "{mode}");
    }
    let duty = modes["ebb_wbt_ebb"]["wbt_duty_pct"].as_f64();
    assert!(duty.is_some_and(|pct| pct > 0.0 && pct <= 100.0), "{duty:?}");
    let out = ebb(&[&args[..], &["--memory", "16M", "--keep-read-file"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(names(dir.path()), ["ebb-bench-read"]);
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A reader that closes the pipe after one line (`ebb ... | head -1`) is not an error: no
/// panic, exit 0.
#[test]
fn output_into_a_closed_pipe_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(EBB)
        .args(["bench", "stream", "--size", "1M", "--rounds", "1", "--warmup", "0", "--memory"])
        .args(["16M", "--dir", dir.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before ebb prints.
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(status.success(), "{status}: {err}");
}

/// The bad inputs a new user met (issue 38): each exits with 2 (usage), and its message names
/// the option or file and says the problem once.
#[test]
fn usage_errors_exit_2_and_name_the_problem_once() {
    let dir = tempfile::tempdir().unwrap();
    let experiment = dir.path().join("tiny.toml");
    let text = include_str!("../../ebb-sim/tests/swarm/fsync-after-brief-outage.toml")
        .replace("time_limit = \"301s\"", "time_limit = \"301s\"\nsample_interval = \"1ns\"");
    std::fs::write(&experiment, text).unwrap();
    let mnt = dir.path().join("mnt");
    let (dir, experiment, mnt) =
        (dir.path().to_str().unwrap(), experiment.to_str().unwrap(), mnt.to_str().unwrap());
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "stream", "--dir", "/proc", "--size", "1M"], "--dir /proc"),
        (&["bench", "stream", "--dir", dir, "--rounds", "0"], "--rounds"),
        (&["report", "/nonexistent/trace.txt"], "/nonexistent/trace.txt"),
        (&["mount", "--backend", dir, mnt, "--knob", "memory_bytes=1000T"], "memory_bytes"),
        (&["sim", experiment, "--out", dir], "sample_interval"),
    ];
    for (args, names) in cases {
        let out = ebb(args);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(said.contains(names), "{args:?} should name {names}: {said}");
        // Said once: no clause of the message comes twice.
        let clauses: Vec<&str> =
            said.split([':', '\n']).map(str::trim).filter(|c| c.len() > 8).collect();
        let unique: std::collections::BTreeSet<&&str> = clauses.iter().collect();
        assert_eq!(unique.len(), clauses.len(), "{args:?} repeats itself: {said}");
    }
}
