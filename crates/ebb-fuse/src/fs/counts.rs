//! What the mount's request loops did: the FUSE requests answered, by kind, those answered on
//! the request loop that read them, and the jobs handed from a loop to a pool thread. `ebb
//! stat` shows them under `fuse` ([`RequestCounts::to_json`]); docs/fuse-requests.md measures
//! the cost of a request with them. Relaxed atomic increments (a few nanoseconds against a
//! request's tens of microseconds).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The kinds of request the filesystem implements (fuser answers the others itself:
/// `ENOSYS`, or for `FUSE_INTERRUPT` nothing). The names are the kernel's opcodes, lower case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Fallocate,
    Create,
}

impl Op {
    const ALL: [Op; 29] = [
        Op::Lookup,
        Op::Forget,
        Op::Getattr,
        Op::Setattr,
        Op::Readlink,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Symlink,
        Op::Rename,
        Op::Link,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Fsync,
        Op::Opendir,
        Op::Readdir,
        Op::Releasedir,
        Op::Fsyncdir,
        Op::Statfs,
        Op::Setxattr,
        Op::Getxattr,
        Op::Listxattr,
        Op::Removexattr,
        Op::Fallocate,
        Op::Create,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Forget => "forget",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Readlink => "readlink",
            Op::Mknod => "mknod",
            Op::Mkdir => "mkdir",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Symlink => "symlink",
            Op::Rename => "rename",
            Op::Link => "link",
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Fsync => "fsync",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Releasedir => "releasedir",
            Op::Fsyncdir => "fsyncdir",
            Op::Statfs => "statfs",
            Op::Setxattr => "setxattr",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Removexattr => "removexattr",
            Op::Fallocate => "fallocate",
            Op::Create => "create",
        }
    }
}

/// The counts of one mount.
#[derive(Default)]
pub(crate) struct RequestCounts {
    requests: [AtomicU64; Op::ALL.len()],
    /// Reads answered from the cache on the request loop.
    reads_on_loop: AtomicU64,
    /// Writes answered on the request loop (the throttle let them through).
    writes_on_loop: AtomicU64,
    /// Namespace requests (lookup, getattr, create, unlink, ...) of a local directory answered
    /// on the request loop.
    meta_on_loop: AtomicU64,
    /// Flushes and releases answered on the request loop (nothing to write back at close).
    flushes_on_loop: AtomicU64,
    releases_on_loop: AtomicU64,
    /// Jobs run by the read pool, the write pool (writes, fsync, flush, release, fallocate,
    /// woken writes) and the guard's pool (requests that may wait on the backend: lookups,
    /// getattr, open, create, the namespace's changes).
    pub(crate) read_pool: Arc<AtomicU64>,
    pub(crate) write_pool: Arc<AtomicU64>,
    pub(crate) meta_pool: Arc<AtomicU64>,
    /// Requests taken from the io_uring queues (`crate::uring`); 0 with the classic loop.
    pub(crate) from_rings: Arc<AtomicU64>,
    /// Whether the io_uring queues take the requests.
    pub(crate) uring: std::sync::atomic::AtomicBool,
    /// The copies of write requests that wait ([`crate::pool::DataBufs`]), once the mount has them.
    pub(crate) copies: std::sync::OnceLock<Arc<crate::pool::DataBufs>>,
}

impl RequestCounts {
    /// One request of kind `op` came.
    pub(crate) fn request(&self, op: Op) {
        self.requests[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn read_on_loop(&self) {
        self.reads_on_loop.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn write_on_loop(&self) {
        self.writes_on_loop.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn meta_on_loop(&self) {
        self.meta_on_loop.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn flush_on_loop(&self) {
        self.flushes_on_loop.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release_on_loop(&self) {
        self.releases_on_loop.fetch_add(1, Ordering::Relaxed);
    }

    /// `{"loop": "uring" or "classic", "from_rings": N, "copies": {...}, "requests": {OP: N,
    /// ...}, "on_loop": {"read": N, "write": N, "meta": N, "flush": N, "release": N},
    /// "pool_jobs": {"read": N, "write": N, "meta": N}}`, requests of kinds that never came left
    /// out (`copies`: [`crate::pool::DataBufs::to_json`]). With io_uring, the ring threads are
    /// the request loops.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let load = |count: &AtomicU64| count.load(Ordering::Relaxed);
        let requests: serde_json::Map<String, serde_json::Value> = Op::ALL
            .iter()
            .map(|&op| (op.name(), load(&self.requests[op as usize])))
            .filter(|&(_, count)| count > 0)
            .map(|(name, count)| (name.to_owned(), count.into()))
            .collect();
        let uring = self.uring.load(Ordering::Relaxed);
        let copies = self.copies.get().map(|copies| copies.to_json());
        serde_json::json!({
            "loop": if uring { "uring" } else { "classic" },
            "from_rings": load(&self.from_rings),
            "copies": copies,
            "requests": requests,
            "on_loop": {
                "read": load(&self.reads_on_loop),
                "write": load(&self.writes_on_loop),
                "meta": load(&self.meta_on_loop),
                "flush": load(&self.flushes_on_loop),
                "release": load(&self.releases_on_loop),
            },
            "pool_jobs": {
                "read": load(&self.read_pool),
                "write": load(&self.write_pool),
                "meta": load(&self.meta_pool),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_slot_and_name() {
        for (index, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, index, "{op:?} is out of order in Op::ALL");
        }
        let counts = RequestCounts::default();
        counts.request(Op::Read);
        counts.request(Op::Read);
        counts.request(Op::Create);
        counts.read_on_loop();
        counts.write_pool.fetch_add(3, Ordering::Relaxed);
        let json = counts.to_json();
        assert_eq!(json["requests"], serde_json::json!({"read": 2, "create": 1}));
        assert_eq!(json["on_loop"]["read"], 1);
        assert_eq!(json["pool_jobs"]["write"], 3);
    }
}
