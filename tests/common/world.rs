//! A store and leases on one manual clock, for deterministic coordination
//! tests.

use std::sync::Arc;
use std::time::Duration;

use calm::coord::LeaseOptions;
use calm::store::{ManualClock, MemoryStore, MemoryStoreOptions};

/// A store judged by a manual clock, and lease options of `ttl` on the
/// same clock.
pub fn world(ttl: Duration) -> (ManualClock, MemoryStore, LeaseOptions) {
    let clock = ManualClock::new();
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
    let opts = LeaseOptions::new(ttl).with_clock(Arc::new(clock.clone()));
    (clock, store, opts)
}

/// Lets ready tasks (keepers, waiters) run until they block.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}
