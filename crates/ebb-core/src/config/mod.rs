//! Configuration: the kernel's knobs, with the kernel's names and units, and their validation.
//!
//! A `Config` describes one cache: its memory budget, its dirty limits, the policy chosen for
//! each mechanism, and the backends it writes to. [`Config::new`] starts from the defaults of a
//! mature Linux kernel; callers change fields (or set knobs by name, [`Config::set_knob`]) and
//! [`Config::validate`] rejects settings that cannot be honoured, naming the knob. The engine
//! refuses an invalid configuration.
//!
//! Every knob is declared once, in `knobs.rs`, which writes the structs and the registry
//! ([`Knob`]: name, scope, unit, kind and range, default, doc). Setting by name, range
//! checks, this table, the simulator's experiment files, the command line's knob flags and the
//! runtime's `Builder::knob` all read the registry. Semantics follow `/proc/sys/vm` and
//! `/sys/class/bdi`; a per-backend knob set by name applies to every backend.
//!
//! Sizes follow one convention everywhere ([`parse_size`]): a bare number is bytes; `K`, `M`, `G`,
//! `T` (either case, optionally followed by `iB`) are powers of 1024; `KB` (or `kB`), `MB`,
//! `GB`, `TB` are powers of 1000. So `64M` is 64 MiB and `64MB` is 64,000,000 bytes.
//!
//! <!-- knob table: rendered from the registry by `knobs::doc_table`; a test checks it -->
//! | knob | scope | unit | default | range | meaning |
//! |---|---|---|---|---|---|
//! | `hz` | global | ticks/s | 1000 | 1..=10000 | Scheduler ticks per second; several kernel formulas round through it. |
//! | `nr_cpus` | global | CPUs | 4 | 1..=65536 | CPUs the kernel formulas assume (`ratelimit_pages`, counter error bounds). |
//! | `memory_bytes` | global | bytes | 256MiB | 4MiB..=8TiB | The memory the cache may use (the kernel's RAM); dirtyable memory derives from it. |
//! | `dirty_ratio` | global | % | 20 | 0..=100 | Hard dirty threshold, % of dirtyable memory; `dirty_bytes`, when nonzero, takes precedence as in the kernel. |
//! | `dirty_bytes` | global | bytes | 0 | 0.. | Hard dirty threshold in bytes (0: use `dirty_ratio`). |
//! | `dirty_background_ratio` | global | % | 10 | 0..=100 | The flusher starts writing back above this, % of dirtyable memory. |
//! | `dirty_background_bytes` | global | bytes | 0 | 0.. | The background threshold in bytes (0: use `dirty_background_ratio`). |
//! | `dirty_expire_centisecs` | global | 1/100 s | 3000 | 0.. | Data older than this is written by periodic writeback. |
//! | `dirty_writeback_centisecs` | global | 1/100 s | 500 | 0.. | Periodic flusher wakeup interval; 0 disables it. |
//! | `min_free_kbytes` | global | KiB | unset | 0.. | Memory kept free for allocations that cannot wait; unset derives it from memory as the kernel does. |
//! | `watermark_scale_factor` | global | 1/10000 | 10 | 1..=3000 | Distance between watermarks, in 1/10000 of memory. |
//! | `zone_bounds_bytes` | global | bytes | none | up to 7 sizes | Memory zones: where each lower zone ends (empty: one zone). |
//! | `throttle` | global |  | ioless | legacy, bandwidth-2010, ioless | Writer-throttling policy (docs/mechanisms.md#3-writer-throttling). |
//! | `reclaim` | global |  | flusher-only | legacy, flusher-only | Reclaim policy (docs/mechanisms.md#6-reclaim). |
//! | `kswapd_scan_ns` | global | ns/page | 0 | 0..=1000000 | kswapd's CPU time per page it scans (0: kswapd balances the zones instantly). |
//! | `unstable_accounting` | global |  | fixed | legacy-2020, rfc-2020, fixed | Accounting of pages written to a two-phase backend but not yet committed (docs/mechanisms.md#7-two-phase-backends). |
//! | `throttle_counter_reads` | global |  | reordered | pre-2009, reordered | Which shared counters the legacy throttle check reads (docs/mechanisms.md#8-cheap-throttle-path): `reordered` (2.6.32 on, Kennedy 2009: each once per pass, reused after the loop) or `pre-2009` (2.6.31: re-read for the limits, again to clip the backend's limit, and again after the loop); docs/throttling.md. |
//! | `io_thread_nice` | global | nice | 10 | 0..=19 | Nice value of the runtime's IO threads (ebb's own; 0: the priority of the thread that built the cache). |
//! | `io_thread_ioprio` | global |  | inherit | inherit, best-effort-7, idle | IO priority of the runtime's IO threads: inherit, best-effort-7 or idle. |
//! | `min_ratio` | backend | % of the threshold | 0 | 0..=100 | Guaranteed share of the dirty threshold. |
//! | `max_ratio` | backend | % of the threshold | 100 | 0..=100 | Cap on the share of the dirty threshold. |
//! | `strict_limit` | backend |  | 0 | 0 or 1 | Throttle writers against this backend's own share even below the global freerun point (FUSE). |
//! | `queue_depth` | backend | requests | 128 | 1..=65536 | Requests the backend accepts at once (the block layer's `nr_requests`). |
//! | `max_write_pages` | backend | pages | 128 | 1..=65536 | Largest single write (the block layer's `max_sectors_kb`). |
//! | `hw_queue_depth` | backend | requests | 32 | 1..=65536 | The device's own command queue depth (NCQ tags), which sizes wbt's limits. |
//! | `rotational` | backend |  | 0 | 0 or 1 | Whether the device rotates (selects the wbt latency default). |
//! | `write_cache` | backend |  | 0 | 0 or 1 | Whether the device has a volatile write cache (wbt drains fully before waking writers). |
//! | `wbt` | backend |  | on | off, on, ebb | Writeback throttling (docs/mechanisms.md#5-writeback-throttling-wbt): off, on (the kernel's algorithm) or ebb (its target learned from the device, smaller writes while reads are active). |
//! | `wbt_lat_usec` | backend | us | unset | 0..=10000000 | wbt read-latency target (0 disables wbt); unset takes the kernel default for the device kind: 2000 solid state, 75000 rotating. |
//! | `wbt_window_usec` | backend | us | 100000 | 1000..=10000000 | wbt window (the kernel's 100 ms default). |
//! | `wbt_min_write_pages` | backend | pages | 32 | 1..=65536 | The smallest background write of `wbt = ebb` while reads are active (ebb's own). |
//! | `wbt_min_depth` | backend | requests | 1 | 1..=65536 | The fewest background writes `wbt = ebb` keeps in flight (ebb's own; 1 is the kernel's floor). |
//! | `wbt_min_duty` | backend | % | 100 | 1..=100 | The least share of the time `wbt = ebb` keeps a background write in service while reads are active (ebb's own); under 100 it paces whole writes, one at a time with a gap after each, instead of shrinking them; 100: no pacing. |
//! | `wbt_pace_write_pages` | backend | pages | 1024 | 1..=65536 | The largest background write of `wbt = ebb` while it paces (ebb's own; may exceed `max_write_pages`). |
//! | `wbt_pace_yields` | backend |  | 0 | 0 or 1 | Whether `wbt = ebb` stops pacing while a writer of the backend was throttled in the last second (ebb's own; the kernel's wbt gives writes its full depth then, `wb_recent_wait`). |
//! | `commit_batch_ratio` | backend | % of the dirty threshold | 0 | 0..=100 | COMMIT batch of a two-phase backend, as a share of its dirty threshold (ebb's own); 0: the kernel's NFS rule, a COMMIT after each writepages call's writes. |
//! | `dirty_seconds` | backend | s | 0 | 0..=86400 | Cap on the backend's share of the dirty threshold: this many seconds of its measured write bandwidth (ebb's own); 0: no cap. |
//! | `dirty_background_seconds` | backend | s | 0 | 0..=86400 | Cap on the backend's share of the background threshold: this many seconds of its write bandwidth (ebb's own); 0: its `dirty_seconds` share scaled as the kernel scales the background threshold. |
//! | `initial_write_bandwidth` | backend | bytes/s | kernel | kernel, auto or 4KiB..=1TiB | Where the bandwidth estimate and ratelimit start (ebb's own): `kernel` (the kernel's 100 MB/s), `auto` (the backend's declared speed) or a rate. |
//! | `retry_timeout_secs` | backend | s | 60 | 0..=31536000 | How long the backend may stay unreachable before fsync and close report EIO (ebb's own; the NFS client's `timeo` x `retrans` of a soft mount plays this role). |
//! | `flush_on_close` | backend |  | 0 | 0 or 1 | Close writes the file back and commits it before it returns, as an NFS client does for close-to-open consistency (ebb's own for other backends). |
//! | `write_granule_bytes` | backend | bytes | unset | 4KiB..=1TiB | Write-back granule: no write crosses a granule's end, and threshold-driven writeback leaves a file's last, partly dirty granule for later (ebb's own: an object store uploads a multipart part whole, so a part written twice costs a commit and a copy); unset: none. |
//! | `write_granule_group` | backend | granules | 0 | 0..=1000000 | Granules per size group: after this many granules of one size the granule doubles (an S3 layout whose parts grow to reach 10,000); 0: one size throughout. |
//! <!-- end of knob table -->

mod knobs;
mod registry;
mod size;

use std::fmt;
use std::str::FromStr;

pub use knobs::{BackendConfig, Config, knob, knobs, parse_setting};
pub use registry::{Kind, Knob, Scope, Setting, Value};
pub use size::{SIZE_UNITS, format_size, parse_size};

/// Bytes in one page. The core counts everything in 4 KiB pages, as x86-64 Linux does.
pub const PAGE_SIZE: u64 = 4096;

/// The largest memory budget, 8 TiB: page counts are kept in 32 bits.
pub const MEMORY_BYTES_MAX: u64 = 1 << 43;

/// Writer-throttling policy (docs/mechanisms.md#3-writer-throttling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrottlePolicy {
    /// Before 2.6.36: the writer writes back 1.5x its ratelimit itself and sleeps with a
    /// doubling pause up to 100 ms.
    Legacy,
    /// The September 2010 IO-less posting: throttle bandwidth = bw * (A - R) / (A - L).
    Bandwidth2010,
    /// The mature IO-less design (v3.2 and later): position and rate control.
    Ioless,
}

/// Reclaim policy (docs/mechanisms.md#6-reclaim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimPolicy {
    /// Reclaim writes dirty pages one at a time, from both direct and background reclaim.
    Legacy,
    /// Direct reclaim never writes; background reclaim writes only when in trouble.
    FlusherOnly,
}

/// How pages written to a two-phase backend but not yet committed are counted
/// (docs/mechanisms.md#7-two-phase-backends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnstableAccounting {
    /// Before v5.8: unstable pages count as reclaimable, so they trigger background writeback.
    Legacy2020,
    /// The posted RFC (NeilBrown, March 2020): the throttle counts unstable pages with
    /// writeback and wakes the flusher only above the thresholds, but a background pass still
    /// counts them toward the background threshold (`wb_over_bg_thresh` unchanged), so it goes
    /// on past the call that took the dirty pages.
    Rfc2020,
    /// Since v5.8: unstable pages count with writeback everywhere; writeback starts, and a
    /// background pass goes on, only above the thresholds.
    Fixed,
}

/// Which shared counters the legacy throttle check reads, and when
/// (docs/mechanisms.md#8-cheap-throttle-path,
/// docs/throttling.md#the-cost-of-the-throttle-check-kennedy-2009).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterReads {
    /// 2.6.31, before Kennedy's reorder: each pass reads the global counters for the limits,
    /// again to clip the backend's limit, then the backend's; after the loop, the global
    /// counters once more for the background test.
    Pre2009,
    /// 2.6.32 on: one read of the global and one of the backend's counters per pass, the
    /// values reused after the loop.
    Reordered,
}

/// Writeback throttling (docs/mechanisms.md#5-writeback-throttling-wbt) for a backend: off,
/// the kernel's algorithm, or ebb's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WbtMode {
    /// No limit on in-flight background writes beyond the queue depth.
    Off,
    /// The kernel's blk-wbt: a limit on in-flight background writes, scaled by the minimum
    /// read latency of each window against a fixed target.
    On,
    /// ebb's variant (`crate::wbt::adaptive`): the kernel's depth control with a target
    /// learned from the device's idle read latency, the window's p99 as the signal, and
    /// smaller background writes while reads are active.
    Ebb,
}

/// The IO priority of the runtime's IO threads (`io_thread_ioprio`), which the block layer's
/// IO scheduler (mq-deadline, bfq) uses to order their writes against other requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoPriority {
    /// Leave it: the threads' requests take the class of the process (best effort, at the
    /// level its nice value gives).
    Inherit,
    /// Best effort, level 7, the lowest of that class.
    BestEffortLow,
    /// The idle class: served when no other class has requests queued.
    Idle,
}

/// Where a backend's write-bandwidth estimate and dirty ratelimit start
/// (`initial_write_bandwidth`; `crate::bandwidth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialBandwidth {
    /// The kernel's fixed start, 100 MB/s (`wb_init`).
    Kernel,
    /// The backend's declared speed ([`BackendConfig::declared_write_bandwidth`]: a device
    /// model's datasheet rate, a backend's own declaration); the kernel's start when none is
    /// declared.
    Auto,
    /// This rate, bytes/s.
    Rate(u64),
}

impl InitialBandwidth {
    /// The names the knob takes besides a rate.
    pub const NAMES: &'static [&'static str] = &["kernel", "auto"];
}

impl registry::KnobField for InitialBandwidth {
    fn to_value(&self) -> Option<Value> {
        Some(match *self {
            InitialBandwidth::Kernel => Value::Choice("kernel"),
            InitialBandwidth::Auto => Value::Choice("auto"),
            InitialBandwidth::Rate(bytes) => Value::Number(bytes),
        })
    }
    fn from_value(value: &Value) -> InitialBandwidth {
        match value {
            Value::Choice("kernel") => InitialBandwidth::Kernel,
            Value::Choice("auto") => InitialBandwidth::Auto,
            Value::Number(bytes) => InitialBandwidth::Rate(*bytes),
            other => panic!(
                "initial_write_bandwidth got {other:?}; settings are checked against their kind"
            ),
        }
    }
}

macro_rules! named_enum {
    ($ty:ident, $knob:literal, $($variant:ident => $name:literal),+) => {
        impl $ty {
            /// The names used in configuration files, on the command line and in reports.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The name used in configuration files, on the command line and in reports.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
        }
        impl registry::KnobField for $ty {
            fn to_value(&self) -> Option<Value> {
                Some(Value::Choice(self.name()))
            }
            fn from_value(value: &Value) -> $ty {
                match value {
                    $(Value::Choice($name) => $ty::$variant,)+
                    other => panic!("{} got {other:?}; settings are checked against their kind", $knob),
                }
            }
        }
        impl FromStr for $ty {
            type Err = ConfigError;
            fn from_str(s: &str) -> Result<Self, ConfigError> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(ConfigError::new($knob, format!(
                        "unknown value {s:?}; expected one of {}",
                        [$($name),+].join(", ")
                    ))),
                }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum!(ThrottlePolicy, "throttle", Legacy => "legacy", Bandwidth2010 => "bandwidth-2010", Ioless => "ioless");
named_enum!(ReclaimPolicy, "reclaim", Legacy => "legacy", FlusherOnly => "flusher-only");
named_enum!(UnstableAccounting, "unstable_accounting", Legacy2020 => "legacy-2020", Rfc2020 => "rfc-2020", Fixed => "fixed");
named_enum!(WbtMode, "wbt", Off => "off", On => "on", Ebb => "ebb");
named_enum!(IoPriority, "io_thread_ioprio", Inherit => "inherit", BestEffortLow => "best-effort-7", Idle => "idle");
named_enum!(CounterReads, "throttle_counter_reads", Pre2009 => "pre-2009", Reordered => "reordered");

// What each policy does, asked by the engine and the drivers as questions rather than `==` on
// a variant, so that a new variant is a compile error at every place that must decide for it.

impl ThrottlePolicy {
    /// Whether each writer's share of the recent dirtying is tracked, for the per-task dirty
    /// limit of the designs before the IO-less one (the 3.2 design dropped it).
    pub fn tracks_task_dirty_shares(self) -> bool {
        match self {
            ThrottlePolicy::Legacy | ThrottlePolicy::Bandwidth2010 => true,
            ThrottlePolicy::Ioless => false,
        }
    }

    /// Whether the flusher gives up its file and backs off while the backend's queue is full
    /// (pdflush's nonblocking writes, before 2.6.36); later flushers wait for a slot.
    pub fn flusher_backs_off_when_congested(self) -> bool {
        match self {
            ThrottlePolicy::Legacy => true,
            ThrottlePolicy::Bandwidth2010 | ThrottlePolicy::Ioless => false,
        }
    }

    /// Whether the design has position and rate control: its flusher sizes chunks from the
    /// bandwidth estimate, its pauses are bounded by `position::MAX_PAUSE`, and its runs chart
    /// the setpoint and the ratelimits.
    pub fn has_position_control(self) -> bool {
        match self {
            ThrottlePolicy::Ioless => true,
            ThrottlePolicy::Legacy | ThrottlePolicy::Bandwidth2010 => false,
        }
    }
}

impl ReclaimPolicy {
    /// Whether direct reclaim that scanned over 1.5 times its target wakes the flushers for as
    /// many pages as it scanned (2.6.3x-3.x).
    pub fn wakes_flushers_after_overscan(self) -> bool {
        match self {
            ReclaimPolicy::Legacy => true,
            ReclaimPolicy::FlusherOnly => false,
        }
    }

    /// Whether reclaim that met only dirty pages already under writeback waits a jiffy for the
    /// congested LRU (`reclaim_throttle`), since it never writes them itself.
    pub fn throttles_when_congested(self) -> bool {
        match self {
            ReclaimPolicy::FlusherOnly => true,
            ReclaimPolicy::Legacy => false,
        }
    }
}

impl UnstableAccounting {
    /// Whether the throttle check counts unstable pages as reclaimable (before the 2020 fix),
    /// so that they start background writeback, rather than with the pages under writeback.
    pub fn unstable_is_reclaimable(self) -> bool {
        match self {
            UnstableAccounting::Legacy2020 => true,
            UnstableAccounting::Rfc2020 | UnstableAccounting::Fixed => false,
        }
    }

    /// Whether a background pass counts unstable pages toward the background threshold
    /// (`wb_over_bg_thresh`), so that it goes on while dirty plus unstable pages exceed it:
    /// before v5.8, the posted RFC included.
    pub fn background_counts_unstable(self) -> bool {
        match self {
            UnstableAccounting::Legacy2020 | UnstableAccounting::Rfc2020 => true,
            UnstableAccounting::Fixed => false,
        }
    }
}

impl CounterReads {
    /// Whether the check reads the global counters again for the limits and after its loop
    /// (2.6.31, before Kennedy's reorder), rather than reusing one read per pass.
    pub fn rereads_global_counters(self) -> bool {
        match self {
            CounterReads::Pre2009 => true,
            CounterReads::Reordered => false,
        }
    }
}

impl WbtMode {
    /// Whether writeback throttling runs at all.
    pub fn is_on(self) -> bool {
        match self {
            WbtMode::Off => false,
            WbtMode::On | WbtMode::Ebb => true,
        }
    }

    /// Whether it is ebb's variant (learned target, smaller or paced writes beside reads).
    pub fn is_ebb(self) -> bool {
        match self {
            WbtMode::Ebb => true,
            WbtMode::Off | WbtMode::On => false,
        }
    }
}

/// A setting that cannot be honoured, with the knob that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The knob's name, e.g. `dirty_ratio` or `backends[1].max_ratio`.
    pub knob: String,
    /// Why the value is rejected.
    pub reason: String,
}

impl ConfigError {
    /// An error about `knob`.
    pub fn new(knob: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError { knob: knob.into(), reason: reason.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.knob, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// `dirty_ratio` of a cache whose backends all write in granules ([`Config::stage_for_granules`]).
pub const STAGING_DIRTY_RATIO: u32 = 60;
/// `dirty_background_ratio` of such a cache ([`Config::stage_for_granules`]).
pub const STAGING_DIRTY_BACKGROUND_RATIO: u32 = 50;

impl BackendConfig {
    /// A backend with the kernel's defaults: no ratio constraints, 128 requests of 512 KiB,
    /// wbt on.
    pub fn new(name: impl Into<String>) -> BackendConfig {
        BackendConfig { name: name.into(), ..BackendConfig::defaults() }
    }

    /// The rate, bytes/s, the backend's bandwidth estimate and dirty ratelimit start from:
    /// `initial_write_bandwidth`'s rate, or with `auto` the declared speed; `None` for the
    /// kernel's fixed start.
    pub fn initial_bandwidth_bytes(&self) -> Option<u64> {
        match self.initial_write_bandwidth {
            InitialBandwidth::Kernel => None,
            InitialBandwidth::Auto => self.declared_write_bandwidth,
            InitialBandwidth::Rate(bytes) => Some(bytes),
        }
    }

    /// The write-back granule holding page `page`, as a page range, if the backend has
    /// granules (`write_granule_bytes`, doubling every `write_granule_group` granules).
    pub fn granule_of(&self, page: u64) -> Option<std::ops::Range<u64>> {
        let mut pages = self.write_granule_bytes? / PAGE_SIZE;
        if self.write_granule_group == 0 {
            let start = page / pages * pages;
            return Some(start..start + pages);
        }
        let per_group = u64::from(self.write_granule_group);
        let mut group_start = 0u64;
        loop {
            let group_end = group_start.saturating_add(pages.saturating_mul(per_group));
            if page < group_end {
                let start = group_start + (page - group_start) / pages * pages;
                return Some(start..start.saturating_add(pages));
            }
            group_start = group_end;
            pages = pages.saturating_mul(2);
        }
    }

    /// The effective wbt latency target in microseconds; 0 means disabled.
    pub fn wbt_target_usec(&self) -> u64 {
        if !self.wbt.is_on() {
            return 0;
        }
        match self.wbt_lat_usec {
            Some(usec) => usec,
            None if self.rotational => 75_000,
            None => 2_000,
        }
    }

    /// Whether `wbt = ebb` paces background writes while reads are active (`wbt_min_duty`
    /// under 100).
    pub fn wbt_paces(&self) -> bool {
        self.wbt.is_ebb() && self.wbt_min_duty < 100 && self.wbt_target_usec() > 0
    }

    /// The largest write the engine issues to this backend, pages: `max_write_pages`, or
    /// `wbt_pace_write_pages` where `wbt = ebb` paces and that is larger.
    pub fn largest_write_pages(&self) -> u32 {
        if self.wbt_paces() {
            self.max_write_pages.max(self.wbt_pace_write_pages)
        } else {
            self.max_write_pages
        }
    }

    /// Sets a per-backend knob by its `/sys/class/bdi` (or block queue) name; the value's form
    /// and range are checked here, its sense beside the other knobs by [`Config::validate`].
    pub fn set_knob(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        knob(name)?.parse(value)?.apply_backend(self)
    }
}

impl Config {
    /// A cache of `memory_bytes` with one backend named `backend`, with the defaults of a mature
    /// kernel (dirty_ratio 20, dirty_background_ratio 10, expire 30 s, writeback every 5 s) and
    /// the default policies (`ioless`, `flusher-only`, `fixed`).
    pub fn new(memory_bytes: u64, backend: BackendConfig) -> Config {
        Config { memory_bytes, backends: vec![backend], ..Config::defaults() }
    }

    /// Dirty ratios of a cache that stages writes for object stores (ebb's own): when every
    /// backend has write granules (`write_granule_bytes`: an S3 upload's parts),
    /// `dirty_ratio` [`STAGING_DIRTY_RATIO`] and `dirty_background_ratio`
    /// [`STAGING_DIRTY_BACKGROUND_RATIO`] instead of the kernel's 20 and 10. Drivers call it
    /// before applying the user's knobs, which override it.
    ///
    /// A file being written holds up to a granule of dirty data that is not worth writing
    /// before it fills (a part written partly costs a commit and server-side copies of the
    /// file's earlier parts). The kernel's ratios are sized for a page cache that also holds
    /// everything else on the machine; here the cache exists for these writes, and with 20%
    /// a 256 MiB budget leaves room for the parts of only a few files: 16 parallel writers of
    /// 64 MiB through an S3 mount with 256 MiB took 144 s with the kernel's ratios, 16 s with
    /// these (one run each, on a loaded machine, 2026-11-26).
    pub fn stage_for_granules(&mut self) {
        if !self.backends.is_empty()
            && self.backends.iter().all(|b| b.write_granule_bytes.is_some())
        {
            self.dirty_ratio = STAGING_DIRTY_RATIO;
            self.dirty_background_ratio = STAGING_DIRTY_BACKGROUND_RATIO;
        }
    }

    /// Total pages of the memory budget.
    pub fn memory_pages(&self) -> u64 {
        self.memory_bytes / PAGE_SIZE
    }

    /// Sets a knob by its `/proc/sys/vm` name (sizes as [`parse_size`] says); a backend knob is set
    /// on every backend. The value's form and range are checked here, its sense beside the
    /// other knobs by [`Config::validate`].
    pub fn set_knob(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        knob(name)?.parse(value)?.apply(self);
        Ok(())
    }

    /// Rejects settings that cannot be honoured; the error names the knob.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_ranges()?;
        self.validate_global()?;
        self.validate_backends()
    }

    /// Every knob's value within its registered range.
    fn validate_ranges(&self) -> Result<(), ConfigError> {
        for knob in knobs() {
            match knob.scope {
                Scope::Global => {
                    if let Some(value) = knob.get(self) {
                        knob.check(&value).map_err(|reason| ConfigError::new(knob.name, reason))?;
                    }
                }
                Scope::Backend => {
                    for (i, backend) in self.backends.iter().enumerate() {
                        if let Some(value) = knob.get_backend(backend) {
                            knob.check(&value).map_err(|reason| {
                                ConfigError::new(format!("backends[{i}].{}", knob.name), reason)
                            })?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The checks that involve more than one global knob.
    fn validate_global(&self) -> Result<(), ConfigError> {
        let err = |knob: &str, reason: String| Err(ConfigError::new(knob, reason));
        if self.dirty_bytes > 0 && self.dirty_bytes < 2 * PAGE_SIZE {
            return err("dirty_bytes", format!("{} is below two pages", self.dirty_bytes));
        }
        for (name, bytes) in [
            ("dirty_bytes", self.dirty_bytes),
            ("dirty_background_bytes", self.dirty_background_bytes),
        ] {
            if bytes > self.memory_bytes {
                return err(
                    name,
                    format!(
                        "{bytes} is larger than the memory budget ({} bytes)",
                        self.memory_bytes
                    ),
                );
            }
        }
        if self.dirty_bytes == 0 && self.dirty_ratio == 0 {
            return err("dirty_ratio", "0 with dirty_bytes 0 leaves no room for dirty data".into());
        }
        let mut prev = 0;
        for &bound in &self.zone_bounds_bytes {
            if bound / PAGE_SIZE <= prev / PAGE_SIZE {
                return err(
                    "zone_bounds_bytes",
                    format!(
                        "bound {bound} is not above the previous one ({prev}) by at least a page"
                    ),
                );
            }
            prev = bound;
        }
        Ok(())
    }

    /// The backend list, the swap backend, and the checks across backends' knobs.
    fn validate_backends(&self) -> Result<(), ConfigError> {
        let err = |knob: &str, reason: String| Err(ConfigError::new(knob, reason));
        if self.backends.is_empty() {
            return err("backends", "at least one backend is needed".into());
        }
        if self.backends.len() > 4096 {
            return err(
                "backends",
                format!("{} backends exceed the limit of 4096", self.backends.len()),
            );
        }
        if let Some(swap) = self.swap_backend
            && swap >= self.backends.len()
        {
            return err(
                "swap_backend",
                format!("backend {swap} does not exist ({} backends)", self.backends.len()),
            );
        }
        for (i, b) in self.backends.iter().enumerate() {
            if let Some(bytes) = b.write_granule_bytes
                && !bytes.is_multiple_of(PAGE_SIZE)
            {
                return Err(ConfigError::new(
                    format!("backends[{i}].write_granule_bytes"),
                    format!("{bytes} is not a multiple of the page size ({PAGE_SIZE} bytes)"),
                ));
            }
            if b.min_ratio > b.max_ratio {
                return Err(ConfigError::new(
                    format!("backends[{i}].min_ratio"),
                    format!("{}% is above max_ratio {}%", b.min_ratio, b.max_ratio),
                ));
            }
        }
        let min_sum: u32 = self.backends.iter().map(|b| b.min_ratio).sum();
        if min_sum >= 100 {
            return err(
                "min_ratio",
                format!(
                    "the backends' min_ratio values add up to {min_sum}%, which must stay below 100%"
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Config {
        Config::new(1 << 30, BackendConfig::new("disk"))
    }

    /// The kernel defaults validate.
    #[test]
    fn defaults_are_valid() {
        assert_eq!(base().validate(), Ok(()));
    }

    type Mutation = Box<dyn Fn(&mut Config)>;

    /// Each impossible setting is rejected with the knob that holds it.
    #[test]
    fn impossible_settings_name_the_knob() {
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|c| c.dirty_ratio = 150), "dirty_ratio"),
            (Box::new(|c| c.dirty_background_ratio = 101), "dirty_background_ratio"),
            (Box::new(|c| c.dirty_bytes = 4096), "dirty_bytes"),
            (Box::new(|c| c.dirty_bytes = 2 << 30), "dirty_bytes"),
            (Box::new(|c| c.memory_bytes = 1 << 20), "memory_bytes"),
            (Box::new(|c| c.hz = 0), "hz"),
            (Box::new(|c| c.backends[0].max_ratio = 120), "backends[0].max_ratio"),
            (Box::new(|c| c.backends[0].min_ratio = 50), "min_ratio"),
            (Box::new(|c| c.backends[0].queue_depth = 0), "backends[0].queue_depth"),
            (Box::new(|c| c.backends.clear()), "backends"),
            (
                Box::new(|c| {
                    c.backends[0].min_ratio = 60;
                    c.backends[0].max_ratio = 100;
                    c.backends.push(BackendConfig { min_ratio: 40, ..BackendConfig::new("b") });
                }),
                "min_ratio",
            ),
            (Box::new(|c| c.zone_bounds_bytes = vec![16 << 20, 16 << 20]), "zone_bounds_bytes"),
            (Box::new(|c| c.zone_bounds_bytes = vec![0]), "zone_bounds_bytes"),
            (Box::new(|c| c.kswapd_scan_ns = 2_000_000), "kswapd_scan_ns"),
            (Box::new(|c| c.zone_bounds_bytes = vec![1 << 20; 8]), "zone_bounds_bytes"),
            (
                Box::new(|c| c.backends[0].write_granule_bytes = Some(5_000_000)),
                "backends[0].write_granule_bytes",
            ),
        ];
        for (i, (mutate, knob)) in cases.into_iter().enumerate() {
            let mut c = base();
            if knob == "min_ratio" && i == 7 {
                c.backends[0].max_ratio = 40;
            }
            mutate(&mut c);
            let err = c.validate().expect_err(knob);
            assert!(err.knob.ends_with(knob), "case {i}: {err}");
        }
    }

    /// Granules: one size, or doubling after each group, as an S3 layout's parts do.
    #[test]
    fn granules_cover_every_page_once() {
        let mut b = BackendConfig::new("b");
        assert_eq!(b.granule_of(7), None);
        b.write_granule_bytes = Some(4 * PAGE_SIZE);
        assert_eq!(b.granule_of(0), Some(0..4));
        assert_eq!(b.granule_of(9), Some(8..12));
        b.write_granule_group = 2;
        let expected = [0..4, 4..8, 8..16, 16..24, 24..40, 40..56, 56..88];
        for range in expected {
            for page in range.clone() {
                assert_eq!(b.granule_of(page), Some(range.clone()), "page {page}");
            }
        }
    }

    /// Knobs set by name parse their values and report the knob when a value is malformed or
    /// out of its range.
    #[test]
    fn knobs_by_name() {
        let mut c = base();
        c.set_knob("dirty_bytes", "64M").unwrap();
        assert_eq!(c.dirty_bytes, 64 << 20);
        c.set_knob("throttle", "legacy").unwrap();
        assert_eq!(c.throttle, ThrottlePolicy::Legacy);
        c.set_knob("wbt_lat_usec", "5000").unwrap();
        assert_eq!(c.backends[0].wbt_lat_usec, Some(5000));
        c.set_knob("strict_limit", "on").unwrap();
        assert!(c.backends[0].strict_limit);
        c.set_knob("initial_write_bandwidth", "2G").unwrap();
        assert_eq!(c.backends[0].initial_write_bandwidth, InitialBandwidth::Rate(2 << 30));
        c.set_knob("initial_write_bandwidth", "auto").unwrap();
        assert_eq!(c.backends[0].initial_write_bandwidth, InitialBandwidth::Auto);
        let err = c.set_knob("initial_write_bandwidth", "fast").unwrap_err();
        assert!(err.reason.contains("kernel, auto"), "{err}");
        c.set_knob("zone_bounds_bytes", "16MiB, 512MiB").unwrap();
        assert_eq!(c.zone_bounds_bytes, [16 << 20, 512 << 20]);
        c.set_knob("hw_queue_depth", "4").unwrap();
        assert_eq!(c.backends[0].hw_queue_depth, 4);
        c.backends[0].initial_write_bandwidth = InitialBandwidth::Rate(1);
        assert_eq!(c.validate().unwrap_err().knob, "backends[0].initial_write_bandwidth");
        c.backends[0].initial_write_bandwidth = InitialBandwidth::Kernel;
        let err = c.set_knob("dirty_ratio", "lots").unwrap_err();
        assert_eq!(err.knob, "dirty_ratio");
        let err = c.set_knob("dirty_bytes", "5Q").unwrap_err();
        assert!(err.reason.contains("powers of 1024"), "{err}");
        let err = c.set_knob("dirty_ration", "5").unwrap_err();
        assert!(err.reason.contains("unknown knob"), "{err}");
        let err = c.set_knob("dirty_ratio", "150").unwrap_err();
        assert!(err.reason.contains("outside 0..=100"), "{err}");
        c.dirty_ratio = 150;
        assert_eq!(c.validate().unwrap_err().knob, "dirty_ratio");
    }

    /// The size bug of issue 19: "64MB" meant 64 MiB to a knob set by name and 64,000,000
    /// bytes in an experiment file. Both now read it as 64,000,000, and "64M" as 64 MiB.
    #[test]
    fn decimal_and_binary_sizes_mean_one_thing_for_knobs() {
        let mut c = base();
        c.set_knob("dirty_bytes", "64MB").unwrap();
        assert_eq!(c.dirty_bytes, 64_000_000);
        c.set_knob("dirty_background_bytes", "64m").unwrap();
        assert_eq!(c.dirty_background_bytes, 64 << 20);
        let err = c.set_knob("dirty_bytes", "64mb").unwrap_err();
        assert!(err.reason.contains("powers of 1000"), "{err}");
    }

    /// The table in this module's doc is the registry's: adding a knob without regenerating
    /// it fails here, with the table to paste.
    #[test]
    fn module_doc_table_matches_the_registry() {
        let source = include_str!("mod.rs");
        let expected: String =
            knobs::doc_table().lines().map(|line| format!("//! {line}\n")).collect();
        let marker = source.find("//! <!-- knob table:").expect("the table's start marker");
        let start = marker + source[marker..].find('\n').expect("a line end") + 1;
        let end = source.find("//! <!-- end of knob table -->").expect("the table's end marker");
        assert!(
            source[start..end] == expected,
            "the knob table in config/mod.rs is stale; replace it with:\n{expected}"
        );
    }

    /// Every knob's default is in its range and reads back from its rendering, so each
    /// declaration's kind fits its type.
    #[test]
    fn every_default_renders_and_parses_back() {
        let mut config = base();
        for knob in knobs() {
            let Some(value) = knob.default_value() else { continue };
            assert_eq!(knob.check(&value), Ok(()), "{}", knob.name);
            let setting = knob.parse(&knob.render(&value)).expect(knob.name);
            assert_eq!(setting.value(), &value, "{}", knob.name);
            setting.apply(&mut config);
            assert_eq!(knob.get(&config), Some(value), "{}", knob.name);
            assert!(!knob.summary().is_empty(), "{} has no doc", knob.name);
        }
    }

    /// Policy names parse from their contract names and reject others with the knob's name.
    #[test]
    fn policy_names_parse() {
        assert_eq!("bandwidth-2010".parse::<ThrottlePolicy>(), Ok(ThrottlePolicy::Bandwidth2010));
        assert_eq!("flusher-only".parse::<ReclaimPolicy>(), Ok(ReclaimPolicy::FlusherOnly));
        assert_eq!("legacy-2020".parse::<UnstableAccounting>(), Ok(UnstableAccounting::Legacy2020));
        assert_eq!("rfc-2020".parse::<UnstableAccounting>(), Ok(UnstableAccounting::Rfc2020));
        let err = "fast".parse::<ThrottlePolicy>().unwrap_err();
        assert_eq!(err.knob, "throttle");
        assert!(err.reason.contains("ioless"));
    }
}
