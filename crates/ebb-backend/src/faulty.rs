//! `FaultyBackend`: wraps any backend and injects errors and latency on a schedule, for tests
//! of the engine's error and slow-device paths against real or memory backends.
//!
//! A [`FaultPlan`] holds rules, each for one [`FaultOp`]: fail the next N calls with an errno,
//! fail every call until a deadline, fail forever (ENOSPC, EROFS), or sleep before the call.
//! A failing call does not reach the wrapped backend at all (no partial IO). Rules can be
//! armed and cleared at any time, from any thread, also while files are open.
//!
//! Cost when nothing is armed: one relaxed atomic load per call, then the wrapped call.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::backend::{
    Backend, BackendFile, Capabilities, CommitReply, OpenOptions, ServerRestart, WriteReply,
};

/// The operation a fault rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    /// [`Backend::open`].
    Open,
    /// [`BackendFile::read_at`].
    Read,
    /// [`BackendFile::write_at`].
    Write,
    /// [`BackendFile::commit`].
    Commit,
    /// [`BackendFile::sync`].
    Sync,
    /// [`BackendFile::set_size`].
    SetSize,
}

/// The faults a [`FaultyBackend`] injects; shared by the backend and all its open files.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// False when `rules` is empty: the fast path reads only this.
    armed: AtomicBool,
    rules: Mutex<Vec<Rule>>,
    injected_count: AtomicU64,
}

#[derive(Debug)]
struct Rule {
    op: FaultOp,
    effect: Effect,
}

#[derive(Debug)]
enum Effect {
    FailNext { errno: i32, remaining: u64 },
    FailUntil { errno: i32, deadline: Instant },
    FailAlways { errno: i32 },
    Delay { latency: Duration },
}

impl FaultPlan {
    /// Fails the next `count` calls of `op` with `errno` (e.g. `libc::EIO`).
    pub fn fail_next(&self, op: FaultOp, errno: i32, count: u64) {
        if 0 < count {
            self.add(Rule { op, effect: Effect::FailNext { errno, remaining: count } });
        }
    }

    /// Fails every call of `op` with `errno` for `window`, starting now.
    pub fn fail_for(&self, op: FaultOp, errno: i32, window: Duration) {
        // A window too long to represent is "forever".
        match Instant::now().checked_add(window) {
            Some(deadline) => self.add(Rule { op, effect: Effect::FailUntil { errno, deadline } }),
            None => self.fail_always(op, errno),
        }
    }

    /// Fails every call of `op` with `errno` until [`FaultPlan::clear`] (a full or read-only
    /// device: `ENOSPC`, `EROFS`).
    pub fn fail_always(&self, op: FaultOp, errno: i32) {
        self.add(Rule { op, effect: Effect::FailAlways { errno } });
    }

    /// Sleeps for `latency` before every call of `op` (added to any other delay rule).
    pub fn delay(&self, op: FaultOp, latency: Duration) {
        self.add(Rule { op, effect: Effect::Delay { latency } });
    }

    /// Removes every rule.
    pub fn clear(&self) {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        rules.clear();
        self.armed.store(false, Ordering::Release);
    }

    /// How many calls have failed by injection so far.
    pub fn injected_count(&self) -> u64 {
        self.injected_count.load(Ordering::Relaxed)
    }

    fn add(&self, rule: Rule) {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        rules.push(rule);
        self.armed.store(true, Ordering::Release);
    }

    /// Applies the rules for one call of `op`: sleeps for its delays, then returns the first
    /// matching failure, if any.
    fn check(&self, op: FaultOp) -> io::Result<()> {
        if !self.armed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let (latency, failure) = self.decide(op, Instant::now());
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        match failure {
            Some(errno) => {
                self.injected_count.fetch_add(1, Ordering::Relaxed);
                Err(io::Error::from_raw_os_error(errno))
            }
            None => Ok(()),
        }
    }

    /// The total delay and the failing errno for one call of `op` at `now`; consumes one use of
    /// a `FailNext` rule and drops exhausted and expired rules.
    fn decide(&self, op: FaultOp, now: Instant) -> (Duration, Option<i32>) {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        let mut latency = Duration::ZERO;
        let mut failure = None;
        for rule in rules.iter_mut().filter(|rule| rule.op == op) {
            match &mut rule.effect {
                Effect::Delay { latency: extra } => latency = latency.saturating_add(*extra),
                _ if failure.is_some() => {}
                Effect::FailNext { errno, remaining } => {
                    failure = Some(*errno);
                    *remaining -= 1;
                }
                Effect::FailUntil { errno, deadline } if now < *deadline => failure = Some(*errno),
                Effect::FailUntil { .. } => {}
                Effect::FailAlways { errno } => failure = Some(*errno),
            }
        }
        rules.retain(|rule| match rule.effect {
            Effect::FailNext { remaining, .. } => 0 < remaining,
            Effect::FailUntil { deadline, .. } => now < deadline,
            Effect::FailAlways { .. } | Effect::Delay { .. } => true,
        });
        self.armed.store(!rules.is_empty(), Ordering::Release);
        (latency, failure)
    }
}

/// A backend that passes every call to `B` unless its [`FaultPlan`] says to fail or delay it.
#[derive(Debug)]
pub struct FaultyBackend<B> {
    inner: B,
    plan: Arc<FaultPlan>,
}

impl<B: Backend> FaultyBackend<B> {
    /// Wraps `inner` with an empty plan (no faults armed).
    pub fn new(inner: B) -> FaultyBackend<B> {
        FaultyBackend { inner, plan: Arc::new(FaultPlan::default()) }
    }

    /// The plan, to arm and clear faults; it also governs files already open.
    pub fn plan(&self) -> &Arc<FaultPlan> {
        &self.plan
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B: Backend> Backend for FaultyBackend<B> {
    fn open(&self, name: &str, options: OpenOptions) -> io::Result<Arc<dyn BackendFile>> {
        self.plan.check(FaultOp::Open)?;
        let inner = self.inner.open(name, options)?;
        Ok(Arc::new(FaultyFile { inner, plan: Arc::clone(&self.plan) }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        self.inner.exists(name)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn server_restart(&self) -> Option<&dyn ServerRestart> {
        self.inner.server_restart()
    }

    /// The inner backend's declared speed; injected delays do not change it.
    fn write_bandwidth(&self) -> Option<u64> {
        self.inner.write_bandwidth()
    }
}

/// One open file of a [`FaultyBackend`].
struct FaultyFile {
    inner: Arc<dyn BackendFile>,
    plan: Arc<FaultPlan>,
}

impl fmt::Debug for FaultyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyFile").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl BackendFile for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.plan.check(FaultOp::Read)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<WriteReply> {
        self.plan.check(FaultOp::Write)?;
        self.inner.write_at(buf, offset)
    }

    fn write_unit(&self, offset: u64, end: u64) -> Option<std::ops::Range<u64>> {
        self.inner.write_unit(offset, end)
    }

    fn write_unit_in_place(
        &self,
        buf: &mut [u8],
        offset: u64,
        valid: std::ops::Range<usize>,
    ) -> io::Result<WriteReply> {
        self.plan.check(FaultOp::Write)?;
        self.inner.write_unit_in_place(buf, offset, valid)
    }

    // `write_from` is not forwarded: a write that the inner file declines is written again
    // through `write_at`, and would meet the fault plan twice.

    fn commit(&self, offset: u64, len: u64) -> io::Result<CommitReply> {
        self.plan.check(FaultOp::Commit)?;
        self.inner.commit(offset, len)
    }

    fn sync(&self) -> io::Result<()> {
        self.plan.check(FaultOp::Sync)?;
        self.inner.sync()
    }

    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }

    fn set_size(&self, size: u64) -> io::Result<()> {
        self.plan.check(FaultOp::SetSize)?;
        self.inner.set_size(size)
    }

    fn forget_metadata(&self) {
        self.inner.forget_metadata();
    }
}
