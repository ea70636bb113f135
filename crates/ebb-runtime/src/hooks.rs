//! Counters the tests read to check what a call costs (hidden from the documentation).

use std::sync::atomic::Ordering;

use crate::Ebb;

impl Ebb {
    /// Backend files `sync` and `drain` synced so far (for tests that they visit only the
    /// files written since their last sync).
    #[doc(hidden)]
    pub fn inner_files_synced(&self) -> u64 {
        self.shared().files_synced.load(Ordering::Relaxed)
    }

    /// Closed files looked at for leaving the cache so far (for tests that a close costs the
    /// same however many closed files are dirty).
    #[doc(hidden)]
    pub fn inner_closed_looks(&self) -> u64 {
        self.shared().closed_looks.load(Ordering::Relaxed)
    }

    /// Direct-read events waiting for the engine (for tests of the bound).
    #[doc(hidden)]
    pub fn inner_direct_read_queue_len(&self) -> usize {
        self.shared().direct_reads.len()
    }
}
