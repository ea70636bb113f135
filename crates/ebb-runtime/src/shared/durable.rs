//! The shared side of durability watermarks (`file/durable.rs` has the file's API): each
//! file's watchers, and what tells them when a sync or a COMMIT made more of a file durable;
//! and the backend sync itself (`sync_backend_file`), which fsync, close, sync and the
//! commit after a failed close run.

use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};

use ebb_core::Event;
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

/// Trims the backend file to the logical size and syncs it if it was written since, then
/// tells the engine what the sync made durable (`Event::FileSynced`), or that it failed
/// (`Event::FileSyncFailed`: on a flush-on-close backend the engine then owes the file a
/// commit, which it asks for with `Action::SyncFile` once the file is written back).
pub(crate) fn sync_backend_file(shared: &Shared, fs: &FileState) -> io::Result<()> {
    let result = trim_and_sync(shared, fs);
    if let Err(e) = &result {
        let (inode, error) = (fs.inode, super::to_io_error(e));
        shared.enter(|core, maps, now| {
            core.engine.handle(now, Event::FileSyncFailed { inode, error }, maps)
        });
    }
    result
}

fn trim_and_sync(shared: &Shared, fs: &FileState) -> io::Result<()> {
    trim_backend_file(fs)?;
    // One sync at a time: a sync that finds nothing written since the last one knows that one
    // has ended, so what completed before its mark is durable either way (an IO thread sets
    // `needs_sync` before it reports the write to the engine).
    let _s = fs.sync_lock.lock();
    let inode = fs.inode;
    let mark = shared.enter(|core, _, _| core.engine.durable_mark(inode));
    if fs.needs_sync.swap(false, Ordering::AcqRel)
        && let Err(e) = fs.file.sync()
    {
        fs.needs_sync.store(true, Ordering::Release);
        return Err(e);
    }
    shared
        .enter(|core, maps, now| core.engine.handle(now, Event::FileSynced { inode, mark }, maps));
    drop(_s);
    durable_changed(shared, fs);
    Ok(())
}

/// Trims the backend file to the logical size where a write-back of ebb's left it longer: a
/// write-back writes the last page whole and trims right after; if that trim failed, the
/// backend's file is still up to the rest of that page longer (`FileState::padded`), which
/// this cuts. Any other excess was made by someone else (another NFS client, a process in the
/// backing directory) after ebb last wrote the file (a truncate through ebb sets the backend's
/// size itself), and a trim would cut their data, whether it ends past ebb's last page or
/// inside it (issue 33: another client's growth was cut by the close that dropped the stale
/// cache): it is left as it is.
pub(crate) fn trim_backend_file(fs: &FileState) -> io::Result<()> {
    // Exclusive: no write of the file lands between the look at the sizes and the trim.
    let _g = fs.size_lock.write();
    if !fs.padded.load(Ordering::Acquire) {
        return Ok(());
    }
    let size = fs.size.load(Ordering::Acquire);
    let backend = fs.file.size()?;
    if backend > size && backend <= size.next_multiple_of(crate::PAGE_SIZE) {
        fs.file.set_size(size)?;
    }
    fs.padded.store(false, Ordering::Release);
    Ok(())
}
