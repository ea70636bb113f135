//! The FUSE filesystem: a [`Namespace`] (names, directories, attributes) whose file data goes
//! through a [`DataPath`] (ebb's cache).
//!
//! # Nodes
//!
//! Every node the kernel knows (looked up and not yet forgotten) holds the namespace's
//! reference to its object ([`nodes`]); for a local directory that is the object's file handle
//! and an `O_PATH` descriptor the namespace may close and reopen by handle (so a mount holds a
//! bounded number of descriptors however many files it has seen), so a rename, even of a
//! parent directory, cannot send an operation to the wrong object. Node ids, shown as
//! `st_ino`, are the namespace's `ino` (the root is 1).
//!
//! # File data
//!
//! Each open of a regular file attaches a handle to the data path, with one key per file (all
//! handles of a file share its cached pages; files are told apart by `ino` and `generation`).
//! Besides the handles, the first open also creates an *anchor* handle kept after the last
//! close, because ebb still holds the file's dirty pages then: `getattr` reports the anchor's
//! size (ebb's, not the backend's stale one) and `truncate` goes through it. An anchor is
//! dropped when its file's last name is removed and nothing has it open, or when more than the
//! anchor limit (`Mount::start_keeping`, default [`ANCHOR_LIMIT`]) exist and the file is
//! closed: then only its key is remembered, the runtime decides when the file's pages are
//! written and forgotten, and `getattr`/`truncate` attach a handle for the call ([`files`]).
//! Keys are ours (a counter), so a new file that reuses a removed file's number never meets
//! the old file's cached pages. The mtime and ctime of files written through the cache are
//! kept by ebb ([`crate::times`]).
//!
//! A file open through the mount whose last name is removed (unlink, or a rename onto it)
//! stays usable through its descriptors. A local directory's node keeps it alive; an NFS
//! server destroys a removed file at once, and a removed S3 object's open files cannot write,
//! so there the name is renamed to a hidden `.ebb-removed-*` name in the same directory
//! instead, removed at the last close, as the kernel's NFS client does with its `.nfs*` names.
//!
//! The kernel keeps no copy of the data: files are opened with `FOPEN_DIRECT_IO`, so every
//! `read(2)` and `write(2)` reaches us. Shared mappings: the kernel refuses `MAP_SHARED` on
//! direct-IO files with `ENODEV` unless the filesystem asks, at init, for
//! `FUSE_DIRECT_IO_ALLOW_MMAP` (kernels since 6.6), which ebb does when the kernel offers it:
//! the mapped pages are then the kernel's, read in with READ requests and written back as
//! WRITE requests into ebb's cache (programs such as SQLite in WAL mode need this). Where the
//! kernel does not offer it, init logs it and shared mappings fail with `ENODEV` (docs/mmap.md).
//!
//! # Threads
//!
//! fuser runs [`LOOP_THREADS`] request loops. What cannot wait is answered on the loop that
//! read the request: a read whose pages the cache holds (a copy), a write the throttle lets
//! through (`write_task`), `forget`, `releasedir`, a flush of a caller being killed, and the
//! flush of a file whose close writes nothing back (a local directory's: an error not yet
//! seen is reported, under the engine's lock) and its release. On a local directory, whose
//! calls wait for the disk but never for a server, one loop at a time (`io_ops::Inline`) also
//! serves an `O_DIRECT` read of a file (a `pread`) and the namespace's requests (lookups,
//! attributes, opens, creates, unlinks, renames, ...): a small file's create, write, close,
//! stat and unlink are then answered without a hand-off, where they took six. The rest
//! is handed to a pool thread ([`crate::pool`]): requests that may wait on the backend's
//! namespace (over NFS and S3, and `fsyncdir` and `rmdir` everywhere) to the guard's pool
//! ([`outage`]), other reads to the read pool, and writes that must wait, `fsync`, `flush`,
//! `release` and `fallocate` to the write pool, so a writer that ebb throttles holds only its
//! own request: readers and metadata continue. Each pool bounds the requests it holds
//! (running plus queued); when a pool is full the loop that received the request waits for
//! room. Each hand-off costs a thread's wake-up and two context switches, counted with the
//! requests by kind in `ebb stat`'s `fuse` ([`counts`]; docs/fuse-requests.md).
//!
//! # Stopping
//!
//! [`Files::stop_writes`] makes every operation that would change data or names fail with
//! `EROFS`, so a drain finishes.

mod convert;
mod counts;
mod dispatch;
mod files;
mod inner;
mod io_ops;
mod nodes;
mod ops;
pub(crate) mod outage;
mod write_task;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, SystemTime};

use ebb_backend::{DirEntries, DirEntry, Namespace, SetAttr};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

pub(crate) use self::convert::errno_of;
use self::convert::{
    credentials, file_type, reply_attr, reply_empty, reply_xattr, set_time, to_errno,
};
use self::counts::Op;
pub(crate) use self::files::Files;
use self::nodes::Nodes;
use self::outage::Guard;
use crate::data::DataPath;
use crate::pool::{DataBufs, Pool};

/// Name of the extended attribute of the mount's root that holds the live stats (JSON).
pub const STATS_XATTR: &str = "user.ebb.stats";

/// How long the kernel may cache names and attributes. We are the only writer of the
/// namespace while mounted, and every size change passes through us, so a short cache is safe;
/// it saves a `getattr` round trip per `stat(2)`.
const TTL: Duration = Duration::from_secs(1);

/// fuser request loops (what cannot wait is answered on them: the module doc).
pub(crate) const LOOP_THREADS: usize = 2;
/// Threads serving reads; each holds one request.
const READ_THREADS: usize = 8;
/// Threads serving writes, fsync and release (a throttled write waits parked, holding none:
/// `write_task`).
const WRITE_THREADS: usize = 16;
/// Requests a pool holds beyond its running ones before the request loop waits. Each queued
/// write holds its data (at most `MAX_WRITE`).
const POOL_QUEUE: usize = 64;
/// Largest write request the kernel sends (256 KiB). A write served on a pool thread holds a
/// copy of its data until it is in the cache, and a throttled writer's request waits parked
/// with its copy (`write_task`; one served on its request loop needs none): with 64 writers throttled at once, 1 MiB requests held 64 MiB
/// beside the cache (a 256 MiB mount peaked at 313-325 MiB); 256 KiB ones hold 16 MiB.
pub(crate) const MAX_WRITE: u32 = 256 << 10;
/// Copies of write requests ([`DataBufs`]) a mount of `memory` bytes holds at most, in
/// `MAX_WRITE` copies (their bytes bound the smaller copies): an eighth of it, at least 2, at
/// most one per write thread, queued write and request loop (82). Without a budget, the most.
pub(crate) fn kept_request_copies(memory: Option<u64>) -> usize {
    let most = WRITE_THREADS + POOL_QUEUE + LOOP_THREADS;
    memory.map_or(most, |memory| (memory / 8 / u64::from(MAX_WRITE)).clamp(2, most as u64) as usize)
}

/// The bytes of a mount's `memory` set aside for its kept copies of write requests.
pub(crate) fn request_copy_bytes(memory: Option<u64>) -> u64 {
    kept_request_copies(memory) as u64 * u64::from(MAX_WRITE)
}
/// Anchors (cached files kept after their last close) above which a closing file's anchor is
/// synced and dropped instead of kept.
pub(crate) const ANCHOR_LIMIT: usize = 4096;

/// How often the regular files the kernel knows are checked for deletion by someone else (for
/// namespaces whose nodes hold storage: [`Namespace::nodes_hold_storage`]).
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// An open directory: the entries read so far ("." and ".." first) and the rest to read.
struct OpenDir {
    read: Vec<(u64, FileType, std::ffi::OsString)>,
    rest: Option<DirEntries>,
}

/// The filesystem's state, shared with the pool threads.
pub(crate) struct Inner<N: Namespace> {
    ns: Arc<N>,
    nodes: Nodes<N>,
    files: Arc<Files>,
    dirs: Mutex<HashMap<u64, Arc<Mutex<OpenDir>>>>,
    /// The root's attributes as last read (answered while the backend cannot be reached).
    root_attr: Mutex<Option<FileAttr>>,
}

/// The filesystem handed to fuser.
pub(crate) struct EbbFs<N: Namespace> {
    inner: Arc<Inner<N>>,
    reads: Arc<Pool>,
    writes: Arc<Pool>,
    /// Copies of write requests' data (one per write running, queued on `writes` or parked),
    /// within the budget's part for them.
    write_data: Arc<DataBufs>,
    /// Runs the requests that may wait on the backend, killable ([`outage`]).
    guard: Arc<Guard>,
    /// The namespace is a local directory: its calls and its files' reads never wait for a
    /// server.
    local: bool,
    /// Request loops serving a request themselves that waits for the disk (`io_ops::Inline`).
    inline: Arc<AtomicUsize>,
    /// Whether INIT asks for FUSE over io_uring, and whether the kernel offered it.
    uring: Arc<crate::uring::Negotiation>,
}

impl<N: Namespace> EbbFs<N> {
    /// The filesystem over `ns` with the data path `data` (`keep_times`: it writes back
    /// later than the writes, see [`crate::times`]), and its file state for the mount.
    pub(crate) fn new(
        ns: Arc<N>,
        data: Arc<dyn DataPath>,
        keep_times: bool,
        anchor_limit: usize,
        kept_copies: usize,
        uring: Arc<crate::uring::Negotiation>,
    ) -> io::Result<(EbbFs<N>, Arc<Files>)> {
        let (root, attr) = ns
            .root()
            .map_err(|error| io::Error::new(error.kind(), format!("{}: {error}", ns.describe())))?;
        let local = ns.local_directory().is_some();
        let files = Arc::new(Files::new(Arc::clone(&data), keep_times, anchor_limit));
        let guard = Guard::new(data, Arc::clone(&files.counts.meta_pool))?;
        let inner = Arc::new(Inner {
            ns,
            nodes: Nodes::new(root.clone(), &attr),
            files: Arc::clone(&files),
            dirs: Mutex::new(HashMap::new()),
            root_attr: Mutex::new(None),
        });
        // Known from the start: a permission check on the root during an outage that begins
        // before anything asked for the root's attributes (a create in it) would get EIO.
        *inner.root_attr.lock() = Some(inner.file_attr(INodeNo::ROOT.0, &root, &attr));
        if inner.ns.nodes_hold_storage() {
            let weak = Arc::downgrade(&inner);
            std::thread::Builder::new().name("ebb-fuse-sweep".to_owned()).spawn(move || {
                while let Some(inner) = weak.upgrade() {
                    inner.release_deleted_files();
                    drop(inner);
                    std::thread::sleep(SWEEP_EVERY);
                }
            })?;
        }
        let fs = EbbFs {
            inner,
            reads: Arc::new(Pool::new(
                "ebb-fuse-read",
                READ_THREADS,
                POOL_QUEUE,
                Arc::clone(&files.counts.read_pool),
            )?),
            writes: Arc::new(Pool::new(
                "ebb-fuse-write",
                WRITE_THREADS,
                POOL_QUEUE,
                Arc::clone(&files.counts.write_pool),
            )?),
            write_data: Arc::clone(files.counts.copies.get_or_init(|| {
                DataBufs::new(MAX_WRITE as usize, kept_copies * MAX_WRITE as usize)
            })),
            guard,
            local,
            inline: Arc::new(AtomicUsize::new(0)),
            uring,
        };
        Ok((fs, files))
    }

    /// A second handle on the same filesystem (state, pools, counts), for the io_uring
    /// queues' threads: fuser owns the first.
    pub(crate) fn share(&self) -> EbbFs<N> {
        EbbFs {
            inner: Arc::clone(&self.inner),
            reads: Arc::clone(&self.reads),
            writes: Arc::clone(&self.writes),
            write_data: Arc::clone(&self.write_data),
            guard: Arc::clone(&self.guard),
            local: self.local,
            inline: Arc::clone(&self.inline),
            uring: Arc::clone(&self.uring),
        }
    }
}

impl<N: Namespace> Filesystem for EbbFs<N> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Best effort: the kernel may offer less.
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // Shared mappings of direct-IO files (module doc); refused by older kernels.
        if config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_err() {
            eprintln!(
                "ebb: this kernel does not offer FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6 and later \
                 do): a shared mmap of any file on the mount fails with ENODEV"
            );
        }
        // FUSE over io_uring, if the mount made its rings (`crate::uring`).
        self.uring.at_init(config);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.inner.files.counts.request(Op::Lookup);
        let name = name.to_owned();
        self.entry(req, reply, move |inner| inner.lookup(parent, &name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inner.files.counts.request(Op::Forget);
        self.inner.nodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.inner.files.counts.request(Op::Getattr);
        if ino == INodeNo::ROOT {
            // The root's attributes, asked for at every permission check on it (`ebb stat`'s
            // getxattr included), are tried once: during an outage the last known ones, so
            // the mount's stats stay readable.
            let inner = Arc::clone(&self.inner);
            // Past the deadline of a server that never answers, no try: the watcher would
            // answer it EIO, and `ebb stat` would fail.
            let known = *inner.root_attr.lock();
            if let Some(known) = known
                && self.guard.clock.unreachable()
            {
                return reply.attr(&TTL, &known);
            }
            let op = move |_: &dyn Fn() -> bool| {
                let result = inner.getattr(ino);
                let mut known = inner.root_attr.lock();
                match result {
                    Ok(attr) => Ok(*known.insert(attr)),
                    Err(errno) if outage::is_outage(errno) => known.ok_or(Errno::EIO),
                    Err(errno) => Err(errno),
                }
            };
            let answer = |reply: Option<ReplyAttr>, result| {
                if let Some(reply) = reply {
                    reply_attr(reply, result);
                }
            };
            return self.guard.run(req.pid(), reply, op, answer);
        }
        self.simple(req, reply, move |inner| inner.getattr(ino), reply_attr);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.inner.files.counts.request(Op::Setattr);
        let set = SetAttr { mode, uid, gid, size, atime: set_time(atime), mtime: set_time(mtime) };
        let caller = credentials(req);
        self.simple(req, reply, move |inner| inner.setattr(ino, &set, fh, &caller), reply_attr);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.inner.files.counts.request(Op::Readlink);
        self.simple(
            req,
            reply,
            move |inner| inner.readlink(ino),
            |reply, result| match result {
                Ok(target) => reply.data(&target),
                Err(error) => reply.error(error),
            },
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.inner.files.counts.request(Op::Mknod);
        let (name, caller) = (name.to_owned(), credentials(req));
        self.entry(req, reply, move |inner| {
            inner.mknod(parent, &name, mode & !umask, rdev, &caller)
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.inner.files.counts.request(Op::Mkdir);
        let (name, caller) = (name.to_owned(), credentials(req));
        self.entry(req, reply, move |inner| inner.mkdir(parent, &name, mode & !umask, &caller));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.inner.files.counts.request(Op::Unlink);
        let (name, caller) = (name.to_owned(), credentials(req));
        self.simple(req, reply, move |inner| inner.unlink(parent, &name, &caller), reply_empty);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.inner.files.counts.request(Op::Rmdir);
        let (name, caller) = (name.to_owned(), credentials(req));
        // On the pool: it may wait a while for hidden names to go (`Inner::rmdir`).
        let op = move |inner: &Inner<N>| inner.rmdir(parent, &name, &caller);
        self.on_guard_pool(req, reply, op, |_, reply, result| answer_empty(reply, result));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.inner.files.counts.request(Op::Symlink);
        let (name, target, caller) =
            (link_name.to_owned(), target.as_os_str().to_owned(), credentials(req));
        self.entry(req, reply, move |inner| inner.symlink(parent, &name, &target, &caller));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Rename);
        let (name, newname, caller) = (name.to_owned(), newname.to_owned(), credentials(req));
        self.simple(
            req,
            reply,
            move |inner| inner.rename(parent, &name, newparent, &newname, flags, &caller),
            reply_empty,
        );
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.inner.files.counts.request(Op::Link);
        let (newname, caller) = (newname.to_owned(), credentials(req));
        self.entry(req, reply, move |inner| inner.link(ino, newparent, &newname, &caller));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.inner.files.counts.request(Op::Open);
        let op = move |inner: &Inner<N>| inner.open(ino, flags);
        self.guarded(req, reply, op, |inner, reply, result| match (reply, result) {
            (Some(reply), Ok(fh)) => reply.opened(FileHandle(fh), io_ops::open_flags()),
            (Some(reply), Err(error)) => reply.error(error),
            (None, Ok(fh)) => drop(inner.files.release(FileHandle(fh))),
            (None, Err(_)) => {}
        });
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.inner.files.counts.request(Op::Read);
        // A read the cache holds whole is answered here, on the request loop that read it: a
        // copy under the file's page-map lock, no hand-off to a pool thread (a thread's
        // wake-up and two context switches fewer per request: docs/fuse-requests.md).
        if let Some(buf) = self.inner.try_read(fh, offset, size) {
            self.inner.files.counts.read_on_loop();
            return reply.data(&buf);
        }
        // So is an O_DIRECT read of a local directory's file: a `pread` of the backend file
        // on this thread, which waits for the disk but never for a server, by one loop at a
        // time, so that another always takes new requests.
        if self.local
            && io_ops::is_direct(flags, offset, size)
            && let Some(turn) = io_ops::Inline::take(&self.inline)
        {
            self.inner.files.counts.read_on_loop();
            let read = self.inner.read(fh, offset, size, flags, req.pid());
            drop(turn);
            return match read {
                Ok(buf) => reply.data(&buf),
                Err(error) => reply.error(error),
            };
        }
        let (inner, pid, clock) =
            (Arc::clone(&self.inner), req.pid(), Arc::clone(&self.guard.clock));
        // Watched as every request that may wait on the backend ([`outage`]): a read of data
        // not cached waits for it.
        let op = move |interrupted: &dyn Fn() -> bool| {
            clock.through_outage(interrupted, || inner.read(fh, offset, size, flags, pid))
        };
        self.guard.run_on(&self.reads, pid, reply, op, |reply, result| match (reply, result) {
            (Some(reply), Ok(buf)) => reply.data(&buf),
            (Some(reply), Err(error)) => reply.error(error),
            (None, _) => {}
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.inner.files.counts.request(Op::Write);
        if let Err(error) = self.inner.files.check_writable() {
            reply.error(error);
            return;
        }
        self.inner.kill_suid_on_write(ino, fh, req.uid());
        let request = write_task::WriteRequest { fh, offset, data, pid: req.pid(), reply };
        write_task::serve(&self.inner, request, &self.write_data, &self.writes);
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Flush);
        // A caller being killed (a close in its exit, or in a close it was killed in) is
        // answered here when the pool would make it wait: the kernel waits for a FLUSH's
        // answer whatever signal comes, and on the pool it could wait behind writes blocked on
        // a server that does not answer (a pool thread's flush asks `killed` itself). Its data
        // stays in the cache and is written back as any other. Asked only then: it costs a
        // read of /proc/PID/status (about 4 us) on every close.
        let (inner, pid) = (Arc::clone(&self.inner), req.pid());
        // A close that writes nothing back (a local directory's: only a write error not yet
        // seen is reported) is answered here: it takes the engine's lock, never the disk.
        if self.local && inner.close_writes_nothing(fh) {
            inner.files.counts.flush_on_loop();
            reply_empty(reply, inner.flush(fh, pid));
            return;
        }
        if self.writes.would_wait() && io_ops::killed(pid) {
            reply.ok();
            return;
        }
        // On a flush-on-close backend (NFS, S3) this writes the file back: a pool thread, as
        // for fsync, so the request loops stay free; answered `EINTR` by the guard's watcher
        // if the caller is killed meanwhile (even a clean file's flush asks the backend).
        let op = move |_: &dyn Fn() -> bool| inner.flush(fh, pid);
        self.guard.run_killable_on(&self.writes, pid, reply, op, answer_empty);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Release);
        let inner = Arc::clone(&self.inner);
        // So is the release of such a file: it waits for no backend (closing a removed file's
        // last descriptor frees its blocks in the backend, as a `forget` may, which is
        // answered on the loop too).
        if self.local && inner.close_writes_nothing(fh) {
            inner.files.counts.release_on_loop();
            return reply_empty(reply, inner.release(fh));
        }
        self.writes.run(move || reply_empty(reply, inner.release(fh)));
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Fsync);
        let (inner, pid) = (Arc::clone(&self.inner), req.pid());
        let op = move |_: &dyn Fn() -> bool| inner.fsync(fh, pid);
        self.guard.run_killable_on(&self.writes, pid, reply, op, answer_empty);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.inner.files.counts.request(Op::Opendir);
        let op = move |inner: &Inner<N>| inner.opendir(ino);
        self.guarded(req, reply, op, |inner, reply, result| match (reply, result) {
            (Some(reply), Ok(fh)) => reply.opened(FileHandle(fh), fuser::FopenFlags::empty()),
            (Some(reply), Err(error)) => reply.error(error),
            (None, Ok(fh)) => drop(inner.dirs.lock().remove(&fh)),
            (None, Err(_)) => {}
        });
    }

    fn readdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.inner.files.counts.request(Op::Readdir);
        let op = move |inner: &Inner<N>| inner.fill_dir(fh, offset);
        self.guarded(req, reply, op, move |inner, reply, result| match (reply, result) {
            (Some(reply), Ok(())) => inner.readdir(fh, offset, reply),
            (Some(reply), Err(error)) => reply.error(error),
            (None, _) => {}
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Releasedir);
        self.inner.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Fsyncdir);
        let op = move |inner: &Inner<N>| inner.fsyncdir(ino);
        self.on_guard_pool(req, reply, op, |_, reply, result| answer_empty(reply, result));
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.inner.files.counts.request(Op::Statfs);
        self.simple(
            req,
            reply,
            move |inner| inner.statfs(ino),
            |reply, result| match result {
                Ok(s) => reply.statfs(
                    s.blocks,
                    s.blocks_free,
                    s.blocks_available,
                    s.files,
                    s.files_free,
                    s.block_size,
                    s.name_max,
                    s.fragment_size,
                ),
                Err(error) => reply.error(error),
            },
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Setxattr);
        let (name, value, caller) = (name.to_owned(), value.to_vec(), credentials(req));
        let op = move |inner: &Inner<N>| inner.setxattr(ino, &name, &value, flags, &caller);
        self.simple(req, reply, op, reply_empty);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.inner.files.counts.request(Op::Getxattr);
        let name = name.to_owned();
        let answer = move |reply, result| reply_xattr(reply, result, size);
        self.simple(req, reply, move |inner| inner.getxattr(ino, &name), answer);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.inner.files.counts.request(Op::Listxattr);
        let answer = move |reply, result| reply_xattr(reply, result, size);
        self.simple(req, reply, move |inner| inner.listxattr(ino), answer);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.inner.files.counts.request(Op::Removexattr);
        let (name, caller) = (name.to_owned(), credentials(req));
        self.simple(req, reply, move |inner| inner.removexattr(ino, &name, &caller), reply_empty);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.inner.files.counts.request(Op::Fallocate);
        let inner = Arc::clone(&self.inner);
        self.writes.run(move || reply_empty(reply, inner.fallocate(ino, fh, offset, length, mode)));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.inner.files.counts.request(Op::Create);
        let (name, caller) = (name.to_owned(), credentials(req));
        let op = move |inner: &Inner<N>| inner.create(parent, &name, mode & !umask, flags, &caller);
        self.guarded(req, reply, op, |inner, reply, result| match (reply, result) {
            (Some(reply), Ok((attr, generation, fh))) => reply.created(
                &TTL,
                &attr,
                fuser::Generation(generation),
                FileHandle(fh),
                io_ops::open_flags(),
            ),
            (Some(reply), Err(error)) => reply.error(error),
            (None, Ok((attr, _, fh))) => {
                drop(inner.files.release(FileHandle(fh)));
                inner.nodes.forget(attr.ino.0, 1);
            }
            (None, Err(_)) => {}
        });
    }
}

/// Answers `reply` with `result` unless the guard's watcher answered it (`None`).
fn answer_empty(reply: Option<ReplyEmpty>, result: Result<(), Errno>) {
    if let Some(reply) = reply {
        reply_empty(reply, result);
    }
}

/// A directory entry as the kernel is told it.
fn dir_entry<N: Namespace>(
    nodes: &Nodes<N>,
    entry: DirEntry,
) -> (u64, FileType, std::ffi::OsString) {
    (nodes.id(entry.ino), file_type(entry.kind), entry.name)
}
