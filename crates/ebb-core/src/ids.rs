//! Identifiers that cross the core boundary.
//!
//! Each is a plain newtype so a backend can never be passed where an inode is expected. The
//! driver chooses inode, writer, group, handle and request identifiers; the core chooses
//! [`IoId`]s (one per IO it asks the driver to perform) and [`FrameId`]s (one per page of the
//! memory budget).

use std::fmt;

macro_rules! id {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id!(
    /// A backend (the kernel's backing device, `bdi`, with its writeback context `wb`): an
    /// index into `Config::backends`.
    BackendId(u32)
);
id!(
    /// A file, chosen by the driver. Its pages are described by one [`crate::PageMap`].
    InodeId(u64)
);
id!(
    /// A writer (the kernel's task in `balance_dirty_pages`), chosen by the driver.
    WriterId(u32)
);
id!(
    /// A group of writers whose pages are accounted together (the kernel's memory cgroup).
    GroupId(u32)
);
id!(
    /// An open handle of a file; write errors are reported once per handle (errseq).
    HandleId(u64)
);
id!(
    /// An IO the core asked the driver to perform; completions name it.
    IoId(u64)
);
id!(
    /// A driver request (fsync, sync, close) whose completion the core reports.
    RequestId(u64)
);
id!(
    /// One page of the memory budget. The runtime keeps a 4 KiB buffer per frame.
    FrameId(u32)
);

impl FrameId {
    /// The frame index as a `usize`, for slice indexing.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl BackendId {
    /// The backend index as a `usize`, for slice indexing.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
