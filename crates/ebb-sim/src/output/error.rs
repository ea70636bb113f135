//! The one error type of the report writers.
//!
//! Every report failure is an operating error (a full disk, a missing directory, a metric that
//! came out as NaN), so it is returned, never panicked on. Each variant names the file or
//! template involved and the cause, because the CLI shows these messages to users as they are.

use std::fmt;
use std::path::PathBuf;

/// Why a report file could not be written or read.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReportError {
    /// Creating, writing or flushing a file failed.
    Write {
        /// The file being written.
        path: PathBuf,
        /// The underlying IO error.
        source: std::io::Error,
    },
    /// Opening or reading a file failed.
    Read {
        /// The file being read.
        path: PathBuf,
        /// The underlying IO error.
        source: std::io::Error,
    },
    /// A file was read but is not the JSON we expect, or a value could not be serialized.
    Json {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying serde_json error, with line and column when parsing.
        source: serde_json::Error,
    },
    /// A number that must be finite (a metric, a timestamp, a counter) was NaN or infinite.
    /// JSON has no representation for these, and writing `null` would only move the failure
    /// to whoever reads the file.
    NonFinite {
        /// The file being written.
        path: PathBuf,
        /// Which value, e.g. `runs["sata/ioless"].metrics["write_mb_s"]`.
        field: String,
        /// The offending value.
        value: f64,
    },
    /// Drawing or encoding a chart failed, or the chart's input cannot be drawn.
    Plot {
        /// The PNG being rendered.
        path: PathBuf,
        /// What went wrong, as reported by plotters or by our own checks.
        message: String,
    },
    /// Rendering the HTML template failed.
    Template {
        /// The template's name.
        template: String,
        /// The underlying minijinja error.
        source: minijinja::Error,
    },
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::Write { path, source } => {
                write!(f, "cannot write {}: {source}", path.display())
            }
            ReportError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            ReportError::Json { path, source } => {
                write!(f, "invalid JSON in {}: {source}", path.display())
            }
            ReportError::NonFinite { path, field, value } => write!(
                f,
                "cannot write {}: {field} is {value}, and JSON only holds finite numbers",
                path.display()
            ),
            ReportError::Plot { path, message } => {
                write!(f, "cannot render chart {}: {message}", path.display())
            }
            ReportError::Template { template, source } => {
                write!(f, "cannot render template {template}: {source:#}")
            }
        }
    }
}

impl std::error::Error for ReportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReportError::Write { source, .. } | ReportError::Read { source, .. } => Some(source),
            ReportError::Json { source, .. } => Some(source),
            ReportError::Template { source, .. } => Some(source),
            ReportError::NonFinite { .. } | ReportError::Plot { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_and_cause() {
        // Goal: a user reading the message learns which file failed and why.
        let error = ReportError::NonFinite {
            path: PathBuf::from("out/summary.json"),
            field: "runs[\"a\"].metrics[\"write_mb_s\"]".to_owned(),
            value: f64::NAN,
        };
        let text = error.to_string();
        assert!(text.contains("out/summary.json"), "{text}");
        assert!(text.contains("write_mb_s"), "{text}");
        assert!(text.contains("NaN"), "{text}");
    }
}
