//! A versitygw server for tests, started and stopped through `scripts/s3-server` on a free
//! port of 127.0.0.1, in a directory of its own, stopped by PID when the guard drops (also
//! when the test fails).
//!
//! ```no_run
//! let Some(server) = ebb_backend::s3::test_server::TestServer::start("ebb-test") else {
//!     return Ok(()); // versitygw is not built here: the test said SKIPPED (and failed under CI)
//! };
//! let backend = ebb_backend::S3Backend::open(server.options("prefix/"))?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use super::S3Options;

/// The keys the test server accepts.
pub const ACCESS_KEY_ID: &str = "ebbtest";
/// The secret that goes with [`ACCESS_KEY_ID`].
pub const SECRET_ACCESS_KEY: &str = "ebbtestsecret";

/// A running versitygw with one bucket; stopped on drop.
#[derive(Debug)]
pub struct TestServer {
    dir: PathBuf,
    port: u16,
    bucket: String,
}

impl TestServer {
    /// The versitygw binary `scripts/s3-server` builds and uses.
    pub fn binary() -> PathBuf {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
            });
        cache.join("ebb/versitygw-v1.8.0/bin/versitygw")
    }

    /// The script, from this crate's source tree.
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/s3-server")
    }

    /// Starts a server with `bucket`, or returns `None` after printing `SKIPPED` on stderr when
    /// versitygw is not built (`scripts/setup` builds it). Under `CI` a missing server panics
    /// instead, so the suite cannot pass without it.
    pub fn start(bucket: &str) -> Option<TestServer> {
        if !TestServer::binary().exists() {
            let message = format!(
                "SKIPPED: versitygw is not built ({} is missing; scripts/setup builds it)",
                TestServer::binary().display()
            );
            assert!(std::env::var_os("CI").is_none(), "{message}");
            eprintln!("{message}");
            return None;
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ebb-s3-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test server's directory");
        let mut server = TestServer { dir, port: 0, bucket: bucket.to_owned() };
        server.port =
            server.start_on_free_port().expect("start versitygw through scripts/s3-server");
        Some(server)
    }

    fn start_on_free_port(&self) -> io::Result<u16> {
        let mut last_error = None;
        // The port is free when picked and may be taken before versitygw binds it: try again.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            match self.run_script(&[
                "start",
                &self.dir_text(),
                "--port",
                &port.to_string(),
                "--bucket",
                &self.bucket,
            ]) {
                Ok(()) => return Ok(port),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.expect("tried"))
    }

    fn dir_text(&self) -> String {
        self.dir.display().to_string()
    }

    fn run_script(&self, args: &[&str]) -> io::Result<()> {
        let output = Command::new("bash")
            .arg(TestServer::script())
            .args(args)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
            .output()?;
        if output.status.success() {
            return Ok(());
        }
        Err(io::Error::other(format!(
            "scripts/s3-server {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )))
    }

    /// The server's URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The directory versitygw stores the bucket in (`root/<bucket>/<key>`).
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// Backend options for `prefix` in the bucket, with the test keys and a journal directory
    /// of this server's.
    pub fn options(&self, prefix: &str) -> S3Options {
        let url = format!("s3://{}/{prefix}", self.bucket);
        let mut options = S3Options::new(&url, &self.endpoint()).expect("valid test URL");
        options.credentials = Some((ACCESS_KEY_ID.to_owned(), SECRET_ACCESS_KEY.to_owned()));
        options.state_dir = Some(self.dir.join("state"));
        options
    }

    /// Stops the server (its data stays).
    pub fn stop(&self) -> io::Result<()> {
        self.run_script(&["stop", &self.dir_text()])
    }

    /// Starts it again on the same port, with the same data.
    pub fn restart(&self) -> io::Result<()> {
        self.run_script(&["start", &self.dir_text(), "--port", &self.port.to_string()])
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if self.dir.join("versitygw.pid").exists() {
            let _ = self.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
