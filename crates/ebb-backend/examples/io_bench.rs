//! Measures the IO patterns of the ebb cache on `O_DIRECT` files, to decide whether
//! `DirBackend` should use blocking `pread`/`pwrite` (called from the runtime's IO threads) or
//! io_uring.
//!
//! Patterns: sequential 1 MiB and 4 MiB writes of a whole file (fdatasync at the end, included
//! in the time) and random 4 KiB reads over it. Blocking runs go through `DirBackend` itself
//! on 1, 2 and 4 threads sharing one sequential stream (each thread takes the next block from
//! an atomic counter, as a flusher feeding a thread pool would); io_uring runs use one thread
//! and a queue depth of 8 or 32. Also measured: the bounce-buffer cost of unaligned user
//! buffers, overwrites of the existing file (no extending writes), and the cost of
//! `FaultyBackend` with nothing armed.
//!
//! Run: `cargo run --release -p ebb-backend --example io_bench -- [DIR] [FILE_MIB]
//! [READ_SECONDS] [WRITE_ROUNDS]` (defaults `/tmp`, 2048, 5, 1). The file is removed at the end.
#![expect(clippy::print_stdout, reason = "a benchmark prints its numbers")]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ebb_backend::{
    AlignedBuf, Backend, BackendFile, DirBackend, FaultyBackend, MemBackend, OpenOptions, PAGE_SIZE,
};
use io_uring::{IoUring, opcode, types};

const MIB: u64 = 1 << 20;
const FILE_NAME: &str = "ebb-io-bench.dat";

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/tmp".to_owned()));
    let file_mib: u64 = args.next().map_or(2048, |text| text.parse().expect("FILE_MIB"));
    let read_seconds: u64 = args.next().map_or(5, |text| text.parse().expect("READ_SECONDS"));
    let rounds: usize = args.next().map_or(1, |text| text.parse().expect("WRITE_ROUNDS"));
    let total = file_mib * MIB;
    let read_time = Duration::from_secs(read_seconds);
    let backend = DirBackend::open(&dir)?;
    println!("dir {} file {file_mib} MiB, O_DIRECT", dir.display());

    println!("\n# sequential writes, whole file, fdatasync included (MB/s = 10^6 bytes/s)");
    // Configurations interleaved, `rounds` times, then the median of each: the device under
    // this VM varies by tens of percent from one run to the next.
    let mut results: Vec<(String, Vec<f64>)> = Vec::new();
    for round in 1..=rounds {
        println!("round {round} of {rounds}");
        for block in [MIB, 4 * MIB] {
            for run in write_runs() {
                let cpu = cpu_seconds();
                let elapsed = match run {
                    WriteRun::Blocking { threads, alignment, overwrite } => {
                        blocking_write(&backend, total, block, threads, alignment, overwrite)?
                    }
                    WriteRun::Uring { depth, overwrite } => {
                        uring_write(&dir.join(FILE_NAME), total, block, depth, overwrite)?
                    }
                };
                let what = format!("{:>2} MiB  {}", block / MIB, run.label());
                let mb_s = report_write(&what, total, elapsed, cpu_seconds() - cpu);
                match results.iter_mut().find(|(label, _)| *label == what) {
                    Some((_, samples)) => samples.push(mb_s),
                    None => results.push((what, vec![mb_s])),
                }
            }
        }
    }
    println!("median of {rounds} round(s):");
    for (what, mut samples) in results {
        samples.sort_by(f64::total_cmp);
        let (low, high) = (samples[0], samples[samples.len() - 1]);
        let median = samples[samples.len() / 2];
        println!("{what:<58} {median:>7.0} MB/s  (min {low:.0}, max {high:.0})");
    }

    println!("\n# random 4 KiB reads over the file, {read_seconds} s each");
    for threads in [1, 2, 4, 8, 32] {
        let cpu = cpu_seconds();
        let count = blocking_reads(&backend, total, threads, read_time)?;
        let what = format!("blocking pread {threads} thread(s)");
        report_reads(&what, count, read_time, cpu_seconds() - cpu);
    }
    for depth in [1, 8, 32] {
        let cpu = cpu_seconds();
        let count = uring_reads(&dir.join(FILE_NAME), total, depth, read_time)?;
        report_reads(&format!("io_uring qd {depth}"), count, read_time, cpu_seconds() - cpu);
    }
    backend.remove(FILE_NAME)?;

    println!("\n# FaultyBackend overhead, 4 KiB writes to MemBackend, 1 thread");
    let plain = mem_write_ns(&MemBackend::new())?;
    let wrapped = mem_write_ns(&FaultyBackend::new(MemBackend::new()))?;
    println!(
        "MemBackend {plain:.0} ns/write, FaultyBackend<MemBackend> (nothing armed) {wrapped:.0} ns/write"
    );
    Ok(())
}

/// One sequential-write configuration.
#[derive(Clone, Copy)]
enum WriteRun {
    /// `overwrite`: write over the existing full-size file instead of a truncated one, so no
    /// write extends the file or allocates blocks.
    Blocking {
        threads: u64,
        alignment: Alignment,
        overwrite: bool,
    },
    Uring {
        depth: usize,
        overwrite: bool,
    },
}

impl WriteRun {
    fn label(self) -> String {
        match self {
            WriteRun::Blocking { threads, alignment: Alignment::Aligned, overwrite } => {
                format!("blocking pwrite {threads} thread(s){}", suffix(overwrite))
            }
            WriteRun::Blocking { threads, alignment: Alignment::Unaligned, overwrite } => {
                format!("blocking {threads} thread(s), unaligned (bounce){}", suffix(overwrite))
            }
            WriteRun::Uring { depth, overwrite } => {
                format!("io_uring qd {depth}{}", suffix(overwrite))
            }
        }
    }
}

fn suffix(overwrite: bool) -> &'static str {
    if overwrite { ", overwrite" } else { "" }
}

/// The configurations of one round; the overwrite runs come last, after the file exists.
fn write_runs() -> [WriteRun; 9] {
    let aligned = Alignment::Aligned;
    let fresh = false;
    [
        WriteRun::Blocking { threads: 1, alignment: aligned, overwrite: fresh },
        WriteRun::Blocking { threads: 2, alignment: aligned, overwrite: fresh },
        WriteRun::Blocking { threads: 4, alignment: aligned, overwrite: fresh },
        WriteRun::Uring { depth: 8, overwrite: fresh },
        WriteRun::Uring { depth: 32, overwrite: fresh },
        WriteRun::Blocking { threads: 1, alignment: Alignment::Unaligned, overwrite: fresh },
        WriteRun::Blocking { threads: 1, alignment: aligned, overwrite: true },
        WriteRun::Uring { depth: 8, overwrite: true },
        WriteRun::Uring { depth: 32, overwrite: true },
    ]
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Alignment {
    Aligned,
    Unaligned,
}

fn report_write(what: &str, total: u64, elapsed: Duration, cpu: f64) -> f64 {
    let seconds = elapsed.as_secs_f64();
    let mb_s = total as f64 / seconds / 1e6;
    println!("{what:<58} {mb_s:>7.0} MB/s  {seconds:>5.2} s  cpu {cpu:>5.2} s");
    mb_s
}

fn report_reads(what: &str, count: u64, elapsed: Duration, cpu: f64) {
    let iops = count as f64 / elapsed.as_secs_f64();
    let cpu_us_per_read = cpu * 1e6 / count as f64;
    println!("4 KiB   {what:<58} {iops:>7.0} IOPS  cpu {cpu_us_per_read:>5.1} us/read");
}

/// CPU time (user + system) of this process so far, all threads, from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name start with the state (field 3);
    // utime and stime are fields 14 and 15, in clock ticks of 1/100 s (USER_HZ).
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|text| text.parse::<f64>().ok());
    ticks(11).zip(ticks(12)).map_or(0.0, |(user, system)| (user + system) / 100.0)
}

/// A buffer of `len` bytes of non-zero data (so nothing can be elided as zeros).
fn data(len: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len as usize);
    for (index, byte) in buf.iter_mut().enumerate() {
        *byte = (index % 251) as u8 + 1;
    }
    buf
}

/// `threads` threads write the file sequentially through `DirBackend`, block by block.
fn blocking_write(
    backend: &DirBackend,
    total: u64,
    block: u64,
    threads: u64,
    alignment: Alignment,
    overwrite: bool,
) -> io::Result<Duration> {
    let file = backend.open(FILE_NAME, OpenOptions { create: true, truncate: !overwrite })?;
    let next = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let file = Arc::clone(&file);
                let next = &next;
                scope.spawn(move || -> io::Result<()> {
                    let buf = data(block + PAGE_SIZE as u64);
                    let bytes = match alignment {
                        Alignment::Aligned => &buf[..block as usize],
                        Alignment::Unaligned => &buf[1..block as usize + 1],
                    };
                    loop {
                        let offset = next.fetch_add(1, Ordering::Relaxed) * block;
                        if total <= offset {
                            return Ok(());
                        }
                        file.write_at(bytes, offset)?;
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| worker.join().expect("writer panicked"))
    })?;
    file.sync()?;
    Ok(start.elapsed())
}

fn open_direct(path: &Path, truncate: bool) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(truncate)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// One thread writes the file sequentially through io_uring with up to `depth` writes in flight.
fn uring_write(
    path: &Path,
    total: u64,
    block: u64,
    depth: usize,
    overwrite: bool,
) -> io::Result<Duration> {
    let file = open_direct(path, !overwrite)?;
    let mut ring = IoUring::new(depth as u32)?;
    let buffers: Vec<AlignedBuf> = (0..depth).map(|_| data(block)).collect();
    let mut free: Vec<usize> = (0..depth).collect();
    let block_count = total / block;
    let (mut next, mut in_flight) = (0, 0);
    let start = Instant::now();
    while next < block_count || 0 < in_flight {
        while next < block_count
            && let Some(slot) = free.pop()
        {
            let entry = opcode::Write::new(
                types::Fd(file.as_raw_fd()),
                buffers[slot].as_ptr(),
                block as u32,
            )
            .offset(next * block)
            .build()
            .user_data(slot as u64);
            #[expect(unsafe_code, reason = "io_uring submission needs the buffer to outlive it")]
            // SAFETY: `buffers[slot]` lives until the end of this function, after every
            // completion has been reaped, and the slot is not reused before its completion.
            let pushed = unsafe { ring.submission().push(&entry) };
            pushed.expect("the queue has `depth` entries and at most `depth` are in flight");
            next += 1;
            in_flight += 1;
        }
        ring.submit_and_wait(1)?;
        let completed: Vec<(u64, i32)> =
            ring.completion().map(|entry| (entry.user_data(), entry.result())).collect();
        for (slot, result) in completed {
            if result < 0 {
                return Err(io::Error::from_raw_os_error(-result));
            }
            assert_eq!(result as u64, block, "short io_uring write");
            free.push(slot as usize);
            in_flight -= 1;
        }
    }
    file.sync_data()?;
    Ok(start.elapsed())
}

/// xorshift64*: a page index below `page_count`.
fn random_page(state: &mut u64, page_count: u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d) % page_count
}

/// `threads` threads read random 4 KiB pages through `DirBackend` for `duration`.
fn blocking_reads(
    backend: &DirBackend,
    total: u64,
    threads: u64,
    duration: Duration,
) -> io::Result<u64> {
    let file = backend.open(FILE_NAME, OpenOptions { create: false, truncate: false })?;
    let page_count = total / PAGE_SIZE as u64;
    let start = Instant::now();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..threads)
            .map(|thread| {
                let file = Arc::clone(&file);
                scope.spawn(move || -> io::Result<u64> {
                    let mut buf = AlignedBuf::zeroed(PAGE_SIZE);
                    let mut state = 0x9e37_79b9_7f4a_7c15 ^ (thread + 1);
                    let mut count = 0;
                    while start.elapsed() < duration {
                        for _ in 0..32 {
                            let page = random_page(&mut state, page_count);
                            file.read_at(&mut buf, page * PAGE_SIZE as u64)?;
                            count += 1;
                        }
                    }
                    Ok(count)
                })
            })
            .collect();
        readers.into_iter().map(|reader| reader.join().expect("reader panicked")).sum()
    })
}

/// One thread reads random 4 KiB pages through io_uring, `depth` in flight, for `duration`.
fn uring_reads(path: &Path, total: u64, depth: usize, duration: Duration) -> io::Result<u64> {
    let file = open_direct(path, false)?;
    let mut ring = IoUring::new(depth as u32)?;
    let mut buffers: Vec<AlignedBuf> = (0..depth).map(|_| AlignedBuf::zeroed(PAGE_SIZE)).collect();
    let mut free: Vec<usize> = (0..depth).collect();
    let page_count = total / PAGE_SIZE as u64;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let (mut count, mut in_flight) = (0, 0);
    let start = Instant::now();
    loop {
        let running = start.elapsed() < duration;
        while running && let Some(slot) = free.pop() {
            let page = random_page(&mut state, page_count);
            let entry = opcode::Read::new(
                types::Fd(file.as_raw_fd()),
                buffers[slot].as_mut_ptr(),
                PAGE_SIZE as u32,
            )
            .offset(page * PAGE_SIZE as u64)
            .build()
            .user_data(slot as u64);
            #[expect(unsafe_code, reason = "io_uring submission needs the buffer to outlive it")]
            // SAFETY: as in `uring_write`: the buffer outlives its completion and is not
            // touched until then.
            let pushed = unsafe { ring.submission().push(&entry) };
            pushed.expect("the queue has `depth` entries and at most `depth` are in flight");
            in_flight += 1;
        }
        if in_flight == 0 {
            return Ok(count);
        }
        ring.submit_and_wait(1)?;
        let completed: Vec<(u64, i32)> =
            ring.completion().map(|entry| (entry.user_data(), entry.result())).collect();
        for (slot, result) in completed {
            if result < 0 {
                return Err(io::Error::from_raw_os_error(-result));
            }
            free.push(slot as usize);
            in_flight -= 1;
            count += 1;
        }
    }
}

/// Mean time of a 4 KiB write to a memory file, to see what a wrapper adds.
fn mem_write_ns(backend: &dyn Backend) -> io::Result<f64> {
    let file: Arc<dyn BackendFile> =
        backend.open("f", OpenOptions { create: true, truncate: true })?;
    let buf = data(PAGE_SIZE as u64);
    let count = 2_000_000;
    let start = Instant::now();
    for index in 0..count {
        file.write_at(&buf, (index % 256) * PAGE_SIZE as u64)?;
    }
    Ok(start.elapsed().as_nanos() as f64 / count as f64)
}
