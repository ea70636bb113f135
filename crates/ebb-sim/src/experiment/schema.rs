//! The experiment file as written: serde structs that refuse unknown keys (but a backend's,
//! which are knob names checked by the registry), and the parse that names the key and line
//! of an error.

use std::path::Path;

use serde::Deserialize;

use super::ExperimentError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExperiment {
    pub(super) name: Option<String>,
    pub(super) title: String,
    pub(super) description: String,
    pub(super) reproduces: String,
    pub(super) compare: String,
    /// `"posting"` (the default: the rows are a posting's numbers) or `"ebb"` (ebb's own
    /// experiment, tallied apart).
    pub(super) origin: Option<String>,
    pub(super) variants: Vec<toml::Value>,
    pub(super) seed: Option<u64>,
    #[serde(rename = "case")]
    pub(super) cases: Vec<RawCase>,
    pub(super) quick: Option<RawQuick>,
    #[serde(default, rename = "published")]
    pub(super) published: Vec<RawPublished>,
    #[serde(default, rename = "check")]
    pub(super) checks: Vec<RawCheck>,
    #[serde(default, rename = "reference")]
    pub(super) references: Vec<RawReference>,
}

/// A `[[reference]]`: the posting's percentile points of one run's read latency, drawn on
/// that case's distribution chart.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReference {
    pub(super) case: String,
    pub(super) variant: String,
    pub(super) label: String,
    /// `[percentile, microseconds]` pairs.
    pub(super) read_latency_us: Vec<[f64; 2]>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCase {
    pub(super) name: String,
    pub(super) memory: toml::Value,
    pub(super) time_limit: toml::Value,
    pub(super) steady_from: Option<toml::Value>,
    pub(super) sample_interval: Option<toml::Value>,
    pub(super) settle_within: Option<f64>,
    #[serde(default)]
    pub(super) knobs: toml::Table,
    #[serde(rename = "backend")]
    pub(super) backends: Vec<RawBackend>,
    #[serde(rename = "workload")]
    pub(super) workloads: Vec<RawWorkload>,
    #[serde(default, rename = "fault")]
    pub(super) faults: Vec<RawFault>,
    pub(super) crash: Option<RawCrash>,
}

/// A `[[case.fault]]`: a window in which one backend's writes or reads fail with an errno or its
/// completions arrive late (`run::Fault`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFault {
    pub(super) backend: Option<String>,
    pub(super) from: toml::Value,
    /// Absent: the fault lasts forever.
    pub(super) until: Option<toml::Value>,
    /// An errno number or name (`"EIO"`, `"ENOSPC"`, ...).
    pub(super) errno: Option<toml::Value>,
    /// The errno the engine's reads fail with, a number or name.
    pub(super) read_errno: Option<toml::Value>,
    pub(super) delay: Option<toml::Value>,
}

/// A case's `crash`: the run ends at a crash of ebb or a power cut (`run::Crash`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCrash {
    pub(super) at: toml::Value,
    pub(super) power_cut: Option<bool>,
    pub(super) restart: Option<bool>,
}

/// A `[[case.backend]]`: its device, and per-backend knobs by name (checked against the
/// registry when the case is built, so an unknown key is refused there).
#[derive(Deserialize)]
pub(super) struct RawBackend {
    pub(super) name: String,
    pub(super) device: String,
    #[serde(default)]
    pub(super) device_overrides: toml::Table,
    /// Anonymous memory is swapped out to this backend (at most one per case).
    pub(super) swap: Option<bool>,
    #[serde(flatten)]
    pub(super) knobs: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkload {
    pub(super) kind: String,
    pub(super) backend: Option<String>,
    pub(super) size: toml::Value,
    pub(super) bs: Option<toml::Value>,
    pub(super) start: Option<toml::Value>,
    pub(super) fsync: Option<bool>,
    pub(super) think: Option<toml::Value>,
    /// dd: once this much is written, truncate the file to `truncate_to` and go on from there.
    pub(super) truncate_at: Option<toml::Value>,
    pub(super) truncate_to: Option<toml::Value>,
    /// dd: unlink the file after closing it.
    pub(super) unlink: Option<bool>,
    /// fsmark: writer threads.
    pub(super) threads: Option<u32>,
    /// fsmark: bytes per file.
    pub(super) file_size: Option<toml::Value>,
    /// mmap-strm: bytes of the mixed phase; `chunk`: bytes per switch.
    pub(super) mix: Option<toml::Value>,
    pub(super) chunk: Option<toml::Value>,
    /// anon-churn: how long each program holds its memory, and the start-to-start period.
    pub(super) hold: Option<toml::Value>,
    pub(super) period: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuick {
    pub(super) size_scale: Option<f64>,
    pub(super) memory: Option<toml::Value>,
    pub(super) time_limit: Option<toml::Value>,
    pub(super) steady_from: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPublished {
    pub(super) claim: String,
    pub(super) published: String,
    pub(super) ours: String,
    /// The posting's line this number is read from, verbatim.
    pub(super) line: Option<String>,
    /// The posting's number (or `[low, high]`); without it the row is not compared.
    pub(super) value: Option<toml::Value>,
    /// Ours, as an expression over the runs' metrics.
    pub(super) ours_value: Option<toml::Value>,
    /// `x2`, `+-3` or `range`.
    pub(super) tolerance: Option<String>,
    /// `"change"` (a before/after effect, with `neutral`) or `"level"` (an absolute figure);
    /// required on every row with a value.
    pub(super) kind: Option<String>,
    /// The point that gives a change its direction (1 for a before/after factor).
    pub(super) neutral: Option<f64>,
    /// The posting's own noise on this number (its standard deviation, or what it calls not
    /// significant), in the value's unit; the row is then judged within `+-noise`.
    pub(super) noise: Option<f64>,
    #[serde(default)]
    pub(super) checks: Vec<String>,
    /// Why ours differs, shown when the row is not reproduced.
    pub(super) why: Option<String>,
    /// Where the analysis is (a path under docs/, with its anchor).
    pub(super) analysis: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCheck {
    pub(super) id: Option<String>,
    pub(super) what: String,
    pub(super) left: toml::Value,
    pub(super) op: String,
    pub(super) right: toml::Value,
    /// A regime figure (a level check): reported, not failing the run.
    pub(super) level: Option<bool>,
}

pub(super) fn deserialize(path: &Path, text: &str) -> Result<RawExperiment, ExperimentError> {
    let table: toml::Table = toml::from_str(text).map_err(|error| {
        let mut e = ExperimentError::new(path, "", format!("not valid TOML: {}", error.message()));
        e.line = error.span().map(|span| line_of(text, span.start));
        e
    })?;
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|error| {
        let key = error.path().to_string();
        let key = if key == "." { String::new() } else { key };
        let message = error.inner().to_string();
        // toml appends "in `a.b`" on its own line; the key says that already.
        let reason = message.lines().next().unwrap_or_default().to_owned();
        let mut e = ExperimentError::new(path, key, reason);
        // Parsing the text directly once more gives the line, which the table has lost.
        if let Err(direct) = toml::from_str::<RawExperiment>(text) {
            e.line = direct.span().map(|span| line_of(text, span.start));
        }
        e
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}
