//! What the block device under a directory did over some time, from `/proc/diskstats`: the
//! device side of `read-under-write`'s figures.

use std::time::Instant;

/// Counters of one block device from `/proc/diskstats`, and when they were read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DiskStats {
    at: Instant,
    reads: u64,
    read_ms: u64,
    writes: u64,
    sectors_written: u64,
    busy_ms: u64,
    queue_ms: u64,
}

impl DiskStats {
    /// The counters of the device `major:minor`, if `/proc/diskstats` lists it.
    pub(crate) fn read(dev: (u64, u64)) -> Option<DiskStats> {
        let text = std::fs::read_to_string("/proc/diskstats").ok()?;
        let at = Instant::now();
        text.lines().find_map(|line| {
            let f: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            // major, minor, then (the name is not a number) reads, merged, sectors, ms, writes,
            // merged, sectors, ms, in flight, io ms, weighted io ms.
            (f.len() >= 13 && (f[0], f[1]) == dev).then(|| DiskStats {
                at,
                reads: f[2],
                read_ms: f[5],
                writes: f[6],
                sectors_written: f[8],
                busy_ms: f[11],
                queue_ms: f[12],
            })
        })
    }

    /// What the device did from `self` to `later`.
    pub(crate) fn until(&self, later: &DiskStats) -> DeviceWork {
        DeviceWork {
            secs: later.at.duration_since(self.at).as_secs_f64(),
            reads: later.reads.saturating_sub(self.reads),
            read_ms: later.read_ms.saturating_sub(self.read_ms),
            bytes: later.sectors_written.saturating_sub(self.sectors_written) * 512,
            writes: later.writes.saturating_sub(self.writes),
            busy_ms: later.busy_ms.saturating_sub(self.busy_ms),
            queue_ms: later.queue_ms.saturating_sub(self.queue_ms),
        }
    }
}

/// What a device did over some time (summed over a mode's rounds).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DeviceWork {
    pub(crate) secs: f64,
    pub(crate) reads: u64,
    pub(crate) read_ms: u64,
    pub(crate) bytes: u64,
    pub(crate) writes: u64,
    pub(crate) busy_ms: u64,
    pub(crate) queue_ms: u64,
}

impl DeviceWork {
    pub(crate) fn add(&mut self, other: DeviceWork) {
        self.secs += other.secs;
        self.reads += other.reads;
        self.read_ms += other.read_ms;
        self.bytes += other.bytes;
        self.writes += other.writes;
        self.busy_ms += other.busy_ms;
        self.queue_ms += other.queue_ms;
    }
}

/// The block device holding `dir` (`major`, `minor`), if it is one.
pub(crate) fn device_of(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    // Linux's encoding of dev_t.
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
    Some((major, minor))
}
