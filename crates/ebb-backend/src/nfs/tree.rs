//! The NFSv3 procedures of a directory tree (RFC 1813 sections 3.3.5 to 3.3.18): what a mount
//! needs beyond the flat backend's files.

use std::io;

use nfs3_types::nfs3::{
    FSSTAT3args, FSSTAT3resok, LINK3args, LINK3resok, MKDIR3args, MKDIR3resok, MKNOD3args,
    MKNOD3resok, PATHCONF3args, PATHCONF3resok, READDIRPLUS3args, READDIRPLUS3resok, READLINK3args,
    READLINK3resok, RENAME3args, RMDIR3args, SYMLINK3args, SYMLINK3resok, cookieverf3, fattr3,
    mknoddata3, nfspath3, sattr3, symlinkdata3,
};
use nfs3_types::xdr_codec::Opaque;

use super::client::{
    FSSTAT, Handle, LINK, MKDIR, MKNOD, NfsClient, PATHCONF, READDIRPLUS, READLINK, RENAME, RMDIR,
    SYMLINK, attributes_of, decode, decode_status, dirop, made,
};

/// Bytes of names and cookies a READDIRPLUS reply may carry (`dircount`), and of the whole
/// reply (`maxcount`): the kernel client's defaults for a 1 MiB rsize are of this order.
const READDIR_NAME_BYTES: u32 = 32 << 10;
const READDIR_REPLY_BYTES: u32 = 128 << 10;

/// One entry of a READDIRPLUS page.
#[derive(Debug)]
pub(crate) struct ListedEntry {
    pub(crate) name: Vec<u8>,
    pub(crate) fileid: u64,
    pub(crate) attributes: Option<fattr3>,
}

/// One READDIRPLUS reply: its entries, where the next page starts, whether it was the last.
#[derive(Debug)]
pub(crate) struct DirPage {
    pub(crate) entries: Vec<ListedEntry>,
    pub(crate) next_cookie: u64,
    pub(crate) verifier: cookieverf3,
    pub(crate) end: bool,
}

/// A created object: its handle and attributes, each if the server sent it.
pub(crate) type Made = (Option<Handle>, Option<fattr3>);

impl NfsClient {
    pub(crate) fn mkdir(
        &self,
        directory: &Handle,
        name: &[u8],
        attributes: sattr3,
    ) -> io::Result<Made> {
        let args = MKDIR3args { where_: dirop(directory, name), attributes };
        let reply = self.call(MKDIR, "MKDIR", &args)?;
        let result: MKDIR3resok = decode(&reply, "MKDIR")?;
        Ok(made(result.obj, result.obj_attributes))
    }

    pub(crate) fn symlink(
        &self,
        directory: &Handle,
        name: &[u8],
        target: &[u8],
        attributes: sattr3,
    ) -> io::Result<Made> {
        let symlink = symlinkdata3 {
            symlink_attributes: attributes,
            symlink_data: nfspath3(Opaque::borrowed(target)),
        };
        let args = SYMLINK3args { where_: dirop(directory, name), symlink };
        let reply = self.call(SYMLINK, "SYMLINK", &args)?;
        let result: SYMLINK3resok = decode(&reply, "SYMLINK")?;
        Ok(made(result.obj, result.obj_attributes))
    }

    pub(crate) fn mknod(
        &self,
        directory: &Handle,
        name: &[u8],
        what: mknoddata3,
    ) -> io::Result<Made> {
        let args = MKNOD3args { where_: dirop(directory, name), what };
        let reply = self.call(MKNOD, "MKNOD", &args)?;
        let result: MKNOD3resok = decode(&reply, "MKNOD")?;
        Ok(made(result.obj, result.obj_attributes))
    }

    pub(crate) fn rmdir(&self, directory: &Handle, name: &[u8]) -> io::Result<()> {
        let reply = self.call(RMDIR, "RMDIR", &RMDIR3args { object: dirop(directory, name) })?;
        decode_status(&reply, "RMDIR").map(drop)
    }

    pub(crate) fn rename(
        &self,
        from_directory: &Handle,
        from: &[u8],
        to_directory: &Handle,
        to: &[u8],
    ) -> io::Result<()> {
        let args = RENAME3args { from: dirop(from_directory, from), to: dirop(to_directory, to) };
        let reply = self.call(RENAME, "RENAME", &args)?;
        decode_status(&reply, "RENAME").map(drop)
    }

    /// Makes `name` in `directory` another name of `file`; the file's attributes after.
    pub(crate) fn link(
        &self,
        file: &Handle,
        directory: &Handle,
        name: &[u8],
    ) -> io::Result<Option<fattr3>> {
        let args = LINK3args { file: file.clone(), link: dirop(directory, name) };
        let reply = self.call(LINK, "LINK", &args)?;
        let result: LINK3resok = decode(&reply, "LINK")?;
        Ok(attributes_of(result.file_attributes))
    }

    pub(crate) fn readlink(&self, symlink: &Handle) -> io::Result<Vec<u8>> {
        let reply = self.call(READLINK, "READLINK", &READLINK3args { symlink: symlink.clone() })?;
        let result: READLINK3resok<'static> = decode(&reply, "READLINK")?;
        Ok(result.data.0.into_owned())
    }

    /// One page of `directory`'s entries from `cookie` (0: the start), with the verifier the
    /// previous page returned (zeros for the first).
    pub(crate) fn readdirplus(
        &self,
        directory: &Handle,
        cookie: u64,
        verifier: cookieverf3,
    ) -> io::Result<DirPage> {
        let args = READDIRPLUS3args {
            dir: directory.clone(),
            cookie,
            cookieverf: verifier,
            dircount: READDIR_NAME_BYTES,
            maxcount: READDIR_REPLY_BYTES,
        };
        let reply = self.call(READDIRPLUS, "READDIRPLUS", &args)?;
        let result: READDIRPLUS3resok<'static> = decode(&reply, "READDIRPLUS")?;
        let mut next_cookie = cookie;
        let entries = result
            .reply
            .entries
            .into_inner()
            .into_iter()
            .map(|entry| {
                next_cookie = entry.cookie;
                ListedEntry {
                    name: entry.name.0.into_owned(),
                    fileid: entry.fileid,
                    attributes: attributes_of(entry.name_attributes),
                }
            })
            .collect();
        Ok(DirPage { entries, next_cookie, verifier: result.cookieverf, end: result.reply.eof })
    }

    pub(crate) fn fsstat(&self, root: &Handle) -> io::Result<FSSTAT3resok> {
        let reply = self.call(FSSTAT, "FSSTAT", &FSSTAT3args { fsroot: root.clone() })?;
        decode(&reply, "FSSTAT")
    }

    pub(crate) fn pathconf(&self, object: &Handle) -> io::Result<PATHCONF3resok> {
        let reply = self.call(PATHCONF, "PATHCONF", &PATHCONF3args { object: object.clone() })?;
        decode(&reply, "PATHCONF")
    }
}
