//! One S3 object as a file: its logical size, the object the server holds, and the multipart
//! upload that will replace that object at the next commit.
//!
//! State of a file (all in [`State`]): `size`, the file's logical size; `object_size`, the size
//! of the object the server holds now; `carried`, the prefix of that object that still belongs
//! to the file (a truncate cuts it: bytes past a truncation read as zeros even if the file grows
//! again); `upload`, the open upload with the parts written so far, each with its ETag and
//! length. Invariant: every uploaded part's length is its extent's length at the current size
//! ([`PartLayout::extent`]), so the upload can be completed at any moment. A change of size
//! that would break this (growing or shrinking a part already uploaded) first commits the
//! upload at the old size.
//!
//! Locks: `busy` makes writes of one part run one at a time (two writes of a part, each
//! filling its gaps from the server, would lose one another's bytes). `gate` is held shared by
//! part uploads and reads and exclusively by commits, size changes and removal, so a commit
//! never races a part upload. `state` is a short-held leaf lock (held across the one
//! CreateMultipartUpload request of an upload, so concurrent writers create one upload).
//! Order: part, gate, state.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};

use ebb_core::event::errno;

use super::Shared;
use super::error::S3Error;
use super::journal::Record;
use crate::backend::{WriteSource, errno_error};

mod staged;
use staged::Staged;

/// How many times a write or commit starts over after the server lost its upload, before it
/// gives up with `EIO`.
const LOST_UPLOAD_ATTEMPTS: u32 = 3;

/// One object; shared by every handle of its key in one backend.
pub(crate) struct Object {
    /// The object's key; changed only by a rename, under `gate` held exclusively.
    key: Mutex<String>,
    pub(super) shared: Arc<Shared>,
    state: Mutex<State>,
    gate: RwLock<()>,
    busy: Mutex<BTreeSet<u32>>,
    part_free: Condvar,
}

#[derive(Debug)]
struct State {
    size: u64,
    object_size: u64,
    carried: u64,
    upload: Option<Upload>,
    /// Set when the server lost an upload holding parts: reported once by the next `sync`.
    lost: Option<String>,
    /// The object was removed through the backend; IO on old handles fails with `ENOENT`.
    removed: bool,
    /// The whole file, written back and not committed yet, of a small file with no upload
    /// (committed by one PutObject: see `staged.rs`).
    staged: Option<Staged>,
}

#[derive(Debug, Clone)]
struct Upload {
    id: String,
    parts: BTreeMap<u32, UploadedPart>,
}

#[derive(Debug, Clone)]
struct UploadedPart {
    etag: String,
    len: u64,
}

impl State {
    /// Whether the file differs from the object on the server.
    fn pending(&self) -> bool {
        self.upload.is_some()
            || self.staged.is_some()
            || self.size != self.object_size
            || self.carried != self.object_size
    }

    fn uploaded(&self, part: u32) -> bool {
        self.upload.as_ref().is_some_and(|upload| upload.parts.contains_key(&part))
    }

    /// Whether every uploaded part that holds bytes at size `size` keeps its length.
    fn parts_fit(&self, shared: &Shared, size: u64) -> bool {
        self.upload.as_ref().is_none_or(|upload| {
            upload.parts.iter().all(|(part, uploaded)| {
                let extent = shared.layout.extent(*part, size);
                extent.is_empty() || extent.end - extent.start == uploaded.len
            })
        })
    }
}

/// Releases a part taken by [`Object::lock_part`].
struct PartGuard<'a> {
    object: &'a Object,
    part: u32,
}

impl Drop for PartGuard<'_> {
    fn drop(&mut self) {
        lock(&self.object.busy).remove(&self.part);
        self.object.part_free.notify_all();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn removed_error(key: &str) -> io::Error {
    errno_error(errno::ENOENT, format!("S3 object {key:?} was removed"))
}

impl Object {
    /// The object `key`, which holds `size` bytes on the server.
    pub(crate) fn new(shared: Arc<Shared>, key: String, size: u64) -> Object {
        let state = State {
            size,
            object_size: size,
            carried: size,
            upload: None,
            lost: None,
            removed: false,
            staged: None,
        };
        Object {
            key: Mutex::new(key),
            shared,
            state: Mutex::new(state),
            gate: RwLock::new(()),
            busy: Mutex::new(BTreeSet::new()),
            part_free: Condvar::new(),
        }
    }

    pub(crate) fn key(&self) -> String {
        lock(&self.key).clone()
    }

    pub(crate) fn layout(&self) -> super::PartLayout {
        self.shared.layout
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn lock_part(&self, part: u32) -> PartGuard<'_> {
        let mut busy = lock(&self.busy);
        while busy.contains(&part) {
            busy = self.part_free.wait(busy).unwrap_or_else(PoisonError::into_inner);
        }
        busy.insert(part);
        PartGuard { object: self, part }
    }

    /// Writes the runs (sorted, disjoint) of the extent ending at `end`, part by part.
    pub(crate) fn write(&self, end: u64, runs: &[(u64, &[u8])]) -> io::Result<()> {
        let layout = self.shared.layout;
        if layout.size_max() < end {
            return Err(errno_error(
                errno::EFBIG,
                format!(
                    "S3 object {:?}: a write to {end} bytes passes the largest object of this \
                     part layout ({} bytes)",
                    self.key(),
                    layout.size_max()
                ),
            ));
        }
        let Some(first) = runs.first() else { return Ok(()) };
        let mut part = layout.part_of(first.0).expect("inside the layout");
        let mut pieces: Vec<(u64, &[u8])> = Vec::new();
        let mut remaining: Vec<(u64, &[u8])> = runs.to_vec();
        while !remaining.is_empty() {
            let range = layout.range(part);
            pieces.clear();
            let mut next = Vec::new();
            for (offset, data) in remaining {
                let run_end = offset + data.len() as u64;
                if range.end <= offset {
                    next.push((offset, data));
                    continue;
                }
                let cut = (range.end.min(run_end) - offset) as usize;
                pieces.push((offset, &data[..cut]));
                if cut < data.len() {
                    next.push((range.end, &data[cut..]));
                }
            }
            if !pieces.is_empty() {
                let part_end = if next.is_empty() { end } else { range.end };
                self.write_part(part, Body::Runs(&pieces), part_end)?;
            }
            remaining = next;
            part += 1;
        }
        Ok(())
    }

    /// Writes `buf[valid]` at `offset + valid.start`; `buf` covers `offset..offset +
    /// buf.len()`, and if that is the part the bytes go to, the part (its extent: all of it, or
    /// the start of the object's last part) is uploaded from `buf` with its other bytes filled
    /// in place (see `BackendFile::write_unit_in_place`); otherwise as [`Object::write`].
    pub(crate) fn write_in_place(
        &self,
        buf: &mut [u8],
        offset: u64,
        valid: Range<usize>,
    ) -> io::Result<()> {
        if valid.is_empty() {
            return Ok(());
        }
        let layout = self.shared.layout;
        let (start, end) = (offset + valid.start as u64, offset + valid.end as u64);
        let part = layout.part_of(start).filter(|&part| {
            end <= layout.size_max()
                && layout.part_of(end - 1) == Some(part)
                && layout.range(part).start == offset
        });
        match part {
            Some(part) => self.write_part(part, Body::InPlace { buf, valid }, end),
            None => self.write(end, &[(start, &buf[valid])]),
        }
    }

    /// Writes `source` at `offset` if it is one whole part of the layout, uploaded straight
    /// from the source; `None` (nothing written) otherwise.
    pub(crate) fn write_from(
        &self,
        offset: u64,
        source: &dyn WriteSource,
    ) -> Option<io::Result<()>> {
        let layout = self.shared.layout;
        let end = offset + source.len() as u64;
        let part = layout.part_of(offset)?;
        let whole = layout.range(part) == (offset..end) && end <= layout.size_max();
        whole.then(|| self.write_part(part, Body::Source(source), end))
    }

    /// Uploads part `part` with `body` (inside it) over what the file holds, the file growing
    /// to at least `end`.
    fn write_part(&self, part: u32, mut body: Body<'_, '_>, end: u64) -> io::Result<()> {
        let _part = self.lock_part(part);
        if part == 1
            && let Some(result) = self.stage(&body, end)
        {
            return result;
        }
        let mut losses = 0;
        while losses < LOST_UPLOAD_ATTEMPTS {
            let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
            let plan = {
                let mut state = self.state();
                if state.removed {
                    return Err(removed_error(&self.key()));
                }
                let size = state.size.max(end);
                if state.uploaded(part)
                    || state.staged.is_some()
                    || !state.parts_fit(&self.shared, size)
                {
                    None
                } else {
                    state.size = size;
                    Some((self.shared.layout.extent(part, size), state.carried))
                }
            };
            let Some((extent, carried)) = plan else {
                // The part's earlier bytes are only in the open upload (or staged), or growing
                // the file would change the length of an uploaded part: commit them.
                drop(gate);
                self.commit_exclusive()?;
                continue;
            };
            // A run covering the whole part (write-back of a whole granule, the usual case)
            // is uploaded from the caller's buffer, and so is a caller's buffer of the whole
            // part, filled in place; otherwise the part is assembled from the runs and what
            // the object already holds.
            let assembled;
            let extent_len = (extent.end - extent.start) as usize;
            let data = match &mut body {
                Body::Runs([(offset, data)])
                    if *offset == extent.start && data.len() == extent_len =>
                {
                    PartData::Bytes(data)
                }
                Body::Runs(runs) => {
                    assembled = self.assemble(&extent, carried, runs)?;
                    PartData::Bytes(&assembled)
                }
                Body::InPlace { buf, valid }
                    if valid.end <= extent_len && extent_len <= buf.len() =>
                {
                    // The part's extent: the whole part, or its start in the object's last part.
                    let buf = &mut buf[..extent_len];
                    self.fill_around(buf, &extent, carried, valid)?;
                    PartData::Bytes(buf)
                }
                Body::InPlace { buf, valid } => {
                    // The buffer does not hold the part's extent: assembled after all.
                    let start = extent.start + valid.start as u64;
                    assembled = self.assemble(&extent, carried, &[(start, &buf[valid.clone()])])?;
                    PartData::Bytes(&assembled)
                }
                // A whole part ends where the write does, so the file holds all of it and its
                // extent is the part (`Object::write_from` checked the range).
                Body::Source(source) => PartData::Source(*source),
            };
            let len = data.len();
            if len != extent_len {
                return Err(errno_error(
                    errno::EIO,
                    format!(
                        "S3 object {:?}: part {part} would go out with {len} bytes for its \
                         {extent_len}",
                        self.key()
                    ),
                ));
            }
            let id = self.ensure_upload()?;
            let sent = match data {
                PartData::Bytes(bytes) => {
                    self.shared.client.upload_part(&self.key(), &id, part, bytes)
                }
                PartData::Source(source) => {
                    self.shared.client.upload_part_from(&self.key(), &id, part, source)
                }
            };
            let etag = match sent {
                Ok(etag) => etag,
                Err(error) if error.is_no_such_upload() => {
                    self.upload_lost(&id, &error);
                    losses += 1;
                    continue;
                }
                Err(error) => return Err(error.into_io()),
            };
            self.shared.journal.record(Record::Part {
                id: &id,
                part,
                etag: &etag,
                len: len as u64,
            })?;
            let mut state = self.state();
            let current = self.shared.layout.extent(part, state.size);
            let same_upload = state.upload.as_ref().is_some_and(|upload| upload.id == id);
            if !same_upload || current != extent {
                // Lost and replaced meanwhile, or another writer grew the file past this
                // part's end while it was uploaded: write it again at the new length.
                continue;
            }
            let upload = state.upload.as_mut().expect("checked above");
            upload.parts.insert(part, UploadedPart { etag, len: len as u64 });
            return Ok(());
        }
        Err(errno_error(
            errno::EIO,
            format!("S3 object {:?}: the server kept losing the upload of part {part}", self.key()),
        ))
    }

    /// The part of `extent` made of `runs` over what the object holds, in a new buffer.
    fn assemble(
        &self,
        extent: &Range<u64>,
        carried: u64,
        runs: &[(u64, &[u8])],
    ) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; (extent.end - extent.start) as usize];
        self.fill_gaps(&mut buf, extent, carried, runs)?;
        for (offset, data) in runs {
            let start = (offset - extent.start) as usize;
            buf[start..start + data.len()].copy_from_slice(data);
        }
        Ok(buf)
    }

    /// Fills `buf`, the whole `extent`, outside `valid` (the caller's bytes) with what the
    /// object holds there (up to `carried`; zeros past it): one ranged GET per side.
    fn fill_around(
        &self,
        buf: &mut [u8],
        extent: &Range<u64>,
        carried: u64,
        valid: &Range<usize>,
    ) -> io::Result<()> {
        for gap in [0..valid.start, valid.end..buf.len()] {
            let first = extent.start + gap.start as u64;
            let fetched = (carried.saturating_sub(first) as usize).min(gap.len());
            if fetched > 0 {
                let window = &mut buf[gap.start..gap.start + fetched];
                self.shared
                    .client
                    .get_range(&self.key(), first, window)
                    .map_err(S3Error::into_io)?;
            }
            buf[gap.start + fetched..gap.end].fill(0);
        }
        Ok(())
    }

    /// Fills the bytes of `extent` that `runs` do not cover from the object (up to `carried`;
    /// zeros past it), with one ranged GET from the first such byte to the last.
    fn fill_gaps(
        &self,
        buf: &mut [u8],
        extent: &Range<u64>,
        carried: u64,
        runs: &[(u64, &[u8])],
    ) -> io::Result<()> {
        let mut gap_first = None;
        let mut gap_end = extent.start;
        let mut position = extent.start;
        for (offset, data) in runs {
            if position < *offset {
                gap_first.get_or_insert(position);
                gap_end = *offset;
            }
            position = offset + data.len() as u64;
        }
        if position < extent.end {
            gap_first.get_or_insert(position);
            gap_end = extent.end;
        }
        let Some(gap_first) = gap_first else { return Ok(()) };
        let fetch_end = gap_end.min(carried);
        if fetch_end <= gap_first {
            return Ok(());
        }
        let window =
            &mut buf[(gap_first - extent.start) as usize..(fetch_end - extent.start) as usize];
        self.shared.client.get_range(&self.key(), gap_first, window).map_err(S3Error::into_io)?;
        Ok(())
    }

    /// The open upload's id, creating the upload (journaled first) if there is none.
    fn ensure_upload(&self) -> io::Result<String> {
        let mut state = self.state();
        if let Some(upload) = &state.upload {
            return Ok(upload.id.clone());
        }
        let journal = &self.shared.journal;
        journal.record(Record::Create { key: &self.key() })?;
        let id = self.shared.client.create_upload(&self.key()).map_err(S3Error::into_io)?;
        if let Err(error) = journal.record(Record::Upload { key: &self.key(), id: &id }) {
            // Unjournaled, it would be orphaned by a crash: give it up now.
            let _ = self.shared.client.abort_upload(&self.key(), &id);
            return Err(error);
        }
        state.upload = Some(Upload { id: id.clone(), parts: BTreeMap::new() });
        Ok(id)
    }

    /// The server answered NoSuchUpload for upload `id`: its parts are gone. Writes whose
    /// only copy was in them are lost; the next `sync` reports it.
    fn upload_lost(&self, id: &str, error: &S3Error) {
        let mut state = self.state();
        if state.upload.as_ref().is_none_or(|upload| upload.id != id) {
            return;
        }
        let upload = state.upload.take().expect("checked above");
        self.shared.client.counters.uploads_lost.fetch_add(1, Ordering::Relaxed);
        let written = upload.parts.len();
        if 0 < written && state.lost.is_none() {
            state.lost = Some(format!(
                "S3 object {:?}: the server lost upload {id} ({error}); the {written} parts \
                 written back to it since the last commit are gone",
                self.key()
            ));
        }
        drop(state);
        let _ = self.shared.journal.record(Record::End { id });
    }

    /// Reads from `offset`, as [`crate::BackendFile::read_at`]. A range whose latest bytes are
    /// only in the open upload is committed first.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
            let state = self.state();
            if state.removed {
                return Err(removed_error(&self.key()));
            }
            if buf.is_empty() || state.size <= offset {
                return Ok(0);
            }
            if let Some(count) = self.read_staged(&state, buf, offset) {
                return Ok(count);
            }
            let end = state.size.min(offset + buf.len() as u64);
            let layout = self.shared.layout;
            let parts =
                layout.part_of(offset).expect("inside")..=layout.part_of(end - 1).expect("inside");
            if parts.into_iter().any(|part| state.uploaded(part)) {
                drop(state);
                drop(gate);
                self.commit_exclusive()?;
                continue;
            }
            let carried = state.carried;
            drop(state);
            let count = (end - offset) as usize;
            let from_object = (carried.min(end).saturating_sub(offset)) as usize;
            let got = if 0 < from_object {
                self.shared
                    .client
                    .get_range(&self.key(), offset, &mut buf[..from_object])
                    .map_err(S3Error::into_io)?
            } else {
                0
            };
            buf[got..count].fill(0);
            return Ok(count);
        }
    }

    /// The logical size: the open upload's, else the object's (metadata cache or server).
    pub(crate) fn size(&self) -> io::Result<u64> {
        let _gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        {
            let state = self.state();
            if state.pending() || state.removed {
                return Ok(state.size);
            }
        }
        let on_server = self.shared.client.head_object(&self.key()).map_err(S3Error::into_io)?;
        let mut state = self.state();
        if !state.pending() {
            let size = on_server.unwrap_or(0);
            state.size = size;
            state.object_size = size;
            state.carried = size;
        }
        Ok(state.size)
    }

    /// Sets the logical size (durable at the next commit).
    pub(crate) fn set_size(&self, size: u64) -> io::Result<()> {
        let layout = self.shared.layout;
        if layout.size_max() < size {
            return Err(errno_error(
                errno::EFBIG,
                format!(
                    "S3 object {:?}: size {size} passes the layout's largest object",
                    self.key()
                ),
            ));
        }
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        let fits = {
            let mut state = self.state();
            if state.removed {
                return Err(removed_error(&self.key()));
            }
            if state.size == size {
                return Ok(());
            }
            if self.resize_staged(&mut state, size) {
                return Ok(());
            }
            state.staged.is_none() && state.parts_fit(&self.shared, size)
        };
        if !fits {
            self.commit_locked()?;
        }
        let mut state = self.state();
        if let Some(upload) = &mut state.upload {
            // Parts wholly past the new end hold bytes that are gone (and must not come back if
            // the file grows again).
            upload.parts.retain(|part, _| !layout.extent(*part, size).is_empty());
        }
        state.size = size;
        state.carried = state.carried.min(size);
        Ok(())
    }

    /// Commits the file and reports a lost upload once.
    pub(crate) fn sync(&self) -> io::Result<()> {
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        if self.state().removed {
            return Err(removed_error(&self.key()));
        }
        self.commit_locked()?;
        match self.state().lost.take() {
            Some(message) => Err(errno_error(errno::EIO, message)),
            None => Ok(()),
        }
    }

    fn commit_exclusive(&self) -> io::Result<()> {
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        self.commit_locked()
    }

    /// Makes the object on the server the file: every part not uploaded in the open upload
    /// is carried from the current object (UploadPartCopy, or a GET plus zeros where the object
    /// does not cover it), then CompleteMultipartUpload. Needs `gate` exclusively.
    fn commit_locked(&self) -> io::Result<()> {
        for _ in 0..LOST_UPLOAD_ATTEMPTS {
            let (size, carried) = {
                let state = self.state();
                if !state.pending() || state.removed {
                    return Ok(());
                }
                (state.size, state.carried)
            };
            if let Some(result) = self.commit_staged() {
                return result;
            }
            if size == 0 {
                return self.commit_empty();
            }
            let id = self.ensure_upload()?;
            match self.complete(&id, size, carried) {
                Ok(()) => {}
                Err(error) if error.is_no_such_upload() => {
                    self.upload_lost(&id, &error);
                    continue;
                }
                Err(error) => return Err(error.into_io()),
            }
            let mut state = self.state();
            state.upload = None;
            state.object_size = size;
            state.carried = size;
            drop(state);
            self.shared.journal.record(Record::End { id: &id })?;
            return Ok(());
        }
        Err(errno_error(
            errno::EIO,
            format!("S3 object {:?}: the server kept losing the upload of its commit", self.key()),
        ))
    }

    /// Carries the parts not uploaded, then completes upload `id` at `size`.
    fn complete(&self, id: &str, size: u64, carried: u64) -> Result<(), S3Error> {
        let layout = self.shared.layout;
        let count = layout.part_count(size);
        for part in 1..=count {
            if self.state().uploaded(part) {
                continue;
            }
            let extent = layout.extent(part, size);
            let etag = self.carry(id, part, &extent, carried)?;
            let len = extent.end - extent.start;
            self.shared
                .journal
                .record(Record::Part { id, part, etag: &etag, len })
                .map_err(|e| journal_error(&self.key(), &e))?;
            if let Some(upload) = &mut self.state().upload {
                upload.parts.insert(part, UploadedPart { etag, len });
            }
        }
        let etags: Vec<String> = {
            let state = self.state();
            let upload = state.upload.as_ref().expect("ensured");
            (1..=count).map(|part| upload.parts[&part].etag.clone()).collect()
        };
        self.shared.client.complete_upload(&self.key(), id, &etags)
    }

    /// Makes part `part` of upload `id` from the current object.
    fn carry(
        &self,
        id: &str,
        part: u32,
        extent: &Range<u64>,
        carried: u64,
    ) -> Result<String, S3Error> {
        let client = &self.shared.client;
        if extent.end <= carried {
            return client.upload_part_copy(&self.key(), id, part, &self.key(), extent.clone());
        }
        let mut buf = vec![0u8; (extent.end - extent.start) as usize];
        if extent.start < carried {
            let window = &mut buf[..(carried - extent.start) as usize];
            client.get_range(&self.key(), extent.start, window)?;
        }
        client.upload_part(&self.key(), id, part, &buf)
    }

    /// Commits an empty file: an empty object, and the upload (if any) aborted.
    fn commit_empty(&self) -> io::Result<()> {
        let client = &self.shared.client;
        client.put_object(&self.key(), &[]).map_err(S3Error::into_io)?;
        let upload = self.state().upload.take();
        if let Some(upload) = upload {
            client.abort_upload(&self.key(), &upload.id).map_err(S3Error::into_io)?;
            self.shared.journal.record(Record::End { id: &upload.id })?;
        }
        let mut state = self.state();
        state.object_size = 0;
        state.carried = 0;
        Ok(())
    }

    /// Aborts the open upload (if any) and marks the object removed; the caller deletes it.
    pub(crate) fn remove(&self) -> io::Result<()> {
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        let upload = {
            let mut state = self.state();
            state.removed = true;
            self.unstage(&mut state);
            state.upload.take()
        };
        if let Some(upload) = upload {
            self.shared.client.abort_upload(&self.key(), &upload.id).map_err(S3Error::into_io)?;
            self.shared.journal.record(Record::End { id: &upload.id })?;
        }
        Ok(())
    }
}

impl Object {
    /// Renames the object to `new_key`: commits what was written back (so the object holds
    /// it), copies the object to `new_key` on the server and deletes the old key; later writes
    /// and commits of this file go to `new_key`.
    pub(crate) fn rename_to(&self, new_key: &str) -> io::Result<()> {
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        if self.state().removed {
            return Err(removed_error(&self.key()));
        }
        self.commit_locked()?;
        let old_key = self.key();
        let client = &self.shared.client;
        client.copy_object(&old_key, new_key).map_err(S3Error::into_io)?;
        client.delete_object(&old_key).map_err(S3Error::into_io)?;
        *lock(&self.key) = new_key.to_owned();
        Ok(())
    }
}

impl Drop for Object {
    /// The last handle is gone: what was written back is committed (nobody could sync it
    /// later), or, if that fails, the upload is aborted so that none is orphaned.
    fn drop(&mut self) {
        if self.commit_exclusive().is_ok() {
            return;
        }
        let mut state = self.state();
        self.unstage(&mut state);
        let upload = state.upload.take();
        drop(state);
        if let Some(upload) = upload
            && self.shared.client.abort_upload(&self.key(), &upload.id).is_ok()
        {
            let _ = self.shared.journal.record(Record::End { id: &upload.id });
        }
    }
}

fn journal_error(key: &str, error: &io::Error) -> S3Error {
    S3Error {
        request: "journal",
        key: key.to_owned(),
        status: 0,
        code: "LocalJournal".to_owned(),
        message: error.to_string(),
        os_errno: error.raw_os_error(),
    }
}

/// What a part is written from: the caller's runs, or a buffer of the whole part whose bytes
/// outside `valid` are scratch ([`Object::write_in_place`]).
enum Body<'a, 'b> {
    Runs(&'a [(u64, &'b [u8])]),
    InPlace {
        buf: &'a mut [u8],
        valid: Range<usize>,
    },
    /// The whole part, copied from the source as it is uploaded.
    Source(&'a dyn WriteSource),
}

/// What a part is uploaded from.
#[derive(Clone, Copy)]
enum PartData<'a> {
    Bytes(&'a [u8]),
    Source(&'a dyn WriteSource),
}

impl PartData<'_> {
    fn len(self) -> usize {
        match self {
            PartData::Bytes(bytes) => bytes.len(),
            PartData::Source(source) => source.len(),
        }
    }
}
