//! ebb-sim: the virtual-time driver of ebb-core.
//!
//! A single-threaded discrete-event loop (events ordered by time, then by sequence number)
//! drives the same `ebb_core` engine the runtime drives, against device and server models,
//! with workloads, fault injection and checkers. One seeded PRNG is the only source of
//! randomness and no wall clock is read, so a seed reproduces a run exactly.
//!
//! [`backend::SimBackend`] is the device models' storage semantics as a real
//! `ebb_backend::Backend` (bytes in memory, durability by the model's rules, no sleeping).
#![forbid(unsafe_code)]

pub mod backend;
pub mod device;
pub mod experiment;
pub mod memload;
pub mod output;
pub mod prng;
pub mod queue;
pub mod report;
pub mod reproduce;
pub mod run;
pub mod swarm;
