//! fsync, sync, reads and truncate.
