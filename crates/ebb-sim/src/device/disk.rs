//! A rotating disk's timing: one actuator, seeks that grow with distance, rotational latency.
//!
//! Writeback on a disk is a story about seeks: a flusher that writes large sequential runs
//! gets the media rate, many interleaved streams or a read in the middle of a write stream
//! cost a seek and half a revolution each. The model keeps only what produces that
//! behaviour:
//!
//! ```text
//! service = command_overhead (host commands only)
//!         + positioning      (0 if the request starts where the head is)
//!         + len / transfer_rate
//! positioning = seek(d) + rotation,  d = |offset - head| / capacity  (fraction of the stroke)
//! seek(d)     = track_to_track + k * sqrt(d)
//! rotation    = uniform in [0, one revolution)   (from the device's Prng; mean half a turn)
//! ```
//!
//! `k` is chosen so that the mean seek between two uniformly random positions equals the
//! datasheet average seek. With `d` the distance between two uniform points on [0, 1],
//! `E[sqrt(d)] = 8/15`, so `k = (average - track_to_track) * 15 / 8`; the defaults give a
//! full-stroke seek of about 15 ms, typical for 7200 rpm desktop drives.
//!
//! The actuator serves one operation at a time. `block.rs` starts the next one only when the
//! actuator is idle, choosing among the tagged commands in C-LOOK order from the head (a
//! simple stand-in for NCQ's shortest-positioning-time reordering, which also optimises
//! rotation), so deeper queues give more random IOPS; a read that arrives while a destage
//! chunk is being written starts after that chunk.

use ebb_core::time::{Duration, Instant};
use serde::{Deserialize, Serialize};

use super::elevator::ElevatorParams;
use super::{DeviceStats, transfer_ns};
use crate::prng::Prng;

/// Parameters of a rotating disk (model `sata-2010`).
///
/// Values of [`DiskParams::sata_2010`], a 7200 rpm 500 GB SATA drive of 2010 (WD Caviar
/// Blue/Black, Seagate Barracuda 7200.12 class):
///
/// | field | value | unit | provenance |
/// |---|---|---|---|
/// | `capacity_bytes` | 500e9 | bytes | typical |
/// | `rpm` | 7200 | rev/min | datasheet |
/// | `transfer_mb_per_s` | 60 | MB/s | measured 50-64 MB/s with dd in the reference posting |
/// | `seek_track_to_track_ms` | 1.0 | ms | datasheet typical (0.8-1.2) |
/// | `seek_average_ms` | 8.5 | ms | datasheet typical read seek |
/// | `command_overhead_us` | 50 | µs | assumed controller time per host command |
/// | `interface_mb_per_s` | 280 | MB/s | SATA 3 Gb/s after 8b/10b coding, typical |
/// | `queue_depth` | 32 | commands | NCQ (libata may expose 31) |
/// | `write_cache_bytes` | 16 MiB | bytes | typical drive buffer; 0 disables the cache |
/// | `destage_chunk_bytes` | 512 KiB | bytes | assumed size of one destage operation |
/// | `elevator` | mq-deadline, 512 KiB | | kernel defaults, `max_sectors_kb` 512 |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskParams {
    /// Addressable bytes; seek distances are fractions of it.
    pub capacity_bytes: u64,
    /// Spindle speed, revolutions per minute.
    pub rpm: u32,
    /// Media transfer rate, MB/s (10^6 bytes).
    pub transfer_mb_per_s: f64,
    /// Shortest non-zero seek (settle time), ms.
    pub seek_track_to_track_ms: f64,
    /// Mean seek between random positions, ms.
    pub seek_average_ms: f64,
    /// Controller time per host command (not per destage step), µs.
    pub command_overhead_us: f64,
    /// Link rate at which cached writes are acknowledged, MB/s.
    pub interface_mb_per_s: f64,
    /// Hardware queue depth (NCQ tags); more requests wait in the elevator.
    pub queue_depth: u32,
    /// Volatile write cache size, bytes; 0 writes every request through.
    pub write_cache_bytes: u64,
    /// Largest extent destaged in one media operation, bytes.
    pub destage_chunk_bytes: u64,
    /// Software queue in front of the disk.
    pub elevator: ElevatorParams,
}

impl DiskParams {
    /// A 7200 rpm SATA disk of 2010; see the table on [`DiskParams`].
    pub fn sata_2010() -> DiskParams {
        DiskParams {
            capacity_bytes: 500_000_000_000,
            rpm: 7200,
            transfer_mb_per_s: 60.0,
            seek_track_to_track_ms: 1.0,
            seek_average_ms: 8.5,
            command_overhead_us: 50.0,
            interface_mb_per_s: 280.0,
            queue_depth: 32,
            write_cache_bytes: 16 << 20,
            destage_chunk_bytes: 512 << 10,
            elevator: ElevatorParams::mq_deadline(512 << 10),
        }
    }

    /// Checks that the parameters describe a usable disk, naming the first bad field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("transfer_mb_per_s", self.transfer_mb_per_s),
            ("interface_mb_per_s", self.interface_mb_per_s),
            ("seek_track_to_track_ms", self.seek_track_to_track_ms),
        ];
        for (field, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("{field} must be positive, got {value}"));
            }
        }
        if self.seek_average_ms < self.seek_track_to_track_ms {
            return Err("seek_average_ms must be at least seek_track_to_track_ms".to_string());
        }
        if !(self.command_overhead_us >= 0.0 && self.command_overhead_us.is_finite()) {
            return Err("command_overhead_us must be non-negative".to_string());
        }
        if self.capacity_bytes == 0 || self.rpm == 0 || self.queue_depth == 0 {
            return Err("capacity_bytes, rpm and queue_depth must be positive".to_string());
        }
        if self.destage_chunk_bytes == 0 {
            return Err("destage_chunk_bytes must be positive".to_string());
        }
        self.elevator.validate()
    }
}

/// What a media operation is, for costs that differ by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MediaOp {
    Read,
    Write,
    /// A write-cache destage step: internal, so no host command overhead.
    Destage,
}

/// The actuator's state and precomputed timing constants.
#[derive(Debug)]
pub(super) struct DiskMedia {
    prng: Prng,
    capacity: f64,
    transfer_mb_per_s: f64,
    settle_ns: f64,
    stroke_ns: f64,
    revolution_ns: u64,
    overhead_ns: u64,
    head: u64,
    busy_until: Instant,
}

impl DiskMedia {
    pub(super) fn new(params: &DiskParams, prng: Prng) -> DiskMedia {
        let settle_ns = params.seek_track_to_track_ms * 1e6;
        DiskMedia {
            prng,
            capacity: params.capacity_bytes as f64,
            transfer_mb_per_s: params.transfer_mb_per_s,
            settle_ns,
            stroke_ns: (params.seek_average_ms * 1e6 - settle_ns) * 15.0 / 8.0,
            revolution_ns: 60_000_000_000 / u64::from(params.rpm),
            overhead_ns: (params.command_overhead_us * 1e3) as u64,
            head: 0,
            busy_until: Instant::ZERO,
        }
    }

    /// Where the head rests after the operations reserved so far.
    pub(super) fn head(&self) -> u64 {
        self.head
    }

    /// When the actuator finishes everything reserved so far.
    pub(super) fn idle_at(&self) -> Instant {
        self.busy_until
    }

    /// Reserves the actuator for one operation after those already reserved; returns its
    /// completion time.
    pub(super) fn reserve(
        &mut self,
        now: Instant,
        op: MediaOp,
        offset: u64,
        len: u64,
        stats: &mut DeviceStats,
    ) -> Instant {
        let start = now.max(self.busy_until);
        let mut service_ns = transfer_ns(len, self.transfer_mb_per_s);
        if op != MediaOp::Destage {
            service_ns += self.overhead_ns;
        }
        if offset != self.head {
            stats.seeks += 1;
            let distance = offset.abs_diff(self.head) as f64 / self.capacity;
            let seek_ns = self.settle_ns + self.stroke_ns * distance.min(1.0).sqrt();
            service_ns += seek_ns as u64 + self.prng.below(self.revolution_ns);
        }
        self.head = offset + len;
        self.busy_until = start + Duration::from_nanos(service_ns);
        self.busy_until
    }
}
