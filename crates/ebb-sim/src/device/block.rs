//! A single block device: elevator, hardware queue, volatile write cache and media.
//!
//! This is where the models' shared queueing behaviour lives, so that every device shows the
//! effects writeback throttling exists for:
//!
//! 1. `submit` puts a read or write into the elevator, or straight into the hardware queue
//!    when the elevator is empty and a tag is free (blk-mq's direct issue). Only requests
//!    that wait can merge, as in the kernel.
//! 2. Whenever a tag frees, the elevator dispatches; at most `queue_depth` requests are in
//!    the hardware at once.
//! 3. In the hardware, a read (and a write the cache cannot take) needs the media (see
//!    `disk.rs`, `flash.rs`): flash reserves it at once; a disk queues it for the actuator,
//!    which takes the next command in C-LOOK order whenever it is idle. A write the cache can take reserves cache space and is
//!    acknowledged once its data crossed the link; if the cache is full, it waits for room
//!    while keeping its tag, and writes behind it wait too (FIFO), so a full cache backs up
//!    into the tags and then into the elevator, where reads then wait.
//! 4. Destaging takes one chunk at a time. It starts when the media is idle (reads and host
//!    writes already dispatched go first) and also right away when writes wait for room or a
//!    flush waits, so a busy media cannot starve it forever.
//! 5. A flush bypasses the elevator and the tags (the kernel's flush machinery) and completes
//!    once as many write bytes have become durable (destaged, or written through, or
//!    overwritten in the cache) as had been submitted before it. With the cache drained and no
//!    other writes, that is exactly "the cache is empty".
//!
//! Internal events go through an [`EventQueue`], so ties resolve in scheduling order and runs
//! are deterministic. Completions found during `submit` (a flush with nothing to wait for)
//! are held until the next `advance`, which is due at once.

use std::collections::{BTreeMap, VecDeque};

use ebb_core::time::{Duration, Instant};

use super::cache::WriteCache;
use super::disk::{DiskMedia, MediaOp};
use super::elevator::{Elevator, Part, Request};
use super::flash::FlashMedia;
use super::{
    Completion, Device, DeviceParams, DeviceRequest, DeviceStats, DiskParams, FlashParams, IoOp,
    transfer_ns,
};
use crate::prng::Prng;
use crate::queue::EventQueue;

/// A disk or flash device; build one with [`super::by_name`] or the constructors here.
#[derive(Debug)]
pub struct BlockDevice {
    name: String,
    params: DeviceParams,
    elevator: Elevator,
    media: Media,
    cache: WriteCache,
    events: EventQueue<Event>,
    /// Requests holding a hardware tag, by slot.
    hardware: Vec<Option<Request>>,
    hardware_free: Vec<usize>,
    tags_used: u32,
    queue_depth: u32,
    /// Hardware slots of writes waiting for cache room, oldest first.
    blocked: VecDeque<usize>,
    /// Disk only: tagged commands waiting for the actuator, by (offset, arrival), picked in
    /// C-LOOK order like NCQ reordering; flash reserves its media at dispatch instead.
    actuator_queue: BTreeMap<(u64, u64), (usize, MediaOp)>,
    actuator_sequence: u64,
    link_free: Instant,
    link_mb_per_s: f64,
    ack_overhead: Duration,
    destage_chunk_bytes: u64,
    destaging: bool,
    /// Pending flushes: durable-byte target and the caller's request, in submission order.
    flushes: VecDeque<(u64, Part)>,
    write_bytes_submitted: u64,
    write_bytes_durable: u64,
    /// Completions found during `submit`, emitted by the next `advance`.
    ready: Vec<Completion>,
    outstanding: usize,
    busy_since: Instant,
    clock: Instant,
    stats: DeviceStats,
}

#[derive(Debug)]
enum Media {
    Disk(DiskMedia),
    Flash(FlashMedia),
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// The media finished the request in this hardware slot.
    MediaDone(usize),
    /// The write in this hardware slot is in the cache.
    CacheAck(usize),
    /// A destage step of this many bytes finished.
    DestageDone(u64),
}

impl Media {
    /// Where the disk head rests after the operations reserved so far (flash: none).
    fn head(&self) -> Option<u64> {
        match self {
            Media::Disk(disk) => Some(disk.head()),
            Media::Flash(_) => None,
        }
    }

    fn idle_at(&self) -> Instant {
        match self {
            Media::Disk(disk) => disk.idle_at(),
            Media::Flash(flash) => flash.idle_at(),
        }
    }

    fn reserve(
        &mut self,
        now: Instant,
        op: MediaOp,
        offset: u64,
        len: u64,
        stats: &mut DeviceStats,
    ) -> Instant {
        match self {
            Media::Disk(disk) => disk.reserve(now, op, offset, len, stats),
            Media::Flash(flash) => flash.reserve(now, op, offset, len),
        }
    }
}

/// The parts of the parameters the shared queueing logic needs.
struct Common {
    queue_depth: u32,
    write_cache_bytes: u64,
    destage_chunk_bytes: u64,
    interface_mb_per_s: f64,
    command_overhead_us: f64,
}

impl BlockDevice {
    /// A rotating disk named `name`. Panics if `params.validate()` fails.
    pub fn disk(name: &str, params: DiskParams, seed: u64) -> BlockDevice {
        if let Err(reason) = params.validate() {
            panic!("invalid disk parameters: {reason}");
        }
        let common = Common {
            queue_depth: params.queue_depth,
            write_cache_bytes: params.write_cache_bytes,
            destage_chunk_bytes: params.destage_chunk_bytes,
            interface_mb_per_s: params.interface_mb_per_s,
            command_overhead_us: params.command_overhead_us,
        };
        let media = Media::Disk(DiskMedia::new(&params, Prng::new(seed)));
        let elevator = Elevator::new(&params.elevator);
        BlockDevice::build(name, DeviceParams::Disk(params), common, elevator, media)
    }

    /// A flash device named `name`; it draws no random numbers, so it takes no seed.
    /// Panics if `params.validate()` fails.
    pub fn flash(name: &str, params: FlashParams) -> BlockDevice {
        if let Err(reason) = params.validate() {
            panic!("invalid flash parameters: {reason}");
        }
        let common = Common {
            queue_depth: params.queue_depth,
            write_cache_bytes: params.write_cache_bytes,
            destage_chunk_bytes: params.destage_chunk_bytes,
            interface_mb_per_s: params.interface_mb_per_s,
            command_overhead_us: params.command_overhead_us,
        };
        let media = Media::Flash(FlashMedia::new(&params));
        let elevator = Elevator::new(&params.elevator);
        BlockDevice::build(name, DeviceParams::Flash(params), common, elevator, media)
    }

    fn build(
        name: &str,
        params: DeviceParams,
        common: Common,
        elevator: Elevator,
        media: Media,
    ) -> BlockDevice {
        BlockDevice {
            name: name.to_string(),
            params,
            elevator,
            media,
            cache: WriteCache::new(common.write_cache_bytes),
            events: EventQueue::new(),
            hardware: Vec::new(),
            hardware_free: Vec::new(),
            tags_used: 0,
            queue_depth: common.queue_depth,
            blocked: VecDeque::new(),
            actuator_queue: BTreeMap::new(),
            actuator_sequence: 0,
            link_free: Instant::ZERO,
            link_mb_per_s: common.interface_mb_per_s,
            ack_overhead: Duration::from_nanos((common.command_overhead_us * 1e3) as u64),
            destage_chunk_bytes: common.destage_chunk_bytes,
            destaging: false,
            flushes: VecDeque::new(),
            write_bytes_submitted: 0,
            write_bytes_durable: 0,
            ready: Vec::new(),
            outstanding: 0,
            busy_since: Instant::ZERO,
            clock: Instant::ZERO,
            stats: DeviceStats::default(),
        }
    }

    /// Bytes in the volatile write cache not yet destaged (for tests and traces).
    pub fn cache_dirty_bytes(&self) -> u64 {
        self.cache.dirty_bytes()
    }

    fn handle(&mut self, now: Instant, event: Event, done: &mut Vec<Completion>) {
        match event {
            Event::MediaDone(slot) => {
                let request = self.release_tag(slot);
                if request.op == IoOp::Write {
                    self.write_bytes_durable += request.len;
                }
                self.complete(now, &request, done);
            }
            Event::CacheAck(slot) => {
                let request = self.release_tag(slot);
                let overwritten = self.cache.insert(request.offset, request.len);
                self.write_bytes_durable += overwritten;
                self.complete(now, &request, done);
                self.admit_blocked(now);
            }
            Event::DestageDone(len) => {
                assert!(self.destaging);
                self.destaging = false;
                self.cache.release(len);
                self.write_bytes_durable += len;
                self.stats.destage_bytes += len;
                self.admit_blocked(now);
            }
        }
        self.pump(now, done);
    }

    /// Moves work forward after any change: dispatch, destage, finish flushes.
    fn pump(&mut self, now: Instant, done: &mut Vec<Completion>) {
        while self.tags_used < self.queue_depth {
            let Some(request) = self.elevator.pop(now) else {
                break;
            };
            self.dispatch(now, request);
        }
        if let Some(head) = self.media.head()
            && self.media.idle_at() <= now
        {
            // NCQ-like reordering: the next command at or after the head, else the lowest.
            let next = self.actuator_queue.range((head, 0)..).next();
            let next = next.or_else(|| self.actuator_queue.iter().next());
            if let Some((&key, &(slot, media_op))) = next {
                self.actuator_queue.remove(&key);
                let request = self.hardware[slot].as_ref().expect("queued slot is occupied");
                let (offset, len) = (request.offset, request.len);
                let at = self.media.reserve(now, media_op, offset, len, &mut self.stats);
                self.events.push(at, Event::MediaDone(slot));
            }
        }
        let flush_waiting =
            self.flushes.front().is_some_and(|&(target, _)| target > self.write_bytes_durable);
        let urgent = !self.blocked.is_empty() || flush_waiting;
        if !self.destaging
            && self.cache.dirty_bytes() > 0
            && (urgent || self.media.idle_at() <= now)
        {
            let (offset, len) =
                self.cache.take_chunk(self.destage_chunk_bytes).expect("cache has dirty bytes");
            let at = self.media.reserve(now, MediaOp::Destage, offset, len, &mut self.stats);
            self.events.push(at, Event::DestageDone(len));
            self.destaging = true;
        }
        while let Some(&(target, part)) = self.flushes.front() {
            if target > self.write_bytes_durable {
                break;
            }
            self.flushes.pop_front();
            self.stats.flushes += 1;
            self.finish_part(now, IoOp::Flush, part, done);
        }
    }

    /// Gives `request` a hardware tag and starts it.
    fn dispatch(&mut self, now: Instant, request: Request) {
        assert!(self.tags_used < self.queue_depth);
        self.tags_used += 1;
        self.stats.dispatches += 1;
        let (op, offset, len) = (request.op, request.offset, request.len);
        let slot = match self.hardware_free.pop() {
            Some(slot) => {
                self.hardware[slot] = Some(request);
                slot
            }
            None => {
                self.hardware.push(Some(request));
                self.hardware.len() - 1
            }
        };
        match op {
            IoOp::Write if self.cache.can_hold(len) => {
                if self.blocked.is_empty() && self.cache.has_room(len) {
                    self.admit(now, slot, len);
                } else {
                    self.blocked.push_back(slot);
                }
            }
            IoOp::Write | IoOp::Read => {
                let media_op = if op == IoOp::Read { MediaOp::Read } else { MediaOp::Write };
                if self.media.head().is_some() {
                    self.actuator_queue.insert((offset, self.actuator_sequence), (slot, media_op));
                    self.actuator_sequence += 1;
                } else {
                    let at = self.media.reserve(now, media_op, offset, len, &mut self.stats);
                    self.events.push(at, Event::MediaDone(slot));
                }
            }
            IoOp::Flush => unreachable!("flushes bypass the hardware queue"),
        }
    }

    /// Starts the link transfer of a cached write; it is acknowledged when the data is in.
    fn admit(&mut self, now: Instant, slot: usize, len: u64) {
        self.cache.reserve(len);
        let transfer = Duration::from_nanos(transfer_ns(len, self.link_mb_per_s));
        self.link_free = now.max(self.link_free) + self.ack_overhead + transfer;
        self.events.push(self.link_free, Event::CacheAck(slot));
    }

    /// Admits waiting writes, oldest first, while the cache has room.
    fn admit_blocked(&mut self, now: Instant) {
        while let Some(&slot) = self.blocked.front() {
            let len = self.hardware[slot].as_ref().expect("blocked slot is occupied").len;
            if !self.cache.has_room(len) {
                break;
            }
            self.blocked.pop_front();
            self.admit(now, slot, len);
        }
    }

    fn release_tag(&mut self, slot: usize) -> Request {
        let request = self.hardware[slot].take().expect("completed slot is occupied");
        self.hardware_free.push(slot);
        self.tags_used -= 1;
        request
    }

    fn complete(&mut self, now: Instant, request: &Request, done: &mut Vec<Completion>) {
        for &part in request.parts() {
            match request.op {
                IoOp::Read => {
                    self.stats.reads += 1;
                    self.stats.read_bytes += part.len;
                }
                IoOp::Write => {
                    self.stats.writes += 1;
                    self.stats.write_bytes += part.len;
                }
                IoOp::Flush => unreachable!("flushes complete in pump"),
            }
            self.finish_part(now, request.op, part, done);
        }
    }

    fn finish_part(&mut self, now: Instant, op: IoOp, part: Part, done: &mut Vec<Completion>) {
        done.push(Completion {
            id: part.id,
            op,
            at: now,
            latency: now.saturating_since(part.submitted),
            verifier: None,
        });
        assert!(self.outstanding > 0);
        self.outstanding -= 1;
        if self.outstanding == 0 {
            self.stats.busy_time += now.saturating_since(self.busy_since);
        }
    }
}

impl Device for BlockDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn params(&self) -> &DeviceParams {
        &self.params
    }

    fn submit(&mut self, now: Instant, request: DeviceRequest) {
        assert!(now >= self.clock, "submit at {now} is earlier than device time {}", self.clock);
        assert!(
            self.events.peek_time().is_none_or(|next| next >= now),
            "submit at {now} with an unprocessed device event before it; call advance first"
        );
        self.clock = now;
        if self.outstanding == 0 {
            self.busy_since = now;
        }
        self.outstanding += 1;
        self.stats.queued_max = self.stats.queued_max.max(self.outstanding);
        let mut ready = std::mem::take(&mut self.ready);
        match request.op {
            IoOp::Flush => {
                let part = Part { id: request.id, submitted: now, len: 0 };
                self.flushes.push_back((self.write_bytes_submitted, part));
            }
            IoOp::Read | IoOp::Write => {
                assert!(request.len > 0, "request {} has zero length", request.id);
                if request.op == IoOp::Write {
                    self.write_bytes_submitted += request.len;
                }
                let queued = Request::new(request.op, request.offset, request.len, request.id, now);
                if self.elevator.is_empty() && self.tags_used < self.queue_depth {
                    self.dispatch(now, queued);
                } else if self.elevator.insert(now, queued) {
                    self.stats.merges += 1;
                }
            }
        }
        self.pump(now, &mut ready);
        self.ready = ready;
    }

    fn next_event_time(&self) -> Option<Instant> {
        if self.ready.is_empty() { self.events.peek_time() } else { Some(self.clock) }
    }

    fn advance(&mut self, now: Instant, done: &mut Vec<Completion>) {
        assert!(now >= self.clock, "advance to {now} is earlier than device time {}", self.clock);
        done.append(&mut self.ready);
        while let Some(at) = self.events.peek_time() {
            if at > now {
                break;
            }
            let (at, event) = self.events.pop().expect("peeked");
            self.clock = at;
            self.handle(at, event, done);
        }
        self.clock = now;
    }

    fn queued(&self) -> usize {
        self.outstanding
    }

    fn stats(&self) -> DeviceStats {
        self.stats
    }
}
