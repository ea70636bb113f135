//! The real-time driver of ebb-core: threads, the monotonic clock, real backends, and the public API (open, read, write, fsync, sync, close, drain, stats).
