//! Owed commits: when to commit, in the background, a file whose commit failed on a backend
//! that writes back at close (`flush_on_close`: NFS, S3).
//!
//! On such a backend the data written back is not the file until the backend's own commit
//! (the driver's sync of the backend file; on S3 the CompleteMultipartUpload), which fsync and
//! close run. A close that failed (an outage past `retry_timeout_secs`, a full server) leaves
//! the data held; the engine's retries write it back once the backend takes it again, and
//! without this nothing would commit it: no close is left to run (the object kept its old
//! contents until the unmount's drain, issue 34). The engine owes such a file a commit and
//! asks the driver for it ([`crate::Action::SyncFile`]) once the file is written back.
//!
//! # Goal
//! Every file whose close or backend sync failed is committed once nothing of it is left to
//! write, without anyone's fsync; a backend that keeps refusing the commit is asked at most
//! every [`BACKOFF_MAX`].
//!
//! # Signals
//! Per owed file: whether it is clean (no page dirty, held, under writeback or unstable, no
//! write or COMMIT in flight) and whether every stable write of it has been synced since
//! (the durability epochs of `engine/durable.rs`: a sync whose mark covers every completed
//! write satisfies the debt, whoever ran it); the outcome of each sync the driver reports
//! ([`crate::Event::FileSynced`], [`crate::Event::FileSyncFailed`]).
//!
//! # Control law
//! ```text
//! owe(f)            on a close answered with an error, or a failed sync of f's backend file
//! satisfied(f)      = clean(f) and no stable write of f unsynced   -> the debt is cleared
//! due(f)            = clean(f) and not satisfied(f) and not running(f)
//!                     and now >= not_before(f)
//! due(f)            -> emit SyncFile(f), running(f) = true
//! not clean(f)      -> looked at again at now + LOOK, and at each completion of f
//! sync failed       -> backoff = clamp(2 * backoff, BACKOFF_MIN, BACKOFF_MAX),
//!                      not_before(f) = now + backoff, running(f) = false
//! sync succeeded    -> running(f) = false; cleared if satisfied(f), else
//!                      not_before(f) = now (written again meanwhile: due again once clean,
//!                      the backoff unchanged)
//! f cut to nothing with no handle open (deleted, dropped from the cache) -> cleared
//! ```
//! Properties: a commit is never asked for a file with unwritten data (it would commit a
//! part of it; the next close or this rule commits the rest); at most one is asked at a time
//! per file; a success clears the debt only if it covered every write (a file written again
//! while its commit ran owes another).
//!
//! # Constants
//! | name | value | unit | provenance |
//! |---|---|---|---|
//! | [`BACKOFF_MIN`] | 1 | s | the engine's first retry of held pages (`HOLD_BACKOFF_MIN`): a failed commit fails for the same reasons (an outage, a full server) |
//! | [`BACKOFF_MAX`] | 30 | s | the engine's longest wait between retries of a file (`RETRY_BACKOFF_MAX`) |
//! | [`LOOK`] | 1 | s | derived: each completion of the file looks at it already; this bounds a missed one to a second |
//!
//! # Insufficient data
//! None needed: a file is owed from the failure on, and its page counts say when it is clean.
//!
//! # Stability
//! The backoff doubles per failed commit and caps; a success or a write resets nothing but
//! the time (the backoff only grows while the backend refuses commits, and starts again at
//! [`BACKOFF_MIN`] for a new debt).
//!
//! # Observability
//! `BdiStats::commits_owed` (`ebb stat`'s `BdiCommitsOwed`), `FileErrors::commit_owed` (a
//! file's `commit_owed` in `ebb stat`'s list), the counters `owed_commits` and
//! `owed_commits_failed` (`Stats`). Unit tests below; through a mount,
//! `s3_past_the_deadline_the_data_is_held_and_written_when_the_server_returns`
//! (ebb-cli's `outage` tests).

use std::collections::BTreeMap;

use crate::ids::InodeId;
use crate::time::{Duration, Instant};

/// The wait after a file's first failed commit.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait between two commits of one file.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long an owed file not yet written back waits before it is looked at again.
pub(crate) const LOOK: Duration = Duration::from_secs(1);

/// What an owed file is, seen by the engine now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileState {
    /// Nothing of it dirty, held, under writeback or unstable, no IO of it in flight.
    pub(crate) clean: bool,
    /// Every stable write of it has been synced.
    pub(crate) synced: bool,
}

/// What to do with a file looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Nothing is owed (any more).
    Clear,
    /// Not now.
    Wait,
    /// Ask the driver for the commit.
    Commit,
}

#[derive(Clone, Copy, Debug)]
struct Owed {
    /// No commit of it before then (the backoff after a failed one).
    not_before: Instant,
    /// When a file not yet written back is looked at again.
    look_at: Instant,
    /// The wait after the last failed commit (zero before one failed).
    backoff: Duration,
    /// A commit of it is asked for and not yet answered.
    running: bool,
}

impl Owed {
    fn new(now: Instant, backoff: Duration) -> Owed {
        let at = now + backoff;
        Owed { not_before: at, look_at: at, backoff, running: false }
    }

    /// When the timer is to look at it (never while its commit runs).
    fn at(&self) -> Option<Instant> {
        (!self.running).then_some(self.not_before.max(self.look_at))
    }
}

/// The files owed a commit.
#[derive(Clone, Debug, Default)]
pub(crate) struct Recommits {
    owed: BTreeMap<InodeId, Owed>,
}

impl Recommits {
    /// `inode`'s close or backend sync failed at `now`: it is owed a commit (already owed:
    /// unchanged, so a failure reported twice does not reset the backoff).
    pub(crate) fn owe(&mut self, inode: InodeId, now: Instant) {
        self.owed.entry(inode).or_insert(Owed::new(now, Duration::ZERO));
    }

    /// Whether `inode` is owed a commit.
    pub(crate) fn owes(&self, inode: InodeId) -> bool {
        self.owed.contains_key(&inode)
    }

    /// The files owed a commit, in inode order.
    pub(crate) fn files(&self) -> impl Iterator<Item = InodeId> + '_ {
        self.owed.keys().copied()
    }

    /// The earliest time a file waiting (not running) is to be looked at.
    pub(crate) fn timer(&self) -> Option<Instant> {
        self.owed.values().filter_map(Owed::at).min()
    }

    /// The files waiting whose time has come, in inode order.
    pub(crate) fn due(&self, now: Instant) -> Vec<InodeId> {
        self.owed
            .iter()
            .filter(|(_, o)| o.at().is_some_and(|t| t <= now))
            .map(|(&i, _)| i)
            .collect()
    }

    /// Looks at `inode` (owed or not) in `state` at `now`: the control law's decision, with
    /// the file's entry updated (cleared, looked at again later, or marked running).
    pub(crate) fn look(&mut self, inode: InodeId, state: FileState, now: Instant) -> Decision {
        let Some(owed) = self.owed.get_mut(&inode) else { return Decision::Clear };
        if state.clean && state.synced {
            if !owed.running {
                self.owed.remove(&inode);
                return Decision::Clear;
            }
            // Its answer is still to come; the answer clears it.
            return Decision::Wait;
        }
        if owed.running {
            return Decision::Wait;
        }
        if !state.clean {
            owed.look_at = now + LOOK;
            return Decision::Wait;
        }
        if owed.not_before > now {
            owed.look_at = owed.not_before;
            return Decision::Wait;
        }
        owed.running = true;
        Decision::Commit
    }

    /// A sync of `inode`'s backend file succeeded at `now` (the commit asked for, or any
    /// other); `state` is the file after it. Cleared if it covered everything, else due again
    /// (once clean).
    pub(crate) fn synced(&mut self, inode: InodeId, state: FileState, now: Instant) -> Decision {
        let Some(owed) = self.owed.get_mut(&inode) else { return Decision::Clear };
        owed.running = false;
        owed.not_before = now;
        owed.look_at = now;
        self.look(inode, state, now)
    }

    /// A sync of `inode`'s backend file failed at `now`: tried again after the backoff.
    /// Returns whether the file was owed already (false: the failure makes it owed).
    pub(crate) fn failed(&mut self, inode: InodeId, now: Instant) -> bool {
        let Some(owed) = self.owed.get_mut(&inode) else {
            self.owed.insert(inode, Owed::new(now, BACKOFF_MIN));
            return false;
        };
        let doubled = owed.backoff.as_nanos().saturating_mul(2);
        let backoff =
            Duration::from_nanos(doubled.clamp(BACKOFF_MIN.as_nanos(), BACKOFF_MAX.as_nanos()));
        *owed = Owed::new(now, backoff);
        true
    }

    /// `inode` is gone (deleted, dropped from the cache): nothing is owed.
    pub(crate) fn forget(&mut self, inode: InodeId) {
        self.owed.remove(&inode);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: InodeId = InodeId(7);
    const DIRTY: FileState = FileState { clean: false, synced: false };
    const WRITTEN: FileState = FileState { clean: true, synced: false };
    const DONE: FileState = FileState { clean: true, synced: true };

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn a_commit_is_due_only_once_the_file_is_written_back() {
        let mut r = Recommits::default();
        r.owe(F, at(0));
        assert_eq!(r.look(F, DIRTY, at(0)), Decision::Wait);
        // Looked at again a LOOK later, or at its next completion.
        assert_eq!(r.timer(), Some(at(0) + LOOK));
        assert!(r.due(at(500)).is_empty());
        assert_eq!(r.due(at(1_000)), vec![F]);
        assert_eq!(r.look(F, DIRTY, at(1_000)), Decision::Wait);
        // A completion leaves it clean: due at once, and asked for once.
        assert_eq!(r.look(F, WRITTEN, at(1_200)), Decision::Commit);
        assert_eq!(r.look(F, WRITTEN, at(1_300)), Decision::Wait);
        assert_eq!(r.timer(), None);
        assert!(r.due(at(99_000)).is_empty());
    }

    #[test]
    fn a_file_clean_and_synced_owes_nothing() {
        let mut r = Recommits::default();
        r.owe(F, at(0));
        assert_eq!(r.look(F, DONE, at(0)), Decision::Clear);
        assert!(!r.owes(F));
        assert_eq!(r.look(F, WRITTEN, at(0)), Decision::Clear);
    }

    #[test]
    fn failed_commits_back_off_doubling_to_the_cap() {
        let mut r = Recommits::default();
        r.owe(F, at(0));
        assert_eq!(r.look(F, WRITTEN, at(0)), Decision::Commit);
        let mut now = at(0);
        let mut waits = Vec::new();
        for _ in 0..8 {
            assert!(r.failed(F, now));
            let next = r.timer().expect("waiting");
            waits.push(next.saturating_since(now).as_millis() / 1_000);
            assert_eq!(r.look(F, WRITTEN, now), Decision::Wait);
            now = next;
            assert_eq!(r.look(F, WRITTEN, now), Decision::Commit);
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn a_success_clears_the_debt() {
        let mut r = Recommits::default();
        r.owe(F, at(0));
        assert_eq!(r.look(F, WRITTEN, at(0)), Decision::Commit);
        // While it runs, another sync covering everything does not clear it twice; its own
        // answer clears it.
        assert_eq!(r.look(F, DONE, at(10)), Decision::Wait);
        assert_eq!(r.synced(F, DONE, at(20)), Decision::Clear);
        assert!(!r.owes(F));
        assert_eq!(r.timer(), None);
    }

    #[test]
    fn a_file_written_again_while_its_commit_ran_is_owed_again() {
        let mut r = Recommits::default();
        r.owe(F, at(0));
        assert!(r.failed(F, at(0))); // one failure: a backoff of 1 s
        assert_eq!(r.look(F, WRITTEN, at(1_000)), Decision::Commit);
        // Written again meanwhile: the commit succeeded but did not cover the new write.
        assert_eq!(r.synced(F, DIRTY, at(1_100)), Decision::Wait);
        assert!(r.owes(F));
        assert_eq!(r.look(F, DIRTY, at(1_500)), Decision::Wait);
        // Once written back, committed at once (no backoff: nothing failed).
        assert_eq!(r.look(F, WRITTEN, at(2_200)), Decision::Commit);
        // A sync that covered the first writes only (clean, not all synced): again.
        assert_eq!(r.synced(F, WRITTEN, at(2_300)), Decision::Commit);
        assert_eq!(r.synced(F, DONE, at(2_400)), Decision::Clear);
    }

    #[test]
    fn a_sync_failing_makes_a_file_owed_and_a_second_failure_report_keeps_the_backoff() {
        let mut r = Recommits::default();
        assert!(!r.failed(F, at(0)));
        assert!(r.owes(F));
        assert_eq!(r.timer(), Some(at(1_000)));
        r.owe(F, at(0)); // the close answered with the error too: unchanged
        assert_eq!(r.timer(), Some(at(1_000)));
        assert!(r.failed(F, at(1_000)));
        assert_eq!(r.timer(), Some(at(3_000)));
        r.forget(F);
        assert!(!r.owes(F));
    }
}
