//! `ebb top MOUNTPOINT`: a live view of a mount, refreshed from its stats (what `ebb stat`
//! reads from the mount's stats socket, a moment under the engine lock per refresh, nothing
//! per page).
//!
//! Per backend: dirty, writeback, unstable and held pages against the background threshold,
//! freerun, setpoint and limit; write bandwidth and the dirty ratelimit; the writers' pauses of
//! the last seconds; wbt's depths and read latency; the backend client's counters; sparklines
//! of the last minute. `q` (or Esc, Ctrl-C) quits.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Gauge, Paragraph, Sparkline};
use serde_json::Value;

/// The history the sparklines show.
const HISTORY: Duration = Duration::from_secs(60);

/// One refresh's figures for the sparklines.
#[derive(Clone, Copy, Default)]
struct Sample {
    dirty_kb: u64,
    writeback_kb: u64,
    write_bw_kbps: u64,
    pause_p99_us: u64,
}

/// Reads one figure of a sample.
type Figure = fn(&Sample) -> u64;

/// What the screen shows: the last stats (or why there are none) and the history.
struct View {
    mountpoint: String,
    interval: Duration,
    stats: Result<Value, String>,
    history: VecDeque<Sample>,
}

fn kb(value: &Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or(0)
}

/// `1234 kB` as `1.2 MiB`.
fn size(kb: u64) -> String {
    match kb {
        0..1024 => format!("{kb} KiB"),
        1024..1_048_576 => format!("{:.1} MiB", kb as f64 / 1024.0),
        _ => format!("{:.2} GiB", kb as f64 / 1_048_576.0),
    }
}

fn rate(kbps: u64) -> String {
    format!("{:.1} MB/s", kbps as f64 * 1024.0 / 1e6)
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

impl View {
    fn refresh(&mut self, mountpoint: &Path) {
        self.stats = ebb_fuse::read_stats(mountpoint)
            .map_err(|error| error.to_string())
            .and_then(|text| serde_json::from_str(&text).map_err(|error| error.to_string()));
        let Ok(stats) = &self.stats else { return };
        let (meminfo, bdi) = (&stats["meminfo"], &stats["bdi"][0]);
        self.history.push_back(Sample {
            dirty_kb: kb(meminfo, "Dirty"),
            writeback_kb: kb(meminfo, "Writeback") + kb(meminfo, "NFS_Unstable"),
            write_bw_kbps: kb(bdi, "BdiWriteBandwidth"),
            pause_p99_us: stats["pauses"]["recent"]["p99_us"].as_u64().unwrap_or(0),
        });
        let keep = (HISTORY.as_millis() / self.interval.as_millis().max(1)) as usize;
        while self.history.len() > keep.max(1) {
            self.history.pop_front();
        }
    }

    fn draw(&self, frame: &mut ratatui::Frame<'_>) {
        let title = format!(" ebb top {} · every {:?} · q quits ", self.mountpoint, self.interval);
        let outer = Block::bordered().title(title);
        let area = outer.inner(frame.area());
        frame.render_widget(outer, frame.area());
        let stats = match &self.stats {
            Ok(stats) => stats,
            Err(error) => {
                let text = format!("no stats from {}: {error}", self.mountpoint);
                frame.render_widget(Paragraph::new(text), area);
                return;
            }
        };
        let backends = stats["bdi"].as_array().map_or(0, Vec::len) as u16;
        let rows = Layout::vertical([
            Constraint::Length(5),
            Constraint::Length(7 * backends),
            Constraint::Length(3),
            Constraint::Min(8),
        ])
        .split(area);
        cache_block(frame, rows[0], &stats["meminfo"]);
        let bdi_rows =
            Layout::vertical(vec![Constraint::Length(7); backends as usize]).split(rows[1]);
        for (i, row) in bdi_rows.iter().enumerate() {
            backend_block(frame, *row, &stats["bdi"][i]);
        }
        pause_block(frame, rows[2], &stats["pauses"]);
        self.sparklines(frame, rows[3]);
    }

    fn sparklines(&self, frame: &mut ratatui::Frame<'_>, area: Rect) {
        let last = self.history.back().copied().unwrap_or_default();
        let lines: [(String, Figure, Color); 4] = [
            (format!("dirty {}", size(last.dirty_kb)), |s| s.dirty_kb, Color::Red),
            (
                format!("writeback+unstable {}", size(last.writeback_kb)),
                |s| s.writeback_kb,
                Color::Yellow,
            ),
            (
                format!("write bandwidth {}", rate(last.write_bw_kbps)),
                |s| s.write_bw_kbps,
                Color::Green,
            ),
            (format!("pause p99 {}", ms(last.pause_p99_us)), |s| s.pause_p99_us, Color::Magenta),
        ];
        let block = Block::bordered().title(" last minute ");
        let inner = block.inner(area);
        frame.render_widget(block, area);
        let rows = Layout::vertical([Constraint::Ratio(1, 4); 4]).split(inner);
        for ((title, value, color), row) in lines.into_iter().zip(rows.iter()) {
            let [label, chart] =
                Layout::horizontal([Constraint::Length(32), Constraint::Min(10)]).areas(*row);
            frame.render_widget(Paragraph::new(title), label);
            let data: Vec<u64> = self.history.iter().map(value).collect();
            frame.render_widget(
                Sparkline::default().data(&data).style(Style::new().fg(color)),
                chart,
            );
        }
    }
}

/// The cache: its pages against the global thresholds, and a gauge of dirty against the limit.
fn cache_block(frame: &mut ratatui::Frame<'_>, area: Rect, m: &Value) {
    let block = Block::bordered().title(" cache ");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [text, gauge] =
        Layout::vertical([Constraint::Length(2), Constraint::Length(1)]).areas(inner);
    let lines = vec![
        Line::from(format!(
            "dirty {}   writeback {}   unstable {}   held {}   of {} cached, {} budget",
            size(kb(m, "Dirty")),
            size(kb(m, "Writeback")),
            size(kb(m, "NFS_Unstable")),
            size(kb(m, "Held")),
            size(kb(m, "Cached")),
            size(kb(m, "MemTotal")),
        )),
        Line::from(format!(
            "bg_thresh {}   freerun {}   setpoint {}   thresh {}   limit {}",
            size(kb(m, "BackgroundThresh")),
            size(kb(m, "DirtyFreerun")),
            size(kb(m, "DirtySetpoint")),
            size(kb(m, "DirtyThresh")),
            size(kb(m, "DirtyLimit")),
        )),
    ];
    frame.render_widget(Paragraph::new(lines), text);
    let dirty = kb(m, "Dirty") + kb(m, "Writeback") + kb(m, "NFS_Unstable");
    let limit = kb(m, "DirtyLimit").max(1);
    let ratio = (dirty as f64 / limit as f64).min(1.0);
    let label = format!("dirty+writeback+unstable {} of limit {}", size(dirty), size(limit));
    frame.render_widget(Gauge::default().ratio(ratio).label(label).gauge_style(Color::Red), gauge);
}

/// One backend: pages against its thresholds, bandwidth and ratelimit, wbt, client counters.
fn backend_block(frame: &mut ratatui::Frame<'_>, area: Rect, b: &Value) {
    let name = b["name"].as_str().unwrap_or("?");
    let counters: Vec<String> = b["backend"]
        .as_object()
        .map(|map| map.iter().map(|(k, v)| format!("{k} {v}")).collect())
        .unwrap_or_default();
    let lines = vec![
        Line::from(format!(
            "dirty {}   writeback {}   unstable {}   held {}   bg_thresh {}   thresh {}",
            size(kb(b, "BdiReclaimable")),
            size(kb(b, "BdiWriteback")),
            size(kb(b, "BdiUnstable")),
            size(kb(b, "BdiHeld")),
            size(kb(b, "BdiBackgroundThresh")),
            size(kb(b, "BdiDirtyThresh")),
        )),
        Line::from(format!(
            "write bandwidth {} (avg {})   dirty ratelimit {} (balanced {})   in flight {}",
            rate(kb(b, "BdiWriteBandwidth")),
            rate(kb(b, "BdiAvgWriteBandwidth")),
            rate(kb(b, "DirtyRatelimit")),
            rate(kb(b, "BalancedDirtyRatelimit")),
            kb(b, "Inflight"),
        )),
        Line::from(format!(
            "wbt depth {}   background {}   normal {}   step {}   read min {} (target {})",
            kb(b, "WbtMaxDepth"),
            kb(b, "WbtBackground"),
            kb(b, "WbtNormal"),
            b["WbtStep"].as_i64().unwrap_or(0),
            ms(kb(b, "WbtReadMinUsec")),
            match kb(b, "WbtTargetUsec") {
                0 => "off".to_owned(),
                us => ms(us),
            },
        )),
        Line::from(if counters.is_empty() {
            "client counters: none (a local directory)".to_owned()
        } else {
            format!("client: {}", counters.join("   "))
        }),
        Line::from(format!(
            "written {}   dirtied {}",
            size(kb(b, "BdiWritten")),
            size(kb(b, "BdiDirtied"))
        )),
    ];
    let paragraph =
        Paragraph::new(lines).block(Block::bordered().title(format!(" backend {name} ")));
    frame.render_widget(paragraph, area);
}

/// The writers' pauses of the last seconds, and since the start.
fn pause_block(frame: &mut ratatui::Frame<'_>, area: Rect, p: &Value) {
    let r = &p["recent"];
    let us = |v: &Value, key: &str| v[key].as_u64().unwrap_or(0);
    let text = format!(
        "last {:.1} s: {} pauses, p50 {}   p99 {}   max {}      since the start: {} pauses, p99 {}, max {}",
        us(r, "window_ms") as f64 / 1000.0,
        us(r, "count"),
        ms(us(r, "p50_us")),
        ms(us(r, "p99_us")),
        ms(us(r, "max_us")),
        us(p, "count"),
        ms(us(p, "p99_us")),
        ms(us(p, "max_us")),
    );
    frame.render_widget(
        Paragraph::new(text).block(Block::bordered().title(" writer pauses ")),
        area,
    );
}

/// Whether a key event asks to quit.
fn quits(event: &Event) -> bool {
    let Event::Key(key) = event else { return false };
    key.kind == KeyEventKind::Press
        && (matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
            || (key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL)))
}

/// Runs the view until `q`. Errors: no terminal to draw on, or the terminal failing.
pub(crate) fn top(mountpoint: &Path, interval: Duration) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        anyhow::bail!("ebb top draws on a terminal, and stdout is not one (use ebb stat for JSON)");
    }
    let mut view = View {
        mountpoint: mountpoint.display().to_string(),
        interval,
        stats: Err("not read yet".to_owned()),
        history: VecDeque::new(),
    };
    let mut terminal = ratatui::try_init()?;
    let result = (|| -> anyhow::Result<()> {
        loop {
            let next = Instant::now() + interval;
            view.refresh(mountpoint);
            terminal.draw(|frame| view.draw(frame))?;
            while let Some(wait) = next.checked_duration_since(Instant::now()) {
                if event::poll(wait)? && quits(&event::read()?) {
                    return Ok(());
                }
            }
        }
    })();
    ratatui::try_restore()?;
    result
}
