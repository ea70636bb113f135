//! Finding the server's ports (the portmapper, RFC 1833 version 2) and the export's root
//! handle (the MOUNT protocol, RFC 1813 appendix I), as the kernel's `mount -t nfs` does.

use std::io;
use std::net::SocketAddr;

use nfs3_types::mount::{dirpath, mountres3};
use nfs3_types::portmap::{self, mapping};
use nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

use super::client::Handle;
use super::rpc::{RetryPolicy, RpcClient, Target};

/// The MOUNT program, version 3.
pub(crate) const MOUNT_PROGRAM: u32 = 100_005;
const MOUNT_VERSION: u32 = 3;
const MOUNTPROC3_MNT: u32 = 1;
const MOUNTPROC3_UMNT: u32 = 3;
const PMAPPROC_GETPORT: u32 = 3;

/// The portmapper's address on `host` (port 111).
pub(crate) fn portmapper(host: std::net::IpAddr) -> SocketAddr {
    SocketAddr::new(host, portmap::PMAP_PORT)
}

/// Asks the portmapper at `address` for the TCP port of `program` `version`.
pub(crate) fn port_of(
    address: SocketAddr,
    program: u32,
    version: u32,
    policy: RetryPolicy,
) -> io::Result<u16> {
    let rpc = client(address, portmap::PROGRAM, portmap::VERSION, policy);
    let query = mapping { prog: program, vers: version, prot: portmap::IPPROTO_TCP, port: 0 };
    let mut encoded = Vec::with_capacity(query.packed_size());
    query.pack(&mut encoded).map_err(|e| io::Error::other(e.to_string()))?;
    let reply = rpc.call(PMAPPROC_GETPORT, "portmapper GETPORT", &[&encoded]).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("asking the portmapper at {address} for program {program}: {error}"),
        )
    })?;
    let (port, _) = u32::unpack(&mut reply.results()).map_err(|e| {
        io::Error::new(io::ErrorKind::InvalidData, format!("garbled GETPORT reply: {e}"))
    })?;
    match u16::try_from(port) {
        Ok(0) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "program {program} version {version} is not registered with the portmapper at {address}"
            ),
        )),
        Ok(port) => Ok(port),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the portmapper at {address} answered port {port}"),
        )),
    }
}

/// MNT: the root handle of `export` on the MOUNT server at `address`.
pub(crate) fn mount(address: SocketAddr, export: &str, policy: RetryPolicy) -> io::Result<Handle> {
    let rpc = client(address, MOUNT_PROGRAM, MOUNT_VERSION, policy);
    let path = dirpath(Opaque::borrowed(export.as_bytes()));
    let mut encoded = Vec::with_capacity(path.packed_size());
    path.pack(&mut encoded).map_err(|e| io::Error::other(e.to_string()))?;
    let reply = rpc.call(MOUNTPROC3_MNT, "MOUNT", &[&encoded])?;
    let (result, _) = mountres3::unpack(&mut reply.results()).map_err(|e| {
        io::Error::new(io::ErrorKind::InvalidData, format!("garbled MOUNT reply: {e}"))
    })?;
    match result {
        mountres3::Ok(ok) => Ok(Handle { data: Opaque::owned(ok.fhandle.0.into_owned()) }),
        mountres3::Err(status) => {
            let kind = match status as u32 {
                2 => io::ErrorKind::NotFound,
                1 | 13 => io::ErrorKind::PermissionDenied,
                _ => io::ErrorKind::Other,
            };
            Err(io::Error::new(
                kind,
                format!("the server at {address} refused to mount {export}: {status}"),
            ))
        }
    }
}

/// UMNT: tells the server the export is no longer mounted (it only updates the server's
/// list of mounts, so errors are ignored, as the kernel's umount ignores them).
pub(crate) fn unmount(address: SocketAddr, export: &str, policy: RetryPolicy) {
    let rpc = client(address, MOUNT_PROGRAM, MOUNT_VERSION, policy);
    let path = dirpath(Opaque::borrowed(export.as_bytes()));
    let mut encoded = Vec::with_capacity(path.packed_size());
    if path.pack(&mut encoded).is_ok() {
        let _ = rpc.call(MOUNTPROC3_UMNT, "UMNT", &[&encoded]);
    }
}

fn client(address: SocketAddr, program: u32, version: u32, policy: RetryPolicy) -> RpcClient {
    let target =
        Target { address, program, version, connections: 1, bulk_procedures: &[], procedures: 0 };
    RpcClient::new(target, policy, super::uid(), super::gid())
}
