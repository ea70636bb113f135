//! The error of a refused experiment file.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why an experiment file was refused: the file, the key and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExperimentError {
    /// The experiment file.
    pub file: PathBuf,
    /// The offending key, e.g. `case[0].workload[1].size`; empty when the file is not TOML.
    pub key: String,
    /// The line of the key in the file, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

impl ExperimentError {
    pub(super) fn new(
        file: &Path,
        key: impl Into<String>,
        reason: impl Into<String>,
    ) -> ExperimentError {
        ExperimentError {
            file: file.to_owned(),
            key: key.into(),
            line: None,
            reason: reason.into(),
        }
    }
}

/// Where a value sits in an experiment file (the file and its key, e.g. `case[0]`), for the
/// errors of the values below it.
pub(super) struct At<'a> {
    path: &'a Path,
    key: String,
}

impl<'a> At<'a> {
    pub(super) fn new(path: &'a Path, key: String) -> At<'a> {
        At { path, key }
    }

    /// The place of `sub` below this one (`case[0]` -> `case[0].workload[1]`).
    pub(super) fn below(&self, sub: &str) -> At<'a> {
        At { path: self.path, key: format!("{}.{sub}", self.key) }
    }

    /// The error of `field` here.
    pub(super) fn fail(&self, field: &str, reason: String) -> ExperimentError {
        ExperimentError::new(self.path, format!("{}.{field}", self.key), reason)
    }
}

impl fmt::Display for ExperimentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ExperimentError {}
