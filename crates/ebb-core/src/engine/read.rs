//! Reads: cache misses, readahead, reads in flight shared by later readers, and their
//! completions.

use super::*;

/// The first readahead window on a sequential read, in pages (16 KiB).
pub(crate) const READAHEAD_MIN_PAGES: u64 = 4;
/// The largest readahead window, in pages: the kernel's default `read_ahead_kb` of 128.
pub(crate) const READAHEAD_MAX_PAGES: u64 = 32;

impl Engine {
    pub(super) fn read_start<M: PageMaps>(
        &mut self,
        inode: InodeId,
        first: u64,
        pages: u64,
        request: RequestId,
        maps: &mut M,
    ) {
        let Some(meta) = self.inodes.get_mut(&inode) else {
            self.emit(Action::ReadDone { request, result: Err(IoError { errno: errno::EBADF }) });
            return;
        };
        // Readahead (the kernel's on-demand readahead, simplified): on sequential reads keep a
        // window, doubling up to READAHEAD_MAX_PAGES, in flight beyond the request, so the
        // next read usually finds its pages resident or on their way; a seek resets it.
        let sequential = meta.last_read_end == first;
        meta.readahead = if sequential {
            (meta.readahead * 2).clamp(READAHEAD_MIN_PAGES, READAHEAD_MAX_PAGES)
        } else {
            0
        };
        meta.last_read_end = first + pages;
        let span = pages + meta.readahead;
        let b = meta.backend;
        let end = first + pages;
        let mut missing = Vec::new();
        maps.with(inode, |m| m.lookup(first, span, &mut missing));
        let mut waiting = BTreeSet::new();
        for run in missing {
            // Parts already being read: wait for those reads instead of reading twice.
            let mut cursor = run.first;
            let in_flight: Vec<(u64, u64, IoId)> = self.inodes[&inode]
                .reading
                .range(..run.end())
                .filter(|(_, (e, _))| *e > run.first)
                .map(|(&f, &(e, io))| (f, e, io))
                .collect();
            let mut gaps = Vec::new();
            for (f, e, io) in in_flight {
                if f > cursor {
                    gaps.push(Run { first: cursor, count: f - cursor });
                }
                if f < end && e > first {
                    waiting.insert(io);
                }
                cursor = cursor.max(e);
            }
            if cursor < run.end() {
                gaps.push(Run { first: cursor, count: run.end() - cursor });
            }
            for gap in gaps {
                let mut frames = Vec::new();
                self.alloc_frames(gap.count as usize, &mut frames, maps);
                if frames.is_empty() {
                    continue;
                }
                let gap = Run { first: gap.first, count: frames.len() as u64 };
                let io = self.new_io();
                self.ios.insert(
                    io,
                    IoRecord {
                        backend: b,
                        inode,
                        kind: IoKind::Read {
                            run: gap,
                            frames,
                            keep_below: u64::MAX,
                            stale: Vec::new(),
                        },
                        issued: self.now,
                    },
                );
                self.inodes
                    .get_mut(&inode)
                    .expect("known")
                    .reading
                    .insert(gap.first, (gap.end(), io));
                self.wbs[b.index()].inflight += 1;
                self.wbs[b.index()].wbt.on_read_issue(self.now, io.0);
                self.stats.reads += 1;
                self.stats.read_pages += gap.count;
                self.emit(Action::Read {
                    io,
                    backend: b,
                    inode,
                    first_page: gap.first,
                    pages: gap.count,
                });
                if gap.first < end {
                    waiting.insert(io);
                }
            }
        }
        if waiting.is_empty() {
            self.emit(Action::ReadDone { request, result: Ok(()) });
        } else {
            self.reads.insert(request, ReadState { waiting, error: None });
        }
    }

    pub(super) fn read_done<M: PageMaps>(
        &mut self,
        io: IoId,
        result: Result<(), IoError>,
        maps: &mut M,
    ) {
        let record =
            self.ios.remove(&io).unwrap_or_else(|| panic!("completion of unknown io {io}"));
        let IoKind::Read { run, mut frames, keep_below, mut stale } = record.kind else {
            panic!("io {io} is not a read")
        };
        let (b, inode) = (record.backend, record.inode);
        self.wbs[b.index()].inflight -= 1;
        let latency = self.now.saturating_since(record.issued);
        self.wbs[b.index()].wbt.on_read_done(self.now, latency, Some(io.0));
        // Pages a truncate dropped while the read was in flight hold stale bytes.
        let fresh = keep_below.saturating_sub(run.first).min(frames.len() as u64) as usize;
        let mut unused = frames.split_off(fresh);
        if result.is_ok() {
            // Insert the runs between stale pages; a stale page's frame goes back unused.
            stale.sort_unstable();
            stale.dedup();
            let mut inserted = Vec::new();
            let mut start = 0usize;
            let cuts: Vec<usize> = stale
                .iter()
                .filter(|&&p| p >= run.first)
                .map(|&p| (p - run.first) as usize)
                .filter(|&c| c < fresh)
                .chain(std::iter::once(fresh))
                .collect();
            for cut in cuts {
                let first = run.first + start as u64;
                let segment = &frames[start..cut];
                let (ins, rest) = maps.with(inode, |m| m.insert_clean(first, segment));
                inserted.extend(ins);
                unused.extend(rest);
                if cut < fresh {
                    unused.push(frames[cut]);
                }
                start = cut + 1;
            }
            let n = inserted.len() as i64;
            for (frame, index) in inserted {
                self.mem.add_to_lru(frame, inode, index);
            }
            self.account(inode, Counters { resident: n, ..Counters::default() });
        } else {
            unused.extend(frames);
        }
        for frame in unused {
            self.mem.release(frame);
        }
        if let Some(meta) = self.inodes.get_mut(&inode) {
            meta.reading.remove(&run.first);
        }
        // Complete the requests that waited for this read.
        let done: Vec<RequestId> = self
            .reads
            .iter_mut()
            .filter_map(|(&req, r)| {
                if !r.waiting.remove(&io) {
                    return None;
                }
                if let Err(e) = result {
                    r.error = Some(e);
                }
                r.waiting.is_empty().then_some(req)
            })
            .collect();
        for request in done {
            let state = self.reads.remove(&request).expect("read");
            self.emit(Action::ReadDone { request, result: state.error.map_or(Ok(()), Err) });
        }
        self.wake_memory_waiters(maps);
    }
}
