//! Streams one file into an S3 bucket through ebb (the library, no mount) and prints one JSON
//! line: MB/s including the fsync, the fsync's own time (close to object visible), the peak
//! resident memory, and the backend's request counters. Used by `scripts/bench-s3`.
//!
//! `cargo run --release -p ebb-runtime --example s3_stream -- ENDPOINT s3://BUCKET/PREFIX
//! SIZE_MIB MEMORY_MIB [NAME]` with credentials in `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`.
#![expect(clippy::print_stdout, reason = "an example that prints its measurement")]

use std::time::Instant;

use ebb_backend::{Backend, OpenOptions, S3Backend, S3Options};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: s3_stream ENDPOINT s3://BUCKET/PREFIX SIZE_MIB MEMORY_MIB [NAME]");
        std::process::exit(2);
    }
    let size_mib: usize = args[3].parse().expect("SIZE_MIB");
    let memory_mib: u64 = args[4].parse().expect("MEMORY_MIB");
    let name = args.get(5).map_or("stream", String::as_str);
    let backend = S3Backend::open(S3Options::from_env(&args[2], &args[1])?)?;
    let ebb = ebb_runtime::Builder::new()
        .memory(memory_mib << 20)
        .s3_backend("s3", backend.clone())
        .build()?;
    let file = ebb.open(name, OpenOptions { create: true, truncate: true })?;
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    for index in 0..size_mib {
        buf.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (index as u8) ^ (i as u8) ^ ((i >> 9) as u8));
        file.write_at(&buf, (index << 20) as u64)?;
    }
    let written = start.elapsed();
    file.fsync()?;
    let total = start.elapsed();
    file.close()?;
    let rss_peak_kib = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    let counters: Vec<String> =
        backend.counters().iter().map(|(name, value)| format!("\"{name}\": {value}")).collect();
    println!(
        "{{\"size_mib\": {size_mib}, \"memory_mib\": {memory_mib}, \"mb_s\": {:.1}, \
         \"write_s\": {:.3}, \"fsync_s\": {:.3}, \"rss_peak_mib\": {}, \"counters\": {{{}}}}}",
        (size_mib << 20) as f64 / 1e6 / total.as_secs_f64(),
        written.as_secs_f64(),
        (total - written).as_secs_f64(),
        rss_peak_kib / 1024,
        counters.join(", ")
    );
    Ok(())
}
