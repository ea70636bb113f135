//! Time as the core sees it: a monotonic instant and a duration, both in nanoseconds.
//!
//! The core never reads a clock. Every entry point takes `now: Instant` from its driver (the
//! runtime reads the OS monotonic clock once per loop turn; the simulator passes virtual time),
//! so the same sequence of inputs always produces the same outputs.
//!
//! Several kernel formulas round through jiffies (`HZ`); `Config::hz` keeps that tick rate as a
//! parameter and [`Instant::jiffies`] converts, so traces can be compared with the kernel's.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A point on the driver's monotonic timeline, in nanoseconds since an arbitrary origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

/// A span of time in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(u64);

impl Instant {
    /// The origin of the timeline.
    pub const ZERO: Instant = Instant(0);

    /// An instant `ns` nanoseconds after the origin.
    pub const fn from_nanos(ns: u64) -> Instant {
        Instant(ns)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the origin, for reports.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// Whole ticks of a `hz` clock since the origin (the kernel's `jiffies`).
    pub fn jiffies(self, hz: u64) -> u64 {
        ((self.0 as u128 * hz as u128) / 1_000_000_000) as u64
    }

    /// The instant of tick `jiffies` of a `hz` clock.
    pub fn from_jiffies(jiffies: u64, hz: u64) -> Instant {
        Instant(((jiffies as u128 * 1_000_000_000) / hz as u128) as u64)
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    /// No time.
    pub const ZERO: Duration = Duration(0);

    /// `ns` nanoseconds.
    pub const fn from_nanos(ns: u64) -> Duration {
        Duration(ns)
    }

    /// `us` microseconds.
    pub const fn from_micros(us: u64) -> Duration {
        Duration(us * 1_000)
    }

    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Duration {
        Duration(ms * 1_000_000)
    }

    /// `s` seconds.
    pub const fn from_secs(s: u64) -> Duration {
        Duration(s * 1_000_000_000)
    }

    /// Nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Microseconds, rounded down.
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }

    /// Milliseconds, rounded down.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// Milliseconds as a float, for reports.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// Seconds as a float, for reports.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `jiffies` ticks of a `hz` clock.
    pub fn from_jiffies(jiffies: u64, hz: u64) -> Duration {
        Duration(((jiffies as u128 * 1_000_000_000) / hz as u128) as u64)
    }

    /// Whole ticks of a `hz` clock in this duration, rounded down.
    pub fn jiffies(self, hz: u64) -> u64 {
        ((self.0 as u128 * hz as u128) / 1_000_000_000) as u64
    }

    /// Multiplies by an integer, saturating.
    pub fn saturating_mul(self, factor: u64) -> Duration {
        Duration(self.0.saturating_mul(factor))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: a later `rhs` gives zero.
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        Duration(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Duration {
    fn add_assign(&mut self, rhs: Duration) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}", self.0 / 1_000_000_000, (self.0 / 1_000) % 1_000_000)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.as_millis_f64())
    }
}
