//! Report writers of the simulator: the files `ebb sim` and `ebb reproduce` leave behind.
//!
//! Each experiment produces numbers (`summary.json`), optionally a trace (`trace.json`, opened
//! by ui.perfetto.dev), PNG charts of the controller signals kernel developers are used to
//! reading (dirty pages against setpoint and limit, ratelimits, bandwidth, pause times), and
//! one self-contained `report.html` that puts each published result beside ours. The CLI
//! prints the same comparisons as plain-text tables.
//!
//! Everything here is deterministic: the same inputs give byte-identical files, so reports
//! can be diffed and golden-tested. Nothing here prints; writers take a path or a `Write`,
//! and the text formatter returns a `String`.
//!
//! | module | writes |
//! |---|---|
//! | [`summary`] | `summary.json`: experiment, runs, config and metrics |
//! | [`hist`] | latency histograms and exact sample statistics turned into metrics |
//! | [`chrome_trace`] | `trace.json` in the Chrome trace-event format, streamed |
//! | [`plot`] | PNG line and point charts with an embedded font |
//! | [`html`] | `report.html` |
//! | [`text`] | aligned plain-text tables for terminals |
//! | [`trace_file`] | the report of a trace file (`ebb report`): charts, `report.html`, `trace.json` |

pub mod compare_charts;
pub mod html;
pub mod plot;
pub mod run_charts;
pub mod summary;
pub mod text;
pub mod trace_file;

pub use crate::output::{ReportError, chrome_trace, hist};

/// A fresh, empty directory for one test's output, unique per test name and process, under
/// `std::env::temp_dir()`.
#[cfg(test)]
pub(crate) fn test_dir(test_name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ebb-sim-report-{test_name}-{}", std::process::id()));
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => panic!("cannot clear {}: {error}", dir.display()),
    }
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}
