//! The shared side of durability watermarks (`file/durable.rs` has the file's API): each
//! file's watchers, and what tells them when a sync or a COMMIT made more of a file durable.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};

use parking_lot::Mutex;

use super::{FileState, Shared};

/// The channels of one file's watchers (`File::durable_watch`) and the length each was last
/// sent.
#[derive(Default)]
pub(crate) struct DurableWatch {
    watchers: Mutex<Vec<(Sender<u64>, u64)>>,
}

impl DurableWatch {
    /// A new watcher, which has seen the durable length `now`.
    pub(crate) fn watch(&self, now: u64) -> Receiver<u64> {
        let (tx, rx) = channel();
        self.watchers.lock().push((tx, now));
        rx
    }
}

/// The durable byte ranges of `fs` now.
pub(crate) fn ranges(shared: &Shared, fs: &FileState) -> Vec<Range<u64>> {
    let (inode, size) = (fs.inode, fs.size.load(Ordering::Acquire));
    shared.enter(|core, maps, _| core.engine.durable_ranges(inode, size, maps))
}

/// The durable length: the first range, if it starts at 0.
pub(crate) fn prefix(ranges: &[Range<u64>]) -> u64 {
    ranges.first().filter(|r| r.start == 0).map_or(0, |r| r.end)
}

/// Something that can make more of `fs` durable happened (a sync, a COMMIT): sends its
/// durable length to the watchers it grew for.
pub(crate) fn durable_changed(shared: &Shared, fs: &FileState) {
    if fs.durable.watchers.lock().is_empty() {
        return;
    }
    let len = prefix(&ranges(shared, fs));
    fs.durable.watchers.lock().retain_mut(|(tx, sent)| {
        if len <= *sent {
            return true;
        }
        *sent = len;
        tx.send(len).is_ok()
    });
}
