//! One seed's world: what [`Draw::generate`] draws from the seed, written as an experiment
//! file (so a failing seed, once shrunk, is a reproducer anyone can run with `ebb sim`).
//!
//! Everything comes from one [`Prng`] seeded with the seed, in a fixed order, so a seed always
//! draws the same world. Sizes are small on purpose (memory 4 to 96 MiB, workloads up to a few
//! times memory): a seed runs in milliseconds, and tiny budgets are where limits, reclaim and
//! held pages collide.

use std::fmt::Write as _;

use crate::device::MODEL_NAMES;
use crate::experiment::errno_name;
use crate::prng::Prng;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A backend: a device model and the per-backend knobs drawn for it.
#[derive(Clone, Debug, PartialEq)]
pub struct DrawBackend {
    /// A device model name.
    pub device: String,
    /// Per-backend knobs, as `name = value` TOML text.
    pub knobs: Vec<(String, String)>,
    /// NFS server restarts (a new verifier each), ms from the start.
    pub restarts_ms: Vec<u64>,
    /// NFS server restarts after a clean shutdown (data and verifier kept), ms from the start;
    /// each comes with a window of refused connections while the server is down.
    pub clean_restarts_ms: Vec<u64>,
}

/// A workload, as an experiment file's `[[case.workload]]` keys (TOML text values).
#[derive(Clone, Debug, PartialEq)]
pub struct DrawWorkload {
    /// Its keys in order, `kind` first.
    pub keys: Vec<(String, String)>,
    /// The backend it uses.
    pub backend: usize,
}

/// A fault window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrawFault {
    /// Backend index.
    pub backend: usize,
    /// Start, ms.
    pub from_ms: u64,
    /// End, ms; `None`: forever.
    pub until_ms: Option<u64>,
    /// Failing writes' errno (0: none).
    pub errno: i32,
    /// Failing reads' errno (0: none).
    pub read_errno: i32,
    /// Extra completion latency, ms (0: none).
    pub delay_ms: u64,
}

/// A crash that ends the run, or after which ebb restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrawCrash {
    /// When, ms.
    pub at_ms: u64,
    /// A power cut (volatile caches lost) rather than ebb alone dying.
    pub power_cut: bool,
    /// ebb starts again over what the devices kept and the writers go on.
    pub restart: bool,
}

/// One seed's world.
#[derive(Clone, Debug, PartialEq)]
pub struct Draw {
    /// The seed (also the experiment's seed, which seeds the device models' jitter).
    pub seed: u64,
    /// The throttle policy.
    pub policy: String,
    /// Memory budget, bytes.
    pub memory: u64,
    /// Cache knobs, as `name = value` TOML text.
    pub knobs: Vec<(String, String)>,
    /// Backends.
    pub backends: Vec<DrawBackend>,
    /// Workloads (at least one writer).
    pub workloads: Vec<DrawWorkload>,
    /// Fault windows.
    pub faults: Vec<DrawFault>,
    /// The crash, if any.
    pub crash: Option<DrawCrash>,
}

/// An errno as an experiment file writes it: its name if it has one.
fn errno_text(errno: i32) -> String {
    errno_name(errno).map_or_else(|| errno.to_string(), quoted)
}

fn pick<'a>(rng: &mut Prng, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len() as u64) as usize]
}

/// A size between `lo` and `hi`, log-uniform, rounded down to a page (at least one).
fn log_size(rng: &mut Prng, lo: u64, hi: u64) -> u64 {
    let (l, h) = ((lo as f64).ln(), (hi.max(lo) as f64).ln());
    let v = (l + (h - l) * rng.next_f64()).exp() as u64;
    (v / 4096).max(1) * 4096
}

fn quoted(text: impl std::fmt::Display) -> String {
    format!("\"{text}\"")
}

impl Draw {
    /// Draws the world of `seed` under throttle `policy`.
    pub fn generate(seed: u64, policy: &str) -> Draw {
        let mut rng = Prng::new(seed);
        let memory = log_size(&mut rng, 4 * MIB, 96 * MIB);
        let knobs = global_knobs(&mut rng, memory, policy);
        let backends: Vec<DrawBackend> =
            (0..1 + rng.below(4)).map(|_| draw_backend(&mut rng)).collect();
        let n = backends.len() as u64;
        let mut workloads: Vec<DrawWorkload> =
            (0..1 + rng.below(3)).map(|_| draw_writer(&mut rng, n, memory)).collect();
        if rng.chance(0.3) {
            workloads.push(draw_other(&mut rng, n, memory));
        }
        let mut faults: Vec<DrawFault> =
            (0..rng.below(5)).map(|_| draw_fault(&mut rng, &backends)).collect();
        for (backend, b) in backends.iter().enumerate() {
            for &from_ms in &b.clean_restarts_ms {
                // The server is down for a while: connections are refused.
                faults.push(DrawFault {
                    backend,
                    from_ms,
                    until_ms: Some(from_ms + rng.range_u64(10, 2_000)),
                    errno: ebb_core::event::errno::ECONNREFUSED,
                    read_errno: 0,
                    delay_ms: 0,
                });
            }
        }
        let crash = rng.chance(0.3).then(|| DrawCrash {
            at_ms: rng.range_u64(50, 8_000),
            power_cut: rng.chance(0.5),
            restart: rng.chance(0.5),
        });
        Draw { seed, policy: policy.to_owned(), memory, knobs, backends, workloads, faults, crash }
    }

    /// Whether some fault never ends (the cache cannot drain).
    pub fn has_permanent_fault(&self) -> bool {
        self.faults.iter().any(|f| f.until_ms.is_none() && f.errno != 0)
    }

    /// When the last fault window ends, ms (0 without faults); a crash or NFS restart counts.
    pub fn faults_end_ms(&self) -> u64 {
        let windows = self.faults.iter().map(|f| f.until_ms.unwrap_or(f.from_ms));
        let restarts = self
            .backends
            .iter()
            .flat_map(|b| b.restarts_ms.iter().chain(&b.clean_restarts_ms).copied());
        windows.chain(restarts).max().unwrap_or(0)
    }

    /// The virtual-time limit: long enough for retries after the last fault (their backoff
    /// reaches 30 s) and for the slowest device to write every workload.
    pub fn time_limit_s(&self) -> u64 {
        self.faults_end_ms() / 1000 + 300
    }

    /// The world as an experiment file: one case, the policy as the only variant.
    pub fn to_toml(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "# ebb swarm seed {} ({})", self.seed, self.policy);
        let _ = writeln!(t, "title = \"swarm seed {}\"", self.seed);
        let _ = writeln!(
            t,
            "description = \"A world drawn by ebb swarm --from {} --policy {}\"",
            self.seed, self.policy
        );
        let _ = writeln!(t, "reproduces = \"ebb swarm\"");
        let _ = writeln!(t, "compare = \"throttle\"");
        let _ = writeln!(t, "variants = [\"{}\"]", self.policy);
        let _ = writeln!(t, "seed = {}\n", self.seed);
        let _ = writeln!(t, "[[case]]\nname = \"swarm\"\nmemory = {}", self.memory);
        let _ = writeln!(t, "time_limit = \"{}s\"", self.time_limit_s());
        let knobs: Vec<String> = self.knobs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        let _ = writeln!(t, "knobs = {{ {} }}", knobs.join(", "));
        if let Some(crash) = self.crash {
            let _ = writeln!(
                t,
                "crash = {{ at = \"{}ms\", power_cut = {}, restart = {} }}",
                crash.at_ms, crash.power_cut, crash.restart
            );
        }
        for (b, backend) in self.backends.iter().enumerate() {
            let _ =
                writeln!(t, "\n[[case.backend]]\nname = \"b{b}\"\ndevice = \"{}\"", backend.device);
            for (k, v) in &backend.knobs {
                let _ = writeln!(t, "{k} = {v}");
            }
            let seconds = |ms: &[u64]| {
                let s: Vec<String> =
                    ms.iter().map(|ms| format!("{:.3}", *ms as f64 / 1000.0)).collect();
                format!("[{}]", s.join(", "))
            };
            let mut overrides = Vec::new();
            if !backend.restarts_ms.is_empty() {
                overrides.push(format!("restart_at_s = {}", seconds(&backend.restarts_ms)));
            }
            if !backend.clean_restarts_ms.is_empty() {
                overrides
                    .push(format!("clean_restart_at_s = {}", seconds(&backend.clean_restarts_ms)));
            }
            if !overrides.is_empty() {
                let _ = writeln!(t, "device_overrides = {{ {} }}", overrides.join(", "));
            }
        }
        for w in &self.workloads {
            let _ = writeln!(t, "\n[[case.workload]]");
            for (k, v) in &w.keys {
                let _ = writeln!(t, "{k} = {v}");
            }
            let _ = writeln!(t, "backend = \"b{}\"", w.backend);
        }
        for f in &self.faults {
            let _ = writeln!(
                t,
                "\n[[case.fault]]\nbackend = \"b{}\"\nfrom = \"{}ms\"",
                f.backend, f.from_ms
            );
            if let Some(until) = f.until_ms {
                let _ = writeln!(t, "until = \"{until}ms\"");
            }
            if f.errno != 0 {
                let _ = writeln!(t, "errno = {}", errno_text(f.errno));
            }
            if f.read_errno != 0 {
                let _ = writeln!(t, "read_errno = {}", errno_text(f.read_errno));
            }
            if f.delay_ms > 0 {
                let _ = writeln!(t, "delay = \"{}ms\"", f.delay_ms);
            }
        }
        t
    }
}

/// Periodic writeback may be off (`dirty_writeback_centisecs = 0`) only under `ioless`. The
/// legacy and bandwidth-2010 policies reproduce kernels whose writers wake only their own
/// backend's flusher and wait while the global count is over the threshold: with dirty pages
/// left on another backend that no writer wakes, only periodic writeback writes them, so
/// without it such a writer waits forever, as in those kernels (swarm seeds 271, 523, 909 and
/// 964 drew that; it is the model being faithful, not a bug to fix in them).
fn global_knobs(rng: &mut Prng, memory: u64, policy: &str) -> Vec<(String, String)> {
    let mut k = Vec::new();
    let mut push = |name: &str, value: String| k.push((name.to_owned(), value));
    if rng.chance(0.2) {
        // A byte threshold, from two pages to half the memory.
        let bytes = log_size(rng, 8 * KIB, memory / 2);
        push("dirty_bytes", bytes.to_string());
        push("dirty_background_bytes", (bytes / (2 + rng.below(4))).max(4096).to_string());
    } else {
        let ratio = rng.range_u64(1, 61);
        push("dirty_ratio", ratio.to_string());
        push("dirty_background_ratio", rng.below(ratio).to_string());
    }
    push("hz", pick(rng, &["100", "250", "300", "1000"]).to_owned());
    push("nr_cpus", rng.range_u64(1, 9).to_string());
    push("dirty_expire_centisecs", pick(rng, &["100", "500", "3000"]).to_owned());
    let writeback = pick(rng, &["0", "100", "500"]);
    let writeback = if policy == "ioless" || writeback != "0" { writeback } else { "500" };
    push("dirty_writeback_centisecs", writeback.to_owned());
    push("reclaim", quoted(pick(rng, &["legacy", "flusher-only"])));
    push("unstable_accounting", quoted(pick(rng, &["legacy-2020", "fixed"])));
    k
}

fn draw_backend(rng: &mut Prng) -> DrawBackend {
    let device = pick(rng, &MODEL_NAMES).to_owned();
    let mut knobs = Vec::new();
    let mut push = |name: &str, value: String| knobs.push((name.to_owned(), value));
    if rng.chance(0.5) {
        push("max_write_pages", (1u64 << rng.below(11)).to_string());
    }
    if rng.chance(0.3) {
        push("queue_depth", (1u64 << rng.below(8)).to_string());
    }
    if rng.chance(0.2) {
        push("strict_limit", "true".into());
    }
    if rng.chance(0.2) {
        push("max_ratio", rng.range_u64(1, 101).to_string());
    }
    if rng.chance(0.3) {
        push("wbt", quoted(pick(rng, &["on", "off"])));
    }
    push("retry_timeout_secs", pick(rng, &["0", "2", "10", "60"]).to_owned());
    if rng.chance(0.3) {
        push("flush_on_close", "true".into());
    }
    let (mut restarts_ms, mut clean_restarts_ms) = (Vec::new(), Vec::new());
    if device == "nfs-server" {
        for _ in 0..rng.below(3) {
            let at = rng.range_u64(10, 6_000);
            if rng.chance(0.5) { clean_restarts_ms.push(at) } else { restarts_ms.push(at) }
        }
        restarts_ms.sort_unstable();
        clean_restarts_ms.sort_unstable();
    }
    DrawBackend { device, knobs, restarts_ms, clean_restarts_ms }
}

fn bs(rng: &mut Prng) -> String {
    quoted(format!("{}KiB", 4u64 << rng.below(9)))
}

/// A dd, a cp or an fs_mark: something that writes.
fn draw_writer(rng: &mut Prng, backends: u64, memory: u64) -> DrawWorkload {
    let backend = rng.below(backends) as usize;
    let size = log_size(rng, 16 * KIB, 3 * memory);
    let start = quoted(format!("{}ms", rng.below(2_000)));
    let mut keys: Vec<(String, String)> = Vec::new();
    match rng.below(10) {
        0..=5 => {
            keys.push(("kind".into(), quoted("dd")));
            keys.push(("size".into(), size.to_string()));
            keys.push(("bs".into(), bs(rng)));
            keys.push(("start".into(), start));
            keys.push(("fsync".into(), rng.chance(0.7).to_string()));
            if rng.chance(0.3) {
                keys.push(("think".into(), quoted(format!("{}us", rng.range_u64(1, 5_000)))));
            }
            if size > 4096 && rng.chance(0.25) {
                // A log rolled back: truncated partway, then written on from the cut.
                let at = rng.range_u64(1, size / 4096 + 1) * 4096;
                keys.push(("truncate_at".into(), at.to_string()));
                keys.push(("truncate_to".into(), (rng.below(at / 4096) * 4096).to_string()));
            }
            if rng.chance(0.2) {
                keys.push(("unlink".into(), "true".into()));
            }
        }
        6..=7 => {
            keys.push(("kind".into(), quoted("cp")));
            keys.push(("size".into(), size.to_string()));
            keys.push(("bs".into(), bs(rng)));
            keys.push(("start".into(), start));
        }
        _ => {
            let file = log_size(rng, 4 * KIB, MIB);
            keys.push(("kind".into(), quoted("fsmark")));
            // At most 128 files: every file is a page map the checkers recount per event.
            keys.push(("size".into(), size.clamp(file, 128 * file).to_string()));
            keys.push(("bs".into(), bs(rng)));
            keys.push(("start".into(), start));
            keys.push(("threads".into(), rng.range_u64(1, 5).to_string()));
            keys.push(("file_size".into(), file.to_string()));
        }
    }
    DrawWorkload { keys, backend }
}

/// A reader or a memory workload beside the writers.
fn draw_other(rng: &mut Prng, backends: u64, memory: u64) -> DrawWorkload {
    let backend = rng.below(backends) as usize;
    let start = quoted(format!("{}ms", rng.below(2_000)));
    let mut keys: Vec<(String, String)> = Vec::new();
    match rng.below(3) {
        0 => {
            keys.push(("kind".into(), quoted("randread")));
            keys.push(("size".into(), log_size(rng, 64 * KIB, 64 * MIB).to_string()));
            keys.push(("bs".into(), quoted("4KiB")));
            keys.push(("start".into(), start));
        }
        1 => {
            // The anonymous half of the mix (at most four chunks) fits in a quarter of memory:
            // with no swap, more could never be faulted in and the writer would wait forever,
            // as a machine would run out of memory (seed 303 drew 4 MiB into 4 MiB).
            let chunk = log_size(rng, 4 * KIB, MIB.min(memory / 16));
            keys.push(("kind".into(), quoted("mmap-strm")));
            keys.push(("size".into(), log_size(rng, 16 * KIB, 2 * memory).to_string()));
            keys.push(("mix".into(), (chunk * rng.range_u64(2, 9)).to_string()));
            keys.push(("chunk".into(), chunk.to_string()));
            keys.push(("bs".into(), bs(rng)));
            keys.push(("start".into(), start));
        }
        _ => {
            let hold = rng.range_u64(10, 1_000);
            keys.push(("kind".into(), quoted("anon-churn")));
            keys.push(("size".into(), log_size(rng, 16 * KIB, memory / 2).to_string()));
            keys.push(("hold".into(), quoted(format!("{hold}ms"))));
            keys.push(("period".into(), quoted(format!("{}ms", hold + rng.range_u64(1, 1_000)))));
            keys.push(("start".into(), start));
        }
    }
    DrawWorkload { keys, backend }
}

fn draw_fault(rng: &mut Prng, backends: &[DrawBackend]) -> DrawFault {
    let backend = rng.below(backends.len() as u64) as usize;
    let nfs = backends[backend].device == "nfs-server";
    let from_ms = rng.below(5_000);
    let len = rng.range_u64(10, 3_000);
    let until_ms = Some(from_ms + len);
    let mut f = DrawFault { backend, from_ms, until_ms, errno: 0, read_errno: 0, delay_ms: 0 };
    use ebb_core::event::errno;
    match rng.below(12) {
        0..=2 => f.errno = errno::EIO,
        3 => {
            f.errno = errno::EIO;
            f.until_ms = None;
        }
        4 => f.errno = errno::ENOSPC,
        5 => {
            f.errno = errno::EROFS;
            if rng.chance(0.3) {
                f.until_ms = None;
            }
        }
        6..=7 => f.delay_ms = rng.range_u64(5, 2_000),
        8..=9 => f.read_errno = errno::EIO,
        _ => {
            f.errno = if nfs { errno::ECONNREFUSED } else { errno::ETIMEDOUT };
            if rng.chance(0.5) {
                f.delay_ms = rng.range_u64(5, 500);
            }
        }
    }
    f
}
