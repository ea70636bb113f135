//! `mount.ebb`, a link to `ebb`: the helper mount(8) runs for `mount -t ebb BACKEND MOUNTPOINT -o OPTIONS` and
//! for an `/etc/fstab` line of type `ebb`; linked as `umount.fuse.ebb`, the helper umount(8)
//! runs for an ebb mount (type `fuse.ebb` in /proc/self/mountinfo).
//!
//! Mounting: the options become `ebb mount` arguments (`memory=64MiB` is `--memory 64MiB`, a
//! knob by its kernel name is `--knob NAME=VALUE`, `endpoint=`, `metrics=`, `trace=`,
//! `trace_max=` and `fuse_loop=` are the flags of those names; the standard options mount(8)
//! passes on, `rw`, `defaults`, `_netdev`, `nofail`, `x-*` and the like, are ignored). The helper starts
//! `ebb mount` (this same binary, /proc/self/exe) as a daemon in a session of its own,
//! its output appended to a log file (`log=FILE`, default `/run/ebb/MOUNTPOINT.log` for root,
//! MOUNTPOINT with its slashes as dashes), and returns once the mount answers its stats, as
//! mount(8) expects of a helper: 0 when mounted; 1 for a bad option, naming it; 32 when `ebb
//! mount` exits first or does not come up within [`READY_DEADLINE`], with what it logged.
//!
//! Unmounting: a FUSE mount's umount(2) returns as soon as the kernel lets go of the mount, and
//! the data ebb still holds is written afterwards by the daemon (see `ebb_fuse::run`: "unmounted
//! from outside", then the drain). `umount.fuse.ebb` unmounts, then waits for the daemon to
//! exit and says whether its drain wrote everything (exit 0) or not (32, with the daemon's
//! last lines), so `umount MOUNTPOINT` returns with the data on the backend. With `-l` (lazy)
//! it detaches and returns; the daemon drains when the last file on the mount is closed.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ebb_core::config;

/// How long the helper waits for `ebb mount` to answer (an NFS or S3 backend is reached first).
const READY_DEADLINE: Duration = Duration::from_secs(120);

/// mount(8)'s exit codes, which a helper's are taken as.
const EXIT_USAGE: u8 = 1;
const EXIT_FAILURE: u8 = 32;

/// Options mount(8) and fstab carry that say nothing to ebb: ignored.
const STANDARD_OPTIONS: &[&str] = &[
    "defaults",
    "rw",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "async",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "loud",
    "silent",
];

/// `ebb mount` flags that take their value from an option of the same name.
const FLAG_OPTIONS: &[&str] = &["memory", "endpoint", "metrics", "trace", "trace_max", "fuse_loop"];

/// When this process was started as `mount.ebb` or `umount.fuse.ebb` (a link to `ebb`), does
/// that helper's work and returns its exit code; `None` for `ebb` itself.
pub(crate) fn run_if_helper() -> Option<ExitCode> {
    let mut argv = std::env::args_os();
    let program = argv.next().map(PathBuf::from).unwrap_or_default();
    let name = program.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let args: Vec<OsString> = argv.collect();
    let result = match name.as_str() {
        "mount.ebb" => mount(&args),
        "umount.fuse.ebb" | "umount.ebb" => umount(&args),
        _ => return None,
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("{name}: {message}");
            ExitCode::from(code)
        }
    })
}

/// An exit code and what to say.
type Failure = (u8, String);

fn usage(message: impl Into<String>) -> Failure {
    (EXIT_USAGE, message.into())
}

/// What mount(8) asked for.
#[derive(Debug, Default, PartialEq)]
struct Request {
    source: OsString,
    mountpoint: PathBuf,
    /// `ebb mount`'s arguments after the backend and mountpoint.
    ebb_args: Vec<String>,
    /// `log=FILE`.
    log: Option<PathBuf>,
    /// `-f`: check the options, mount nothing.
    fake: bool,
    /// `-v`.
    verbose: bool,
}

/// Parses `SOURCE MOUNTPOINT [-sfnvrw] [-N NS] [-o OPTIONS] [-t TYPE]`, the helper calling
/// convention of mount(8).
fn parse_mount_args(args: &[OsString]) -> Result<Request, Failure> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let (mut sloppy, mut fake, mut verbose) = (false, false, false);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        if !text.starts_with('-') || text == "-" {
            positional.push(arg.clone());
            continue;
        }
        let mut value_of = |flag: char| {
            args.next()
                .map(|value| value.to_string_lossy().into_owned())
                .ok_or_else(|| usage(format!("-{flag} needs a value")))
        };
        match &*text {
            "-o" => options.push(value_of('o')?),
            "-t" => {
                let kind = value_of('t')?;
                if kind != "ebb" && kind != "fuse.ebb" {
                    return Err(usage(format!("type {kind:?} is not ebb")));
                }
            }
            "-N" => return Err(usage("-N (another mount namespace) is not supported")),
            "-h" | "--help" => {
                return Err(usage(
                    "usage: mount.ebb BACKEND MOUNTPOINT [-sfnv] [-o memory=SIZE,KNOB=VALUE,...]",
                ));
            }
            flags => {
                for flag in flags.chars().skip(1) {
                    match flag {
                        's' => sloppy = true,
                        'f' => fake = true,
                        'v' => verbose = true,
                        'n' | 'w' => {}
                        'r' => return Err(usage("read-only mounts (-r, ro) are not supported")),
                        other => return Err(usage(format!("unknown flag -{other}"))),
                    }
                }
            }
        }
    }
    let [source, mountpoint] = <[OsString; 2]>::try_from(positional).map_err(|got| {
        usage(format!("expected BACKEND MOUNTPOINT, got {} argument(s) {got:?}", got.len()))
    })?;
    let mut request =
        Request { source, mountpoint: mountpoint.into(), fake, verbose, ..Default::default() };
    for list in &options {
        let (args, log) = ebb_arguments(list, sloppy)?;
        request.ebb_args.extend(args);
        request.log = log.or(request.log);
    }
    Ok(request)
}

/// Splits a mount option list at the commas outside double quotes (`zone_bounds_bytes=
/// "16MiB,4GiB"`), dropping the quotes.
fn split_options(list: &str) -> Vec<String> {
    let mut options = vec![String::new()];
    let mut quoted = false;
    for c in list.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => options.push(String::new()),
            c => options.last_mut().into_iter().for_each(|option| option.push(c)),
        }
    }
    options.retain(|option| !option.is_empty());
    options
}

/// The `ebb mount` arguments for the option list `list`, and the log file if it names one.
/// With `sloppy` (`mount -s`), unknown options are ignored instead of refused.
fn ebb_arguments(list: &str, sloppy: bool) -> Result<(Vec<String>, Option<PathBuf>), Failure> {
    let mut args = Vec::new();
    let mut log = None;
    for option in split_options(list) {
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (option.as_str(), None),
        };
        if STANDARD_OPTIONS.contains(&name)
            || name.starts_with("x-")
            || name == "comment"
            || name == "helper"
        {
            continue;
        }
        if name == "ro" {
            return Err(usage("option ro: read-only mounts are not supported"));
        }
        if name == "log" {
            let file = value.filter(|v| !v.is_empty());
            log = Some(file.ok_or_else(|| usage("option log needs a file: log=FILE"))?.into());
            continue;
        }
        if FLAG_OPTIONS.contains(&name) {
            let Some(value) = value.filter(|v| !v.is_empty()) else {
                return Err(usage(format!("option {name} needs a value: {name}=VALUE")));
            };
            if name == "memory" || name == "trace_max" {
                config::parse_size(value)
                    .map_err(|reason| usage(format!("option {name}={value}: {reason}")))?;
            }
            args.push(format!("--{}", name.replace('_', "-")));
            args.push(value.to_owned());
            continue;
        }
        let knob = match config::knob(name) {
            Ok(knob) => knob,
            Err(_) if sloppy => continue,
            Err(error) => {
                return Err(usage(format!(
                    "option {name}: not a mount option of ebb (memory, endpoint, metrics, \
                     trace, trace_max, fuse_loop, log), nor a standard one; as a knob: {error}"
                )));
            }
        };
        // A boolean knob alone turns it on; lists may also be written with colons.
        let value = match value {
            Some(value) => value.replace(':', ","),
            None if knob.kind == config::Kind::Bool => "1".to_owned(),
            None => return Err(usage(format!("option {name} needs a value: {name}=VALUE"))),
        };
        if knob.name == "memory_bytes" {
            return Err(usage("option memory_bytes: write memory=SIZE"));
        }
        let setting = config::parse_setting(&format!("{name}={value}"))
            .map_err(|error| usage(format!("option {error}")))?;
        args.push("--knob".to_owned());
        args.push(setting.to_string());
    }
    Ok((args, log))
}

/// The mount: `ebb mount` started as a daemon, waited for until it answers.
fn mount(args: &[OsString]) -> Result<(), Failure> {
    let request = parse_mount_args(args)?;
    let ebb = std::env::current_exe()
        .map_err(|e| (EXIT_FAILURE, format!("finding the ebb binary: {e}")))?;
    let mut command = Command::new(&ebb);
    command
        .arg("mount")
        .arg("--backend")
        .arg(&request.source)
        .arg(&request.mountpoint)
        .args(&request.ebb_args);
    if request.verbose {
        eprintln!("mount.ebb: {command:?}");
    }
    if request.fake {
        return Ok(());
    }
    let log_path = match &request.log {
        Some(path) => path.clone(),
        None => default_log(&request.mountpoint)?,
    };
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| (EXIT_FAILURE, format!("log file {}: {e}", log_path.display())))?;
    let _ = writeln!(log, "mount.ebb: {command:?}");
    let start = log.seek(SeekFrom::End(0)).unwrap_or(0);
    let stderr = log.try_clone().map_err(|e| (EXIT_FAILURE, e.to_string()))?;
    command.stdin(Stdio::null()).stdout(log).stderr(stderr);
    // SAFETY: setsid is async-signal-safe and touches no memory of this process.
    #[expect(unsafe_code, reason = "pre_exec has no safe form")]
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        });
    }
    let target = request
        .mountpoint
        .canonicalize()
        .map_err(|e| (EXIT_FAILURE, format!("mountpoint {}: {e}", request.mountpoint.display())))?;
    let before = fuse_mounts(&target);
    let mut child =
        command.spawn().map_err(|e| (EXIT_FAILURE, format!("starting {}: {e}", ebb.display())))?;
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let said = log_since(&log_path, start);
            let code = if status.code() == Some(2) { EXIT_USAGE } else { EXIT_FAILURE };
            return Err((code, format!("ebb mount exited ({status}):\n{}", said.trim_end())));
        }
        // Mounted by this child (a mount there that was not before) and answering.
        let new_mount = fuse_mounts(&target).iter().any(|id| !before.contains(id));
        if new_mount && std::fs::metadata(&target).is_ok() {
            if request.verbose {
                eprintln!(
                    "mount.ebb: {} on {} (ebb pid {}, log {})",
                    request.source.to_string_lossy(),
                    target.display(),
                    child.id(),
                    log_path.display()
                );
            }
            return Ok(());
        }
        if started.elapsed() > READY_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            let said = log_since(&log_path, start);
            return Err((
                EXIT_FAILURE,
                format!(
                    "ebb mount did not answer within {} s; killed. It said:\n{}",
                    READY_DEADLINE.as_secs(),
                    said.trim_end()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ids of the FUSE mounts on `target` (absolute) in this process's mount namespace.
fn fuse_mounts(target: &Path) -> Vec<u64> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let target = target.to_string_lossy().replace(' ', "\\040");
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().position(|&field| field == "-")?;
            let fstype = fields.get(separator + 1)?;
            (fields.get(4) == Some(&target.as_str()) && fstype.starts_with("fuse"))
                .then(|| fields.first()?.parse().ok())
                .flatten()
        })
        .collect()
}

/// `/run/ebb/NAME.log` for root, else `$TMPDIR/ebb-UID/NAME.log`; NAME is the mountpoint with
/// its slashes as dashes.
fn default_log(mountpoint: &Path) -> Result<PathBuf, Failure> {
    let uid = rustix::process::geteuid().as_raw();
    let dir = if uid == 0 {
        PathBuf::from("/run/ebb")
    } else {
        std::env::temp_dir().join(format!("ebb-{uid}"))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| (EXIT_FAILURE, format!("log directory {}: {e}", dir.display())))?;
    Ok(dir.join(format!("{}.log", log_name(mountpoint))))
}

/// `/mnt/data` → `mnt-data`; `/` → `root`.
fn log_name(mountpoint: &Path) -> String {
    let text = mountpoint.to_string_lossy();
    let name = text.trim_matches('/').replace('/', "-");
    if name.is_empty() { "root".to_owned() } else { name }
}

/// What the log file holds from byte `start` on.
fn log_since(path: &Path, start: u64) -> String {
    let mut text = Vec::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let _ = file.seek(SeekFrom::Start(start));
        let _ = file.read_to_end(&mut text);
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// `umount.fuse.ebb MOUNTPOINT [-nlfvr] [-t TYPE] [-N NS]`: unmounts and waits for the drain.
fn umount(args: &[OsString]) -> Result<(), Failure> {
    let mut mountpoint = None;
    let (mut lazy, mut force, mut verbose) = (false, false, false);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        match &*text {
            "-t" => {
                args.next();
            }
            "-N" => return Err(usage("-N (another mount namespace) is not supported")),
            flags if flags.starts_with('-') => {
                for flag in flags.chars().skip(1) {
                    match flag {
                        'l' => lazy = true,
                        'f' => force = true,
                        'v' => verbose = true,
                        'n' | 'r' => {}
                        other => return Err(usage(format!("unknown flag -{other}"))),
                    }
                }
            }
            _ if mountpoint.is_none() => mountpoint = Some(PathBuf::from(arg)),
            _ => return Err(usage(format!("unexpected argument {text:?}"))),
        }
    }
    let mountpoint = mountpoint.ok_or_else(|| usage("usage: umount.fuse.ebb MOUNTPOINT [-lfv]"))?;
    let daemon = find_daemon(&mountpoint);
    // The daemon's log, from its stderr, read from here on.
    let log = daemon.and_then(|pid| std::fs::read_link(format!("/proc/{pid}/fd/2")).ok());
    let log = log.filter(|path| path.is_file());
    let start = log.as_ref().and_then(|path| std::fs::metadata(path).ok()).map_or(0, |m| m.len());
    let mut flags = rustix::mount::UnmountFlags::empty();
    if lazy {
        flags |= rustix::mount::UnmountFlags::DETACH;
    }
    if force {
        flags |= rustix::mount::UnmountFlags::FORCE;
    }
    rustix::mount::unmount(&mountpoint, flags).map_err(|errno| {
        let hint = if errno == rustix::io::Errno::BUSY { " (files are open on it)" } else { "" };
        (EXIT_FAILURE, format!("{}: {errno}{hint}", mountpoint.display()))
    })?;
    let Some(pid) = daemon.filter(|_| !lazy) else {
        return Ok(());
    };
    if verbose {
        eprintln!("umount.fuse.ebb: waiting for ebb (pid {pid}) to write what it holds");
    }
    let identity = process_start(pid);
    let mut shown = start;
    while identity.is_some() && process_start(pid) == identity {
        if let Some(path) = log.as_ref().filter(|_| verbose) {
            let text = log_since(path, shown);
            shown += text.len() as u64;
            eprint!("{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some(path) = log else { return Ok(()) };
    if verbose {
        eprint!("{}", log_since(&path, shown));
    }
    let said = log_since(&path, start);
    if said.contains("everything written") {
        return Ok(());
    }
    Err((
        EXIT_FAILURE,
        format!("ebb (pid {pid}) exited without writing everything; it said:\n{}", said.trim_end()),
    ))
}

/// The process serving the ebb mount at `mountpoint`: an `ebb mount` whose arguments name it.
fn find_daemon(mountpoint: &Path) -> Option<u32> {
    let target = mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.to_path_buf());
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&OsStr> = cmdline.split(|&b| b == 0).map(OsStr::from_bytes).collect();
        let is_ebb_mount = args.first().and_then(|a| Path::new(a).file_name())
            == Some(OsStr::new("ebb"))
            && args.get(1) == Some(&OsStr::new("mount"));
        if !is_ebb_mount {
            continue;
        }
        let cwd = std::fs::read_link(entry.path().join("cwd")).unwrap_or_default();
        let names_it = args.iter().skip(2).any(|arg| {
            let path = cwd.join(arg);
            path == target || path.canonicalize().is_ok_and(|p| p == target)
        });
        if names_it {
            return Some(pid);
        }
    }
    None
}

/// The start time of process `pid` (field 22 of /proc/PID/stat), to tell it from a later
/// process given the same number; `None` once it has gone.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); zombies have exited.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Request, Failure> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse_mount_args(&args)
    }

    /// mount(8)'s calling convention: the options become `ebb mount` arguments, the knobs by
    /// their kernel names, the standard options ignored.
    #[test]
    fn options_become_ebb_mount_arguments() {
        let request = parse(&[
            "/srv/data",
            "/mnt/ebb",
            "-s",
            "-n",
            "-o",
            "rw,noauto,_netdev,x-systemd.requires=network.target,memory=64MiB,dirty_ratio=20,\
             strict_limit,zone_bounds_bytes=\"16MiB,1GiB\",metrics=9187,log=/var/log/ebb.log",
            "-t",
            "ebb",
        ])
        .unwrap();
        assert_eq!(request.source, "/srv/data");
        assert_eq!(request.mountpoint, Path::new("/mnt/ebb"));
        assert_eq!(request.log.as_deref(), Some(Path::new("/var/log/ebb.log")));
        assert_eq!(
            request.ebb_args,
            [
                "--memory",
                "64MiB",
                "--knob",
                "dirty_ratio=20",
                "--knob",
                "strict_limit=1",
                "--knob",
                "zone_bounds_bytes=16MiB,1GiB",
                "--metrics",
                "9187",
            ]
        );
        let colons = parse(&["a", "b", "-o", "zone_bounds_bytes=16MiB:1GiB"]).unwrap();
        assert_eq!(colons.ebb_args[1], "zone_bounds_bytes=16MiB,1GiB");
    }

    /// A bad option is a usage error (mount's exit code 1) that names it.
    #[test]
    fn bad_options_are_named() {
        let error = |options: &str| {
            let (code, message) = parse(&["/srv", "/mnt", "-o", options]).unwrap_err();
            assert_eq!(code, EXIT_USAGE, "{message}");
            message
        };
        let message = error("rw,dirty_ration=20");
        assert!(
            message.contains("option dirty_ration") && message.contains("unknown knob"),
            "{message}"
        );
        let message = error("dirty_ratio=150");
        assert!(message.contains("dirty_ratio") && message.contains("0..=100"), "{message}");
        let message = error("memory=lots");
        assert!(message.contains("option memory=lots"), "{message}");
        let message = error("dirty_ratio");
        assert!(message.contains("dirty_ratio needs a value"), "{message}");
        assert!(error("ro").contains("option ro"));
        assert!(error("memory_bytes=1G").contains("memory=SIZE"));
        // mount -s: unknown options are let through.
        let sloppy = parse(&["/srv", "/mnt", "-s", "-o", "dirty_ration=20,dirty_ratio=5"]).unwrap();
        assert_eq!(sloppy.ebb_args, ["--knob", "dirty_ratio=5"]);
        let (code, message) = parse(&["/srv"]).unwrap_err();
        assert_eq!(code, EXIT_USAGE);
        assert!(message.contains("BACKEND MOUNTPOINT"), "{message}");
        let (_, message) = parse(&["/srv", "/mnt", "-t", "ext4"]).unwrap_err();
        assert!(message.contains("ext4"), "{message}");
    }

    #[test]
    fn log_names_follow_the_mountpoint() {
        assert_eq!(log_name(Path::new("/mnt/data")), "mnt-data");
        assert_eq!(log_name(Path::new("/")), "root");
    }
}
