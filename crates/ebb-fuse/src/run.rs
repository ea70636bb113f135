//! What `ebb mount` does: mount, serve until SIGINT/SIGTERM or an outside unmount, drain,
//! unmount; and the operator's log of failed write-backs.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{RecvTimeoutError, Sender, unbounded};
use ebb_backend::Namespace;
use nix::sys::signal::{SigSet, Signal};

use crate::{Mount, MountConfig};

/// Says on stderr when write-backs to the backend fail, at most once per [`ErrorLog::EVERY`]: the
/// applications learn of them at fsync and close, the operator from this.
#[derive(Default)]
struct ErrorLog {
    reported: u64,
    last: Option<Instant>,
}

impl ErrorLog {
    const EVERY: Duration = Duration::from_secs(10);

    /// Logs new failures unless the last line is recent.
    fn check(&mut self, mount: &Mount, backend: &str) {
        if self.last.is_some_and(|last| last.elapsed() < ErrorLog::EVERY) {
            return;
        }
        self.flush(mount, backend);
    }

    /// Logs new failures now.
    fn flush(&mut self, mount: &Mount, backend: &str) {
        let errors = mount.write_errors();
        if errors > self.reported {
            eprintln!(
                "ebb mount: {} failed write-backs to {backend} ({errors} since the start; the data stays \
                 in the cache, applications get the error at fsync and close, `ebb stat` shows \
                 the state)",
                errors - self.reported,
            );
            self.reported = errors;
            self.last = Some(Instant::now());
        }
    }
}

/// How long a drain may take before `run` gives up and reports what is left.
const DRAIN_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// What [`run`] waits for.
enum Event {
    Signal(Signal),
    Drained(io::Result<()>),
}

/// Mounts `namespace`, serves until SIGINT/SIGTERM or an outside unmount, drains and unmounts.
/// Returns `Ok` when everything was written to the backend; exits the process with status 1
/// on a second signal.
pub fn run<N: Namespace>(config: &MountConfig, namespace: N) -> io::Result<()> {
    // Block the signals before any thread starts, so every thread inherits the mask and only
    // the sigwait thread below receives them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block().map_err(io::Error::from)?;
    let backend = namespace.describe();
    let mount = Arc::new(Mount::start(config, namespace)?);
    eprintln!(
        "ebb mount: {backend} on {} (ctrl-c or SIGTERM drains to {backend} and unmounts)",
        mount.mountpoint().display(),
    );
    let (sender, events) = unbounded();
    let signal_sender = sender.clone();
    std::thread::Builder::new().name("ebb-signals".to_owned()).spawn(move || {
        while let Ok(signal) = signals.wait() {
            if signal_sender.send(Event::Signal(signal)).is_err() {
                break;
            }
        }
    })?;
    let mut draining = false;
    let mut errors = ErrorLog::default();
    loop {
        match events.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::Signal(signal)) if !draining => {
                draining = true;
                start_drain(&mount, &sender, &backend, &format!("{signal}"))?;
            }
            Ok(Event::Signal(signal)) => {
                eprintln!(
                    "ebb mount: {signal} again: exiting now; not written to {backend}: {}",
                    mount.unwritten()
                );
                mount.detach();
                std::process::exit(1);
            }
            Ok(Event::Drained(result)) => {
                errors.flush(&mount, &backend);
                if let Err(error) = result {
                    eprintln!(
                        "ebb mount: drain failed: {error}; not written: {}",
                        mount.unwritten()
                    );
                    mount.detach();
                    return Err(error);
                }
                break;
            }
            Err(RecvTimeoutError::Timeout) => {
                errors.check(&mount, &backend);
                if !draining && mount.is_finished() {
                    draining = true;
                    start_drain(&mount, &sender, &backend, "unmounted from outside")?;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let mount = Arc::into_inner(mount)
        .ok_or_else(|| io::Error::other("the mount is still in use after the drain"))?;
    let mountpoint = mount.mountpoint().to_path_buf();
    mount.unmount()?;
    eprintln!("ebb mount: everything written; {} unmounted", mountpoint.display());
    Ok(())
}

/// Stops writes and drains the mount to `backend` on a thread of its own, which reports
/// progress every half second and sends [`Event::Drained`] when done.
fn start_drain(
    mount: &Arc<Mount>,
    sender: &Sender<Event>,
    backend: &str,
    reason: &str,
) -> io::Result<std::thread::JoinHandle<()>> {
    eprintln!("ebb mount: {reason}: writes stopped, draining to {backend}");
    let mount = Arc::clone(mount);
    let sender = sender.clone();
    std::thread::Builder::new().name("ebb-drain".to_owned()).spawn(move || {
        let mut last = Instant::now() - Duration::from_secs(1);
        let result = mount.drain(DRAIN_DEADLINE, &mut |line, done| {
            if done || last.elapsed() >= Duration::from_millis(500) {
                eprintln!("ebb mount: drain: {line}");
                last = Instant::now();
            }
        });
        drop(mount);
        let _ = sender.send(Event::Drained(result));
    })
}
