//! A small blocking ONC RPC client (RFC 5531) over TCP: record marking, `AUTH_UNIX`, and
//! several calls in flight on one connection.
//!
//! A client of an NFS server keeps the procedures that carry the bulk of the bytes (WRITE and
//! COMMIT, the writeback) on their connections (`nconnect` of them) and every other procedure
//! (READ, the metadata) on one connection of its own: a TCP stream delivers in order, so a
//! READ sent on a connection whose stream holds megabytes of WRITEs would wait for the server
//! to read them all first (the kernel's client shares its connections; ebb does not, so that
//! a reader beside writeback waits only for the server's own queue).
//!
//! A call encodes its header once (the xid inside it), registers a waiter under the xid, and
//! writes the record while holding the connection's write lock, so records never interleave.
//! One reader thread per connection reads whole records and hands each reply to the waiter of
//! its xid; replies come back in any order. A reply for an xid nobody waits for (a late reply
//! to a call that timed out, or garbage) is counted in `bad_xids` and dropped; a record that
//! breaks the framing (larger than [`RECORD_BYTES_MAX`]) closes the connection, because the
//! stream cannot be resynchronised.
//!
//! # Retries: bounded, never hiding an outage
//!
//! The engine owns retrying writeback; this layer only recovers from the transport:
//!
//! * No reply within `timeout` (the kernel's `timeo`): the connection is closed and the call
//!   is retransmitted with the same xid on a new one, at most `retrans` times; then the call
//!   fails with `ETIMEDOUT`. A server's duplicate request cache recognises the xid; the NFS
//!   procedures the backend uses are idempotent anyway.
//! * Connection refused, reset or closed by the server: after `backoff`, one reconnect is
//!   tried and the call retransmitted; if that fails too, the call fails with the error
//!   (`ECONNREFUSED`, `ECONNRESET`, ...). A server that is down thus fails each call after
//!   about one `backoff`, and the engine's retry policy decides what happens next.
//!
//! The counters follow the kernel's names (`nfsstat -c`, `/proc/self/mountstats`): `calls`,
//! `retransmits`, `timeouts`, `bad_xids`, plus `reconnects` (connections opened after the
//! first) and calls per procedure.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nfs3_types::rpc::{
    accept_stat_data, auth_unix, call_body, msg_body, opaque_auth, rejected_reply, reply_body,
    rpc_msg,
};
use nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

use super::errno;

/// Largest reply record accepted: a 1 MiB READ with its headers fits many times over, and a
/// corrupt length cannot make the reader allocate gigabytes.
pub(crate) const RECORD_BYTES_MAX: usize = 64 << 20;

/// The last-fragment bit of a record-marking header (RFC 5531 section 11).
const LAST_FRAGMENT: u32 = 0x8000_0000;

/// How a client recovers from the transport; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// How long a call waits for its reply before it is retransmitted (`timeo`).
    pub(crate) timeout: Duration,
    /// Retransmissions after timeouts before the call fails with `ETIMEDOUT` (`retrans`).
    pub(crate) retrans: u32,
    /// Wait before the one reconnect after a refused or lost connection.
    pub(crate) backoff: Duration,
}

/// Where calls go and who makes them.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) address: SocketAddr,
    pub(crate) program: u32,
    pub(crate) version: u32,
    /// Connections used round-robin (the kernel's `nconnect`), at least 1.
    pub(crate) connections: usize,
    /// Procedures sent on those connections only (an NFS client's WRITE and COMMIT: the bulk
    /// of the bytes); when not empty, every other procedure goes on one more connection of its
    /// own, so a READ never waits behind the WRITEs queued in the bulk connections' streams.
    pub(crate) bulk_procedures: &'static [u32],
    /// Procedure numbers counted separately: `0..procedures`.
    pub(crate) procedures: usize,
}

/// The transport's event counters.
#[derive(Debug, Default)]
pub(crate) struct RpcCounters {
    pub(crate) calls: AtomicU64,
    pub(crate) retransmits: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) bad_xids: AtomicU64,
    pub(crate) reconnects: AtomicU64,
}

/// An RPC client of one program on one server.
pub(crate) struct RpcClient {
    target: Target,
    policy: RetryPolicy,
    /// The `AUTH_UNIX` credential, the same for every call.
    credential: opaque_auth<'static>,
    next_xid: AtomicU32,
    /// The bulk connections (`connections` of them), then the one for other procedures when
    /// `bulk_procedures` is not empty.
    slots: Vec<Slot>,
    next_slot: AtomicUsize,
    pub(crate) counters: Arc<RpcCounters>,
    per_procedure: Vec<AtomicU64>,
}

impl fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcClient")
            .field("address", &self.target.address)
            .field("program", &self.target.program)
            .finish_non_exhaustive()
    }
}

/// One connection place of the client: the live connection, if any.
#[derive(Default)]
struct Slot {
    current: Mutex<Option<Arc<Connection>>>,
    /// Connections this slot has opened.
    opened: AtomicU64,
}

/// A reply to a call: the whole record and where the procedure's results start.
#[derive(Debug)]
pub(crate) struct Reply {
    record: Vec<u8>,
    results_at: usize,
}

impl Reply {
    /// The procedure's results, XDR encoded.
    pub(crate) fn results(&self) -> &[u8] {
        &self.record[self.results_at..]
    }
}

impl RpcClient {
    /// A client that connects on first use. `uid`, `gid` and `machine` form the `AUTH_UNIX`
    /// credential of every call.
    pub(crate) fn new(target: Target, policy: RetryPolicy, uid: u32, gid: u32) -> RpcClient {
        let auth = auth_unix {
            stamp: 0,
            machinename: Opaque::owned(b"ebb".to_vec()),
            uid,
            gid,
            gids: vec![gid],
        };
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos())
            ^ std::process::id().rotate_left(16);
        let connections =
            target.connections.max(1) + usize::from(!target.bulk_procedures.is_empty());
        let per_procedure = (0..target.procedures).map(|_| AtomicU64::new(0)).collect();
        RpcClient {
            target,
            policy,
            credential: opaque_auth::auth_unix(&auth),
            next_xid: AtomicU32::new(seed),
            slots: (0..connections).map(|_| Slot::default()).collect(),
            next_slot: AtomicUsize::new(0),
            counters: Arc::new(RpcCounters::default()),
            per_procedure,
        }
    }

    /// Calls of `procedure` so far.
    pub(crate) fn procedure_calls(&self, procedure: u32) -> u64 {
        self.per_procedure.get(procedure as usize).map_or(0, |count| count.load(Ordering::Relaxed))
    }

    /// Calls `procedure` with its arguments given as consecutive pieces (so a WRITE's data is
    /// sent from the caller's buffer, not copied), and returns the accepted reply. `name` is
    /// used in errors.
    pub(crate) fn call(
        &self,
        procedure: u32,
        name: &str,
        arguments: &[&[u8]],
    ) -> io::Result<Reply> {
        let xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
        let header = self.call_header(xid, procedure);
        let length: usize = header.len() + arguments.iter().map(|piece| piece.len()).sum::<usize>();
        let marker = u32::try_from(length)
            .ok()
            .filter(|length| *length < LAST_FRAGMENT)
            .ok_or_else(|| invalid(format!("{name} call of {length} bytes is too large")))?;
        let marker = (marker | LAST_FRAGMENT).to_be_bytes();
        let mut pieces = Vec::with_capacity(arguments.len() + 2);
        pieces.push(&marker[..]);
        pieces.push(&header[..]);
        pieces.extend_from_slice(arguments);
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(count) = self.per_procedure.get(procedure as usize) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        let slot = self.slot_for(procedure);
        let address = self.target.address;
        let record = self.exchange(slot, xid, &pieces).map_err(|failure| {
            errno::error(failure.code, format!("{name} to {address}: {}", failure.why))
        })?;
        parse_reply(record, xid).map_err(|error| match error {
            Failure { code: None, why } => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} to {address}: garbled RPC reply: {why}"),
            ),
            Failure { code: Some(code), why } => {
                errno::error(code, format!("{name} to {address}: {why}"))
            }
        })
    }

    /// The connection `procedure` goes on: a bulk connection in turn, or the one of its own
    /// for the others (module docs).
    fn slot_for(&self, procedure: u32) -> &Slot {
        let bulk = self.target.connections.max(1);
        if bulk < self.slots.len() && !self.target.bulk_procedures.contains(&procedure) {
            return &self.slots[bulk];
        }
        &self.slots[self.next_slot.fetch_add(1, Ordering::Relaxed) % bulk]
    }

    /// Sends the record and waits for its reply, reconnecting and retransmitting as the module
    /// docs say.
    fn exchange(&self, slot: &Slot, xid: u32, pieces: &[&[u8]]) -> Result<Vec<u8>, Lost> {
        let mut timeouts = 0;
        let mut reconnected = false;
        loop {
            let outcome = match self.connection(slot) {
                Ok(connection) => connection.round_trip(xid, pieces, self.policy.timeout),
                Err(error) => Outcome::Lost(Lost::connecting(&error)),
            };
            match outcome {
                Outcome::Reply(record) => return Ok(record),
                Outcome::TimedOut(connection) => {
                    self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                    timeouts += 1;
                    if self.policy.retrans < timeouts {
                        let why = format!(
                            "no reply within {:?}, {timeouts} times (timeo and retrans)",
                            self.policy.timeout
                        );
                        return Err(Lost { code: errno::ETIMEDOUT, why });
                    }
                    connection.close(errno::ETIMEDOUT, "closed after a call timed out");
                }
                Outcome::Lost(lost) => {
                    if reconnected {
                        return Err(lost);
                    }
                    reconnected = true;
                    std::thread::sleep(self.policy.backoff);
                }
            }
            self.counters.retransmits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The slot's live connection, or a new one.
    fn connection(&self, slot: &Slot) -> io::Result<Arc<Connection>> {
        let mut current = lock(&slot.current);
        if let Some(connection) = current.as_ref().filter(|connection| !connection.is_closed()) {
            return Ok(Arc::clone(connection));
        }
        let stream = TcpStream::connect_timeout(&self.target.address, self.policy.timeout)?;
        stream.set_nodelay(true)?;
        // A server that stops reading must not block a sender forever.
        stream.set_write_timeout(Some(self.policy.timeout))?;
        let reader = stream.try_clone()?;
        let connection = Arc::new(Connection {
            writer: Mutex::new(stream),
            pending: Mutex::new(Pending::default()),
        });
        let for_reader = Arc::clone(&connection);
        let counters = Arc::clone(&self.counters);
        std::thread::Builder::new()
            .name("ebb-rpc-reader".to_owned())
            .spawn(move || read_loop(&for_reader, reader, &counters))?;
        if 0 < slot.opened.fetch_add(1, Ordering::Relaxed) {
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(old) = current.replace(Arc::clone(&connection)) {
            old.close(errno::ECONNRESET, "replaced by a new connection");
        }
        Ok(connection)
    }

    fn call_header(&self, xid: u32, procedure: u32) -> Vec<u8> {
        let message = rpc_msg {
            xid,
            body: msg_body::CALL(call_body {
                rpcvers: 2,
                prog: self.target.program,
                vers: self.target.version,
                proc: procedure,
                cred: self.credential.borrow(),
                verf: opaque_auth::default(),
            }),
        };
        let mut header = Vec::with_capacity(message.packed_size());
        message.pack(&mut header).expect("packing into a Vec");
        header
    }
}

impl Drop for RpcClient {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Some(connection) = lock(&slot.current).take() {
                connection.close(errno::ECONNABORTED, "the client was dropped");
            }
        }
    }
}

/// What became of one transmission.
enum Outcome {
    Reply(Vec<u8>),
    TimedOut(Arc<Connection>),
    Lost(Lost),
}

/// Why a connection could not carry a call: the errno and what happened.
#[derive(Debug, Clone)]
struct Lost {
    code: i32,
    why: String,
}

impl Lost {
    fn connecting(error: &io::Error) -> Lost {
        let code = error.raw_os_error().unwrap_or(errno::EIO);
        Lost { code, why: format!("cannot connect: {}", io::Error::from_raw_os_error(code).kind()) }
    }

    fn closed(code: i32, why: &str) -> Lost {
        Lost { code, why: format!("connection lost: {why}") }
    }
}

type Waiter = SyncSender<Result<Vec<u8>, Lost>>;

/// Calls waiting on one connection, or why it closed.
#[derive(Default)]
struct Pending {
    waiters: HashMap<u32, Waiter>,
    closed: Option<(i32, String)>,
}

struct Connection {
    writer: Mutex<TcpStream>,
    pending: Mutex<Pending>,
}

impl Connection {
    fn is_closed(&self) -> bool {
        lock(&self.pending).closed.is_some()
    }

    /// Registers `xid`, sends the record and waits up to `timeout` for the reply.
    fn round_trip(self: Arc<Self>, xid: u32, pieces: &[&[u8]], timeout: Duration) -> Outcome {
        let (sender, receiver) = mpsc::sync_channel(1);
        {
            let mut pending = lock(&self.pending);
            if let Some((code, why)) = &pending.closed {
                return Outcome::Lost(Lost::closed(*code, why));
            }
            pending.waiters.insert(xid, sender);
        }
        // The write lock is released before `close`, which takes it to shut the socket down.
        let sent = write_pieces(&mut lock(&self.writer), pieces);
        if let Err(error) = sent {
            let code = error.raw_os_error().unwrap_or(errno::ECONNRESET);
            self.close(code, &format!("sending failed: {error}"));
        }
        match receiver.recv_timeout(timeout) {
            Ok(Ok(record)) => Outcome::Reply(record),
            Ok(Err(lost)) => Outcome::Lost(lost),
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.pending).waiters.remove(&xid);
                Outcome::TimedOut(self)
            }
            Err(RecvTimeoutError::Disconnected) => {
                Outcome::Lost(Lost::closed(errno::ECONNRESET, "the connection closed"))
            }
        }
    }

    /// Closes the connection (idempotent): every waiting call gets `code`, the socket is shut
    /// down so the reader thread ends.
    fn close(&self, code: i32, why: &str) {
        let waiters = {
            let mut pending = lock(&self.pending);
            if pending.closed.is_some() {
                return;
            }
            pending.closed = Some((code, why.to_owned()));
            std::mem::take(&mut pending.waiters)
        };
        for waiter in waiters.into_values() {
            let _ = waiter.send(Err(Lost::closed(code, why)));
        }
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
    }

    /// Hands a reply record to its waiter; unknown xids are counted and dropped.
    fn deliver(&self, record: Vec<u8>, counters: &RpcCounters) {
        let waiter = reply_xid(&record).and_then(|xid| lock(&self.pending).waiters.remove(&xid));
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(Ok(record));
            }
            None => {
                counters.bad_xids.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The reader thread of one connection: delivers records until the stream ends or breaks.
fn read_loop(connection: &Connection, stream: TcpStream, counters: &RpcCounters) {
    // A library thread must not take a program's signals: one that waits for SIGTERM with
    // sigwait (ebb mount) blocks it in its own threads, but this one may predate that, and a
    // SIGTERM delivered here would end the program.
    let _ = nix::sys::signal::SigSet::all().thread_block();
    let mut stream = BufReader::with_capacity(64 << 10, stream);
    let (code, why) = loop {
        match read_record(&mut stream, RECORD_BYTES_MAX) {
            Ok(record) => connection.deliver(record, counters),
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                break (errno::ECONNRESET, "the server closed the connection".to_owned());
            }
            Err(error) => {
                let code = error.raw_os_error().unwrap_or(errno::EIO);
                break (code, error.to_string());
            }
        }
    };
    connection.close(code, &why);
}

/// Reads one record (all its fragments). A record longer than `limit` is `InvalidData`.
pub(crate) fn read_record(stream: &mut impl Read, limit: usize) -> io::Result<Vec<u8>> {
    let mut record = Vec::new();
    loop {
        let mut marker = [0; 4];
        stream.read_exact(&mut marker)?;
        let marker = u32::from_be_bytes(marker);
        let length = (marker & !LAST_FRAGMENT) as usize;
        if limit < record.len() + length {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "garbled RPC stream: a record of more than {} bytes (limit {limit})",
                    record.len() + length
                ),
            ));
        }
        let start = record.len();
        record.resize(start + length, 0);
        stream.read_exact(&mut record[start..])?;
        if marker & LAST_FRAGMENT != 0 {
            return Ok(record);
        }
    }
}

/// The xid of a record that looks like a reply (xid, then message type 1).
fn reply_xid(record: &[u8]) -> Option<u32> {
    let xid = u32::from_be_bytes(record.get(0..4)?.try_into().ok()?);
    let kind = u32::from_be_bytes(record.get(4..8)?.try_into().ok()?);
    (kind == 1).then_some(xid)
}

/// What is wrong with a reply: an errno the server's answer maps to, or `None` for a reply
/// that does not decode.
pub(crate) struct Failure {
    pub(crate) code: Option<i32>,
    pub(crate) why: String,
}

/// Checks a reply's header: accepted, successful, for `xid`; the results follow it.
pub(crate) fn parse_reply(record: Vec<u8>, xid: u32) -> Result<Reply, Failure> {
    let garbled = |why: String| Failure { code: None, why };
    let refused = |code: i32, why: String| Failure { code: Some(code), why };
    let mut cursor = &record[..];
    let (message, _) = rpc_msg::unpack(&mut cursor).map_err(|error| garbled(error.to_string()))?;
    if message.xid != xid {
        return Err(garbled(format!("xid {} in a reply to xid {xid}", message.xid)));
    }
    let accepted = match message.body {
        msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted)) => accepted,
        msg_body::REPLY(reply_body::MSG_DENIED(rejected_reply::AUTH_ERROR(stat))) => {
            return Err(refused(
                errno::EACCES,
                format!("the server refused the credential: {stat}"),
            ));
        }
        msg_body::REPLY(reply_body::MSG_DENIED(rejected_reply::RPC_MISMATCH { low, high })) => {
            let why = format!("the server speaks RPC versions {low}..={high}, not 2");
            return Err(refused(errno::EPROTONOSUPPORT, why));
        }
        msg_body::CALL(_) => return Err(garbled("a call where a reply was expected".to_owned())),
    };
    let (code, why) = match accepted.reply_data {
        accept_stat_data::SUCCESS => {
            let results_at = record.len() - cursor.len();
            return Ok(Reply { record, results_at });
        }
        accept_stat_data::PROG_UNAVAIL => (errno::EPFNOSUPPORT, "program unavailable".to_owned()),
        accept_stat_data::PROG_MISMATCH { low, high } => {
            (errno::EPROTONOSUPPORT, format!("program versions {low}..={high} only"))
        }
        accept_stat_data::PROC_UNAVAIL => (errno::EOPNOTSUPP, "procedure unavailable".to_owned()),
        accept_stat_data::GARBAGE_ARGS => {
            (errno::EIO, "the server could not decode the arguments".to_owned())
        }
        accept_stat_data::SYSTEM_ERR => (errno::EREMOTEIO, "system error on the server".to_owned()),
    };
    Err(refused(code, why))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Writes every piece, continuing after short vectored writes.
fn write_pieces(stream: &mut TcpStream, pieces: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = pieces.iter().map(|piece| IoSlice::new(piece)).collect();
    let mut remaining = &mut slices[..];
    IoSlice::advance_slices(&mut remaining, 0);
    while !remaining.is_empty() {
        match stream.write_vectored(remaining) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(written) => IoSlice::advance_slices(&mut remaining, written),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
