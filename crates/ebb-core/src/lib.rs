//! ebb-core: the writeback engine as a deterministic state machine.
//!
//! Drivers (the real-time runtime and the virtual-time simulator) feed events stamped with the
//! current monotonic time and carry out the actions the engine emits. The engine never performs
//! IO, never reads a clock, never spawns a thread and never draws a random number, so the same
//! sequence of inputs always yields the same sequence of outputs.
#![forbid(unsafe_code)]

pub mod time;
pub mod bandwidth;
pub mod config;
pub mod fprop;
pub mod limits;
pub mod position;
pub mod ids;
pub mod pagemap;

pub use config::{BackendConfig, Config, ConfigError, PAGE_SIZE};
pub use ids::*;
pub use pagemap::{PageMap, PageState, Run};
pub use time::{Duration, Instant};
