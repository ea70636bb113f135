//! Device models: deterministic discrete-event block devices the simulator writes back to.
//!
//! The writeback engine's behaviour (throttling, wbt, flusher batching) only means something
//! against a device whose latency responds to load the way real hardware does: a read queued
//! behind buffered writes waits, a volatile write cache acknowledges fast until it fills, a
//! disk head pays for every seek. These models reproduce those effects from a handful of
//! datasheet-level parameters, cheaply enough to simulate millions of pages per second.
//!
//! # Driving a device
//!
//! A device is a passive component. The simulator:
//!
//! 1. calls [`Device::submit`] at any simulated time (never earlier than the last `advance`,
//!    and never while an internal event earlier than `now` is still unprocessed);
//! 2. schedules a wake-up at [`Device::next_event_time`];
//! 3. at that time calls [`Device::advance`], which processes every internal event at or
//!    before `now` in time order and appends the finished requests to `done`, each stamped
//!    with its exact completion instant (never later than `now`).
//!
//! Submission is always accepted; what does not fit the hardware queue waits in the software
//! queue (the elevator), as in the kernel's block layer.
//!
//! # Structure shared by the models
//!
//! ```text
//!  submit ──► elevator (mq-deadline or none) ──► hardware tags (queue depth)
//!                 merges, sorts, expiries              │
//!                                                      ├─ read / uncached write ─► media
//!                                                      └─ write ─► volatile write cache
//!                                                                   (ack at link speed;
//!                                                                    destage ─► media)
//! ```
//!
//! The media is one serial resource (a disk's actuator, an SSD's back-end bandwidth), so a
//! read dispatched while the cache is destaging or while writes are in flight queues behind
//! them. See `block.rs` for the flow, `disk.rs` and `flash.rs` for the timing models and
//! `raid0.rs` for striping.
//!
//! # Models
//!
//! | name | params constructor | summary |
//! |---|---|---|
//! | `sata-2010` | [`DiskParams::sata_2010`] | 7200 rpm disk, ~60 MB/s, ~8.5 ms seeks, 16 MiB cache |
//! | `raid0-4x-sata-2010` | [`Raid0Params::raid0_4x_sata_2010`] | 4 such disks, 512 KiB chunk |
//! | `laptop-ssd` | [`FlashParams::laptop_ssd_2016`] | SATA SSD, NCQ 32, ~520/400 MB/s |
//! | `nvme` | [`FlashParams::nvme`] | ~3 GB/s read, ~2 GB/s write, depth 1023, no write cache |
//! | `usb-stick` | [`FlashParams::usb_stick`] | ~20/6 MB/s, depth 1, no cache |
//! | `nfs-server` | [`NfsParams::gigabit_2020`] | NFS server over 1 Gbit/s: UNSTABLE writes, COMMIT, restarts |
//!
//! Experiment files override any field with [`by_name_with_overrides`].
//!
//! The `nfs-server` model (`nfs.rs`) is not a block device: its writes complete UNSTABLE with
//! the server's write verifier in [`Completion::verifier`], and a flush is a COMMIT.
//!
//! The same models' storage semantics, with real bytes and no timing, are
//! [`crate::backend::SimBackend`] (it asks [`DeviceParams::write_landing`] where a write
//! lands, and shares the NFS rules through [`NfsServerState`]).
//!
//! # Not modelled
//!
//! Reads served from the write cache or from a read-ahead buffer, zoned recording (outer
//! tracks faster), NCQ reordering inside the disk (the hardware queue is FIFO), flash garbage
//! collection beyond the fixed random-write penalty, and errors (fault injection lives in the
//! simulated backend).

mod block;
mod cache;
mod disk;
mod elevator;
mod flash;
mod nfs;
mod raid0;
#[cfg(test)]
mod tests;

use std::fmt;

use ebb_core::time::{Duration, Instant};
use serde::{Deserialize, Serialize};

pub use block::BlockDevice;
pub use disk::DiskParams;
pub use elevator::{ElevatorParams, Scheduler};
pub use flash::FlashParams;
pub use nfs::{
    CommitDone, CommitInProgress, NfsParams, NfsServer, NfsServerState, NfsStats, ReceivedWrite,
};
pub use raid0::{Raid0, Raid0Params};

/// The operation of a request, as the block layer classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum IoOp {
    /// Read `len` bytes at `offset`.
    Read,
    /// Write `len` bytes at `offset`.
    Write,
    /// Make every write submitted before it durable (empty the volatile cache); `offset` and
    /// `len` are ignored.
    Flush,
}

/// One request handed to a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRequest {
    /// Caller's identifier, returned in the [`Completion`]; the device does not interpret it.
    pub id: u64,
    /// What to do.
    pub op: IoOp,
    /// Byte offset on the device.
    pub offset: u64,
    /// Length in bytes (positive for reads and writes).
    pub len: u64,
    /// A `REQ_SYNC`-like hint (reads, fsync writes); the models keep it for callers such as
    /// wbt and do not schedule by it, as mq-deadline schedules by direction only.
    pub sync: bool,
}

/// A finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The request's `id`.
    pub id: u64,
    /// The request's operation.
    pub op: IoOp,
    /// When it completed (at or before the `now` given to [`Device::advance`]).
    pub at: Instant,
    /// From submission to completion.
    pub latency: Duration,
    /// `None` from a local device: a completed write is stable (in its cache or on media) and
    /// a flush made everything durable. `Some(verifier)` from a two-phase backend (NFS): a
    /// write was accepted UNSTABLE under this write verifier, and a flush was a COMMIT that
    /// returned it.
    pub verifier: Option<u64>,
}

/// Counters a device keeps since its creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Completed read requests (as submitted, before merging).
    pub reads: u64,
    /// Completed write requests (as submitted, before merging).
    pub writes: u64,
    /// Completed flush requests.
    pub flushes: u64,
    /// Bytes read by completed reads.
    pub read_bytes: u64,
    /// Bytes written by completed writes.
    pub write_bytes: u64,
    /// Commands sent to the hardware after merging (reads and writes).
    pub dispatches: u64,
    /// Requests absorbed into another queued request by front or back merging.
    pub merges: u64,
    /// Media operations that had to move the head (always 0 for flash).
    pub seeks: u64,
    /// Bytes moved from the volatile write cache to the media.
    pub destage_bytes: u64,
    /// Time during which at least one request was outstanding (like iostat's `io_ticks`).
    pub busy_time: Duration,
    /// Largest number of outstanding requests seen at once.
    pub queued_max: usize,
}

impl DeviceStats {
    /// Adds the media-level counters of a member device (used by RAID to report its disks).
    fn add_member(&mut self, member: &DeviceStats) {
        self.dispatches += member.dispatches;
        self.merges += member.merges;
        self.seeks += member.seeks;
        self.destage_bytes += member.destage_bytes;
    }
}

/// The parameters of any model, as returned by [`Device::params`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DeviceParams {
    /// A rotating disk.
    Disk(DiskParams),
    /// A flash device (SATA SSD, NVMe, USB stick).
    Flash(FlashParams),
    /// RAID-0 over identical disks.
    Raid0(Raid0Params),
    /// An NFS server over a network link.
    Nfs(NfsParams),
}

/// Where the data of a completed write sits, by a model's rules (timing aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteLanding {
    /// In the device's volatile write cache: lost by a power cut until a flush.
    VolatileCache,
    /// On the media (written through): durable when the write completes.
    Media,
    /// In a two-phase server's memory: lost by a server restart until a COMMIT.
    ServerMemory,
}

impl DeviceParams {
    /// Where a completed write of `len` bytes (`len > 0`) sits: for a disk or flash device,
    /// in the write cache if the cache admits it (a write larger than the cache, or any write
    /// to a device without one, is written through; see `cache.rs`); for NFS, in server memory.
    ///
    /// RAID-0 answers [`WriteLanding::VolatileCache`] whenever its members have a cache:
    /// striping cuts a request into per-member pieces, and a piece larger than a member's cache
    /// would be written through; the answer for the whole request is the less durable one.
    pub fn write_landing(&self, len: u64) -> WriteLanding {
        let cached = |capacity| {
            if cache::WriteCache::caches(capacity, len) {
                WriteLanding::VolatileCache
            } else {
                WriteLanding::Media
            }
        };
        match self {
            DeviceParams::Disk(disk) => cached(disk.write_cache_bytes),
            DeviceParams::Flash(flash) => cached(flash.write_cache_bytes),
            DeviceParams::Raid0(raid) if raid.member.write_cache_bytes > 0 => {
                WriteLanding::VolatileCache
            }
            DeviceParams::Raid0(_) => WriteLanding::Media,
            DeviceParams::Nfs(_) => WriteLanding::ServerMemory,
        }
    }
}

impl DeviceParams {
    /// The model's sustained write rate, bytes/s, as a datasheet gives it: the speed a
    /// driver declares to the engine (`BackendConfig::declared_write_bandwidth`, which
    /// `initial_write_bandwidth = auto` starts from). A disk's media transfer rate (RAID-0:
    /// times its members), a flash device's sustained write bandwidth, an NFS server's link
    /// (an UNSTABLE WRITE completes once it has crossed the link).
    pub fn declared_write_bandwidth(&self) -> u64 {
        let mb_per_s = match self {
            DeviceParams::Disk(disk) => disk.transfer_mb_per_s,
            DeviceParams::Flash(flash) => flash.write_mb_per_s,
            DeviceParams::Raid0(raid) => {
                raid.member.transfer_mb_per_s * f64::from(raid.member_count)
            }
            DeviceParams::Nfs(nfs) => nfs.link_mb_per_s,
        };
        (mb_per_s * 1e6) as u64
    }
}

/// A simulated block device; see the module doc for the driving protocol.
pub trait Device {
    /// The model's name (`sata-2010`, ...).
    fn name(&self) -> &str;

    /// The parameters the device was built with.
    fn params(&self) -> &DeviceParams;

    /// Accepts a request at `now`; it completes in a later (or the same) `advance`.
    fn submit(&mut self, now: Instant, request: DeviceRequest);

    /// The earliest instant at which `advance` has something to do, if any.
    fn next_event_time(&self) -> Option<Instant>;

    /// Processes every internal event at or before `now`, appending finished requests to
    /// `done` in completion order.
    fn advance(&mut self, now: Instant, done: &mut Vec<Completion>);

    /// Requests accepted but not yet completed (counted as submitted, before merging).
    fn queued(&self) -> usize;

    /// Counters since creation; `busy_time` is accounted up to the last processed event.
    fn stats(&self) -> DeviceStats;

    /// Server-side counters of a two-phase backend; `None` for local devices.
    fn nfs_stats(&self) -> Option<NfsStats> {
        None
    }
}

/// Why a device could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// No model has this name.
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The names that exist.
        known: Vec<&'static str>,
    },
    /// The parameters (after overrides) are unusable.
    InvalidParams {
        /// The model whose parameters were rejected.
        model: String,
        /// What is wrong, naming the field.
        reason: String,
    },
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::UnknownModel { name, known } => {
                write!(f, "unknown device model `{name}`; known models: {}", known.join(", "))
            }
            DeviceError::InvalidParams { model, reason } => {
                write!(f, "invalid parameters for device model `{model}`: {reason}")
            }
        }
    }
}

impl std::error::Error for DeviceError {}

/// The names [`by_name`] accepts, in documentation order.
pub const MODEL_NAMES: [&str; 6] =
    ["sata-2010", "raid0-4x-sata-2010", "laptop-ssd", "nvme", "usb-stick", "nfs-server"];

/// Builds the named model with its documented parameters; `seed` drives all its jitter.
pub fn by_name(name: &str, seed: u64) -> Result<Box<dyn Device>, DeviceError> {
    let params = default_params(name)?;
    build(name, params, seed)
}

/// Builds the named model with some parameters replaced by the fields of `overrides`
/// (a TOML table shaped like the model's params struct; nested tables merge recursively).
///
/// Unknown fields are rejected, so a typo in an experiment file is an error, not a silent
/// default.
pub fn by_name_with_overrides(
    name: &str,
    seed: u64,
    overrides: &toml::Table,
) -> Result<Box<dyn Device>, DeviceError> {
    let invalid = |reason: String| DeviceError::InvalidParams { model: name.to_string(), reason };
    let params = match default_params(name)? {
        DeviceParams::Disk(base) => {
            DeviceParams::Disk(apply_overrides(&base, overrides).map_err(invalid)?)
        }
        DeviceParams::Flash(base) => {
            DeviceParams::Flash(apply_overrides(&base, overrides).map_err(invalid)?)
        }
        DeviceParams::Raid0(base) => {
            DeviceParams::Raid0(apply_overrides(&base, overrides).map_err(invalid)?)
        }
        DeviceParams::Nfs(base) => {
            DeviceParams::Nfs(apply_overrides(&base, overrides).map_err(invalid)?)
        }
    };
    build(name, params, seed)
}

/// Serializes `base` to TOML, merges `overrides` into it and deserializes the result.
fn apply_overrides<T: Serialize + serde::de::DeserializeOwned>(
    base: &T,
    overrides: &toml::Table,
) -> Result<T, String> {
    let mut value = toml::Value::try_from(base).map_err(|error| error.to_string())?;
    merge_tables(&mut value, overrides);
    value.try_into().map_err(|error: toml::de::Error| error.to_string())
}

/// Replaces the fields of `base` named in `overrides`, descending into nested tables.
fn merge_tables(base: &mut toml::Value, overrides: &toml::Table) {
    let toml::Value::Table(base_table) = base else {
        return;
    };
    for (key, value) in overrides {
        match (base_table.get_mut(key), value) {
            (Some(existing @ toml::Value::Table(_)), toml::Value::Table(nested)) => {
                merge_tables(existing, nested);
            }
            _ => {
                base_table.insert(key.clone(), value.clone());
            }
        }
    }
}

fn default_params(name: &str) -> Result<DeviceParams, DeviceError> {
    Ok(match name {
        "sata-2010" => DeviceParams::Disk(DiskParams::sata_2010()),
        "raid0-4x-sata-2010" => DeviceParams::Raid0(Raid0Params::raid0_4x_sata_2010()),
        "laptop-ssd" => DeviceParams::Flash(FlashParams::laptop_ssd_2016()),
        "nvme" => DeviceParams::Flash(FlashParams::nvme()),
        "usb-stick" => DeviceParams::Flash(FlashParams::usb_stick()),
        "nfs-server" => DeviceParams::Nfs(NfsParams::gigabit_2020()),
        _ => {
            return Err(DeviceError::UnknownModel {
                name: name.to_string(),
                known: MODEL_NAMES.to_vec(),
            });
        }
    })
}

fn build(name: &str, params: DeviceParams, seed: u64) -> Result<Box<dyn Device>, DeviceError> {
    let invalid = |reason: String| DeviceError::InvalidParams { model: name.to_string(), reason };
    Ok(match params {
        DeviceParams::Disk(disk) => {
            disk.validate().map_err(invalid)?;
            Box::new(BlockDevice::disk(name, disk, seed))
        }
        DeviceParams::Flash(flash) => {
            flash.validate().map_err(invalid)?;
            Box::new(BlockDevice::flash(name, flash))
        }
        DeviceParams::Raid0(raid) => {
            raid.validate().map_err(invalid)?;
            Box::new(Raid0::new(name, raid, seed))
        }
        DeviceParams::Nfs(nfs) => {
            nfs.validate().map_err(invalid)?;
            Box::new(NfsServer::new(name, nfs, seed))
        }
    })
}

/// Nanoseconds to move `bytes` at `mb_per_s` (decimal megabytes, as datasheets quote).
#[inline]
fn transfer_ns(bytes: u64, mb_per_s: f64) -> u64 {
    (bytes as f64 * 1000.0 / mb_per_s) as u64
}
