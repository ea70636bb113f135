//! Network outages through the mount, over NFS (nfs-ganesha) and S3 (versitygw), with the
//! fault proxy ([`proxy`]) between ebb and the server: what applications see while the server
//! refuses, resets or stalls connections, before and after the backend's `retry_timeout_secs`
//! (docs/outages.md). Each scenario is one function run over both backends.
//!
//! The calls run in child processes (coreutils), each with a deadline and killed by PID, so a
//! call that hangs fails the test instead of hanging it, and so a call can be SIGKILLed.

mod proxy;

#[path = "../support/mod.rs"]
mod support;
use support::{fuse_available, is_mounted};

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebb_backend::NfsServer;
use ebb_backend::s3::test_server::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, TestServer};
use ebb_backend::{Backend, OpenOptions, S3Backend};
use proxy::{Mode, Proxy};

const EBB: &str = env!("CARGO_BIN_EXE_ebb");
const MIB: usize = 1 << 20;

/// The clients' per-try timeout, s: a try unanswered this long is evidence of an outage
/// (`ebb_core::outage`), so a stalled server's calls fail at the 3 s deadline of the stall
/// tests (with the defaults, 10 s for NFS and 60 s for S3, at those timeouts).
const TRY_TIMEOUT_SECS: u64 = 2;

/// The error texts of the socket errnos no call may return.
const SOCKET_ERRORS: [&str; 3] = ["Connection refused", "Connection reset", "Connection timed out"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Nfs,
    S3,
}

enum Server {
    Nfs(NfsServer),
    S3(TestServer),
}

/// A server, the fault proxy in front of it and `ebb mount` through the proxy; all stopped by
/// PID on drop.
struct Fixture {
    server: Server,
    proxy: Proxy,
    root: tempfile::TempDir,
    mnt: PathBuf,
    mount: Option<Child>,
}

impl Fixture {
    /// The server, the proxy and the mount with `retry_timeout_secs` = `deadline_secs`; `None`
    /// (SKIPPED) when FUSE or the server is missing here.
    fn start(kind: Kind, name: &str, deadline_secs: u64) -> Option<Fixture> {
        if !fuse_available() {
            return None;
        }
        let server = match kind {
            Kind::Nfs => {
                if !NfsServer::available() {
                    let missing = "nfs-ganesha is not installed (scripts/setup installs it)";
                    assert!(std::env::var_os("CI").is_none(), "{missing}, and CI is set");
                    eprintln!("SKIPPED: {missing}");
                    return None;
                }
                Server::Nfs(NfsServer::start().expect("start nfs-ganesha"))
            }
            Kind::S3 => Server::S3(TestServer::start(&name.replace('_', "-"))?),
        };
        Fixture::start_on(server, deadline_secs)
    }

    fn start_on(server: Server, deadline_secs: u64) -> Option<Fixture> {
        let root = tempfile::Builder::new().prefix("ebb-outage").tempdir_in("/tmp").unwrap();
        let mnt = root.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let server_port = match &server {
            Server::Nfs(nfs) => port_of(nfs.url()),
            Server::S3(s3) => port_of(&s3.endpoint()),
        };
        let proxy = Proxy::start(([127, 0, 0, 1], server_port).into()).unwrap();
        let mut fixture = Fixture { server, proxy, root, mnt, mount: None };
        fixture.mount(deadline_secs);
        Some(fixture)
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }

    /// Starts `ebb mount` through the proxy and waits until it answers. The clients give up
    /// a try unanswered for [`TRY_TIMEOUT_SECS`] (NFS `timeo`, `--s3-timeout`).
    fn mount(&mut self, deadline_secs: u64) {
        let mut command = Command::new(EBB);
        command.arg("mount");
        let proxied = format!("127.0.0.1:{}", self.proxy.port());
        match &self.server {
            Server::Nfs(nfs) => {
                let url =
                    nfs.url().replacen(&format!("127.0.0.1:{}", port_of(nfs.url())), &proxied, 1);
                let joint = if url.contains('?') { '&' } else { '?' };
                let url = format!("{url}{joint}timeo={}", TRY_TIMEOUT_SECS * 10);
                command.args(["--backend", &url]);
            }
            Server::S3(s3) => {
                command
                    .args(["--backend", &format!("s3://{}/m", s3.bucket())])
                    .args(["--endpoint", &format!("http://{proxied}")])
                    .args(["--s3-timeout", &TRY_TIMEOUT_SECS.to_string()])
                    .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
                    .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
                    .env("XDG_STATE_HOME", self.state());
            }
        }
        let child = command
            .args(["--memory", "64MiB", "--retry_timeout_secs", &deadline_secs.to_string()])
            .arg(&self.mnt)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.mount = Some(child);
        let start = Instant::now();
        while ebb_fuse::read_stats(&self.mnt).is_err() {
            if let Some(status) = self.mount.as_mut().unwrap().try_wait().unwrap() {
                let mut text = String::new();
                let _ =
                    self.mount.as_mut().unwrap().stderr.take().unwrap().read_to_string(&mut text);
                panic!("ebb mount exited with {status}: {text}");
            }
            assert!(start.elapsed() < Duration::from_secs(60), "ebb mount did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the mount and detaches it.
    fn kill_mount(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut child) = self.mount.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = child.stderr.take().unwrap().read_to_string(&mut text);
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        text
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// The file `name` as the server holds it (read directly, not through the proxy).
    fn on_server(&self, name: &str) -> Option<Vec<u8>> {
        match &self.server {
            Server::Nfs(nfs) => std::fs::read(nfs.export_dir().join(name)).ok(),
            Server::S3(s3) => {
                // A name in a directory: the object under the directory's prefix.
                let (dir, name) = name.rsplit_once('/').map_or(("", name), |(d, n)| (d, n));
                let prefix = if dir.is_empty() { "m/".to_owned() } else { format!("m/{dir}/") };
                let mut options = s3.options(&prefix);
                options.state_dir = Some(self.root.path().join("observer"));
                let backend = S3Backend::open(options).unwrap();
                let file =
                    backend.open(name, OpenOptions { create: false, truncate: false }).ok()?;
                let size = file.size().unwrap() as usize;
                let mut data = vec![0; size];
                for start in (0..size).step_by(8 * MIB) {
                    let end = (start + 8 * MIB).min(size);
                    file.read_at(&mut data[start..end], start as u64).unwrap();
                }
                Some(data)
            }
        }
    }

    /// `ebb stat` of the mount, as JSON.
    fn stat(&self) -> serde_json::Value {
        let output = run(Command::new(EBB).arg("stat").arg(&self.mnt), Duration::from_secs(10));
        assert!(output.0.is_some_and(|code| code == 0), "ebb stat: {}", output.1);
        serde_json::from_str(&output.2).unwrap()
    }

    /// `ebb stat` once `done` holds of it, or the last one after `limit`.
    fn stat_until(
        &self,
        done: impl Fn(&serde_json::Value) -> bool,
        limit: Duration,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let stat = self.stat();
            if done(&stat) || start.elapsed() > limit {
                return stat;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits (at most `limit`) until the server holds `data` as `name`.
    fn wait_on_server(&self, name: &str, data: &[u8], limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.on_server(name).is_some_and(|stored| stored == data) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.proxy.set(Mode::Pass);
        self.kill_mount();
    }
}

/// The port of a URL `scheme://127.0.0.1:PORT/...`.
fn port_of(url: &str) -> u16 {
    let rest = url.split_once("127.0.0.1:").expect("a URL on 127.0.0.1").1;
    rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(31) ^ (i >> 12) as u8).wrapping_add(seed) | 1)
        .collect()
}

/// Runs `command` to its end or `limit` (then SIGKILL): exit code (None if killed or by
/// signal), stderr, stdout.
fn run(command: &mut Command, limit: Duration) -> (Option<i32>, String, String) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let (mut out, mut err) = (String::new(), String::new());
            let _ = child.stdout.take().unwrap().read_to_string(&mut out);
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            return (status.code(), err, out);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (None, format!("still running after {limit:?}: killed"), String::new());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A call of each kind that can wait on the backend, as a command on the mount (run without
/// a shell, so that killing it kills the call). `old` is a file that exists (written and
/// synced before); `TAG` names what the calls create, remove or rename. The calls that change
/// a directory work in directories of their own: the kernel holds a directory's lock through
/// a create, mkdir, unlink or rename in it, and a process waiting for that lock cannot be
/// killed until its holder's request ends (on any filesystem, the kernel's NFS client
/// included), so calls sharing a directory would measure the kernel's lock, not ebb.
fn calls(mnt: &Path, tag: &str) -> Vec<(String, Vec<String>)> {
    let m = mnt.display();
    [
        ("lookup+getattr", vec!["stat".into(), format!("{m}/old")]),
        // dd, not touch: S3 objects have no settable times (touch's utimensat is EOPNOTSUPP).
        (
            "create",
            vec![
                "dd".into(),
                "if=/dev/null".into(),
                format!("of={m}/new/new-{tag}"),
                "status=none".into(),
            ],
        ),
        // cat blocks in its open; a read on a descriptor opened before: `spawn_descriptor_children`.
        ("open", vec!["cat".into(), format!("{m}/old")]),
        // A size (to the one it has): S3 objects have no settable mode or times.
        ("setattr", vec!["truncate".into(), "-s".into(), "1M".into(), format!("{m}/old")]),
        ("readdir", vec!["ls".into(), format!("{m}/dir")]),
        ("mkdir", vec!["mkdir".into(), format!("{m}/mk/dir-{tag}")]),
        ("unlink", vec!["rm".into(), format!("{m}/rm/gone-{tag}")]),
        (
            "rename",
            vec!["mv".into(), format!("{m}/mv/moved-{tag}"), format!("{m}/mv/moved-{tag}.2")],
        ),
        // A create, then (past the fault) writes, fsync and the closing flush. In a directory
        // of its own: in the root, its create held the root's lock while the stat of `old`
        // waited for it (walk_component), alive 2 s after SIGKILL (once, S3).
        (
            "create+write+fsync+flush",
            [
                "dd",
                &format!("if={}", source(mnt, tag).display()),
                &format!("of={m}/wr/written-{tag}"),
                "bs=64k",
                "conv=fsync",
                "status=none",
            ]
            .map(String::from)
            .to_vec(),
        ),
    ]
    .into_iter()
    .map(|(name, args)| (name.to_owned(), args))
    .collect()
}

/// What the calls' dd writes (off the mount): [`written`].
fn source(mnt: &Path, tag: &str) -> PathBuf {
    mnt.parent().unwrap().join(format!("source-{tag}"))
}

/// The contents of `source`: 4 MiB, patterned so that a lost or misplaced block (a hole
/// reads as zeros) shows.
fn written() -> Vec<u8> {
    pattern(4 * MIB + 11, 11)
}

/// The files the calls expect: `old` (synced), the directories, `rm/gone-TAG` and
/// `mv/moved-TAG`, and dd's source.
fn prepare(fx: &Fixture, tag: &str) {
    std::fs::write(source(&fx.mnt, tag), written()).unwrap();
    for dir in ["dir", "new", "mk", "rm", "mv", "wr"] {
        let _ = std::fs::create_dir(fx.path(dir));
    }
    if !fx.path("old").exists() {
        std::fs::write(fx.path("old"), pattern(MIB, 7)).unwrap();
    }
    std::fs::write(fx.path(&format!("rm/gone-{tag}")), b"gone").unwrap();
    std::fs::write(fx.path(&format!("mv/moved-{tag}")), b"moved").unwrap();
    // Everything on the server, and the kernel's attribute cache (1 s) expired, so that the
    // calls reach the backend.
    let synced = run(Command::new("sync").arg("-f").arg(fx.path("old")), Duration::from_secs(30));
    assert_eq!(synced.0, Some(0), "sync: {}", synced.1);
    std::thread::sleep(Duration::from_millis(1100));
}

/// Spawns every call at once; returns (name, script, child).
fn spawn_calls(calls: Vec<(String, Vec<String>)>) -> Vec<(String, String, Child)> {
    calls
        .into_iter()
        .map(|(name, args)| {
            let child = Command::new(&args[0])
                .args(&args[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (name, args.join(" "), child)
        })
        .collect()
}

/// Waits for every call (each at most `limit` from now, then killed): (name, exit code,
/// stderr). Prints each call's time to its end.
fn finish_calls(
    children: Vec<(String, String, Child)>,
    limit: Duration,
) -> Vec<(String, Option<i32>, String)> {
    let timed = finish_calls_timed(children, limit);
    timed.into_iter().map(|(name, code, err, _)| (name, code, err)).collect()
}

/// [`finish_calls`], with each call's time from now to its end.
fn finish_calls_timed(
    children: Vec<(String, String, Child)>,
    limit: Duration,
) -> Vec<(String, Option<i32>, String, Duration)> {
    let start = Instant::now();
    let mut ended: Vec<Option<(Option<i32>, Duration)>> = vec![None; children.len()];
    let mut children = children;
    while ended.iter().any(Option::is_none) {
        for (index, (_, _, child)) in children.iter_mut().enumerate() {
            if ended[index].is_some() {
                continue;
            }
            if let Some(status) = child.try_wait().unwrap() {
                ended[index] = Some((status.code(), start.elapsed()));
            } else if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                ended[index] = Some((None, start.elapsed()));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    children
        .into_iter()
        .zip(ended)
        .map(|((name, _script, mut child), end)| {
            let (code, took) = end.unwrap();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            eprintln!("{name}: exit {code:?} after {took:?}: {}", err.trim());
            (name, code, err, took)
        })
        .collect()
}

// --- scenarios, each over both backends ---

/// What a descriptor child does (`python3 -c`, arguments: the call and the file): opens the
/// file itself (for `fsync` and `flush`: creates it and writes 1 MiB the cache holds), says
/// `ready`, waits for a line on its standard input, then makes its one call, and exits 3 if
/// the call returned (a call that needs the server must not, while it stalls).
const DESCRIPTOR_CHILD: &str = r#"
import os, sys
call, path = sys.argv[1], sys.argv[2]
def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]
if call in ("read", "getattr (fstat)"):
    fd = os.open(path, os.O_RDONLY)
else:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if call != "write":
        write_all(fd, b"\x5a" * (1 << 20))
print("ready", flush=True)
sys.stdin.readline()
if call == "read":
    os.read(fd, 1 << 20)
elif call == "getattr (fstat)":
    os.fstat(fd)
elif call == "write":
    for _ in range(256):
        write_all(fd, bytes(1 << 20))
elif call == "fsync":
    os.fsync(fd)
elif call == "flush":
    os.close(fd)
sys.exit(3)
"#;

/// The calls on a descriptor (`read`, a throttled `write`, `fstat`, `fsync`, the `flush` of a
/// close), which a call on a path never reaches while the server is away (it blocks in its
/// lookup or open first), each in a child ([`DESCRIPTOR_CHILD`]) that opens its own
/// descriptor while the server answers and makes its call once the server stalls. The test
/// itself holds no descriptor on the mount meanwhile: a child spawned while it held one with
/// unwritten data would close its inherited copy in its `execve` (close-on-exec), a FLUSH
/// that waits for the server, and block there instead of in its call (the first version of
/// this trial did, and saw every child, the reader's included, alive after SIGKILL).
///
/// The mount is restarted first, so `old` is not cached and the read reaches the server; the
/// writer writes more than the cache's dirty limit, so that it is throttled while write-back
/// hangs; `fsync` and `flush` have 1 MiB not yet written back. `None` (SKIPPED) without
/// python3.
fn spawn_descriptor_children(
    fx: &mut Fixture,
    tag: &str,
    deadline_secs: u64,
) -> Option<Vec<(String, Child)>> {
    if Command::new("python3").arg("-c").arg("").status().is_err() {
        let missing = "python3 is not installed (scripts/setup installs it)";
        assert!(std::env::var_os("CI").is_none(), "{missing}, and CI is set");
        eprintln!("SKIPPED: {missing}");
        return None;
    }
    fx.kill_mount();
    fx.mount(deadline_secs);
    let files = [
        ("read", "old".to_owned()),
        ("getattr (fstat)", "old".to_owned()),
        ("write", format!("big-{tag}")),
        ("fsync", format!("fsync-{tag}")),
        ("flush", format!("flush-{tag}")),
    ];
    let mut children = Vec::new();
    for (call, file) in files {
        let child = Command::new("python3")
            .args(["-c", DESCRIPTOR_CHILD, call])
            .arg(fx.path(&file))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        children.push((call.to_owned(), child));
    }
    // Each child's `ready`, read on a thread of its own so that the wait has a deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    for (index, (_, child)) in children.iter_mut().enumerate() {
        let mut stdout = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut line = [0; 6];
            let ready = stdout.read_exact(&mut line).is_ok() && &line == b"ready\n";
            let _ = tx.send((index, ready));
        });
    }
    let start = Instant::now();
    let mut ready = 0;
    while ready < children.len() {
        let left = Duration::from_secs(30).saturating_sub(start.elapsed());
        if let Ok((_, true)) = rx.recv_timeout(left) {
            ready += 1;
            continue;
        }
        for (_, child) in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let errors: Vec<String> = children
            .iter_mut()
            .map(|(call, child)| {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                format!("{call}: {}", err.trim())
            })
            .collect();
        panic!("the descriptor children did not all get ready within 30 s: {errors:?}");
    }
    // The kernel's attribute cache (1 s) expired, so that fstat asks the mount.
    std::thread::sleep(Duration::from_millis(1100));
    Some(children)
}

/// While the server stalls (connections accepted, nothing answered), a process blocked in each
/// kind of call on a path dies within a generous bound of SIGKILL (the issue asks for 1 s; the
/// bound is 2 s on a noisy machine). Every call must still be blocked when it is killed (none
/// answered from a cache), so that each kind is seen waiting on the server.
fn a_process_blocked_in_any_call_dies_at_sigkill_while_the_server_hangs(kind: Kind) {
    let name = format!("{kind:?}-killable").to_lowercase();
    let Some(fx) = Fixture::start(kind, &name, 60) else { return };
    prepare(&fx, "k");
    fx.proxy.set(Mode::Stall);
    let mut children = spawn_calls(calls(&fx.mnt, "k"));
    std::thread::sleep(Duration::from_millis(1500));
    // The stat of `old` and its truncate to the size it has may be answered without the
    // backend (over S3, seen in some runs); every other call needs the server.
    let (slow, not_blocked) = kill_each(&mut children, &["lookup+getattr", "setattr"]);
    fx.proxy.set(Mode::Pass);
    // The survivors end once the server answers (or are killed by finish_calls).
    let _ = finish_calls(children, Duration::from_secs(30));
    assert!(slow.is_empty(), "{kind:?}: still alive 2 s after SIGKILL: {slow:?}");
    assert!(not_blocked.is_empty(), "{kind:?}: not blocked on the server: {not_blocked:?}");
}

/// [`a_process_blocked_in_any_call_dies_at_sigkill_while_the_server_hangs`] for the calls on a
/// descriptor opened before the server stalls ([`spawn_descriptor_children`]).
fn a_process_blocked_on_a_descriptor_dies_at_sigkill_while_the_server_hangs(kind: Kind) {
    let name = format!("{kind:?}-descriptors").to_lowercase();
    let Some(mut fx) = Fixture::start(kind, &name, 60) else { return };
    prepare(&fx, "d");
    let Some(children) = spawn_descriptor_children(&mut fx, "d", 60) else { return };
    fx.proxy.set(Mode::Stall);
    let mut children = go(children);
    std::thread::sleep(Duration::from_millis(1500));
    // fstat may be answered without the server (seen in some runs over both).
    let (slow, not_blocked) = kill_each(&mut children, &["getattr (fstat)"]);
    fx.proxy.set(Mode::Pass);
    let _ = finish_calls(children, Duration::from_secs(30));
    assert!(slow.is_empty(), "{kind:?}: still alive 2 s after SIGKILL: {slow:?}");
    assert!(not_blocked.is_empty(), "{kind:?}: not blocked on the server: {not_blocked:?}");
}

/// Where the process `pid` waits in the kernel (`/proc/PID/stack`, root only), read by a child
/// with a deadline: the read waits for a lock a process in `execve` holds.
fn kernel_stack(pid: u32) -> String {
    let path = format!("/proc/{pid}/stack");
    let (_, err, out) =
        run(Command::new("timeout").args(["2", "cat", &path]), Duration::from_secs(5));
    let frames: Vec<&str> = out.lines().filter_map(|line| line.split(' ').nth(1)).collect();
    if frames.is_empty() { err } else { frames.join(" < ") }
}

/// Tells each descriptor child to make its call.
fn go(children: Vec<(String, Child)>) -> Vec<(String, String, Child)> {
    children
        .into_iter()
        .map(|(call, mut child)| {
            std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
            (call, String::new(), child)
        })
        .collect()
}

/// SIGKILLs each child still running and waits (at most 2 s each) for it to end: the calls
/// still alive 2 s after their SIGKILL, and those that had already ended (except those in
/// `may_end`), with their exit code.
fn kill_each(
    children: &mut [(String, String, Child)],
    may_end: &[&str],
) -> (Vec<String>, Vec<String>) {
    let (mut slow, mut not_blocked) = (Vec::new(), Vec::new());
    for (name, _script, child) in children {
        if let Some(status) = child.try_wait().unwrap() {
            if !may_end.contains(&name.as_str()) {
                not_blocked.push(format!("{name} (exit {:?})", status.code()));
            }
            continue;
        }
        let killed_at = Instant::now();
        child.kill().unwrap(); // SIGKILL
        loop {
            if child.try_wait().unwrap().is_some() {
                eprintln!("{name}: ended {:?} after SIGKILL", killed_at.elapsed());
                break;
            }
            if killed_at.elapsed() > Duration::from_secs(2) {
                slow.push(format!("{name} (kernel stack: {})", kernel_stack(child.id())));
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    (slow, not_blocked)
}

/// How long after the deadline a call may end with EIO, on a noisy machine (the rule says at
/// the deadline; before the backend's silence counted, a stalled server's calls took 7 to
/// 31 s with a 3 s deadline).
const EIO_SLACK: Duration = Duration::from_secs(3);

/// The server refuses connections (or stalls them: accepts and never answers) past the
/// deadline: every call that needs it fails with EIO (or succeeds from the cache) within
/// [`EIO_SLACK`] of the deadline, none with a socket errno, and none hangs.
fn calls_fail_with_eio_after_the_deadline_never_a_socket_errno(kind: Kind, mode: Mode) {
    let name = format!("{kind:?}-eio").to_lowercase();
    let deadline = 3;
    let Some(fx) = Fixture::start(kind, &name, deadline) else { return };
    prepare(&fx, "e");
    fx.proxy.set(mode);
    let children = spawn_calls(calls(&fx.mnt, "e"));
    let results = finish_calls_timed(children, Duration::from_secs(deadline + 20));
    fx.proxy.set(Mode::Pass);
    for (name, code, err, took) in &results {
        assert!(code.is_some(), "{kind:?} {name}: hung past the deadline: {err}");
        assert!(
            *took <= Duration::from_secs(deadline) + EIO_SLACK,
            "{kind:?} {name}: ended {took:?} into a {deadline} s outage"
        );
        assert!(
            !SOCKET_ERRORS.iter().any(|text| err.contains(text)),
            "{kind:?} {name}: a socket errno reached the application: {err}"
        );
        assert!(
            *code == Some(0) || err.contains("Input/output error"),
            "{kind:?} {name}: failed with something else than EIO: {err}"
        );
    }
}

/// Past the deadline while the server stalls, the calls on a descriptor
/// ([`spawn_descriptor_children`]) fail with EIO within [`EIO_SLACK`] of it (`fstat` may be
/// answered: S3 keeps an object's size), the throttled writer included; the data stays held
/// (`ebb stat`), and over NFS the fsync's reaches the server once it answers, with no fsync.
fn descriptor_calls_fail_with_eio_at_the_deadline_while_the_server_stalls(kind: Kind) {
    let name = format!("{kind:?}-fdeio").to_lowercase();
    let deadline = 3;
    let Some(mut fx) = Fixture::start(kind, &name, deadline) else { return };
    prepare(&fx, "f");
    let Some(children) = spawn_descriptor_children(&mut fx, "f", deadline) else { return };
    fx.proxy.set(Mode::Stall);
    let results = finish_calls_timed(go(children), Duration::from_secs(deadline + 20));
    let stat = fx.stat();
    fx.proxy.set(Mode::Pass);
    for (name, code, err, took) in &results {
        assert!(code.is_some(), "{kind:?} {name}: hung past the deadline: {err}");
        assert!(
            !SOCKET_ERRORS.iter().any(|text| err.contains(text)),
            "{kind:?} {name}: a socket errno reached the application: {err}"
        );
        if name == "getattr (fstat)" && *code == Some(3) {
            continue;
        }
        assert!(err.contains("Input/output error"), "{kind:?} {name}: not EIO: {err}");
        assert!(
            *took <= Duration::from_secs(deadline) + EIO_SLACK,
            "{kind:?} {name}: ended {took:?} into a {deadline} s stall"
        );
    }
    let meminfo = &stat["meminfo"];
    let unwritten: u64 =
        ["Dirty", "Writeback", "Held"].iter().map(|f| meminfo[*f].as_u64().unwrap_or(0)).sum();
    assert!(0 < unwritten, "{kind:?}: ebb stat shows nothing unwritten: {meminfo}");
    // Over S3 the uploads the stall held may end only at the client's own timeout (a minute)
    // before the retries write the data: once it took longer than 30 s, not waited for here
    // (`past_the_deadline_the_data_is_held_and_written_when_the_server_returns` shows it).
    if kind == Kind::Nfs {
        let data = vec![0x5a; MIB];
        assert!(
            fx.wait_on_server("fsync-f", &data, Duration::from_secs(30)),
            "{kind:?}: the data of the failed fsync did not reach the server by itself"
        );
    }
}

/// An outage shorter than the deadline: every call started during it waits and succeeds
/// (fsync included), each within 5 s of the server's return (the issue's bound; the rule's
/// next try comes within 0.5 s), and the data is right afterwards.
fn calls_wait_through_an_outage_shorter_than_the_deadline(kind: Kind) {
    let name = format!("{kind:?}-short").to_lowercase();
    let Some(fx) = Fixture::start(kind, &name, 20) else { return };
    prepare(&fx, "s");
    fx.proxy.set(Mode::Refuse);
    let children = spawn_calls(calls(&fx.mnt, "s"));
    std::thread::sleep(Duration::from_secs(2));
    fx.proxy.set(Mode::Reset);
    std::thread::sleep(Duration::from_millis(500));
    fx.proxy.set(Mode::Pass);
    let results = finish_calls_timed(children, Duration::from_secs(30));
    for (name, code, err, took) in &results {
        assert_eq!(*code, Some(0), "{kind:?} {name}: failed through a short outage: {err}");
        assert!(
            *took < Duration::from_secs(5),
            "{kind:?} {name}: went on {took:?} after the server's return"
        );
    }
    assert!(fx.path("new/new-s").exists() && fx.path("mk/dir-s").is_dir());
    assert_eq!(std::fs::read(fx.path("mv/moved-s.2")).unwrap(), b"moved");
    assert!(!fx.path("mv/moved-s").exists() && !fx.path("rm/gone-s").exists());
    assert_eq!(std::fs::metadata(fx.path("old")).unwrap().len(), MIB as u64);
    assert!(std::fs::read(fx.path("wr/written-s")).unwrap() == written(), "{kind:?}: wrong data");
    assert!(fx.wait_on_server("wr/written-s", &written(), Duration::from_secs(20)));
}

/// Opens `name` on the mount before the proxy turns to `mode` (an open needs the server, as
/// on NFS: it would fail past the deadline), then dd writes `data` to it with an fsync through
/// that descriptor (its standard output) while the fault lasts; dd's exit code and stderr.
fn dd_into_a_file_opened_before(
    fx: &Fixture,
    name: &str,
    data: &[u8],
    mode: Mode,
) -> (Option<i32>, String) {
    std::fs::write(fx.path(name), b"").unwrap();
    let out = std::fs::OpenOptions::new().write(true).open(fx.path(name)).unwrap();
    let source = fx.root.path().join(format!("{name}.source"));
    std::fs::write(&source, data).unwrap();
    fx.proxy.set(mode);
    let writer = Command::new("dd")
        .arg(format!("if={}", source.display()))
        .args(["bs=1M", "conv=fsync", "status=none"])
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, code, err) =
        finish_calls(vec![("dd".into(), String::new(), writer)], Duration::from_secs(30)).remove(0);
    (code, err)
}

/// Past the deadline fsync gets EIO, the data stays held (`ebb stat` shows it) and is written
/// once the server returns, without anyone's fsync.
fn past_the_deadline_the_data_is_held_and_written_when_the_server_returns(kind: Kind) {
    let name = format!("{kind:?}-held").to_lowercase();
    let Some(fx) = Fixture::start(kind, &name, 2) else { return };
    let data = pattern(4 * MIB + 5, 3);
    let dd = dd_into_a_file_opened_before(&fx, "held", &data, Mode::Refuse);
    assert_ne!(dd.0, Some(0), "{kind:?}: fsync past the deadline succeeded");
    assert!(dd.1.contains("Input/output error"), "{kind:?}: {}", dd.1);
    let stat = fx.stat();
    let meminfo = &stat["meminfo"];
    // Dirty (waiting for the next retry), Writeback (a retry in flight) or Held.
    let unwritten = ["Dirty", "Writeback", "Held"]
        .iter()
        .map(|field| meminfo[*field].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert!(0 < unwritten, "{kind:?}: ebb stat shows nothing held: {meminfo}");
    // dd's close failed as well: ebb owes the file its commit (S3's completion of the
    // upload), and `ebb stat` says so, per backend and on the file's line.
    let owed = |stat: &serde_json::Value| {
        let files = stat["files"].as_array().cloned().unwrap_or_default();
        let listed = files.iter().filter(|file| file["commit_owed"] == true).count();
        (stat["bdi"][0]["BdiCommitsOwed"].as_u64(), listed)
    };
    let seen = fx.stat_until(|stat| owed(stat) == (Some(1), 1), Duration::from_secs(5));
    assert_eq!(owed(&seen), (Some(1), 1), "{kind:?}: no commit owed in ebb stat: {seen}");
    // The outage goes on past the deadline a while: the retries must go on with it.
    std::thread::sleep(Duration::from_secs(3));
    fx.proxy.set(Mode::Pass);
    assert!(
        fx.wait_on_server("held", &data, Duration::from_secs(20)),
        "{kind:?}: the held data did not reach the server by itself"
    );
    let paid = fx.stat_until(|stat| owed(stat) == (Some(0), 0), Duration::from_secs(5));
    assert_eq!(owed(&paid), (Some(0), 0), "{kind:?}: a commit still owed: {paid}");
}

/// The server's disk fills, then frees: the writer's fsync and close fail with ENOSPC (the
/// server's own answer, not EIO), the data stays held (`ebb stat`: `Held`, and the commit
/// owed), and once space is back the held pages are written and the file completed by
/// themselves, with no fsync from anyone. S3: the fault proxy answers every PUT and
/// UploadPart 507 InsufficientStorage, as versitygw does with its disk full. NFS: ganesha
/// exports a small ext4 filesystem with 1 MiB left (`NFS3ERR_NOSPC`), freed by deleting a
/// file on the server.
fn a_full_server_holds_the_data_and_drains_once_freed(kind: Kind) {
    let name = format!("{kind:?}-full").to_lowercase();
    let (fx, small) = match kind {
        Kind::S3 => (Fixture::start(kind, &name, 30), None),
        Kind::Nfs => match SmallFs::nfs_server_on_a_nearly_full_fs() {
            Some((server, small)) => (Fixture::start_on(Server::Nfs(server), 30), Some(small)),
            None => return,
        },
    };
    let Some(fx) = fx else { return };
    let data = pattern(3 * MIB + 7, 5);
    let full = if kind == Kind::S3 { Mode::Full } else { Mode::Pass };
    let (code, err) = dd_into_a_file_opened_before(&fx, "full", &data, full);
    assert_ne!(code, Some(0), "{kind:?}: fsync on a full server succeeded");
    assert!(err.contains("No space left on device"), "{kind:?}: dd said {err}");
    let held = |stat: &serde_json::Value| {
        let held = stat["meminfo"]["Held"].as_u64().unwrap_or(0);
        (held > 0, stat["bdi"][0]["BdiCommitsOwed"].as_u64())
    };
    let seen = fx.stat_until(|stat| held(stat) == (true, Some(1)), Duration::from_secs(5));
    assert_eq!(held(&seen), (true, Some(1)), "{kind:?}: not held, or no commit owed: {seen}");
    assert!(fx.on_server("full").is_none_or(|stored| stored != data), "{kind:?}: written");
    // Space is freed: the held pages are retried (1 s, doubling) and the file completed.
    match &small {
        Some(small) => small.free(),
        None => fx.proxy.set(Mode::Pass),
    }
    assert!(
        fx.wait_on_server("full", &data, Duration::from_secs(30)),
        "{kind:?}: the held data did not reach the server once space was freed"
    );
    let paid = fx.stat_until(|stat| held(stat) == (false, Some(0)), Duration::from_secs(5));
    assert_eq!(held(&paid), (false, Some(0)), "{kind:?}: {paid}");
    drop(fx);
}

/// A 16 MiB ext4 filesystem (a loop-mounted image) on an NFS server's export, filled by a
/// file written beside the server to 1 MiB of free space; unmounted on drop (after the
/// server, which the fixture holds, has stopped: drop the fixture first). ext4, not tmpfs:
/// ganesha exporting a tmpfs mounted on its export answered the first create `EIO`.
struct SmallFs {
    dir: PathBuf,
    image: PathBuf,
}

impl SmallFs {
    /// ganesha exporting a nearly full 16 MiB ext4, or `None` (SKIPPED) without ganesha,
    /// root or `mkfs.ext4` (under CI, where the tests run as root, a missing piece fails).
    fn nfs_server_on_a_nearly_full_fs() -> Option<(NfsServer, SmallFs)> {
        if !fuse_available() {
            return None;
        }
        let missing = if !NfsServer::available() {
            Some("nfs-ganesha is not installed (scripts/setup installs it)")
        } else if !rustix::process::geteuid().is_root() {
            Some("a loop-mounted filesystem for the NFS server's export needs root")
        } else if Command::new("mkfs.ext4").arg("-V").output().is_err() {
            Some("mkfs.ext4 is not installed (Debian's e2fsprogs)")
        } else {
            None
        };
        if let Some(missing) = missing {
            assert!(std::env::var_os("CI").is_none(), "{missing}, and CI is set");
            eprintln!("SKIPPED: {missing}");
            return None;
        }
        let mut server = NfsServer::start().expect("start nfs-ganesha");
        server.stop().expect("stop nfs-ganesha");
        let dir = server.export_dir();
        let image = dir.with_extension("img");
        std::fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
        let small = SmallFs { dir, image };
        let made = run(
            Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&small.image),
            Duration::from_secs(30),
        );
        assert_eq!(made.0, Some(0), "mkfs.ext4: {}", made.2);
        let mounted = run(
            Command::new("mount").args(["-o", "loop"]).arg(&small.image).arg(&small.dir),
            Duration::from_secs(30),
        );
        assert_eq!(mounted.0, Some(0), "mount -o loop on {}: {}", small.dir.display(), mounted.2);
        let free = rustix::fs::statvfs(&small.dir).unwrap();
        let left = free.f_bavail * free.f_frsize;
        let filler = (left - MIB as u64) as usize;
        std::fs::write(small.filler(), vec![0x11; filler]).unwrap();
        rustix::fs::sync();
        server.restart(NfsServer::fresh_verifier()).expect("restart nfs-ganesha");
        Some((server, small))
    }

    fn filler(&self) -> PathBuf {
        self.dir.join("filler")
    }

    /// Frees the space: deletes the filler on the server's side.
    fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
        rustix::fs::sync();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.image);
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// A writer waiting through an outage longer than the retry backoff's first steps goes on
/// within 5 s of the server's return.
fn writers_resume_within_5_s_of_the_servers_return(kind: Kind) {
    let name = format!("{kind:?}-resume").to_lowercase();
    let Some(fx) = Fixture::start(kind, &name, 30) else { return };
    fx.proxy.set(Mode::Refuse);
    let mut writer = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", fx.path("resume").display()))
        .args(["bs=1M", "count=8", "conv=fsync", "status=none"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    fx.proxy.set(Mode::Pass);
    let back = Instant::now();
    let result = finish_calls(
        vec![("dd".into(), String::new(), writer_take(&mut writer))],
        Duration::from_secs(30),
    );
    let resumed = back.elapsed();
    assert_eq!(result[0].1, Some(0), "{kind:?}: {}", result[0].2);
    assert!(
        resumed < Duration::from_secs(5),
        "{kind:?}: the writer resumed {resumed:?} after the server's return"
    );
}

fn writer_take(child: &mut Child) -> Child {
    std::mem::replace(child, Command::new("true").spawn().unwrap())
}

// --- the tests ---

#[test]
fn nfs_a_process_blocked_in_any_call_dies_at_sigkill_while_the_server_hangs() {
    a_process_blocked_in_any_call_dies_at_sigkill_while_the_server_hangs(Kind::Nfs);
}

#[test]
fn s3_a_process_blocked_in_any_call_dies_at_sigkill_while_the_server_hangs() {
    a_process_blocked_in_any_call_dies_at_sigkill_while_the_server_hangs(Kind::S3);
}

#[test]
fn nfs_a_process_blocked_on_a_descriptor_dies_at_sigkill_while_the_server_hangs() {
    a_process_blocked_on_a_descriptor_dies_at_sigkill_while_the_server_hangs(Kind::Nfs);
}

#[test]
fn s3_a_process_blocked_on_a_descriptor_dies_at_sigkill_while_the_server_hangs() {
    a_process_blocked_on_a_descriptor_dies_at_sigkill_while_the_server_hangs(Kind::S3);
}

#[test]
fn nfs_calls_fail_with_eio_after_the_deadline_never_a_socket_errno() {
    calls_fail_with_eio_after_the_deadline_never_a_socket_errno(Kind::Nfs, Mode::Refuse);
}

#[test]
fn s3_calls_fail_with_eio_after_the_deadline_never_a_socket_errno() {
    calls_fail_with_eio_after_the_deadline_never_a_socket_errno(Kind::S3, Mode::Refuse);
}

#[test]
fn nfs_calls_wait_through_an_outage_shorter_than_the_deadline() {
    calls_wait_through_an_outage_shorter_than_the_deadline(Kind::Nfs);
}

#[test]
fn s3_calls_wait_through_an_outage_shorter_than_the_deadline() {
    calls_wait_through_an_outage_shorter_than_the_deadline(Kind::S3);
}

#[test]
fn nfs_past_the_deadline_the_data_is_held_and_written_when_the_server_returns() {
    past_the_deadline_the_data_is_held_and_written_when_the_server_returns(Kind::Nfs);
}

#[test]
fn s3_a_full_server_holds_the_data_and_drains_once_freed() {
    a_full_server_holds_the_data_and_drains_once_freed(Kind::S3);
}

#[test]
fn nfs_a_full_server_holds_the_data_and_drains_once_freed() {
    a_full_server_holds_the_data_and_drains_once_freed(Kind::Nfs);
}

/// Before the backend's silence was counted (a call waiting unanswered starts the outage),
/// each request was answered EIO only after it had itself waited the deadline plus 0.5 s,
/// requests queued behind another's directory lock waited one such bound per request ahead
/// of them (3 s deadline: EIO after 7 to 31 s), and fsync waited for the clients' own
/// timeouts.
#[test]
fn nfs_calls_fail_with_eio_after_the_deadline_while_the_server_stalls() {
    calls_fail_with_eio_after_the_deadline_never_a_socket_errno(Kind::Nfs, Mode::Stall);
}

#[test]
fn s3_calls_fail_with_eio_after_the_deadline_while_the_server_stalls() {
    calls_fail_with_eio_after_the_deadline_never_a_socket_errno(Kind::S3, Mode::Stall);
}

#[test]
fn nfs_descriptor_calls_fail_with_eio_at_the_deadline_while_the_server_stalls() {
    descriptor_calls_fail_with_eio_at_the_deadline_while_the_server_stalls(Kind::Nfs);
}

#[test]
fn s3_descriptor_calls_fail_with_eio_at_the_deadline_while_the_server_stalls() {
    descriptor_calls_fail_with_eio_at_the_deadline_while_the_server_stalls(Kind::S3);
}

#[test]
fn s3_past_the_deadline_the_data_is_held_and_written_when_the_server_returns() {
    past_the_deadline_the_data_is_held_and_written_when_the_server_returns(Kind::S3);
}

#[test]
fn nfs_writers_resume_within_5_s_of_the_servers_return() {
    writers_resume_within_5_s_of_the_servers_return(Kind::Nfs);
}

#[test]
fn s3_writers_resume_within_5_s_of_the_servers_return() {
    writers_resume_within_5_s_of_the_servers_return(Kind::S3);
}
