//! ebb-core: the writeback engine as a deterministic state machine.
//!
//! Drivers (the real-time runtime and the virtual-time simulator) feed events stamped with the
//! current monotonic time and carry out the actions the engine emits. The engine never performs
//! IO, never reads a clock, never spawns a thread and never draws a random number, so the same
//! sequence of inputs always yields the same sequence of outputs.
#![forbid(unsafe_code)]

pub mod bandwidth;
pub mod config;
mod engine;
pub mod event;
pub mod flusher;
pub mod fprop;
pub mod ids;
pub mod limits;
pub mod memory;
pub mod outage;
pub mod pagemap;
pub mod position;
pub mod reclaim;
mod recommit;
pub mod stats;
pub mod time;
pub mod trace;
pub mod wbt;
pub mod writer;

pub use config::{
    BackendConfig, Config, ConfigError, CounterReads, InitialBandwidth, PAGE_SIZE, ReclaimPolicy,
    ThrottlePolicy, UnstableAccounting, WbtMode,
};
pub use engine::{CoreBug, Engine, MapStore, PageMaps, WRITEPAGES_SIZE_BUCKETS};
pub use event::{Action, ErrorClass, Event, IoClass, IoError, Issuer, Stability, Verdict};
pub use ids::*;
pub use pagemap::{PageMap, PageState, Run};
pub use stats::{BdiStats, FileErrors, MemInfo, Stats};
pub use time::{Duration, Instant};
pub use trace::TraceEvent;
pub use writer::{NextStep, WaitOn, WriteStep, Writer, WriterInput, WriterNext, write_pages};
