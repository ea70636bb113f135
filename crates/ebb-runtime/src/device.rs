//! What the kernel knows about the block device under a directory, read from sysfs, so a
//! directory backend gets the writeback settings the kernel would give it: rotational or solid
//! state (selects the wbt latency target, 75 ms or 2 ms), a volatile write cache, the request
//! queue depth and the largest single IO; and what the runtime's per-file lanes imply
//! (`wbt_min_depth`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ebb_core::BackendConfig;

/// Pages per write to a directory backend (1 MiB), unless the device takes less.
pub(crate) const DIRECTORY_WRITE_PAGES: u32 = 256;

/// Background writes `wbt = ebb` keeps in flight to a directory backend at least: its writes go
/// through per-file lanes, one at a time, so with two in flight the next is copied out and
/// waiting when one completes while the device still serves one (`wbt_min_depth`).
pub(crate) const DIRECTORY_WBT_MIN_DEPTH: u32 = 2;

/// The least share of the time `wbt = ebb` keeps a background write in service to a directory
/// while reads are active, % (`wbt_min_duty`): it then paces whole writes of up to
/// `max_sectors_kb` rather than shrinking them (BENCHMARKS.md, "read-under-write").
pub(crate) const DIRECTORY_WBT_MIN_DUTY: u32 = 12;

/// Device requests of `max_sectors_kb` each that one paced background write of `wbt = ebb` to a
/// directory spans (`wbt_pace_write_pages`): the kernel splits it and the device takes the
/// pieces back to back, one busy period. A read that arrives while a write is in service
/// waits for it, and the reader, one read at a time, meets each busy period about once, so
/// the reads delayed per second are the busy periods per second: two requests per write
/// delay half as many reads for the same bytes, each by about twice as long. Measured on this
/// machine's virtio disk (`ebb bench read-under-write --memory kernel`, 2026-11-27, five runs
/// of two rounds, 8 MiB against 4 MiB side by side): beside paced 4 MiB writes nine slow
/// reads in ten overlapped a write, about one per write (`--breakdown`); with 8 MiB writes
/// the writer ran 12-26% faster in every run, the reads' p99 was lower in three runs (160
/// against 188 us, 223 against 323, 209 against 215), about equal in one (110 against 113)
/// and higher in one (194 against 179), and their p99.99 rose from 2.1-4.2 ms to 3.7-6.1.
pub(crate) const DIRECTORY_WBT_PACE_REQUESTS: u32 = 2;

/// The device facts found, each `None` when sysfs does not say (a virtual filesystem, a
/// container without /sys).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `/sys/dev/block/M:m` of the device (or of its whole disk for a partition).
    pub sysfs: Option<PathBuf>,
    /// `queue/rotational`.
    pub rotational: Option<bool>,
    /// `queue/write_cache` says "write back".
    pub write_cache: Option<bool>,
    /// `queue/nr_requests`.
    pub nr_requests: Option<u32>,
    /// `queue/max_sectors_kb`.
    pub max_sectors_kb: Option<u32>,
    /// `queue/max_segments`.
    pub max_segments: Option<u32>,
}

impl DeviceInfo {
    /// Looks up the device holding `path`.
    pub fn for_path(path: &Path) -> DeviceInfo {
        let Ok(meta) = std::fs::metadata(path) else { return DeviceInfo::default() };
        let dev = meta.dev();
        // Linux's encoding of dev_t.
        let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
        let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
        let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        let queue = if base.join("queue").is_dir() {
            base.join("queue")
        } else if base.join("../queue").is_dir() {
            base.join("../queue")
        } else {
            return DeviceInfo::default();
        };
        let read = |name: &str| std::fs::read_to_string(queue.join(name)).ok();
        DeviceInfo {
            sysfs: Some(base),
            rotational: read("rotational").map(|s| s.trim() == "1"),
            write_cache: read("write_cache").map(|s| s.trim() == "write back"),
            nr_requests: read("nr_requests").and_then(|s| s.trim().parse().ok()),
            max_sectors_kb: read("max_sectors_kb").and_then(|s| s.trim().parse().ok()),
            max_segments: read("max_segments").and_then(|s| s.trim().parse().ok()),
        }
    }

    /// Applies what was found to a backend's configuration (unknown facts keep the defaults).
    pub fn apply(&self, config: &mut BackendConfig) {
        if let Some(r) = self.rotational {
            config.rotational = r;
        }
        if let Some(w) = self.write_cache {
            config.write_cache = w;
        }
        if let Some(n) = self.nr_requests {
            config.queue_depth = n.clamp(1, 65_536);
        }
        // Writes of 1 MiB (256 pages, the most one bio of the kernel's writeback carries, as we
        // recall BIO_MAX_VECS; unverified here), where the device takes them: measured on this
        // machine's ext4 (BENCHMARKS.md, "Runtime"), writing back 4 GiB with no writer running
        // took 2.36 s in 1 MiB writes and 3.30 s in the engine's default 512 KiB, each write of
        // a file extension paying the filesystem's fixed cost; 4 MiB writes raised a
        // concurrent reader's p99 from 2.4 ms to 6-12 ms with no gain in write throughput, so
        // `max_sectors_kb` beyond 1 MiB is not used. A smaller device limit lowers them.
        config.max_write_pages = DIRECTORY_WRITE_PAGES;
        if let Some(kb) = self.max_sectors_kb {
            config.max_write_pages = config.max_write_pages.min((kb / 4).max(1));
            let request = (kb / 4).max(1);
            config.wbt_pace_write_pages = request.saturating_mul(DIRECTORY_WBT_PACE_REQUESTS);
        }
        // Each 4 KiB page of an IO buffer may be a scatter-gather segment of its own (pages
        // that happen to be physically adjacent merge), and a write of more segments than the
        // device takes is split into two requests: this virtio disk (max_segments 254) saw
        // 1 MiB writes arrive as 630 KiB requests on average, and 1016 KiB writes as 910 KiB;
        // a 4 GiB stream took 4.23-4.27 s instead of 4.63 s (BENCHMARKS.md, "Runtime").
        if let Some(segments) = self.max_segments {
            config.max_write_pages = config.max_write_pages.min(segments.max(1));
        }
        config.wbt_min_depth = DIRECTORY_WBT_MIN_DEPTH;
        config.wbt_min_duty = DIRECTORY_WBT_MIN_DUTY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes are 1 MiB unless the device takes fewer pages in one request (`max_sectors_kb`)
    /// or fewer scatter-gather segments (`max_segments`, one per page at worst).
    #[test]
    fn write_size_follows_the_device_limits() {
        let mut config = BackendConfig::new("d");
        DeviceInfo::default().apply(&mut config);
        assert_eq!(config.max_write_pages, DIRECTORY_WRITE_PAGES);
        assert_eq!(config.wbt_min_depth, 2, "one write copied out behind the one in service");
        let virtio = DeviceInfo {
            max_sectors_kb: Some(4096),
            max_segments: Some(254),
            rotational: Some(true),
            ..DeviceInfo::default()
        };
        virtio.apply(&mut config);
        assert_eq!(config.max_write_pages, 254);
        assert!(config.rotational);
        assert_eq!(config.wbt_min_duty, DIRECTORY_WBT_MIN_DUTY, "wbt = ebb paces");
        assert_eq!(config.wbt_pace_write_pages, 2048, "paced writes of two max_sectors_kb");
        let usb = DeviceInfo {
            max_sectors_kb: Some(120),
            max_segments: Some(2048),
            ..DeviceInfo::default()
        };
        usb.apply(&mut config);
        assert_eq!(config.max_write_pages, 30);
        assert_eq!(config.wbt_pace_write_pages, 60);
    }
}
