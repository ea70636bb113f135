//! A flash device's timing: parallel access latency in front of one shared data pipe.
//!
//! An SSD has no seeks, but it is not infinitely parallel: a command first waits for a flash
//! access (tens of microseconds, overlapped across dies and channels), then its data moves at
//! the device's bandwidth, which every command and the cache destage share. That is enough to
//! give the shapes writeback cares about: a lone 4 KiB read takes about the access latency,
//! many commands saturate the bandwidth, and a read queued behind writes or destaging waits
//! for the data ahead of it.
//!
//! ```text
//! slot         = earliest free of `parallelism` access slots
//! access_start = max(now, slot free)
//! access_end   = access_start + latency(op) (+ random_write_penalty for a write that does
//!                not continue the previous write)
//! data_start   = max(access_end, pipe free)
//! done         = data_start + len / bandwidth(op)        (slot and pipe busy until done)
//! destage step = pipe only: max(now, pipe free) + len / write_bandwidth
//! ```
//!
//! The random-write penalty stands for the read-modify-write of a partially written erase
//! block on devices without a real flash translation layer (USB sticks); it is zero for
//! SSDs. Garbage collection and SLC-cache exhaustion are not modelled beyond the sustained
//! write bandwidth, which is what destaging uses.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ebb_core::time::{Duration, Instant};
use serde::{Deserialize, Serialize};

use super::disk::MediaOp;
use super::elevator::ElevatorParams;
use super::transfer_ns;

/// Parameters of a flash device (models `laptop-ssd`, `nvme`, `usb-stick`).
///
/// | field | `laptop-ssd` | `nvme` | `usb-stick` | unit |
/// |---|---|---|---|---|
/// | `capacity_bytes` | 256e9 | 512e9 | 16e9 | bytes |
/// | `queue_depth` | 32 | 1023 | 1 | commands |
/// | `parallelism` | 8 | 32 | 1 | concurrent accesses |
/// | `read_latency_us` | 90 | 75 | 500 | µs |
/// | `write_latency_us` | 40 | 20 | 2000 | µs |
/// | `read_mb_per_s` | 520 | 3000 | 20 | MB/s |
/// | `write_mb_per_s` | 400 | 2000 | 6 | MB/s |
/// | `interface_mb_per_s` | 550 | 3500 | 35 | MB/s |
/// | `command_overhead_us` | 10 | 2 | 0 | µs |
/// | `write_cache_bytes` | 64 MiB | 0 | 0 | bytes |
/// | `destage_chunk_bytes` | 512 KiB | 1 MiB | 128 KiB | bytes |
/// | `random_write_penalty_us` | 0 | 0 | 30000 | µs |
/// | `elevator` | mq-deadline | none | mq-deadline | |
/// | `elevator.max_request_bytes` | 512 KiB | 512 KiB | 120 KiB | bytes |
///
/// Provenance. `laptop-ssd` is a 2016 SATA 6 Gb/s SSD like the laptop drive in Axboe's 2016
/// wbt postings (Samsung 850-class): sequential read ~520 MB/s and sustained write
/// ~350-450 MB/s are datasheet-typical; the 90 µs access gives a ~100 µs 4 KiB read, typical
/// of measured QD1 latency; parallelism 8 gives ~90k random-read IOPS, typical of the class.
/// `nvme` is a PCIe 3.0 x4 drive (960 Pro-class): ~3 GB/s read, ~2 GB/s write datasheet
/// typical, 4 KiB read ~80 µs typical. The `nvme` model has no write cache: such a drive's DRAM
/// holds the flash translation table (about 1 MB per GB of flash, the 960 Pro's 512 MB-2 GB of
/// LPDDR3), not a host write buffer that reads could overtake, so a sustained write stream runs
/// at the flash program rate and a read waits for the writes dispatched before it. That is the
/// behaviour the wbt posting series reports on NVMe (Axboe's `wb-buf-throttle-v2` commit:
/// unthrottled background writeback delayed other IO by 1-2 s on an NVMe drive, tens of
/// milliseconds with throttling); an earlier 256 MiB cache acknowledged at link speed let every
/// read overtake the whole write backlog, which no such measurement shows. `usb-stick` is a cheap USB 2.0-era stick: ~20 MB/s
/// read, ~6 MB/s write typical; the millisecond latencies and the 30 ms penalty per
/// non-sequential write (about 30 random-write IOPS) are assumed from published small-write
/// benchmarks of such sticks, and 120 KiB is usb-storage's default `max_sectors` (240). Cache sizes, write access latencies, command overheads and
/// destage chunk sizes are assumed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashParams {
    /// Addressable bytes.
    pub capacity_bytes: u64,
    /// Hardware queue depth; more requests wait in the elevator.
    pub queue_depth: u32,
    /// Flash accesses that can overlap.
    pub parallelism: u32,
    /// Access latency of a read, µs.
    pub read_latency_us: f64,
    /// Access latency of an uncached write, µs.
    pub write_latency_us: f64,
    /// Read bandwidth of the shared data pipe, MB/s.
    pub read_mb_per_s: f64,
    /// Sustained write bandwidth (uncached writes and destaging), MB/s.
    pub write_mb_per_s: f64,
    /// Link rate at which cached writes are acknowledged, MB/s.
    pub interface_mb_per_s: f64,
    /// Controller time per cached write acknowledgement, µs.
    pub command_overhead_us: f64,
    /// Volatile write cache size, bytes; 0 writes every request through.
    pub write_cache_bytes: u64,
    /// Largest extent destaged in one step, bytes.
    pub destage_chunk_bytes: u64,
    /// Extra access time of an uncached write that does not start where the previous write
    /// ended, µs.
    pub random_write_penalty_us: f64,
    /// Software queue in front of the device.
    pub elevator: ElevatorParams,
}

impl FlashParams {
    /// A 2016 SATA SSD; see the table on [`FlashParams`].
    pub fn laptop_ssd_2016() -> FlashParams {
        FlashParams {
            capacity_bytes: 256_000_000_000,
            queue_depth: 32,
            parallelism: 8,
            read_latency_us: 90.0,
            write_latency_us: 40.0,
            read_mb_per_s: 520.0,
            write_mb_per_s: 400.0,
            interface_mb_per_s: 550.0,
            command_overhead_us: 10.0,
            write_cache_bytes: 64 << 20,
            destage_chunk_bytes: 512 << 10,
            random_write_penalty_us: 0.0,
            elevator: ElevatorParams::mq_deadline(512 << 10),
        }
    }

    /// A PCIe 3.0 x4 NVMe SSD; see the table on [`FlashParams`].
    pub fn nvme() -> FlashParams {
        FlashParams {
            capacity_bytes: 512_000_000_000,
            queue_depth: 1023,
            parallelism: 32,
            read_latency_us: 75.0,
            write_latency_us: 20.0,
            read_mb_per_s: 3000.0,
            write_mb_per_s: 2000.0,
            interface_mb_per_s: 3500.0,
            command_overhead_us: 2.0,
            write_cache_bytes: 0,
            destage_chunk_bytes: 1 << 20,
            random_write_penalty_us: 0.0,
            elevator: ElevatorParams::none(512 << 10),
        }
    }

    /// A cheap USB flash stick; see the table on [`FlashParams`].
    pub fn usb_stick() -> FlashParams {
        FlashParams {
            capacity_bytes: 16_000_000_000,
            queue_depth: 1,
            parallelism: 1,
            read_latency_us: 500.0,
            write_latency_us: 2000.0,
            read_mb_per_s: 20.0,
            write_mb_per_s: 6.0,
            interface_mb_per_s: 35.0,
            command_overhead_us: 0.0,
            write_cache_bytes: 0,
            destage_chunk_bytes: 128 << 10,
            random_write_penalty_us: 30_000.0,
            elevator: ElevatorParams::mq_deadline(120 << 10),
        }
    }

    /// Checks that the parameters describe a usable device, naming the first bad field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("read_mb_per_s", self.read_mb_per_s),
            ("write_mb_per_s", self.write_mb_per_s),
            ("interface_mb_per_s", self.interface_mb_per_s),
        ];
        for (field, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("{field} must be positive, got {value}"));
            }
        }
        let non_negative = [
            ("read_latency_us", self.read_latency_us),
            ("write_latency_us", self.write_latency_us),
            ("command_overhead_us", self.command_overhead_us),
            ("random_write_penalty_us", self.random_write_penalty_us),
        ];
        for (field, value) in non_negative {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(format!("{field} must be non-negative, got {value}"));
            }
        }
        if self.capacity_bytes == 0 || self.queue_depth == 0 || self.parallelism == 0 {
            return Err("capacity_bytes, queue_depth and parallelism must be positive".to_string());
        }
        if self.destage_chunk_bytes == 0 {
            return Err("destage_chunk_bytes must be positive".to_string());
        }
        self.elevator.validate()
    }
}

/// Access slots and the data pipe of a flash device.
#[derive(Debug)]
pub(super) struct FlashMedia {
    /// Free times of the access slots, earliest on top.
    slots: BinaryHeap<Reverse<Instant>>,
    pipe_free: Instant,
    last_write_end: u64,
    read_latency: Duration,
    write_latency: Duration,
    random_write_penalty: Duration,
    read_mb_per_s: f64,
    write_mb_per_s: f64,
}

impl FlashMedia {
    pub(super) fn new(params: &FlashParams) -> FlashMedia {
        let micros = |us: f64| Duration::from_nanos((us * 1e3) as u64);
        FlashMedia {
            slots: (0..params.parallelism).map(|_| Reverse(Instant::ZERO)).collect(),
            pipe_free: Instant::ZERO,
            last_write_end: 0,
            read_latency: micros(params.read_latency_us),
            write_latency: micros(params.write_latency_us),
            random_write_penalty: micros(params.random_write_penalty_us),
            read_mb_per_s: params.read_mb_per_s,
            write_mb_per_s: params.write_mb_per_s,
        }
    }

    /// When the data pipe finishes everything reserved so far.
    pub(super) fn idle_at(&self) -> Instant {
        self.pipe_free
    }

    /// Reserves an access slot (except for destaging) and the pipe; returns completion time.
    pub(super) fn reserve(&mut self, now: Instant, op: MediaOp, offset: u64, len: u64) -> Instant {
        if op == MediaOp::Destage {
            let start = now.max(self.pipe_free);
            self.pipe_free = start + Duration::from_nanos(transfer_ns(len, self.write_mb_per_s));
            return self.pipe_free;
        }
        let Reverse(slot_free) = self.slots.pop().expect("parallelism is at least 1");
        let (latency, mb_per_s) = match op {
            MediaOp::Read => (self.read_latency, self.read_mb_per_s),
            _ => {
                let mut latency = self.write_latency;
                if offset != self.last_write_end {
                    latency += self.random_write_penalty;
                }
                self.last_write_end = offset + len;
                (latency, self.write_mb_per_s)
            }
        };
        let access_end = now.max(slot_free) + latency;
        let data_start = access_end.max(self.pipe_free);
        self.pipe_free = data_start + Duration::from_nanos(transfer_ns(len, mb_per_s));
        self.slots.push(Reverse(self.pipe_free));
        self.pipe_free
    }
}
