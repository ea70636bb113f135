//! `trace.json`: a streaming writer of the Chrome trace-event format.
//!
//! ui.perfetto.dev and chrome://tracing open `{"displayTimeUnit":"ns","traceEvents":[...]}`
//! with these phases:
//!
//! | phase | method | shows |
//! |---|---|---|
//! | `M` | [`ChromeTrace::process_name`], [`ChromeTrace::thread_name`] | track names |
//! | `X` | [`ChromeTrace::complete`] | a slice with a start and duration (a pause, a write) |
//! | `i` | [`ChromeTrace::instant`] | a point event on a thread track (a throttle decision) |
//! | `C` | [`ChromeTrace::counter`] | a counter track per process and name (dirty pages) |
//!
//! Timestamps and durations are microseconds as floating point, so virtual nanoseconds are
//! written exactly as `ts_ns / 1000`. A simulated hour produces millions of events, so
//! nothing is kept in memory: each event is formatted straight into a `BufWriter`, one event
//! per line, comma-separated. [`ChromeTrace::finish`] closes the array; a file cut short
//! without it still opens in Perfetto, whose JSON importer tolerates a missing `]}`.
//!
//! Strings (names, categories, argument keys and values) are escaped by serde_json, so any
//! text is safe. Timestamps, durations and counter values must be finite (JSON has no NaN);
//! a non-finite one is refused with [`ReportError::NonFinite`]. Non-finite floating-point
//! arguments are written as the strings `"NaN"`, `"inf"` and `"-inf"`, since they are only
//! shown, never plotted.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::output::ReportError;

/// The value of one event argument (the `args` object shown when an event is selected).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue<'a> {
    /// Text, escaped as a JSON string.
    Str(&'a str),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer (page counts, byte counts).
    UInt(u64),
    /// A floating-point number.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl<'a> From<&'a str> for ArgValue<'a> {
    fn from(value: &'a str) -> ArgValue<'a> {
        ArgValue::Str(value)
    }
}

impl From<i64> for ArgValue<'_> {
    fn from(value: i64) -> Self {
        ArgValue::Int(value)
    }
}

impl From<u64> for ArgValue<'_> {
    fn from(value: u64) -> Self {
        ArgValue::UInt(value)
    }
}

impl From<u32> for ArgValue<'_> {
    fn from(value: u32) -> Self {
        ArgValue::UInt(u64::from(value))
    }
}

impl From<usize> for ArgValue<'_> {
    fn from(value: usize) -> Self {
        ArgValue::UInt(value as u64)
    }
}

impl From<f64> for ArgValue<'_> {
    fn from(value: f64) -> Self {
        ArgValue::Float(value)
    }
}

impl From<bool> for ArgValue<'_> {
    fn from(value: bool) -> Self {
        ArgValue::Bool(value)
    }
}

/// A Chrome trace being written to `W`, one event at a time.
pub struct ChromeTrace<W: Write> {
    out: BufWriter<W>,
    /// Named in errors: the file, or `<trace stream>` for a writer of unknown origin.
    path: PathBuf,
    event_count: u64,
}

impl ChromeTrace<File> {
    /// Creates (or truncates) the file at `path` and writes the trace header.
    pub fn create(path: &Path) -> Result<ChromeTrace<File>, ReportError> {
        let file = File::create(path)
            .map_err(|source| ReportError::Write { path: path.to_owned(), source })?;
        ChromeTrace::with_path(file, path.to_owned())
    }
}

impl<W: Write> ChromeTrace<W> {
    /// Starts a trace on `writer` (buffered here) and writes the header.
    pub fn new(writer: W) -> Result<ChromeTrace<W>, ReportError> {
        ChromeTrace::with_path(writer, PathBuf::from("<trace stream>"))
    }

    fn with_path(writer: W, path: PathBuf) -> Result<ChromeTrace<W>, ReportError> {
        let mut trace =
            ChromeTrace { out: BufWriter::with_capacity(1 << 16, writer), path, event_count: 0 };
        let result = trace.out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
        trace.io(result)?;
        Ok(trace)
    }

    /// Number of events written so far, metadata included.
    pub fn event_count(&self) -> u64 {
        self.event_count
    }

    /// Names process `pid` (a top-level group of tracks, e.g. one backend).
    pub fn process_name(&mut self, pid: u32, name: &str) -> Result<(), ReportError> {
        let result = self.begin_event().and_then(|out| {
            write!(out, "{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_name\",\"args\":")?;
            write_args(out, &[("name", ArgValue::Str(name))])?;
            out.write_all(b"}")
        });
        self.io(result)
    }

    /// Names thread `tid` of process `pid` (one track, e.g. one writer or the flusher).
    pub fn thread_name(&mut self, pid: u32, tid: u32, name: &str) -> Result<(), ReportError> {
        let result = self.begin_event().and_then(|out| {
            write!(out, "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",")?;
            out.write_all(b"\"args\":")?;
            write_args(out, &[("name", ArgValue::Str(name))])?;
            out.write_all(b"}")
        });
        self.io(result)
    }

    /// A slice on track (`pid`, `tid`) from `ts_us` lasting `dur_us` (phase `X`).
    #[expect(clippy::too_many_arguments, reason = "mirrors the fields of a trace event")]
    pub fn complete(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        cat: &str,
        ts_us: f64,
        dur_us: f64,
        args: &[(&str, ArgValue<'_>)],
    ) -> Result<(), ReportError> {
        self.check_finite(name, "ts", ts_us)?;
        self.check_finite(name, "dur", dur_us)?;
        let result = self.begin_event().and_then(|out| {
            write!(out, "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":")?;
            write_f64(out, ts_us)?;
            out.write_all(b",\"dur\":")?;
            write_f64(out, dur_us)?;
            write_name_cat_args(out, name, cat, args)
        });
        self.io(result)
    }

    /// A point event on track (`pid`, `tid`) at `ts_us` (phase `i`, thread scope).
    pub fn instant(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        cat: &str,
        ts_us: f64,
        args: &[(&str, ArgValue<'_>)],
    ) -> Result<(), ReportError> {
        self.check_finite(name, "ts", ts_us)?;
        let result = self.begin_event().and_then(|out| {
            write!(out, "{{\"ph\":\"i\",\"s\":\"t\",\"pid\":{pid},\"tid\":{tid},\"ts\":")?;
            write_f64(out, ts_us)?;
            write_name_cat_args(out, name, cat, args)
        });
        self.io(result)
    }

    /// New values of the counter track `name` of process `pid` at `ts_us` (phase `C`); each
    /// entry of `values` is one line of the counter track.
    pub fn counter(
        &mut self,
        pid: u32,
        name: &str,
        ts_us: f64,
        values: &[(&str, f64)],
    ) -> Result<(), ReportError> {
        self.check_finite(name, "ts", ts_us)?;
        for &(key, value) in values {
            self.check_finite(name, key, value)?;
        }
        let result = self.begin_event().and_then(|out| {
            write!(out, "{{\"ph\":\"C\",\"pid\":{pid},\"ts\":")?;
            write_f64(out, ts_us)?;
            out.write_all(b",\"name\":")?;
            write_str(out, name)?;
            out.write_all(b",\"args\":{")?;
            for (index, &(key, value)) in values.iter().enumerate() {
                if index > 0 {
                    out.write_all(b",")?;
                }
                write_str(out, key)?;
                out.write_all(b":")?;
                write_f64(out, value)?;
            }
            out.write_all(b"}}")
        });
        self.io(result)
    }

    /// Closes the event array, flushes, and returns the underlying writer.
    pub fn finish(mut self) -> Result<W, ReportError> {
        let result = self.out.write_all(b"\n]}\n").and_then(|()| self.out.flush());
        self.io(result)?;
        let path = self.path;
        self.out
            .into_inner()
            .map_err(|error| ReportError::Write { path, source: error.into_error() })
    }

    /// Writes the separator before an event and counts it.
    fn begin_event(&mut self) -> std::io::Result<&mut BufWriter<W>> {
        if self.event_count > 0 {
            self.out.write_all(b",\n")?;
        }
        self.event_count += 1;
        Ok(&mut self.out)
    }

    fn io(&self, result: std::io::Result<()>) -> Result<(), ReportError> {
        result.map_err(|source| ReportError::Write { path: self.path.clone(), source })
    }

    fn check_finite(&self, event: &str, field: &str, value: f64) -> Result<(), ReportError> {
        if value.is_finite() {
            return Ok(());
        }
        Err(ReportError::NonFinite {
            path: self.path.clone(),
            field: format!("event {event:?} field {field:?}"),
            value,
        })
    }
}

fn write_name_cat_args<W: Write>(
    out: &mut W,
    name: &str,
    cat: &str,
    args: &[(&str, ArgValue<'_>)],
) -> std::io::Result<()> {
    out.write_all(b",\"name\":")?;
    write_str(out, name)?;
    out.write_all(b",\"cat\":")?;
    write_str(out, cat)?;
    if !args.is_empty() {
        out.write_all(b",\"args\":")?;
        write_args(out, args)?;
    }
    out.write_all(b"}")
}

fn write_args<W: Write>(out: &mut W, args: &[(&str, ArgValue<'_>)]) -> std::io::Result<()> {
    out.write_all(b"{")?;
    for (index, (key, value)) in args.iter().enumerate() {
        if index > 0 {
            out.write_all(b",")?;
        }
        write_str(out, key)?;
        out.write_all(b":")?;
        match *value {
            ArgValue::Str(text) => write_str(out, text)?,
            ArgValue::Int(number) => write!(out, "{number}")?,
            ArgValue::UInt(number) => write!(out, "{number}")?,
            ArgValue::Float(number) if number.is_finite() => write_f64(out, number)?,
            ArgValue::Float(number) => write_str(out, &number.to_string())?,
            ArgValue::Bool(flag) => write!(out, "{flag}")?,
        }
    }
    out.write_all(b"}")
}

/// Writes `text` as a JSON string literal, escaped by serde_json.
fn write_str<W: Write>(out: &mut W, text: &str) -> std::io::Result<()> {
    serde_json::to_writer(out, text).map_err(std::io::Error::from)
}

/// Writes a finite `value` as the shortest JSON number that reads back as the same f64.
fn write_f64<W: Write>(out: &mut W, value: f64) -> std::io::Result<()> {
    debug_assert!(value.is_finite());
    serde_json::to_writer(out, &value).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::Value;

    use super::*;

    /// Parses a finished trace and returns its events, checking the envelope.
    fn parse(bytes: &[u8]) -> Vec<Value> {
        let value: Value = serde_json::from_slice(bytes).expect("trace is valid JSON");
        assert_eq!(value["displayTimeUnit"], "ns");
        value["traceEvents"].as_array().expect("traceEvents array").clone()
    }

    #[test]
    fn trace_is_valid_json_with_the_right_phases() {
        // Goal: every kind of event parses back with its phase, fields and escaped strings.
        let mut trace = ChromeTrace::new(Vec::new()).expect("header");
        trace.process_name(1, "backend \"sata\"").expect("process");
        trace.thread_name(1, 7, "dd #1\n<writer>").expect("thread");
        let args = [
            ("dirty", ArgValue::UInt(1200)),
            ("pos_ratio", ArgValue::Float(0.75)),
            ("bad", ArgValue::Float(f64::NAN)),
            ("reason", ArgValue::Str("over \\ setpoint")),
            ("delta", ArgValue::Int(-3)),
            ("writers", ArgValue::from(2usize)),
            ("strict", ArgValue::Bool(false)),
        ];
        trace.complete(1, 7, "balance_dirty_pages", "throttle", 10.5, 200.0, &args).unwrap();
        trace.instant(1, 7, "wbt_step", "wbt", 11.0, &[]).expect("instant");
        trace.counter(1, "dirty pages", 12.0, &[("dirty", 1200.0), ("setpoint", 1000.0)]).unwrap();
        assert_eq!(trace.event_count(), 5);
        let events = parse(&trace.finish().expect("finish"));
        let phases: Vec<&str> = events.iter().map(|e| e["ph"].as_str().unwrap()).collect();
        assert_eq!(phases, ["M", "M", "X", "i", "C"]);
        assert_eq!(events[0]["args"]["name"], "backend \"sata\"");
        assert_eq!(events[1]["args"]["name"], "dd #1\n<writer>");
        assert_eq!(events[1]["tid"], 7);
        let slice = &events[2];
        assert_eq!(slice["ts"].as_f64(), Some(10.5));
        assert_eq!(slice["dur"].as_f64(), Some(200.0));
        assert_eq!(slice["args"]["dirty"], 1200);
        assert_eq!(slice["args"]["bad"], "NaN");
        assert_eq!(slice["args"]["reason"], "over \\ setpoint");
        assert_eq!(slice["args"]["delta"], -3);
        assert_eq!(slice["args"]["writers"], 2);
        assert_eq!(events[3]["s"], "t");
        assert!(events[3].get("args").is_none());
        assert_eq!(events[4]["args"]["setpoint"].as_f64(), Some(1000.0));
    }

    #[test]
    fn timestamps_are_non_decreasing_per_track() {
        // Goal: events written in time order on several interleaved tracks read back in
        // order per track (pid, tid) for slices and per (pid, name) for counters.
        let mut trace = ChromeTrace::new(Vec::new()).expect("header");
        for step in 0..1000u32 {
            let ts_us = f64::from(step) * 0.125; // virtual ns / 1000, exactly representable
            let tid = step % 3;
            trace.complete(1, tid, "pause", "throttle", ts_us, 0.1, &[]).unwrap();
            trace.counter(2, "dirty", ts_us, &[("pages", f64::from(step))]).unwrap();
        }
        let events = parse(&trace.finish().expect("finish"));
        assert_eq!(events.len(), 2000);
        let mut last_ts: BTreeMap<String, f64> = BTreeMap::new();
        for event in &events {
            let track = match event["ph"].as_str().unwrap() {
                "C" => format!("C/{}/{}", event["pid"], event["name"]),
                _ => format!("T/{}/{}", event["pid"], event["tid"]),
            };
            let ts = event["ts"].as_f64().expect("ts is a number");
            let previous = last_ts.insert(track.clone(), ts).unwrap_or(f64::MIN);
            assert!(previous <= ts, "track {track}: {ts} after {previous}");
        }
        assert_eq!(last_ts.len(), 4);
    }

    #[test]
    fn non_finite_timestamp_is_refused() {
        // Goal: NaN in a timestamp or counter is an error, and the file stays valid JSON.
        let dir = crate::report::test_dir("trace-non-finite");
        let path = dir.join("trace.json");
        let mut trace = ChromeTrace::create(&path).expect("create");
        let error = trace.complete(1, 1, "x", "c", f64::NAN, 1.0, &[]).expect_err("NaN ts");
        assert!(error.to_string().contains("trace.json"), "{error}");
        trace.counter(1, "c", 1.0, &[("v", f64::INFINITY)]).expect_err("inf value");
        trace.counter(1, "c", 1.0, &[("v", 1.0)]).expect("finite value");
        trace.finish().expect("finish");
        let events = parse(&std::fs::read(&path).expect("read back"));
        assert_eq!(events.len(), 1);
    }

    #[test]
    fn empty_trace_is_valid() {
        // Goal: a trace with no events is still a valid, openable file.
        let events = parse(&ChromeTrace::new(Vec::new()).unwrap().finish().unwrap());
        assert!(events.is_empty());
    }
}
