//! The engine's actions carried out on the device models, and the devices' completions sent
//! back to the engine as events (with the faults that hold at the time).

use ebb_core::{
    Action, BackendId, Duration, Event, InodeId, IoClass, IoError, IoId, RequestId, Stability,
};

use super::checks::Landing;
use super::readers::DIRECT_READ_BIT;
use super::writers::WriterState;
use super::{Ev, PAGE, PlantedBug, Sim, SimError, faults};
use crate::device::{DeviceRequest, IoOp};

/// Identities of the cache flushes that follow an fsync (`Sim::driver_flush`).
const DRIVER_FLUSH_BIT: u64 = 1 << 61;
/// Identities of the backend syncs the engine asks for (`Action::SyncFile`, `Sim::sync_file`).
const SYNC_FILE_BIT: u64 = 1 << 60;

pub(super) enum IoPending {
    Write(IoId),
    Read(IoId),
    Commit(IoId),
}

impl Sim<'_> {
    /// Carries out the engine's actions and keeps the timers scheduled.
    pub(super) fn drain(&mut self) -> Result<(), SimError> {
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::Write { io, backend, inode, runs, class, .. } => {
                    let id = self.dev_id(io);
                    let sync = class == IoClass::Sync;
                    // A granule's scattered runs are one request to the device model, of
                    // their pages together, placed at the first.
                    let first_page = runs.first().map_or(0, |run| run.first);
                    let pages = runs.iter().map(|run| run.count).sum();
                    self.submit(backend, id, IoOp::Write, inode, first_page, pages, sync);
                    self.ios.insert(id, IoPending::Write(io));
                    self.device_pages += pages;
                    if let Some(check) = self.check.as_deref_mut() {
                        check.write_submitted(id, backend.index(), inode, &runs);
                    }
                }
                Action::Read { io, backend, inode, first_page, pages } => {
                    let id = self.dev_id(io);
                    self.submit(backend, id, IoOp::Read, inode, first_page, pages, true);
                    self.ios.insert(id, IoPending::Read(io));
                    self.read_pages += pages;
                }
                Action::Commit { io, backend, inode, .. } => {
                    // A local disk makes written data durable with a cache flush; to the
                    // nfs-server model a flush is a COMMIT.
                    let id = self.dev_id(io);
                    self.submit(backend, id, IoOp::Flush, inode, 0, 0, true);
                    self.ios.insert(id, IoPending::Commit(io));
                    if let Some(check) = self.check.as_deref_mut() {
                        check.flush_submitted(id, backend.index());
                    }
                }
                Action::SyncFile { backend, inode } => self.sync_file(backend, inode),
                Action::Resume { writer } => {
                    let i = writer.0 as usize;
                    self.queue.push(self.now, Ev::Resume(i));
                }
                Action::FsyncDone { request, result } => self.fsync_done(request, result),
                Action::ReadDone { request, result } => self.read_call_done(request, result),
                Action::CloseDone { request, result } => {
                    if let Some(check) = self.check.as_deref_mut() {
                        check.answered(self.now, request, result);
                    }
                }
                Action::SyncDone { request, .. } => {
                    if let Some(check) = self.check.as_deref_mut() {
                        check.sync_answered(request);
                    }
                }
                Action::Forget { inode } => self.maps.remove(inode),
                Action::ReturnReserves => {
                    let writers = self.writers.iter_mut().map(|sw| &mut sw.w);
                    self.engine.return_reserves(self.now, writers, &mut self.maps);
                }
            }
        }
        if let Some(t) = self.engine.poll_timeout()
            && self.timer_at.is_none_or(|cur| t < cur)
        {
            let t = t.max(self.now);
            self.timer_at = Some(t);
            self.queue.push(t, Ev::Timer);
        }
        if self.trace.is_some() {
            self.write_trace()?;
        }
        Ok(())
    }

    /// An fsync was answered: the writer that waited for it finishes (after the driver's own
    /// flush of the device cache, if it needs one first).
    fn fsync_done(&mut self, request: RequestId, result: Result<(), IoError>) {
        if result.is_ok() && self.driver_flush(request) {
            return;
        }
        if let Some(check) = self.check.as_deref_mut() {
            check.answered(self.now, request, result);
        }
        if let Err(e) = result {
            self.fsync_errors += 1;
            self.fsync_errno = e.errno;
        }
        if let Some(i) = self.writers.iter().position(|w| w.state == WriterState::Fsyncing(request))
        {
            self.finish_writer(i);
        }
    }

    /// A read call was answered: its latency is recorded, and the copying writer that waited
    /// for it writes on, or stops at an error.
    fn read_call_done(&mut self, request: RequestId, result: Result<(), IoError>) {
        if let Some((_, started)) = self.read_started.remove(&request) {
            // Each read call's latency, cache hits included (read-to-pipe-async).
            let ns = self.now.saturating_since(started).as_nanos().max(1_000);
            self.read_latency.record(ns);
        }
        if let Some(check) = self.check.as_deref_mut() {
            check.read_answered(self.now, request, result);
        }
        let Some(i) = self.writers.iter().position(|w| w.state == WriterState::Reading(request))
        else {
            return;
        };
        if result.is_err() {
            // cp stops at a read error ("cp: error reading"), closing its copy.
            self.finish_writer(i);
            return;
        }
        self.writers[i].state = WriterState::Running;
        self.queue.push(self.now, Ev::Step(i));
    }

    /// The device request id of the engine's `io`: an engine restarted after a crash numbers
    /// its IOs from 1 again, so each engine's ids carry its epoch (0 for the first).
    pub(super) fn dev_id(&self, io: IoId) -> u64 {
        io.0 | self.io_epoch
    }

    #[expect(clippy::too_many_arguments, reason = "one device request")]
    pub(super) fn submit(
        &mut self,
        backend: BackendId,
        id: u64,
        op: IoOp,
        inode: InodeId,
        first_page: u64,
        pages: u64,
        sync: bool,
    ) {
        let b = backend.index();
        let offset = self.base.get(&inode).copied().unwrap_or(0) + first_page * PAGE;
        self.devices[b].submit(self.now, DeviceRequest { id, op, offset, len: pages * PAGE, sync });
        self.reschedule(b);
    }

    pub(super) fn reschedule(&mut self, b: usize) {
        if let Some(t) = self.devices[b].next_event_time()
            && self.scheduled[b].is_none_or(|cur| t < cur)
        {
            self.scheduled[b] = Some(t);
            self.queue.push(t, Ev::Device(b));
        }
    }

    pub(super) fn device_events(&mut self, b: usize) {
        let mut done = Vec::new();
        self.devices[b].advance(self.now, &mut done);
        for c in done {
            self.device_waits[b].0 += 1;
            self.device_waits[b].1 += c.latency;
            if c.id & DIRECT_READ_BIT != 0 {
                self.direct_read_done(c.id, c.latency);
                continue;
            }
            if c.id & DRIVER_FLUSH_BIT != 0 {
                self.driver_flush_done(c.id);
                continue;
            }
            if c.id & SYNC_FILE_BIT != 0 {
                self.sync_file_done(c.id, c.verifier);
                continue;
            }
            // A two-phase backend (NFS) reports the verifier; a local device reports none.
            let event = match self.ios.remove(&c.id) {
                Some(IoPending::Write(io)) => {
                    let stability = match c.verifier {
                        Some(verifier) => Stability::Unstable { verifier },
                        None => Stability::Stable,
                    };
                    let t = self.now.saturating_since(ebb_core::Instant::ZERO);
                    let result = match faults::write_errno(&self.spec.faults, b, t) {
                        Some(errno) => Err(IoError { errno }),
                        None => Ok(stability),
                    };
                    Event::WriteDone { io, result: self.check_write(b, c.id, result) }
                }
                Some(IoPending::Read(io)) => {
                    let t = self.now.saturating_since(ebb_core::Instant::ZERO);
                    let result = match faults::read_errno(&self.spec.faults, b, t) {
                        Some(errno) => Err(IoError { errno }),
                        None => Ok(()),
                    };
                    Event::ReadDone { io, result }
                }
                Some(IoPending::Commit(io)) => {
                    if let Some(check) = self.check.as_deref_mut() {
                        check.flush_completed(c.id, c.verifier);
                    }
                    Event::CommitDone { io, result: Ok(c.verifier.unwrap_or(0)) }
                }
                None => continue,
            };
            let t = self.now.saturating_since(ebb_core::Instant::ZERO);
            let spike = faults::completion_delay(&self.spec.faults, b, t);
            if spike > Duration::ZERO {
                self.next_delayed += 1;
                self.delayed.insert(self.next_delayed, event);
                self.queue.push(self.now + spike, Ev::Delayed(self.next_delayed));
                continue;
            }
            self.deliver(event);
        }
        self.reschedule(b);
    }

    /// In a checked run, an fsync the engine answered on a local device is followed by a
    /// cache flush of the device, as the runtime's `File::fsync` follows the engine's fsync
    /// with the backend's `sync` (fdatasync); the fsync returns when the flush completes.
    /// (Unchecked runs, the published experiments, do not flush: their figures predate this.)
    /// Returns true if a flush was started.
    fn driver_flush(&mut self, request: ebb_core::RequestId) -> bool {
        let Some(i) = self.writers.iter().position(|w| w.state == WriterState::Fsyncing(request))
        else {
            return false;
        };
        let b = self.writers[i].backend;
        let Some(check) = self.check.as_deref_mut() else { return false };
        if matches!(self.devices[b].params(), crate::device::DeviceParams::Nfs(_)) {
            return false;
        }
        let id = DRIVER_FLUSH_BIT | request.0;
        check.flush_submitted(id, b);
        let inode = self.writers[i].inode;
        // As the runtime's `sync_backend_file`: a mark before the sync, reported after it.
        let mark = self.engine.durable_mark(inode);
        self.file_syncs.insert(id, (inode, mark));
        self.submit(ebb_core::BackendId(b as u32), id, IoOp::Flush, inode, 0, 0, true);
        true
    }

    fn driver_flush_done(&mut self, id: u64) {
        let request = ebb_core::RequestId(id & !DRIVER_FLUSH_BIT);
        if let Some(check) = self.check.as_deref_mut() {
            check.flush_completed(id, None);
            check.answered(self.now, request, Ok(()));
        }
        if let Some((inode, mark)) = self.file_syncs.remove(&id) {
            self.engine.handle(self.now, Event::FileSynced { inode, mark }, &mut self.maps);
            self.check_durable_claims(Some(inode), "after a sync of the file");
        }
        if let Some(i) = self.writers.iter().position(|w| w.state == WriterState::Fsyncing(request))
        {
            self.finish_writer(i);
        }
    }

    /// The engine owes `inode` a commit ([`Action::SyncFile`]: its close failed on a
    /// flush-on-close backend, and it is written back now): a flush of the device, with the
    /// engine's mark before it and [`Event::FileSynced`] after it, as the runtime's
    /// `sync_backend_file`. The device models never fail a flush, so it is never
    /// `Event::FileSyncFailed`.
    fn sync_file(&mut self, backend: BackendId, inode: InodeId) {
        self.owed_syncs += 1;
        let id = SYNC_FILE_BIT | self.io_epoch | inode.0;
        if let Some(check) = self.check.as_deref_mut() {
            check.flush_submitted(id, backend.index());
        }
        let mark = self.engine.durable_mark(inode);
        self.file_syncs.insert(id, (inode, mark));
        self.submit(backend, id, IoOp::Flush, inode, 0, 0, true);
    }

    fn sync_file_done(&mut self, id: u64, verifier: Option<u64>) {
        if let Some(check) = self.check.as_deref_mut() {
            check.flush_completed(id, verifier);
        }
        if let Some((inode, mark)) = self.file_syncs.remove(&id) {
            self.engine.handle(self.now, Event::FileSynced { inode, mark }, &mut self.maps);
            self.check_durable_claims(Some(inode), "after a sync the engine asked for");
        }
    }

    /// Files where a completed write's pages landed (checked runs), and plants a driver bug
    /// if asked: returns the result the engine is told.
    fn check_write(
        &mut self,
        b: usize,
        io: u64,
        result: Result<Stability, IoError>,
    ) -> Result<Stability, IoError> {
        let Some(check) = self.check.as_deref_mut() else { return result };
        let landing = match result {
            Ok(Stability::Stable) => {
                let bytes = check.write_bytes(io);
                Some(Landing::Stable(self.devices[b].params().write_landing(bytes.max(1))))
            }
            Ok(Stability::Unstable { verifier }) => Some(Landing::Unstable(verifier)),
            Err(_) => None,
        };
        check.write_completed(io, b, landing);
        match (check.planted, result) {
            (Some(PlantedBug::SwallowWriteError), Err(_)) => Ok(Stability::Stable),
            _ => result,
        }
    }

    /// Hands a completion to the engine (the checkers see failed writes reach it).
    pub(super) fn deliver(&mut self, event: Event) {
        let epoch = self.io_epoch;
        if let (Some(check), Event::ReadDone { result: Err(_), .. }) =
            (self.check.as_deref_mut(), &event)
        {
            check.read_failures += 1;
        }
        if let (Some(check), Event::WriteDone { io, result }) = (self.check.as_deref_mut(), &event)
        {
            if check.planted == Some(PlantedBug::LoseCompletion) {
                check.planted = None;
                return;
            }
            check.delivered(io.0 | epoch, result.err());
        }
        self.engine.handle(self.now, event, &mut self.maps);
    }
}
