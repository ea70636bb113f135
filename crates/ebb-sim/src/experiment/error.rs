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
