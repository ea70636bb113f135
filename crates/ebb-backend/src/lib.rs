//! The storage boundary of ebb: the `Backend` trait, its real implementations and the one
//! conformance suite every implementation passes.
//!
//! ebb does its own page caching and writeback. The engine decides which page ranges to write
//! and when; a backend only performs positional IO on named files and reports results exactly
//! as the OS (or the server) gave them. The cache always reads and writes whole 4 KiB pages at
//! 4 KiB-aligned offsets, in runs of contiguous pages, so the contract is written for that
//! caller, but every backend must also answer any other input without panicking.
//!
//! | item | what it is |
//! |---|---|
//! | [`Backend`], [`BackendFile`] | the blocking trait pair (namespace, per-file IO) |
//! | [`DirBackend`] | a directory of files opened with `O_DIRECT` (the default backend) |
//! | [`open_direct_path`] | one file of any path opened like a `DirBackend` file |
//! | [`Namespace`] | names, directories and attributes a filesystem (the FUSE mount) serves over a backend |
//! | [`DirNamespace`] | a local directory as a namespace (`O_PATH` nodes, `*at` calls) |
//! | [`namespace_conformance`] | named checks any namespace must pass |
//! | [`MemBackend`] | files in memory, optionally two-phase (NFS-like unstable writes) |
//! | [`S3Backend`] | one S3 object per file, written as multipart parts, committed at `sync` |
//! | [`NfsBackend`], [`NfsOptions`], [`NfsFile`] | the files of an NFSv3 export, written UNSTABLE and committed (a userspace NFS client) |
//! | [`NfsNamespace`] | an NFSv3 export as the tree a mount serves (file handles as nodes) |
//! | [`NfsServer`] | nfs-ganesha on 127.0.0.1 for tests and benchmarks, through `scripts/nfs-server` |
//! | [`FaultyBackend`] | a wrapper that injects errors and latency on a schedule, for tests |
//! | [`AlignedBuf`] | an owned, 4096-aligned, page-multiple byte buffer |
//! | [`conformance`] | named checks any backend (real or simulated) must pass |
//! | [`backend_conformance!`], [`namespace_conformance!`] | one `#[test]` per check of a suite, for a backend's or a namespace's tests |
//! | [`check_name`], [`check_request`], [`check_extent`] | the name and request rules, for backends outside this crate |
//! | [`network_writeback_throttling`] | the wbt settings of a network backend (NFS, S3) |
//! | [`errno_error`], [`errno_of`] | an IO error with an errno and a server's message, and its errno |
//!
//! The simulator's backend, `ebb_sim::backend::SimBackend`, lives in `ebb-sim` (files in
//! memory with a device model's durability) and passes the same suite.
//!
//! `unsafe` is denied in the whole crate; the exceptions are the allocation inside
//! [`AlignedBuf`] and the file-handle system calls of the directory namespace (`handle.rs`).
#![deny(unsafe_code)]

mod aligned;
mod backend;
pub mod conformance;
mod conformance_macro;
mod dir;
mod dir_namespace;
mod faulty;
mod fd_cache;
mod handle;
mod mem;
mod namespace;
pub mod namespace_conformance;
mod nfs;
pub mod s3;

pub use aligned::{AlignedBuf, HUGE_PAGE_SIZE, PAGE_SIZE};
pub use backend::{
    Backend, BackendFile, Capabilities, CommitReply, NETWORK_WBT_MIN_DEPTH, OpenOptions,
    ServerRestart, Stability, WriteReply, WriteSource, check_extent, check_name, check_request,
    errno_error, errno_of, network_writeback_throttling,
};
pub use dir::{DirBackend, open_direct_path};
pub use dir_namespace::{DirNamespace, DirNode};
pub use faulty::{FaultOp, FaultPlan, FaultyBackend};
pub use mem::MemBackend;
pub use namespace::{
    Attr, Credentials, DirEntries, DirEntry, Fallocate, FileKind, Namespace, RenameFlags, SetAttr,
    SetTime, StatFs, XattrSet, unsupported,
};
pub use nfs::{NfsBackend, NfsFile, NfsNamespace, NfsNode, NfsOptions, NfsServer};
pub use s3::{S3Backend, S3Namespace, S3Node, S3Options};
