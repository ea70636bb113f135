//! The engine's actions carried out on the device models, and the devices' completions sent
//! back to the engine as events (with the faults that hold at the time).

use ebb_core::{Action, BackendId, Duration, Event, InodeId, IoClass, IoError, IoId, Stability};

use super::readers::DIRECT_READ_BIT;
use super::writers::WriterState;
use super::{Ev, PAGE, Sim, SimError, faults};
use crate::device::{DeviceRequest, IoOp};

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
                Action::Write { io, backend, inode, first_page, pages, class, .. } => {
                    self.submit(
                        backend,
                        io.0,
                        IoOp::Write,
                        inode,
                        first_page,
                        pages,
                        class == IoClass::Sync,
                    );
                    self.ios.insert(io.0, IoPending::Write(io));
                    self.device_pages += pages;
                }
                Action::Read { io, backend, inode, first_page, pages } => {
                    self.submit(backend, io.0, IoOp::Read, inode, first_page, pages, true);
                    self.ios.insert(io.0, IoPending::Read(io));
                    self.read_pages += pages;
                }
                Action::Commit { io, backend, inode, .. } => {
                    // A local disk makes written data durable with a cache flush; to the
                    // nfs-server model a flush is a COMMIT.
                    self.submit(backend, io.0, IoOp::Flush, inode, 0, 0, true);
                    self.ios.insert(io.0, IoPending::Commit(io));
                }
                Action::Resume { writer } => {
                    let i = writer.0 as usize;
                    self.queue.push(self.now, Ev::Resume(i));
                }
                Action::FsyncDone { request, result } => {
                    if let Err(e) = result {
                        self.fsync_errors += 1;
                        self.fsync_errno = e.errno;
                    }
                    if let Some(i) =
                        self.writers.iter().position(|w| w.state == WriterState::Fsyncing(request))
                    {
                        self.finish_writer(i);
                    }
                }
                Action::ReadDone { request, .. } => {
                    if let Some((_, started)) = self.read_started.remove(&request) {
                        // Each read call's latency, cache hits included (read-to-pipe-async).
                        let ns = self.now.saturating_since(started).as_nanos().max(1_000);
                        self.read_latency.record(ns);
                    }
                    if let Some(i) =
                        self.writers.iter().position(|w| w.state == WriterState::Reading(request))
                    {
                        self.writers[i].state = WriterState::Running;
                        self.queue.push(self.now, Ev::Step(i));
                    }
                }
                Action::SyncDone { .. } | Action::CloseDone { .. } => {}
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
                    Event::WriteDone { io, result }
                }
                Some(IoPending::Read(io)) => Event::ReadDone { io, result: Ok(()) },
                Some(IoPending::Commit(io)) => {
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
            self.engine.handle(self.now, event, &mut self.maps);
        }
        self.reschedule(b);
    }
}
