//! The experiments of the repository's `experiments/` folder, compiled into the binary, so
//! `ebb reproduce` runs from any directory and after `cargo install` (`--experiments DIR`
//! reads a folder instead). A test checks that this list and the folder hold the same files.

use std::path::Path;

use super::{Experiment, ExperimentError};

/// `(file name, text)` of every experiment file, sorted by file name.
pub const FILES: [(&str, &str); 8] = [
    ("dirtier-fairness.toml", include_str!("../../../../experiments/dirtier-fairness.toml")),
    ("dirty-seconds.toml", include_str!("../../../../experiments/dirty-seconds.toml")),
    ("ioless-throttling.toml", include_str!("../../../../experiments/ioless-throttling.toml")),
    ("nfs-commit-batching.toml", include_str!("../../../../experiments/nfs-commit-batching.toml")),
    ("reclaim-writeback.toml", include_str!("../../../../experiments/reclaim-writeback.toml")),
    ("seeded-bandwidth.toml", include_str!("../../../../experiments/seeded-bandwidth.toml")),
    ("throttle-reorder.toml", include_str!("../../../../experiments/throttle-reorder.toml")),
    ("wbt-read-latency.toml", include_str!("../../../../experiments/wbt-read-latency.toml")),
];

impl Experiment {
    /// Every embedded experiment, in file-name order; errors name `experiments/<file>`.
    pub fn embedded() -> Result<Vec<Experiment>, ExperimentError> {
        FILES
            .iter()
            .map(|(file, text)| Experiment::parse(&Path::new("experiments").join(file), text))
            .collect()
    }
}
