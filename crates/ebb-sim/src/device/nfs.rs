//! An NFS server behind a network link: the two-phase backend of
//! docs/mechanisms.md#7-two-phase-backends.
//!
//! A client WRITE crosses the link (one serial resource: the client's TCP stream to the
//! server), lands in the server's memory and is acknowledged UNSTABLE with the server's current
//! write verifier; nothing is on the server's disk yet. A COMMIT (sent as [`IoOp::Flush`])
//! makes every write the server has received but not made durable reach its disk, at the
//! disk's bandwidth, and returns the verifier. A server restart drops everything received but
//! not committed and changes the verifier, so the client's comparison of verifiers detects the
//! loss and writes the pages again (docs/nfs.md).
//!
//! ```text
//!  WRITE ─► link (wire rate) ─► RTT/2 ─► server memory ─► reply RTT/2 (UNSTABLE, verifier)
//!  COMMIT ─► link ─► RTT/2 ─► server fsync (disk, serial) ─► reply RTT/2 (verifier)
//!  READ  ─► RTT/2 ─► server disk ─► reply link (wire rate) ─► RTT/2
//! ```
//!
//! The durability rules (what a WRITE, a COMMIT and a restart do to the server's data and
//! verifier) live in [`NfsServerState`], apart from the timing, so that the simulator's
//! storage-semantics backend ([`crate::backend::SimBackend`]) applies the very same rules to
//! real bytes.
//!
//! Not modelled: the server's own background writeback (it would make COMMITs cheaper; a
//! single client that commits after every writepages batch keeps the server's dirty memory
//! below its background threshold, so the fsync pays for all of it), per-RPC server CPU
//! cost, TCP windowing, retransmissions (a reply lost in a restart is treated as delivered:
//! it carries the verifier the write was received under, which the next COMMIT then fails to
//! match), and COMMIT ranges (a COMMIT makes every received write durable, as a server
//! `syncfs` would; with one file per server, as in the experiments, that is a file's fsync).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::mem;

use ebb_core::time::{Duration, Instant};
use serde::{Deserialize, Serialize};

use super::{Completion, Device, DeviceParams, DeviceRequest, DeviceStats, IoOp, transfer_ns};

/// Granularity of the server's durable-state bookkeeping (the client's page size).
const PAGE: u64 = ebb_core::PAGE_SIZE;

/// Parameters of the `nfs-server` model.
///
/// Provenance: the posting being reproduced (Brown 2020, `004_*`) mounts a server over a
/// network it does not describe; 1 Gbit/s Ethernet was the common case. Its payload rate,
/// ~117 MB/s, is 125 MB/s less Ethernet, IP and TCP framing (~6%). 0.2 ms is a typical
/// same-switch LAN round trip. 1 MiB is the Linux client's default and maximum `wsize`
/// against a Linux server (the posting's "large 1MB WRITE requests"). The server disk rate
/// (150 MB/s, a single 2015-2020 SATA disk's sequential write) and the fixed fsync cost (2 ms:
/// a journal commit plus a disk cache flush) are assumed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsParams {
    /// Payload rate of the network link in each direction, MB/s (decimal).
    pub link_mb_per_s: f64,
    /// Network round-trip time, µs.
    pub rtt_us: f64,
    /// Largest WRITE or READ RPC, bytes (`wsize`/`rsize`); longer requests go out as several
    /// RPCs back to back and complete when the last reply arrives.
    pub wsize_bytes: u64,
    /// Server disk bandwidth for COMMIT and READ, MB/s (decimal).
    pub disk_mb_per_s: f64,
    /// Fixed cost of one server fsync (journal commit, cache flush), µs.
    pub fsync_overhead_us: f64,
    /// Simulated times at which the server restarts, seconds from the start of the run
    /// (fault injection; empty by default).
    pub restart_at_s: Vec<f64>,
    /// Simulated times at which the server restarts after a clean shutdown that wrote
    /// everything it had received to disk: nothing is lost and the verifier stays (fault
    /// injection; empty by default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clean_restart_at_s: Vec<f64>,
}

impl NfsParams {
    /// A Linux NFS server on 1 Gbit/s Ethernet; see the provenance on [`NfsParams`].
    pub fn gigabit_2020() -> NfsParams {
        NfsParams {
            link_mb_per_s: 117.0,
            rtt_us: 200.0,
            wsize_bytes: 1 << 20,
            disk_mb_per_s: 150.0,
            fsync_overhead_us: 2000.0,
            restart_at_s: Vec::new(),
            clean_restart_at_s: Vec::new(),
        }
    }

    /// Rejects parameters the model cannot run with, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 { Ok(()) } else { Err(format!("{name} must be > 0")) }
        };
        positive("link_mb_per_s", self.link_mb_per_s)?;
        positive("disk_mb_per_s", self.disk_mb_per_s)?;
        if !(self.rtt_us.is_finite() && self.rtt_us >= 0.0) {
            return Err("rtt_us must be >= 0".into());
        }
        if !(self.fsync_overhead_us.is_finite() && self.fsync_overhead_us >= 0.0) {
            return Err("fsync_overhead_us must be >= 0".into());
        }
        if self.wsize_bytes < PAGE || !self.wsize_bytes.is_multiple_of(PAGE) {
            return Err(format!("wsize_bytes must be a positive multiple of {PAGE}"));
        }
        if self.restart_at_s.iter().any(|t| !(t.is_finite() && *t >= 0.0)) {
            return Err("restart_at_s entries must be >= 0".into());
        }
        if self.clean_restart_at_s.iter().any(|t| !(t.is_finite() && *t >= 0.0)) {
            return Err("clean_restart_at_s entries must be >= 0".into());
        }
        Ok(())
    }
}

/// What the server has done since creation, beyond [`DeviceStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsStats {
    /// The current write verifier.
    pub verifier: u64,
    /// Restarts so far.
    pub restarts: u64,
    /// Distinct bytes (whole pages) on the server's disk.
    pub durable_bytes: u64,
    /// Bytes received but not yet durable (lost by a restart now).
    pub uncommitted_bytes: u64,
    /// Received bytes a restart dropped.
    pub lost_bytes: u64,
    /// COMMITs completed.
    pub commits: u64,
}

/// One WRITE as the server received it: which file (an NFS file handle; the timing model has
/// one file, 0) and which bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceivedWrite {
    /// The file the write is for.
    pub file: u64,
    /// Byte offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A COMMIT between its arrival at the server ([`NfsServerState::begin_commit`]) and the end
/// of its fsync ([`NfsServerState::finish_commit`]): the writes it covers.
#[derive(Debug)]
pub struct CommitInProgress {
    /// The restart epoch the fsync started in.
    epoch: u64,
    writes: Vec<ReceivedWrite>,
}

impl CommitInProgress {
    /// Bytes the fsync has to write.
    pub fn bytes(&self) -> u64 {
        self.writes.iter().map(|write| write.len).sum()
    }
}

/// What a finished COMMIT did.
#[derive(Debug, PartialEq, Eq)]
pub struct CommitDone {
    /// The verifier the COMMIT reply carries (the server's current one).
    pub verifier: u64,
    /// The writes that are now durable: every write the COMMIT covered, or none if the server
    /// restarted during its fsync.
    pub durable: Vec<ReceivedWrite>,
}

/// The server's durability rules, without timing; shared by the `nfs-server` timing model and
/// the storage-semantics [`crate::backend::SimBackend`].
///
/// * A WRITE is received under the current verifier and is held in server memory only.
/// * A COMMIT covers every write received before it arrived (the whole server, as `syncfs`);
///   they are durable when its fsync ends, unless the server restarted in between, and the
///   reply carries the verifier current at that end.
/// * A restart loses every write received but not durable (including those of a COMMIT whose
///   fsync is under way) and changes the verifier.
#[derive(Clone, Debug)]
pub struct NfsServerState {
    /// Received, not yet durable nor in a COMMIT's fsync, in arrival order.
    uncommitted: Vec<ReceivedWrite>,
    /// Pages (file, offset / PAGE) on the server's disk.
    durable: BTreeSet<(u64, u64)>,
    /// Bumped by every restart; a fsync that started in an earlier epoch made nothing durable.
    epoch: u64,
    base_verifier: u64,
    stats: NfsStats,
}

impl NfsServerState {
    /// A freshly booted server; `seed` picks the first verifier (a boot time, in effect).
    pub fn new(seed: u64) -> NfsServerState {
        let base_verifier = seed | 1;
        NfsServerState {
            uncommitted: Vec::new(),
            durable: BTreeSet::new(),
            epoch: 0,
            base_verifier,
            stats: NfsStats { verifier: base_verifier, ..NfsStats::default() },
        }
    }

    /// The current write verifier.
    pub fn verifier(&self) -> u64 {
        self.stats.verifier
    }

    /// A WRITE reaches server memory; returns the verifier its UNSTABLE reply carries.
    pub fn receive(&mut self, write: ReceivedWrite) -> u64 {
        self.uncommitted.push(write);
        self.stats.verifier
    }

    /// A COMMIT reaches the server: its fsync covers every write received so far.
    pub fn begin_commit(&mut self) -> CommitInProgress {
        CommitInProgress { epoch: self.epoch, writes: mem::take(&mut self.uncommitted) }
    }

    /// The fsync of `commit` ended: its writes are durable unless a restart came first.
    pub fn finish_commit(&mut self, commit: CommitInProgress) -> CommitDone {
        self.stats.commits += 1;
        if commit.epoch != self.epoch {
            // The server restarted during this fsync: its data never reached the disk.
            self.stats.lost_bytes += commit.bytes();
            return CommitDone { verifier: self.stats.verifier, durable: Vec::new() };
        }
        for write in &commit.writes {
            let pages = write.offset / PAGE..(write.offset + write.len).div_ceil(PAGE);
            self.durable.extend(pages.map(|page| (write.file, page)));
        }
        CommitDone { verifier: self.stats.verifier, durable: commit.writes }
    }

    /// The server restarts: everything received but not durable is lost, fsyncs under way
    /// make nothing durable, and the verifier changes.
    pub fn restart(&mut self) {
        self.epoch += 1;
        self.stats.restarts += 1;
        self.stats.verifier = self.base_verifier.wrapping_add(self.stats.restarts);
        self.stats.lost_bytes += self.uncommitted.iter().map(|write| write.len).sum::<u64>();
        self.uncommitted.clear();
    }

    /// The server restarts after a clean shutdown: everything received is written to disk
    /// first (fsyncs under way finish), so nothing is lost and the verifier stays (RFC 1813:
    /// it must change only when the server may have lost data).
    pub fn restart_keeping_data(&mut self) {
        self.stats.restarts += 1;
        for write in mem::take(&mut self.uncommitted) {
            let pages = write.offset / PAGE..(write.offset + write.len).div_ceil(PAGE);
            self.durable.extend(pages.map(|page| (write.file, page)));
        }
    }

    /// Verifier, restarts, durable bytes, uncommitted bytes (received and not yet in a
    /// COMMIT's fsync), lost bytes, commits.
    pub fn stats(&self) -> NfsStats {
        NfsStats {
            durable_bytes: self.durable.len() as u64 * PAGE,
            uncommitted_bytes: self.uncommitted.iter().map(|write| write.len).sum(),
            ..self.stats
        }
    }
}

/// Internal events, in time order (ties by sequence number, i.e. submission order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// A WRITE's last RPC reaches server memory.
    WriteArrives { slot: usize },
    /// A COMMIT reaches the server and starts (or queues for) its fsync.
    CommitArrives { slot: usize },
    /// The fsync of a COMMIT finished.
    CommitDurable { slot: usize },
    /// A reply reaches the client.
    Reply { slot: usize },
    /// The server restarts.
    Restart,
    /// The server restarts after a clean shutdown (data kept, verifier kept).
    CleanRestart,
}

/// A request between submission and reply.
struct Pending {
    request: DeviceRequest,
    submitted: Instant,
    verifier: Option<u64>,
    /// A COMMIT's writes while its fsync runs.
    commit: Option<CommitInProgress>,
}

/// The `nfs-server` model; see the module doc.
pub struct NfsServer {
    name: String,
    params: DeviceParams,
    p: NfsParams,
    /// Next instant the uplink (client to server) is free.
    up_free: Instant,
    /// Next instant the downlink (server to client) is free.
    down_free: Instant,
    /// Next instant the server disk is free.
    disk_free: Instant,
    events: BinaryHeap<Reverse<(Instant, u64, Step)>>,
    seq: u64,
    pending: Vec<Option<Pending>>,
    free_slots: Vec<usize>,
    outstanding: usize,
    busy_since: Instant,
    /// What the server holds and how durable it is.
    state: NfsServerState,
    stats: DeviceStats,
}

impl NfsServer {
    /// A server with `params`; `seed` picks the first verifier (a boot time, in effect).
    pub fn new(name: &str, params: NfsParams, seed: u64) -> NfsServer {
        let mut events = BinaryHeap::new();
        let mut seq = 0;
        for &t in &params.restart_at_s {
            let at = Instant::ZERO + Duration::from_nanos((t * 1e9) as u64);
            events.push(Reverse((at, seq, Step::Restart)));
            seq += 1;
        }
        for &t in &params.clean_restart_at_s {
            let at = Instant::ZERO + Duration::from_nanos((t * 1e9) as u64);
            events.push(Reverse((at, seq, Step::CleanRestart)));
            seq += 1;
        }
        NfsServer {
            name: name.to_string(),
            params: DeviceParams::Nfs(params.clone()),
            p: params,
            up_free: Instant::ZERO,
            down_free: Instant::ZERO,
            disk_free: Instant::ZERO,
            events,
            seq,
            pending: Vec::new(),
            free_slots: Vec::new(),
            outstanding: 0,
            busy_since: Instant::ZERO,
            state: NfsServerState::new(seed),
            stats: DeviceStats::default(),
        }
    }

    /// Server-side counters: verifier, restarts, durable and uncommitted bytes.
    pub fn nfs_stats(&self) -> NfsStats {
        self.state.stats()
    }

    /// Restarts the server at `now` (same calling rule as [`Device::submit`]): everything
    /// received but not durable is lost, fsyncs in progress make nothing durable, and the
    /// verifier changes.
    pub fn restart(&mut self, _now: Instant) {
        self.state.restart();
    }

    fn push(&mut self, at: Instant, step: Step) {
        self.events.push(Reverse((at, self.seq, step)));
        self.seq += 1;
    }

    fn half_rtt(&self) -> Duration {
        Duration::from_nanos((self.p.rtt_us * 500.0) as u64)
    }

    /// Moves `bytes` over a serial link starting no earlier than `now`; returns when the last
    /// byte left.
    fn send(free: &mut Instant, now: Instant, bytes: u64, mb_per_s: f64) -> Instant {
        let start = (*free).max(now);
        *free = start + Duration::from_nanos(transfer_ns(bytes, mb_per_s));
        *free
    }

    fn on_step(&mut self, at: Instant, step: Step) {
        match step {
            Step::WriteArrives { slot } => {
                let pending = self.pending[slot].as_mut().expect("pending write");
                let (offset, len) = (pending.request.offset, pending.request.len);
                let verifier = self.state.receive(ReceivedWrite { file: 0, offset, len });
                pending.verifier = Some(verifier);
                let reply = at + self.half_rtt();
                self.push(reply, Step::Reply { slot });
            }
            Step::CommitArrives { slot } => {
                let commit = self.state.begin_commit();
                let bytes = commit.bytes();
                self.pending[slot].as_mut().expect("pending commit").commit = Some(commit);
                let start = self.disk_free.max(at);
                let cost = Duration::from_nanos(
                    transfer_ns(bytes, self.p.disk_mb_per_s)
                        + (self.p.fsync_overhead_us * 1000.0) as u64,
                );
                self.disk_free = start + cost;
                self.stats.destage_bytes += bytes;
                self.push(self.disk_free, Step::CommitDurable { slot });
            }
            Step::CommitDurable { slot } => {
                let pending = self.pending[slot].as_mut().expect("pending commit");
                let commit = pending.commit.take().expect("a COMMIT in its fsync");
                pending.verifier = Some(self.state.finish_commit(commit).verifier);
                let reply = at + self.half_rtt();
                self.push(reply, Step::Reply { slot });
            }
            Step::Reply { .. } | Step::Restart | Step::CleanRestart => {
                unreachable!("handled in advance")
            }
        }
    }
}

impl Device for NfsServer {
    fn name(&self) -> &str {
        &self.name
    }

    fn params(&self) -> &DeviceParams {
        &self.params
    }

    fn submit(&mut self, now: Instant, request: DeviceRequest) {
        if self.outstanding == 0 {
            self.busy_since = now;
        }
        self.outstanding += 1;
        self.stats.queued_max = self.stats.queued_max.max(self.outstanding);
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.pending.push(None);
                self.pending.len() - 1
            }
        };
        self.pending[slot] =
            Some(Pending { request, submitted: now, verifier: None, commit: None });
        let half = self.half_rtt();
        match request.op {
            IoOp::Write => {
                // Back-to-back RPCs of at most wsize: the last one's arrival is what matters.
                let rpcs = request.len.div_ceil(self.p.wsize_bytes).max(1);
                self.stats.dispatches += rpcs;
                let sent = Self::send(&mut self.up_free, now, request.len, self.p.link_mb_per_s);
                self.push(sent + half, Step::WriteArrives { slot });
            }
            IoOp::Flush => {
                // A COMMIT is a small RPC, but it queues behind the writes in the same stream.
                let sent = Self::send(&mut self.up_free, now, 0, self.p.link_mb_per_s);
                self.push(sent + half, Step::CommitArrives { slot });
            }
            IoOp::Read => {
                self.stats.dispatches += request.len.div_ceil(self.p.wsize_bytes).max(1);
                let start = self.disk_free.max(now + half);
                self.disk_free =
                    start + Duration::from_nanos(transfer_ns(request.len, self.p.disk_mb_per_s));
                let sent = Self::send(
                    &mut self.down_free,
                    self.disk_free,
                    request.len,
                    self.p.link_mb_per_s,
                );
                self.push(sent + half, Step::Reply { slot });
            }
        }
    }

    fn next_event_time(&self) -> Option<Instant> {
        self.events.peek().map(|Reverse((at, _, _))| *at)
    }

    fn advance(&mut self, now: Instant, done: &mut Vec<Completion>) {
        while let Some(&Reverse((at, _, step))) = self.events.peek() {
            if at > now {
                break;
            }
            self.events.pop();
            match step {
                Step::Restart => self.restart(at),
                Step::CleanRestart => self.state.restart_keeping_data(),
                Step::Reply { slot } => {
                    let pending = self.pending[slot].take().expect("pending request");
                    self.free_slots.push(slot);
                    let request = pending.request;
                    match request.op {
                        IoOp::Read => {
                            self.stats.reads += 1;
                            self.stats.read_bytes += request.len;
                        }
                        IoOp::Write => {
                            self.stats.writes += 1;
                            self.stats.write_bytes += request.len;
                        }
                        IoOp::Flush => self.stats.flushes += 1,
                    }
                    done.push(Completion {
                        id: request.id,
                        op: request.op,
                        at,
                        latency: at.saturating_since(pending.submitted),
                        verifier: pending.verifier,
                    });
                    self.outstanding -= 1;
                    if self.outstanding == 0 {
                        self.stats.busy_time += at.saturating_since(self.busy_since);
                    }
                }
                other => self.on_step(at, other),
            }
        }
    }

    fn queued(&self) -> usize {
        self.outstanding
    }

    fn stats(&self) -> DeviceStats {
        self.stats
    }

    fn nfs_stats(&self) -> Option<NfsStats> {
        Some(NfsServer::nfs_stats(self))
    }
}
