//! `ebb mount` with many files: a process holding thousands of written files open, more files
//! than the mount may hold descriptors, the mount's memory under many files, and its exit
//! with many files cached.
//!
//! Every workload runs in a child process with a deadline and is killed by its PID when the
//! deadline passes; the [`Running`] guard kills the mount and detaches it if a test fails.
//! A machine without `/dev/fuse` skips these tests with a message (and fails them when `CI`
//! is set).

mod support;
use support::{Running, dirs, fuse_available, is_mounted, output_within};

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs the bash `script` with `args` within `deadline`, and fails if it fails.
fn bash(script: &str, args: &[&str], deadline: Duration) {
    let output =
        output_within(Command::new("bash").args(["-c", script, "bash"]).args(args), deadline);
    assert!(
        output.status.success(),
        "bash {script:?} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Opens `$2` files in `$1` (f0, f1, ...), writes 4 KiB to each and keeps them all open, then
/// closes them all.
const HOLD_OPEN: &str = r#"
ulimit -n $(( $2 + 64 )) || exit 3
fds=()
for ((i = 0; i < $2; i++)); do
    exec {fd}>"$1/f$i" || exit 4
    printf '%4096s' "$i" >&$fd || exit 5
    fds+=($fd)
done
for fd in "${fds[@]}"; do exec {fd}>&-; done
"#;

// A process that opens 2000 files, writes 4 KiB to each and keeps them all open, with
// `--memory 64MiB`. Each open handle's writer keeps a reserve of up to 1 MiB of frames from
// the budget; before the engine asked idle writers for their reserves back when a writer
// found no memory (`Action::ReturnReserves`), the 30th file's write waited for memory forever
// (198 files with 256 MiB), and this test failed at its deadline.
#[test]
fn a_process_holding_two_thousand_written_files_open_finishes() {
    if !fuse_available() {
        return;
    }
    let (_root, dir, mnt) = dirs();
    let running = Running::start(&dir, &mnt, &["--memory", "64MiB"]);
    bash(HOLD_OPEN, &[mnt.to_str().unwrap(), "2000"], Duration::from_secs(120));
    let counters = &running.stat()["counters"];
    assert!(counters["reserve_sweeps"].as_u64().unwrap() > 0, "reserves never ran short");
    for i in [0, 29, 1999] {
        let text = std::fs::read_to_string(mnt.join(format!("f{i}"))).unwrap();
        assert_eq!(text, format!("{i:>4096}"), "f{i}");
    }
}

/// In `$1`: creates `$2` files of 4 KiB (c0, c1, ...), then for each: stats it, reads it
/// back, appends to it and renames it (r0, r1, ...); then checks every renamed file's text.
/// Each step is one pass over all the files, so the mount has seen them all before the next.
const EVERY_FILE: &str = r#"
cd "$1" || exit 3
for ((i = 0; i < $2; i++)); do printf '%4096s' "$i" > "c$i" || exit 4; done
for ((i = 0; i < $2; i++)); do [ -s "c$i" ] || exit 5; done
for ((i = 0; i < $2; i++)); do
    read -r -N 4096 text < "c$i" || exit 6
    [ "$text" = "$(printf '%4096s' "$i")" ] || exit 7
done
for ((i = 0; i < $2; i++)); do printf 'more' >> "c$i" || exit 8; done
for ((i = 0; i < $2; i++)); do mv "c$i" "r$i" || exit 9; done
for ((i = 0; i < $2; i++)); do
    read -r -N 4100 text < "r$i" || exit 10
    [ "$text" = "$(printf '%4096smore' "$i")" ] || exit 11
done
"#;

// A mount serves more files than it may hold descriptors: with its limit on open files at
// 1,024, 1,500 files are created, stated, read, appended to and renamed through it. Before the
// directory namespace kept its descriptors in a bounded cache (reopening objects by file
// handle), every file seen kept two descriptors open (its node's and its data's), and creating
// the 507th file failed with EMFILE ("Too many open files").
#[test]
fn a_mount_serves_more_files_than_its_descriptor_limit() {
    if !fuse_available() {
        return;
    }
    const LIMIT: u32 = 1024;
    const FILES: usize = 1500;
    let (_root, dir, mnt) = dirs();
    let running = Running::start_with_file_limit(&dir, &mnt, &[], LIMIT);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", running.pid())).unwrap();
    let line = limits.lines().find(|line| line.starts_with("Max open files")).unwrap();
    assert_eq!(line.split_whitespace().nth(3), Some("1024"), "not limited: {line}");
    bash(EVERY_FILE, &[mnt.to_str().unwrap(), &FILES.to_string()], Duration::from_secs(300));
    let open = std::fs::read_dir(format!("/proc/{}/fd", running.pid())).unwrap().count();
    eprintln!("{FILES} files served with {open} descriptors open at the end");
    assert!(open < LIMIT as usize, "{open} descriptors open");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), FILES);
}

/// `VmHWM` of process `pid`, in kB.
fn vm_hwm_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Creates `$2` files in `$1` (c0, c1, ...) of 4 KiB each, one after the other, each closed
/// before the next.
const CREATE: &str = r#"
for ((i = 0; i < $2; i++)); do printf '%4096s' "$i" > "$1/c$i" || exit 4; done
"#;

/// `$2` writers at once in `$1`, each writing 1 MiB (64 KiB at a time) to a file of its own.
const CONCURRENT: &str = r#"
for ((i = 0; i < $2; i++)); do
    dd if=/dev/zero of="$1/w$i" bs=64k count=16 status=none &
done
wait
"#;

// The mount's peak resident memory (`VmHWM`) stays within `--memory 64MiB` through 3,000
// files of 4 KiB created and closed one after another, then 256 writers at once, and the
// copies of the writers' requests stayed within their bound. Before the copies were bounded
// (one per throttled writer) and the fixed reserve knew the code the binary maps: 74,180 kB
// with the test profile's binary, 71,404 kB with a release build (2026-11-29).
#[test]
fn the_mount_stays_within_its_memory_with_many_files() {
    if !fuse_available() {
        return;
    }
    let (_root, dir, mnt) = dirs();
    let running = Running::start(&dir, &mnt, &["--memory", "64MiB"]);
    let mnt_arg = mnt.to_str().unwrap();
    bash(CREATE, &[mnt_arg, "3000"], Duration::from_secs(300));
    let after_files = vm_hwm_kb(running.pid());
    bash(CONCURRENT, &[mnt_arg, "256"], Duration::from_secs(300));
    let peak = vm_hwm_kb(running.pid());
    let copies = running.stat()["fuse"]["copies"].clone();
    eprintln!("VmHWM {after_files} kB after 3,000 files, {peak} kB after 256 writers; {copies}");
    let limit = copies["limit"].as_u64().expect("no copies in the stats");
    assert!(copies["peak"].as_u64().unwrap() <= limit, "{copies}");
    assert!(peak <= 64 << 10, "VmHWM {peak} kB above --memory 64MiB");
}

// SIGTERM on a mount whose cached files were all written back exits within a generous bound
// (a hang and regression detector; the issue's target is 2 s for 100,000 files). Before the
// drain synced a directory's files with one syncfs, it fsynced each backend file written since
// its last sync (about 2 ms each): 4.2 and 11.9 s in two runs here; after, 0.4 s.
#[test]
fn sigterm_with_many_clean_files_exits_fast() {
    if !fuse_available() {
        return;
    }
    const FILES: &str = "5000";
    let (_root, dir, mnt) = dirs();
    // Written back within a few centiseconds of being dirtied.
    let knobs = ["--knob", "dirty_expire_centisecs=1", "--knob", "dirty_writeback_centisecs=1"];
    let mut running = Running::start(&dir, &mnt, &knobs);
    bash(CREATE, &[mnt.to_str().unwrap(), FILES], Duration::from_secs(300));
    let start = Instant::now();
    loop {
        let meminfo = running.stat()["meminfo"].clone();
        let unwritten = ["Dirty", "Writeback", "NFS_Unstable"]
            .iter()
            .map(|k| meminfo[k].as_u64().unwrap_or(0))
            .sum::<u64>();
        if unwritten == 0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "never clean: {meminfo}");
        std::thread::sleep(Duration::from_millis(100));
    }
    running.signal("-TERM");
    let (status, stderr, took) = running.wait_within(Duration::from_secs(20));
    eprintln!("SIGTERM with {FILES} clean files: exited after {took:?}");
    assert!(status.success(), "{stderr}");
    assert!(!is_mounted(&mnt));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), FILES.parse::<usize>().unwrap());
}

// The mount's peak resident memory (`VmHWM`) stays within `--memory 64MiB` through 2,000 files
// of 4 KiB created and closed one after another, and their state is charged against the
// cache (`Slab` in the stats, kB: at least 2,000 times the 3.4 KB a file costs). The test
// profile's binary has more code resident than a release build (about 19 MB against 5.6), which
// the mount's fixed reserve does not know of: this workload leaves room for it (33.8 MB after
// 3,000 files with that binary). Before the charge there was no `Slab` figure, and the files'
// heap came on top of a cache that could fill the budget.
#[test]
fn the_files_state_of_a_mount_with_many_files_is_inside_its_memory() {
    if !fuse_available() {
        return;
    }
    const FILES: u64 = 2000;
    let (_root, dir, mnt) = dirs();
    let running = Running::start(&dir, &mnt, &["--memory", "64MiB"]);
    bash(CREATE, &[mnt.to_str().unwrap(), &FILES.to_string()], Duration::from_secs(300));
    let peak = vm_hwm_kb(running.pid());
    let slab_kb = running.stat()["meminfo"]["Slab"].as_u64().expect("no Slab in meminfo");
    eprintln!("VmHWM {peak} kB, Slab {slab_kb} kB after {FILES} files");
    assert!(slab_kb * 1024 >= FILES * 3400, "{slab_kb} kB charged for {FILES} files");
    assert!(peak <= 64 << 10, "VmHWM {peak} kB above --memory 64MiB");
}
