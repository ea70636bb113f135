//! Small objects committed by one PutObject: a file whose whole content fits in
//! [`STAGED_OBJECT_MAX`] bytes and has no upload open is not written back as a multipart part;
//! its bytes are kept here (staged) until the commit, which is then one PutObject instead of
//! CreateMultipartUpload, UploadPart, CompleteMultipartUpload and the HeadObject that checks
//! the completion (`Client::complete_upload`): one request where there were four.
//!
//! What a staged write promises is what a part upload promises: nothing until the commit. A
//! part uploaded to an open upload is not visible and is aborted after a crash (the journal's
//! meaning), so staged bytes, lost with the process, lose nothing a part would have kept; a
//! staged object has no upload, so the journal records nothing for it, and PutObject replaces
//! the object whole or not at all. The staged copy is memory the engine does not count (its
//! pages are clean once written back), so it is bounded per backend by
//! [`STAGED_BYTES_MAX`]; past it, small files are written back as parts, as before.
//!
//! Invariant: a staged object has no open upload, and its staged bytes are the whole file
//! (`staged.len() == state.size`). Anything that would break it commits first: a write to a
//! part other than the first (the file grew past the staged size), a size past
//! [`STAGED_OBJECT_MAX`], a budget that cannot grow.

use std::fmt;
use std::io;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use super::{Body, Object, State, removed_error};
use crate::s3::error::S3Error;

/// The largest file committed by one PutObject from staged bytes, in bytes. 1 MiB: the
/// small files the bench writes (4-64 KiB) and then some, and well under the smallest
/// part (5 MiB), so a file that grows into a second part was never staged at a part's size.
/// (AWS's CLI switches to multipart at 8 MiB, s3fs at its `multipart_size`, 10 MB.)
pub(super) const STAGED_OBJECT_MAX: u64 = 1 << 20;

/// The most staged bytes one backend holds at once, in bytes: 16 MiB, 16 files of the
/// largest staged size or 256 of 64 KiB written back and not yet committed. Memory outside
/// the engine's `--memory` budget, so small next to it.
pub(super) const STAGED_BYTES_MAX: u64 = 16 << 20;

/// The whole content of a staged file.
pub(super) struct Staged(pub(super) Vec<u8>);

impl fmt::Debug for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Staged({} bytes)", self.0.len())
    }
}

impl Object {
    /// Writes `body` (in part 1, the file growing to at least `end`) into the staged bytes,
    /// if the file can be staged: `None` (nothing done) when it cannot, and the caller writes
    /// the part to an upload. The caller holds part 1.
    pub(super) fn stage(&self, body: &Body<'_, '_>, end: u64) -> Option<io::Result<()>> {
        let runs: Vec<(u64, &[u8])> = match body {
            Body::Runs(runs) => runs.to_vec(),
            Body::InPlace { buf, valid } => vec![(valid.start as u64, &buf[valid.clone()])],
            // A whole part: larger than any staged file.
            Body::Source(_) => return None,
        };
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        let (size, carried, old) = {
            let mut state = self.state();
            if state.removed {
                return Some(Err(removed_error(&self.key())));
            }
            let size = state.size.max(end);
            if state.upload.is_some() || STAGED_OBJECT_MAX < size {
                return None;
            }
            let old = state.staged.as_ref().map_or(0, |staged| staged.0.len() as u64);
            if !self.reserve_staged(old, size) {
                return None;
            }
            if let Some(staged) = state.staged.as_mut() {
                // Newer than the object: the runs go over it, no request.
                overlay(&mut staged.0, size, &runs);
                state.size = size;
                return Some(Ok(()));
            }
            (size, state.carried, old)
        };
        // First staging: the rest of the file from the object (one ranged GET at most).
        let assembled = match self.assemble(&(0..size), carried, &runs) {
            Ok(assembled) => assembled,
            Err(error) => {
                self.reserve_staged(size, old);
                return Some(Err(error));
            }
        };
        let mut state = self.state();
        if state.upload.is_some() || size < state.size || state.staged.is_some() {
            // A write of another part grew the file (and opened an upload) meanwhile.
            drop(state);
            self.reserve_staged(size, old);
            return None;
        }
        state.size = size;
        state.staged = Some(Staged(assembled));
        Some(Ok(()))
    }

    /// Takes staged bytes from `old` to `new` bytes in the backend's budget; false (nothing
    /// taken) if growing would pass [`STAGED_BYTES_MAX`]. Shrinking always succeeds.
    pub(super) fn reserve_staged(&self, old: u64, new: u64) -> bool {
        let total = &self.shared.staged_bytes;
        if new <= old {
            total.fetch_sub(old - new, Ordering::Relaxed);
            return true;
        }
        let more = new - old;
        total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (now + more <= STAGED_BYTES_MAX).then_some(now + more)
            })
            .is_ok()
    }

    /// Drops the staged bytes (if any) and gives their budget back.
    pub(super) fn unstage(&self, state: &mut State) {
        if let Some(staged) = state.staged.take() {
            self.reserve_staged(staged.0.len() as u64, 0);
        }
    }

    /// Sets the size of a staged file without a request, if it stays stageable; false when it
    /// does not (or nothing is staged), and the caller commits first.
    pub(super) fn resize_staged(&self, state: &mut State, size: u64) -> bool {
        let Some(old) = state.staged.as_ref().map(|staged| staged.0.len() as u64) else {
            return false;
        };
        if STAGED_OBJECT_MAX < size || !self.reserve_staged(old, size) {
            return false;
        }
        let staged = state.staged.as_mut().expect("checked above");
        staged.0.resize(size as usize, 0);
        state.size = size;
        state.carried = state.carried.min(size);
        true
    }

    /// Commits a staged file by one PutObject of its bytes; `None` if nothing is staged.
    /// Needs `gate` exclusively (so no write or read runs while the bytes are out of `state`).
    pub(super) fn commit_staged(&self) -> Option<io::Result<()>> {
        let staged = self.state().staged.take()?;
        let key = self.key();
        let client = &self.shared.client;
        if let Err(error) = client.put_object(&key, &staged.0) {
            self.state().staged = Some(staged);
            return Some(Err(S3Error::into_io(error)));
        }
        let size = staged.0.len() as u64;
        self.reserve_staged(size, 0);
        let mut state = self.state();
        state.object_size = size;
        state.carried = size;
        Some(Ok(()))
    }

    /// Reads from the staged bytes, if the file is staged.
    pub(super) fn read_staged(&self, state: &State, buf: &mut [u8], offset: u64) -> Option<usize> {
        let staged = state.staged.as_ref()?;
        let start = (offset as usize).min(staged.0.len());
        let count = buf.len().min(staged.0.len() - start);
        buf[..count].copy_from_slice(&staged.0[start..start + count]);
        Some(count)
    }
}

/// Writes `runs` over `data`, which grows (with zeros) to `size` bytes first.
fn overlay(data: &mut Vec<u8>, size: u64, runs: &[(u64, &[u8])]) {
    data.resize(size as usize, 0);
    for (offset, run) in runs {
        let start = *offset as usize;
        data[start..start + run.len()].copy_from_slice(run);
    }
}
