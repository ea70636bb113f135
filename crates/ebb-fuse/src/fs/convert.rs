//! Conversions between the backend's types and FUSE's: errnos, credentials, file types and
//! times, and the replies that carry a `Result`.

use std::io;

use ebb_backend::{Credentials, FileKind, SetTime};
use fuser::{
    Errno, FileAttr, FileType, ReplyAttr, ReplyEmpty, ReplyEntry, ReplyXattr, Request, TimeOrNow,
};

use super::TTL;

/// The errno of an IO error: the OS's if it carries one, else one chosen from its kind.
pub(crate) fn errno_of(error: &io::Error) -> Errno {
    // The backend's errno too (S3's errors carry one without being OS errors): without it a
    // refused connection's kind mapped to EIO, and no outage was seen as one.
    if let Some(raw) = ebb_backend::errno_of(error) {
        return Errno::from_i32(raw);
    }
    use io::ErrorKind as K;
    let raw = match error.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::InvalidInput => libc::EINVAL,
        K::StorageFull => libc::ENOSPC,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::TimedOut => libc::ETIMEDOUT,
        K::Unsupported => libc::EOPNOTSUPP,
        K::Interrupted => libc::EINTR,
        K::WouldBlock => libc::EAGAIN,
        K::FileTooLarge => libc::EFBIG,
        K::OutOfMemory => libc::ENOMEM,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        K::DirectoryNotEmpty => libc::ENOTEMPTY,
        K::CrossesDevices => libc::EXDEV,
        _ => libc::EIO,
    };
    Errno::from_i32(raw)
}

/// [`errno_of`] as a `map_err` argument.
pub(super) fn to_errno(error: io::Error) -> Errno {
    errno_of(&error)
}

/// The caller of `req`: its ids, and its supplementary groups from `/proc/PID/status` (none if
/// the process is gone).
pub(super) fn credentials(req: &Request) -> Credentials {
    let groups = std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|line| line.strip_prefix("Groups:"))?;
            Some(line.split_whitespace().filter_map(|group| group.parse().ok()).collect())
        })
        .unwrap_or_default();
    Credentials { uid: req.uid(), gid: req.gid(), groups }
}

pub(super) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub(super) fn set_time(value: Option<TimeOrNow>) -> Option<SetTime> {
    value.map(|value| match value {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => SetTime::At(at),
    })
}

pub(super) fn reply_entry(reply: ReplyEntry, result: Result<(FileAttr, u64), Errno>) {
    match result {
        Ok((attr, generation)) => reply.entry(&TTL, &attr, fuser::Generation(generation)),
        Err(error) => reply.error(error),
    }
}

pub(super) fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(error) => reply.error(error),
    }
}

pub(super) fn reply_attr(reply: ReplyAttr, result: Result<FileAttr, Errno>) {
    match result {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(error) => reply.error(error),
    }
}

pub(super) fn reply_xattr(reply: ReplyXattr, value: Result<Vec<u8>, Errno>, size: u32) {
    match value {
        Ok(value) if size == 0 => reply.size(u32::try_from(value.len()).unwrap_or(u32::MAX)),
        Ok(value) if value.len() <= size as usize => reply.data(&value),
        Ok(_) => reply.error(Errno::ERANGE),
        Err(error) => reply.error(error),
    }
}
