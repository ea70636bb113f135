//! A FUSE filesystem whose file data goes through ebb's cache and writeback (built on ebb-runtime).
