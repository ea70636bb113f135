//! `NfsBackend`: the files of an NFSv3 export's root directory, written in two phases.
//!
//! ebb is the NFS client here, as the kernel's client is for a mounted export: the engine's
//! writeback sends `WRITE` with `stable_how = UNSTABLE` (the server may keep the data in its
//! memory) and a `COMMIT` after each writepages batch, and keeps the pages until a COMMIT
//! returns the verifier their WRITE returned. A different verifier means the server restarted
//! and may have lost them: the engine writes them again. This module only carries the
//! protocol; when to write, commit, retry or give up is the engine's.
//!
//! # Layers
//!
//! * `rpc`: ONC RPC over TCP (record marking, `AUTH_UNIX`, calls matched to replies by xid,
//!   several in flight per connection), with bounded retransmission and reconnection.
//! * `mount`: the portmapper and MOUNT, which give the ports and the export's root handle.
//! * `client`: the NFSv3 procedures, on the `nfs3_types` XDR structures.
//! * this file: the URL, [`NfsBackend`] and its files.
//!
//! # URL
//!
//! `nfs://HOST[:PORT]/EXPORT[?OPTION=VALUE&...]`, where `EXPORT` is the path the server
//! exports (as in `mount -t nfs HOST:/EXPORT`). The options are the kernel client's mount
//! options of the same names:
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `port` (or `:PORT`) | portmapper | the NFS server's TCP port |
//! | `mountport` | portmapper | the MOUNT server's TCP port |
//! | `timeo` | 100 (10 s) | tenths of a second a call waits for its reply before it is retransmitted |
//! | `retrans` | 2 | retransmissions after timeouts before a call fails with `ETIMEDOUT` |
//! | `nconnect` | 1 | TCP connections for WRITE and COMMIT, used in turn (1..=16); READ and the metadata have one more of their own |
//! | `wsize`, `rsize` | the server's `wtmax`, `rtmax`, at most 1 MiB | largest WRITE and READ |
//!
//! Without a port the portmapper (port 111) is asked, as the kernel's mount does. `timeo`
//! and `retrans` differ from the kernel's TCP defaults (60 s, 2): a hard mount retries
//! forever anyway, but here a call must fail in time for the engine's write-error deadline
//! (60 s by default) to be what the user sees when the server hangs, so a hung server fails a
//! call after 3 x 10 s. A server that is down (connection refused or reset) fails a call after
//! one reconnect attempt, a quarter of a second later. Calls that time out, such as a COMMIT
//! that makes the server flush gigabytes, are retransmitted, which NFS's procedures allow.
//!
//! # Counters
//!
//! [`Backend::counters`] reports, in the kernel client's words where it has them
//! (`nfsstat -c`, `/proc/self/mountstats`): `calls`, `retransmits`, `timeouts`, `bad_xids`,
//! `reconnects`, the RPCs per procedure (`write_rpcs`, `commit_rpcs`, ...), `serverreadbytes`
//! and `serverwritebytes` (bytes moved by READ and WRITE), and `verifier_changes` (a WRITE or
//! COMMIT reply whose verifier was not seen before: the server restarted).

mod client;
mod errno;
mod mount;
mod namespace;
mod rpc;
mod server;
mod tree;

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nfs3_types::nfs3::{ftype3, sattr3, set_mode3, stable_how};

use crate::backend::{
    Backend, BackendFile, Capabilities, CommitReply, OpenOptions, Stability, WriteReply,
    check_name, check_request,
};
use client::{Handle, NfsClient};
use rpc::{RetryPolicy, RpcClient, Target};

pub use namespace::{NfsNamespace, NfsNode};
pub use server::NfsServer;

/// The largest READ and WRITE the backend sends, as the kernel client's (1 MiB).
const IO_BYTES_MAX: u32 = 1 << 20;

/// Wait before the one reconnect after a refused or lost connection.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(250);

/// Mode of files the backend creates, as [`crate::DirBackend`]'s.
const FILE_MODE: u32 = 0o644;

/// Verifiers remembered to tell a new one from a late reply carrying an older one.
const VERIFIERS_REMEMBERED: usize = 8;

/// Where and how to reach an export: the parsed URL (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsOptions {
    /// Server host name or address.
    pub host: String,
    /// NFS port; `None` asks the portmapper.
    pub port: Option<u16>,
    /// The exported path, starting with `/`.
    pub export: String,
    /// MOUNT port; `None` asks the portmapper.
    pub mount_port: Option<u16>,
    /// How long a call waits for its reply before it is retransmitted (`timeo`).
    pub timeout: Duration,
    /// Retransmissions after timeouts before a call fails (`retrans`).
    pub retrans: u32,
    /// TCP connections to the server (`nconnect`).
    pub nconnect: u32,
    /// Largest WRITE, bytes (`wsize`); `None`: the server's `wtmax`, at most 1 MiB.
    pub wsize_bytes: Option<u32>,
    /// Largest READ, bytes (`rsize`); `None`: the server's `rtmax`, at most 1 MiB.
    pub rsize_bytes: Option<u32>,
}

impl NfsOptions {
    /// Parses `nfs://HOST[:PORT]/EXPORT[?OPTION=VALUE&...]`. Errors name the part at fault.
    pub fn parse(url: &str) -> io::Result<NfsOptions> {
        let bad = |why: String| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("NFS URL {url:?}: {why}"))
        };
        let rest = url
            .strip_prefix("nfs://")
            .ok_or_else(|| bad("does not start with nfs://".to_owned()))?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let slash = location
            .find('/')
            .ok_or_else(|| bad("has no export path after the host".to_owned()))?;
        let (authority, export) = location.split_at(slash);
        let (host, port) = split_host_port(authority).map_err(bad)?;
        if host.is_empty() {
            return Err(bad("has no host".to_owned()));
        }
        let mut options = NfsOptions {
            host: host.to_owned(),
            port,
            export: export.to_owned(),
            mount_port: None,
            timeout: Duration::from_secs(10),
            retrans: 2,
            nconnect: 1,
            wsize_bytes: None,
            rsize_bytes: None,
        };
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) =
                pair.split_once('=').ok_or_else(|| bad(format!("option {pair:?} has no value")))?;
            options.set(name, value).map_err(bad)?;
        }
        Ok(options)
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let number =
            |low: u64, high: u64| -> Result<u64, String> {
                value.parse::<u64>().ok().filter(|number| (low..=high).contains(number)).ok_or_else(
                    || format!("option {name}={value:?} is not a number in {low}..={high}"),
                )
            };
        match name {
            "port" => self.port = Some(number(1, 65_535)? as u16),
            "mountport" => self.mount_port = Some(number(1, 65_535)? as u16),
            "timeo" => self.timeout = Duration::from_millis(number(1, 36_000)? * 100),
            "retrans" => self.retrans = number(0, 100)? as u32,
            "nconnect" => self.nconnect = number(1, 16)? as u32,
            "wsize" => self.wsize_bytes = Some(number(4096, u64::from(IO_BYTES_MAX))? as u32),
            "rsize" => self.rsize_bytes = Some(number(4096, u64::from(IO_BYTES_MAX))? as u32),
            _ => {
                return Err(format!(
                    "unknown option {name:?} (known: port, mountport, timeo, retrans, nconnect, \
                     wsize, rsize)"
                ));
            }
        }
        Ok(())
    }

    fn policy(&self) -> RetryPolicy {
        RetryPolicy { timeout: self.timeout, retrans: self.retrans, backoff: RECONNECT_BACKOFF }
    }
}

/// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
fn split_host_port(authority: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']').ok_or("has an unclosed [ in the host")?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port {
        None => None,
        Some(port) => Some(
            port.parse::<u16>()
                .ok()
                .filter(|port| *port != 0)
                .ok_or_else(|| format!("port {port:?} is not a number in 1..=65535"))?,
        ),
    };
    Ok((host, port))
}

/// The files of an NFSv3 export's root directory (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct NfsBackend {
    shared: Arc<Shared>,
}

struct Shared {
    url: String,
    export: String,
    mount_address: SocketAddr,
    policy: RetryPolicy,
    nfs: NfsClient,
    root: Handle,
    capabilities: Capabilities,
    verifiers: Mutex<Verifiers>,
    server_read_bytes: AtomicU64,
    server_write_bytes: AtomicU64,
}

#[derive(Default)]
struct Verifiers {
    recent: Vec<u64>,
    changes: u64,
}

impl NfsBackend {
    /// Mounts the export of `url` (see the module docs): asks the portmapper for missing
    /// ports, gets the root handle from MOUNT and the transfer sizes from FSINFO. Errors: a
    /// malformed URL (`InvalidInput`), an unreachable server (`ConnectionRefused`, ...), an
    /// export the server refuses (`NotFound`, `PermissionDenied`), each naming the server.
    pub fn connect(url: &str) -> io::Result<NfsBackend> {
        NfsBackend::connect_with(url, &NfsOptions::parse(url)?)
    }

    /// [`NfsBackend::connect`] with parsed options; `url` names the backend in errors.
    pub fn connect_with(url: &str, options: &NfsOptions) -> io::Result<NfsBackend> {
        let policy = options.policy();
        let host = resolve(&options.host)?;
        let port = match options.port {
            Some(port) => port,
            None => {
                mount::port_of(mount::portmapper(host), client::PROGRAM, client::VERSION, policy)?
            }
        };
        let mount_port = match options.mount_port {
            Some(port) => port,
            None => mount::port_of(mount::portmapper(host), mount::MOUNT_PROGRAM, 3, policy)?,
        };
        let mount_address = SocketAddr::new(host, mount_port);
        let root = mount::mount(mount_address, &options.export, policy)?;
        let target = Target {
            address: SocketAddr::new(host, port),
            program: client::PROGRAM,
            version: client::VERSION,
            connections: options.nconnect as usize,
            bulk_procedures: client::BULK_PROCEDURES,
            procedures: client::PROCEDURE_COUNT,
        };
        let nfs = NfsClient { rpc: RpcClient::new(target, policy, uid(), gid()) };
        let info = nfs
            .fsinfo(&root)
            .map_err(|error| io::Error::new(error.kind(), format!("FSINFO of {url}: {error}")))?;
        let write_bytes = transfer_size(info.wtmax, options.wsize_bytes);
        let read_bytes = transfer_size(info.rtmax, options.rsize_bytes);
        let capabilities = Capabilities {
            two_phase: true,
            direct_io: false,
            alignment: 1,
            max_io_bytes: u64::from(write_bytes.min(read_bytes)),
            serial_writes: false,
        };
        Ok(NfsBackend {
            shared: Arc::new(Shared {
                url: url.to_owned(),
                export: options.export.clone(),
                mount_address,
                policy,
                nfs,
                root,
                capabilities,
                verifiers: Mutex::new(Verifiers::default()),
                server_read_bytes: AtomicU64::new(0),
                server_write_bytes: AtomicU64::new(0),
            }),
        })
    }

    /// The URL the backend was connected with.
    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// The writeback settings the kernel gives an NFS mount's bdi: WRITEs of up to the mount's
    /// wsize (the server's `wtmax`, at most 1 MiB); no request queue of its own (a writepages
    /// call hands every WRITE to the RPC layer, whose slot table grows to 65536 entries; the
    /// runtime's IO threads bound what is in flight); writeback throttling of the WRITEs in
    /// flight set up ([`crate::network_writeback_throttling`]) but off by default, as the
    /// kernel has none for a network filesystem (`wbt = ebb` turns it on): beside a stream on
    /// a local ganesha it halved the reads' p99 and p99.9 but tripled their p99.99 and cost the
    /// writer a fifth (BENCHMARKS.md, NFS).
    pub fn writeback_settings(&self, settings: &mut ebb_core::BackendConfig) {
        let page = crate::PAGE_SIZE as u64;
        settings.max_write_pages = (self.shared.capabilities.max_io_bytes / page) as u32;
        settings.queue_depth = 65_536;
        settings.client_queue = true;
        crate::network_writeback_throttling(settings);
        settings.wbt = ebb_core::WbtMode::Off;
        // Close writes the file back and commits it (the NFS client's close-to-open
        // consistency).
        settings.flush_on_close = true;
        // A call unanswered for `timeo` is given up and retransmitted: a call in flight
        // longer is evidence of an outage (`ebb_core::outage`).
        settings.try_timeout_ms = u64::try_from(self.shared.policy.timeout.as_millis()).ok();
    }

    /// Opens `name` in the export's root, creating it if asked; the handle is the file's.
    fn open_file(&self, name: &str, options: OpenOptions) -> io::Result<NfsFile> {
        check_name(name)?;
        let shared = &self.shared;
        let (handle, attributes) = match shared.nfs.lookup(&shared.root, name.as_bytes()) {
            Ok(found) => found,
            Err(error) if error.kind() == io::ErrorKind::NotFound && options.create => {
                let attributes = sattr3 { mode: set_mode3::Some(FILE_MODE), ..sattr3::default() };
                match shared.nfs.create(&shared.root, name.as_bytes(), attributes) {
                    Ok((Some(handle), attributes)) => (handle, attributes),
                    // No handle in the reply, or created by someone else meanwhile.
                    Ok((None, _)) => shared.nfs.lookup(&shared.root, name.as_bytes())?,
                    Err(error) if crate::errno_of(&error) == Some(errno::EEXIST) => {
                        shared.nfs.lookup(&shared.root, name.as_bytes())?
                    }
                    Err(error) => return Err(error),
                }
            }
            Err(error) => return Err(error),
        };
        let attributes = match attributes {
            Some(attributes) => attributes,
            None => shared.nfs.getattr(&handle)?,
        };
        match attributes.type_ {
            ftype3::NF3REG => {}
            ftype3::NF3DIR => {
                return Err(errno::error(
                    errno::EISDIR,
                    format!("{name} in {} is a directory", shared.url),
                ));
            }
            other => {
                let why = format!("{name} in {} is not a regular file but {other}", shared.url);
                return Err(errno::error(errno::EINVAL, why));
            }
        }
        if options.truncate && attributes.size != 0 {
            shared.nfs.set_size(&handle, 0)?;
        }
        Ok(NfsFile { shared: Arc::clone(shared), handle })
    }
}

impl fmt::Debug for NfsBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NfsBackend").field("url", &self.shared.url).finish_non_exhaustive()
    }
}

impl Shared {
    /// Records a verifier from a WRITE or COMMIT reply, counting it if it is new.
    fn note_verifier(&self, verifier: u64) {
        let mut verifiers = self.verifiers.lock().unwrap_or_else(PoisonError::into_inner);
        if verifiers.recent.contains(&verifier) {
            return;
        }
        if !verifiers.recent.is_empty() {
            verifiers.changes += 1;
        }
        if verifiers.recent.len() == VERIFIERS_REMEMBERED {
            verifiers.recent.remove(0);
        }
        verifiers.recent.push(verifier);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let policy = RetryPolicy { timeout: Duration::from_secs(1), retrans: 0, ..self.policy };
        mount::unmount(self.mount_address, &self.export, policy);
    }
}

impl Backend for NfsBackend {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        Ok(Arc::new(self.open_file(name, options)?))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        self.shared.nfs.remove(&self.shared.root, name.as_bytes())
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        match self.shared.nfs.lookup(&self.shared.root, name.as_bytes()) {
            Ok(_) => Ok(true),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(error),
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.shared.capabilities
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let shared = &self.shared;
        let rpc = &shared.nfs.rpc;
        let transport = &rpc.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut counters = vec![
            ("calls", load(&transport.calls)),
            ("retransmits", load(&transport.retransmits)),
            ("timeouts", load(&transport.timeouts)),
            ("bad_xids", load(&transport.bad_xids)),
            ("reconnects", load(&transport.reconnects)),
        ];
        counters.extend(
            client::PROCEDURES.iter().map(|(number, name)| (*name, rpc.procedure_calls(*number))),
        );
        let verifier_changes =
            shared.verifiers.lock().unwrap_or_else(PoisonError::into_inner).changes;
        counters.extend([
            ("serverreadbytes", load(&shared.server_read_bytes)),
            ("serverwritebytes", load(&shared.server_write_bytes)),
            ("verifier_changes", verifier_changes),
        ]);
        counters
    }
}

/// One file of the export, by its file handle: it stays usable after a rename, and after a
/// remove as long as the server keeps the handle.
pub struct NfsFile {
    shared: Arc<Shared>,
    handle: Handle,
}

impl fmt::Debug for NfsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NfsFile").field("url", &self.shared.url).finish_non_exhaustive()
    }
}

impl BackendFile for NfsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        check_request(&self.shared.capabilities, offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() {
            let (count, eof) =
                self.shared.nfs.read(&self.handle, offset + done as u64, &mut buf[done..])?;
            done += count;
            if eof || count == 0 {
                break;
            }
        }
        self.shared.server_read_bytes.fetch_add(done as u64, Ordering::Relaxed);
        Ok(done)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        check_request(&self.shared.capabilities, offset, buf.len())?;
        // The first unstable piece's verifier stands for the whole write: if the server
        // restarted between pieces, the engine's COMMIT then sees a different one.
        let mut stability = Stability::Stable;
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let written =
                self.shared.nfs.write(&self.handle, at, &buf[done..], stable_how::UNSTABLE)?;
            self.shared.note_verifier(written.verifier);
            if written.count == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!(
                        "the server at {} wrote none of {} bytes at offset {at}",
                        self.shared.url,
                        buf.len() - done
                    ),
                ));
            }
            if written.committed == stable_how::UNSTABLE && stability == Stability::Stable {
                stability = Stability::Unstable { verifier: written.verifier };
            }
            done += written.count as usize;
        }
        self.shared.server_write_bytes.fetch_add(done as u64, Ordering::Relaxed);
        Ok(WriteReply { stability })
    }

    fn commit(&self, offset: u64, len: u64) -> io::Result<CommitReply> {
        // COMMIT counts in 32 bits, 0 meaning to the end of the file.
        let count = u32::try_from(len).unwrap_or(0);
        let verifier = self.shared.nfs.commit(&self.handle, offset, count)?;
        self.shared.note_verifier(verifier);
        Ok(CommitReply { verifier })
    }

    fn sync(&self) -> io::Result<()> {
        // Metadata procedures (CREATE, SETATTR) are synchronous in NFSv3; the data needs the
        // COMMIT.
        self.commit(0, 0).map(|_| ())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.shared.nfs.getattr(&self.handle)?.size)
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        self.shared.nfs.set_size(&self.handle, size)
    }
}

/// The largest transfer: the server's maximum, lowered by the option, at most 1 MiB, in
/// whole pages (the cache writes pages).
fn transfer_size(server_bytes_max: u32, option: Option<u32>) -> u32 {
    let page = crate::PAGE_SIZE as u32;
    let bytes = server_bytes_max.min(option.unwrap_or(IO_BYTES_MAX)).min(IO_BYTES_MAX);
    (bytes / page * page).max(page)
}

fn resolve(host: &str) -> io::Result<IpAddr> {
    let mut addresses = (host, 0).to_socket_addrs().map_err(|error| {
        io::Error::new(error.kind(), format!("cannot resolve the NFS server {host:?}: {error}"))
    })?;
    addresses.next().map(|address| address.ip()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("the NFS server {host:?} has no address"))
    })
}

/// The `AUTH_UNIX` identity of calls: this process's.
fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

fn gid() -> u32 {
    rustix::process::getgid().as_raw()
}

#[cfg(test)]
mod tests;
