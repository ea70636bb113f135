//! [`NfsServer`]: a real NFSv3 server (nfs-ganesha) for tests and benchmarks, started and
//! stopped through the repository's `scripts/nfs-server`.
//!
//! Each server gets its own directory under `/tmp` (config, log, PID files and the exported
//! `export/` directory) and two free TCP ports on 127.0.0.1, so tests running at the same time
//! do not collide. Dropping the value stops the server by its PID (also when a test panics)
//! and removes the directory. The script path is the one of the source tree this crate was
//! built from, so this works from a checkout, not from an installed binary elsewhere.

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::process::{Pid, Signal};

/// The script, in the source tree this crate was built from.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/nfs-server");

/// A running (or stopped, restartable) nfs-ganesha with its own export directory.
#[derive(Debug)]
pub struct NfsServer {
    dir: PathBuf,
    port: u16,
    mount_port: u16,
    url: String,
    running: bool,
    paused: bool,
}

impl NfsServer {
    /// Whether the server's programs are installed (`scripts/setup` installs them); without
    /// them [`NfsServer::start`] would install them itself, which tests should not do.
    pub fn available() -> bool {
        let installed = |path: &str| Path::new(path).exists();
        installed("/usr/bin/ganesha.nfsd") && installed("/usr/sbin/rpcbind")
    }

    /// Starts a server on free ports with a fresh verifier, exporting a new empty directory.
    pub fn start() -> io::Result<NfsServer> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "ebb-nfs-{}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            fresh_verifier()
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir)?;
        let mut server = NfsServer {
            dir,
            port: 0,
            mount_port: 0,
            url: String::new(),
            running: false,
            paused: false,
        };
        // Free ports can be taken by someone else between the probe and ganesha's bind: try
        // a few pairs.
        let mut last_error = None;
        for _ in 0..3 {
            server.port = free_port()?;
            server.mount_port = free_port()?;
            match server.launch(fresh_verifier()) {
                Ok(()) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("nfs-server did not start")))
    }

    /// The backend URL: `nfs://127.0.0.1:PORT/DIR/export?mountport=N`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The exported directory, as seen on this machine.
    pub fn export_dir(&self) -> PathBuf {
        self.dir.join("export")
    }

    /// Stops the server with SIGTERM (it finishes what it does), keeping the export.
    pub fn stop(&mut self) -> io::Result<()> {
        self.run_stop(false)
    }

    /// Stops the server with SIGKILL, as a crash would.
    pub fn kill(&mut self) -> io::Result<()> {
        self.run_stop(true)
    }

    /// Freezes the server (SIGSTOP): its connections stay open and nothing is answered, as
    /// when a server hangs.
    /// Returns once every thread of the server has stopped (SIGSTOP only asks them to).
    pub fn pause(&mut self) -> io::Result<()> {
        let pid = self.signal(Signal::STOP)?;
        self.paused = true;
        let tasks = format!("/proc/{}/task", pid.as_raw_nonzero());
        for _ in 0..10_000 {
            let mut all_stopped = true;
            for task in std::fs::read_dir(&tasks)? {
                let stat = std::fs::read_to_string(task?.path().join("stat")).unwrap_or_default();
                // The state follows the command name in parentheses: `pid (comm) S ...`.
                let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
                all_stopped &= matches!(state, Some('T' | 't') | None);
            }
            if all_stopped {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Err(io::Error::other(format!("the server (PID {pid:?}) did not stop within 10 s")))
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&mut self) -> io::Result<()> {
        let _ = self.signal(Signal::CONT)?;
        self.paused = false;
        Ok(())
    }

    /// Starts the stopped server again on the same ports and export with `verifier` (pass a
    /// new one to make the restart visible to clients, as a reboot is).
    pub fn restart(&mut self, verifier: u32) -> io::Result<()> {
        if self.running {
            self.stop()?;
        }
        self.launch(verifier)
    }

    /// A verifier no server of this process used before.
    pub fn fresh_verifier() -> u32 {
        fresh_verifier()
    }

    /// Sends `signal` to the server; returns its PID.
    fn signal(&self, signal: Signal) -> io::Result<Pid> {
        let text = std::fs::read_to_string(self.dir.join("ganesha.pid"))?;
        let pid =
            text.trim().parse().ok().and_then(Pid::from_raw).ok_or_else(|| {
                io::Error::other(format!("no server PID in {}", self.dir.display()))
            })?;
        rustix::process::kill_process(pid, signal)?;
        Ok(pid)
    }

    fn launch(&mut self, verifier: u32) -> io::Result<()> {
        let output = Command::new(SCRIPT)
            .arg("start")
            .arg(&self.dir)
            .args(["--port", &self.port.to_string(), "--mount-port", &self.mount_port.to_string()])
            .args(["--verifier", &verifier.to_string()])
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "scripts/nfs-server start {} failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        self.url = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        self.running = true;
        Ok(())
    }

    fn run_stop(&mut self, kill: bool) -> io::Result<()> {
        if self.paused && !kill {
            // A stopped process does not act on SIGTERM until it runs again. SIGKILL ends it
            // as it is: resuming it first would let it answer what it holds, which a test of
            // a server that dies while hung must not see.
            self.resume()?;
        }
        let mut command = Command::new(SCRIPT);
        command.arg("stop").arg(&self.dir);
        if kill {
            command.arg("--kill");
        }
        let output = command.output()?;
        self.running = false;
        self.paused = false;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "scripts/nfs-server stop {} failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(())
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        if self.running {
            let _ = self.run_stop(false);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Distinct in this process and unlikely to repeat across processes: the time in
/// milliseconds, then counting up.
fn fresh_verifier() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let _ = NEXT.compare_exchange(
        0,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |since| since.as_millis() as u32 | 1),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    NEXT.fetch_add(1, Ordering::Relaxed)
}
