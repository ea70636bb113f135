//! The NFSv3 procedures (RFC 1813) the backend uses, as blocking calls on an [`RpcClient`].
//!
//! Arguments and results are the `nfs3_types` structures. Each result starts with an
//! `nfsstat3`, read here as a plain number so that a status this crate does not know is an
//! error with its number rather than a decoding failure; a status other than `NFS3_OK`
//! becomes the errno of [`errno::of_status`]. READ and WRITE move their data without an
//! extra copy: WRITE sends the caller's buffer as one piece of the record, READ copies the
//! reply's bytes straight into the caller's buffer.

use std::io;

use nfs3_types::nfs3::{
    COMMIT3args, COMMIT3resok, CREATE3args, CREATE3resok, FSINFO3args, FSINFO3resok, GETATTR3args,
    GETATTR3resok, LOOKUP3args, LOOKUP3resok, REMOVE3args, SETATTR3args, createhow3, diropargs3,
    fattr3, filename3, nfs_fh3, post_op_attr, post_op_fh3, sattr3, set_size3, stable_how,
    writeverf3,
};
use nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

use super::errno;
use super::rpc::{Reply, RpcClient};

/// The NFS program and version.
pub(crate) const PROGRAM: u32 = 100_003;
pub(crate) const VERSION: u32 = 3;

/// NFSv3 procedure numbers (RFC 1813 section 3) and the counter each is reported under.
pub(crate) const PROCEDURES: [(u32, &str); 19] = [
    (GETATTR, "getattr_rpcs"),
    (SETATTR, "setattr_rpcs"),
    (LOOKUP, "lookup_rpcs"),
    (READLINK, "readlink_rpcs"),
    (READ, "read_rpcs"),
    (WRITE, "write_rpcs"),
    (CREATE, "create_rpcs"),
    (MKDIR, "mkdir_rpcs"),
    (SYMLINK, "symlink_rpcs"),
    (MKNOD, "mknod_rpcs"),
    (REMOVE, "remove_rpcs"),
    (RMDIR, "rmdir_rpcs"),
    (RENAME, "rename_rpcs"),
    (LINK, "link_rpcs"),
    (READDIRPLUS, "readdirplus_rpcs"),
    (FSSTAT, "fsstat_rpcs"),
    (FSINFO, "fsinfo_rpcs"),
    (PATHCONF, "pathconf_rpcs"),
    (COMMIT, "commit_rpcs"),
];
pub(crate) const PROCEDURE_COUNT: usize = 22;

const GETATTR: u32 = 1;
const SETATTR: u32 = 2;
const LOOKUP: u32 = 3;
pub(crate) const READLINK: u32 = 5;
const READ: u32 = 6;
const WRITE: u32 = 7;
const CREATE: u32 = 8;
pub(crate) const MKDIR: u32 = 9;
pub(crate) const SYMLINK: u32 = 10;
pub(crate) const MKNOD: u32 = 11;
const REMOVE: u32 = 12;
pub(crate) const RMDIR: u32 = 13;
pub(crate) const RENAME: u32 = 14;
pub(crate) const LINK: u32 = 15;
pub(crate) const READDIRPLUS: u32 = 17;
pub(crate) const FSSTAT: u32 = 18;
const FSINFO: u32 = 19;
pub(crate) const PATHCONF: u32 = 20;
const COMMIT: u32 = 21;

/// The procedures that go on the bulk connections (`rpc`'s module docs): the writeback's.
pub(crate) const BULK_PROCEDURES: &[u32] = &[WRITE, COMMIT];

/// An NFS file handle.
pub(crate) type Handle = nfs_fh3;

/// A WRITE's reply: bytes written, how durable, the server's verifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) count: u32,
    pub(crate) committed: stable_how,
    pub(crate) verifier: u64,
}

/// The verifier as a number (its 8 bytes, most significant first).
pub(crate) fn verifier(verf: writeverf3) -> u64 {
    u64::from_be_bytes(verf.0)
}

/// A blocking NFSv3 client.
#[derive(Debug)]
pub(crate) struct NfsClient {
    pub(crate) rpc: RpcClient,
}

impl NfsClient {
    pub(crate) fn getattr(&self, file: &Handle) -> io::Result<fattr3> {
        let reply = self.call(GETATTR, "GETATTR", &GETATTR3args { object: file.clone() })?;
        let result: GETATTR3resok = decode(&reply, "GETATTR")?;
        Ok(result.obj_attributes)
    }

    /// Sets the attributes `attributes` gives; returns the attributes after, if the server
    /// sent them.
    pub(crate) fn setattr(&self, file: &Handle, attributes: sattr3) -> io::Result<Option<fattr3>> {
        let args = SETATTR3args {
            object: file.clone(),
            new_attributes: attributes,
            guard: nfs3_types::nfs3::Nfs3Option::None,
        };
        let reply = self.call(SETATTR, "SETATTR", &args)?;
        let result: nfs3_types::nfs3::SETATTR3resok = decode(&reply, "SETATTR")?;
        Ok(attributes_of(result.obj_wcc.after))
    }

    /// Sets the size.
    pub(crate) fn set_size(&self, file: &Handle, size: u64) -> io::Result<()> {
        self.setattr(file, sattr3 { size: set_size3::Some(size), ..sattr3::default() }).map(drop)
    }

    /// The handle and (if the server sent them) attributes of `name` in `directory`.
    pub(crate) fn lookup(
        &self,
        directory: &Handle,
        name: &[u8],
    ) -> io::Result<(Handle, Option<fattr3>)> {
        let args = LOOKUP3args { what: dirop(directory, name) };
        let reply = self.call(LOOKUP, "LOOKUP", &args)?;
        let result: LOOKUP3resok = decode(&reply, "LOOKUP")?;
        Ok((result.object, attributes_of(result.obj_attributes)))
    }

    /// Creates the regular file `name` with `attributes`, failing with `EEXIST` if the name
    /// exists (`GUARDED`). The handle is `None` when the server did not return one (RFC 1813
    /// allows it; LOOKUP then).
    pub(crate) fn create(
        &self,
        directory: &Handle,
        name: &[u8],
        attributes: sattr3,
    ) -> io::Result<(Option<Handle>, Option<fattr3>)> {
        let args =
            CREATE3args { where_: dirop(directory, name), how: createhow3::GUARDED(attributes) };
        let reply = self.call(CREATE, "CREATE", &args)?;
        let result: CREATE3resok = decode(&reply, "CREATE")?;
        Ok(made(result.obj, result.obj_attributes))
    }

    pub(crate) fn remove(&self, directory: &Handle, name: &[u8]) -> io::Result<()> {
        let reply = self.call(REMOVE, "REMOVE", &REMOVE3args { object: dirop(directory, name) })?;
        decode_status(&reply, "REMOVE").map(|_| ())
    }

    pub(crate) fn fsinfo(&self, root: &Handle) -> io::Result<FSINFO3resok> {
        let reply = self.call(FSINFO, "FSINFO", &FSINFO3args { fsroot: root.clone() })?;
        decode(&reply, "FSINFO")
    }

    /// Reads into `buf` from `offset` with one READ; returns the count and whether the file
    /// ends there.
    pub(crate) fn read(
        &self,
        file: &Handle,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<(usize, bool)> {
        let count = u32::try_from(buf.len()).map_err(|_| invalid("READ of more than 4 GiB"))?;
        let args = nfs3_types::nfs3::READ3args { file: file.clone(), offset, count };
        let reply = self.call(READ, "READ", &args)?;
        let mut results = decode_status(&reply, "READ")?;
        let (_, _) = post_op_attr::unpack(&mut results).map_err(|e| garbled("READ", &e))?;
        let (count, _) = u32::unpack(&mut results).map_err(|e| garbled("READ", &e))?;
        let (eof, _) = bool::unpack(&mut results).map_err(|e| garbled("READ", &e))?;
        let (length, _) = u32::unpack(&mut results).map_err(|e| garbled("READ", &e))?;
        let length = length as usize;
        if length != count as usize || buf.len() < length || results.len() < length {
            return Err(garbled(
                "READ",
                &format!("{length} data bytes for count {count}, {} asked", buf.len()),
            ));
        }
        buf[..length].copy_from_slice(&results[..length]);
        Ok((length, eof))
    }

    /// Writes `data` at `offset` with one WRITE of the given stability.
    pub(crate) fn write(
        &self,
        file: &Handle,
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> io::Result<Written> {
        let count = u32::try_from(data.len()).map_err(|_| invalid("WRITE of more than 4 GiB"))?;
        let mut head = Vec::with_capacity(file.packed_size() + 20);
        let packed = (|| {
            file.pack(&mut head)?;
            offset.pack(&mut head)?;
            count.pack(&mut head)?;
            stable.pack(&mut head)?;
            count.pack(&mut head)
        })();
        packed.map_err(|e| invalid(&format!("WRITE arguments: {e}")))?;
        let padding = [0u8; 3];
        let padding = &padding[..(4 - data.len() % 4) % 4];
        let reply = self.rpc.call(WRITE, "WRITE", &[&head, data, padding])?;
        let result: nfs3_types::nfs3::WRITE3resok = decode(&reply, "WRITE")?;
        if count < result.count {
            return Err(garbled("WRITE", &format!("{} bytes written of {count}", result.count)));
        }
        Ok(Written {
            count: result.count,
            committed: result.committed,
            verifier: verifier(result.verf),
        })
    }

    /// COMMITs `count` bytes from `offset` (0: to the end of the file); returns the verifier.
    pub(crate) fn commit(&self, file: &Handle, offset: u64, count: u32) -> io::Result<u64> {
        let reply =
            self.call(COMMIT, "COMMIT", &COMMIT3args { file: file.clone(), offset, count })?;
        let result: COMMIT3resok = decode(&reply, "COMMIT")?;
        Ok(verifier(result.verf))
    }

    pub(crate) fn call(&self, procedure: u32, name: &str, args: &impl Pack) -> io::Result<Reply> {
        let mut encoded = Vec::with_capacity(args.packed_size());
        args.pack(&mut encoded).map_err(|e| invalid(&format!("{name} arguments: {e}")))?;
        self.rpc.call(procedure, name, &[&encoded])
    }
}

pub(crate) fn dirop<'a>(directory: &Handle, name: &'a [u8]) -> diropargs3<'a> {
    diropargs3 { dir: directory.clone(), name: filename3(Opaque::borrowed(name)) }
}

pub(crate) fn attributes_of(attributes: post_op_attr) -> Option<fattr3> {
    match attributes {
        nfs3_types::nfs3::Nfs3Option::Some(attributes) => Some(attributes),
        nfs3_types::nfs3::Nfs3Option::None => None,
    }
}

/// The handle and attributes of a created object, each if the server sent it.
pub(crate) fn made(
    handle: post_op_fh3,
    attributes: post_op_attr,
) -> (Option<Handle>, Option<fattr3>) {
    let handle = match handle {
        nfs3_types::nfs3::Nfs3Option::Some(handle) => Some(handle),
        nfs3_types::nfs3::Nfs3Option::None => None,
    };
    (handle, attributes_of(attributes))
}

/// The results after an `NFS3_OK` status, or the status's error.
pub(crate) fn decode_status<'a>(reply: &'a Reply, name: &str) -> io::Result<&'a [u8]> {
    let mut results = reply.results();
    let (status, _) = u32::unpack(&mut results).map_err(|e| garbled(name, &e))?;
    match errno::of_status(status) {
        None => Ok(results),
        Some((code, status_name)) => {
            Err(errno::error(code, format!("{name} failed: {status_name} ({status})")))
        }
    }
}

/// Decodes the results of a successful call.
pub(crate) fn decode<T: Unpack>(reply: &Reply, name: &str) -> io::Result<T> {
    let mut results = decode_status(reply, name)?;
    T::unpack(&mut results).map(|(value, _)| value).map_err(|e| garbled(name, &e))
}

fn garbled(name: &str, error: &dyn std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("garbled {name} reply: {error}"))
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message.to_owned())
}
