//! The file formats a run and its report share, apart from both: latency histograms and exact
//! sample statistics ([`hist`]), `trace.json` in the Chrome trace-event format
//! ([`chrome_trace`]), and the errors of writing them ([`ReportError`]). A run writes its trace
//! and keeps its histograms through these; `crate::report` re-exports them under their earlier
//! paths.

pub mod chrome_trace;
mod error;
pub mod hist;

pub use error::ReportError;
