//! The server's ceiling for `scripts/bench-s3`: one multipart upload of SIZE_MIB from memory,
//! PART_MIB parts, THREADS parts in flight, signed by rusty-s3 and sent by ureq like the S3
//! backend's, no cache and no copy. Prints one JSON line with MB/s (Create to Complete).
//!
//! `cargo run --release -p ebb-backend --example s3_raw_upload -- ENDPOINT BUCKET KEY SIZE_MIB
//! PART_MIB THREADS` with credentials in `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`.
#![expect(clippy::print_stdout, reason = "an example that prints its measurement")]

use std::io::Read;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rusty_s3::actions::{CreateMultipartUpload, S3Action};
use rusty_s3::{Bucket, Credentials, UrlStyle};

const SIGN: Duration = Duration::from_secs(3600);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        eprintln!("usage: s3_raw_upload ENDPOINT BUCKET KEY SIZE_MIB PART_MIB THREADS");
        std::process::exit(2);
    }
    let (key, size_mib, part_mib, threads): (&str, u64, u64, u32) =
        (&args[3], args[4].parse().unwrap(), args[5].parse().unwrap(), args[6].parse().unwrap());
    let bucket =
        Bucket::new(args[1].parse().unwrap(), UrlStyle::Path, args[2].clone(), "us-east-1")
            .expect("bucket");
    let credentials = Credentials::new(
        std::env::var("AWS_ACCESS_KEY_ID").expect("AWS_ACCESS_KEY_ID"),
        std::env::var("AWS_SECRET_ACCESS_KEY").expect("AWS_SECRET_ACCESS_KEY"),
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .max_idle_connections_per_host(256)
        .timeout_per_read(Some(Duration::from_secs(60)))
        .build()
        .into();
    let parts = size_mib.div_ceil(part_mib) as u32;
    let start = Instant::now();
    let url = bucket.create_multipart_upload(Some(&credentials), key).sign(SIGN);
    let body = agent.post(url.as_str()).send(&[][..]).unwrap().body_mut().read_to_string().unwrap();
    let upload = CreateMultipartUpload::parse_response(&body).unwrap();
    let id = upload.upload_id();
    let next = AtomicU32::new(1);
    let mut etags = vec![String::new(); parts as usize];
    let results: Vec<Vec<(u32, String)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (agent, bucket, credentials, next) = (&agent, &bucket, &credentials, &next);
                scope.spawn(move || {
                    let mut done = Vec::new();
                    let mut buf = vec![0u8; (part_mib << 20) as usize];
                    loop {
                        let part = next.fetch_add(1, Ordering::Relaxed);
                        if parts < part {
                            return done;
                        }
                        let len = ((size_mib - u64::from(part - 1) * part_mib).min(part_mib) << 20)
                            as usize;
                        buf.iter_mut().enumerate().for_each(|(i, b)| *b = (part as u8) ^ (i as u8));
                        let url =
                            bucket.upload_part(Some(credentials), key, part as u16, id).sign(SIGN);
                        let response = agent.put(url.as_str()).send(&buf[..len]).unwrap();
                        let etag = response.headers()["etag"].to_str().unwrap().to_owned();
                        done.push((part, etag));
                    }
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().unwrap()).collect()
    });
    for (part, etag) in results.into_iter().flatten() {
        etags[part as usize - 1] = etag;
    }
    let action = bucket.complete_multipart_upload(
        Some(&credentials),
        key,
        id,
        etags.iter().map(String::as_str),
    );
    let url = action.sign(SIGN);
    let mut reply = String::new();
    agent
        .post(url.as_str())
        .send(action.body())
        .unwrap()
        .into_body()
        .into_reader()
        .read_to_string(&mut reply)
        .unwrap();
    assert!(!reply.contains("<Error>"), "{reply}");
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{{\"size_mib\": {size_mib}, \"part_mib\": {part_mib}, \"threads\": {threads}, \"seconds\": {seconds:.3}, \"mb_s\": {:.1}}}",
        (size_mib << 20) as f64 / 1e6 / seconds
    );
}
