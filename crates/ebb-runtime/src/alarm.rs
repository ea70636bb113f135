//! Wakers woken at a time: how the runtime's futures ([`crate::WriteAt`], the durability
//! waits) wait out a throttle pause without a runtime of their own. One thread sleeps until the
//! earliest deadline and wakes what is due; it starts with the cache and stops with it.

use std::collections::BTreeMap;
use std::task::Waker;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Deadlines and their wakers.
#[derive(Default)]
pub(crate) struct Alarms {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    due: BTreeMap<(Instant, u64), Waker>,
    seq: u64,
    stop: bool,
}

impl Alarms {
    /// Wakes `waker` at `at` (at once if `at` has passed).
    pub(crate) fn wake_at(&self, at: Instant, waker: Waker) {
        let mut s = self.state.lock();
        s.seq += 1;
        let key = (at, s.seq);
        let first = s.due.first_key_value().is_none_or(|(k, _)| key < *k);
        s.due.insert(key, waker);
        if first {
            self.cv.notify_one();
        }
    }

    /// The alarm thread's loop, until [`Alarms::stop`].
    pub(crate) fn run(&self) {
        let mut s = self.state.lock();
        loop {
            if s.stop {
                // Wake everyone left: their futures see the cache gone and finish.
                for (_, w) in std::mem::take(&mut s.due) {
                    w.wake();
                }
                return;
            }
            let now = Instant::now();
            let mut ready = Vec::new();
            while let Some(entry) = s.due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                ready.push(entry.remove());
            }
            if !ready.is_empty() {
                drop(s);
                ready.into_iter().for_each(Waker::wake);
                s = self.state.lock();
                continue;
            }
            match s.due.first_key_value().map(|(k, _)| k.0) {
                Some(at) => {
                    self.cv.wait_until(&mut s, at);
                }
                None => self.cv.wait(&mut s),
            }
        }
    }

    /// Ends [`Alarms::run`].
    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.cv.notify_all();
    }
}
