//! The journal of multipart uploads: which uploads this process has open, so that after a
//! crash the next process aborts them and no upload is left orphaned.
//!
//! Each process appends to its own file, `journal-<pid>-<nanos>.log`, in the state directory
//! of its endpoint and bucket, and holds an exclusive `flock` on it while it lives. A record is
//! one line, written (and, but for `part`, `fdatasync`ed) before the step it announces is
//! relied on:
//!
//! * `create KEY` before CreateMultipartUpload (so an upload created just before a crash, whose
//!   id never reached the journal, is still found: by its key),
//! * `upload KEY ID` once the server gave the upload's id,
//! * `part ID N ETAG LEN` once part N is uploaded, before its pages are reported clean (not
//!   synced by itself: recovery aborts an open upload whatever parts it has),
//! * `end ID` once the upload was completed or aborted,
//! * `rename FROM TO` before a directory's keys (every key under the prefix `FROM`) are copied
//!   under the prefix `TO`, and `renamed FROM TO` once every old key was deleted.
//!
//! At start, [`Journal::open`] takes every journal file whose lock is free (its process died),
//! and returns what they name: the uploads to abort and the keys to sweep. The caller aborts
//! them, rolls forward the directory renames they name (see `S3Backend::open`) and then calls
//! [`Journal::forget_dead`]. Fields are
//! percent-encoded, so keys with spaces or newlines cannot break a line.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{FlockOperation, flock};

/// A journal file this size or larger is emptied when no upload in it is open.
const COMPACT_BYTES: u64 = 1 << 20;

/// What the journals of dead processes name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Leftovers {
    /// Uploads still open when their process died: upload id to key.
    pub(crate) uploads: BTreeMap<String, String>,
    /// Keys an upload was being created for when their process died, with no id recorded.
    pub(crate) keys_creating: BTreeSet<String>,
    /// Upload ids open in the journals of processes still alive (never to be aborted here).
    pub(crate) uploads_alive: BTreeSet<String>,
    /// Directory renames (old prefix, new prefix) begun and not finished when their process
    /// died, in the order they began.
    pub(crate) renames: Vec<(String, String)>,
    /// The dead journals, removed by [`Journal::forget_dead`].
    dead: Vec<PathBuf>,
}

/// This process's journal.
#[derive(Debug)]
pub(crate) struct Journal {
    directory: PathBuf,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    file: File,
    /// Uploads open (with an `upload` record and no `end`).
    open: BTreeSet<String>,
    /// Directory renames begun and not finished (old prefix, new prefix).
    renaming: BTreeSet<(String, String)>,
    bytes: u64,
}

/// One line of a journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    Create { key: &'a str },
    Upload { key: &'a str, id: &'a str },
    Part { id: &'a str, part: u32, etag: &'a str, len: u64 },
    End { id: &'a str },
    Rename { from: &'a str, to: &'a str },
    Renamed { from: &'a str, to: &'a str },
}

impl Journal {
    /// Opens a new journal in `directory` (created if missing) and reads the journals of dead
    /// processes there.
    pub(crate) fn open(directory: &Path) -> io::Result<(Journal, Leftovers)> {
        fs::create_dir_all(directory).map_err(|e| annotate(e, "create", directory))?;
        let leftovers = read_others(directory)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = directory.join(format!("journal-{}-{nanos}.log", std::process::id()));
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| annotate(e, "create", &path))?;
        flock(&file, FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| annotate(e.into(), "lock", &path))?;
        // The new name must survive a crash, or the next process would not find the file.
        File::open(directory)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| annotate(e, "sync", directory))?;
        let inner = Inner { file, open: BTreeSet::new(), renaming: BTreeSet::new(), bytes: 0 };
        Ok((Journal { directory: directory.to_owned(), inner: Mutex::new(inner) }, leftovers))
    }

    /// Appends `record` and makes it durable.
    pub(crate) fn record(&self, record: Record<'_>) -> io::Result<()> {
        let line = record.to_line();
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sync = match record {
            Record::Upload { id, .. } => {
                inner.open.insert(id.to_owned());
                true
            }
            Record::End { id } => {
                inner.open.remove(id);
                true
            }
            Record::Create { .. } => true,
            Record::Rename { from, to } => {
                inner.renaming.insert((from.to_owned(), to.to_owned()));
                true
            }
            Record::Renamed { from, to } => {
                inner.renaming.remove(&(from.to_owned(), to.to_owned()));
                true
            }
            // Nothing after a crash relies on a part's line (an open upload is aborted, its
            // parts with it), so it is not synced on its own: the next record's sync carries
            // it. Syncing it held up each part's completion by a flush of the local disk.
            Record::Part { .. } => false,
        };
        if inner.open.is_empty() && inner.renaming.is_empty() && COMPACT_BYTES <= inner.bytes {
            // Nothing open: the history can go. A crash between the two steps leaves an empty
            // or a complete file, both correct.
            inner.file.set_len(0)?;
            inner.bytes = 0;
        }
        inner.file.write_all(line.as_bytes())?;
        if sync {
            inner.file.sync_data()?;
        }
        inner.bytes += line.len() as u64;
        Ok(())
    }

    /// Removes the dead journals once their uploads were aborted.
    pub(crate) fn forget_dead(&self, leftovers: &Leftovers) -> io::Result<()> {
        for path in &leftovers.dead {
            match fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(annotate(e, "remove", path)),
            }
        }
        File::open(&self.directory).and_then(|dir| dir.sync_all())
    }
}

impl Record<'_> {
    fn to_line(&self) -> String {
        match self {
            Record::Create { key } => format!("create {}\n", encode(key)),
            Record::Upload { key, id } => format!("upload {} {}\n", encode(key), encode(id)),
            Record::Part { id, part, etag, len } => {
                format!("part {} {part} {} {len}\n", encode(id), encode(etag))
            }
            Record::End { id } => format!("end {}\n", encode(id)),
            Record::Rename { from, to } => format!("rename {} {}\n", encode(from), encode(to)),
            Record::Renamed { from, to } => format!("renamed {} {}\n", encode(from), encode(to)),
        }
    }
}

/// Reads every other journal in `directory`: those whose lock is free are dead.
fn read_others(directory: &Path) -> io::Result<Leftovers> {
    let mut leftovers = Leftovers::default();
    let entries = fs::read_dir(directory).map_err(|e| annotate(e, "read", directory))?;
    for entry in entries {
        let path = entry?.path();
        let is_journal = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|name| name.starts_with("journal-") && name.ends_with(".log"));
        if !is_journal {
            continue;
        }
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(annotate(e, "open", &path)),
        };
        let alive = flock(&file, FlockOperation::NonBlockingLockShared).is_err();
        let mut text = String::new();
        (&file).read_to_string(&mut text).map_err(|e| annotate(e, "read", &path))?;
        let parsed = parse(&text, &path)?;
        if alive {
            leftovers.uploads_alive.extend(parsed.uploads.into_keys());
        } else {
            leftovers.uploads.extend(parsed.uploads);
            leftovers.keys_creating.extend(parsed.creating);
            leftovers.renames.extend(parsed.renames);
            leftovers.dead.push(path);
        }
    }
    Ok(leftovers)
}

/// What one journal leaves open.
#[derive(Debug, Default)]
struct Parsed {
    /// The uploads still open (id to key).
    uploads: BTreeMap<String, String>,
    /// The keys with a `create` record not followed by an `upload` record of the same key.
    creating: BTreeSet<String>,
    /// The directory renames with a `rename` record and no `renamed` record, in order.
    renames: Vec<(String, String)>,
}

fn parse(text: &str, path: &Path) -> io::Result<Parsed> {
    let mut uploads = BTreeMap::new();
    let mut creating = BTreeSet::new();
    let mut renames: Vec<(String, String)> = Vec::new();
    // Every record ends with a newline: text after the last one is a record a crash cut
    // short, whose step never happened as far as the journal is concerned.
    let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    for (number, line) in complete.lines().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "S3 journal {}: line {} is not a record: {line:?}",
                    path.display(),
                    number + 1
                ),
            )
        };
        let field = |index: usize| match fields.get(index) {
            Some(field) => decode(field),
            None => Err(bad()),
        };
        match (fields[0], fields.len()) {
            ("create", 2) => {
                creating.insert(field(1)?);
            }
            ("upload", 3) => {
                let key = field(1)?;
                creating.remove(&key);
                uploads.insert(field(2)?, key);
            }
            ("end", 2) => {
                uploads.remove(&field(1)?);
            }
            ("part", 5) => {}
            ("rename", 3) => renames.push((field(1)?, field(2)?)),
            ("renamed", 3) => {
                let done = (field(1)?, field(2)?);
                renames.retain(|rename| *rename != done);
            }
            _ => return Err(bad()),
        }
    }
    Ok(Parsed { uploads, creating, renames })
}

/// Percent-encodes everything but unreserved characters and `/`.
fn encode(text: &str) -> String {
    super::client::percent_encode_key(text)
}

fn decode(text: &str) -> io::Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(byte) = hex else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("S3 journal: bad escape in {text:?}"),
                ));
            };
            out.push(byte);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn annotate(error: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("S3 journal: {what} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_journal_names_its_open_uploads_and_unfinished_creates() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (journal, leftovers) = Journal::open(dir.path()).unwrap();
            assert_eq!(leftovers, Leftovers::default());
            journal.record(Record::Create { key: "a b/c\nd" }).unwrap();
            journal.record(Record::Upload { key: "a b/c\nd", id: "id-1" }).unwrap();
            journal.record(Record::Part { id: "id-1", part: 1, etag: "\"e1\"", len: 5 }).unwrap();
            journal.record(Record::Create { key: "done" }).unwrap();
            journal.record(Record::Upload { key: "done", id: "id-2" }).unwrap();
            journal.record(Record::End { id: "id-2" }).unwrap();
            journal.record(Record::Create { key: "crashed while creating" }).unwrap();
            journal.record(Record::Rename { from: "a/", to: "b c/" }).unwrap();
            journal.record(Record::Rename { from: "x/", to: "y/" }).unwrap();
            journal.record(Record::Renamed { from: "x/", to: "y/" }).unwrap();
            // Dropping the journal releases its lock, as the death of its process would.
        }
        let (journal, leftovers) = Journal::open(dir.path()).unwrap();
        assert_eq!(leftovers.uploads, BTreeMap::from([("id-1".to_owned(), "a b/c\nd".to_owned())]));
        assert_eq!(leftovers.keys_creating, BTreeSet::from(["crashed while creating".to_owned()]));
        assert_eq!(leftovers.renames, [("a/".to_owned(), "b c/".to_owned())]);
        journal.forget_dead(&leftovers).unwrap();
        drop(journal);
        let (_journal, leftovers) = Journal::open(dir.path()).unwrap();
        assert!(leftovers.uploads.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_live_journal_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = Journal::open(dir.path()).unwrap();
        first.record(Record::Upload { key: "k", id: "live" }).unwrap();
        let (_second, leftovers) = Journal::open(dir.path()).unwrap();
        assert!(leftovers.uploads.is_empty());
        assert_eq!(leftovers.uploads_alive, BTreeSet::from(["live".to_owned()]));
        assert!(leftovers.dead.is_empty());
    }

    #[test]
    fn a_torn_last_line_is_ignored_and_garbage_is_an_error_naming_the_file() {
        let path = Path::new("/state/journal-1-2.log");
        let parsed = parse("upload k id\npart id 1 e 5\nupl", path).unwrap();
        assert_eq!(parsed.uploads.len(), 1);
        let error = parse("upload k id\nnonsense here\n", path).unwrap_err();
        assert!(error.to_string().contains("journal-1-2.log"), "{error}");
        assert!(error.to_string().contains("line 2"), "{error}");
    }
}
