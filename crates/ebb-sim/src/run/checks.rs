//! The checkers of a checked run ([`super::run_checked`], what the swarm runs): safety,
//! accounting, errseq and pause bounds, verified as the run goes.
//!
//! The device models keep no bytes, so the checker keeps a shadow of the data: every page the
//! application writes gets a stamp (a counter, one per write call), a write the engine submits
//! carries the stamps its pages had at submission, and the write's completion puts them where
//! the device model's rules say the data now is:
//!
//! * on the media (a device without a volatile cache, or a write larger than it): durable;
//! * in a volatile write cache: durable once a flush submitted after the completion completes
//!   (a power cut before that loses it; an ebb crash does not, the device destages it);
//! * in an NFS server's memory under a verifier: durable once a COMMIT submitted after the
//!   reply returns the same verifier (a different one means the server restarted and lost it).
//!
//! A failed write puts nothing anywhere. A successful fsync acknowledges the stamps its file
//! had when the fsync was issued; after a crash and at the end of the run, every acknowledged
//! stamp must be in the durable image (a newer stamp of the page counts, an older one or none
//! is a lost acknowledged write).
//!
//! The durability watermarks (`Engine::durable_ranges`, the runtime's `File::durable_len`) are
//! held to their word: a checked run's sync of a file (the cache flush after an fsync) takes
//! the engine's mark before it and reports `Event::FileSynced` after it, as the runtime does;
//! after each such sync, at a crash and at the end, every page the engine calls durable must
//! hold its last application write in the durable image (volatile caches excluded: the claim
//! is about a crash of the backend). And once every fault is over and the final sync has
//! drained the cache, every page the application wrote must be on its device (volatile caches
//! count): a page dropped without a successful write is lost data even if no fsync
//! acknowledged it.
//!
//! After every event the engine's counters must equal a recount of the page maps and the
//! frames must fit the memory budget (`Engine::check_accounting`). Errors follow errseq: an
//! fsync or close reports an error only if a write of its file failed since the handle last
//! heard of one, and a write that failed (other than with an outage error, reported only after
//! the backend's retry timeout) before an fsync or close is issued is reported by it or by the
//! handle's earlier report. With the `ioless` throttle no sleep exceeds `MAX_PAUSE` (plus one
//! tick of rounding). The first violation ends the run.

use std::collections::{BTreeMap, BTreeSet};

use ebb_core::{Duration, ErrorClass, HandleId, InodeId, Instant, IoError, RequestId};

use crate::device::WriteLanding;

/// Where a completed write put its pages, as the checker files it.
pub(super) enum Landing {
    /// Stable, on the media or in a volatile cache (the device model's rule).
    Stable(WriteLanding),
    /// UNSTABLE in a server's memory under this verifier.
    Unstable(u64),
}

/// Pages of one write, not yet durable.
/// A run of a write: its first page and the stamps of its pages.
type RunStamps = (u64, Vec<u64>);

struct Landed {
    backend: usize,
    /// Order of landing (flushes and COMMITs cover what landed before their submission).
    seq: u64,
    verifier: Option<u64>,
    inode: InodeId,
    first: u64,
    stamps: Vec<u64>,
}

/// An fsync or close between issue and answer.
struct Pending {
    inode: InodeId,
    backend: usize,
    handle: HandleId,
    stamps: Vec<u64>,
    /// Non-outage failures of the file when it was issued.
    failures_at_issue: u64,
    fsync: bool,
}

/// Failed writes of one file delivered to the engine.
#[derive(Clone, Copy, Default)]
struct Failures {
    /// All failures.
    all: u64,
    /// Failures of a class reported without a timeout (not [`ErrorClass::Outage`]).
    reported: u64,
}

/// A driver-side bug the swarm's own tests plant to show the checkers catch it (never set
/// outside them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedBug {
    /// A failed write is reported to the engine as a success (an error swallowed on one
    /// completion path): the engine frees pages the device never stored.
    SwallowWriteError,
    /// The first write completion of the run never reaches the engine (a lost wake-up): its
    /// pages stay under writeback forever.
    LoseCompletion,
    /// Flushes and COMMITs complete without making anything durable (a cache flush skipped).
    SkipFlush,
    /// A bug planted in the engine itself (needs ebb-core's `planted-bugs` feature, which the
    /// swarm's tests enable; a run refuses it otherwise).
    Core(ebb_core::CoreBug),
}

/// What the checkers found and saw.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// The first violation: its checker (`accounting`, `durability`, `durable_len`, `lost`,
    /// `errseq`, `pause`) and
    /// what it found, with the virtual time.
    pub violation: Option<(&'static str, String)>,
    /// Events checked.
    pub events: u64,
    /// fsyncs acknowledged as successful, and pages they acknowledged.
    pub fsyncs_ok: u64,
    /// Pages acknowledged by successful fsyncs (counted once per fsync).
    pub acked_pages: u64,
    /// fsyncs, closes and the final sync issued but never answered at the end of the run.
    pub unanswered: u64,
    /// Whether the run ended at a crash (`RunSpec::crash`).
    pub crashed: bool,
    /// Restarts of ebb after a crash (`Crash::restart`).
    pub restarts: u64,
    /// Whether the sync issued once every writer had finished returned.
    pub synced: bool,
}

pub(super) struct Checker {
    written: BTreeMap<InodeId, Vec<u64>>,
    stamp: u64,
    inflight: BTreeMap<u64, (InodeId, Vec<RunStamps>)>,
    /// The file and backend of each write until its completion reaches the engine.
    io_inodes: BTreeMap<u64, (InodeId, usize)>,
    /// Per backend: outage-class failures (an outage past the retry timeout reports EIO to
    /// every file of the backend with unwritten data, failed or not).
    outages: BTreeMap<usize, u64>,
    durable: BTreeMap<InodeId, Vec<u64>>,
    landed: Vec<Landed>,
    seq: u64,
    flushes: BTreeMap<u64, (usize, u64)>,
    pending: BTreeMap<RequestId, Pending>,
    syncs: BTreeSet<RequestId>,
    acked: BTreeMap<InodeId, Vec<u64>>,
    failures: BTreeMap<InodeId, Failures>,
    /// Per handle: the file's failures and its backend's outage failures when the handle
    /// last heard of an error.
    heard: BTreeMap<HandleId, (Failures, u64)>,
    max_sleep: Option<Duration>,
    /// Reads of the engine that failed, delivered so far.
    pub(super) read_failures: u64,
    /// Read calls between issue and answer, with `read_failures` at issue.
    reads: BTreeMap<RequestId, u64>,
    pub(super) planted: Option<PlantedBug>,
    pub(super) report: CheckReport,
}

/// The first page of `want` whose stamp `image` lacks: (inode, page, wanted, found).
fn first_missing(
    want: &BTreeMap<InodeId, Vec<u64>>,
    image: &BTreeMap<InodeId, Vec<u64>>,
) -> Option<(InodeId, usize, u64, u64)> {
    want.iter().find_map(|(inode, stamps)| {
        let have = image.get(inode).map_or(&[][..], |v| &v[..]);
        stamps.iter().enumerate().find_map(|(page, &w)| {
            let got = have.get(page).copied().unwrap_or(0);
            (w > got).then_some((*inode, page, w, got))
        })
    })
}

fn write_name(stamp: u64) -> String {
    if stamp == 0 { "nothing".to_owned() } else { format!("write {stamp}") }
}

fn set_stamps(v: &mut Vec<u64>, first: u64, stamps: &[u64]) {
    let end = first as usize + stamps.len();
    if v.len() < end {
        v.resize(end, 0);
    }
    v[first as usize..end].copy_from_slice(stamps);
}

impl Checker {
    /// `max_sleep`: the longest sleep a throttle verdict may ask for, if bounded.
    pub(super) fn new(max_sleep: Option<Duration>, planted: Option<PlantedBug>) -> Checker {
        Checker {
            written: BTreeMap::new(),
            stamp: 0,
            inflight: BTreeMap::new(),
            io_inodes: BTreeMap::new(),
            outages: BTreeMap::new(),
            durable: BTreeMap::new(),
            landed: Vec::new(),
            seq: 0,
            flushes: BTreeMap::new(),
            pending: BTreeMap::new(),
            syncs: BTreeSet::new(),
            acked: BTreeMap::new(),
            failures: BTreeMap::new(),
            heard: BTreeMap::new(),
            max_sleep,
            read_failures: 0,
            reads: BTreeMap::new(),
            planted,
            report: CheckReport::default(),
        }
    }

    pub(super) fn fail(&mut self, now: Instant, checker: &'static str, what: String) {
        if self.report.violation.is_none() {
            self.report.violation = Some((checker, format!("at {now}: {what}")));
        }
    }

    pub(super) fn failed(&self) -> bool {
        self.report.violation.is_some()
    }

    /// The application wrote pages `[first, first + count)` of `inode`.
    pub(super) fn wrote(&mut self, inode: InodeId, first: u64, count: u64) {
        if count == 0 {
            return;
        }
        self.stamp += 1;
        let v = self.written.entry(inode).or_default();
        let end = (first + count) as usize;
        if v.len() < end {
            v.resize(end, 0);
        }
        v[first as usize..end].fill(self.stamp);
    }

    /// The file was truncated at page `first` (0: unlinked): what lay past it is gone, and no
    /// longer owed to the application.
    pub(super) fn truncated(&mut self, inode: InodeId, first: u64) {
        for map in [&mut self.written, &mut self.acked] {
            if let Some(v) = map.get_mut(&inode) {
                v.truncate(first as usize);
            }
        }
    }

    fn stamps_of(&self, inode: InodeId, first: u64, pages: u64) -> Vec<u64> {
        let v = self.written.get(&inode).map_or(&[][..], |v| &v[..]);
        (first..first + pages).map(|p| v.get(p as usize).copied().unwrap_or(0)).collect()
    }

    /// The engine asked for a write of `runs` (each `[first, first + pages)`), landing
    /// together.
    pub(super) fn write_submitted(
        &mut self,
        io: u64,
        backend: usize,
        inode: InodeId,
        runs: &[ebb_core::Run],
    ) {
        let stamps =
            runs.iter().map(|r| (r.first, self.stamps_of(inode, r.first, r.count))).collect();
        self.inflight.insert(io, (inode, stamps));
        self.io_inodes.insert(io, (inode, backend));
    }

    /// Pages of write `io`, for the device's landing rule.
    pub(super) fn write_bytes(&self, io: u64) -> u64 {
        self.inflight.get(&io).map_or(0, |w| {
            w.1.iter().map(|(_, stamps)| stamps.len() as u64).sum::<u64>() * ebb_core::PAGE_SIZE
        })
    }

    /// Write `io` completed on `backend` (`None`: it failed).
    pub(super) fn write_completed(&mut self, io: u64, backend: usize, landing: Option<Landing>) {
        let Some((inode, runs)) = self.inflight.remove(&io) else { return };
        let verifier = match landing {
            None => return,
            Some(Landing::Stable(WriteLanding::Media)) => {
                for (first, stamps) in &runs {
                    set_stamps(self.durable.entry(inode).or_default(), *first, stamps);
                }
                return;
            }
            Some(Landing::Stable(_)) => None,
            Some(Landing::Unstable(verifier)) => Some(verifier),
        };
        self.seq += 1;
        for (first, stamps) in runs {
            self.landed.push(Landed { backend, seq: self.seq, verifier, inode, first, stamps });
        }
    }

    /// A flush (COMMIT on a two-phase backend) was submitted on `backend`.
    pub(super) fn flush_submitted(&mut self, io: u64, backend: usize) {
        self.flushes.insert(io, (backend, self.seq));
    }

    /// Flush `io` completed; a COMMIT returns the server's verifier.
    pub(super) fn flush_completed(&mut self, io: u64, verifier: Option<u64>) {
        let Some((backend, upto)) = self.flushes.remove(&io) else { return };
        if self.planted == Some(PlantedBug::SkipFlush) {
            return;
        }
        let (covered, rest): (Vec<Landed>, Vec<Landed>) = std::mem::take(&mut self.landed)
            .into_iter()
            .partition(|l| l.backend == backend && l.seq <= upto);
        self.landed = rest;
        for l in covered {
            // A verifier that changed means the server restarted: the write is lost (the
            // engine sees the change and writes the pages again).
            if l.verifier.is_none() || l.verifier == verifier {
                set_stamps(self.durable.entry(l.inode).or_default(), l.first, &l.stamps);
            }
        }
    }

    /// The completion of write `io` reaches the engine (`Some`: the write failed).
    pub(super) fn delivered(&mut self, io: u64, error: Option<IoError>) {
        let Some((inode, backend)) = self.io_inodes.remove(&io) else { return };
        if let Some(e) = error {
            let f = self.failures.entry(inode).or_default();
            f.all += 1;
            if e.class() != ErrorClass::Outage {
                f.reported += 1;
            } else {
                *self.outages.entry(backend).or_default() += 1;
            }
        }
    }

    /// An fsync (`fsync`) or close of `handle` on `inode` was issued as `request`.
    pub(super) fn issued(
        &mut self,
        request: RequestId,
        (inode, backend): (InodeId, usize),
        handle: HandleId,
        fsync: bool,
    ) {
        let stamps = self.written.get(&inode).cloned().unwrap_or_default();
        let failures_at_issue = self.failures.get(&inode).map_or(0, |f| f.reported);
        let p = Pending { inode, backend, handle, stamps, failures_at_issue, fsync };
        self.pending.insert(request, p);
    }

    /// The answer to an fsync or close: errseq, and a successful fsync's acknowledgement.
    pub(super) fn answered(
        &mut self,
        now: Instant,
        request: RequestId,
        result: Result<(), IoError>,
    ) {
        let Some(p) = self.pending.remove(&request) else { return };
        let what = if p.fsync { "fsync" } else { "close" };
        let f = self.failures.get(&p.inode).copied().unwrap_or_default();
        let (heard, heard_outages) = self.heard.get(&p.handle).copied().unwrap_or_default();
        let outages = self.outages.get(&p.backend).copied().unwrap_or(0);
        match result {
            Err(e) => {
                if f.all <= heard.all && outages <= heard_outages {
                    self.fail(
                        now,
                        "errseq",
                        format!(
                            "{what} of inode {} reported errno {} with no write of it failed \
                             and no outage of its backend since handle {} last heard of one \
                             (reported twice or invented)",
                            p.inode, e.errno, p.handle
                        ),
                    );
                }
                self.heard.insert(p.handle, (f, outages));
            }
            Ok(()) => {
                if p.failures_at_issue > heard.reported {
                    self.fail(
                        now,
                        "errseq",
                        format!(
                            "{what} of inode {} returned success though {} write(s) of it failed \
                             before it was issued and handle {} never heard of them",
                            p.inode,
                            p.failures_at_issue - heard.reported,
                            p.handle
                        ),
                    );
                }
                if p.fsync {
                    self.report.fsyncs_ok += 1;
                    self.report.acked_pages += p.stamps.iter().filter(|&&s| s > 0).count() as u64;
                    let acked = self.acked.entry(p.inode).or_default();
                    if acked.len() < p.stamps.len() {
                        acked.resize(p.stamps.len(), 0);
                    }
                    for (a, s) in acked.iter_mut().zip(&p.stamps) {
                        *a = (*a).max(*s);
                    }
                }
            }
        }
    }

    /// A read call was issued as `request`.
    pub(super) fn read_issued(&mut self, request: RequestId) {
        self.reads.insert(request, self.read_failures);
    }

    /// A read call was answered: an error must come from a read that failed since it was
    /// issued (no invented error).
    pub(super) fn read_answered(
        &mut self,
        now: Instant,
        request: RequestId,
        result: Result<(), IoError>,
    ) {
        let Some(at_issue) = self.reads.remove(&request) else { return };
        if let Err(e) = result
            && self.read_failures == at_issue
        {
            self.fail(
                now,
                "errseq",
                format!(
                    "read {} failed with errno {} though no read of the backend failed since \
                     it was issued",
                    request.0, e.errno
                ),
            );
        }
    }

    /// The final sync was issued.
    pub(super) fn sync_issued(&mut self, request: RequestId) {
        self.syncs.insert(request);
    }

    /// A sync returned.
    pub(super) fn sync_answered(&mut self, request: RequestId) {
        if self.syncs.remove(&request) {
            self.report.synced = true;
        }
    }

    /// A throttle verdict asked writer `writer` to sleep until `until`.
    pub(super) fn slept(&mut self, now: Instant, until: Instant, writer: usize) {
        if let Some(max) = self.max_sleep
            && until.saturating_since(now) > max
        {
            self.fail(
                now,
                "pause",
                format!(
                    "writer {writer} paused {} ms, over the maximum pause {} ms",
                    until.saturating_since(now).as_millis_f64(),
                    max.as_millis_f64()
                ),
            );
        }
    }

    /// The devices' image: durable, plus with `cached` what sits in volatile write caches
    /// (an ebb crash: the devices keep running).
    fn image(&self, cached: bool) -> BTreeMap<InodeId, Vec<u64>> {
        let mut image = self.durable.clone();
        if cached {
            for l in self.landed.iter().filter(|l| l.verifier.is_none()) {
                set_stamps(image.entry(l.inode).or_default(), l.first, &l.stamps);
            }
        }
        image
    }

    /// Checks every acknowledged stamp against the durable image; with `cached`, what sits in
    /// volatile write caches counts (an ebb crash: the devices keep running).
    pub(super) fn check_durable(&mut self, now: Instant, cached: bool, when: &str) {
        let image = self.image(cached);
        if let Some((inode, page, want, got)) = first_missing(&self.acked, &image) {
            let what = format!(
                "{when}: page {page} of inode {inode} was acknowledged by fsync (write {want}) \
                 but the durable image has {}",
                write_name(got)
            );
            self.fail(now, "durability", what);
        }
    }

    /// Once the cache has drained with every fault over: nothing the application wrote is
    /// missing from the devices (volatile caches count). A page the engine dropped without a
    /// successful write fails here even if no fsync acknowledged it.
    pub(super) fn check_nothing_lost(&mut self, now: Instant) {
        let image = self.image(true);
        if let Some((inode, page, want, got)) = first_missing(&self.written, &image) {
            let what = format!(
                "after the final sync, every fault over: page {page} of inode {inode} (write \
                 {want}) is not on its device, which has {}",
                write_name(got)
            );
            self.fail(now, "lost", what);
        }
    }

    /// Files the application wrote and their length in pages: `only`, or all of them.
    pub(super) fn written_files(&self, only: Option<InodeId>) -> Vec<(InodeId, u64)> {
        self.written
            .iter()
            .filter(|(inode, _)| only.is_none_or(|o| o == **inode))
            .map(|(inode, v)| (*inode, v.len() as u64))
            .collect()
    }

    /// The engine claims the byte `ranges` of `inode` durable (its durability watermarks):
    /// each page in them must hold its last application write in the durable image (volatile
    /// caches excluded).
    pub(super) fn check_claim(
        &mut self,
        now: Instant,
        inode: InodeId,
        ranges: &[std::ops::Range<u64>],
        when: &str,
    ) {
        let written = self.written.get(&inode).map_or(&[][..], |v| &v[..]);
        let have = self.durable.get(&inode).map_or(&[][..], |v| &v[..]);
        let page = ebb_core::PAGE_SIZE;
        let lost = ranges.iter().flat_map(|r| r.start / page..r.end.div_ceil(page)).find(|&p| {
            let want = written.get(p as usize).copied().unwrap_or(0);
            want > have.get(p as usize).copied().unwrap_or(0)
        });
        if let Some(p) = lost {
            let want = written[p as usize];
            let got = have.get(p as usize).copied().unwrap_or(0);
            let what = format!(
                "{when}: the engine calls page {p} of inode {inode} durable (its durable \
                 ranges {ranges:?}) but its last write {want} is not in the durable image, \
                 which has {}",
                write_name(got)
            );
            self.fail(now, "durable_len", what);
        }
    }

    /// ebb restarted after a crash: what it was asked is never answered, the errors it saw are
    /// gone with it, and the application's files are what the devices kept. A power cut lost
    /// the volatile write caches; after ebb alone crashed the devices destage them. (An NFS
    /// server keeps what it received either way; a later COMMIT may make it durable.)
    pub(super) fn restarted(&mut self, power_cut: bool) {
        let (cached, unstable): (Vec<Landed>, Vec<Landed>) =
            std::mem::take(&mut self.landed).into_iter().partition(|l| l.verifier.is_none());
        self.landed = unstable;
        if !power_cut {
            for l in cached {
                set_stamps(self.durable.entry(l.inode).or_default(), l.first, &l.stamps);
            }
        }
        self.written = self.durable.clone();
        self.inflight.clear();
        self.io_inodes.clear();
        self.outages.clear();
        self.flushes.clear();
        self.pending.clear();
        self.syncs.clear();
        self.reads.clear();
        self.failures.clear();
        self.heard.clear();
        self.report.restarts += 1;
    }

    /// fsyncs, closes, reads and syncs never answered.
    pub(super) fn finish(&mut self) -> CheckReport {
        self.report.unanswered = (self.pending.len() + self.syncs.len() + self.reads.len()) as u64;
        std::mem::take(&mut self.report)
    }
}
