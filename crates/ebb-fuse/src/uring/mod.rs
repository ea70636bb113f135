//! FUSE over io_uring: the mount's requests taken and answered through per-CPU io_uring
//! queues instead of `read(2)` and `writev(2)` on `/dev/fuse` (Linux 6.14 and later, with
//! `CONFIG_FUSE_IO_URING` and the `fuse` module's `enable_uring` parameter on).
//!
//! Only the transport changes: a request taken from a ring is decoded by fuser (ebb's patched
//! copy, `vendor/fuser/PATCHED.md`) and given to the same [`fuser::Filesystem`] methods the
//! classic loop calls, on the ring's thread, which answers what cannot wait and hands the rest
//! to the pools exactly as a request loop does (`crate::fs`'s module doc). FUSE_INIT, FORGET,
//! INTERRUPT and notifications stay on `/dev/fuse`, whose loops keep running.
//!
//! How a mount starts ([`FuseLoop`]): before mounting, the rings and their buffers are made
//! (`io_uring_setup` may be refused: `io_uring_disabled`, seccomp); INIT then asks the kernel
//! for `FUSE_OVER_IO_URING` (only if the rings were made: once granted, the kernel holds every
//! request until the rings are registered or a registration fails); after INIT, one thread
//! per queue registers its entries. The kernel offers the flag only with `enable_uring` on.
//! With `auto`, any of these failing leaves the classic loop serving (said on stderr once);
//! with `uring` it is a mount error. The protocol: `abi` and docs/fuse-requests.md.
//!
//! Queues: one per possible CPU (the kernel's rule: a request waits on the queue of the CPU
//! its caller runs on, and the rings are used only once every queue has an entry), each with
//! [`DEPTH`] entries, each entry with a payload buffer of the largest request.

mod abi;
mod queue;

use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam::channel::bounded;
use fuser::{Dispatcher, Filesystem, InitFlags, KernelConfig};

use self::queue::Queue;

/// Entries per queue. A request holds its entry until answered, including a write that ebb
/// throttles (parked, `write_task`): with every entry of a CPU's queue held so, the requests of
/// programs on that CPU wait. 16 per queue is 16 such writers per CPU.
pub(crate) const DEPTH: usize = 16;

/// How long the ring threads may take to register their entries before the mount gives up.
const START_DEADLINE: Duration = Duration::from_secs(10);

/// Which loop serves the mount's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FuseLoop {
    /// io_uring where the kernel offers it, the classic loop otherwise.
    #[default]
    Auto,
    /// io_uring, or the mount fails.
    Uring,
    /// `read(2)` and `writev(2)` on `/dev/fuse`.
    Classic,
}

impl FuseLoop {
    /// The choice named by the environment variable `EBB_FUSE_LOOP` (`auto`, `uring`,
    /// `classic`), for running a test suite with either loop; `None` if unset.
    pub fn from_env() -> Result<Option<FuseLoop>, String> {
        match std::env::var("EBB_FUSE_LOOP") {
            Ok(text) => text.parse().map(Some).map_err(|error| format!("EBB_FUSE_LOOP: {error}")),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(error) => Err(format!("EBB_FUSE_LOOP: {error}")),
        }
    }
}

impl FromStr for FuseLoop {
    type Err = String;

    fn from_str(text: &str) -> Result<FuseLoop, String> {
        match text {
            "auto" => Ok(FuseLoop::Auto),
            "uring" => Ok(FuseLoop::Uring),
            "classic" => Ok(FuseLoop::Classic),
            other => Err(format!("unknown FUSE loop {other:?} (auto, uring or classic)")),
        }
    }
}

impl fmt::Display for FuseLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FuseLoop::Auto => "auto",
            FuseLoop::Uring => "uring",
            FuseLoop::Classic => "classic",
        })
    }
}

/// What INIT asks for and what the kernel offered (the filesystem's `init` fills it in).
#[derive(Debug, Default)]
pub(crate) struct Negotiation {
    ask: AtomicBool,
    offered: AtomicBool,
}

impl Negotiation {
    /// At INIT: asks for `FUSE_OVER_IO_URING` if the rings are ready, and notes whether the
    /// kernel offered it.
    pub(crate) fn at_init(&self, config: &mut KernelConfig) {
        if self.ask.load(Ordering::Relaxed) {
            let offered = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok();
            self.offered.store(offered, Ordering::Relaxed);
        }
    }
}

/// The rings made before mounting, to be started after INIT.
pub(crate) struct Prepared {
    queues: Vec<Queue>,
    choice: FuseLoop,
}

/// The rings serve the mount (their threads end with its connection).
pub(crate) struct Running;

/// Makes the rings for `choice` (none for `Classic`, or for `Auto` where io_uring is refused,
/// said on stderr) with payload buffers of `payload` bytes, counting the requests they take
/// in `served`; `negotiation` then asks for them at INIT.
pub(crate) fn prepare(
    choice: FuseLoop,
    payload: usize,
    negotiation: &Negotiation,
    served: &Arc<AtomicU64>,
) -> io::Result<Option<Prepared>> {
    if choice == FuseLoop::Classic {
        return Ok(None);
    }
    let made = possible_cpus().and_then(|cpus| {
        (0..cpus)
            .map(|qid| {
                let qid = u16::try_from(qid).map_err(io::Error::other)?;
                Queue::new(qid, DEPTH, payload.max(abi::MIN_PAYLOAD), Arc::clone(served))
            })
            .collect::<io::Result<Vec<Queue>>>()
    });
    match made {
        Ok(queues) => {
            negotiation.ask.store(true, Ordering::Relaxed);
            Ok(Some(Prepared { queues, choice }))
        }
        Err(error) => fall_back(choice, &format!("io_uring_setup failed: {error}")).map(|()| None),
    }
}

/// After INIT: registers the rings on the connection of `device` and serves `fs` through them;
/// `None` where the kernel did not take them (`Auto`: said on stderr).
pub(crate) fn start<FS: Filesystem>(
    prepared: Option<Prepared>,
    negotiation: &Negotiation,
    device: &OwnedFd,
    dispatcher: &Dispatcher,
    fs: &Arc<FS>,
) -> io::Result<Option<Running>> {
    let Some(Prepared { queues, choice }) = prepared else {
        return Ok(None);
    };
    if !negotiation.offered.load(Ordering::Relaxed) {
        let reason = "the kernel does not offer FUSE_OVER_IO_URING (Linux 6.14+ with \
                      CONFIG_FUSE_IO_URING, and /sys/module/fuse/parameters/enable_uring Y)";
        return fall_back(choice, reason).map(|()| None);
    }
    let (started, results) = bounded(queues.len());
    let count = queues.len();
    for (qid, queue) in queues.into_iter().enumerate() {
        let (device, dispatcher, fs, started) =
            (device.try_clone()?, dispatcher.clone(), Arc::clone(fs), started.clone());
        std::thread::Builder::new()
            .name(format!("ebb-fuse-ring-{qid}"))
            .spawn(move || queue.serve(device, &dispatcher, &*fs, &started))?;
    }
    for _ in 0..count {
        let result = results.recv_timeout(START_DEADLINE).unwrap_or_else(|_| {
            Err(io::Error::new(io::ErrorKind::TimedOut, "the io_uring queues did not start"))
        });
        if let Err(error) = result {
            // A refused registration puts the connection back on `/dev/fuse`.
            return fall_back(choice, &error.to_string()).map(|()| None);
        }
    }
    Ok(Some(Running))
}

/// With `Auto`, says why the classic loop serves; with `Uring`, the mount's error.
fn fall_back(choice: FuseLoop, reason: &str) -> io::Result<()> {
    match choice {
        FuseLoop::Uring => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("FUSE over io_uring (--fuse-loop uring): {reason}"),
        )),
        _ => {
            eprintln!("ebb mount: requests go through /dev/fuse, not io_uring: {reason}");
            Ok(())
        }
    }
}

/// The kernel's number of possible CPUs (`/sys/devices/system/cpu/possible`, e.g. `0-3`): the
/// number of queues it expects.
fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(text.trim()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, format!("possible CPUs {text:?}"))
    })
}

/// The highest CPU number of a list such as `0-3,8-11`, plus one.
fn parse_cpu_list(text: &str) -> Option<usize> {
    let mut highest = None;
    for part in text.split(',') {
        let last = part.rsplit('-').next()?;
        let cpu: usize = last.trim().parse().ok()?;
        highest = Some(highest.map_or(cpu, |highest: usize| highest.max(cpu)));
    }
    highest.map(|cpu| cpu + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_the_number_of_queues() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn loops_are_named() {
        for choice in [FuseLoop::Auto, FuseLoop::Uring, FuseLoop::Classic] {
            assert_eq!(choice.to_string().parse::<FuseLoop>(), Ok(choice));
        }
        assert!("fast".parse::<FuseLoop>().is_err());
    }
}
