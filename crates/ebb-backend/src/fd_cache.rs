//! `FdCache`: a bound on the descriptors a [`crate::DirNamespace`] keeps open, however many
//! objects it has handed out.
//!
//! Each node of the namespace, and each file it opened for data, has a [`Slot`] that holds its
//! descriptor while it is cached. An object that can be opened again (by its file handle, see
//! [`crate::dir_namespace`]) registers its slot here when the slot gets a descriptor; when
//! more than the cache's limit are registered, the oldest ones give theirs up, and their next
//! use opens the object again. A slot that cannot give its descriptor up (an object with no
//! handle, or a removed file only its descriptor keeps) is *pinned* and never registered.
//!
//! Replacement is the clock algorithm: slots queue in the order they got their descriptor; a
//! slot used since it was last looked at goes to the back once instead of giving its
//! descriptor up. A slot that is *busy* (a buffered file with writes not yet synced, whose
//! write-back errors a new descriptor would not see) goes to the back as well. An evicted
//! descriptor a request still uses stays open until that request ends (requests hold an
//! `Arc` of it), so the descriptors open are at most the limit plus the pinned ones plus one
//! per request running.
//!
//! * **Limit.** Half the process's soft `RLIMIT_NOFILE` (the other half for the FUSE device,
//!   sockets, the descriptors requests open for a call, and the pinned ones), at least
//!   [`MIN_LIMIT`] and at most [`MAX_LIMIT`]; `ebb mount` raises the soft limit to the hard one
//!   before it opens the namespace.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The least number of descriptors cached, whatever the limit of the process (below this the
/// mount would mostly reopen objects).
const MIN_LIMIT: usize = 16;

/// The most descriptors cached: each keeps the object's inode in the kernel's memory, which
/// `--memory` does not count; 16,384 `O_PATH` descriptors cost the kernel about 20 MiB.
const MAX_LIMIT: usize = 16_384;

/// Where one object's descriptor is kept while it is open.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    fd: Mutex<Option<Arc<OwnedFd>>>,
    /// Used since the clock last passed it.
    used: AtomicBool,
    /// Never gives its descriptor up (see the module doc).
    pinned: AtomicBool,
    /// Gives its descriptor up only once this is cleared again.
    busy: AtomicBool,
}

impl Slot {
    /// A slot holding `fd`, pinned (never registered in a cache).
    pub(crate) fn pinned(fd: OwnedFd) -> Arc<Slot> {
        let mut slot = Slot::default();
        *slot.fd.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(fd));
        slot.pinned.store(true, Ordering::Release);
        Arc::new(slot)
    }

    /// The descriptor if the slot holds one now (without opening, or counting a use).
    pub(crate) fn peek(&self) -> Option<Arc<OwnedFd>> {
        self.fd.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Keeps `fd` in the slot for good (the object could not be opened again without it).
    pub(crate) fn pin(&self, fd: OwnedFd) {
        // Under the slot's lock: a `get` opening the slot again (which holds the lock) must
        // not see it pinned without its descriptor.
        let mut held = self.fd.lock().unwrap_or_else(PoisonError::into_inner);
        *held = Some(Arc::new(fd));
        self.pinned.store(true, Ordering::Release);
    }

    /// Whether the slot holds its descriptor for good.
    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned.load(Ordering::Acquire)
    }

    /// Whether the slot may not give its descriptor up for now (see the module doc).
    pub(crate) fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Release);
    }
}

/// The cache: the slots that hold a descriptor they could give up, oldest first.
#[derive(Debug)]
pub(crate) struct FdCache {
    limit: usize,
    queue: Mutex<VecDeque<Weak<Slot>>>,
}

impl FdCache {
    /// A cache keeping at most `limit` descriptors (at least [`MIN_LIMIT`]).
    pub(crate) fn new(limit: usize) -> FdCache {
        FdCache { limit: limit.max(MIN_LIMIT), queue: Mutex::new(VecDeque::new()) }
    }

    /// A cache sized for the process's current soft `RLIMIT_NOFILE` (see the module doc).
    pub(crate) fn for_process() -> FdCache {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let half = soft.map_or(MAX_LIMIT, |soft| usize::try_from(soft / 2).unwrap_or(MAX_LIMIT));
        FdCache::new(half.min(MAX_LIMIT))
    }

    /// Slots registered now (those whose descriptor was taken since included).
    #[cfg(test)]
    pub(crate) fn registered(&self) -> usize {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The descriptor of `slot`, opened with `open` if the slot holds none.
    pub(crate) fn get(
        &self,
        slot: &Arc<Slot>,
        open: impl FnOnce() -> io::Result<OwnedFd>,
    ) -> io::Result<Arc<OwnedFd>> {
        let fd = {
            let mut held = slot.fd.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(fd) = &*held {
                slot.used.store(true, Ordering::Release);
                return Ok(Arc::clone(fd));
            }
            let fd = Arc::new(open()?);
            *held = Some(Arc::clone(&fd));
            fd
        };
        self.register(slot);
        Ok(fd)
    }

    /// Puts `fd`, just opened, in the empty `slot`.
    pub(crate) fn put(&self, slot: &Arc<Slot>, fd: OwnedFd) {
        *slot.fd.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(fd));
        self.register(slot);
    }

    /// A slot that was just given its descriptor joins the queue (unless pinned); the oldest
    /// give theirs up while more than the limit are queued.
    pub(crate) fn register(&self, slot: &Arc<Slot>) {
        if slot.pinned.load(Ordering::Acquire) {
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push_back(Arc::downgrade(slot));
            // Each queued slot is passed at most twice (once to clear its use), so this ends
            // even when every slot is busy; then the queue stays above the limit for now.
            let mut budget = 2 * queue.len();
            while queue.len() > self.limit && budget > 0 {
                budget -= 1;
                let Some(weak) = queue.pop_front() else { break };
                let Some(victim) = weak.upgrade() else { continue };
                if victim.pinned.load(Ordering::Acquire) {
                    continue;
                }
                if victim.used.swap(false, Ordering::AcqRel) || victim.busy.load(Ordering::Acquire)
                {
                    queue.push_back(weak);
                    continue;
                }
                evicted.push(victim);
            }
        }
        // The slots' own locks are taken without the queue's (`get` takes them the other way).
        for victim in evicted {
            if !victim.pinned.load(Ordering::Acquire) && !victim.busy.load(Ordering::Acquire) {
                victim.fd.lock().unwrap_or_else(PoisonError::into_inner).take();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devnull() -> io::Result<OwnedFd> {
        Ok(rustix::fs::open("/dev/null", rustix::fs::OFlags::RDONLY, rustix::fs::Mode::empty())?)
    }

    #[test]
    fn at_most_the_limit_hold_a_descriptor() {
        let cache = FdCache::new(MIN_LIMIT);
        let slots: Vec<Arc<Slot>> = (0..100).map(|_| Arc::new(Slot::default())).collect();
        for slot in &slots {
            cache.get(slot, devnull).unwrap();
        }
        let open = slots.iter().filter(|slot| slot.peek().is_some()).count();
        assert_eq!(open, MIN_LIMIT);
        assert_eq!(cache.registered(), MIN_LIMIT);
        // The last one is still there; the first opens again.
        assert!(slots[99].peek().is_some());
        assert!(slots[0].peek().is_none());
        cache.get(&slots[0], devnull).unwrap();
        assert!(slots[0].peek().is_some());
    }

    #[test]
    fn pinned_and_busy_slots_keep_their_descriptor() {
        let cache = FdCache::new(MIN_LIMIT);
        let pinned = Slot::pinned(devnull().unwrap());
        let busy = Arc::new(Slot::default());
        cache.get(&busy, devnull).unwrap();
        busy.set_busy(true);
        for _ in 0..100 {
            cache.get(&Arc::new(Slot::default()), devnull).unwrap();
        }
        assert!(pinned.peek().is_some());
        assert!(busy.peek().is_some());
        busy.set_busy(false);
        let kept: Vec<Arc<Slot>> = (0..100).map(|_| Arc::new(Slot::default())).collect();
        for slot in &kept {
            cache.get(slot, devnull).unwrap();
        }
        assert!(busy.peek().is_none(), "a slot no longer busy gives its descriptor up");
    }
}
