//! One queue of FUSE over io_uring: its ring, its entries' buffers and the thread that waits
//! on it.
//!
//! The thread owns the ring: it alone submits commands, so the kernel always copies a request
//! into an entry's buffers in the ring thread's own context (the task of the command's
//! submitter). A request it answers itself (on the thread, as the classic loop answers what
//! cannot wait) is committed with the next `io_uring_enter`, which also waits for the next
//! request: one system call per request. An answer made on a pool thread is written into the
//! entry's buffers there, put on the queue's `ready` list, and the ring thread woken through
//! an eventfd (a read of it is kept in flight on the ring) to commit it.
//!
//! The kernel holds the address of every registered entry's buffers until it tears the entry
//! down (a completion with `ENOTCONN` at unmount or abort, `ECANCELED` when the submitter
//! exits): the buffers are freed only after every entry has ended so, and leaked otherwise.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam::channel::Sender;
use fuser::{Dispatcher, Filesystem, ReplyTransport};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use parking_lot::Mutex;

use super::abi::{self, EntInOut, InHeader, ReqHeader};

/// The completion's `user_data` of the eventfd read (entries use their index).
const WAKE: u64 = u64::MAX;

/// Memory the kernel reads and writes through addresses given to it: one entry's header and
/// payload buffers, and the two iovecs that name them in its REGISTER command.
struct EntryBufs {
    header: *mut ReqHeader,
    payload: *mut u8,
    payload_len: usize,
    iov: *mut [libc::iovec; 2],
}

#[expect(unsafe_code, reason = "EntryBufs owns its allocations like Box does, which is Send")]
unsafe impl Send for EntryBufs {}
#[expect(unsafe_code, reason = "shared use is ordered by the protocol: see QueueShared")]
unsafe impl Sync for EntryBufs {}

impl EntryBufs {
    fn new(payload_len: usize) -> EntryBufs {
        let header = Box::into_raw(Box::new(ReqHeader::default()));
        let payload = Box::into_raw(vec![0u8; payload_len].into_boxed_slice()).cast::<u8>();
        let iov = Box::into_raw(Box::new([
            libc::iovec { iov_base: header.cast(), iov_len: size_of::<ReqHeader>() },
            libc::iovec { iov_base: payload.cast(), iov_len: payload_len },
        ]));
        EntryBufs { header, payload, payload_len, iov }
    }
}

impl Drop for EntryBufs {
    #[expect(unsafe_code, reason = "the allocations made in EntryBufs::new, freed once")]
    fn drop(&mut self) {
        unsafe {
            drop(Box::from_raw(self.header));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.payload, self.payload_len)));
            drop(Box::from_raw(self.iov));
        }
    }
}

/// What a queue's thread shares with the answers made elsewhere.
///
/// An entry's buffers are written by the kernel while the entry waits for a request, read by
/// the ring thread when the request's completion comes, written by the one [`EntryAnswer`] of
/// that request, and read by the kernel at the commit: never two at once.
pub(crate) struct QueueShared {
    qid: u16,
    entries: Vec<EntryBufs>,
    /// Answered entries (index, commit id) waiting for the ring thread to commit them.
    ready: Mutex<Vec<(u16, u64)>>,
    /// Written to wake the ring thread when `ready` was empty.
    wake: File,
    /// Requests taken from the rings (the mount's count, shared by its queues).
    served: Arc<AtomicU64>,
}

thread_local! {
    /// The queue whose ring thread this is (null elsewhere).
    static RING_OF_THIS_THREAD: Cell<*const QueueShared> = const { Cell::new(std::ptr::null()) };
}

/// A queue ready to start: its ring and buffers, nothing given to the kernel yet.
pub(crate) struct Queue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    shared: Arc<QueueShared>,
}

impl Queue {
    /// Queue `qid` with `depth` entries of `payload_len` bytes of payload each.
    /// `served` counts the requests taken from it.
    pub(crate) fn new(
        qid: u16,
        depth: usize,
        payload_len: usize,
        served: Arc<AtomicU64>,
    ) -> io::Result<Queue> {
        // One submission per entry at most, and the eventfd read.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(u32::try_from(depth + 1).map_err(io::Error::other)?)?;
        #[expect(unsafe_code, reason = "eventfd(2) has no safe wrapper in our dependencies")]
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        #[expect(unsafe_code, reason = "a descriptor eventfd just returned, owned by nobody else")]
        let wake = File::from(unsafe { OwnedFd::from_raw_fd(wake) });
        let entries = (0..depth).map(|_| EntryBufs::new(payload_len)).collect();
        let shared =
            Arc::new(QueueShared { qid, entries, ready: Mutex::new(Vec::new()), wake, served });
        Ok(Queue { ring, shared })
    }

    /// Registers the entries on the connection of `device` and serves requests until every
    /// entry has ended; says on `started` whether the registration was taken.
    pub(crate) fn serve<FS: Filesystem>(
        mut self,
        device: OwnedFd,
        dispatcher: &Dispatcher,
        fs: &FS,
        started: &Sender<io::Result<()>>,
    ) {
        let shared = Arc::clone(&self.shared);
        RING_OF_THIS_THREAD.with(|ring| ring.set(Arc::as_ptr(&shared)));
        let mut ring = RingThread {
            fd: types::Fd(device.as_raw_fd()),
            shared: &shared,
            ended: vec![false; shared.entries.len()],
            commit_ids: vec![0; shared.entries.len()],
            wake_buf: Box::leak(Box::new(0u64)),
            scratch: vec![
                0u8;
                abi::IN_HEADER_SIZE + abi::OP_IN_SIZE + shared.entries[0].payload_len
            ],
            completions: Vec::new(),
        };
        let result = ring.start(&mut self.ring);
        let registered = result.is_ok();
        let _ = started.send(result);
        if registered {
            ring.run(&mut self.ring, dispatcher, fs);
        }
        let all_ended = ring.ended.iter().all(|ended| *ended);
        drop(self.ring);
        drop(device);
        if !all_ended {
            // The kernel may still write into the buffers: leave them to it.
            std::mem::forget(shared);
        }
    }
}

/// The ring thread's own state.
struct RingThread<'a> {
    fd: types::Fd,
    shared: &'a Arc<QueueShared>,
    /// Entries the kernel has let go of.
    ended: Vec<bool>,
    /// The request each entry holds (for a command tried again).
    commit_ids: Vec<u64>,
    /// Where the eventfd read puts the count (leaked: the read may outlive the thread).
    wake_buf: &'static mut u64,
    /// A request as `read(2)` of `/dev/fuse` would give it, for fuser's decoder.
    scratch: Vec<u8>,
    /// Completions taken from the ring and not yet handled: (user data, result).
    completions: Vec<(u64, i32)>,
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

impl RingThread<'_> {
    /// Submits every entry's REGISTER and the eventfd read; fails if the kernel refused one.
    fn start(&mut self, ring: &mut Ring) -> io::Result<()> {
        for index in 0..self.shared.entries.len() {
            let register = self.register(index);
            push(ring, &register)?;
        }
        let wake = self.wake_read();
        push(ring, &wake)?;
        ring.submit()?;
        // A refused command completes within the submission; a taken one only when a
        // request comes (those that came already are handled by `run`).
        self.take_completions(ring);
        let mut refused = None;
        for &(user_data, result) in &self.completions {
            if user_data != WAKE && result < 0 {
                self.ended[user_data as usize] = true;
                refused.get_or_insert(result);
            }
        }
        self.completions.retain(|&(user_data, result)| user_data == WAKE || result >= 0);
        match refused {
            None => Ok(()),
            Some(result) => {
                let error = io::Error::from_raw_os_error(-result);
                Err(io::Error::new(
                    error.kind(),
                    format!("FUSE_IO_URING_CMD_REGISTER on queue {}: {error}", self.shared.qid),
                ))
            }
        }
    }

    /// Serves requests until every entry has ended (the connection is gone).
    fn run<FS: Filesystem>(&mut self, ring: &mut Ring, dispatcher: &Dispatcher, fs: &FS) {
        loop {
            let completions = std::mem::take(&mut self.completions);
            for &(user_data, result) in &completions {
                self.complete(ring, user_data, result, dispatcher, fs);
            }
            self.completions = completions;
            self.completions.clear();
            self.commit_ready(ring);
            if self.ended.iter().all(|ended| *ended) {
                return;
            }
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                // The completion queue is full: take what is there.
                Err(error) if error.raw_os_error() == Some(libc::EBUSY) => {}
                Err(error) => {
                    eprintln!(
                        "ebb mount: io_uring queue {}: {error}; queue stopped",
                        self.shared.qid
                    );
                    return;
                }
            }
            self.take_completions(ring);
        }
    }

    fn take_completions(&mut self, ring: &mut Ring) {
        self.completions.extend(ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
    }

    /// Handles one completion.
    fn complete<FS: Filesystem>(
        &mut self,
        ring: &mut Ring,
        user_data: u64,
        result: i32,
        dispatcher: &Dispatcher,
        fs: &FS,
    ) {
        if user_data == WAKE {
            if result < 0 && result != -libc::EINTR && result != -libc::EAGAIN {
                // Not read again (it would fail again at once): answers made on pool threads
                // are then committed only when a request comes to this queue.
                eprintln!(
                    "ebb mount: io_uring queue {}: reading its eventfd: {}",
                    self.shared.qid,
                    io::Error::from_raw_os_error(-result)
                );
                return;
            }
            let wake = self.wake_read();
            if push(ring, &wake).is_err() {
                eprintln!(
                    "ebb mount: io_uring queue {}: no room to wait for answers",
                    self.shared.qid
                );
            }
            return;
        }
        let index = user_data as usize;
        match result {
            0 => self.request(index, dispatcher, fs),
            // Not taken this time: the same command again.
            result if result == -libc::EAGAIN || result == -libc::EINTR => {
                let again = if self.commit_ids[index] == 0 {
                    self.register(index)
                } else {
                    self.commit(index, self.commit_ids[index])
                };
                let _ = push(ring, &again);
            }
            // ENOTCONN (unmount, abort), ECANCELED, or a refused commit: the entry is gone.
            result => {
                if result != -libc::ENOTCONN && result != -libc::ECANCELED {
                    eprintln!(
                        "ebb mount: io_uring queue {} entry {index}: {}",
                        self.shared.qid,
                        io::Error::from_raw_os_error(-result)
                    );
                }
                self.ended[index] = true;
            }
        }
    }

    /// Decodes the request in entry `index` and hands it to the filesystem, whose answer
    /// goes back through an [`EntryAnswer`].
    fn request<FS: Filesystem>(&mut self, index: usize, dispatcher: &Dispatcher, fs: &FS) {
        self.shared.served.fetch_add(1, Ordering::Relaxed);
        let bufs = &self.shared.entries[index];
        #[expect(unsafe_code, reason = "the kernel wrote the header before the completion")]
        let header: ReqHeader = unsafe { std::ptr::read(bufs.header) };
        let in_header = InHeader::parse(&header.in_out);
        let EntInOut { commit_id, payload_sz, .. } = header.ent;
        self.commit_ids[index] = commit_id;
        let answer = Arc::new(EntryAnswer {
            shared: Arc::clone(self.shared),
            index: index as u16,
            commit_id,
            unique: in_header.unique,
            sent: AtomicBool::new(false),
        });
        let payload_sz_usize = payload_sz as usize;
        let op_len = abi::op_header_len(&in_header, payload_sz)
            .filter(|_| payload_sz_usize <= bufs.payload_len);
        let Some(op_len) = op_len else {
            eprintln!(
                "ebb mount: io_uring: request {} (opcode {}) of {} bytes with {payload_sz} of \
                 payload does not add up; answered EIO",
                in_header.unique, in_header.opcode, in_header.len
            );
            return; // `answer`'s drop answers EIO.
        };
        let len = in_header.len as usize;
        let at_payload = abi::IN_HEADER_SIZE + op_len;
        self.scratch[..abi::IN_HEADER_SIZE].copy_from_slice(&header.in_out[..abi::IN_HEADER_SIZE]);
        self.scratch[abi::IN_HEADER_SIZE..at_payload].copy_from_slice(&header.op_in[..op_len]);
        #[expect(unsafe_code, reason = "the kernel wrote payload_sz bytes before the completion")]
        let payload = unsafe { std::slice::from_raw_parts(bufs.payload, payload_sz_usize) };
        self.scratch[at_payload..len].copy_from_slice(payload);
        if !dispatcher.dispatch(fs, &self.scratch[..len], answer) {
            eprintln!(
                "ebb mount: io_uring: request {} (opcode {}) not decoded; answered EIO",
                in_header.unique, in_header.opcode
            );
        }
    }

    /// Submits the commits of the answers made since the last time.
    fn commit_ready(&mut self, ring: &mut Ring) {
        let ready = std::mem::take(&mut *self.shared.ready.lock());
        for (index, commit_id) in ready {
            let commit = self.commit(usize::from(index), commit_id);
            if let Err(error) = push(ring, &commit) {
                eprintln!("ebb mount: io_uring queue {}: {error}", self.shared.qid);
            }
        }
    }

    /// The REGISTER command of entry `index`.
    fn register(&self, index: usize) -> squeue::Entry128 {
        let iov = self.shared.entries[index].iov;
        let mut entry = opcode::UringCmd80::new(self.fd, abi::CMD_REGISTER)
            .cmd(abi::cmd_req(0, self.shared.qid))
            .addr(Some(iov as u64))
            .build()
            .user_data(index as u64);
        set_len(&mut entry, 2);
        entry
    }

    /// The COMMIT_AND_FETCH command of entry `index`, answering `commit_id`.
    fn commit(&self, index: usize, commit_id: u64) -> squeue::Entry128 {
        opcode::UringCmd80::new(self.fd, abi::CMD_COMMIT_AND_FETCH)
            .cmd(abi::cmd_req(commit_id, self.shared.qid))
            .build()
            .user_data(index as u64)
    }

    /// A read of the eventfd that answers made elsewhere write.
    fn wake_read(&mut self) -> squeue::Entry128 {
        let buf: *mut u64 = self.wake_buf;
        squeue::Entry128::from(
            opcode::Read::new(types::Fd(self.shared.wake.as_raw_fd()), buf.cast(), 8)
                .build()
                .user_data(WAKE),
        )
    }
}

/// Puts `entry` on the ring's submission queue.
fn push(ring: &mut Ring, entry: &squeue::Entry128) -> io::Result<()> {
    #[expect(unsafe_code, reason = "the buffers an entry names live until the kernel lets go")]
    let pushed = unsafe { ring.submission().push(entry) };
    if pushed.is_err() {
        // Full (never: one submission per entry): make room and try once more.
        ring.submit()?;
        #[expect(unsafe_code, reason = "as above")]
        let pushed = unsafe { ring.submission().push(entry) };
        pushed.map_err(|_| io::Error::other("submission queue full"))?;
    }
    Ok(())
}

/// Sets a submission entry's `len` (the io-uring crate's `UringCmd80` has no setter for it;
/// REGISTER takes the number of iovecs there).
#[expect(unsafe_code, reason = "a field of the kernel's SQE layout, inside the entry")]
fn set_len(entry: &mut squeue::Entry128, len: u32) {
    // `struct io_uring_sqe`: opcode (u8), flags (u8), ioprio (u16), fd (i32), off (u64),
    // addr (u64), then len (u32) at byte 24; `Entry128` is `#[repr(C)]` over it.
    const LEN_AT: usize = 24;
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    unsafe {
        let bytes = std::ptr::from_mut(entry).cast::<u8>();
        bytes.add(LEN_AT).cast::<u32>().write_unaligned(len);
    }
}

/// The answer to the request an entry holds: written into the entry's buffers, then
/// committed by the ring thread. Dropped unsent, it answers `EIO`.
#[derive(Debug)]
struct EntryAnswer {
    shared: Arc<QueueShared>,
    index: u16,
    commit_id: u64,
    unique: u64,
    sent: AtomicBool,
}

impl std::fmt::Debug for QueueShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueShared").field("qid", &self.qid).finish_non_exhaustive()
    }
}

impl EntryAnswer {
    /// Copies `data` (`fuse_out_header`, then the body) into the entry's buffers and hands
    /// the entry to the ring thread.
    fn answer(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let bufs = &self.shared.entries[usize::from(self.index)];
        let total: usize = data.iter().map(|slice| slice.len()).sum();
        let body = total.checked_sub(abi::OUT_HEADER_SIZE);
        let result = match body {
            Some(body) if body <= bufs.payload_len => {
                let mut out = [0u8; abi::OUT_HEADER_SIZE];
                let mut at = 0;
                for slice in data {
                    let mut bytes: &[u8] = slice;
                    if at < abi::OUT_HEADER_SIZE {
                        let head = bytes.len().min(abi::OUT_HEADER_SIZE - at);
                        out[at..at + head].copy_from_slice(&bytes[..head]);
                        at += head;
                        bytes = &bytes[head..];
                    }
                    if !bytes.is_empty() {
                        let offset = at - abi::OUT_HEADER_SIZE;
                        #[expect(unsafe_code, reason = "this answer owns the entry's payload")]
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                bytes.as_ptr(),
                                bufs.payload.add(offset),
                                bytes.len(),
                            );
                        }
                        at += bytes.len();
                    }
                }
                self.set(bufs, &out, body as u32);
                Ok(())
            }
            _ => {
                self.set(bufs, &abi::error_answer(self.unique, libc::EIO), 0);
                Err(io::Error::other(format!(
                    "an answer of {total} bytes does not fit the ring's {} bytes",
                    bufs.payload_len
                )))
            }
        };
        self.hand_back();
        result
    }

    /// Writes the `fuse_out_header` and the payload's length into the entry's header buffer.
    #[expect(unsafe_code, reason = "this answer owns the entry's header buffer")]
    fn set(&self, bufs: &EntryBufs, out: &[u8; abi::OUT_HEADER_SIZE], payload_sz: u32) {
        unsafe {
            let header = bufs.header;
            std::ptr::copy_nonoverlapping(
                out.as_ptr(),
                std::ptr::addr_of_mut!((*header).in_out).cast::<u8>(),
                out.len(),
            );
            std::ptr::addr_of_mut!((*header).ent.payload_sz).write(payload_sz);
        }
    }

    /// Puts the entry on the ready list; wakes the ring thread unless this is it or it has
    /// been woken already.
    fn hand_back(&self) {
        let was_empty = {
            let mut ready = self.shared.ready.lock();
            ready.push((self.index, self.commit_id));
            ready.len() == 1
        };
        let on_ring =
            RING_OF_THIS_THREAD.with(|ring| std::ptr::eq(ring.get(), Arc::as_ptr(&self.shared)));
        if was_empty && !on_ring {
            // An eventfd write fails only on overflow of its counter (never: the ring thread
            // reads it after each wake).
            let _ = (&self.shared.wake).write(&1u64.to_ne_bytes());
        }
    }
}

impl ReplyTransport for EntryAnswer {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        if self.sent.swap(true, Ordering::AcqRel) {
            return Err(io::Error::other("a FUSE request answered twice"));
        }
        self.answer(data)
    }
}

impl Drop for EntryAnswer {
    fn drop(&mut self) {
        if !self.sent.swap(true, Ordering::AcqRel) {
            let out = abi::error_answer(self.unique, libc::EIO);
            let _ = self.answer(&[IoSlice::new(&out)]);
        }
    }
}
