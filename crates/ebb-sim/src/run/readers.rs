//! O_DIRECT random readers (fio `rw=randread direct=1`): reads that bypass the cache, go
//! straight to the device, and report their latency to the engine (wbt's read signal).

use ebb_core::{BackendId, Duration, Event, Instant};

use super::writers::WriterState;
use super::{Ev, PAGE, Sim};
use crate::device::{DeviceRequest, IoOp};

/// An O_DIRECT random reader.
pub(super) struct Reader {
    pub(super) backend: usize,
    pub(super) base: u64,
    pub(super) pages: u64,
    pub(super) bs_pages: u64,
    pub(super) start: Duration,
    pub(super) issued: Option<(u64, Instant)>,
    pub(super) reads: u64,
}

/// Identities of direct reads, apart from the engine's IO identities.
pub(super) const DIRECT_READ_BIT: u64 = 1 << 62;

impl Sim<'_> {
    /// Issues the next O_DIRECT read of reader `r`, unless every writer is done.
    pub(super) fn reader_step(&mut self, r: usize) {
        if self.writers.iter().all(|w| w.state == WriterState::Done) {
            return;
        }
        let reader = &self.readers[r];
        let slots = (reader.pages / reader.bs_pages).max(1);
        let page = self.rng.below(slots) * reader.bs_pages;
        let (b, offset, len) = (reader.backend, reader.base + page * PAGE, reader.bs_pages * PAGE);
        let id = DIRECT_READ_BIT | ((r as u64) << 40) | (reader.reads & ((1 << 40) - 1));
        self.readers[r].issued = Some((id, self.now));
        self.readers[r].reads += 1;
        self.engine.handle(
            self.now,
            Event::DirectReadStart { backend: BackendId(b as u32), id },
            &mut self.maps,
        );
        self.devices[b]
            .submit(self.now, DeviceRequest { id, op: IoOp::Read, offset, len, sync: true });
        self.reschedule(b);
    }

    pub(super) fn direct_read_done(&mut self, id: u64, latency: Duration) {
        let r = ((id & !DIRECT_READ_BIT) >> 40) as usize;
        let b = self.readers[r].backend;
        self.readers[r].issued = None;
        self.read_latency.record(latency.as_nanos().max(1));
        self.read_pages += self.readers[r].bs_pages;
        self.engine.handle(
            self.now,
            Event::DirectRead { backend: BackendId(b as u32), id, latency },
            &mut self.maps,
        );
        self.queue.push(self.now, Ev::ReaderStep(r));
    }
}
