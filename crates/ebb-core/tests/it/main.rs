//! Integration tests of ebb-core through its public boundary (events, writer calls, actions).
//!
//! One test binary (matklad's advice). `harness` is a small discrete-event driver with a
//! fixed-rate device; the simulator in ebb-sim is the full driver with real device models.
#![expect(unreachable_pub, reason = "items of the test binary are shared between its modules")]
#![expect(dead_code, reason = "harness helpers are used by some tests only")]

mod harness;

mod durable;
mod dynamics;
mod granules;
mod invariants;
mod nonblocking;
mod outage;
mod reclaim;
mod recommit;
mod requests;
mod scale;
mod seeded;
