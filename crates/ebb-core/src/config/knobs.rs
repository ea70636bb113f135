//! The knobs, each declared once: its field, doc, default, unit and kind (parser and range).
//! The [`declare_knobs!`] macro turns this into `Config`, `BackendConfig` and the registry (see
//! `registry.rs`); the `config` module doc's table is rendered from it (a test checks it). The
//! lookups over the table (`knob`, `parse_setting`, `doc_table`) are here too, so the registry
//! (the types and the macro) names nothing of this file.
//!
//! To add a knob, add one entry to the `knobs` block of its struct: a doc whose first paragraph
//! is the table's one-line meaning, then `name: Type = default, "unit", Kind;`. The type must be
//! one `KnobField` knows (`u32`, `u64`, `Option<u64>`, `bool`, `Vec<u64>`, a policy enum made
//! with `named_enum!`). Its name is then accepted by `Config::set_knob`, experiment files,
//! `--knob` and the command line's own flag, and `Builder::knob`, and its range is checked by
//! `Config::validate`; checks that involve other knobs go in `Config::validate` by hand.

use super::ConfigError;
use super::registry::{Access, Kind, Knob, KnobField, Scope, Setting, declare_knobs};
use super::{
    CounterReads, InitialBandwidth, IoPriority, MEMORY_BYTES_MAX, ReclaimPolicy, ThrottlePolicy,
    UnstableAccounting, WbtMode,
};

const U32_MAX: u64 = u32::MAX as u64;

declare_knobs! {
    /// The configuration of one cache: its memory budget, its dirty limits, the policy chosen
    /// for each mechanism, and the backends it writes to.
    pub struct Config {
        knobs {
            /// Scheduler ticks per second; several kernel formulas round through it.
            hz: u64 = 1000, "ticks/s", Kind::Number { min: 1, max: 10_000 };
            /// CPUs the kernel formulas assume (`ratelimit_pages`, counter error bounds).
            nr_cpus: u32 = 4, "CPUs", Kind::Number { min: 1, max: 65_536 };
            /// The memory the cache may use (the kernel's RAM); dirtyable memory derives from it.
            memory_bytes: u64 = 256 << 20, "bytes",
                Kind::Bytes { min: 4 << 20, max: MEMORY_BYTES_MAX };
            /// Hard dirty threshold, % of dirtyable memory; `dirty_bytes`, when nonzero, takes
            /// precedence as in the kernel.
            ///
            /// 60 by default when every backend writes in granules (an S3 bucket:
            /// `Config::stage_for_granules`).
            dirty_ratio: u32 = 20, "%", Kind::Number { min: 0, max: 100 };
            /// Hard dirty threshold in bytes (0: use `dirty_ratio`).
            dirty_bytes: u64 = 0, "bytes", Kind::Bytes { min: 0, max: u64::MAX };
            /// The flusher starts writing back above this, % of dirtyable memory.
            ///
            /// 50 by default when every backend writes in granules
            /// (`Config::stage_for_granules`).
            dirty_background_ratio: u32 = 10, "%", Kind::Number { min: 0, max: 100 };
            /// The background threshold in bytes (0: use `dirty_background_ratio`).
            dirty_background_bytes: u64 = 0, "bytes", Kind::Bytes { min: 0, max: u64::MAX };
            /// Data older than this is written by periodic writeback.
            dirty_expire_centisecs: u32 = 3000, "1/100 s", Kind::Number { min: 0, max: U32_MAX };
            /// Periodic flusher wakeup interval; 0 disables it.
            dirty_writeback_centisecs: u32 = 500, "1/100 s",
                Kind::Number { min: 0, max: U32_MAX };
            /// Memory kept free for allocations that cannot wait; unset derives it from memory
            /// as the kernel does.
            min_free_kbytes: Option<u64> = None, "KiB", Kind::Number { min: 0, max: u64::MAX };
            /// Distance between watermarks, in 1/10000 of memory.
            watermark_scale_factor: u32 = 10, "1/10000", Kind::Number { min: 1, max: 3000 };
            /// Memory zones: where each lower zone ends (empty: one zone).
            ///
            /// The physical addresses (bytes of memory from 0, increasing) where each lower
            /// zone ends; the zone above the last bound runs to the end of memory, and bounds
            /// at or beyond the end of memory are ignored (as `mem=` trims the zones above it).
            /// x86-64 of the 2.6/3.x era: `16MiB,4GiB` (DMA, DMA32, Normal). See `memory` for
            /// what zones change.
            zone_bounds_bytes: Vec<u64> = Vec::new(), "bytes", Kind::Sizes { max_len: 7 };
            /// Writer-throttling policy (docs/mechanisms.md#3-writer-throttling).
            throttle: ThrottlePolicy = ThrottlePolicy::Ioless, "",
                Kind::Choice(ThrottlePolicy::NAMES);
            /// Reclaim policy (docs/mechanisms.md#6-reclaim).
            reclaim: ReclaimPolicy = ReclaimPolicy::FlusherOnly, "",
                Kind::Choice(ReclaimPolicy::NAMES);
            /// kswapd's CPU time per page it scans (0: kswapd balances the zones instantly).
            ///
            /// A batch of reclaim takes this times the pages it scanned of virtual time, while
            /// writers keep allocating (see `reclaim`). At 0, kswapd balances the zones in the
            /// event that wakes it (the real-time runtime spends real CPU time instead, and the
            /// landed experiments were measured so). `reclaim-writeback` sets 2000 (2 us), an
            /// assumption, not from the postings: the order of a 2011 core isolating, checking
            /// and freeing one clean page-cache page (about 2 GB/s of clean cache per core).
            kswapd_scan_ns: u64 = 0, "ns/page", Kind::Number { min: 0, max: 1_000_000 };
            /// Accounting of pages written to a two-phase backend but not yet committed
            /// (docs/mechanisms.md#7-two-phase-backends).
            unstable_accounting: UnstableAccounting = UnstableAccounting::Fixed, "",
                Kind::Choice(UnstableAccounting::NAMES);
            /// Which shared counters the legacy throttle check reads
            /// (docs/mechanisms.md#8-cheap-throttle-path):
            /// `reordered` (2.6.32 on, Kennedy 2009: each once per pass, reused after the
            /// loop) or `pre-2009` (2.6.31: re-read for the limits, again to clip the
            /// backend's limit, and again after the loop); docs/throttling.md.
            throttle_counter_reads: CounterReads = CounterReads::Reordered, "",
                Kind::Choice(CounterReads::NAMES);
            /// Nice value of the runtime's IO threads (ebb's own; 0: the priority of the
            /// thread that built the cache).
            ///
            /// The IO threads copy pages out of the cache and wait for the backend; on a machine
            /// with few CPUs a busy one delays a reader's wakeup, as the kernel's flusher, which
            /// copies nothing, does not. At a higher nice value the scheduler runs the woken
            /// foreground thread first. The simulator has no threads and ignores it.
            io_thread_nice: u32 = 10, "nice", Kind::Number { min: 0, max: 19 };
            /// IO priority of the runtime's IO threads: inherit, best-effort-7 or idle.
            ///
            /// The block layer's IO scheduler (mq-deadline since Linux 5.14, bfq) serves a
            /// higher class first; the simulator ignores it.
            io_thread_ioprio: IoPriority = IoPriority::Inherit, "",
                Kind::Choice(IoPriority::NAMES);
        }
        fields {
            /// The backend anonymous pages are swapped out to (`None`: no swap, anonymous memory
            /// is never reclaimed).
            swap_backend: Option<usize> = None,
            /// Whether the engine records trace events (costs time; off for benchmarks). Set by
            /// the driver that writes the trace, not a knob.
            trace: bool = false,
            /// The backends; `BackendId(i)` is `backends[i]`.
            backends: Vec<BackendConfig> = Vec::new(),
            /// Bytes each file the engine knows costs beside its cached pages (the engine's
            /// record, its page map, the driver's tables), charged against `memory_bytes` as
            /// the kernel's inode slab is (`engine/forget.rs`). Set by the driver, which
            /// measures its own; 0 (the simulator) charges nothing. Not a knob.
            file_state_bytes: u64 = 0,
        }
    }

    /// One backend: the kernel's `bdi` with its single writeback context.
    pub struct BackendConfig {
        knobs {
            /// Guaranteed share of the dirty threshold.
            min_ratio: u32 = 0, "% of the threshold", Kind::Number { min: 0, max: 100 };
            /// Cap on the share of the dirty threshold.
            max_ratio: u32 = 100, "% of the threshold", Kind::Number { min: 0, max: 100 };
            /// Throttle writers against this backend's own share even below the global freerun
            /// point (FUSE).
            strict_limit: bool = false, "", Kind::Bool;
            /// Requests the backend accepts at once (the block layer's `nr_requests`).
            ///
            /// Submitters wait for a free slot beyond this, which is what paces the flusher.
            queue_depth: u32 = 128, "requests", Kind::Number { min: 1, max: 65_536 };
            /// Largest single write (the block layer's `max_sectors_kb`).
            ///
            /// Contiguous dirty pages go out as one write up to this size.
            max_write_pages: u32 = 128, "pages", Kind::Number { min: 1, max: 65_536 };
            /// The device's own command queue depth (NCQ tags), which sizes wbt's limits.
            ///
            /// The kernel's `blk_queue_depth`; `queue_depth` is the software queue.
            hw_queue_depth: u32 = 32, "requests", Kind::Number { min: 1, max: 65_536 };
            /// Whether the device rotates (selects the wbt latency default).
            rotational: bool = false, "", Kind::Bool;
            /// Whether the device has a volatile write cache (wbt drains fully before waking
            /// writers).
            write_cache: bool = false, "", Kind::Bool;
            /// Writeback throttling (docs/mechanisms.md#5-writeback-throttling-wbt): off, on (the
            /// kernel's algorithm) or ebb (its target learned from the device, smaller writes
            /// while reads are active).
            wbt: WbtMode = WbtMode::On, "", Kind::Choice(WbtMode::NAMES);
            /// wbt read-latency target (0 disables wbt); unset takes the kernel default for the
            /// device kind: 2000 solid state, 75000 rotating.
            wbt_lat_usec: Option<u64> = None, "us", Kind::Number { min: 0, max: 10_000_000 };
            /// wbt window (the kernel's 100 ms default).
            wbt_window_usec: u64 = 100_000, "us", Kind::Number { min: 1_000, max: 10_000_000 };
            /// The smallest background write of `wbt = ebb` while reads are active (ebb's own).
            ///
            /// Smaller writes keep a read's wait behind the write in service shorter and cost
            /// write throughput; 32 pages (128 KiB) kept ebb's writer faster than the kernel's on
            /// the development machine's virtio disk.
            wbt_min_write_pages: u32 = 32, "pages", Kind::Number { min: 1, max: 65_536 };
            /// The fewest background writes `wbt = ebb` keeps in flight (ebb's own; 1 is the
            /// kernel's floor).
            ///
            /// A backend whose writes to one file go out one at a time anyway (a local
            /// directory, through the runtime's per-file lane) is given 2: the next write is
            /// then copied out and waiting when one completes, rather than issued after it,
            /// while the device still serves one at a time.
            wbt_min_depth: u32 = 1, "requests", Kind::Number { min: 1, max: 65_536 };
            /// The least share of the time `wbt = ebb` keeps a background write in service
            /// while reads are active (ebb's own); under 100 it paces whole writes, one at a
            /// time with a gap after each, instead of shrinking them; 100: no pacing.
            ///
            /// A missed window halves the share (down to this floor), a met one adds 1/16 back;
            /// the floor is what keeps the writer's share of the device while a reader misses
            /// the target all the time.
            wbt_min_duty: u32 = 100, "%", Kind::Number { min: 1, max: 100 };
            /// The largest background write of `wbt = ebb` while it paces (ebb's own; may exceed
            /// `max_write_pages`).
            ///
            /// A paced write's gap scales with its service time, so a few large writes leave the
            /// same idle share as many small ones with fewer interruptions of the reads; 1024
            /// pages (4 MiB) is about the size in which the kernel's writeback reached the
            /// development machine's virtio disk (3.2-3.7 MiB per request).
            wbt_pace_write_pages: u32 = 1024, "pages", Kind::Number { min: 1, max: 65_536 };
            /// Whether `wbt = ebb` stops pacing while a writer of the backend was throttled in
            /// the last second (ebb's own; the kernel's wbt gives writes its full depth then,
            /// `wb_recent_wait`).
            ///
            /// Off, pacing holds the writer's share at the duty whatever the writers need, so a
            /// writer faster than the paced share is throttled to it; on, a throttled writer
            /// lifts the pacing until its dirty data falls back under the throttling point.
            wbt_pace_yields: bool = false, "", Kind::Bool;
            /// COMMIT batch of a two-phase backend, as a share of its dirty threshold (ebb's
            /// own); 0: the kernel's NFS rule, a COMMIT after each writepages call's writes.
            ///
            /// A COMMIT is a server-side fsync; with a small cache the kernel's rule sends one
            /// per call (every 8 MiB with a 256 MiB budget). Set, a completed call's COMMIT
            /// waits until the file's unstable pages reach this share of the backend's dirty
            /// threshold or no write of the file is in flight; fsync, sync and close commit at
            /// once as always. It halves the COMMITs but was slower where measured: the
            /// simulated gigabit server (`experiments/in-progress/commit-batch.toml`, 61 against
            /// 74 MB/s) and a local ganesha at 256 MiB (0.60 against 0.64 of the raw client).
            commit_batch_ratio: u32 = 0, "% of the dirty threshold",
                Kind::Number { min: 0, max: 100 };
            /// Cap on the backend's share of the dirty threshold: this many seconds of its
            /// measured write bandwidth (ebb's own); 0: no cap.
            ///
            /// A slow or remote backend then never holds more unwritten data than it can write
            /// in that time, whatever its share of the cache: its writers are throttled against
            /// its own limit even below the global freerun point (as with `strict_limit`), and
            /// `sync` or unmount waits at most about that long for it. The kernel approximates
            /// this with `strict_limit` and per-bdi byte limits.
            dirty_seconds: u64 = 0, "s", Kind::Number { min: 0, max: 86_400 };
            /// Cap on the backend's share of the background threshold: this many seconds of its
            /// write bandwidth (ebb's own); 0: its `dirty_seconds` share scaled as the kernel
            /// scales the background threshold.
            dirty_background_seconds: u64 = 0, "s", Kind::Number { min: 0, max: 86_400 };
            /// Where the bandwidth estimate and ratelimit start (ebb's own): `kernel` (the
            /// kernel's 100 MB/s), `auto` (the backend's declared speed) or a rate.
            ///
            /// Not a kernel knob: a long-lived cache learns its device over seconds (the
            /// estimate moves ~5% per 200 ms and the ratelimit more slowly); a user who knows
            /// the device can start there. `auto` starts from the speed its driver declares
            /// (`BackendConfig::declared_write_bandwidth`: the simulator's device model, or
            /// what a runtime backend declares) and from the kernel's start when none is
            /// declared.
            initial_write_bandwidth: InitialBandwidth = InitialBandwidth::Kernel, "bytes/s",
                Kind::ChoiceOrBytes {
                    names: InitialBandwidth::NAMES,
                    min: super::PAGE_SIZE,
                    max: 1 << 40,
                };
            /// How long the backend may stay unreachable before fsync and close report EIO
            /// (ebb's own; the NFS client's `timeo` x `retrans` of a soft mount plays this role).
            ///
            /// While writes fail with connection errors (refused, reset, timed out, EAGAIN)
            /// the pages stay dirty and are retried with backoff, writers are throttled as
            /// usual and fsync waits. Past this time every file of the backend with unwritten
            /// data gets EIO, reported once per handle, writers that would be throttled fail
            /// with EIO instead, and the data stays cached and retried: it is written when the
            /// backend returns. 0: report at the first failure.
            retry_timeout_secs: u64 = 60, "s", Kind::Number { min: 0, max: 86_400 * 365 };
            /// Close writes the file back and commits it before it returns, as an NFS client
            /// does for close-to-open consistency (ebb's own for other backends).
            ///
            /// On for network backends (NFS, S3), whose other clients see only what was
            /// committed; off for local directories, whose close does not promise durability.
            flush_on_close: bool = false, "", Kind::Bool;
            /// Write-back granule: no write crosses a granule's end, and threshold-driven
            /// writeback leaves a file's last, partly dirty granule for later (ebb's own: an
            /// object store uploads a multipart part whole, so a part written twice costs a
            /// commit and a copy); unset: none.
            ///
            /// A multiple of the page size. A granule is written as one write however large
            /// (`max_write_pages` and the flusher's chunk do not cut it). The tail is deferred
            /// only while the file was dirtied within `dirty_expire_centisecs` and the tails of
            /// the backend's dirty files would take at most half its background threshold;
            /// fsync, sync, close, reclaim and data past its expiry write it.
            write_granule_bytes: Option<u64> = None, "bytes",
                Kind::Bytes { min: super::PAGE_SIZE, max: 1 << 40 };
            /// Granules per size group: after this many granules of one size the granule
            /// doubles (an S3 layout whose parts grow to reach 10,000); 0: one size throughout.
            write_granule_group: u32 = 0, "granules", Kind::Number { min: 0, max: 1_000_000 };
        }
        fields {
            /// Name used in traces (`bdi=<name>`) and stats.
            name: String = String::new(),
            /// The backend's write speed as its driver knows it, bytes/s (`None`: unknown):
            /// the simulator's device model's sustained write rate, or what a runtime backend
            /// declares. Not a knob: `initial_write_bandwidth = auto` starts there.
            declared_write_bandwidth: Option<u64> = None,
            /// The backend's client queues its requests itself, without limit (an NFS client's
            /// RPC layer), so a driver hands it every write at once and keeps `queue_depth` as
            /// the backend declared it rather than lowering it to the driver's own IO threads.
            /// Declared by the backend with its other writeback settings; not a knob.
            client_queue: bool = false,
            /// The backend's own per-try timeout, ms (`None`: it has none, a local device): its
            /// client gives up a try unanswered this long (NFS: `timeo`; S3: the per-read
            /// timeout), so a call still in flight then is evidence of an outage
            /// (`ebb_core::outage`); before, or without one, a call in flight is in service.
            /// Declared by the backend with its other writeback settings; not a knob.
            try_timeout_ms: Option<u64> = None,
        }
    }
}

/// Every knob, global ones first, in declaration order.
pub fn knobs() -> &'static [Knob] {
    KNOBS
}

/// The knob named `name`; the error lists the knobs.
pub fn knob(name: &str) -> Result<&'static Knob, ConfigError> {
    let name = name.trim();
    knobs().iter().find(|knob| knob.name == name).ok_or_else(|| unknown_knob(name))
}

/// Parses `name=value` (as `--knob` takes it) into a setting.
pub fn parse_setting(text: &str) -> Result<Setting, ConfigError> {
    let Some((name, value)) = text.split_once('=') else {
        return Err(ConfigError::new(text.trim(), "expected NAME=VALUE".to_owned()));
    };
    knob(name)?.parse(value)
}

fn unknown_knob(name: &str) -> ConfigError {
    let names = |scope: Scope| {
        knobs().iter().filter(|k| k.scope == scope).map(|k| k.name).collect::<Vec<_>>().join(", ")
    };
    ConfigError::new(
        name,
        format!(
            "unknown knob; cache knobs: {}; backend knobs: {}",
            names(Scope::Global),
            names(Scope::Backend)
        ),
    )
}

/// The table of the `config` module doc, rendered from the registry (a test holds the doc to
/// it).
#[cfg(test)]
pub(super) fn doc_table() -> String {
    let mut out = String::from(
        "| knob | scope | unit | default | range | meaning |\n|---|---|---|---|---|---|\n",
    );
    for knob in knobs() {
        let default = match knob.default_value().map(|value| knob.render(&value)) {
            Some(text) if text.is_empty() => "none".to_owned(),
            Some(text) => text,
            None => "unset".to_owned(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            knob.name,
            knob.scope.name(),
            knob.unit,
            default,
            knob.kind.range_text(),
            knob.summary()
        ));
    }
    out
}
