//! `mount -t ebb`, an /etc/fstab line and `umount`, run the way an administrator runs them:
//! mount(8) and umount(8) find `mount.ebb` and `umount.fuse.ebb` (links to the `ebb` under
//! test) in /sbin. So that nothing on the machine changes, the test runs in a mount namespace
//! of its own (`unshare -m`), where an overlay adds the two links to /sbin and a bind mount puts
//! a test fstab on /etc/fstab; both vanish with the namespace.
//!
//! The mounts log to the test's directory (`log=`), not /run/ebb.
//!
//! Needs root, /dev/fuse, unshare(1) and overlayfs: without them it says SKIPPED, and fails
//! under CI. The whole script has a deadline; on failure every `ebb mount` it started is killed
//! by PID.

mod support;
use support::fuse_available;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EBB: &str = env!("CARGO_BIN_EXE_ebb");

/// What the script checks, in order; `$H` is the test's directory, `$B` the backend, `$M` the
/// mountpoint.
const SCRIPT: &str = r#"
set -eu
sbin=$(readlink -f /sbin)
mount -t overlay overlay -o "lowerdir=$H/bin:$sbin" "$sbin"

echo "1. mount -t ebb with knobs: returns mounted; umount returns with everything written"
mount -v -t ebb -o rw,_netdev,memory=64MiB,dirty_ratio=20,dirty_expire_centisecs=360000,log=$H/log \
    "$B" "$M" 2> "$H/mount.err"
cat "$H/mount.err"
pid=$(sed -n 's/.*(ebb pid \([0-9]*\),.*/\1/p' "$H/mount.err")
test -n "$pid"
grep -q " $M .* fuse.ebb " /proc/self/mountinfo
cp "$H/ref" "$M/f"
umount "$M"
cmp "$H/ref" "$B/f"
! kill -0 "$pid" 2> /dev/null
! grep -q " $M " /proc/self/mountinfo

echo "2. bad options: exit 1 and the option named"
status=0; mount -t ebb -o dirty_ration=5 "$B" "$M" 2> "$H/err" || status=$?
cat "$H/err"; test "$status" = 1; grep -q "option dirty_ration" "$H/err"
status=0; mount -t ebb -o memory=1k,log="$H/log" "$B" "$M" 2> "$H/err" || status=$?
cat "$H/err"; test "$status" = 1; grep -q "too small" "$H/err"
! grep -q " $M " /proc/self/mountinfo

echo "3. an fstab line: mount MOUNTPOINT, a busy umount refused and harmless, umount"
echo "$B $M ebb noauto,nofail,_netdev,x-systemd.after=network-online.target,memory=64MiB,dirty_expire_centisecs=360000,log=$H/log 0 0" > "$H/fstab"
mount --bind "$H/fstab" /etc/fstab
mount "$M"
echo hello > "$M/g"
exec 3< "$M/g"
! umount "$M" 2> "$H/err"
cat "$H/err"; grep -q "busy" "$H/err"
echo again >> "$M/g"
exec 3<&-
umount "$M"
test "$(cat "$B/g")" = "$(printf 'hello\nagain')"
! grep -q " $M " /proc/self/mountinfo
echo PASSED
"#;

/// Whether this machine can run the test; if not, says SKIPPED (fails under CI).
fn can_run() -> bool {
    if !fuse_available() {
        return false;
    }
    let root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|status| status.lines().any(|l| l.starts_with("Uid:\t0\t")));
    let overlay = std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|filesystems| filesystems.contains("\toverlay\n"));
    let unshare = Command::new("unshare")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    let missing: Vec<&str> = [(root, "root"), (overlay, "overlayfs"), (unshare, "unshare(1)")]
        .iter()
        .filter(|(there, _)| !there)
        .map(|(_, what)| *what)
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "mount.ebb test: missing {missing:?}, and CI is set");
    eprintln!("SKIPPED: the mount.ebb test needs {missing:?}");
    false
}

/// The `ebb mount` processes whose arguments name a path under `dir`.
fn daemons_under(dir: &Path) -> Vec<u32> {
    let dir = dir.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("\0mount\0") && cmdline.contains(&dir) {
            pids.push(pid);
        }
    }
    pids
}

/// A test directory `$H` with `bin/` (the two helper links), `b/` and `m/`, and `$H/ref`, 8 MiB.
fn helper_dir(prefix: &str) -> tempfile::TempDir {
    let root = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").unwrap();
    let h = root.path();
    for dir in ["bin", "b", "m"] {
        std::fs::create_dir(h.join(dir)).unwrap();
    }
    for link in ["mount.ebb", "umount.fuse.ebb"] {
        std::os::unix::fs::symlink(EBB, h.join("bin").join(link)).unwrap();
    }
    let data: Vec<u8> =
        (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(h.join("ref"), data).unwrap();
    root
}

/// Runs `script` in a mount namespace of its own with `$H` = `h` and `envs`, within 60 s;
/// kills whatever `ebb mount` under `h` is left, and fails unless the script printed PASSED.
fn run_script(script: &str, h: &Path, envs: &[(&str, &std::ffi::OsStr)]) {
    let output = std::fs::File::create(h.join("output")).unwrap();
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("H", h)
        .env("M", h.join("m"))
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever happened, no daemon outlives the test (each exits once unmounted and drained).
    let left = daemons_under(h);
    for pid in &left {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
    let said = std::fs::read_to_string(h.join("output")).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("the script did not end within 60 s:\n{said}"));
    assert!(status.success() && said.contains("PASSED"), "{status}:\n{said}");
    assert!(left.is_empty(), "ebb mount processes left running: {left:?}\n{said}");
}

#[test]
fn mount_t_ebb_and_an_fstab_line_mount_and_umount_drains() {
    if !can_run() {
        return;
    }
    let root = helper_dir("ebb-mount-helper");
    let h = root.path();
    run_script(SCRIPT, h, &[("B", h.join("b").as_os_str())]);
}

/// `mount -t ebb` of a network source, then `umount`: what the umount returned after is in
/// the backend. `$B` is the source, `$O` the extra options.
const NETWORK_SCRIPT: &str = r#"
set -eu
sbin=$(readlink -f /sbin)
mount -t overlay overlay -o "lowerdir=$H/bin:$sbin" "$sbin"
mount -v -t ebb -o "_netdev,memory=64MiB,dirty_expire_centisecs=360000,log=$H/log$O" "$B" "$M"
grep -q " $M .* fuse.ebb " /proc/self/mountinfo
cp "$H/ref" "$M/f"
umount "$M"
! grep -q " $M " /proc/self/mountinfo
echo PASSED
"#;

// The same helper with the two network sources of ebb mount: nfs://HOST/EXPORT against
// nfs-ganesha, s3://BUCKET/PREFIX with endpoint= and the credentials in mount's environment
// against versitygw. Each server is started by the project's script and stopped by PID.
#[test]
fn mount_t_ebb_mounts_nfs_and_s3_sources_and_umount_drains_to_them() {
    use ebb_backend::s3::test_server::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, TestServer};
    use ebb_backend::{Backend, NfsServer, OpenOptions, S3Backend};
    if !can_run() {
        return;
    }
    let root = helper_dir("ebb-mount-helper-net");
    let h = root.path();
    let reference = std::fs::read(h.join("ref")).unwrap();
    if NfsServer::available() {
        let server = NfsServer::start().expect("start nfs-ganesha");
        let url = std::ffi::OsString::from(server.url());
        run_script(NETWORK_SCRIPT, h, &[("B", &url), ("O", "".as_ref())]);
        let written = std::fs::read(server.export_dir().join("f")).unwrap();
        assert!(written == reference, "the export's f differs from what was written");
    } else {
        assert!(std::env::var_os("CI").is_none(), "nfs-ganesha is missing, and CI is set");
        eprintln!("SKIPPED: mount -t ebb nfs://: nfs-ganesha is not installed (scripts/setup)");
    }
    let Some(server) = TestServer::start("ebb-mount-helper") else { return };
    let url = std::ffi::OsString::from(format!("s3://{}/m", server.bucket()));
    let options = std::ffi::OsString::from(format!(",endpoint={}", server.endpoint()));
    run_script(
        NETWORK_SCRIPT,
        h,
        &[
            ("B", &url),
            ("O", &options),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.as_ref()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.as_ref()),
            ("XDG_STATE_HOME", h.join("state").as_os_str()),
        ],
    );
    let mut options = server.options("m/");
    options.state_dir = Some(h.join("observer"));
    let backend = S3Backend::open(options).unwrap();
    let file = backend.open("f", OpenOptions { create: false, truncate: false }).unwrap();
    assert_eq!(file.size().unwrap(), reference.len() as u64);
    let mut written = vec![0; reference.len()];
    for (i, chunk) in written.chunks_mut(1 << 20).enumerate() {
        assert_eq!(file.read_at(chunk, (i as u64) << 20).unwrap(), chunk.len());
    }
    assert!(written == reference, "the object m/f differs from what was written");
    assert_eq!(backend.multipart_uploads().unwrap(), []);
}

/// The value of `key` in the unit file `unit` (its first line `key=...`).
fn unit_value<'a>(unit: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    unit.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("the unit has no {key}="))
}

/// docs/examples/ebb-data.service run as systemd runs it (systemd itself is not PID 1 in every
/// test machine): ExecStart in the background, the unit started once ExecStartPost returns,
/// stopped with KillSignal, which must drain everything to the backend, unmount and exit 0
/// within TimeoutStopSec. `systemd-analyze verify` checks the file where it is installed.
#[test]
fn the_systemd_unit_starts_stops_and_drains() {
    if !fuse_available() {
        return;
    }
    let root = tempfile::Builder::new().prefix("ebb-unit").tempdir_in("/tmp").unwrap();
    let (backend, mnt) = (root.path().join("backend"), root.path().join("mnt"));
    std::fs::create_dir(&backend).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/ebb-data.service");
    let unit = std::fs::read_to_string(&path)
        .unwrap()
        .replace("/usr/local/bin/ebb", EBB)
        .replace("/srv/ebb-data", backend.to_str().unwrap())
        .replace("/data", mnt.to_str().unwrap());
    let installed = root.path().join("ebb-data.service");
    std::fs::write(&installed, &unit).unwrap();
    match Command::new("systemd-analyze").arg("verify").arg(&installed).output() {
        Ok(output) => assert!(
            output.status.success() && output.stderr.is_empty(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(_) => eprintln!("systemd-analyze is missing: the unit's syntax is not checked"),
    }
    assert_eq!(unit_value(&unit, "Type"), "exec");
    assert_eq!(unit_value(&unit, "KillSignal"), "SIGTERM");
    assert_eq!(unit_value(&unit, "KillMode"), "mixed");
    let start: Vec<&str> = unit_value(&unit, "ExecStart").split_whitespace().collect();
    let log = std::fs::File::create(root.path().join("journal")).unwrap();
    let child = Command::new(start[0])
        .args(&start[1..])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut service = Service { child: Some(child), mnt: mnt.clone() };
    let post = Command::new("timeout")
        .args(["60", "sh", "-c", unit_value(&unit, "ExecStartPost")])
        .status()
        .unwrap();
    let journal = || std::fs::read_to_string(root.path().join("journal")).unwrap_or_default();
    assert!(post.success(), "ExecStartPost: {post}\n{}", journal());
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
    std::fs::write(mnt.join("f"), &data).unwrap();
    let pid = service.child.as_ref().unwrap().id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // TimeoutStopSec is 30 minutes; 60 s is plenty for 8 MiB to a local directory.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = service.child.as_mut().unwrap().try_wait().unwrap() {
            service.child = None;
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 60 s of SIGTERM:\n{}", journal());
        std::thread::sleep(Duration::from_millis(20));
    };
    let journal = journal();
    assert!(status.success() && journal.contains("everything written"), "{status}\n{journal}");
    assert!(!support::is_mounted(&mnt), "{journal}");
    assert!(std::fs::read(backend.join("f")).unwrap() == data);
}

/// The service's main process; killed and its mount detached on drop if still there.
struct Service {
    child: Option<std::process::Child>,
    mnt: std::path::PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if support::is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}
