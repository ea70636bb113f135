//! The stats as Prometheus metrics, and a small HTTP endpoint that serves them
//! ([`Ebb::serve_metrics`], `ebb mount --metrics`).
//!
//! The metrics are written from the same figure lists as `ebb stat`'s JSON (the core's
//! `figures()`), so both always show the same fields: a figure shown as `Dirty` is
//! `ebb_dirty_bytes`, `BdiWriteBandwidth` is `ebb_bdi_write_bandwidth` (bytes per second), a
//! backend's figures carry the label `backend`, the cumulative page counts (`Dirtied`,
//! `Written`, `BdiDirtied`, `BdiWritten`) are counters (`ebb_dirtied_bytes_total`), an engine
//! counter such as `writes` is the counter `ebb_writes_total` (one in nanoseconds such as
//! `reclaim_stall_ns` is `ebb_reclaim_stall_seconds_total`, in seconds; `counter` in a name is
//! `count`), a backend's own
//! counter such as `write_rpcs` is `ebb_backend_write_rpcs_total`, the writers' pauses are the
//! histogram `ebb_balance_dirty_pages_pause_seconds`, and their recent median, 99th percentile
//! and longest are three gauges (`ebb_balance_dirty_pages_recent_pause_p50_seconds`, `_p99_`,
//! `_max_`). Pages are shown in bytes (4096 per page), rates in bytes per second, times in
//! seconds, as Prometheus' conventions ask (`promtool check metrics` finds nothing to say);
//! `ebb stat` shows the same in kB.
//!
//! The endpoint answers `GET /metrics` (and `GET /`) with the text format 0.0.4, one request
//! per connection; it reads the stats as `ebb stat` does (the engine lock for a moment, never
//! per page). Each connection is served on a thread of its own, at most [`CLIENTS_MAX`] at
//! once (beyond that a connection gets `503` at once), and must send its request head within
//! [`REQUEST_TIMEOUT`] in all (not per read), so idle or trickling clients cannot hold up a
//! scrape: at worst they hold [`CLIENTS_MAX`] threads for that long.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use ebb_core::PAGE_SIZE;
use ebb_core::stats::{Figure, Unit, Value};

use crate::pauses::BUCKETS_US;
use crate::{Ebb, Inner, RuntimeStats};

/// How often the endpoint's thread looks whether it should stop, when no request comes.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);
/// How long a client may take to send its whole request head (and to take the answer).
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Connections served at once. A scrape takes milliseconds, so more than a few at once are
/// slow or idle clients; 32 threads of a small stack cost little.
const CLIENTS_MAX: usize = 32;
/// The longest request head read.
const REQUEST_MAX: usize = 8192;

/// The Prometheus name of a figure `ebb stat` shows as `figure.name`: `ebb_`, the name in
/// snake case, and `_bytes` for pages (`Dirty` is `ebb_dirty_bytes`, `NFS_Unstable`
/// `ebb_nfs_unstable_bytes`, `BdiWriteBandwidth` `ebb_bdi_write_bandwidth`).
pub fn prometheus_name(figure: &Figure) -> String {
    let mut name = format!("ebb_{}", snake_case(figure.name));
    if figure.unit == Unit::Pages {
        name.push_str("_bytes");
    }
    if is_cumulative(figure) {
        name.push_str("_total");
    }
    name
}

/// The figures that only ever grow (pages dirtied and written since the start): counters.
fn is_cumulative(figure: &Figure) -> bool {
    matches!(figure.name, "Dirtied" | "Written" | "BdiDirtied" | "BdiWritten")
}

/// The Prometheus name of the engine counter `ebb stat` shows as `name`, and what its value is
/// divided by: `writes` is `ebb_writes_total`, `reclaim_stall_ns` is
/// `ebb_reclaim_stall_seconds_total` (divided by 1e9); `counter` in a name is `count`
/// (`global_counter_reads` is `ebb_global_count_reads_total`), since Prometheus reserves the
/// type's name.
pub fn counter_metric(name: &str) -> (String, f64) {
    let name = name.replace("counter", "count");
    match name.strip_suffix("_ns") {
        Some(stem) => (format!("ebb_{stem}_seconds_total"), 1e9),
        None => (format!("ebb_{name}_total"), 1.0),
    }
}

/// The value Prometheus shows for a figure: pages and pages/s in bytes and bytes/s.
pub fn prometheus_value(figure: &Figure, value: Value) -> f64 {
    match (figure.unit, value) {
        (Unit::Pages | Unit::PagesPerSecond, Value::Unsigned(pages)) => (pages * PAGE_SIZE) as f64,
        (_, Value::Unsigned(n)) => n as f64,
        (_, Value::Signed(n)) => n as f64,
    }
}

/// `MemTotal` -> `mem_total`, `NFS_Unstable` -> `nfs_unstable`, `Active(file)` ->
/// `active_file`, `WbtTargetUsec` -> `wbt_target_usec`.
fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            if !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 && !out.ends_with('_') {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase() || prev.is_ascii_digit() || next_lower {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out.trim_end_matches('_').to_owned()
}

/// A label value with `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', r#"\""#).replace('\n', r"\n")
}

/// Writes the `# HELP` and `# TYPE` lines of a metric.
fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// `counter` for the cumulative figures, `gauge` for the others.
fn kind(figure: &Figure) -> &'static str {
    if is_cumulative(figure) { "counter" } else { "gauge" }
}

fn unit_help(figure: &Figure) -> &'static str {
    match figure.unit {
        Unit::Pages => "bytes",
        Unit::PagesPerSecond => "bytes per second",
        Unit::Number => "as ebb stat shows it",
    }
}

impl RuntimeStats {
    /// The stats in Prometheus' text format (see the module doc for the names).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        for (figure, value) in self.meminfo.figures() {
            let name = prometheus_name(&figure);
            let help = format!("{} ({}).", figure.name, unit_help(&figure));
            head(&mut out, &name, kind(&figure), &help);
            let _ = writeln!(out, "{name} {}", prometheus_value(&figure, value));
        }
        self.write_bdi(&mut out);
        for (figure, value) in self.counters.figures() {
            let (name, divisor) = counter_metric(figure.name);
            head(&mut out, &name, "counter", &format!("The engine's {} counter.", figure.name));
            let _ = writeln!(out, "{name} {}", prometheus_value(&figure, value) / divisor);
        }
        self.write_pauses(&mut out);
        out
    }

    /// Each backend's figures and own counters, labelled with its name; one `# TYPE` per
    /// metric, its backends' samples after it.
    fn write_bdi(&self, out: &mut String) {
        let figures: Vec<Vec<(Figure, Value)>> = self.bdi.iter().map(|b| b.figures()).collect();
        for (i, (figure, _)) in figures.first().into_iter().flatten().enumerate() {
            let name = prometheus_name(figure);
            head(out, &name, kind(figure), &format!("{} ({}).", figure.name, unit_help(figure)));
            for (bdi, list) in self.bdi.iter().zip(&figures) {
                let (figure, value) = list[i];
                let value = prometheus_value(&figure, value);
                let _ = writeln!(out, "{name}{{backend=\"{}\"}} {value}", label(&bdi.name));
            }
        }
        let keys: std::collections::BTreeSet<&String> =
            self.backend_counters.iter().flat_map(|c| c.keys()).collect();
        for key in keys {
            let name = format!("ebb_backend_{}_total", snake_case(key));
            head(out, &name, "counter", &format!("The backend client's {key} counter."));
            for (bdi, counters) in self.bdi.iter().zip(&self.backend_counters) {
                if let Some(value) = counters.get(key) {
                    let _ = writeln!(out, "{name}{{backend=\"{}\"}} {value}", label(&bdi.name));
                }
            }
        }
    }

    /// The pause histogram and the recent pauses' percentiles, in seconds.
    fn write_pauses(&self, out: &mut String) {
        let p = &self.pauses;
        let seconds = |us: u64| us as f64 / 1e6;
        let name = "ebb_balance_dirty_pages_pause_seconds";
        head(out, name, "histogram", "Writers' throttle pauses (balance_dirty_pages sleeps).");
        for (bound, count) in BUCKETS_US.iter().zip(&p.buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {count}", seconds(*bound));
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", p.count);
        let _ = writeln!(out, "{name}_sum {}", seconds(p.sum_us));
        let _ = writeln!(out, "{name}_count {}", p.count);
        let r = &p.recent;
        for (which, what, us) in [
            ("p50", "median", r.p50_us),
            ("p99", "99th percentile", r.p99_us),
            ("max", "longest", r.max_us),
        ] {
            let name = format!("ebb_balance_dirty_pages_recent_pause_{which}_seconds");
            let help = format!("The {what} of the writers' pauses over the last 5 to 10 s.");
            head(out, &name, "gauge", &help);
            let _ = writeln!(out, "{name} {}", seconds(us));
        }
    }
}

/// A running metrics endpoint; it stops when dropped (or when the cache is gone).
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// The address it listens on (the port chosen, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Ebb {
    /// Serves the stats as Prometheus metrics at `http://ADDR/metrics` (see the module doc of
    /// `metrics`) until the returned server is dropped. It does not keep the cache alive.
    /// Errors: the address cannot be bound (in use, not local).
    pub fn serve_metrics(&self, addr: SocketAddr) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr).map_err(|error| {
            io::Error::new(error.kind(), format!("metrics endpoint on {addr}: {error}"))
        })?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let cache = Arc::downgrade(&self.inner);
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ebb-metrics".to_owned())
            .spawn(move || serve(&listener, &cache, &stopping))?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }
}

fn serve(listener: &TcpListener, cache: &Weak<Inner>, stop: &AtomicBool) {
    let clients = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if cache.strong_count() == 0 {
                    return;
                }
                if clients.load(Ordering::Acquire) >= CLIENTS_MAX {
                    let _ = busy(stream);
                    continue;
                }
                clients.fetch_add(1, Ordering::AcqRel);
                let (cache, clients) = (cache.clone(), Arc::clone(&clients));
                let spawned = std::thread::Builder::new()
                    .name("ebb-metrics-client".to_owned())
                    .stack_size(256 << 10)
                    .spawn({
                        let clients = Arc::clone(&clients);
                        move || {
                            let _ = answer(stream, &cache);
                            clients.fetch_sub(1, Ordering::AcqRel);
                        }
                    });
                if spawned.is_err() {
                    clients.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(STOP_POLL)
            }
            Err(_) => std::thread::sleep(STOP_POLL),
        }
    }
}

/// Answers `503` to a connection beyond [`CLIENTS_MAX`], without waiting for it.
fn busy(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    let body = "too many clients at once; try again\n";
    let reply = format!(
        "HTTP/1.0 503 Service Unavailable\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes())
}

/// Reads one request head (within [`REQUEST_TIMEOUT`] in all) and answers it, if the cache
/// is still there.
fn answer(mut stream: TcpStream, cache: &Weak<Inner>) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REQUEST_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "request head too slow"));
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let Some(inner) = cache.upgrade() else { return Ok(()) };
    let ebb = Ebb { inner };
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (status, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics" | "/")) => ("200 OK", ebb.stats().prometheus()),
        (Some("GET"), _) => ("404 Not Found", "not found: the metrics are at /metrics\n".into()),
        _ => ("405 Method Not Allowed", "only GET is served\n".into()),
    };
    let reply = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Idle clients (connected, nothing sent) and trickling ones (a byte now and then, never
    /// a whole head) do not hold up a scrape: it is answered while they wait. Before each
    /// connection had its own thread and an overall deadline, four such clients made a scrape
    /// wait for their timeouts one after the other (issue 34).
    #[test]
    fn idle_and_trickling_clients_do_not_hold_up_a_scrape() {
        let backend = Arc::new(ebb_backend::MemBackend::new());
        let ebb = crate::Builder::new().memory(8 << 20).backend("mem", backend).build().unwrap();
        let server = ebb.serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.local_addr();
        let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let tricklers: Vec<_> = (0..4)
            .map(|_| {
                let stop = Arc::clone(&stop);
                let mut stream = TcpStream::connect(addr).unwrap();
                std::thread::spawn(move || {
                    let _ = stream.write_all(b"GET /metr");
                    while !stop.load(Ordering::Acquire) && stream.write_all(b"i").is_ok() {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Generous: the scrape itself takes milliseconds; the clients ahead of it held it for
        // seconds before.
        let limit = std::time::Duration::from_millis(1500);
        let mut scrape = TcpStream::connect(addr).unwrap();
        scrape.set_read_timeout(Some(limit)).unwrap();
        scrape.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        let read = scrape.read_to_string(&mut text);
        stop.store(true, Ordering::Release);
        for trickler in tricklers {
            trickler.join().unwrap();
        }
        drop(idle);
        read.unwrap_or_else(|error| {
            panic!("the scrape was not answered within {limit:?}: {error}")
        });
        assert!(text.starts_with("HTTP/1.0 200 OK"), "{text}");
        assert!(text.contains("\nebb_dirty_bytes "), "{text}");
    }

    /// The names follow the kernel's: what an operator would search for.
    #[test]
    fn names_follow_the_kernels() {
        let name = |name, unit| prometheus_name(&Figure { name, unit });
        assert_eq!(name("Dirty", Unit::Pages), "ebb_dirty_bytes");
        assert_eq!(name("Writeback", Unit::Pages), "ebb_writeback_bytes");
        assert_eq!(name("NFS_Unstable", Unit::Pages), "ebb_nfs_unstable_bytes");
        assert_eq!(name("Active(file)", Unit::Pages), "ebb_active_file_bytes");
        assert_eq!(name("BdiWriteBandwidth", Unit::PagesPerSecond), "ebb_bdi_write_bandwidth");
        assert_eq!(name("WbtTargetUsec", Unit::Number), "ebb_wbt_target_usec");
        assert_eq!(name("DirtyRatelimit", Unit::PagesPerSecond), "ebb_dirty_ratelimit");
        assert_eq!(name("Written", Unit::Pages), "ebb_written_bytes_total");
        assert_eq!(name("BdiDirtied", Unit::Pages), "ebb_bdi_dirtied_bytes_total");
        assert_eq!(
            counter_metric("reclaim_stall_ns"),
            ("ebb_reclaim_stall_seconds_total".into(), 1e9)
        );
    }

    /// Every figure appears once with a `# TYPE`, in bytes, backends labelled (a quote in a
    /// name escaped), and the pause histogram's buckets end with `+Inf` = count.
    #[test]
    fn text_has_every_figure_once() {
        let mut stats = RuntimeStats::default();
        stats.meminfo.dirty = 3;
        for name in ["a", "b\"c"] {
            let bdi =
                ebb_core::BdiStats { name: name.into(), write_bandwidth: 2, ..Default::default() };
            stats.bdi.push(bdi);
            stats.backend_counters.push([("write_rpcs".to_owned(), 5)].into());
        }
        stats.pauses.count = 4;
        stats.pauses.buckets = vec![1; BUCKETS_US.len()];
        let text = stats.prometheus();
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let unique: std::collections::BTreeSet<&&str> = types.iter().collect();
        assert_eq!(types.len(), unique.len(), "a metric typed twice:\n{text}");
        let figures = stats.meminfo.figures().len() + stats.counters.figures().len();
        // The pause histogram, its three recent gauges and the backend's write_rpcs counter.
        assert_eq!(types.len(), figures + stats.bdi[0].figures().len() + 1 + 3 + 1, "{text}");
        assert!(text.contains("\n# TYPE ebb_dirtied_bytes_total counter\n"), "{text}");
        assert!(text.contains("\nebb_reclaim_stall_seconds_total 0\n"), "{text}");
        assert!(!text.contains("quantile"), "{text}");
        assert!(text.contains("\nebb_dirty_bytes 12288\n"), "{text}");
        assert!(text.contains("\nebb_bdi_write_bandwidth{backend=\"a\"} 8192\n"), "{text}");
        assert!(text.contains("\nebb_bdi_write_bandwidth{backend=\"b\\\"c\"} 8192\n"), "{text}");
        assert!(text.contains("\nebb_backend_write_rpcs_total{backend=\"a\"} 5\n"), "{text}");
        assert!(text.contains("\nebb_writes_total 0\n"), "{text}");
        let inf = "\nebb_balance_dirty_pages_pause_seconds_bucket{le=\"+Inf\"} 4\n";
        assert!(text.contains(inf), "{text}");
        assert!(text.contains("_bucket{le=\"0.2\"} 1\n"), "{text}");
    }
}
