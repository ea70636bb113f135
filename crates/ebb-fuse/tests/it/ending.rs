//! A mount that stops serving ends its FUSE connection (issue 33): a process still using it
//! gets `ENOTCONN` at once, and nothing can wait on it for ever.
//!
//! The hang this prevents: every child this test process forks holds copies of every mount's
//! `/dev/fuse` descriptors until its `execve` is over, and closes during that exec the files
//! of other tests' mounts it inherited, a FLUSH each, which the kernel waits for without
//! limit. A mount dropped while such a child held a file of it went on serving with a backend
//! already stopped (a FLUSH over S3 writes the file back: it never finished), and once the
//! test process had exited nobody answered at all, the child's copy keeping the connection
//! up: the child stayed in `execve` for good, and `ps` hung on it machine-wide. That needs a
//! process to die, so the tests below check the rule that prevents it: once the mount is
//! dropped or unmounted, a request on its connection fails at once.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ebb_fuse::DataMode;

use super::Fixture;

/// How long each step of the child may take before it is killed (by its PID) and the test
/// fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// A shell that opens `f` on the mount (which makes the mount busy), says `open`, waits for a
/// line on its stdin, then reads `f` through the descriptor it opened and says cat's status.
fn holder(fx: &Fixture) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"exec 3<"$1" && echo open && read go && cat <&3; echo "status $?""#)
        .arg("sh")
        .arg(fx.mnt.join("f"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sh");
    let stdout = child.stdout.take().unwrap();
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let said = received.recv_timeout(DEADLINE);
    if said.as_deref() != Ok("open") {
        kill(&mut child);
        panic!("the child did not open the file: {said:?}");
    }
    (child, received)
}

/// Tells the holder to read; what it printed after `open` and on stderr.
fn read_now(mut child: Child, received: &mpsc::Receiver<String>) -> (Vec<String>, String) {
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > DEADLINE {
            kill(&mut child);
            panic!("the child's read of a stopped mount did not end within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    // Every line the child printed, once its stdout's reader has read to the end (the child
    // has exited, but the reader thread may not have passed on its last line yet).
    let mut printed = Vec::new();
    let start = Instant::now();
    while let Ok(line) = received.recv_timeout(DEADLINE.saturating_sub(start.elapsed())) {
        printed.push(line);
    }
    (printed, String::from_utf8_lossy(&output.stderr).into_owned())
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The holder's read after the mount stopped failed with `ENOTCONN` and read nothing.
fn assert_not_connected(printed: &[String], stderr: &str, how: &str) {
    assert_eq!(printed, ["status 1"], "{how}: the read must fail (stderr: {stderr})");
    assert!(stderr.contains("Transport endpoint is not connected"), "{how}: {stderr}");
}

// A dropped mount ends its connection: the file a child still has open fails its next read
// with ENOTCONN. Before the fix the dropped mount's request loops went on serving it (the
// child read "kept open"), with whatever backend the mount had, until its last file closed.
#[test]
fn a_dropped_mount_ends_its_connection() {
    let Some(mut fx) = Fixture::new(DataMode::Ebb, None, &[]) else { return };
    std::fs::write(fx.mnt.join("f"), b"kept open").unwrap();
    let (child, received) = holder(&fx);
    drop(fx.mount.take());
    let (printed, stderr) = read_now(child, &received);
    assert_not_connected(&printed, &stderr, "after the drop");
}

// An unmount that finds the mount busy detaches it, ends its connection (the processes using
// it get ENOTCONN, as its message says) and writes everything to the backend.
#[test]
fn a_busy_unmount_ends_the_connection_and_writes_everything() {
    let Some(mut fx) = Fixture::new(DataMode::Ebb, None, &[]) else { return };
    std::fs::write(fx.mnt.join("f"), b"kept open").unwrap();
    let (child, received) = holder(&fx);
    fx.unmount();
    let (printed, stderr) = read_now(child, &received);
    assert_not_connected(&printed, &stderr, "after the unmount");
    assert_eq!(std::fs::read(fx.dir.join("f")).unwrap(), b"kept open");
}
