//! Errors of the NFS backend as the engine classifies them: an errno per failure.
//!
//! NFS status codes map to errno as the kernel's client maps them (`nfs3_stat_to_errno` in
//! `fs/nfs/nfs3xdr.c`), except where the kernel uses its internal codes (above 511), which no
//! program ever sees: those become the errno a program of the kernel's client ends up with
//! (`NFS3ERR_NOTSUPP` is `EOPNOTSUPP`, `NFS3ERR_BADHANDLE` is `ESTALE`, the rest `EIO`), and
//! `NFS3ERR_JUKEBOX` (the server asks to come back later; the kernel waits and retries it
//! itself) is `EAGAIN`, which the engine retries with backoff.

use std::io;

use rustix::io::Errno;

pub(crate) const EPERM: i32 = Errno::PERM.raw_os_error();
pub(crate) const ENOENT: i32 = Errno::NOENT.raw_os_error();
pub(crate) const EIO: i32 = Errno::IO.raw_os_error();
pub(crate) const ENXIO: i32 = Errno::NXIO.raw_os_error();
pub(crate) const EAGAIN: i32 = Errno::AGAIN.raw_os_error();
pub(crate) const EACCES: i32 = Errno::ACCESS.raw_os_error();
pub(crate) const EEXIST: i32 = Errno::EXIST.raw_os_error();
pub(crate) const EXDEV: i32 = Errno::XDEV.raw_os_error();
pub(crate) const ENODEV: i32 = Errno::NODEV.raw_os_error();
pub(crate) const ENOTDIR: i32 = Errno::NOTDIR.raw_os_error();
pub(crate) const EISDIR: i32 = Errno::ISDIR.raw_os_error();
pub(crate) const EINVAL: i32 = Errno::INVAL.raw_os_error();
pub(crate) const EFBIG: i32 = Errno::FBIG.raw_os_error();
pub(crate) const ENOSPC: i32 = Errno::NOSPC.raw_os_error();
pub(crate) const EROFS: i32 = Errno::ROFS.raw_os_error();
pub(crate) const EMLINK: i32 = Errno::MLINK.raw_os_error();
pub(crate) const ENAMETOOLONG: i32 = Errno::NAMETOOLONG.raw_os_error();
pub(crate) const ENOTEMPTY: i32 = Errno::NOTEMPTY.raw_os_error();
pub(crate) const EDQUOT: i32 = Errno::DQUOT.raw_os_error();
pub(crate) const ESTALE: i32 = Errno::STALE.raw_os_error();
pub(crate) const EREMOTE: i32 = Errno::REMOTE.raw_os_error();
pub(crate) const EOPNOTSUPP: i32 = Errno::OPNOTSUPP.raw_os_error();
pub(crate) const EREMOTEIO: i32 = Errno::REMOTEIO.raw_os_error();
pub(crate) const EPROTONOSUPPORT: i32 = Errno::PROTONOSUPPORT.raw_os_error();
pub(crate) const EPFNOSUPPORT: i32 = Errno::PFNOSUPPORT.raw_os_error();
pub(crate) const ETIMEDOUT: i32 = Errno::TIMEDOUT.raw_os_error();
pub(crate) const ECONNRESET: i32 = Errno::CONNRESET.raw_os_error();
pub(crate) const ECONNABORTED: i32 = Errno::CONNABORTED.raw_os_error();

/// An error carrying `code`, the errno the engine classifies (retry or hold), and `message`.
pub(crate) fn error(code: i32, message: String) -> io::Error {
    crate::errno_error(code, message)
}

/// The errno and name of an NFSv3 status (RFC 1813 section 2.6); `None` for `NFS3_OK`.
pub(crate) fn of_status(status: u32) -> Option<(i32, &'static str)> {
    let mapped = match status {
        0 => return None,
        1 => (EPERM, "NFS3ERR_PERM"),
        2 => (ENOENT, "NFS3ERR_NOENT"),
        5 => (EIO, "NFS3ERR_IO"),
        6 => (ENXIO, "NFS3ERR_NXIO"),
        13 => (EACCES, "NFS3ERR_ACCES"),
        17 => (EEXIST, "NFS3ERR_EXIST"),
        18 => (EXDEV, "NFS3ERR_XDEV"),
        19 => (ENODEV, "NFS3ERR_NODEV"),
        20 => (ENOTDIR, "NFS3ERR_NOTDIR"),
        21 => (EISDIR, "NFS3ERR_ISDIR"),
        22 => (EINVAL, "NFS3ERR_INVAL"),
        27 => (EFBIG, "NFS3ERR_FBIG"),
        28 => (ENOSPC, "NFS3ERR_NOSPC"),
        30 => (EROFS, "NFS3ERR_ROFS"),
        31 => (EMLINK, "NFS3ERR_MLINK"),
        63 => (ENAMETOOLONG, "NFS3ERR_NAMETOOLONG"),
        66 => (ENOTEMPTY, "NFS3ERR_NOTEMPTY"),
        69 => (EDQUOT, "NFS3ERR_DQUOT"),
        70 => (ESTALE, "NFS3ERR_STALE"),
        71 => (EREMOTE, "NFS3ERR_REMOTE"),
        10001 => (ESTALE, "NFS3ERR_BADHANDLE"),
        10002 => (EIO, "NFS3ERR_NOT_SYNC"),
        10003 => (EIO, "NFS3ERR_BAD_COOKIE"),
        10004 => (EOPNOTSUPP, "NFS3ERR_NOTSUPP"),
        10005 => (EIO, "NFS3ERR_TOOSMALL"),
        10006 => (EREMOTEIO, "NFS3ERR_SERVERFAULT"),
        10007 => (EINVAL, "NFS3ERR_BADTYPE"),
        10008 => (EAGAIN, "NFS3ERR_JUKEBOX"),
        _ => (EIO, "an unknown NFS status"),
    };
    Some(mapped)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The statuses the engine treats specially keep their meaning: the ones it holds pages
    // for, and the one it must retry.
    #[test]
    fn statuses_map_to_the_kernel_clients_errno() {
        assert_eq!(of_status(0), None);
        let errno = |status| of_status(status).unwrap().0;
        assert_eq!(errno(28), libc::ENOSPC);
        assert_eq!(errno(30), libc::EROFS);
        assert_eq!(errno(69), libc::EDQUOT);
        assert_eq!(errno(70), libc::ESTALE);
        assert_eq!(errno(13), libc::EACCES);
        assert_eq!(errno(27), libc::EFBIG);
        assert_eq!(errno(1), libc::EPERM);
        assert_eq!(errno(2), libc::ENOENT);
        assert_eq!(errno(10008), libc::EAGAIN);
        assert_eq!(errno(5), libc::EIO);
        assert_eq!(of_status(4242).unwrap(), (libc::EIO, "an unknown NFS status"));
    }
}
