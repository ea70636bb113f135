//! Durability watermarks: how much of a file a crash would keep, as the engine tracks it
//! (`ebb_core::Engine::durable_ranges`): pages written by a stable write and synced since, or
//! written unstable and committed. A log acknowledges a record once it is durable, without an
//! fsync of its own when another sync already covered it.
//!
//! What moves the watermark: on a two-phase backend (NFS) background writeback does, since
//! each batch of writes is committed; on a one-phase backend (a directory, S3) a sync of the
//! file does (`File::fsync`, `File::wait_durable`, `Ebb::sync`, a close on a backend that
//! flushes on close), because until then the data may sit in the device's volatile cache or
//! an unfinished upload.

use std::io;
use std::ops::Range;
use std::sync::mpsc::Receiver;

use super::File;
use crate::shared::durable::{prefix, ranges};

impl File {
    /// How many bytes from the start of the file a crash would keep: every byte below it was
    /// written and synced (or committed, on a two-phase backend) since it was last changed, or
    /// never changed through this cache. Never more than [`File::len`].
    ///
    /// ```
    /// # let ebb = ebb_runtime::Builder::new().memory(64 << 20)
    /// #     .backend("mem", std::sync::Arc::new(ebb_backend::MemBackend::new())).build()?;
    /// let wal = ebb.open("wal", ebb_backend::OpenOptions { create: true, truncate: true })?;
    /// wal.write_at(b"record 1\n", 0)?;
    /// assert_eq!(wal.durable_len(), 0); // in the cache only
    /// wal.wait_durable(9)?; // writes back and syncs what is not durable yet
    /// assert_eq!(wal.durable_len(), 9);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn durable_len(&self) -> u64 {
        prefix(&self.durable_ranges())
    }

    /// The byte ranges of the file a crash would keep (see [`File::durable_len`]), in order.
    pub fn durable_ranges(&self) -> Vec<Range<u64>> {
        ranges(&self.ebb.inner.shared, &self.fs)
    }

    /// Returns once the first `offset` bytes are durable ([`File::durable_len`]): at once if
    /// they are, else after writing back and syncing this file (as [`File::fsync`] does, whose
    /// errors it returns). Concurrent callers share syncs: one that finds its bytes covered by
    /// another's sync returns without one of its own. `InvalidInput` for an offset past the
    /// end of the file.
    pub fn wait_durable(&self, offset: u64) -> io::Result<()> {
        loop {
            if offset > self.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("offset {offset} is past the end of the file ({} bytes)", self.len()),
                ));
            }
            if self.durable_len() >= offset {
                return Ok(());
            }
            // Another caller's sync may be about to cover it: wait for it first.
            drop(self.fs.sync_lock.lock());
            if self.durable_len() >= offset {
                return Ok(());
            }
            self.fsync()?;
        }
    }

    /// A channel that receives this file's durable length each time it grows (after a sync
    /// or a COMMIT that made more of it durable). It ends when the cache stops.
    ///
    /// ```
    /// # let ebb = ebb_runtime::Builder::new().memory(64 << 20)
    /// #     .backend("mem", std::sync::Arc::new(ebb_backend::MemBackend::new())).build()?;
    /// let wal = ebb.open("wal", ebb_backend::OpenOptions { create: true, truncate: true })?;
    /// let durable = wal.durable_watch();
    /// wal.write_at(b"record 1\n", 0)?;
    /// wal.fsync()?;
    /// assert_eq!(durable.recv().unwrap(), 9); // acknowledge the record's client here
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn durable_watch(&self) -> Receiver<u64> {
        self.fs.durable.watch(self.durable_len())
    }
}
