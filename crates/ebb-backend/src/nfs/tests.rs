//! Unit tests of the URL and of the RPC layer against in-process fake servers that answer
//! out of order, with unknown xids, garbage, nothing at all, or by closing the connection.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::rpc::{RECORD_BYTES_MAX, RetryPolicy, RpcClient, Target, read_record};
use super::{NfsOptions, errno};

#[test]
fn url_with_every_part() {
    let options = NfsOptions::parse(
        "nfs://127.0.0.1:20490/srv/export?mountport=20048&timeo=5&retrans=1&nconnect=2&wsize=65536",
    )
    .unwrap();
    assert_eq!(options.host, "127.0.0.1");
    assert_eq!(options.port, Some(20490));
    assert_eq!(options.export, "/srv/export");
    assert_eq!(options.mount_port, Some(20048));
    assert_eq!(options.timeout, Duration::from_millis(500));
    assert_eq!(options.retrans, 1);
    assert_eq!(options.nconnect, 2);
    assert_eq!(options.wsize_bytes, Some(65536));
    assert_eq!(options.rsize_bytes, None);
}

#[test]
fn url_defaults_and_ipv6() {
    let options = NfsOptions::parse("nfs://[::1]/e").unwrap();
    assert_eq!((options.host.as_str(), options.port, options.export.as_str()), ("::1", None, "/e"));
    assert_eq!(
        (options.timeout, options.retrans, options.nconnect),
        (Duration::from_secs(10), 2, 1)
    );
    assert_eq!(NfsOptions::parse("nfs://[::1]:7/e").unwrap().port, Some(7));
}

// Each malformed URL is refused with InvalidInput and a message naming the part at fault.
#[test]
fn bad_urls_name_the_problem() {
    for (url, says) in [
        ("http://host/e", "nfs://"),
        ("nfs://host", "export path"),
        ("nfs:///e", "no host"),
        ("nfs://host:99999/e", "port"),
        ("nfs://host:0/e", "port"),
        ("nfs://host/e?mountport", "no value"),
        ("nfs://host/e?timeo=0", "timeo"),
        ("nfs://host/e?nconnect=99", "nconnect"),
        ("nfs://host/e?wsize=12", "wsize"),
        ("nfs://host/e?sync=1", "unknown option"),
    ] {
        let error = NfsOptions::parse(url).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{url}");
        assert!(error.to_string().contains(says), "{url}: {error}");
    }
}

#[test]
fn record_fragments_are_joined() {
    let mut stream = Vec::new();
    stream.extend_from_slice(&3u32.to_be_bytes());
    stream.extend_from_slice(b"abc");
    stream.extend_from_slice(&0u32.to_be_bytes());
    stream.extend_from_slice(&(0x8000_0002u32).to_be_bytes());
    stream.extend_from_slice(b"de");
    stream.extend_from_slice(&(0x8000_0001u32).to_be_bytes());
    stream.extend_from_slice(b"f");
    let mut reader = &stream[..];
    assert_eq!(read_record(&mut reader, 100).unwrap(), b"abcde");
    assert_eq!(read_record(&mut reader, 100).unwrap(), b"f");
    let error = read_record(&mut reader, 100).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
}

#[test]
fn oversized_or_truncated_records_are_errors() {
    let mut stream = Vec::new();
    stream.extend_from_slice(&(0x8000_0000u32 | 2000).to_be_bytes());
    let error = read_record(&mut &stream[..], 1000).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    assert!(error.to_string().contains("garbled RPC stream"), "{error}");
    stream.extend_from_slice(b"only a few bytes");
    let error = read_record(&mut &stream[..], 4000).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
}

/// A server on a free port whose connections are handled by `serve(connection number,
/// stream)`, each in its own thread.
fn fake_server(serve: impl Fn(usize, TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for (number, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            let serve = Arc::clone(&serve);
            std::thread::spawn(move || serve(number, stream));
        }
    });
    address
}

fn client(address: SocketAddr, timeout: Duration, retrans: u32) -> RpcClient {
    let target = Target {
        address,
        program: 100_003,
        version: 3,
        connections: 1,
        bulk_procedures: &[],
        procedures: 22,
    };
    let policy = RetryPolicy { timeout, retrans, backoff: Duration::from_millis(10) };
    RpcClient::new(target, policy, 0, 0)
}

/// The xid and procedure of a call record.
fn call_of(record: &[u8]) -> (u32, u32) {
    let word =
        |index: usize| u32::from_be_bytes(record[index * 4..index * 4 + 4].try_into().unwrap());
    (word(0), word(5))
}

/// An accepted, successful reply record (with its marker) carrying `results`.
fn reply(xid: u32, results: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for word in [xid, 1, 0, 0, 0, 0] {
        body.extend_from_slice(&word.to_be_bytes());
    }
    body.extend_from_slice(results);
    framed(&body)
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut record = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    record.extend_from_slice(body);
    record
}

// Eight callers share one connection; the server collects all eight calls and answers them
// in reverse order, each reply carrying its call's procedure number. Every caller gets its
// own reply.
#[test]
fn replies_out_of_order_reach_their_callers() {
    let address = fake_server(|_, mut stream| {
        let mut calls = Vec::new();
        while calls.len() < 8 {
            calls.push(call_of(&read_record(&mut stream, 1 << 20).unwrap()));
        }
        for (xid, procedure) in calls.into_iter().rev() {
            stream.write_all(&reply(xid, &procedure.to_be_bytes())).unwrap();
        }
    });
    let client = client(address, Duration::from_secs(30), 0);
    std::thread::scope(|scope| {
        for procedure in 0..8u32 {
            let client = &client;
            scope.spawn(move || {
                let reply = client.call(procedure, "TEST", &[b"args"]).unwrap();
                assert_eq!(reply.results(), procedure.to_be_bytes());
            });
        }
    });
    assert_eq!(client.counters.calls.load(Ordering::Relaxed), 8);
    assert_eq!(client.counters.reconnects.load(Ordering::Relaxed), 0);
}

// A reply nobody waits for is counted and dropped; the real reply still arrives.
#[test]
fn reply_for_an_unknown_xid_is_counted_and_dropped() {
    let address = fake_server(|_, mut stream| {
        while let Ok(record) = read_record(&mut stream, 1 << 20) {
            let (xid, _) = call_of(&record);
            stream.write_all(&reply(xid.wrapping_add(1000), b"late")).unwrap();
            stream.write_all(&framed(b"xx")).unwrap();
            stream.write_all(&reply(xid, b"mine")).unwrap();
        }
    });
    let client = client(address, Duration::from_secs(30), 0);
    let reply = client.call(1, "TEST", &[]).unwrap();
    assert_eq!(reply.results(), b"mine");
    assert_eq!(client.counters.bad_xids.load(Ordering::Relaxed), 2);
}

// Replies with the right xid but a broken header are errors that say so; nothing panics and
// the connection stays usable.
#[test]
fn garbled_replies_are_clear_errors() {
    let address = fake_server(|_, mut stream| {
        let mut count = 0;
        while let Ok(record) = read_record(&mut stream, 1 << 20) {
            let (xid, _) = call_of(&record);
            let mut body = Vec::new();
            let words: &[u32] = match count {
                0 => &[xid, 1, 0, 0],        // cut inside the verifier
                1 => &[xid, 1, 0, 0, 0, 99], // accept_stat 99 does not exist
                2 => &[xid, 1, 7],           // reply_stat 7 does not exist
                3 => &[xid, 1, 1, 1, 1],     // denied: AUTH_ERROR AUTH_BADCRED
                _ => &[xid, 1, 0, 0, 0, 3],  // PROC_UNAVAIL
            };
            for word in words {
                body.extend_from_slice(&word.to_be_bytes());
            }
            stream.write_all(&framed(&body)).unwrap();
            count += 1;
        }
    });
    let client = client(address, Duration::from_secs(30), 0);
    for _ in 0..3 {
        let error = client.call(1, "TEST", &[]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        assert!(error.to_string().contains("garbled RPC reply"), "{error}");
        assert!(error.to_string().contains("TEST"), "{error}");
    }
    let error = client.call(1, "TEST", &[]).unwrap_err();
    assert_eq!(crate::errno_of(&error), Some(errno::EACCES), "{error}");
    let error = client.call(1, "TEST", &[]).unwrap_err();
    assert_eq!(crate::errno_of(&error), Some(errno::EOPNOTSUPP), "{error}");
    assert_eq!(client.counters.reconnects.load(Ordering::Relaxed), 0);
}

// A server that never answers: the call is sent 1 + retrans times, each time on a new
// connection and with the same xid, then fails with ETIMEDOUT.
#[test]
fn silence_is_retransmitted_with_the_same_xid_then_times_out() {
    let (sender, receiver) = std::sync::mpsc::channel();
    let address = fake_server(move |number, mut stream| {
        while let Ok(record) = read_record(&mut stream, 1 << 20) {
            sender.send((number, call_of(&record).0)).unwrap();
        }
    });
    let client = client(address, Duration::from_millis(100), 2);
    let error = client.call(1, "TEST", &[b"args"]).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
    assert!(error.to_string().contains("no reply"), "{error}");
    let sends: Vec<(usize, u32)> = receiver.try_iter().collect();
    assert_eq!(sends.len(), 3, "{sends:?}");
    assert!(sends.iter().all(|(_, xid)| *xid == sends[0].1), "{sends:?}");
    let connections: std::collections::BTreeSet<usize> =
        sends.iter().map(|(number, _)| *number).collect();
    assert_eq!(connections.len(), 3, "each retransmission on a new connection: {sends:?}");
    assert_eq!(client.counters.timeouts.load(Ordering::Relaxed), 3);
    assert_eq!(client.counters.retransmits.load(Ordering::Relaxed), 2);
    assert_eq!(client.counters.reconnects.load(Ordering::Relaxed), 2);
}

// The server drops the first connection after reading the call; the call is sent again on
// a new connection and succeeds.
#[test]
fn a_reset_connection_is_reconnected_once() {
    let address = fake_server(|number, mut stream| {
        let Ok(record) = read_record(&mut stream, 1 << 20) else { return };
        if number == 0 {
            return; // Closes the connection.
        }
        stream.write_all(&reply(call_of(&record).0, b"ok")).unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    });
    let client = client(address, Duration::from_secs(30), 0);
    assert_eq!(client.call(1, "TEST", &[]).unwrap().results(), b"ok");
    assert_eq!(client.counters.retransmits.load(Ordering::Relaxed), 1);
    assert_eq!(client.counters.reconnects.load(Ordering::Relaxed), 1);
}

// A server that drops every connection: one reconnect, then the call fails with ECONNRESET
// instead of trying forever.
#[test]
fn a_server_that_keeps_resetting_fails_the_call() {
    let address = fake_server(|_, mut stream| {
        let _ = read_record(&mut stream, 1 << 20);
    });
    let client = client(address, Duration::from_secs(30), 5);
    let error = client.call(1, "TEST", &[]).unwrap_err();
    assert_eq!(crate::errno_of(&error), Some(errno::ECONNRESET), "{error}");
    assert_eq!(client.counters.retransmits.load(Ordering::Relaxed), 1);
}

// Nobody listens: ECONNREFUSED after one more attempt.
#[test]
fn a_refused_connection_fails_after_one_retry() {
    let address = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let client = client(address, Duration::from_secs(30), 5);
    let error = client.call(1, "TEST", &[]).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    assert_eq!(client.counters.retransmits.load(Ordering::Relaxed), 1);
}

// A record marker announcing more than the limit: the stream cannot be trusted any more, so
// the connection closes and the call fails (after its one reconnect) with that reason.
#[test]
fn an_oversized_reply_closes_the_connection() {
    let address = fake_server(|_, mut stream| {
        if read_record(&mut stream, 1 << 20).is_ok() {
            let marker = 0x8000_0000u32 | (RECORD_BYTES_MAX as u32 + 1);
            stream.write_all(&marker.to_be_bytes()).unwrap();
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest);
        }
    });
    let client = client(address, Duration::from_secs(30), 0);
    let error = client.call(1, "TEST", &[]).unwrap_err();
    assert!(error.to_string().contains("garbled RPC stream"), "{error}");
}

// The real portmapper (rpcbind, started with a server) answers GETPORT: itself on 111, the
// NFS program on some port, and NotFound for a program nobody registered.
#[test]
fn portmapper_lookups_against_rpcbind() {
    if !super::NfsServer::available() {
        assert!(std::env::var_os("CI").is_none(), "nfs-ganesha is not installed");
        eprintln!("SKIPPED portmapper_lookups_against_rpcbind: nfs-ganesha is not installed");
        return;
    }
    let _server = super::NfsServer::start().unwrap();
    let policy =
        RetryPolicy { timeout: Duration::from_secs(10), retrans: 0, backoff: Duration::ZERO };
    let portmapper = super::mount::portmapper("127.0.0.1".parse().unwrap());
    assert_eq!(super::mount::port_of(portmapper, 100_000, 2, policy).unwrap(), 111);
    assert_ne!(super::mount::port_of(portmapper, 100_003, 3, policy).unwrap(), 0);
    let error = super::mount::port_of(portmapper, 100_099, 1, policy).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
    assert!(error.to_string().contains("not registered"), "{error}");
}

// The server goes away while a large call is being sent: the send fails, the connection is
// closed (which takes the write lock the failed send held) and the call fails with the
// connection's errno instead of hanging.
#[test]
fn a_send_into_a_closed_connection_fails_the_call() {
    let address = fake_server(|_, stream| drop(stream));
    let client = Arc::new(client(address, Duration::from_secs(30), 0));
    let (sender, receiver) = std::sync::mpsc::channel();
    let caller = Arc::clone(&client);
    std::thread::spawn(move || {
        let arguments = vec![7u8; 32 << 20];
        let _ = sender.send(caller.call(1, "TEST", &[&arguments]).map(|_| ()));
    });
    let result = receiver.recv_timeout(Duration::from_secs(120)).expect("the call hung");
    let error = result.unwrap_err();
    let errno = crate::errno_of(&error);
    assert!(matches!(errno, Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNREFUSED)), "{error}");
}

// WRITE and COMMIT go on the bulk connection, READ and the metadata on one of their own: a
// READ never queues behind the WRITEs in the bulk connection's stream.
#[test]
fn reads_and_metadata_have_their_own_connection() {
    let (sender, receiver) = std::sync::mpsc::channel();
    let address = fake_server(move |number, mut stream| {
        while let Ok(record) = read_record(&mut stream, 1 << 20) {
            let (xid, procedure) = call_of(&record);
            sender.send((procedure, number)).unwrap();
            stream.write_all(&reply(xid, b"ok")).unwrap();
        }
    });
    let target = Target {
        address,
        program: 100_003,
        version: 3,
        connections: 1,
        bulk_procedures: super::client::BULK_PROCEDURES,
        procedures: 22,
    };
    let policy =
        RetryPolicy { timeout: Duration::from_secs(30), retrans: 0, backoff: Duration::ZERO };
    let client = RpcClient::new(target, policy, 0, 0);
    for procedure in [7, 6, 7, 21, 1, 6] {
        client.call(procedure, "TEST", &[b"args"]).unwrap();
    }
    let on: std::collections::BTreeMap<u32, std::collections::BTreeSet<usize>> =
        receiver.try_iter().fold(Default::default(), |mut on, (procedure, number)| {
            on.entry(procedure).or_default().insert(number);
            on
        });
    let (write, commit, read, getattr) = (&on[&7], &on[&21], &on[&6], &on[&1]);
    assert_eq!(write.len(), 1, "{on:?}");
    assert_eq!(write, commit, "COMMIT beside the WRITEs: {on:?}");
    assert_eq!(read, getattr, "READ beside the metadata: {on:?}");
    assert!(write.is_disjoint(read), "READ apart from the WRITEs: {on:?}");
    assert_eq!(client.counters.reconnects.load(Ordering::Relaxed), 0);
}
