//! Several writers on one thread, through `File::write_at_async` and an executor of a few
//! lines (no async runtime needed): each future waits out its throttle pauses while the
//! others write. `cargo run --release -p ebb-runtime --example async_writers -- DIR [MiB]`.
#![expect(clippy::print_stdout, reason = "an example that prints what it sees")]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

/// Wakes the executor's thread and marks the futures to poll again.
struct Flag(AtomicBool, std::thread::Thread);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
        self.1.unpark();
    }
}

/// Polls every future until all are done, parking the thread while none can go on.
fn run_all<T>(mut futures: Vec<Pin<Box<dyn Future<Output = T> + '_>>>) -> Vec<T> {
    let flag = Arc::new(Flag(AtomicBool::new(true), std::thread::current()));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    while out.iter().any(Option::is_none) {
        if !flag.0.swap(false, Ordering::AcqRel) {
            std::thread::park();
            continue;
        }
        for (f, slot) in futures.iter_mut().zip(out.iter_mut()).filter(|(_, s)| s.is_none()) {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                *slot = Some(v);
            }
        }
    }
    out.into_iter().flatten().collect()
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: async_writers DIR [MiB]");
    let mib: usize = args.next().map_or(256, |s| s.parse().expect("MiB"));
    let ebb = ebb_runtime::Builder::new().memory(64 << 20).directory(&dir)?.build()?;
    let create = ebb_backend::OpenOptions { create: true, truncate: true };
    let files =
        (0..3).map(|i| ebb.open(&format!("async{i}"), create)).collect::<Result<Vec<_>, _>>()?;
    let data = vec![0x5au8; mib << 20];
    let start = std::time::Instant::now();
    let futures = files
        .iter()
        .map(|f| {
            Box::pin(f.write_at_async(&data, 0))
                as Pin<Box<dyn Future<Output = std::io::Result<usize>>>>
        })
        .collect();
    let results = run_all(futures);
    let secs = start.elapsed().as_secs_f64();
    for (i, (f, r)) in files.iter().zip(results).enumerate() {
        let s = f.throttle_stats();
        println!(
            "writer {i}: {} MiB in {secs:.2} s, {} pauses, p50 {} us, max {} us",
            r? >> 20,
            s.pauses,
            s.pause_us_p50,
            s.pause_us_max
        );
    }
    Ok(())
}
