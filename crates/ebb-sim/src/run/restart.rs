//! ebb restarting after a crash (`Crash::restart`): a new engine over what the devices kept,
//! the applications' files reopened, and every unfinished writer going on from where it was
//! (its interrupted write call, read or fsync issued again). What was in flight at the crash
//! belongs to the dead engine: its completions are dropped (each engine's device request ids
//! carry its epoch), and nothing it was asked is ever answered.

use ebb_core::{BackendId, Engine, Event, GroupId, HandleId, MapStore, Writer, WriterId};

use super::writers::WriterState;
use super::{Ev, Sim, SimError};
use crate::queue::EventQueue;

/// Where an engine's epoch goes in device request ids (the engine's own ids stay below).
const EPOCH_SHIFT: u32 = 48;

/// Handles of cp sources reopened after a restart (`HandleId(CP_SOURCE_HANDLE | writer)`).
const CP_SOURCE_HANDLE: u64 = 1 << 40;

impl Sim<'_> {
    /// Starts ebb again after the crash.
    pub(super) fn restart(&mut self) -> Result<(), SimError> {
        let power_cut = self.spec.crash.is_some_and(|c| c.power_cut);
        let mut config = self.spec.config.clone();
        config.trace = self.spec.trace_dir.is_some();
        self.engine = Engine::new(config, self.now).map_err(SimError::Config)?;
        self.maps = MapStore::new();
        self.io_epoch += 1 << EPOCH_SHIFT;
        self.ios.clear();
        self.delayed.clear();
        self.file_syncs.clear();
        self.read_started.clear();
        self.timer_at = None;
        if let Some(check) = self.check.as_deref_mut() {
            check.restarted(power_cut);
        }
        self.requeue();
        for i in 0..self.writers.len() {
            self.reopen(i);
        }
        if self.writers.iter().all(|w| w.state == WriterState::Done) {
            self.final_sync();
        }
        Ok(())
    }

    /// Keeps the queued events that outlive the engine (devices, samples, readers, writers not
    /// started yet) and schedules every other unfinished writer now.
    fn requeue(&mut self) {
        let mut kept = EventQueue::new();
        while let Some((at, ev)) = self.queue.pop() {
            let keep = match ev {
                Ev::Device(_) | Ev::Sample | Ev::ReaderStep(_) => true,
                Ev::Step(i) => self.writers[i].state == WriterState::NotStarted,
                Ev::Resume(_) | Ev::Timer | Ev::Delayed(_) | Ev::Crash => false,
            };
            if keep {
                kept.push(at, ev);
            }
        }
        self.queue = kept;
        for (i, w) in self.writers.iter().enumerate() {
            if !matches!(w.state, WriterState::Done | WriterState::NotStarted) {
                self.queue.push(self.now, Ev::Step(i));
            }
        }
    }

    /// Writer `i`'s application starts again: its open files reopened, its write call, read or
    /// fsync in progress to be issued again.
    fn reopen(&mut self, i: usize) {
        let sw = &mut self.writers[i];
        match sw.state {
            WriterState::Done => return,
            // Its files were opened when the run was set up.
            WriterState::NotStarted => {}
            _ => {
                sw.w = Writer::new(WriterId(i as u32), GroupId(i as u32));
                sw.state = WriterState::Running;
                sw.left = 0;
                sw.anon_held = 0;
            }
        }
        let backend = BackendId(sw.backend as u32);
        let mut open = Vec::new();
        if !sw.anon && sw.end > 0 {
            open.push((sw.handle, sw.inode));
        }
        if let Some((inode, handle, _)) = sw.append
            && inode != sw.inode
        {
            open.push((handle, inode));
        }
        if let Some(src) = sw.src {
            open.push((HandleId(CP_SOURCE_HANDLE | i as u64), src));
        }
        for (handle, inode) in open {
            self.engine.handle(self.now, Event::Open { handle, inode, backend }, &mut self.maps);
        }
    }
}
