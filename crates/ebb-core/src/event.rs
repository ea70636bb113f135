//! The vocabulary that crosses the core boundary: events in, actions out, verdicts for writers.
//!
//! Drivers hand the engine [`Event`]s stamped with `now` and drain [`Action`]s. Writers take a
//! faster path: they dirty pages through [`crate::writer::write_pages`] on their own
//! [`crate::Writer`] state and the file's [`crate::PageMap`], and enter the engine only for a
//! throttle check, which answers with a [`Verdict`].

use std::fmt;

use crate::ids::{BackendId, HandleId, InodeId, IoId, RequestId, WriterId};
use crate::time::{Duration, Instant};

/// An operating error from a backend, as the OS reported it (a Linux errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoError {
    /// The errno value (e.g. 5 for EIO, 28 for ENOSPC).
    pub errno: i32,
}

/// Linux errno values the core classifies.
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// No such file or directory (a network backend's file or bucket removed underneath).
    pub const ENOENT: i32 = 2;
    /// Interrupted (the caller's signal: the call was given up, the server not asked to the end).
    pub const EINTR: i32 = 4;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Bad file descriptor: a read of a file the engine does not know.
    pub const EBADF: i32 = 9;
    /// Try again (a server asking the client to back off: NFS3ERR_JUKEBOX, S3 SlowDown).
    pub const EAGAIN: i32 = 11;
    /// Out of memory.
    pub const ENOMEM: i32 = 12;
    /// Permission denied (a server refusing the write: NFS3ERR_ACCES, S3 AccessDenied).
    pub const EACCES: i32 = 13;
    /// Too many open files in the system.
    pub const ENFILE: i32 = 23;
    /// Too many open files (the process's limit).
    pub const EMFILE: i32 = 24;
    /// File too large.
    pub const EFBIG: i32 = 27;
    /// No space left on device.
    pub const ENOSPC: i32 = 28;
    /// Read-only file system.
    pub const EROFS: i32 = 30;
    /// Broken pipe (the connection to a server closed under a request).
    pub const EPIPE: i32 = 32;
    /// Network is down.
    pub const ENETDOWN: i32 = 100;
    /// Network is unreachable.
    pub const ENETUNREACH: i32 = 101;
    /// Connection aborted.
    pub const ECONNABORTED: i32 = 103;
    /// Connection reset by peer.
    pub const ECONNRESET: i32 = 104;
    /// Transport endpoint is not connected.
    pub const ENOTCONN: i32 = 107;
    /// Connection timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Connection refused.
    pub const ECONNREFUSED: i32 = 111;
    /// Host is down.
    pub const EHOSTDOWN: i32 = 112;
    /// No route to host.
    pub const EHOSTUNREACH: i32 = 113;
    /// Stale file handle.
    pub const ESTALE: i32 = 116;
    /// Quota exceeded.
    pub const EDQUOT: i32 = 122;
    /// Operation canceled.
    pub const ECANCELED: i32 = 125;
}

/// What the engine does with a failed write (the write-error policy, see `engine`'s module
/// doc): every class keeps the pages; they differ in when the write is tried again and when an
/// application hears of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The device or server failed this write (EIO and everything not named below): the pages
    /// stay dirty and are retried with backoff, and the error is reported once to every handle
    /// of the file at its next fsync or close.
    Retry,
    /// The backend could not be reached (a refused, reset or timed-out connection, a server
    /// asking to back off): nothing is known to be wrong with the data, so the pages are
    /// retried with backoff and writers are throttled as usual, but no error is reported until
    /// the backend has been unreachable for its `retry_timeout_secs`; fsync waits meanwhile.
    Outage,
    /// The write will fail the same way until someone acts (ENOSPC, EROFS, EDQUOT, EFBIG,
    /// ESTALE, EACCES, EPERM, ENOENT): the pages are held (not counted by throttling, retried
    /// with a longer backoff so that freed space drains them), the error is reported once per
    /// handle, and a writer that cannot get memory because held pages fill the cache fails with
    /// it instead of waiting.
    Hold,
}

impl IoError {
    /// The error's class (see [`ErrorClass`]).
    pub fn class(self) -> ErrorClass {
        match self.errno {
            errno::ENOSPC
            | errno::EROFS
            | errno::EDQUOT
            | errno::EFBIG
            | errno::ESTALE
            | errno::EACCES
            | errno::EPERM
            | errno::ENOENT => ErrorClass::Hold,
            errno::EAGAIN
            | errno::EPIPE
            | errno::ENETDOWN
            | errno::ENETUNREACH
            | errno::ECONNABORTED
            | errno::ECONNRESET
            | errno::ENOTCONN
            | errno::ETIMEDOUT
            | errno::ECONNREFUSED
            | errno::EHOSTDOWN
            | errno::EHOSTUNREACH => ErrorClass::Outage,
            _ => ErrorClass::Retry,
        }
    }

    /// Whether retrying later may succeed without anyone acting: every class but
    /// [`ErrorClass::Hold`].
    pub fn may_pass(self) -> bool {
        self.class() != ErrorClass::Hold
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "errno {}", self.errno)
    }
}

/// How a backend accepted a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stability {
    /// Durable.
    Stable,
    /// Accepted by a two-phase backend under this write verifier; a COMMIT makes it durable.
    Unstable {
        /// The server's write verifier (changes when the server restarts).
        verifier: u64,
    },
}

/// Why an IO is issued; selects its admission limit (wbt) and priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IoClass {
    /// Background, periodic or legacy-writer writeback.
    Background,
    /// Integrity writeback for fsync or sync.
    Sync,
    /// Writeback requested by reclaim.
    Reclaim,
    /// A read.
    Read,
}

/// Who issued a write; the legacy policy makes writers issue their own writeback.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Issuer {
    /// The backend's flusher.
    Flusher,
    /// A throttled writer doing writeback itself (legacy policy).
    Writer(WriterId),
    /// An fsync.
    Fsync(RequestId),
    /// Reclaim writing a single page (legacy reclaim).
    Reclaim,
}

/// An input to the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A handle of `inode`, stored on `backend`, was opened.
    Open {
        /// The new handle.
        handle: HandleId,
        /// Its file.
        inode: InodeId,
        /// Where the file lives.
        backend: BackendId,
    },
    /// A handle is closed; answered by [`Action::CloseDone`] with any write error not yet
    /// reported to this handle.
    Close {
        /// The handle.
        handle: HandleId,
        /// Names the answer.
        request: RequestId,
    },
    /// Make everything written through this handle's file durable; answered by
    /// [`Action::FsyncDone`].
    Fsync {
        /// The handle.
        handle: HandleId,
        /// Names the answer.
        request: RequestId,
    },
    /// Make everything dirty now durable; answered by [`Action::SyncDone`].
    Sync {
        /// Names the answer.
        request: RequestId,
    },
    /// Read pages `[first_page, first_page + pages)` of `inode` into the cache; answered by
    /// [`Action::ReadDone`] once they are all resident.
    Read {
        /// The file.
        inode: InodeId,
        /// First page.
        first_page: u64,
        /// Pages.
        pages: u64,
        /// Names the answer.
        request: RequestId,
    },
    /// The backend file of `inode` was synced (a successful `fsync` of it, an S3 upload's
    /// completion) after the driver took `mark` from [`crate::Engine::durable_mark`]: the pages
    /// stable writes cleaned before then are durable.
    FileSynced {
        /// The file.
        inode: InodeId,
        /// The mark taken before the sync began.
        mark: u64,
    },
    /// A sync of the backend file of `inode` failed (an fsync's, a close's, or the one an
    /// [`Action::SyncFile`] asked for). On a `flush_on_close` backend the engine then owes the
    /// file a commit (`recommit`).
    FileSyncFailed {
        /// The file.
        inode: InodeId,
        /// How it failed.
        error: IoError,
    },
    /// Drop the file's pages at and after `first_page` (truncate or unlink).
    Truncate {
        /// The file.
        inode: InodeId,
        /// First page dropped.
        first_page: u64,
    },
    /// Someone other than the cache changed the backend's file of `inode` (found at an open,
    /// close-to-open): its clean pages may hold the bytes from before, so they leave the cache,
    /// and reads in flight keep none of their pages; pages holding data the backend lacks
    /// (dirty, held, under writeback, unstable) stay: the cache's data wins.
    BackendChanged {
        /// The file.
        inode: InodeId,
    },
    /// The driver begins changing `pages` pages of `inode` from `first_page` in the backend
    /// behind the cache (a punched or zeroed range, a trimmed end): until the matching
    /// [`Event::InvalidateDone`], no page of the range a read brings in is installed, nor one
    /// a read in flight now brings (it may hold the bytes from before the change).
    Invalidate {
        /// The file.
        inode: InodeId,
        /// First page of the range.
        first_page: u64,
        /// Pages in the range (`u64::MAX - first_page` for everything from it on).
        pages: u64,
    },
    /// The backend change an [`Event::Invalidate`] of the same range announced is done.
    InvalidateDone {
        /// The file.
        inode: InodeId,
        /// First page of the range, as announced.
        first_page: u64,
        /// Pages in the range, as announced.
        pages: u64,
    },
    /// A write the engine asked for finished.
    WriteDone {
        /// The IO.
        io: IoId,
        /// How it ended.
        result: Result<Stability, IoError>,
    },
    /// A COMMIT the engine asked for finished, with the server's verifier.
    CommitDone {
        /// The IO.
        io: IoId,
        /// The verifier, or the error.
        result: Result<u64, IoError>,
    },
    /// A read the engine asked for finished.
    ReadDone {
        /// The IO.
        io: IoId,
        /// How it ended.
        result: Result<(), IoError>,
    },
    /// The driver issued a read without the cache (O_DIRECT); feeds writeback throttling
    /// (a read stuck behind writes counts even before it completes).
    DirectReadStart {
        /// The device.
        backend: BackendId,
        /// The driver's identity for this read.
        id: u64,
    },
    /// A read the driver performed without the cache completed after `latency`.
    DirectRead {
        /// The device.
        backend: BackendId,
        /// The identity given at [`Event::DirectReadStart`].
        id: u64,
        /// Issue to completion.
        latency: Duration,
    },
    /// Memory outside the cache (anonymous memory) grew by `pages`.
    AnonAlloc {
        /// Pages.
        pages: u64,
    },
    /// Memory outside the cache shrank by `pages`.
    AnonFree {
        /// Pages.
        pages: u64,
    },
    /// The instant returned by `poll_timeout` has come.
    Timer,
}

/// An output of the engine, for the driver to carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write the pages of `runs` of `inode` (all under writeback) to `backend` as one write,
    /// then report [`Event::WriteDone`].
    Write {
        /// Names the completion.
        io: IoId,
        /// Where.
        backend: BackendId,
        /// The file.
        inode: InodeId,
        /// The pages: ascending, disjoint runs, never empty. One run, except on a backend with
        /// write granules, where a granule's scattered dirty pages go out as one write of
        /// several runs (`flusher::granules`): the backend writes the granule once, filling
        /// the pages between the runs from what it holds, and a driver of a backend without
        /// granules writes the runs one after another.
        runs: Vec<crate::pagemap::Run>,
        /// Why.
        class: IoClass,
        /// Who asked.
        issuer: Issuer,
    },
    /// Commit every unstable write of `inode` on a two-phase backend, then report
    /// [`Event::CommitDone`].
    Commit {
        /// Names the completion.
        io: IoId,
        /// Where.
        backend: BackendId,
        /// The file.
        inode: InodeId,
        /// Unstable pages it covers.
        pages: u64,
    },
    /// Sync the backend file of `inode`, as after an fsync (on a `flush_on_close` backend its
    /// commit: S3's CompleteMultipartUpload): take [`crate::Engine::durable_mark`] first,
    /// then report [`Event::FileSynced`], or [`Event::FileSyncFailed`]. The commit the engine
    /// owes a file whose close failed, asked for once the file is written back (`recommit`).
    /// A driver that no longer has the file (deleted) reports it synced.
    SyncFile {
        /// Where.
        backend: BackendId,
        /// The file.
        inode: InodeId,
    },
    /// Read pages into frames the engine assigned, then report [`Event::ReadDone`].
    Read {
        /// Names the completion.
        io: IoId,
        /// Where.
        backend: BackendId,
        /// The file.
        inode: InodeId,
        /// First page.
        first_page: u64,
        /// Pages.
        pages: u64,
    },
    /// A writer that got [`crate::WriterNext::Wait`] may go on: it steps with
    /// [`crate::WriterInput::Continue`] ([`crate::Engine::writer_step`]).
    Resume {
        /// The writer.
        writer: WriterId,
    },
    /// A writer waits for memory while other writers hold frames in their reserves: give
    /// back the reserve of every writer that is not in the middle of a write, in one call to
    /// [`crate::Engine::return_reserves`], and have each writer that was writes give its own
    /// back when its write ends. (The kernel drains every CPU's page lists to the allocator
    /// when an allocation fails, `drain_all_pages`.) A reserve is at most
    /// [`crate::writer::FRAME_BATCH`] frames, refilled at the writer's next throttle check.
    ReturnReserves,
    /// The answer to [`Event::Fsync`].
    FsyncDone {
        /// The request.
        request: RequestId,
        /// Ok, or the first write error not yet reported to this handle.
        result: Result<(), IoError>,
    },
    /// The answer to [`Event::Sync`].
    SyncDone {
        /// The request.
        request: RequestId,
        /// Ok, or a write error seen during the sync.
        result: Result<(), IoError>,
    },
    /// The answer to [`Event::Close`].
    CloseDone {
        /// The request.
        request: RequestId,
        /// Ok, or a write error not yet reported to this handle.
        result: Result<(), IoError>,
    },
    /// The answer to [`Event::Read`]: the pages are resident (or the read failed).
    ReadDone {
        /// The request.
        request: RequestId,
        /// Ok, or the error.
        result: Result<(), IoError>,
    },
    /// The engine forgot `inode` (no handle open, nothing cached, in flight or unreported):
    /// the driver drops what it keeps of the file (its page map, its backend file). Opening
    /// the file again is a new [`Event::Open`].
    Forget {
        /// The file.
        inode: InodeId,
    },
}

/// What a throttle call decided (inside the engine; drivers get it as a
/// [`crate::WriterNext`] from [`crate::Engine::writer_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on writing. `stalled` is the time spent in this throttle call, from its first
    /// check to now (the kernel trace's `paused`, plus any pause just finished).
    Proceed {
        /// Time spent throttled in this call.
        stalled: Duration,
        /// The call went past the freerun point (it was a throttling decision, even if it
        /// ended without a pause); false for checks that found the writer in freerun.
        throttled: bool,
    },
    /// Sleep until `until`, then continue the call (`Engine::throttle_continue`).
    Sleep {
        /// Wake-up time.
        until: Instant,
    },
    /// Wait for [`Action::Resume`] (IO the writer issued, a page under writeback, memory),
    /// then continue the call (`Engine::throttle_continue`).
    Wait,
    /// The write cannot go on: the cache is full of pages held by `error` (the backend is
    /// full or read-only) so no memory will come, or the writer's backend has been unreachable
    /// past its `retry_timeout_secs` (`error` is EIO). The writer's `write` fails with `error`;
    /// what it dirtied before stays cached. The throttle call has ended.
    Fail {
        /// The errno the write fails with.
        error: IoError,
    },
}
