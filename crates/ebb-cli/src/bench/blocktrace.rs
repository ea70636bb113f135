//! `read-under-write --breakdown`: where each read's time went. The reader records, per read, when
//! it was issued and completed (`CLOCK_MONOTONIC`) and how long its thread waited for a CPU
//! meanwhile (`run_delay` of `/proc/thread-self/schedstat`, before and after). The block layer's
//! tracepoints (`block_rq_insert`, `block_rq_issue`, `block_rq_complete` of the device under the
//! directory, in a tracefs instance of the bench's own, clock `mono`) give each device read's time
//! in the IO scheduler (insert to issue) and in the device (issue to completion), and which writes
//! the device had in service (issued, not completed) and queued in the scheduler when the read
//! reached it; whether a write was in service at any time while the device served it (also one
//! issued after it); and, with none in service when it was issued, how long before the last write
//! had completed. Each of the reader's reads is joined to the device read its thread queued between
//! the read's start and end (the reader has one read in flight at a time). Needs root and tracefs;
//! the text trace has microsecond timestamps, so the device figures are good to about a
//! microsecond.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where tracefs is mounted.
const TRACEFS: &str = "/sys/kernel/tracing";

/// Ring buffer per CPU, KiB: a 10 s mode of 15,000 reads a second makes about 450,000 events
/// (three per read) of about 60 bytes each, 27 MiB; this holds twice that on one CPU.
const BUFFER_KIB: u64 = 65536;

/// The monotonic clock, nanoseconds (the clock tracefs's `mono` uses).
pub(crate) fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The calling thread's `run_delay`, read through one open file per reader.
pub(crate) struct RunDelay(File);

impl RunDelay {
    pub(crate) fn open() -> Option<RunDelay> {
        File::open("/proc/thread-self/schedstat").ok().map(RunDelay)
    }

    /// Nanoseconds the thread has spent runnable but not running, in all.
    pub(crate) fn now(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.0.read_at(&mut buf, 0).unwrap_or(0);
        let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
        text.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0)
    }
}

/// One of the reader's reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadSample {
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) run_delay_ns: u64,
}

/// One device read, from the trace.
#[derive(Clone, Copy, Debug, Default)]
struct DevRead {
    insert_ns: u64,
    issue_ns: u64,
    complete_ns: u64,
    /// Writes issued to the device and not completed when the read was issued to it.
    writes_in_service: u32,
    /// Their bytes.
    write_bytes_in_service: u64,
    /// Writes in the IO scheduler, not yet issued, when the read was inserted.
    writes_queued: u32,
    /// A write was in service at some time while the device served the read (in service at
    /// its issue, or issued before its completion).
    overlapped: bool,
    /// With no write in service at its issue, how long before it the last write completed.
    since_write_ns: Option<u64>,
}

/// A read joined to its device read (if one was found).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadRecord {
    latency_ns: u64,
    run_delay_ns: u64,
    dev: Option<DevRead>,
}

impl ReadRecord {
    pub(crate) fn latency_us(&self) -> u64 {
        self.latency_ns / 1000
    }
}

/// A tracefs instance tracing one device's requests; removed on drop.
pub(crate) struct BlockTrace {
    dir: PathBuf,
}

const EVENTS: [&str; 3] = ["block_rq_insert", "block_rq_issue", "block_rq_complete"];

fn write(path: &Path, text: &str) -> io::Result<()> {
    std::fs::write(path, text)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

impl BlockTrace {
    /// Starts tracing the requests of the block device `major:minor`.
    pub(crate) fn start(dev: (u64, u64)) -> io::Result<BlockTrace> {
        let dir =
            Path::new(TRACEFS).join("instances").join(format!("ebb-bench-{}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e} (--breakdown needs root and tracefs)", dir.display()),
                ));
            }
        }
        let trace = BlockTrace { dir };
        write(&trace.dir.join("tracing_on"), "0")?;
        write(&trace.dir.join("trace_clock"), "mono")?;
        write(&trace.dir.join("buffer_size_kb"), &BUFFER_KIB.to_string())?;
        // The kernel's dev_t inside the kernel: major << 20 | minor.
        let filter = format!("dev == {}", (dev.0 << 20) | dev.1);
        for event in EVENTS {
            let at = trace.dir.join("events/block").join(event);
            write(&at.join("filter"), &filter)?;
            write(&at.join("enable"), "1")?;
        }
        write(&trace.dir.join("trace"), "")?;
        write(&trace.dir.join("tracing_on"), "1")?;
        Ok(trace)
    }

    /// Stops tracing and joins the reader's `samples` (in order) to the device's reads.
    /// Returns the records and the events the ring buffer lost.
    pub(crate) fn finish(self, samples: &[ReadSample]) -> io::Result<(Vec<ReadRecord>, u64)> {
        write(&self.dir.join("tracing_on"), "0")?;
        let lost = self.lost();
        let reads = parse(BufReader::new(File::open(self.dir.join("trace"))?))?;
        Ok((join(samples, &reads), lost))
    }

    /// Events overwritten in the ring buffer, all CPUs.
    fn lost(&self) -> u64 {
        let Ok(cpus) = std::fs::read_dir(self.dir.join("per_cpu")) else { return 0 };
        cpus.filter_map(|cpu| std::fs::read_to_string(cpu.ok()?.path().join("stats")).ok())
            .flat_map(|stats| {
                stats
                    .lines()
                    .filter_map(|l| l.strip_prefix("overrun:")?.trim().parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

impl Drop for BlockTrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        for event in EVENTS {
            let _ = std::fs::write(self.dir.join("events/block").join(event).join("enable"), "0");
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One trace line: the event, its time, whether a read or write, sector, bytes.
fn parse_line(line: &str) -> Option<(&str, u64, bool, u64, u64)> {
    let at = line.find(": block_rq_")?;
    let ts = line[..at].rsplit(' ').next()?;
    let (secs, frac) = ts.split_once('.')?;
    let frac_ns: u64 = format!("{frac:0<9}")[..9].parse().ok()?;
    let t = secs.parse::<u64>().ok()? * 1_000_000_000 + frac_ns;
    let rest = &line[at + 2..];
    let (event, details) = rest.split_once(": ")?;
    let tokens: Vec<&str> = details.split_whitespace().collect();
    let rwbs = tokens.get(1)?;
    let write = if rwbs.contains('W') {
        true
    } else if rwbs.contains('R') {
        false
    } else {
        return None; // flushes, discards
    };
    let plus = tokens.iter().position(|t| *t == "+")?;
    let sector = tokens.get(plus.checked_sub(1)?)?.parse().ok()?;
    let nr: u64 = tokens.get(plus + 1)?.parse().ok()?;
    Some((event, t, write, sector, nr * 512))
}

/// The device reads of a trace, in the order they were inserted, with the writes around them.
fn parse(trace: impl io::BufRead) -> io::Result<Vec<DevRead>> {
    let mut queued_writes: HashMap<u64, u64> = HashMap::new();
    let mut writes_in_service: HashMap<u64, u64> = HashMap::new();
    let mut service_bytes = 0u64;
    let mut last_write_done: Option<u64> = None;
    let mut pending: HashMap<u64, DevRead> = HashMap::new();
    let mut done = Vec::new();
    for line in trace.lines() {
        let line = line?;
        if line.starts_with('#') {
            continue;
        }
        let Some((event, t, write, sector, bytes)) = parse_line(&line) else { continue };
        match (event, write) {
            ("block_rq_insert", true) => {
                queued_writes.insert(sector, bytes);
            }
            ("block_rq_issue", true) => {
                queued_writes.remove(&sector);
                if let Some(old) = writes_in_service.insert(sector, bytes) {
                    service_bytes -= old;
                }
                service_bytes += bytes;
                pending.values_mut().filter(|r| r.issue_ns > 0).for_each(|r| r.overlapped = true);
            }
            ("block_rq_complete", true) => {
                if let Some(old) = writes_in_service.remove(&sector) {
                    service_bytes -= old;
                }
                last_write_done = Some(t);
            }
            ("block_rq_insert", false) => {
                let r = DevRead {
                    insert_ns: t,
                    writes_queued: queued_writes.len() as u32,
                    ..DevRead::default()
                };
                pending.insert(sector, r);
            }
            ("block_rq_issue", false) => {
                let r = pending.entry(sector).or_insert(DevRead {
                    insert_ns: t,
                    writes_queued: queued_writes.len() as u32,
                    ..DevRead::default()
                });
                r.issue_ns = t;
                r.writes_in_service = writes_in_service.len() as u32;
                r.write_bytes_in_service = service_bytes;
                r.overlapped = !writes_in_service.is_empty();
                r.since_write_ns =
                    last_write_done.filter(|_| !r.overlapped).map(|done| t.saturating_sub(done));
            }
            ("block_rq_complete", false) => {
                if let Some(mut r) = pending.remove(&sector)
                    && r.issue_ns > 0
                {
                    r.complete_ns = t;
                    done.push(r);
                }
            }
            _ => {}
        }
    }
    done.sort_by_key(|r| r.insert_ns);
    Ok(done)
}

/// Joins each sample to the device read inserted between its start and end (a microsecond
/// of slack either side: the trace's resolution).
fn join(samples: &[ReadSample], reads: &[DevRead]) -> Vec<ReadRecord> {
    samples
        .iter()
        .map(|s| {
            let from = s.start_ns.saturating_sub(1000);
            let i = reads.partition_point(|r| r.insert_ns < from);
            let dev = reads.get(i).filter(|r| r.insert_ns <= s.end_ns + 1000).copied();
            ReadRecord {
                latency_ns: s.end_ns.saturating_sub(s.start_ns),
                run_delay_ns: s.run_delay_ns,
                dev,
            }
        })
        .collect()
}

/// Means over one class of reads, microseconds unless named otherwise.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ClassFigures {
    /// Reads in the class.
    pub(crate) reads: u64,
    /// Of them, joined to a device read in the trace.
    pub(crate) joined: u64,
    /// Mean latency as the reader saw it.
    pub(crate) lat_us: f64,
    /// Mean time the reader thread waited for a CPU during the read.
    pub(crate) run_delay_us: f64,
    /// Mean time in the IO scheduler (insert to issue), joined reads.
    pub(crate) sched_us: f64,
    /// Mean time in the device (issue to completion), joined reads.
    pub(crate) device_us: f64,
    /// The rest of the joined reads' latency: the system call, the filesystem, waking up.
    pub(crate) other_us: f64,
    /// Mean writes in service at the device when the read was issued to it.
    pub(crate) writes_in_service: f64,
    /// Mean bytes of those, KiB.
    pub(crate) write_kib_in_service: f64,
    /// Share of the joined reads issued while a write was in service, %.
    pub(crate) with_write_pct: f64,
    /// Mean writes queued in the scheduler when the read arrived there.
    pub(crate) writes_queued: f64,
    /// Share of the joined reads during whose device service a write was in service at some
    /// time, %.
    pub(crate) overlap_pct: f64,
    /// Share of the joined reads with no write in service, issued within `AFTER_WRITE_NS` of a
    /// write's completion, %.
    pub(crate) after_write_pct: f64,
    /// Share of the joined reads that spent over half their latency in the device, %.
    pub(crate) device_bound_pct: f64,
    /// Share of the reads that spent over half their latency waiting for a CPU, %.
    pub(crate) cpu_bound_pct: f64,
}

/// A read issued this soon after a write completed counts in `after_write_pct`, ns.
const AFTER_WRITE_NS: u64 = 2_000_000;

/// Where the reads' time went: the reads up to the mode's p90, from p90 to p99, above p99, and
/// from p99 to p99.9.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Breakdown {
    /// Reads at or under the p90.
    pub(crate) to_p90: ClassFigures,
    /// Reads over the p90 and at or under the p99.
    pub(crate) p90_to_p99: ClassFigures,
    /// Reads over the p99.
    pub(crate) above_p99: ClassFigures,
    /// Of them, those at or under the p99.9: the reads that set the p99 when a few more or
    /// fewer are slow.
    pub(crate) p99_to_p99_9: ClassFigures,
    /// Trace events the ring buffer lost (the join misses reads where it did).
    pub(crate) lost_events: u64,
}

impl Breakdown {
    /// The classes of `records` by the mode's `p90`, `p99` and `p99_9` (microseconds).
    pub(crate) fn of(
        records: &[ReadRecord],
        [p90, p99, p99_9]: [u64; 3],
        lost_events: u64,
    ) -> Breakdown {
        let class = |keep: &dyn Fn(u64) -> bool| {
            let mut c = ClassFigures::default();
            let (mut with_write, mut overlap, mut after) = (0u64, 0u64, 0u64);
            let (mut device_bound, mut cpu_bound) = (0u64, 0u64);
            for r in records.iter().filter(|r| keep(r.latency_us())) {
                c.reads += 1;
                c.lat_us += r.latency_ns as f64 / 1e3;
                c.run_delay_us += r.run_delay_ns as f64 / 1e3;
                cpu_bound += u64::from(r.run_delay_ns * 2 > r.latency_ns);
                if let Some(d) = r.dev {
                    c.joined += 1;
                    let sched = d.issue_ns.saturating_sub(d.insert_ns) as f64 / 1e3;
                    let device = d.complete_ns.saturating_sub(d.issue_ns) as f64 / 1e3;
                    c.sched_us += sched;
                    c.device_us += device;
                    c.other_us +=
                        r.latency_ns as f64 / 1e3 - sched - device - r.run_delay_ns as f64 / 1e3;
                    c.writes_in_service += f64::from(d.writes_in_service);
                    c.write_kib_in_service += d.write_bytes_in_service as f64 / 1024.0;
                    c.writes_queued += f64::from(d.writes_queued);
                    with_write += u64::from(d.writes_in_service > 0);
                    overlap += u64::from(d.overlapped);
                    let in_device = d.complete_ns.saturating_sub(d.issue_ns);
                    device_bound += u64::from(in_device * 2 > r.latency_ns);
                    after += u64::from(d.since_write_ns.is_some_and(|ns| ns < AFTER_WRITE_NS));
                }
            }
            let n = c.reads.max(1) as f64;
            let j = c.joined.max(1) as f64;
            c.lat_us /= n;
            c.run_delay_us /= n;
            c.sched_us /= j;
            c.device_us /= j;
            c.other_us /= j;
            c.writes_in_service /= j;
            c.write_kib_in_service /= j;
            c.writes_queued /= j;
            c.with_write_pct = with_write as f64 * 100.0 / j;
            c.overlap_pct = overlap as f64 * 100.0 / j;
            c.after_write_pct = after as f64 * 100.0 / j;
            c.device_bound_pct = device_bound as f64 * 100.0 / j;
            c.cpu_bound_pct = cpu_bound as f64 * 100.0 / n;
            c
        };
        Breakdown {
            to_p90: class(&|us| us <= p90),
            p90_to_p99: class(&|us| us > p90 && us <= p99),
            above_p99: class(&|us| us > p99),
            p99_to_p99_9: class(&|us| us > p99 && us <= p99_9),
            lost_events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that waited in the device behind a write in service is joined to its device
    /// read, with the write's bytes; the write that completed before it is not counted.
    #[test]
    fn a_trace_joins_reads_to_the_writes_in_service() {
        let trace = "\
# tracer: nop
  kworker-1 [000] ..... 100.000100: block_rq_insert: 254,0 W 1048576 () 5000 + 2048 be,0,4 [ebb-io]
  kworker-1 [000] ..... 100.000110: block_rq_issue: 254,0 W 1048576 () 5000 + 2048 be,0,4 [ebb-io]
  kworker-1 [000] ..... 100.000120: block_rq_insert: 254,0 W 4096 () 9000 + 8 be,0,4 [ebb-io]
  kworker-1 [000] ..... 100.000130: block_rq_issue: 254,0 W 4096 () 9000 + 8 be,0,4 [ebb-io]
  <idle>-0 [001] d.h.. 100.000140: block_rq_complete: 254,0 W () 9000 + 8 be,0,4 [0]
  reader-7 [001] ..... 100.000200: block_rq_insert: 254,0 R 4096 () 100 + 8 be,0,4 [reader]
  reader-7 [001] ..... 100.000210: block_rq_issue: 254,0 R 4096 () 100 + 8 be,0,4 [reader]
  <idle>-0 [000] d.h.. 100.000900: block_rq_complete: 254,0 W () 5000 + 2048 be,0,4 [0]
  <idle>-0 [000] d.h.. 100.001000: block_rq_complete: 254,0 R () 100 + 8 be,0,4 [0]
";
        let reads = parse(trace.as_bytes()).unwrap();
        assert_eq!(reads.len(), 1);
        let r = reads[0];
        assert_eq!(
            (r.insert_ns, r.issue_ns, r.complete_ns),
            (100_000_200_000, 100_000_210_000, 100_001_000_000)
        );
        assert_eq!((r.writes_in_service, r.write_bytes_in_service), (1, 1 << 20));
        let samples = [
            ReadSample { start_ns: 100_000_190_000, end_ns: 100_001_020_000, run_delay_ns: 5_000 },
            ReadSample { start_ns: 100_002_000_000, end_ns: 100_002_050_000, run_delay_ns: 0 },
        ];
        let records = join(&samples, &reads);
        assert!(records[0].dev.is_some() && records[1].dev.is_none());
        let b = Breakdown::of(&records, [100, 500, 1000], 0);
        assert_eq!((b.to_p90.reads, b.above_p99.reads, b.above_p99.joined), (1, 1, 1));
        assert_eq!(b.above_p99.device_us, 790.0);
        assert_eq!(b.above_p99.sched_us, 10.0);
        assert_eq!(b.above_p99.run_delay_us, 5.0);
        assert_eq!(b.above_p99.other_us, 830.0 - 790.0 - 10.0 - 5.0);
        assert_eq!(b.above_p99.with_write_pct, 100.0);
        assert_eq!((b.above_p99.overlap_pct, b.above_p99.after_write_pct), (100.0, 0.0));
        assert_eq!(b.p99_to_p99_9.reads, 1);
    }

    /// A read issued with no write in service counts as overlapped when a write is issued
    /// before it completes; one issued a millisecond after a write completed counts as after
    /// a write, and one issued three milliseconds after as neither.
    #[test]
    fn reads_overlapped_by_a_later_write_or_just_after_one() {
        let trace = "\
  reader-7 [001] ..... 200.000100: block_rq_issue: 254,0 R 4096 () 100 + 8 be,0,4 [reader]
  kworker-1 [000] ..... 200.000110: block_rq_issue: 254,0 W 1048576 () 5000 + 2048 be,0,4 [ebb-io]
  <idle>-0 [000] d.h.. 200.000200: block_rq_complete: 254,0 R () 100 + 8 be,0,4 [0]
  <idle>-0 [000] d.h.. 200.001000: block_rq_complete: 254,0 W () 5000 + 2048 be,0,4 [0]
  reader-7 [001] ..... 200.002000: block_rq_issue: 254,0 R 4096 () 200 + 8 be,0,4 [reader]
  <idle>-0 [000] d.h.. 200.002100: block_rq_complete: 254,0 R () 200 + 8 be,0,4 [0]
  reader-7 [001] ..... 200.004000: block_rq_issue: 254,0 R 4096 () 300 + 8 be,0,4 [reader]
  <idle>-0 [000] d.h.. 200.004100: block_rq_complete: 254,0 R () 300 + 8 be,0,4 [0]
";
        let reads = parse(trace.as_bytes()).unwrap();
        let flags: Vec<_> = reads.iter().map(|r| (r.overlapped, r.since_write_ns)).collect();
        assert_eq!(flags, [(true, None), (false, Some(1_000_000)), (false, Some(3_000_000))]);
        let samples: Vec<_> = reads
            .iter()
            .map(|r| ReadSample { start_ns: r.issue_ns, end_ns: r.complete_ns, run_delay_ns: 0 })
            .collect();
        let b = Breakdown::of(&join(&samples, &reads), [1000, 1000, 1000], 0);
        assert_eq!(b.to_p90.reads, 3);
        assert!((b.to_p90.overlap_pct - 100.0 / 3.0).abs() < 1e-9);
        assert!((b.to_p90.after_write_pct - 100.0 / 3.0).abs() < 1e-9);
    }
}
