//! The simulated applications that write: dd and cp streams, and the memory workloads' plans
//! (`crate::memload`), advanced through the writer protocol (`Engine::writer_write`, then
//! `Engine::writer_step` after a sleep or a wait) and its answers.

use ebb_core::{
    BackendId, Duration, Event, GroupId, HandleId, InodeId, Instant, RequestId, Writer, WriterId,
    WriterNext,
};

use super::{Ev, NS_PER_PAGE, PAGE, Sim};
use crate::memload::{NS_PER_FAULT, Plan, Seg};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriterState {
    NotStarted,
    Running,
    Blocked,
    Reading(RequestId),
    Fsyncing(RequestId),
    Done,
}

pub(super) struct SimWriter {
    pub(super) w: Writer,
    pub(super) inode: InodeId,
    pub(super) handle: HandleId,
    pub(super) src: Option<InodeId>,
    pub(super) pos: u64,
    pub(super) end: u64,
    pub(super) bs: u64,
    pub(super) left: u64,
    pub(super) think: Duration,
    pub(super) fsync: bool,
    pub(super) state: WriterState,
    pub(super) started: Option<Instant>,
    pub(super) finished: Option<Instant>,
    /// When its closing fsync began (`conv=fsync`).
    pub(super) sync_started: Option<Instant>,
    /// Memory workloads (`Workload::Memory`): what follows the current segment.
    pub(super) plan: std::collections::VecDeque<Seg>,
    /// Repeated while foreground writers run; a writer with a cycle is in the background.
    pub(super) cycle: Vec<Seg>,
    pub(super) cycle_start: Instant,
    pub(super) backend: usize,
    /// The current segment faults in anonymous memory rather than writing a file.
    pub(super) anon: bool,
    pub(super) anon_held: u64,
    /// Follows a plan (`Workload::Memory`).
    pub(super) planned: bool,
    /// Where the current segment began in its file (`Seg::Append` continues a file).
    pub(super) seg_start: u64,
    /// Pages done in finished segments.
    pub(super) done_before: u64,
    pub(super) files_done: u64,
    pub(super) count_files: bool,
    /// The second file of `Seg::Append`: inode, handle, next page.
    pub(super) append: Option<(InodeId, HandleId, u64)>,
    /// dd: at this page, truncate the file to the second and go on from there.
    pub(super) truncate: Option<(u64, u64)>,
    /// dd: unlink the file after closing it.
    pub(super) unlink: bool,
}

/// Pages a plan writes or faults in (for progress).
pub(super) fn plan_pages(plan: &Plan) -> u64 {
    plan.segs
        .iter()
        .map(|s| match *s {
            Seg::File(n) | Seg::Append(n) | Seg::Anon(n) => n,
            _ => 0,
        })
        .sum()
}

impl SimWriter {
    /// Writer `w` of `backend`, with nothing to write yet: no file, no plan, not started.
    pub(super) fn idle(w: usize, backend: usize) -> SimWriter {
        SimWriter {
            w: Writer::new(WriterId(w as u32), GroupId(w as u32)),
            inode: InodeId(0),
            handle: HandleId(0),
            src: None,
            pos: 0,
            end: 0,
            bs: 1,
            left: 0,
            think: Duration::ZERO,
            fsync: false,
            state: WriterState::NotStarted,
            started: None,
            finished: None,
            sync_started: None,
            plan: Default::default(),
            cycle: Vec::new(),
            cycle_start: Instant::ZERO,
            backend,
            anon: false,
            anon_held: 0,
            planned: false,
            seg_start: 0,
            done_before: 0,
            files_done: 0,
            count_files: false,
            append: None,
            truncate: None,
            unlink: false,
        }
    }

    /// A writer following a memory workload's plan (it starts with no segment).
    pub(super) fn planned(w: usize, plan: Plan) -> SimWriter {
        SimWriter {
            bs: plan.bs_pages.max(1),
            plan: plan.segs.into(),
            cycle: plan.cycle,
            planned: true,
            count_files: plan.count_files,
            ..SimWriter::idle(w, plan.backend)
        }
    }
}

/// What a writer between write calls does next ([`Sim::between_calls`]).
enum Between {
    /// Look again (its state changed).
    Again,
    /// Nothing until an event wakes it.
    Stop,
    /// Write its next call's pages.
    Write,
}

impl Sim<'_> {
    /// Advances writer `i` through its workload until it must wait.
    pub(super) fn step(&mut self, i: usize) {
        // Bounded: each turn consumes pages, starts a request, or stops the writer.
        for _ in 0..100_000 {
            let sw = &mut self.writers[i];
            match sw.state {
                WriterState::NotStarted => {
                    sw.state = WriterState::Running;
                    sw.started = Some(self.now);
                }
                WriterState::Running => {}
                _ => return,
            }
            if sw.left == 0 {
                match self.between_calls(i) {
                    Between::Again => continue,
                    Between::Stop => return,
                    Between::Write => {}
                }
            }
            let next = self.write_call(i);
            if !self.obey_inline(i, next) {
                return;
            }
        }
        panic!("writer {i} makes no progress at {}", self.now);
    }

    /// A writer between write calls: truncates where its plan says, moves to its next segment,
    /// faults in anonymous memory, fsyncs or finishes at its end, or starts its next call (of
    /// `bs` pages, first reading them from its source, if it copies).
    fn between_calls(&mut self, i: usize) -> Between {
        let sw = &mut self.writers[i];
        if sw.truncate.is_some_and(|(at, _)| sw.pos >= at) {
            self.truncate(i);
            return Between::Again;
        }
        if sw.pos >= sw.end && sw.planned {
            return if self.next_segment(i) { Between::Again } else { Between::Stop };
        }
        if sw.anon {
            self.anon_step(i);
            return Between::Stop;
        }
        if sw.pos >= sw.end {
            if sw.fsync {
                self.start_fsync(i);
            } else {
                self.finish_writer(i);
            }
            return Between::Stop;
        }
        sw.left = sw.bs.min(sw.end - sw.pos);
        let Some(src) = sw.src else { return Between::Write };
        let (first, pages) = (sw.pos, sw.left);
        let request = self.request();
        self.writers[i].state = WriterState::Reading(request);
        self.read_started.insert(request, (i, self.now));
        if let Some(check) = self.check.as_deref_mut() {
            check.read_issued(request);
        }
        let read = Event::Read { inode: src, first_page: first, pages, request };
        self.engine.handle(self.now, read, &mut self.maps);
        Between::Stop
    }

    /// The writer reached its end: it fsyncs its file.
    fn start_fsync(&mut self, i: usize) {
        let request = self.request();
        let sw = &mut self.writers[i];
        self.engine.flush_writer(self.now, &mut sw.w, &mut self.maps);
        sw.state = WriterState::Fsyncing(request);
        sw.sync_started = Some(self.now);
        let (handle, inode, b) = (sw.handle, sw.inode, sw.backend);
        if let Some(check) = self.check.as_deref_mut() {
            check.issued(request, (inode, b), handle, true);
        }
        self.engine.handle(self.now, Event::Fsync { handle, request }, &mut self.maps);
    }

    /// Dirties what is left of the writer's call as far as it goes (`Engine::writer_write`):
    /// the writer's next move.
    fn write_call(&mut self, i: usize) -> WriterNext {
        let sw = &mut self.writers[i];
        let (inode, pos, left) = (sw.inode, sw.pos, sw.left);
        let (consumed, next) =
            self.engine.writer_write(self.now, &mut sw.w, inode, (pos, left), &mut self.maps);
        if let Some(check) = self.check.as_deref_mut() {
            check.wrote(inode, pos, consumed);
        }
        sw.pos += consumed;
        sw.left -= consumed;
        self.pages_done += consumed;
        next
    }

    /// Carries out a writer's next move; true if the writer may go on at once.
    pub(super) fn obey_inline(&mut self, i: usize, v: WriterNext) -> bool {
        match v {
            WriterNext::Done => {
                // The write call is done: the copy took CPU time, then the application thinks
                // (its next call is queued after them).
                let sw = &self.writers[i];
                let at = self.now + Duration::from_nanos(sw.bs * NS_PER_PAGE) + sw.think;
                self.queue.push(at, Ev::Step(i));
                false
            }
            WriterNext::Proceed { stalled, throttled } => {
                if throttled {
                    self.pauses.push((self.now.as_secs_f64(), stalled.as_millis_f64(), i as u32));
                }
                self.writers[i].state = WriterState::Running;
                true
            }
            WriterNext::Sleep { until } => {
                if let Some(check) = self.check.as_deref_mut() {
                    check.slept(self.now, until, i);
                }
                self.writers[i].state = WriterState::Blocked;
                self.queue.push(until, Ev::Resume(i));
                false
            }
            WriterNext::Wait { .. } => {
                self.writers[i].state = WriterState::Blocked;
                false
            }
            WriterNext::Fail { error } => {
                // The write failed (held pages fill the cache, or its backend is unreachable
                // past its retry timeout): the writer stops, as dd does on a write error.
                self.write_failures.push((self.now.as_secs_f64(), i as u32, error.errno));
                self.finish_writer(i);
                false
            }
        }
    }

    pub(super) fn obey(&mut self, i: usize, v: WriterNext) {
        if self.obey_inline(i, v) {
            self.step(i);
        }
    }

    pub(super) fn finish_writer(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        sw.state = WriterState::Done;
        sw.finished = Some(self.now);
        self.engine.writer_exit(self.now, &mut sw.w, &mut self.maps);
        if self.check.is_some() && !self.writers[i].planned {
            // A checked run closes a stream's file, so errseq is checked at close too.
            let (handle, inode) = (self.writers[i].handle, self.writers[i].inode);
            self.close(i, inode, handle);
        }
        if self.writers[i].unlink {
            let inode = self.writers[i].inode;
            self.engine.handle(self.now, Event::Truncate { inode, first_page: 0 }, &mut self.maps);
            if let Some(check) = self.check.as_deref_mut() {
                check.truncated(inode, 0);
            }
        }
        if self.writers.iter().all(|w| w.state == WriterState::Done) {
            let stats = self.engine.stats();
            self.writepages_at_end = Some((stats.writepages_calls, stats.writepages_pages));
            self.final_sync();
        }
    }

    /// A checked run ends with a sync (the runtime's drain): liveness requires it to return and
    /// leave nothing unwritten that a fault does not hold.
    pub(super) fn final_sync(&mut self) {
        if self.check.is_some() {
            let request = self.request();
            if let Some(check) = self.check.as_deref_mut() {
                check.sync_issued(request);
            }
            self.engine.handle(self.now, Event::Sync { request }, &mut self.maps);
        }
    }

    /// Ends writer `i`'s current segment and starts the next: true if the writer goes on at
    /// once, false if it sleeps or has finished.
    pub(super) fn next_segment(&mut self, i: usize) -> bool {
        self.end_segment(i);
        let sw = &mut self.writers[i];
        if sw.plan.is_empty() {
            let foreground_running =
                self.writers.iter().any(|w| w.cycle.is_empty() && w.state != WriterState::Done);
            let sw = &mut self.writers[i];
            if sw.cycle.is_empty() || !foreground_running {
                self.free_anon(i);
                self.finish_writer(i);
                return false;
            }
            sw.plan = sw.cycle.clone().into();
            sw.cycle_start = self.now;
        }
        let sw = &mut self.writers[i];
        let seg = sw.plan.pop_front().expect("refilled above");
        sw.done_before += sw.pos - sw.seg_start;
        sw.pos = 0;
        sw.seg_start = 0;
        sw.end = 0;
        sw.anon = false;
        match seg {
            Seg::File(n) => {
                let (inode, handle) = self.new_file(i, n);
                let sw = &mut self.writers[i];
                sw.inode = inode;
                sw.handle = handle;
                sw.end = n;
                true
            }
            Seg::Append(n) => {
                let (inode, handle, at) = match self.writers[i].append {
                    Some(a) => a,
                    None => {
                        let (inode, handle) = self.new_file(i, 1 << 20);
                        (inode, handle, 0)
                    }
                };
                let sw = &mut self.writers[i];
                sw.inode = inode;
                sw.handle = handle;
                sw.append = Some((inode, handle, at));
                sw.pos = at;
                sw.seg_start = at;
                sw.end = at + n;
                true
            }
            Seg::Anon(n) => {
                sw.anon = true;
                sw.end = n;
                true
            }
            Seg::FreeAnon => {
                self.free_anon(i);
                true
            }
            Seg::Sleep(d) => {
                self.queue.push(self.now + d, Ev::Step(i));
                false
            }
            Seg::SleepUntilNext(period) => {
                let at = (sw.cycle_start + period).max(self.now);
                self.queue.push(at, Ev::Step(i));
                false
            }
        }
    }

    /// A dd truncates its file (`Workload::Dd::truncate`) and goes on writing from the cut.
    fn truncate(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        let Some((_, to)) = sw.truncate.take() else { return };
        self.engine.flush_writer(self.now, &mut sw.w, &mut self.maps);
        let inode = sw.inode;
        self.pages_total += sw.pos.saturating_sub(to);
        sw.pos = sw.pos.min(to);
        self.engine.handle(self.now, Event::Truncate { inode, first_page: to }, &mut self.maps);
        if let Some(check) = self.check.as_deref_mut() {
            check.truncated(inode, to);
        }
    }

    /// Closes the file of a finished file segment.
    pub(super) fn end_segment(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        if sw.anon || sw.end == 0 {
            return;
        }
        if let Some((inode, handle, at)) = sw.append
            && inode == sw.inode
        {
            sw.append = Some((inode, handle, at.max(sw.pos)));
            return;
        }
        if sw.count_files {
            sw.files_done += 1;
        }
        self.engine.flush_writer(self.now, &mut sw.w, &mut self.maps);
        let (handle, inode) = (self.writers[i].handle, self.writers[i].inode);
        self.close(i, inode, handle);
    }

    /// Closes `handle` of `inode`, a file of writer `i`'s backend.
    fn close(&mut self, i: usize, inode: InodeId, handle: HandleId) {
        let request = self.request();
        let b = self.writers[i].backend;
        if let Some(check) = self.check.as_deref_mut() {
            check.issued(request, (inode, b), handle, false);
        }
        self.engine.handle(self.now, Event::Close { handle, request }, &mut self.maps);
    }

    /// Opens a new file of up to `pages` for writer `i`.
    pub(super) fn new_file(&mut self, i: usize, pages: u64) -> (InodeId, HandleId) {
        self.next_file += 1;
        let inode = InodeId(self.next_file);
        let handle = HandleId(self.next_file);
        self.base.insert(inode, self.next_base);
        self.next_base += (pages * PAGE).next_multiple_of(1 << 30);
        let backend = BackendId(self.writers[i].backend as u32);
        self.engine.handle(self.now, Event::Open { handle, inode, backend }, &mut self.maps);
        (inode, handle)
    }

    /// Background writers (anon-churn) end once every foreground writer has finished, even in
    /// the middle of a sleep.
    pub(super) fn end_background(&mut self) {
        if self.writers.iter().any(|w| w.cycle.is_empty() && w.state != WriterState::Done) {
            return;
        }
        for i in 0..self.writers.len() {
            if !self.writers[i].cycle.is_empty() && self.writers[i].state != WriterState::Done {
                self.free_anon(i);
                self.finish_writer(i);
            }
        }
    }

    pub(super) fn free_anon(&mut self, i: usize) {
        let pages = std::mem::take(&mut self.writers[i].anon_held);
        if pages > 0 {
            self.engine.handle(self.now, Event::AnonFree { pages }, &mut self.maps);
        }
    }

    /// Faults in the next batch of the writer's anonymous segment.
    pub(super) fn anon_step(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        let want = sw.bs.min(sw.end - sw.pos);
        let (got, verdict) = self.engine.anon_fault(self.now, &mut sw.w, want, &mut self.maps);
        sw.pos += got;
        sw.anon_held += got;
        if sw.cycle.is_empty() {
            self.pages_done += got;
        }
        if got > 0 {
            let at = self.now + Duration::from_nanos(got * NS_PER_FAULT);
            self.queue.push(at, Ev::Step(i));
        } else {
            self.obey_inline(i, verdict);
        }
    }
}
