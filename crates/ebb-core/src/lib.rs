//! ebb-core: the writeback engine as a deterministic state machine.
//!
//! Drivers (the real-time runtime and the virtual-time simulator) feed events stamped with the
//! current monotonic time and carry out the actions the engine emits. The engine never performs
//! IO, never reads a clock, never spawns a thread and never draws a random number, so the same
//! sequence of inputs always yields the same sequence of outputs.
#![forbid(unsafe_code)]

/// Asserts an invariant where the state it covers changes (`assert!`'s arguments): checked in
/// debug builds (every test, a debug `ebb swarm`) and with the `invariants` feature (CI's
/// release swarm), compiled out otherwise, where the code goes on as it always did.
macro_rules! invariant {
    ($($arg:tt)*) => {
        if cfg!(any(debug_assertions, feature = "invariants")) {
            assert!($($arg)*);
        }
    };
}

mod bandwidth;
pub mod config;
mod engine;
pub mod event;
mod flusher;
mod fprop;
mod ids;
mod limits;
mod memory;
pub mod outage;
mod pagemap;
mod position;
mod reclaim;
mod recommit;
pub mod stats;
pub mod time;
mod trace;
mod wbt;
pub mod writer;

pub use bandwidth::INIT_BW;
pub use config::{
    BackendConfig, Config, ConfigError, CounterReads, InitialBandwidth, PAGE_SIZE, ReclaimPolicy,
    ThrottlePolicy, UnstableAccounting, WbtMode,
};
pub use engine::{CoreBug, Engine, MapStore, PageMaps, WRITEPAGES_SIZE_BUCKETS};
pub use event::{Action, ErrorClass, Event, IoClass, IoError, Issuer, Stability, Verdict};
pub use ids::*;
pub use pagemap::{PageMap, PageState, Run, flag as page_flag};
pub use position::MAX_PAUSE;
pub use reclaim::SWAP_INODE;
pub use stats::{BdiStats, FileErrors, MemInfo, Stats};
pub use time::{Duration, Instant};
pub use trace::TraceEvent;
pub use writer::{NextStep, WaitOn, WriteStep, Writer, WriterInput, WriterNext, write_pages};
