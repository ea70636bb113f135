//! The software queue in front of a device: an mq-deadline-like elevator, or `none` (FIFO).
//!
//! Requests that do not fit the hardware queue wait here, and what the elevator does while
//! they wait decides much of what a read sees under heavy writeback, so the model follows
//! the kernel's `block/mq-deadline.c` in the parts that matter for latency and throughput:
//!
//! - Two directions (reads, writes), each kept sorted by offset and in a FIFO of expiry
//!   times (`read_expire_ms`, `write_expire_ms`).
//! - Back and front merging of a new request with a queued one it touches, in the same
//!   direction, up to `max_request_bytes` (the kernel's `max_sectors_kb`). A request that
//!   bridges two queued ones merges with one of them only; the kernel's follow-up
//!   request-to-request merge is not modelled.
//! - Batches: once a direction is chosen, up to `fifo_batch` requests are dispatched in
//!   ascending offset order from the last dispatched position before the choice is made again.
//! - Reads are preferred, but after `writes_starved` read batches chosen while writes waited,
//!   a write batch goes next.
//! - A batch starts at the oldest request of its direction if that one has expired (or if
//!   nothing lies ahead of the last position), otherwise at the next request by offset.
//!
//! Not modelled: I/O priorities, zoned-device write locking, and the dispatch-time insertion
//! of requests at the head (requeues). `none` keeps one FIFO and never merges, which is what
//! blk-mq does for NVMe once plugging is ignored.
//!
//! Cost: insertion and dispatch are O(log n) in the queue length (two B-trees per direction,
//! a FIFO with lazy deletion), so thousands of queued requests stay cheap.

use std::collections::{BTreeMap, VecDeque};

use ebb_core::time::{Duration, Instant};
use serde::{Deserialize, Serialize};

use super::IoOp;

/// Which software scheduler sits in front of the hardware queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduler {
    /// mq-deadline: sorted, merging, read-preferring batches with expiry (see module doc).
    MqDeadline,
    /// No scheduling: one FIFO, no merging (the kernel's `none`).
    None,
}

/// Parameters of the software queue. Defaults quoted are the kernel's mq-deadline defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElevatorParams {
    /// Which scheduler; `mq-deadline` or `none`.
    pub scheduler: Scheduler,
    /// Read FIFO expiry, ms (kernel default 500).
    pub read_expire_ms: u64,
    /// Write FIFO expiry, ms (kernel default 5000).
    pub write_expire_ms: u64,
    /// Read batches allowed while writes wait before a write batch is forced (default 2).
    pub writes_starved: u32,
    /// Requests dispatched per batch in one direction (default 16).
    pub fifo_batch: u32,
    /// Largest request merging may build, bytes (`max_sectors_kb`; 512 KiB typical of the
    /// era's SATA controllers).
    pub max_request_bytes: u64,
}

impl ElevatorParams {
    /// mq-deadline with the kernel's defaults and the given merge limit.
    pub fn mq_deadline(max_request_bytes: u64) -> ElevatorParams {
        ElevatorParams {
            scheduler: Scheduler::MqDeadline,
            read_expire_ms: 500,
            write_expire_ms: 5000,
            writes_starved: 2,
            fifo_batch: 16,
            max_request_bytes,
        }
    }

    /// The `none` scheduler (FIFO, no merging); the other fields are kept for overrides.
    pub fn none(max_request_bytes: u64) -> ElevatorParams {
        ElevatorParams {
            scheduler: Scheduler::None,
            ..ElevatorParams::mq_deadline(max_request_bytes)
        }
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.fifo_batch == 0 {
            return Err("elevator.fifo_batch must be at least 1".to_string());
        }
        if self.max_request_bytes == 0 {
            return Err("elevator.max_request_bytes must be positive".to_string());
        }
        Ok(())
    }
}

/// One caller request inside a (possibly merged) device request.
#[derive(Clone, Copy, Debug)]
pub(super) struct Part {
    pub(super) id: u64,
    pub(super) submitted: Instant,
    pub(super) len: u64,
}

/// A device request: a contiguous range and the caller requests merged into it.
#[derive(Debug)]
pub(super) struct Request {
    pub(super) op: IoOp,
    pub(super) offset: u64,
    pub(super) len: u64,
    /// The first part lives inline so that unmerged requests never allocate.
    pub(super) first: Part,
    pub(super) rest: Vec<Part>,
}

impl Request {
    pub(super) fn new(op: IoOp, offset: u64, len: u64, id: u64, submitted: Instant) -> Request {
        Request { op, offset, len, first: Part { id, submitted, len }, rest: Vec::new() }
    }

    pub(super) fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Every caller request carried by this one.
    pub(super) fn parts(&self) -> impl Iterator<Item = &Part> {
        std::iter::once(&self.first).chain(self.rest.iter())
    }

    fn absorb(&mut self, other: Request) {
        self.rest.push(other.first);
        self.rest.extend(other.rest);
    }
}

/// The software queue; see the module doc.
#[derive(Debug)]
pub(super) struct Elevator {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Deadline(Box<Deadline>),
    Fifo(VecDeque<Request>),
}

impl Elevator {
    pub(super) fn new(params: &ElevatorParams) -> Elevator {
        let inner = match params.scheduler {
            Scheduler::MqDeadline => Inner::Deadline(Box::new(Deadline::new(params))),
            Scheduler::None => Inner::Fifo(VecDeque::new()),
        };
        Elevator { inner }
    }

    pub(super) fn is_empty(&self) -> bool {
        match &self.inner {
            Inner::Deadline(deadline) => deadline.count == 0,
            Inner::Fifo(fifo) => fifo.is_empty(),
        }
    }

    /// Queues `request`; returns true if it was merged into a queued request.
    pub(super) fn insert(&mut self, now: Instant, request: Request) -> bool {
        assert!(request.op != IoOp::Flush, "flushes bypass the elevator");
        match &mut self.inner {
            Inner::Deadline(deadline) => deadline.insert(now, request),
            Inner::Fifo(fifo) => {
                fifo.push_back(request);
                false
            }
        }
    }

    /// The next request to send to the hardware, if any.
    pub(super) fn pop(&mut self, now: Instant) -> Option<Request> {
        match &mut self.inner {
            Inner::Deadline(deadline) => deadline.pop(now),
            Inner::Fifo(fifo) => fifo.pop_front(),
        }
    }
}

const READ: usize = 0;
const WRITE: usize = 1;

fn direction(op: IoOp) -> usize {
    match op {
        IoOp::Read => READ,
        IoOp::Write => WRITE,
        IoOp::Flush => unreachable!("flushes bypass the elevator"),
    }
}

#[derive(Debug)]
struct Queued {
    request: Request,
    sequence: u64,
}

#[derive(Debug)]
struct Deadline {
    expire: [Duration; 2],
    writes_starved: u32,
    fifo_batch: u32,
    max_request_bytes: u64,
    slots: Vec<Option<Queued>>,
    slots_free: Vec<usize>,
    /// (offset, sequence) to slot, per direction: dispatch order and front merges.
    sorted: [BTreeMap<(u64, u64), usize>; 2],
    /// (end, sequence) to slot, per direction: back merges.
    by_end: [BTreeMap<(u64, u64), usize>; 2],
    /// (expiry, sequence, slot) in arrival order; entries of dispatched requests are skipped
    /// when they reach the front (lazy deletion keeps dispatch O(log n)).
    fifo: [VecDeque<(Instant, u64, usize)>; 2],
    /// End offset of the last request dispatched in each direction.
    position: [u64; 2],
    batch_direction: Option<usize>,
    batching: u32,
    starved: u32,
    sequence_next: u64,
    count: usize,
}

impl Deadline {
    fn new(params: &ElevatorParams) -> Deadline {
        Deadline {
            expire: [
                Duration::from_millis(params.read_expire_ms),
                Duration::from_millis(params.write_expire_ms),
            ],
            writes_starved: params.writes_starved,
            fifo_batch: params.fifo_batch,
            max_request_bytes: params.max_request_bytes,
            slots: Vec::new(),
            slots_free: Vec::new(),
            sorted: [BTreeMap::new(), BTreeMap::new()],
            by_end: [BTreeMap::new(), BTreeMap::new()],
            fifo: [VecDeque::new(), VecDeque::new()],
            position: [0, 0],
            batch_direction: None,
            batching: 0,
            starved: 0,
            sequence_next: 0,
            count: 0,
        }
    }

    fn insert(&mut self, now: Instant, request: Request) -> bool {
        let dir = direction(request.op);
        let request = match self.back_merge(dir, request) {
            Ok(()) => return true,
            Err(request) => request,
        };
        let request = match self.front_merge(dir, request) {
            Ok(()) => return true,
            Err(request) => request,
        };
        let sequence = self.sequence_next;
        self.sequence_next += 1;
        let key_offset = (request.offset, sequence);
        let key_end = (request.end(), sequence);
        let slot = match self.slots_free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(Queued { request, sequence });
                slot
            }
            None => {
                self.slots.push(Some(Queued { request, sequence }));
                self.slots.len() - 1
            }
        };
        self.sorted[dir].insert(key_offset, slot);
        self.by_end[dir].insert(key_end, slot);
        self.fifo[dir].push_back((now + self.expire[dir], sequence, slot));
        self.count += 1;
        false
    }

    /// Appends `request` to a queued request that ends where it starts.
    fn back_merge(&mut self, dir: usize, request: Request) -> Result<(), Request> {
        let found = self.by_end[dir]
            .range((request.offset, 0)..=(request.offset, u64::MAX))
            .next()
            .map(|(&key, &slot)| (key, slot));
        let Some(((end, sequence), slot)) = found else {
            return Err(request);
        };
        let queued = self.slots[slot].as_mut().expect("indexed slot is occupied");
        if queued.request.len + request.len > self.max_request_bytes {
            return Err(request);
        }
        queued.request.len += request.len;
        let end_new = queued.request.end();
        queued.request.absorb(request);
        self.by_end[dir].remove(&(end, sequence));
        self.by_end[dir].insert((end_new, sequence), slot);
        Ok(())
    }

    /// Prepends `request` to a queued request that starts where it ends.
    fn front_merge(&mut self, dir: usize, request: Request) -> Result<(), Request> {
        let end = request.end();
        let found = self.sorted[dir]
            .range((end, 0)..=(end, u64::MAX))
            .next()
            .map(|(&key, &slot)| (key, slot));
        let Some(((offset, sequence), slot)) = found else {
            return Err(request);
        };
        let queued = self.slots[slot].as_mut().expect("indexed slot is occupied");
        if queued.request.len + request.len > self.max_request_bytes {
            return Err(request);
        }
        queued.request.offset = request.offset;
        queued.request.len += request.len;
        let offset_new = queued.request.offset;
        queued.request.absorb(request);
        self.sorted[dir].remove(&(offset, sequence));
        self.sorted[dir].insert((offset_new, sequence), slot);
        Ok(())
    }

    fn pop(&mut self, now: Instant) -> Option<Request> {
        if self.count == 0 {
            return None;
        }
        // Continue the current batch in ascending offset order while it lasts.
        if let Some(dir) = self.batch_direction
            && self.batching < self.fifo_batch
            && let Some(slot) = self.next_by_offset(dir)
        {
            self.batching += 1;
            return Some(self.take(dir, slot));
        }
        let reads = !self.sorted[READ].is_empty();
        let writes = !self.sorted[WRITE].is_empty();
        let dir = if reads {
            let starved = self.starved;
            if writes {
                self.starved += 1;
            }
            if writes && starved >= self.writes_starved { WRITE } else { READ }
        } else {
            WRITE
        };
        if dir == WRITE {
            self.starved = 0;
        }
        let oldest = self.fifo_front(dir);
        let expired = self.fifo[dir].front().is_some_and(|&(expiry, _, _)| expiry <= now);
        let slot = match self.next_by_offset(dir) {
            Some(slot) if !expired => slot,
            _ => oldest,
        };
        self.batch_direction = Some(dir);
        self.batching = 1;
        Some(self.take(dir, slot))
    }

    /// The first queued request at or after the last dispatched position.
    fn next_by_offset(&self, dir: usize) -> Option<usize> {
        self.sorted[dir].range((self.position[dir], 0)..).next().map(|(_, &slot)| slot)
    }

    /// The oldest live request of a non-empty direction, dropping stale FIFO entries.
    fn fifo_front(&mut self, dir: usize) -> usize {
        loop {
            let &(_, sequence, slot) = self.fifo[dir].front().expect("direction is not empty");
            let live = self.slots[slot].as_ref().is_some_and(|queued| queued.sequence == sequence);
            if live {
                return slot;
            }
            self.fifo[dir].pop_front();
        }
    }

    fn take(&mut self, dir: usize, slot: usize) -> Request {
        let queued = self.slots[slot].take().expect("dispatched slot is occupied");
        self.slots_free.push(slot);
        let request = queued.request;
        let removed_sorted = self.sorted[dir].remove(&(request.offset, queued.sequence));
        let removed_end = self.by_end[dir].remove(&(request.end(), queued.sequence));
        assert!(removed_sorted.is_some() && removed_end.is_some());
        self.position[dir] = request.end();
        self.count -= 1;
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: IoOp, offset: u64, len: u64, id: u64) -> Request {
        Request::new(op, offset, len, id, Instant::ZERO)
    }

    #[test]
    fn merges_front_and_back_up_to_the_limit() {
        // Goal: contiguous requests merge both ways, and merging stops at max_request_bytes.
        let mut elevator = Elevator::new(&ElevatorParams::mq_deadline(16 * 1024));
        let now = Instant::ZERO;
        assert!(!elevator.insert(now, request(IoOp::Write, 8192, 4096, 1)));
        assert!(elevator.insert(now, request(IoOp::Write, 12288, 4096, 2)));
        assert!(elevator.insert(now, request(IoOp::Write, 4096, 4096, 3)));
        assert!(elevator.insert(now, request(IoOp::Write, 0, 4096, 4)));
        // The queued request is 16 KiB now, so a fifth contiguous one starts a new request.
        assert!(!elevator.insert(now, request(IoOp::Write, 16384, 4096, 5)));
        // A read never merges with writes.
        assert!(!elevator.insert(now, request(IoOp::Read, 20480, 4096, 6)));
        let first = elevator.pop(now).expect("queued");
        assert_eq!(first.op, IoOp::Read);
        let merged = elevator.pop(now).expect("queued");
        assert_eq!((merged.offset, merged.len), (0, 16384));
        let mut ids: Vec<u64> = merged.parts().map(|part| part.id).collect();
        ids.sort();
        assert_eq!(ids, vec![1, 2, 3, 4]);
        assert_eq!(elevator.pop(now).map(|r| r.offset), Some(16384));
        assert!(elevator.pop(now).is_none());
        assert!(elevator.is_empty());
    }

    #[test]
    fn reads_preferred_but_writes_not_starved() {
        // Goal: with both directions queued, reads go first, and a write batch follows after
        // writes_starved read batches.
        let params = ElevatorParams { fifo_batch: 1, ..ElevatorParams::mq_deadline(4096) };
        let mut elevator = Elevator::new(&params);
        let now = Instant::ZERO;
        for index in 0..4 {
            elevator.insert(now, request(IoOp::Write, index * 1_000_000, 4096, index));
            elevator
                .insert(now, request(IoOp::Read, 500_000 + index * 1_000_000, 4096, 10 + index));
        }
        let order: Vec<IoOp> = std::iter::from_fn(|| elevator.pop(now)).map(|r| r.op).collect();
        use IoOp::{Read, Write};
        assert_eq!(order, vec![Read, Read, Write, Read, Read, Write, Write, Write]);
    }

    #[test]
    fn expired_request_jumps_the_sorted_order() {
        // Goal: once the oldest write expires, the next write batch starts at it even though
        // other writes lie ahead of the last position.
        let params = ElevatorParams { fifo_batch: 1, ..ElevatorParams::mq_deadline(4096) };
        let mut elevator = Elevator::new(&params);
        let start = Instant::ZERO;
        elevator.insert(start, request(IoOp::Write, 0, 4096, 1));
        let later = start + Duration::from_secs(1);
        elevator.insert(later, request(IoOp::Write, 100_000, 4096, 2));
        elevator.insert(later, request(IoOp::Write, 200_000, 4096, 3));
        assert_eq!(elevator.pop(later).map(|r| r.first.id), Some(1));
        // Position is now 4096; request 2 is next by offset and nothing has expired.
        assert_eq!(elevator.pop(later).map(|r| r.first.id), Some(2));
        // Request 4 lies between the position and request 3, so it is next by offset.
        elevator.insert(later, request(IoOp::Write, 150_000, 4096, 4));
        let expired = later + Duration::from_secs(6);
        // Request 3 is the oldest and has expired, so the new batch starts at it instead.
        assert_eq!(elevator.pop(expired).map(|r| r.first.id), Some(3));
    }
}
