//! Truncate: the pages past the new end leave the cache (the page map frees those under
//! writeback when their write ends), reads in flight are kept from bringing them back, and a
//! file left without held pages is no longer retried (truncating is how a user gives up on
//! data a permanent error keeps).

use super::{Counters, Engine, IoKind, IoRecord, PageMaps};
use crate::ids::{InodeId, IoId};

impl Engine {
    pub(super) fn truncate<M: PageMaps>(&mut self, inode: InodeId, first_page: u64, maps: &mut M) {
        if !self.inodes.contains_key(&inode) {
            return;
        }
        let out = maps.with(inode, |m| m.truncate(first_page));
        // Reads in flight past the cut would bring back bytes the truncate removed.
        let reading: Vec<IoId> = self.inodes[&inode]
            .reading
            .values()
            .filter(|&&(end, _)| end > first_page)
            .map(|&(_, io)| io)
            .collect();
        for io in reading {
            if let Some(IoRecord { kind: IoKind::Read { keep_below, .. }, .. }) =
                self.ios.get_mut(&io)
            {
                *keep_below = (*keep_below).min(first_page);
            }
        }
        for &frame in &out.freed_frames {
            self.mem.unlink(frame);
            self.mem.release(frame);
        }
        let freed = out.freed_frames.len() as i64;
        self.account(
            inode,
            Counters {
                dirty: -(out.dirty as i64),
                held: -(out.held as i64),
                unstable: -(out.unstable as i64),
                resident: -freed,
                ..Counters::default()
            },
        );
        // Truncating away held pages is how a user gives up on data a permanent error keeps.
        let (dirty, held) = maps.with(inode, |m| (m.counts().dirty, m.counts().held));
        let before = self.retry_deadlines(inode);
        let meta = self.inode_mut(inode);
        if dirty == 0 {
            meta.retry_at = None;
        }
        if held == 0 {
            meta.hold_retry_at = None;
        }
        self.reindex_retry(inode, before);
    }
}
