//! Configuration: the kernel's knobs, with the kernel's names and units, and their validation.
//!
//! A `Config` describes one cache: its memory budget, its dirty limits, the policy chosen for
//! each mechanism, and the backends it writes to. [`Config::new`] starts from the defaults of a
//! mature Linux kernel; callers change fields and [`Config::validate`] rejects settings that
//! cannot be honoured, naming the knob. The engine refuses an invalid configuration.
//!
//! Knob semantics follow `/proc/sys/vm` and `/sys/class/bdi`:
//!
//! | knob | unit | default | meaning |
//! |---|---|---|---|
//! | `dirty_ratio` | % of dirtyable memory | 20 | hard dirty threshold; `dirty_bytes`, when nonzero, takes precedence as in the kernel |
//! | `dirty_bytes` | bytes | 0 | hard dirty threshold in bytes |
//! | `dirty_background_ratio` | % | 10 | flusher starts above this |
//! | `dirty_background_bytes` | bytes | 0 | same, in bytes |
//! | `dirty_expire_centisecs` | 1/100 s | 3000 | data older than this is written by periodic writeback |
//! | `dirty_writeback_centisecs` | 1/100 s | 500 | periodic flusher wakeup; 0 disables it |
//! | `min_ratio` (per backend) | % of the threshold | 0 | guaranteed share |
//! | `max_ratio` (per backend) | % of the threshold | 100 | cap on the share |
//! | `strict_limit` (per backend) | bool | false | throttle on the backend's own share (FUSE) |
//! | `wbt_lat_usec` (per backend) | us | 2000 solid state, 75000 rotating | read latency target; 0 disables wbt |
//! | `initial_write_bandwidth` (per backend, ebb's own) | bytes/s | unset (100 MB/s) | where the bandwidth estimate and ratelimit start |

use std::fmt;
use std::str::FromStr;

/// Bytes in one page. The core counts everything in 4 KiB pages, as x86-64 Linux does.
pub const PAGE_SIZE: u64 = 4096;

/// Writer-throttling policy (mechanism 3).
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

/// Reclaim policy (mechanism 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimPolicy {
    /// Reclaim writes dirty pages one at a time, from both direct and background reclaim.
    Legacy,
    /// Direct reclaim never writes; background reclaim writes only when in trouble.
    FlusherOnly,
}

/// How pages written to a two-phase backend but not yet committed are counted (mechanism 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnstableAccounting {
    /// Before v5.8: unstable pages count as reclaimable, so they trigger background writeback.
    Legacy2020,
    /// Since v5.8: unstable pages count with writeback; writeback starts only above thresholds.
    Fixed,
}

/// Writeback throttling (mechanism 5) on or off for a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WbtMode {
    /// No limit on in-flight background writes beyond the queue depth.
    Off,
    /// The latency-targeted limit of blk-wbt.
    On,
}

macro_rules! named_enum {
    ($ty:ident, $knob:literal, $($variant:ident => $name:literal),+) => {
        impl $ty {
            /// The name used in configuration files, on the command line and in reports.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
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
named_enum!(UnstableAccounting, "unstable_accounting", Legacy2020 => "legacy-2020", Fixed => "fixed");
named_enum!(WbtMode, "wbt", Off => "off", On => "on");

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

/// One backend: the kernel's `bdi` with its single writeback context.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendConfig {
    /// Name used in traces (`bdi=<name>`) and stats.
    pub name: String,
    /// Guaranteed share of the dirty threshold, percent.
    pub min_ratio: u32,
    /// Cap on the share of the dirty threshold, percent.
    pub max_ratio: u32,
    /// Throttle writers against this backend's own share even below the global freerun point.
    pub strict_limit: bool,
    /// Requests the backend accepts at once (the block layer's `nr_requests`). Submitters wait
    /// for a free slot beyond this, which is what paces the flusher.
    pub queue_depth: u32,
    /// Largest single write, pages (the block layer's `max_sectors_kb`). Contiguous dirty pages
    /// go out as one write up to this size.
    pub max_write_pages: u32,
    /// The device's own command queue depth (NCQ tags; the kernel's `blk_queue_depth`), which
    /// sizes writeback throttling's limits; `queue_depth` above is the software queue.
    pub hw_queue_depth: u32,
    /// Whether the device rotates (selects the wbt latency default).
    pub rotational: bool,
    /// Whether the device has a volatile write cache (wbt drains fully before waking writers).
    pub write_cache: bool,
    /// Writeback throttling on or off.
    pub wbt: WbtMode,
    /// wbt read-latency target, microseconds; `None` takes the kernel default for the device
    /// kind (2 ms solid state, 75 ms rotating); `Some(0)` disables wbt.
    pub wbt_lat_usec: Option<u64>,
    /// wbt window, microseconds (the kernel's 100 ms default).
    pub wbt_window_usec: u64,
    /// Starting write bandwidth estimate, bytes/s (`None`: the kernel's 100 MB/s). Not a kernel
    /// knob: a long-lived cache learns its device over tens of seconds (the estimate moves ~5%
    /// per 200 ms and the ratelimit more slowly); a user who knows the device can start there.
    pub initial_write_bandwidth: Option<u64>,
}

impl BackendConfig {
    /// A backend with the kernel's defaults: no ratio constraints, 128 requests of 512 KiB,
    /// wbt on.
    pub fn new(name: impl Into<String>) -> BackendConfig {
        BackendConfig {
            name: name.into(),
            min_ratio: 0,
            max_ratio: 100,
            strict_limit: false,
            queue_depth: 128,
            max_write_pages: 128,
            hw_queue_depth: 32,
            rotational: false,
            write_cache: false,
            wbt: WbtMode::On,
            wbt_lat_usec: None,
            wbt_window_usec: 100_000,
            initial_write_bandwidth: None,
        }
    }

    /// The effective wbt latency target in microseconds; 0 means disabled.
    pub fn wbt_target_usec(&self) -> u64 {
        if self.wbt == WbtMode::Off {
            return 0;
        }
        match self.wbt_lat_usec {
            Some(usec) => usec,
            None if self.rotational => 75_000,
            None => 2_000,
        }
    }
}

/// The configuration of one cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Scheduler ticks per second; several kernel formulas round through it.
    pub hz: u64,
    /// CPUs the kernel formulas assume (`ratelimit_pages`, counter error bounds).
    pub nr_cpus: u32,
    /// The memory the cache may use, bytes (the kernel's RAM). Dirtyable memory derives from it.
    pub memory_bytes: u64,
    /// See the module table.
    pub dirty_ratio: u32,
    /// See the module table.
    pub dirty_bytes: u64,
    /// See the module table.
    pub dirty_background_ratio: u32,
    /// See the module table.
    pub dirty_background_bytes: u64,
    /// See the module table.
    pub dirty_expire_centisecs: u32,
    /// See the module table.
    pub dirty_writeback_centisecs: u32,
    /// `min_free_kbytes`; `None` derives it from memory as the kernel does.
    pub min_free_kbytes: Option<u64>,
    /// Distance between watermarks, in 1/10000 of memory (kernel default 10).
    pub watermark_scale_factor: u32,
    /// Memory zones: the physical addresses (bytes of memory from 0, increasing) where each
    /// lower zone ends; the zone above the last bound runs to the end of memory, and bounds at
    /// or beyond the end of memory are ignored (as `mem=` trims the zones above it). Empty (the
    /// default): one zone. x86-64 of the 2.6/3.x era: `[16 MiB, 4 GiB]` (DMA, DMA32, Normal).
    /// See `memory` for what zones change.
    pub zone_bounds_bytes: Vec<u64>,
    /// Writer-throttling policy.
    pub throttle: ThrottlePolicy,
    /// Reclaim policy.
    pub reclaim: ReclaimPolicy,
    /// kswapd's CPU time per page it scans, in nanoseconds: a batch of reclaim takes this times
    /// the pages it scanned of virtual time, while writers keep allocating (see `reclaim`).
    /// Default 0: kswapd balances the zones instantly, in the event that wakes it (the real-time
    /// runtime spends real CPU time instead, and the landed experiments were measured so).
    /// `reclaim-writeback` sets 2000 (2 us), an assumption, not from the postings: the order of
    /// a 2011 core isolating, checking and freeing one clean page-cache page (about 2 GB/s of
    /// clean cache per core).
    pub kswapd_scan_ns: u64,
    /// The backend anonymous pages are swapped out to (`None`: no swap, anonymous memory is
    /// never reclaimed).
    pub swap_backend: Option<usize>,
    /// Accounting of unstable pages.
    pub unstable_accounting: UnstableAccounting,
    /// Whether the engine records trace events (costs time; off for benchmarks).
    pub trace: bool,
    /// The backends; `BackendId(i)` is `backends[i]`.
    pub backends: Vec<BackendConfig>,
}

impl Config {
    /// A cache of `memory_bytes` with one backend named `backend`, with the defaults of a mature
    /// kernel (dirty_ratio 20, dirty_background_ratio 10, expire 30 s, writeback every 5 s) and
    /// the default policies (`ioless`, `flusher-only`, `fixed`).
    pub fn new(memory_bytes: u64, backend: BackendConfig) -> Config {
        Config {
            hz: 1000,
            nr_cpus: 4,
            memory_bytes,
            dirty_ratio: 20,
            dirty_bytes: 0,
            dirty_background_ratio: 10,
            dirty_background_bytes: 0,
            dirty_expire_centisecs: 3000,
            dirty_writeback_centisecs: 500,
            min_free_kbytes: None,
            watermark_scale_factor: 10,
            zone_bounds_bytes: Vec::new(),
            throttle: ThrottlePolicy::Ioless,
            reclaim: ReclaimPolicy::FlusherOnly,
            kswapd_scan_ns: 0,
            swap_backend: None,
            unstable_accounting: UnstableAccounting::Fixed,
            trace: false,
            backends: vec![backend],
        }
    }

    /// Total pages of the memory budget.
    pub fn memory_pages(&self) -> u64 {
        self.memory_bytes / PAGE_SIZE
    }

    /// Rejects settings that cannot be honoured; the error names the knob.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |knob: &str, reason: String| Err(ConfigError::new(knob, reason));
        if self.hz == 0 || self.hz > 10_000 {
            return err("hz", format!("{} is outside 1..=10000", self.hz));
        }
        if self.nr_cpus == 0 || self.nr_cpus > 65_536 {
            return err("nr_cpus", format!("{} is outside 1..=65536", self.nr_cpus));
        }
        if self.memory_pages() < 1024 {
            return err(
                "memory_bytes",
                format!("{} bytes is below the 4 MiB minimum (1024 pages)", self.memory_bytes),
            );
        }
        if self.memory_pages() > u64::from(u32::MAX) - 1 {
            return err("memory_bytes", format!("{} bytes exceeds 16 TiB", self.memory_bytes));
        }
        if self.dirty_ratio > 100 {
            return err("dirty_ratio", format!("{}% is above 100%", self.dirty_ratio));
        }
        if self.dirty_background_ratio > 100 {
            return err(
                "dirty_background_ratio",
                format!("{}% is above 100%", self.dirty_background_ratio),
            );
        }
        if self.dirty_bytes > 0 && self.dirty_bytes < 2 * PAGE_SIZE {
            return err("dirty_bytes", format!("{} is below two pages", self.dirty_bytes));
        }
        if self.dirty_bytes > self.memory_bytes {
            return err(
                "dirty_bytes",
                format!(
                    "{} is larger than the memory budget ({} bytes)",
                    self.dirty_bytes, self.memory_bytes
                ),
            );
        }
        if self.dirty_background_bytes > self.memory_bytes {
            return err(
                "dirty_background_bytes",
                format!(
                    "{} is larger than the memory budget ({} bytes)",
                    self.dirty_background_bytes, self.memory_bytes
                ),
            );
        }
        if self.dirty_bytes == 0 && self.dirty_ratio == 0 {
            return err("dirty_ratio", "0 with dirty_bytes 0 leaves no room for dirty data".into());
        }
        if self.watermark_scale_factor == 0 || self.watermark_scale_factor > 3000 {
            return err(
                "watermark_scale_factor",
                format!("{} is outside 1..=3000", self.watermark_scale_factor),
            );
        }
        if self.kswapd_scan_ns > 1_000_000 {
            return err(
                "kswapd_scan_ns",
                format!("{} ns per page scanned is above 1 ms", self.kswapd_scan_ns),
            );
        }
        if self.zone_bounds_bytes.len() > 7 {
            return err(
                "zone_bounds_bytes",
                format!("{} bounds exceed the limit of 7 (8 zones)", self.zone_bounds_bytes.len()),
            );
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
        let mut min_sum = 0u32;
        for (i, b) in self.backends.iter().enumerate() {
            let knob = |k: &str| format!("backends[{i}].{k}");
            if b.max_ratio > 100 {
                return Err(ConfigError::new(
                    knob("max_ratio"),
                    format!("{}% is above 100%", b.max_ratio),
                ));
            }
            if b.min_ratio > b.max_ratio {
                return Err(ConfigError::new(
                    knob("min_ratio"),
                    format!("{}% is above max_ratio {}%", b.min_ratio, b.max_ratio),
                ));
            }
            min_sum += b.min_ratio;
            if b.queue_depth == 0 || b.queue_depth > 65_536 {
                return Err(ConfigError::new(
                    knob("queue_depth"),
                    format!("{} is outside 1..=65536", b.queue_depth),
                ));
            }
            if b.hw_queue_depth == 0 || b.hw_queue_depth > 65_536 {
                return Err(ConfigError::new(
                    knob("hw_queue_depth"),
                    format!("{} is outside 1..=65536", b.hw_queue_depth),
                ));
            }
            if b.max_write_pages == 0 || b.max_write_pages > 65_536 {
                return Err(ConfigError::new(
                    knob("max_write_pages"),
                    format!("{} is outside 1..=65536", b.max_write_pages),
                ));
            }
            if b.wbt_window_usec < 1_000 || b.wbt_window_usec > 10_000_000 {
                return Err(ConfigError::new(
                    knob("wbt_window_usec"),
                    format!("{} is outside 1000..=10000000", b.wbt_window_usec),
                ));
            }
            if let Some(bw) = b.initial_write_bandwidth
                && !(PAGE_SIZE..=1 << 40).contains(&bw)
            {
                return Err(ConfigError::new(
                    knob("initial_write_bandwidth"),
                    format!("{bw} bytes/s is outside 4 KiB/s..=1 TiB/s"),
                ));
            }
            if let Some(lat) = b.wbt_lat_usec
                && lat > 10_000_000
            {
                return Err(ConfigError::new(
                    knob("wbt_lat_usec"),
                    format!("{lat} us is above the 10 s maximum"),
                ));
            }
        }
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

/// Parses a knob value, naming the knob when it is malformed.
fn parse_knob<T: FromStr>(knob: &str, value: &str, what: &str) -> Result<T, ConfigError> {
    value.trim().parse().map_err(|_| ConfigError::new(knob, format!("{value:?} is not {what}")))
}

/// Parses a byte count with an optional binary suffix (`K`, `M`, `G`, `T`, with or without `iB`).
pub fn parse_bytes(knob: &str, value: &str) -> Result<u64, ConfigError> {
    let v = value.trim();
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = v[digits.len()..].to_ascii_lowercase();
    let shift = match suffix.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(ConfigError::new(
                knob,
                format!("{value:?}: unknown size suffix {suffix:?} (use K, M, G or T)"),
            ));
        }
    };
    let n: u64 = parse_knob(knob, digits, "a byte count")?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| ConfigError::new(knob, format!("{value:?} does not fit in 64 bits")))
}

impl BackendConfig {
    /// Names of the knobs [`BackendConfig::set_knob`] accepts.
    pub const KNOBS: &'static [&'static str] = &[
        "min_ratio",
        "max_ratio",
        "strict_limit",
        "queue_depth",
        "max_write_pages",
        "hw_queue_depth",
        "rotational",
        "write_cache",
        "wbt",
        "wbt_lat_usec",
        "wbt_window_usec",
        "initial_write_bandwidth",
    ];

    /// Sets a per-backend knob by its `/sys/class/bdi` (or block queue) name. Values are checked
    /// for form here and for sense by [`Config::validate`].
    pub fn set_knob(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        match name {
            "min_ratio" => self.min_ratio = parse_knob(name, value, "a percentage")?,
            "max_ratio" => self.max_ratio = parse_knob(name, value, "a percentage")?,
            "strict_limit" => self.strict_limit = parse_bool(name, value)?,
            "queue_depth" => self.queue_depth = parse_knob(name, value, "a request count")?,
            "max_write_pages" => self.max_write_pages = parse_knob(name, value, "a page count")?,
            "hw_queue_depth" => self.hw_queue_depth = parse_knob(name, value, "a request count")?,
            "rotational" => self.rotational = parse_bool(name, value)?,
            "write_cache" => self.write_cache = parse_bool(name, value)?,
            "wbt" => self.wbt = value.trim().parse()?,
            "wbt_lat_usec" => self.wbt_lat_usec = Some(parse_knob(name, value, "microseconds")?),
            "wbt_window_usec" => self.wbt_window_usec = parse_knob(name, value, "microseconds")?,
            "initial_write_bandwidth" => {
                self.initial_write_bandwidth = Some(parse_bytes(name, value)?)
            }
            _ => return Err(unknown_knob(name)),
        }
        Ok(())
    }
}

fn parse_bool(knob: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(ConfigError::new(knob, format!("{value:?} is not a boolean (1/0, on/off)"))),
    }
}

fn unknown_knob(name: &str) -> ConfigError {
    ConfigError::new(
        name,
        format!(
            "unknown knob; cache knobs: {}; backend knobs: {}",
            Config::KNOBS.join(", "),
            BackendConfig::KNOBS.join(", ")
        ),
    )
}

impl Config {
    /// Names of the knobs [`Config::set_knob`] accepts (besides the backend knobs).
    pub const KNOBS: &'static [&'static str] = &[
        "hz",
        "nr_cpus",
        "memory_bytes",
        "dirty_ratio",
        "dirty_bytes",
        "dirty_background_ratio",
        "dirty_background_bytes",
        "dirty_expire_centisecs",
        "dirty_writeback_centisecs",
        "min_free_kbytes",
        "watermark_scale_factor",
        "throttle",
        "reclaim",
        "kswapd_scan_ns",
        "unstable_accounting",
        "trace",
    ];

    /// Sets a knob by its `/proc/sys/vm` name (byte knobs accept K/M/G/T suffixes). A backend
    /// knob (see [`BackendConfig::KNOBS`]) is set on every backend. Values are checked for form
    /// here and for sense by [`Config::validate`].
    pub fn set_knob(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        match name {
            "hz" => self.hz = parse_knob(name, value, "a tick rate")?,
            "nr_cpus" => self.nr_cpus = parse_knob(name, value, "a CPU count")?,
            "memory_bytes" => self.memory_bytes = parse_bytes(name, value)?,
            "dirty_ratio" => self.dirty_ratio = parse_knob(name, value, "a percentage")?,
            "dirty_bytes" => self.dirty_bytes = parse_bytes(name, value)?,
            "dirty_background_ratio" => {
                self.dirty_background_ratio = parse_knob(name, value, "a percentage")?
            }
            "dirty_background_bytes" => self.dirty_background_bytes = parse_bytes(name, value)?,
            "dirty_expire_centisecs" => {
                self.dirty_expire_centisecs = parse_knob(name, value, "centiseconds")?
            }
            "dirty_writeback_centisecs" => {
                self.dirty_writeback_centisecs = parse_knob(name, value, "centiseconds")?
            }
            "min_free_kbytes" => self.min_free_kbytes = Some(parse_knob(name, value, "KiB")?),
            "watermark_scale_factor" => {
                self.watermark_scale_factor = parse_knob(name, value, "a factor")?
            }
            "throttle" => self.throttle = value.trim().parse()?,
            "reclaim" => self.reclaim = value.trim().parse()?,
            "kswapd_scan_ns" => {
                self.kswapd_scan_ns = parse_knob(name, value, "nanoseconds per page")?
            }
            "unstable_accounting" => self.unstable_accounting = value.trim().parse()?,
            "trace" => self.trace = parse_bool(name, value)?,
            _ if BackendConfig::KNOBS.contains(&name) => {
                for b in &mut self.backends {
                    b.set_knob(name, value)?;
                }
            }
            _ => return Err(unknown_knob(name)),
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

    /// Knobs set by name parse their values and report the knob when a value is malformed.
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
        assert_eq!(c.backends[0].initial_write_bandwidth, Some(2 << 30));
        c.backends[0].initial_write_bandwidth = Some(1);
        assert_eq!(c.validate().unwrap_err().knob, "backends[0].initial_write_bandwidth");
        c.backends[0].initial_write_bandwidth = None;
        let err = c.set_knob("dirty_ratio", "lots").unwrap_err();
        assert_eq!(err.knob, "dirty_ratio");
        let err = c.set_knob("dirty_bytes", "5Q").unwrap_err();
        assert!(err.reason.contains("suffix"), "{err}");
        let err = c.set_knob("dirty_ration", "5").unwrap_err();
        assert!(err.reason.contains("unknown knob"), "{err}");
        c.set_knob("dirty_ratio", "150").unwrap();
        assert_eq!(c.validate().unwrap_err().knob, "dirty_ratio");
    }

    /// Policy names parse from their contract names and reject others with the knob's name.
    #[test]
    fn policy_names_parse() {
        assert_eq!("bandwidth-2010".parse::<ThrottlePolicy>(), Ok(ThrottlePolicy::Bandwidth2010));
        assert_eq!("flusher-only".parse::<ReclaimPolicy>(), Ok(ReclaimPolicy::FlusherOnly));
        assert_eq!("legacy-2020".parse::<UnstableAccounting>(), Ok(UnstableAccounting::Legacy2020));
        let err = "fast".parse::<ThrottlePolicy>().unwrap_err();
        assert_eq!(err.knob, "throttle");
        assert!(err.reason.contains("ioless"));
    }
}
