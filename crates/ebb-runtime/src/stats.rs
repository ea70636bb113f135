//! Stats shaped like the kernel's: `/proc/meminfo` (kB) and `/sys/class/bdi/<dev>/stats`.
//!
//! The figures are the core's own structs ([`MemInfo`], [`BdiStats`], [`Stats`]), taken as
//! they are; their JSON (`ebb stat`) is written from the lists the core declares with them
//! (`figures()`: the name each figure is shown under and its unit), so a counter the core adds
//! shows up here with no code of ours. Pages become kB, as in the kernel's files.

use std::collections::BTreeMap;

use ebb_core::stats::{Figure, Unit, Value};
use ebb_core::{BackendId, BdiStats, Engine, MemInfo, PAGE_SIZE, Stats};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::pauses::PauseStats;

const KB_PER_PAGE: u64 = PAGE_SIZE / 1024;

/// Everything `Ebb::stats` reports. Serialized as `{"meminfo": {..}, "bdi": [..], "counters":
/// {..}, "pauses": {..}}`: meminfo and each bdi entry under the kernel's names in kB, each bdi entry with its
/// backend's `name` and `backend` counters, the counters under their field names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// The cache as a whole, in pages.
    pub meminfo: MemInfo,
    /// Each backend, in pages (bandwidths in pages/s).
    pub bdi: Vec<BdiStats>,
    /// Each backend's own counters (`Backend::counters`, `backend_counters[i]` for `bdi[i]`):
    /// for NFS the RPC counts, retransmits and verifier mismatches, for S3 the requests by
    /// kind and retries. Empty for local backends.
    pub backend_counters: Vec<BTreeMap<String, u64>>,
    /// The engine's event counters.
    pub counters: Stats,
    /// Every writer's throttle pauses: percentiles since the start and over the last seconds,
    /// cumulative buckets.
    pub pauses: PauseStats,
}

impl Serialize for RuntimeStats {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bdi: Vec<BdiEntry<'_>> = self
            .bdi
            .iter()
            .enumerate()
            .map(|(i, stats)| BdiEntry { stats, backend: self.backend_counters.get(i) })
            .collect();
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("meminfo", &Figures(&self.meminfo.figures()))?;
        map.serialize_entry("bdi", &bdi)?;
        map.serialize_entry("counters", &Figures(&self.counters.figures()))?;
        map.serialize_entry("pauses", &self.pauses)?;
        map.end()
    }
}

/// Figures as a JSON object, pages in kB.
struct Figures<'a>(&'a [(Figure, Value)]);

impl Figures<'_> {
    fn write<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        for (figure, value) in self.0 {
            match (figure.unit, *value) {
                (Unit::Pages | Unit::PagesPerSecond, Value::Unsigned(pages)) => {
                    map.serialize_entry(figure.name, &(pages * KB_PER_PAGE))?;
                }
                (_, Value::Unsigned(n)) => map.serialize_entry(figure.name, &n)?,
                (_, Value::Signed(n)) => map.serialize_entry(figure.name, &n)?,
            }
        }
        Ok(())
    }
}

impl Serialize for Figures<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        self.write(&mut map)?;
        map.end()
    }
}

/// One backend: its name, its figures, its own counters.
struct BdiEntry<'a> {
    stats: &'a BdiStats,
    backend: Option<&'a BTreeMap<String, u64>>,
}

impl Serialize for BdiEntry<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let figures = self.stats.figures();
        let mut map = serializer.serialize_map(Some(figures.len() + 2))?;
        map.serialize_entry("name", &self.stats.name)?;
        Figures(&figures).write(&mut map)?;
        map.serialize_entry("backend", &self.backend.cloned().unwrap_or_default())?;
        map.end()
    }
}

/// What a drain has left, reported while it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DrainProgress {
    /// Since the drain began.
    pub elapsed_ms: u64,
    /// Pages still dirty.
    pub dirty_pages: u64,
    /// Pages being written.
    pub writeback_pages: u64,
    /// Pages written but not committed.
    pub unstable_pages: u64,
    /// Pages written back since the cache started.
    pub written_pages: u64,
    /// The drain finished.
    pub done: bool,
}

/// The engine's figures, plus each backend's own counters (`backend_counters[i]` for backend
/// `i`, from `Backend::counters`).
pub(crate) fn collect(
    engine: &Engine,
    backend_counters: Vec<Vec<(&'static str, u64)>>,
    pauses: PauseStats,
) -> RuntimeStats {
    let backends = engine.config().backends.len();
    let mut backend_counters: Vec<BTreeMap<String, u64>> = backend_counters
        .into_iter()
        .map(|counters| counters.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        .collect();
    backend_counters.resize(backends, BTreeMap::new());
    RuntimeStats {
        meminfo: engine.meminfo(),
        bdi: (0..backends).map(|i| engine.bdi_stats(BackendId(i as u32))).collect(),
        backend_counters,
        counters: engine.stats().clone(),
        pauses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON keeps every name `ebb stat` has shown (scripts read them), in kB for pages,
    /// with each backend's name and own counters, and shows the core's figures it gained.
    #[test]
    fn json_keeps_the_kernel_names_and_units() {
        let mut stats = RuntimeStats::default();
        stats.meminfo.dirty = 3;
        stats.meminfo.held = 2;
        let bdi = BdiStats {
            name: "disk".to_owned(),
            write_bandwidth: 5,
            wbt_step: -1,
            written: 7,
            ..BdiStats::default()
        };
        stats.bdi.push(bdi);
        stats.backend_counters.push(BTreeMap::from([("write_rpcs".to_owned(), 9)]));
        stats.counters.write_pages = 11;
        let json = serde_json::to_value(&stats).expect("serializes");
        let meminfo = [
            "MemTotal",
            "MemFree",
            "Cached",
            "Dirty",
            "Writeback",
            "NFS_Unstable",
            "Active(file)",
            "Inactive(file)",
            "DirtyThresh",
            "BackgroundThresh",
            "DirtyLimit",
            "Dirtied",
            "Written",
        ];
        for key in meminfo {
            assert!(json["meminfo"][key].is_u64(), "meminfo lacks {key}: {json}");
        }
        let bdi = [
            "name",
            "BdiReclaimable",
            "BdiWriteback",
            "BdiUnstable",
            "BdiDirtyThresh",
            "BdiBackgroundThresh",
            "BdiWriteBandwidth",
            "BdiAvgWriteBandwidth",
            "DirtyRatelimit",
            "BalancedDirtyRatelimit",
            "Inflight",
            "WbtMaxDepth",
            "WbtBackground",
            "WbtStep",
            "BdiDirtied",
            "BdiWritten",
            "backend",
        ];
        for key in bdi {
            assert!(!json["bdi"][0][key].is_null(), "bdi lacks {key}: {json}");
        }
        let counters = [
            "throttle_checks",
            "throttled_calls",
            "global_counter_reads",
            "writepages_calls",
            "writes",
            "write_pages",
            "write_errors",
            "reads",
            "read_pages",
            "commits",
            "verifier_redirtied",
            "kswapd_scanned",
            "kswapd_reclaimed",
            "kswapd_written",
            "direct_scanned",
            "direct_reclaimed",
            "direct_written",
        ];
        for key in counters {
            assert!(json["counters"][key].is_u64(), "counters lack {key}: {json}");
        }
        let kb = PAGE_SIZE / 1024;
        assert_eq!(json["meminfo"]["Dirty"], 3 * kb);
        assert_eq!(json["meminfo"]["Held"], 2 * kb);
        assert_eq!(json["bdi"][0]["name"], "disk");
        assert_eq!(json["bdi"][0]["BdiWriteBandwidth"], 5 * kb);
        assert_eq!(json["bdi"][0]["BdiWritten"], 7 * kb);
        assert_eq!(json["bdi"][0]["WbtStep"], -1);
        assert_eq!(json["bdi"][0]["backend"]["write_rpcs"], 9);
        // Counters are counts, pages included: shown as they are.
        assert_eq!(json["counters"]["write_pages"], 11);
        assert_eq!(json["counters"]["reclaim_stall_ns"], 0);
        for key in ["count", "sum_us", "p50_us", "p90_us", "p99_us", "p99_9_us", "max_us"] {
            assert!(json["pauses"][key].is_u64(), "pauses lack {key}: {json}");
        }
        for key in ["window_ms", "count", "p50_us", "p99_us", "max_us"] {
            assert!(json["pauses"]["recent"][key].is_u64(), "recent pauses lack {key}: {json}");
        }
    }
}
