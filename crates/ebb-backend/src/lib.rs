//! The Backend trait (positional read, stable/unstable write, commit, sync), the O_DIRECT directory and memory backends, and one conformance suite every backend passes.
