//! A fault proxy: a TCP proxy on 127.0.0.1 that the outage tests put between ebb and its server
//! (nfs-ganesha or versitygw), told what to do with connections by [`Proxy::set`]:
//!
//! | mode | new connections | open connections |
//! |---|---|---|
//! | [`Mode::Pass`] | accepted and relayed | relayed |
//! | [`Mode::Refuse`] | refused (the listener is closed: `ECONNREFUSED`) | reset |
//! | [`Mode::Reset`] | accepted, then reset at once (`ECONNRESET`) | reset |
//! | [`Mode::Stall`] | accepted, never answered (bytes read and dropped) | nothing more relayed either way |
//! | [`Mode::Full`] | one HTTP request each: a `PUT` (S3 PutObject, UploadPart) answered `507 Insufficient Storage`, as versitygw answers with its disk full; any other request relayed with `Connection: close` | reset |
//!
//! Dropping the proxy stops it: the listener is closed and every relay thread ends within
//! [`POLL`] (they poll a stop flag between reads of at most that long).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a relay thread or the acceptor waits before looking at the mode again.
const POLL: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mode {
    Pass = 0,
    Refuse = 1,
    Reset = 2,
    Stall = 3,
    /// An S3 server whose disk is full (HTTP only).
    Full = 4,
}

impl Mode {
    fn from_u8(value: u8) -> Mode {
        match value {
            1 => Mode::Refuse,
            2 => Mode::Reset,
            3 => Mode::Stall,
            4 => Mode::Full,
            _ => Mode::Pass,
        }
    }
}

struct Shared {
    mode: AtomicU8,
    stop: AtomicBool,
    /// Bumped by every change of mode that ends open connections (refuse, reset).
    generation: std::sync::atomic::AtomicU64,
    /// The listener, absent while refusing.
    listener: Mutex<Option<TcpListener>>,
}

/// A running proxy from `addr()` to the server's address.
pub(crate) struct Proxy {
    shared: Arc<Shared>,
    port: u16,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `server` on a free port of 127.0.0.1, passing connections.
    pub(crate) fn start(server: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Pass as u8),
            stop: AtomicBool::new(false),
            generation: Default::default(),
            listener: Mutex::new(Some(listener)),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("fault-proxy".to_owned())
                .spawn(move || accept_loop(&shared, server, port))?
        };
        Ok(Proxy { shared, port, acceptor: Some(acceptor) })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// What to do with connections from now on.
    pub(crate) fn set(&self, mode: Mode) {
        let old = Mode::from_u8(self.shared.mode.swap(mode as u8, Ordering::SeqCst));
        if matches!(mode, Mode::Refuse | Mode::Reset | Mode::Full) {
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        let mut listener = self.shared.listener.lock().unwrap();
        if mode == Mode::Refuse {
            *listener = None;
        } else if old == Mode::Refuse || listener.is_none() {
            // Bind the same port again (SO_REUSEADDR is set by std on Unix listeners).
            for _ in 0..250 {
                if let Ok(bound) = TcpListener::bind(("127.0.0.1", self.port)) {
                    bound.set_nonblocking(true).unwrap();
                    *listener = Some(bound);
                    return;
                }
                std::thread::sleep(POLL);
            }
            panic!("the fault proxy could not listen on port {} again", self.port);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.listener.lock().unwrap().take();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, server: SocketAddr, _port: u16) {
    while !shared.stop.load(Ordering::SeqCst) {
        let accepted = shared.listener.lock().unwrap().as_ref().map(TcpListener::accept);
        let (client, _) = match accepted {
            Some(Ok(pair)) => pair,
            _ => {
                std::thread::sleep(POLL);
                continue;
            }
        };
        let _ = client.set_nonblocking(false);
        match Mode::from_u8(shared.mode.load(Ordering::SeqCst)) {
            Mode::Refuse | Mode::Reset => reset(&client),
            Mode::Full => {
                let shared = Arc::clone(shared);
                let _ = std::thread::Builder::new()
                    .name("fault-proxy-full".to_owned())
                    .spawn(move || full(&shared, client, server));
            }
            Mode::Stall | Mode::Pass => {
                let shared = Arc::clone(shared);
                let _ = std::thread::Builder::new()
                    .name("fault-proxy-conn".to_owned())
                    .spawn(move || serve(&shared, client, server));
            }
        }
    }
}

/// Closes `stream` with a RST (linger 0) instead of a FIN.
fn reset(stream: &TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(stream, Some(Duration::ZERO));
    let _ = stream.shutdown(Shutdown::Both);
}

/// One client connection: connects to the server (when passing) and relays both ways until
/// either side closes, the mode ends the connection or the proxy stops.
fn serve(shared: &Arc<Shared>, client: TcpStream, server: SocketAddr) {
    let generation = shared.generation.load(Ordering::SeqCst);
    // A connection accepted while stalled is held without a server connection until the
    // mode changes.
    while Mode::from_u8(shared.mode.load(Ordering::SeqCst)) == Mode::Stall {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        drain(&client);
        std::thread::sleep(POLL);
    }
    if shared.generation.load(Ordering::SeqCst) != generation {
        reset(&client);
        return;
    }
    let Ok(upstream) = TcpStream::connect(server) else {
        reset(&client);
        return;
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    relay_both_ways(shared, client, upstream, generation);
}

/// One request of a connection accepted while the server is full: a `PUT` is answered 507
/// (its body read and dropped); anything else is sent to the server with `Connection: close`
/// and its answer relayed, so the client's next request comes on a new connection.
fn full(shared: &Arc<Shared>, client: TcpStream, server: SocketAddr) {
    let generation = shared.generation.load(Ordering::SeqCst);
    let _ = client.set_read_timeout(Some(POLL));
    let mut head = Vec::new();
    let mut buf = [0u8; 64 << 10];
    let end = loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if shared.stop.load(Ordering::SeqCst) || head.len() > 1 << 20 {
            return reset(&client);
        }
        match (&client).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<&str> = lines
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    if request.starts_with("PUT ") {
        let length = headers
            .iter()
            .find_map(|h| {
                h.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(str::trim)
                    .and_then(|v| v.parse::<usize>().ok())
            })
            .unwrap_or(0);
        let mut left = length.saturating_sub(head.len() - end);
        while left > 0 && !shared.stop.load(Ordering::SeqCst) {
            match (&client).read(&mut buf[..left.min(64 << 10)]) {
                Ok(0) => return,
                Ok(n) => left -= n,
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
        }
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InsufficientStorage</Code>\
                    <Message>Your request was rejected because there is not enough storage.</Message></Error>";
        let answer = format!(
            "HTTP/1.1 507 Insufficient Storage\r\nContent-Type: application/xml\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = (&client).write_all(answer.as_bytes());
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let Ok(upstream) = TcpStream::connect(server) else { return reset(&client) };
    let mut rewritten = format!("{request}\r\n");
    for h in &headers {
        rewritten.push_str(h);
        rewritten.push_str("\r\n");
    }
    rewritten.push_str("Connection: close\r\n\r\n");
    if (&upstream).write_all(rewritten.as_bytes()).is_err()
        || (&upstream).write_all(&head[end..]).is_err()
    {
        return reset(&client);
    }
    relay_both_ways(shared, client, upstream, generation);
}

/// Reads and drops whatever `stream` has ready.
fn drain(stream: &TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(1)));
    let mut buf = [0u8; 64 << 10];
    let _ = (&*stream).read(&mut buf);
}

/// Relays `client` to `upstream` on a thread of its own and back on this one, until both end.
fn relay_both_ways(shared: &Arc<Shared>, client: TcpStream, upstream: TcpStream, generation: u64) {
    let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let back = {
        let shared = Arc::clone(shared);
        std::thread::spawn(move || relay(&shared, u2, c2, generation))
    };
    relay(shared, client, upstream, generation);
    let _ = back.join();
}

/// Copies `from` to `to` while passing; holds while stalled; resets both ends when the mode
/// says so or the proxy stops.
fn relay(shared: &Shared, mut from: TcpStream, mut to: TcpStream, generation: u64) {
    from.set_read_timeout(Some(POLL)).unwrap();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        if shared.stop.load(Ordering::SeqCst)
            || shared.generation.load(Ordering::SeqCst) != generation
        {
            reset(&from);
            reset(&to);
            return;
        }
        if Mode::from_u8(shared.mode.load(Ordering::SeqCst)) == Mode::Stall {
            std::thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    reset(&from);
                    return;
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => {
                reset(&to);
                return;
            }
        }
    }
}
