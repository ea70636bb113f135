//! FUSE over io_uring (`--fuse-loop`): where the kernel offers it (the `fuse` module's
//! `enable_uring` on; this machine's setting, which the tests leave alone), a mount asked for
//! it takes its requests from the rings and serves them as the classic loop does; where it
//! does not, `uring` is a clear mount error and `auto` falls back to the classic loop.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use ebb_fuse::{DataMode, FuseLoop, Mount, MountConfig};

use crate::{namespace, precondition, read_range};

/// Whether this machine's kernel offers FUSE over io_uring now.
fn kernel_offers_uring() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|value| value.trim() == "Y")
}

/// A mount of `dir` on `mnt` whose requests `fuse_loop` takes.
fn mount(dir: &Path, mnt: &Path, fuse_loop: FuseLoop) -> std::io::Result<Mount> {
    let config = MountConfig {
        mountpoint: mnt.to_path_buf(),
        memory: Some(64 << 20),
        fuse_loop: Some(fuse_loop),
        ..MountConfig::default()
    };
    Mount::start(&config, namespace(DataMode::Ebb, dir))
}

// With io_uring offered: `uring` serves reads (cached, missed, O_DIRECT), writes small and of
// the largest size, fsync, names and directories through the rings, with the bytes the
// backend then holds; `auto` picks the rings too. Without: `uring` fails naming
// `enable_uring`, `auto` mounts on the classic loop.
#[test]
fn requests_go_through_the_rings_where_the_kernel_offers_them() {
    if !precondition(Path::new("/dev/fuse").exists(), "/dev/fuse is missing") {
        return;
    }
    let root = tempfile::Builder::new().prefix("ebb-fuse-uring").tempdir_in("/tmp").unwrap();
    let (dir, mnt) = (root.path().join("dir"), root.path().join("mnt"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    if !kernel_offers_uring() {
        let error =
            mount(&dir, &mnt, FuseLoop::Uring).expect_err("uring without the kernel's offer");
        assert_eq!(error.kind(), std::io::ErrorKind::Unsupported, "{error}");
        assert!(error.to_string().contains("enable_uring"), "{error}");
        let fallback = mount(&dir, &mnt, FuseLoop::Auto).expect("auto mounts anyway");
        assert_eq!(fallback.fuse_loop(), FuseLoop::Classic);
        std::fs::write(mnt.join("f"), b"classic").unwrap();
        fallback.unmount().unwrap();
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"classic");
        eprintln!("the kernel does not offer FUSE over io_uring: checked the fallback only");
        return;
    }
    let m = mount(&dir, &mnt, FuseLoop::Uring).expect("mount with uring");
    assert_eq!(m.fuse_loop(), FuseLoop::Uring);
    let before = m.ring_requests();

    // Written to the backend's directory: the first read misses ebb's cache.
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(dir.join("big"), &data).unwrap();
    let file = File::open(mnt.join("big")).unwrap();
    assert!(read_range(&file, 0, 1 << 20) == data, "a missed read");
    assert!(read_range(&file, 4096, 8192) == data[4096..12288], "a cached read");
    let direct =
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(mnt.join("big")).unwrap();
    let mut raw = vec![0u8; 8192 + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let aligned = &mut raw[start..start + 8192];
    assert_eq!(direct.read_at(aligned, 64 << 10).unwrap(), 8192);
    assert!(*aligned == data[64 << 10..72 << 10], "an O_DIRECT read");

    // Writes of 10 bytes and of the largest request (256 KiB), fsync, a rename, a directory.
    std::fs::create_dir(mnt.join("d")).unwrap();
    let mut out = File::create(mnt.join("d/new")).unwrap();
    out.write_all(b"ten bytes!").unwrap();
    let large: Vec<u8> = (0..(256u32 << 10)).map(|i| (i % 241) as u8).collect();
    out.write_all_at(&large, 4096).unwrap();
    out.sync_all().unwrap();
    drop(out);
    std::fs::rename(mnt.join("d/new"), mnt.join("d/renamed")).unwrap();
    let names: Vec<_> =
        std::fs::read_dir(mnt.join("d")).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(names, ["renamed"]);
    assert_eq!(std::fs::metadata(mnt.join("d/renamed")).unwrap().len(), 4096 + (256 << 10));
    std::fs::remove_file(mnt.join("big")).unwrap();
    assert!(std::fs::metadata(mnt.join("big")).is_err());

    let served = m.ring_requests() - before;
    // Each of the calls above is at least one request (lookups, opens, reads, writes, ...).
    assert!(served >= 20, "only {served} requests came through the rings");
    m.unmount().unwrap();
    let written = std::fs::read(dir.join("d/renamed")).unwrap();
    assert_eq!(&written[..10], b"ten bytes!");
    assert!(written[4096..] == large[..], "the large write reached the backend");

    // `auto` takes the rings where they are offered.
    let auto = mount(&dir, &mnt, FuseLoop::Auto).expect("mount with auto");
    assert_eq!(auto.fuse_loop(), FuseLoop::Uring);
    assert_eq!(std::fs::read(mnt.join("d/renamed")).unwrap(), written);
    assert!(auto.ring_requests() > 0);
    auto.unmount().unwrap();
}
