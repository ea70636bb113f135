//! What the mount test binaries share (`mod support;`, or `#[path]` from a test directory).
#![allow(dead_code, reason = "each test binary that includes this uses part of it")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `ebb` binary under test.
pub(crate) const EBB: &str = env!("CARGO_BIN_EXE_ebb");

/// Whether FUSE can be mounted here; if not, the test says SKIPPED and returns early, except
/// under CI (the environment variable `CI` set), where a skip would count as a pass: it fails.
pub(crate) fn fuse_available() -> bool {
    let available = Path::new("/dev/fuse").exists();
    if !available {
        assert!(std::env::var_os("CI").is_none(), "/dev/fuse is missing, and CI is set");
        eprintln!("SKIPPED: /dev/fuse is missing, so FUSE cannot be mounted here");
    }
    available
}

/// Whether `mnt` is a mountpoint of this process's mount namespace.
pub(crate) fn is_mounted(mnt: &Path) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let target = mnt.to_str().unwrap();
    mountinfo.lines().any(|line| line.split(' ').nth(4) == Some(target))
}

/// Fresh backend and mountpoint directories.
pub(crate) fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::Builder::new().prefix("ebb-cli-mount").tempdir_in("/tmp").unwrap();
    let (dir, mnt) = (root.path().join("dir"), root.path().join("mnt"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    (root, dir, mnt)
}

/// A running `ebb mount --backend DIR`; killed and detached on drop if still there.
pub(crate) struct Running {
    child: Option<Child>,
    mnt: PathBuf,
}

impl Running {
    pub(crate) fn start(dir: &Path, mnt: &Path, extra: &[&str]) -> Running {
        Running::start_command(Command::new(EBB), dir, mnt, extra)
    }

    /// [`Running::start`] with the mount's limit on open files (soft and hard) set to `files`.
    pub(crate) fn start_with_file_limit(
        dir: &Path,
        mnt: &Path,
        extra: &[&str],
        files: u32,
    ) -> Running {
        let mut command = Command::new("bash");
        // `exec`: the mount keeps the shell's PID, which the guard kills.
        let script = format!("ulimit -n {files} && exec \"$@\"");
        command.args(["-c", &script, "bash", EBB]);
        Running::start_command(command, dir, mnt, extra)
    }

    /// Starts `command` (which runs `ebb` with the arguments it is given) as the mount.
    fn start_command(mut command: Command, dir: &Path, mnt: &Path, extra: &[&str]) -> Running {
        command
            .args(["mount", "--backend", dir.to_str().unwrap(), mnt.to_str().unwrap()])
            .args(extra);
        Running::spawn(&mut command, mnt)
    }

    /// Starts `command` (a whole `ebb mount ...` of any backend) and waits until the mount at
    /// `mnt` answers.
    pub(crate) fn spawn(command: &mut Command, mnt: &Path) -> Running {
        let child = command.stderr(Stdio::piped()).spawn().unwrap();
        let mut running = Running { child: Some(child), mnt: mnt.to_path_buf() };
        // Mounted once the root answers with its stats (a hang detector, not a speed check).
        let start = Instant::now();
        while ebb_fuse::read_stats(mnt).is_err() {
            if let Some(status) = running.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("ebb mount exited with {status}: {}", running.stderr());
            }
            assert!(start.elapsed() < Duration::from_secs(60), "ebb mount did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        running
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL, as a crash would (the mountpoint stays until the guard is dropped).
    pub(crate) fn kill(&mut self) {
        self.child.as_mut().unwrap().kill().unwrap();
    }

    pub(crate) fn signal(&self, name: &str) {
        let pid = self.pid().to_string();
        assert!(Command::new("kill").args([name, &pid]).status().unwrap().success());
    }

    /// Waits for the mount to exit: its status and what it wrote on stderr.
    pub(crate) fn wait(&mut self) -> (ExitStatus, String) {
        let status = self.child.as_mut().unwrap().wait().unwrap();
        let stderr = self.stderr();
        self.child = None;
        (status, stderr)
    }

    /// Waits for the mount to exit, at most `deadline` (then it is killed by its PID and the
    /// test fails).
    pub(crate) fn wait_within(&mut self, deadline: Duration) -> (ExitStatus, String, Duration) {
        let start = Instant::now();
        let child = self.child.as_mut().unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ebb mount did not exit within {deadline:?}: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = start.elapsed();
        let stderr = self.stderr();
        self.child = None;
        (status, stderr, took)
    }

    pub(crate) fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(stderr) = self.child.as_mut().and_then(|child| child.stderr.as_mut()) {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    }

    /// The mount's stats (`ebb stat`), within a deadline.
    pub(crate) fn stat(&self) -> serde_json::Value {
        let output =
            output_within(Command::new(EBB).arg("stat").arg(&self.mnt), Duration::from_secs(60));
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// Runs `command` to its end, or kills it (by its PID) after `deadline` and fails.
pub(crate) fn output_within(command: &mut Command, deadline: Duration) -> std::process::Output {
    let start = Instant::now();
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
