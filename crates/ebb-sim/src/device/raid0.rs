//! RAID-0: requests striped over identical member disks, complete when every part is done.
//!
//! Striping is how 2010-era servers got several times a disk's bandwidth, and it changes
//! what writeback sees: one large request keeps several actuators busy, while a small random
//! read still costs one disk's seek. As in Linux md, the array has no scheduler of its own;
//! each member keeps its own elevator, hardware queue and write cache.
//!
//! Address mapping, with `n` members and chunk size `c`:
//!
//! ```text
//! chunk   = offset / c
//! member  = chunk mod n
//! address = (chunk / n) * c + offset mod c        (on that member)
//! ```
//!
//! The pieces of one contiguous request that land on the same member are contiguous there
//! (chunks `k` and `k + n` are neighbours on member `k mod n`), so each member receives at
//! most one request per array request, and the member request id can be the array slot. A
//! flush goes to every member.

use ebb_core::time::Instant;
use serde::{Deserialize, Serialize};

use super::block::BlockDevice;
use super::{Completion, Device, DeviceParams, DeviceRequest, DeviceStats, DiskParams, IoOp};
use crate::prng::Prng;

/// Parameters of a RAID-0 array (model `raid0-4x-sata-2010`).
///
/// | field | value | unit | provenance |
/// |---|---|---|---|
/// | `member` | [`DiskParams::sata_2010`] | | as the single-disk model |
/// | `member_count` | 4 | disks | the reference setup |
/// | `chunk_bytes` | 512 KiB | bytes | mdadm default chunk since 2009 |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Raid0Params {
    /// Parameters of every member disk.
    pub member: DiskParams,
    /// Number of member disks.
    pub member_count: u32,
    /// Stripe chunk size, bytes.
    pub chunk_bytes: u64,
}

impl Raid0Params {
    /// Four 2010 SATA disks with 512 KiB chunks.
    pub fn raid0_4x_sata_2010() -> Raid0Params {
        Raid0Params { member: DiskParams::sata_2010(), member_count: 4, chunk_bytes: 512 << 10 }
    }

    /// Checks that the parameters describe a usable array, naming the first bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.member_count == 0 {
            return Err("member_count must be at least 1".to_string());
        }
        if self.chunk_bytes == 0 {
            return Err("chunk_bytes must be positive".to_string());
        }
        self.member.validate().map_err(|reason| format!("member.{reason}"))
    }
}

/// A RAID-0 array of [`BlockDevice`] disks; see the module doc.
#[derive(Debug)]
pub struct Raid0 {
    name: String,
    params: DeviceParams,
    chunk_bytes: u64,
    members: Vec<BlockDevice>,
    /// Array requests in progress, by slot (the slot is the members' request id).
    parents: Vec<Option<Parent>>,
    parents_free: Vec<usize>,
    /// Per-member (start, len) of the request being split; reused to avoid allocation.
    pieces: Vec<(u64, u64)>,
    scratch: Vec<Completion>,
    outstanding: usize,
    busy_since: Instant,
    stats: DeviceStats,
}

#[derive(Debug)]
struct Parent {
    id: u64,
    op: IoOp,
    len: u64,
    submitted: Instant,
    parts_remaining: u32,
    last_at: Instant,
}

impl Raid0 {
    /// An array named `name`; member seeds are forked from `seed`. Panics if
    /// `params.validate()` fails.
    pub fn new(name: &str, params: Raid0Params, seed: u64) -> Raid0 {
        if let Err(reason) = params.validate() {
            panic!("invalid raid0 parameters: {reason}");
        }
        let mut prng = Prng::new(seed);
        let members = (0..params.member_count)
            .map(|index| {
                let member_name = format!("{name}/{index}");
                BlockDevice::disk(&member_name, params.member.clone(), prng.next_u64())
            })
            .collect();
        Raid0 {
            name: name.to_string(),
            chunk_bytes: params.chunk_bytes,
            pieces: vec![(0, 0); params.member_count as usize],
            params: DeviceParams::Raid0(params),
            members,
            parents: Vec::new(),
            parents_free: Vec::new(),
            scratch: Vec::new(),
            outstanding: 0,
            busy_since: Instant::ZERO,
            stats: DeviceStats::default(),
        }
    }

    /// The member disks, for inspection.
    pub fn members(&self) -> &[BlockDevice] {
        &self.members
    }

    /// Fills `self.pieces` with each member's contiguous share of `[offset, offset + len)`.
    fn split(&mut self, offset: u64, len: u64) {
        let count = self.members.len() as u64;
        let chunk = self.chunk_bytes;
        self.pieces.fill((0, 0));
        let end = offset + len;
        let mut position = offset;
        while position < end {
            let chunk_index = position / chunk;
            let member = (chunk_index % count) as usize;
            let piece_end = end.min((chunk_index + 1) * chunk);
            let address = (chunk_index / count) * chunk + position % chunk;
            let piece = &mut self.pieces[member];
            if piece.1 == 0 {
                *piece = (address, piece_end - position);
            } else {
                assert_eq!(piece.0 + piece.1, address, "member pieces are contiguous");
                piece.1 += piece_end - position;
            }
            position = piece_end;
        }
    }
}

impl Device for Raid0 {
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
        let parent = Parent {
            id: request.id,
            op: request.op,
            len: request.len,
            submitted: now,
            parts_remaining: 0,
            last_at: now,
        };
        let slot = match self.parents_free.pop() {
            Some(slot) => {
                self.parents[slot] = Some(parent);
                slot
            }
            None => {
                self.parents.push(Some(parent));
                self.parents.len() - 1
            }
        };
        let mut parts = 0;
        if request.op == IoOp::Flush {
            for member in &mut self.members {
                let flush = DeviceRequest { id: slot as u64, ..request };
                member.submit(now, flush);
                parts += 1;
            }
        } else {
            assert!(request.len > 0, "request {} has zero length", request.id);
            self.split(request.offset, request.len);
            for (member, &(offset, len)) in self.members.iter_mut().zip(&self.pieces) {
                if len > 0 {
                    member.submit(now, DeviceRequest { id: slot as u64, offset, len, ..request });
                    parts += 1;
                }
            }
        }
        self.parents[slot].as_mut().expect("just inserted").parts_remaining = parts;
    }

    fn next_event_time(&self) -> Option<Instant> {
        self.members.iter().filter_map(|member| member.next_event_time()).min()
    }

    fn advance(&mut self, now: Instant, done: &mut Vec<Completion>) {
        let start = done.len();
        for index in 0..self.members.len() {
            self.scratch.clear();
            self.members[index].advance(now, &mut self.scratch);
            for part in &self.scratch {
                let slot = part.id as usize;
                let parent = self.parents[slot].as_mut().expect("member completed a live request");
                parent.parts_remaining -= 1;
                parent.last_at = parent.last_at.max(part.at);
                if parent.parts_remaining > 0 {
                    continue;
                }
                let parent = self.parents[slot].take().expect("checked above");
                self.parents_free.push(slot);
                match parent.op {
                    IoOp::Read => {
                        self.stats.reads += 1;
                        self.stats.read_bytes += parent.len;
                    }
                    IoOp::Write => {
                        self.stats.writes += 1;
                        self.stats.write_bytes += parent.len;
                    }
                    IoOp::Flush => self.stats.flushes += 1,
                }
                done.push(Completion {
                    id: parent.id,
                    op: parent.op,
                    at: parent.last_at,
                    latency: parent.last_at.saturating_since(parent.submitted),
                    verifier: None,
                });
                self.outstanding -= 1;
                if self.outstanding == 0 {
                    self.stats.busy_time += parent.last_at.saturating_since(self.busy_since);
                }
            }
        }
        // Members are advanced one after another, so restore completion-time order.
        done[start..].sort_by_key(|completion| completion.at);
    }

    fn queued(&self) -> usize {
        self.outstanding
    }

    fn stats(&self) -> DeviceStats {
        let mut stats = self.stats;
        for member in &self.members {
            stats.add_member(&member.stats());
        }
        stats
    }
}
