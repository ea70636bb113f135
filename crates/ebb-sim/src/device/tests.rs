//! Behavioural tests of the device models against their documented ranges.
//!
//! Every assertion is on simulated time, which is deterministic, so the ranges are tight
//! enough to catch a broken model and loose enough to survive parameter tuning within the
//! documented provenance.

use ebb_core::time::{Duration, Instant};

use super::*;
use crate::prng::Prng;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn request(id: u64, op: IoOp, offset: u64, len: u64) -> DeviceRequest {
    DeviceRequest { id, op, offset, len, sync: op == IoOp::Read }
}

/// Keeps `depth` requests outstanding: `next(index)` gives the request with id `index`, and a
/// new one is submitted as soon as one completes. Returns every completion in order.
fn closed_loop(
    device: &mut dyn Device,
    depth: usize,
    mut next: impl FnMut(u64) -> Option<DeviceRequest>,
) -> Vec<Completion> {
    let mut now = Instant::ZERO;
    let mut issued = 0;
    let mut outstanding = 0;
    let mut all = Vec::new();
    let mut batch = Vec::new();
    loop {
        while outstanding < depth {
            let Some(next_request) = next(issued) else { break };
            device.submit(now, next_request);
            issued += 1;
            outstanding += 1;
        }
        let Some(at) = device.next_event_time() else { break };
        now = at;
        batch.clear();
        device.advance(now, &mut batch);
        outstanding -= batch.len();
        all.extend_from_slice(&batch);
    }
    assert_eq!(device.queued(), 0);
    all
}

/// Submits `requests` at their times (sorted), advancing the device in between; returns all
/// completions once the device is idle.
fn open_loop(device: &mut dyn Device, requests: &[(Instant, DeviceRequest)]) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut pending = requests.iter().peekable();
    loop {
        let arrival = pending.peek().map(|(at, _)| *at);
        let event = device.next_event_time();
        match (arrival, event) {
            (None, None) => break,
            (Some(arrival), event) if event.is_none_or(|event| arrival < event) => {
                let (at, next_request) = pending.next().expect("peeked");
                device.submit(*at, *next_request);
                assert!(arrival == *at);
            }
            (_, Some(event)) => device.advance(event, &mut all),
            (Some(_), None) => unreachable!("covered by the arm above"),
        }
    }
    all
}

fn megabytes_per_second(bytes: u64, completions: &[Completion]) -> f64 {
    let end = completions.iter().map(|completion| completion.at).max().expect("completions");
    bytes as f64 / end.as_secs_f64() / 1e6
}

fn sequential(op: IoOp, len: u64, count: u64) -> impl FnMut(u64) -> Option<DeviceRequest> {
    move |index| (index < count).then(|| request(index, op, index * len, len))
}

fn model(name: &str) -> Box<dyn Device> {
    by_name(name, 1).expect("known model")
}

fn sequential_bandwidth(name: &str, op: IoOp, len: u64, bytes: u64) -> f64 {
    let mut device = model(name);
    let count = bytes / len;
    let completions = closed_loop(device.as_mut(), 32, sequential(op, len, count));
    assert_eq!(completions.len() as u64, count);
    megabytes_per_second(count * len, &completions)
}

/// Mean latency of `count` random 4 KiB reads at queue depth `depth`, and the IOPS.
fn random_reads(device: &mut dyn Device, depth: usize, count: u64, span: u64) -> (Duration, f64) {
    let mut prng = Prng::new(99);
    let completions = closed_loop(device, depth, |index| {
        (index < count).then(|| request(index, IoOp::Read, prng.below(span / 4096) * 4096, 4096))
    });
    let total: u64 = completions.iter().map(|completion| completion.latency.as_nanos()).sum();
    let end = completions.iter().map(|completion| completion.at).max().expect("completions");
    (Duration::from_nanos(total / count), count as f64 / end.as_secs_f64())
}

/// Latency of one 4 KiB read submitted on an idle device, and of one submitted `read_at_ms`
/// after `writes` buffered writes of `len` bytes were submitted at time zero (late enough for
/// the backlog to fill the cache and the hardware queue).
fn read_latency_idle_and_behind_writes(
    name: &str,
    writes: u64,
    len: u64,
    read_at_ms: u64,
) -> (Duration, Duration) {
    let far = 100_000 * MIB;
    let mut idle = model(name);
    let idle_latency =
        open_loop(idle.as_mut(), &[(Instant::ZERO, request(0, IoOp::Read, far, 4096))])[0].latency;
    let mut busy = model(name);
    let mut requests: Vec<(Instant, DeviceRequest)> = (0..writes)
        .map(|index| (Instant::ZERO, request(index, IoOp::Write, index * len, len)))
        .collect();
    let read_id = writes;
    let read_at = Instant::ZERO + Duration::from_millis(read_at_ms);
    requests.push((read_at, request(read_id, IoOp::Read, far, 4096)));
    let completions = open_loop(busy.as_mut(), &requests);
    let read = completions.iter().find(|completion| completion.id == read_id).expect("read");
    (idle_latency, read.latency)
}

#[test]
fn sata_sequential_bandwidth() {
    // Goal: one sequential stream of 512 KiB requests runs at the media rate (55-65 MB/s),
    // for writes through the cache as for reads.
    let write = sequential_bandwidth("sata-2010", IoOp::Write, 512 * KIB, 1024 * MIB);
    assert!((55.0..=65.0).contains(&write), "sequential write {write:.1} MB/s");
    let read = sequential_bandwidth("sata-2010", IoOp::Read, 512 * KIB, 512 * MIB);
    assert!((55.0..=65.0).contains(&read), "sequential read {read:.1} MB/s");
}

#[test]
fn sata_random_read_iops() {
    // Goal: 4 KiB random reads over the whole disk cost a seek and a rotation each: about 80
    // IOPS at queue depth 1, more (but under ~170) when NCQ-like reordering has 32 to choose.
    let span = DiskParams::sata_2010().capacity_bytes;
    let (latency, iops_depth_1) = random_reads(model("sata-2010").as_mut(), 1, 2000, span);
    assert!((70.0..=100.0).contains(&iops_depth_1), "QD1 {iops_depth_1:.0} IOPS");
    assert!((10.0..=14.5).contains(&latency.as_millis_f64()), "QD1 latency {latency}");
    let (_, iops_depth_32) = random_reads(model("sata-2010").as_mut(), 32, 4000, span);
    assert!((100.0..=170.0).contains(&iops_depth_32), "QD32 {iops_depth_32:.0} IOPS");
}

#[test]
fn sata_interleaved_streams_seek() {
    // Goal: eight sequential read streams far apart make the head seek between them, so the
    // disk delivers well under half of one stream's bandwidth.
    let len = 512 * KIB;
    let region = DiskParams::sata_2010().capacity_bytes / 8;
    let count = 1024;
    let mut device = model("sata-2010");
    let completions = closed_loop(device.as_mut(), 8, |index| {
        let stream = index % 8;
        (index < count)
            .then(|| request(index, IoOp::Read, stream * region + (index / 8) * len, len))
    });
    let interleaved = megabytes_per_second(count * len, &completions);
    let single = sequential_bandwidth("sata-2010", IoOp::Read, len, count * len);
    assert!(interleaved < 0.5 * single, "8 streams {interleaved:.1} vs 1 stream {single:.1}");
    assert!(device.stats().seeks > count / 2);
}

#[test]
fn sata_read_waits_behind_write_backlog() {
    // Goal: a read submitted together with a deep backlog of buffered writes waits for tags
    // and destaging, so it takes clearly longer than the same read on an idle disk.
    let (idle, behind) = read_latency_idle_and_behind_writes("sata-2010", 256, 512 * KIB, 500);
    assert!(idle.as_millis_f64() < 20.0, "idle read {idle}");
    assert!(behind.as_nanos() > 2 * idle.as_nanos(), "idle {idle}, behind writes {behind}");
}

#[test]
fn sata_merges_contiguous_requests() {
    // Goal: contiguous 4 KiB writes that wait in the elevator merge into requests of up to
    // 512 KiB, so the disk sees few large commands.
    let mut device = model("sata-2010");
    let count = 4096;
    let requests: Vec<(Instant, DeviceRequest)> = (0..count)
        .map(|index| (Instant::ZERO, request(index, IoOp::Write, index * 4096, 4096)))
        .collect();
    let completions = open_loop(device.as_mut(), &requests);
    assert_eq!(completions.len() as u64, count);
    let stats = device.stats();
    // 32 requests go straight to the tags; the other 4064 merge into 32 requests of 128.
    assert_eq!(stats.dispatches, 64, "{stats:?}");
    assert_eq!(stats.merges, count - 64);
    assert_eq!(stats.writes, count);
    assert_eq!(stats.write_bytes, count * 4096);
}

#[test]
fn raid0_scales_sequential_bandwidth() {
    // Goal: striping over four disks gives about four times one disk's sequential bandwidth.
    for op in [IoOp::Read, IoOp::Write] {
        let single = sequential_bandwidth("sata-2010", op, 512 * KIB, 512 * MIB);
        let raid = sequential_bandwidth("raid0-4x-sata-2010", op, 512 * KIB, 2048 * MIB);
        let ratio = raid / single;
        assert!((3.4..=4.6).contains(&ratio), "{op:?}: raid {raid:.1}, disk {single:.1}");
    }
}

#[test]
fn raid0_splits_across_members() {
    // Goal: a request spanning chunks is split into one contiguous piece per member and
    // completes once, when its last piece does.
    let mut raid = Raid0::new("raid", Raid0Params::raid0_4x_sata_2010(), 3);
    let completions =
        open_loop(&mut raid, &[(Instant::ZERO, request(7, IoOp::Read, 256 * KIB, 5 * 512 * KIB))]);
    assert_eq!(completions.len(), 1);
    assert_eq!(completions[0].id, 7);
    let reads: Vec<u64> = raid.members().iter().map(|member| member.stats().read_bytes).collect();
    // Chunks 0..=5 are touched; member 0 gets chunks 0 (half) and 4, member 1 chunks 1 and 5
    // (half), members 2 and 3 one chunk each.
    assert_eq!(reads, vec![768 * KIB, 768 * KIB, 512 * KIB, 512 * KIB]);
}

#[test]
fn write_cache_acks_fast_then_at_destage_rate() {
    // Goal: with the cache empty, writes are acknowledged at link speed; once it is full,
    // each write waits for a destage step, so acknowledgements slow to the media rate.
    let mut device = model("sata-2010");
    let len = 512 * KIB;
    let completions = closed_loop(device.as_mut(), 1, sequential(IoOp::Write, len, 200));
    let latencies: Vec<f64> =
        completions.iter().map(|completion| completion.latency.as_millis_f64()).collect();
    // 16 MiB holds 32 requests; the first 30 see only the 280 MB/s link.
    for (index, latency) in latencies[..30].iter().enumerate() {
        assert!(*latency < 2.5, "write {index} took {latency} ms with room in the cache");
    }
    let steady = &latencies[60..200];
    let mean = steady.iter().sum::<f64>() / steady.len() as f64;
    assert!((7.0..=11.0).contains(&mean), "steady write latency {mean:.2} ms");
    let rate = (140 * len) as f64 / (completions[199].at - completions[59].at).as_secs_f64() / 1e6;
    assert!((55.0..=65.0).contains(&rate), "steady ack rate {rate:.1} MB/s");
}

#[test]
fn flush_waits_for_cache_to_empty() {
    // Goal: a flush completes exactly when the cached writes before it are all destaged, and
    // at once when nothing is dirty.
    let mut device = BlockDevice::disk("disk", DiskParams::sata_2010(), 1);
    let len = 512 * KIB;
    let mut requests: Vec<(Instant, DeviceRequest)> = (0..20)
        .map(|index| (Instant::ZERO, request(index, IoOp::Write, index * len, len)))
        .collect();
    requests.push((Instant::ZERO, request(100, IoOp::Flush, 0, 0)));
    let mut done = Vec::new();
    let mut pending = requests.into_iter();
    for (at, next_request) in pending.by_ref() {
        device.submit(at, next_request);
    }
    let mut flushed_at = None;
    while let Some(at) = device.next_event_time() {
        let before = done.len();
        device.advance(at, &mut done);
        if let Some(flush) = done[before..].iter().find(|completion| completion.op == IoOp::Flush) {
            assert_eq!(device.cache_dirty_bytes(), 0);
            flushed_at = Some(flush.at);
        } else if flushed_at.is_none() {
            assert!(device.stats().destage_bytes < 20 * len, "cache drained before the flush");
        }
    }
    let flushed_at = flushed_at.expect("flush completed");
    assert_eq!(device.stats().destage_bytes, 20 * len);
    // 10 MiB at 60 MB/s is about 175 ms of destaging.
    assert!((150.0..=200.0).contains(&(flushed_at.as_secs_f64() * 1e3)), "flush at {flushed_at}");
    let later = flushed_at + Duration::from_millis(1);
    device.submit(later, request(101, IoOp::Flush, 0, 0));
    assert_eq!(device.next_event_time(), Some(later));
    device.advance(later, &mut done);
    assert_eq!(
        done.last().map(|completion| (completion.id, completion.latency)),
        Some((101, Duration::ZERO))
    );
}

#[test]
fn write_cache_disabled_by_override() {
    // Goal: experiment files can override fields (here the cache size), unknown fields are
    // rejected, and unknown models name the known ones.
    let mut overrides = toml::Table::new();
    overrides.insert("write_cache_bytes".to_string(), toml::Value::Integer(0));
    let mut device = by_name_with_overrides("sata-2010", 1, &overrides).expect("valid override");
    let completions = closed_loop(device.as_mut(), 1, sequential(IoOp::Write, 512 * KIB, 10));
    assert!(completions.iter().all(|completion| completion.latency.as_millis_f64() > 8.0));
    assert_eq!(device.stats().destage_bytes, 0);

    let mut nested = toml::Table::new();
    let mut member = toml::Table::new();
    member.insert("queue_depth".to_string(), toml::Value::Integer(1));
    nested.insert("member".to_string(), toml::Value::Table(member));
    let raid = by_name_with_overrides("raid0-4x-sata-2010", 1, &nested).expect("nested override");
    let DeviceParams::Raid0(params) = raid.params() else { panic!("raid params") };
    assert_eq!(params.member.queue_depth, 1);
    assert_eq!(params.member.rpm, 7200);

    let mut typo = toml::Table::new();
    typo.insert("write_cache_byte".to_string(), toml::Value::Integer(0));
    let error = by_name_with_overrides("sata-2010", 1, &typo).err().expect("typo rejected");
    assert!(error.to_string().contains("write_cache_byte"), "{error}");

    let error = by_name("sata-2011", 1).err().expect("unknown model");
    let message = error.to_string();
    assert!(message.contains("sata-2011") && message.contains("laptop-ssd"), "{message}");
}

#[test]
fn laptop_ssd_ranges() {
    // Goal: the 2016 SATA SSD reads at ~520 MB/s, sustains 350-450 MB/s of writes past its
    // cache, serves a lone 4 KiB read in ~100 us, and makes a read wait behind queued writes.
    let read = sequential_bandwidth("laptop-ssd", IoOp::Read, 512 * KIB, 1024 * MIB);
    assert!((470.0..=550.0).contains(&read), "read {read:.0} MB/s");
    let write = sequential_bandwidth("laptop-ssd", IoOp::Write, 512 * KIB, 4096 * MIB);
    assert!((350.0..=450.0).contains(&write), "write {write:.0} MB/s");
    let span = FlashParams::laptop_ssd_2016().capacity_bytes;
    let (latency, _) = random_reads(model("laptop-ssd").as_mut(), 1, 1000, span);
    assert!((80.0..=120.0).contains(&(latency.as_micros() as f64)), "4 KiB read {latency}");
    let (idle, behind) = read_latency_idle_and_behind_writes("laptop-ssd", 1024, 512 * KIB, 500);
    assert!(behind.as_nanos() > 10 * idle.as_nanos(), "idle {idle}, behind writes {behind}");
}

#[test]
fn nvme_ranges() {
    // Goal: the NVMe drive reads at ~3 GB/s, writes through at ~2 GB/s, serves a lone
    // 4 KiB read in ~80 us, and makes a read wait behind queued writes.
    let read = sequential_bandwidth("nvme", IoOp::Read, 512 * KIB, 4096 * MIB);
    assert!((2700.0..=3100.0).contains(&read), "read {read:.0} MB/s");
    let write = sequential_bandwidth("nvme", IoOp::Write, 512 * KIB, 8192 * MIB);
    assert!((1800.0..=2150.0).contains(&write), "write {write:.0} MB/s");
    let span = FlashParams::nvme().capacity_bytes;
    let (latency, _) = random_reads(model("nvme").as_mut(), 1, 1000, span);
    assert!((60.0..=100.0).contains(&(latency.as_micros() as f64)), "4 KiB read {latency}");
    let (idle, behind) = read_latency_idle_and_behind_writes("nvme", 4096, 512 * KIB, 300);
    assert!(behind.as_nanos() > 10 * idle.as_nanos(), "idle {idle}, behind writes {behind}");
}

#[test]
fn usb_stick_ranges() {
    // Goal: the USB stick reads at ~20 MB/s and writes at ~6 MB/s sequentially, takes about a
    // millisecond per small read, pays an erase-block penalty on random writes, and makes a
    // read wait for the write in progress.
    let len = 120 * KIB;
    let read = sequential_bandwidth("usb-stick", IoOp::Read, len, 64 * MIB);
    assert!((16.0..=21.0).contains(&read), "read {read:.1} MB/s");
    let write = sequential_bandwidth("usb-stick", IoOp::Write, len, 32 * MIB);
    assert!((4.5..=6.5).contains(&write), "write {write:.2} MB/s");
    let span = FlashParams::usb_stick().capacity_bytes;
    let (latency, _) = random_reads(model("usb-stick").as_mut(), 1, 200, span);
    assert!((0.5..=2.0).contains(&latency.as_millis_f64()), "4 KiB read {latency}");
    let mut prng = Prng::new(5);
    let mut device = model("usb-stick");
    let completions = closed_loop(device.as_mut(), 1, |index| {
        (index < 50).then(|| request(index, IoOp::Write, prng.below(span / 4096) * 4096, 4096))
    });
    let iops = 50.0 / completions[49].at.as_secs_f64();
    assert!((15.0..=50.0).contains(&iops), "random 4 KiB writes {iops:.1} IOPS");
    let (idle, behind) = read_latency_idle_and_behind_writes("usb-stick", 16, len, 50);
    assert!(behind.as_nanos() > 5 * idle.as_nanos(), "idle {idle}, behind writes {behind}");
}

/// A mixed open-loop workload: Poisson arrivals of reads, writes (some sequential runs) and
/// occasional flushes.
fn mixed_workload(seed: u64, count: u64, capacity: u64) -> Vec<(Instant, DeviceRequest)> {
    let mut prng = Prng::new(seed);
    let mut now = Instant::ZERO;
    let mut cursor = 0;
    (0..count)
        .map(|id| {
            now += Duration::from_nanos(prng.exponential(2e6) as u64);
            let len = 4096 << prng.below(8);
            let draw = prng.below(100);
            let next_request = if draw < 2 {
                request(id, IoOp::Flush, 0, 0)
            } else if draw < 40 {
                request(id, IoOp::Read, prng.below(capacity / len) * len, len)
            } else {
                if prng.chance(0.2) {
                    cursor = prng.below(capacity / MIB) * MIB;
                }
                let offset = cursor;
                cursor += len;
                request(id, IoOp::Write, offset, len)
            };
            (now, next_request)
        })
        .collect()
}

fn completion_hash(completions: &[Completion]) -> u64 {
    // FNV-1a over (id, at): any change in order or timing changes the hash.
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for completion in completions {
        for word in [completion.id, completion.at.as_nanos()] {
            for byte in word.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    hash
}

#[test]
fn same_seed_same_completions() {
    // Goal: every model replays a mixed workload identically from the same seed, and the
    // disk's rotational jitter really depends on the seed.
    for name in MODEL_NAMES {
        let run = |seed: u64| {
            let mut device = by_name(name, seed).expect("known model");
            let capacity = 100_000 * MIB;
            let completions = open_loop(device.as_mut(), &mixed_workload(11, 3000, capacity));
            assert_eq!(completions.len(), 3000, "{name}");
            assert_eq!(device.queued(), 0);
            completion_hash(&completions)
        };
        assert_eq!(run(1), run(1), "{name} is not deterministic");
        if name.contains("sata") {
            assert_ne!(run(1), run(2), "{name} ignores its seed");
        }
    }
}

#[test]
fn completions_are_in_time_order_and_stats_add_up() {
    // Goal: advance reports completions in time order with latency = at - submit, and the
    // counters match the workload.
    for name in MODEL_NAMES {
        let mut device = model(name);
        let workload = mixed_workload(12, 2000, 50_000 * MIB);
        let completions = open_loop(device.as_mut(), &workload);
        assert!(completions.windows(2).all(|pair| pair[0].at <= pair[1].at), "{name}");
        for completion in &completions {
            let submitted = workload[completion.id as usize].0;
            assert_eq!(completion.at - submitted, completion.latency);
        }
        let stats = device.stats();
        let count = |op| workload.iter().filter(|(_, r)| r.op == op).count() as u64;
        assert_eq!(stats.reads, count(IoOp::Read), "{name}");
        assert_eq!(stats.writes, count(IoOp::Write), "{name}");
        assert_eq!(stats.flushes, count(IoOp::Flush), "{name}");
        assert!(stats.busy_time.as_nanos() > 0 && stats.queued_max > 0);
    }
}

/// A clean restart (the server shut down after writing everything it had received) keeps the
/// data and the verifier; a restart after a crash loses what was not committed and changes
/// the verifier.
#[test]
fn nfs_clean_restart_keeps_data_and_verifier() {
    use super::nfs::{NfsServerState, ReceivedWrite};
    let mut server = NfsServerState::new(7);
    let before = server.receive(ReceivedWrite { file: 1, offset: 0, len: 8192 });
    server.restart_keeping_data();
    let s = server.stats();
    assert_eq!(
        (server.verifier(), s.durable_bytes, s.lost_bytes, s.restarts),
        (before, 8192, 0, 1)
    );
    server.receive(ReceivedWrite { file: 1, offset: 8192, len: 4096 });
    server.restart();
    let s = server.stats();
    assert_ne!(server.verifier(), before);
    assert_eq!((s.durable_bytes, s.lost_bytes), (8192, 4096));
}
