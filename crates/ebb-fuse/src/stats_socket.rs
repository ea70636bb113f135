//! The stats socket: a running mount answers `ebb stat` and `ebb top` over a Unix socket of
//! its own, served by a thread of the mount process, so the stats come from the process's
//! memory and never go through the kernel's FUSE requests or the backend (an NFS server that
//! does not answer, a mount busy with thousands of requests). The old extended attribute
//! (`user.ebb.stats` of the root) still answers, with the same bounded JSON, for a caller who
//! cannot reach the socket (another user, a mountpoint named through a symlink).
//!
//! Where: `$XDG_RUNTIME_DIR/ebb/` if that variable names an absolute directory, else
//! `/tmp/ebb-UID/`; the directory is created with mode 0700 and refused if it is someone
//! else's, a symlink, or open to others; the socket, `mount-HASH.sock` with HASH the FNV-1a
//! hash of the mountpoint's absolute path (the last component not followed), has mode 0600.
//!
//! Protocol: the client sends one line `files N` (the most files to list), the server answers
//! with the stats JSON and closes. Both sides have deadlines; the server answers one client at
//! a time.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::fs::Files;

/// How many files the stats list when the caller does not say.
pub const DEFAULT_LISTED_FILES: usize = 20;

/// The most files a caller may ask to be listed (the list is built under the mount's locks).
const MAX_LISTED_FILES: usize = 100_000;

/// How long the server waits for a request line, and the client for the answer.
const SERVER_DEADLINE: Duration = Duration::from_secs(2);
const CLIENT_DEADLINE: Duration = Duration::from_secs(10);

/// The directory the mount's runtime files (its stats socket) go in, created if missing.
fn runtime_dir(create: bool) -> io::Result<PathBuf> {
    let uid = rustix::process::geteuid().as_raw();
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(base) if base.is_absolute() && base.is_dir() => base.join("ebb"),
        _ => PathBuf::from(format!("/tmp/ebb-{uid}")),
    };
    if create {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                return Err(io::Error::new(
                    error.kind(),
                    format!("creating the runtime directory {}: {error}", dir.display()),
                ));
            }
        }
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the runtime directory {} is not a directory of user {uid} with mode 0700; \
                 remove it",
                dir.display()
            ),
        ));
    }
    Ok(dir)
}

/// The socket's name for the mount at `mountpoint` (absolute).
fn socket_name(mountpoint: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in mountpoint.as_os_str().as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("mount-{hash:016x}.sock")
}

/// A running stats server; dropping it stops the thread and removes the socket.
pub(crate) struct StatsServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatsServer {
    /// Serves `files`' stats on the socket of `mountpoint` (canonical) on a thread of its own.
    pub(crate) fn start(mountpoint: &Path, files: Weak<Files>) -> io::Result<StatsServer> {
        let path = runtime_dir(true)?.join(socket_name(mountpoint));
        // A socket left by a crashed mount on this mountpoint (a live one was refused before).
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        let listener = UnixListener::bind(&path).map_err(|error| {
            io::Error::new(error.kind(), format!("stats socket {}: {error}", path.display()))
        })?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ebb-stats".to_owned())
            .stack_size(256 << 10)
            .spawn(move || serve(&listener, &files, &thread_stop))?;
        Ok(StatsServer { path, stop, thread: Some(thread) })
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept; the thread sees the flag and ends.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listener: &UnixListener, files: &Weak<Files>, stop: &AtomicBool) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            // Out of descriptors, most likely: let the mount close some.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let Some(files) = files.upgrade() else { return };
        let _ = answer(stream, &files);
    }
}

/// Reads the request line and writes the stats.
fn answer(stream: UnixStream, files: &Files) -> io::Result<()> {
    stream.set_read_timeout(Some(SERVER_DEADLINE))?;
    stream.set_write_timeout(Some(SERVER_DEADLINE))?;
    let mut line = String::new();
    BufReader::new((&stream).take(64)).read_line(&mut line)?;
    let listed = line
        .trim()
        .strip_prefix("files ")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(DEFAULT_LISTED_FILES)
        .min(MAX_LISTED_FILES);
    let json = files.stats_json(listed);
    (&stream).write_all(json.as_bytes())
}

/// The stats of the mount at `mountpoint` from its socket, listing at most `listed` files;
/// `Ok(None)` if it has no socket this user can reach.
pub(crate) fn read(mountpoint: &Path, listed: usize) -> io::Result<Option<String>> {
    let Ok(dir) = runtime_dir(false) else { return Ok(None) };
    let absolute = crate::places::absolute_without_following(mountpoint)?;
    let path = dir.join(socket_name(&absolute));
    let mut stream = match UnixStream::connect(&path) {
        Ok(stream) => stream,
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(error) => {
            return Err(io::Error::new(
                error.kind(),
                format!("stats socket {}: {error}", path.display()),
            ));
        }
    };
    stream.set_read_timeout(Some(CLIENT_DEADLINE))?;
    stream.set_write_timeout(Some(CLIENT_DEADLINE))?;
    stream.write_all(format!("files {listed}\n").as_bytes())?;
    let mut json = String::new();
    stream.read_to_string(&mut json).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!(
                "reading the stats of {} from {}: {error}",
                mountpoint.display(),
                path.display()
            ),
        )
    })?;
    Ok(Some(json))
}
