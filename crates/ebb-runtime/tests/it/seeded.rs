//! `initial_write_bandwidth`: where a backend's bandwidth estimate and dirty ratelimit start.
//! With `auto` they start at the speed the backend declares (`Backend::write_bandwidth`) or
//! its settings declare (`BackendConfig::declared_write_bandwidth`), not at the kernel's
//! 100 MB/s; with nothing declared, `auto` is the kernel's start.

use std::sync::Arc;

use ebb_backend::{Backend, BackendFile, Capabilities, MemBackend, OpenOptions};
use ebb_core::{BackendConfig, INIT_BW, PAGE_SIZE};
use ebb_runtime::Builder;

/// A memory backend that declares a write speed (a test double for a backend that knows its
/// rate, such as a provisioned link).
#[derive(Debug)]
struct Declared {
    inner: MemBackend,
    bytes_per_sec: u64,
}

impl Backend for Declared {
    fn open(&self, name: &str, options: OpenOptions) -> std::io::Result<Arc<dyn BackendFile>> {
        self.inner.open(name, options)
    }
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
    fn exists(&self, name: &str) -> std::io::Result<bool> {
        self.inner.exists(name)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn write_bandwidth(&self) -> Option<u64> {
        Some(self.bytes_per_sec)
    }
}

/// The first estimates (write bandwidth, its average, the dirty ratelimit), pages/s, of a
/// cache whose only backend is `backend` with `settings`, `initial_write_bandwidth` set to
/// `initial`.
fn first_estimates(backend: Arc<dyn Backend>, settings: BackendConfig, initial: &str) -> [u64; 3] {
    let ebb = Builder::new()
        .memory(64 << 20)
        .backend_with("b", backend, settings)
        .knob("initial_write_bandwidth", initial)
        .unwrap()
        .build()
        .unwrap();
    let stats = ebb.stats();
    let bdi = &stats.bdi[0];
    [bdi.write_bandwidth, bdi.avg_write_bandwidth, bdi.dirty_ratelimit]
}

const DECLARED: u64 = 30_000_000;

fn declared() -> Arc<dyn Backend> {
    Arc::new(Declared { inner: MemBackend::new(), bytes_per_sec: DECLARED })
}

#[test]
fn auto_starts_from_the_backends_declared_speed() {
    let seeded = DECLARED / PAGE_SIZE;
    let auto = first_estimates(declared(), BackendConfig::new("b"), "auto");
    assert_eq!(auto, [seeded; 3], "auto with a backend declaring 30 MB/s");
    let kernel = first_estimates(declared(), BackendConfig::new("b"), "kernel");
    assert_eq!(kernel, [INIT_BW; 3], "the kernel's start ignores the declaration");
}

#[test]
fn auto_takes_the_settings_declaration_first_and_falls_back_to_the_kernels_start() {
    let mut settings = BackendConfig::new("b");
    settings.declared_write_bandwidth = Some(2_000_000_000);
    let auto = first_estimates(declared(), settings, "auto");
    assert_eq!(auto, [2_000_000_000 / PAGE_SIZE; 3], "the settings' declaration wins");
    let undeclared = first_estimates(Arc::new(MemBackend::new()), BackendConfig::new("b"), "auto");
    assert_eq!(undeclared, [INIT_BW; 3], "auto with nothing declared");
    let explicit = first_estimates(declared(), BackendConfig::new("b"), "6MB");
    assert_eq!(explicit, [6_000_000 / PAGE_SIZE; 3], "an explicit rate");
}
