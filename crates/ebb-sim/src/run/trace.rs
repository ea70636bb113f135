//! Trace files of a run: `trace.txt` in the kernel's tracepoint text format and `trace.json`
//! in the Chrome trace-event format, written as the run goes.

use std::fs::File;
use std::io::{BufWriter, Write};

use ebb_core::TraceEvent;

use super::{RunSpec, Sim, SimError};
use crate::output::chrome_trace::{ArgValue, ChromeTrace};

/// Writes trace.txt and trace.json as the run goes.
pub(super) struct Tracer {
    pub(super) txt: BufWriter<File>,
    pub(super) json: ChromeTrace<File>,
    pub(super) names: Vec<String>,
}

impl Tracer {
    /// The tracer of `spec`, if it has a trace directory.
    pub(super) fn create(spec: &RunSpec) -> Result<Option<Tracer>, SimError> {
        let Some(dir) = &spec.trace_dir else { return Ok(None) };
        std::fs::create_dir_all(dir).map_err(SimError::Io)?;
        let txt = BufWriter::new(File::create(dir.join("trace.txt")).map_err(SimError::Io)?);
        let mut json = ChromeTrace::create(&dir.join("trace.json"))
            .map_err(|e| SimError::Spec(e.to_string()))?;
        let _ = json.process_name(1, &spec.name);
        let names = spec.config.backends.iter().map(|b| b.name.clone()).collect();
        Ok(Some(Tracer { txt, json, names }))
    }
}

impl Sim<'_> {
    pub(super) fn write_trace(&mut self) -> Result<(), SimError> {
        let events = self.engine.drain_trace();
        let Some(tr) = &mut self.trace else { return Ok(()) };
        for (at, ev) in events {
            let task = match ev.writer() {
                Some(w) => format!("dd-{}", w.0 + 1),
                None => "kworker/u8:0-1".to_string(),
            };
            tr.txt
                .write_all(ev.text_lines(at, &task, &tr.names).as_bytes())
                .map_err(SimError::Io)?;
            let ts_us = at.as_secs_f64() * 1e6;
            match ev {
                // Every throttle policy's pauses, as spans on the writer's track (the legacy
                // event's pause is the whole call, already over: drawn ending at `at`).
                TraceEvent::BalanceDirtyPages { writer, pause_ms, .. } if pause_ms > 0 => {
                    let dur_us = pause_ms as f64 * 1e3;
                    let _ = tr.json.complete(
                        1,
                        writer.0 + 2,
                        "pause",
                        "balance_dirty_pages",
                        ts_us,
                        dur_us,
                        &[],
                    );
                }
                TraceEvent::Bw2010BalanceDirtyPages { writer, pause_ms, .. } if pause_ms > 0 => {
                    let dur_us = pause_ms as f64 * 1e3;
                    let _ = tr.json.complete(
                        1,
                        writer.0 + 2,
                        "pause",
                        "balance_dirty_pages",
                        ts_us,
                        dur_us,
                        &[],
                    );
                }
                TraceEvent::LegacyBalanceDirtyPages { writer, pause_ms, .. } if pause_ms > 0 => {
                    let dur_us = pause_ms as f64 * 1e3;
                    let start = (ts_us - dur_us).max(0.0);
                    let _ = tr.json.complete(
                        1,
                        writer.0 + 2,
                        "pause",
                        "balance_dirty_pages",
                        start,
                        dur_us,
                        &[],
                    );
                }
                // Writepages calls and COMMITs on the flusher's track.
                TraceEvent::Writepages { wrote, .. } => {
                    let args = [("wrote", ArgValue::UInt(wrote))];
                    let _ = tr.json.instant(1, 1, "writepages", "writeback", ts_us, &args);
                }
                TraceEvent::Commit { pages, .. } => {
                    let args = [("pages", ArgValue::UInt(pages))];
                    let _ = tr.json.instant(1, 1, "commit", "nfs", ts_us, &args);
                }
                _ => {}
            }
        }
        Ok(())
    }
}
