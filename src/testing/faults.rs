//! Fault injection for stores: pause a "process", count its requests.
//!
//! [`InstrumentedStore`] wraps any [`Store`] the way a process sees it.
//! [`pause`](InstrumentedStore::pause) freezes that process's view: every
//! call, including ones already waiting and its watches, blocks until
//! [`resume`](InstrumentedStore::resume), then proceeds as if nothing
//! happened. That is exactly a garbage-collection pause or a descheduled
//! VM from the store's point of view: the process does not renew its
//! leases, and when it wakes its queued writes go out late. Give each
//! simulated process its own wrapper around one shared store.
//!
//! It also counts requests, to prove that a recipe costs O(1) requests per
//! event (no thundering herd).
//!
//! # Examples
//!
//! ```
//! use calm::store::{MemoryStore, PutOptions, Store};
//! use calm::testing::faults::InstrumentedStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), calm::store::StoreError> {
//! let shared = MemoryStore::new();
//! let process_a = InstrumentedStore::new(shared.clone());
//! let _ = process_a.put(b"k", b"v", PutOptions::new()).await?;
//! assert_eq!(process_a.requests(), 1);
//! process_a.pause();
//! let late = tokio::spawn({
//!     let a = process_a.clone();
//!     async move { a.put(b"k", b"late", PutOptions::new()).await }
//! });
//! tokio::task::yield_now().await;
//! assert_eq!(shared.get(b"k").await?.unwrap().value, b"v"); // not yet
//! process_a.resume();
//! let _ = late.await.unwrap()?;
//! assert_eq!(shared.get(b"k").await?.unwrap().value, b"late");
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::occ::Version;
use crate::store::{
    Expect, KeySpan, KeyValue, LeaseGrant, LeaseId, PutOptions, RangeResult, Store, StoreError,
    Txn, TxnOutcome, Watch, WatchEvent, WriteOutcome,
};

/// A store as one simulated process sees it: pausable, and counting its
/// requests. Clones share the pause switch and the counter.
#[derive(Debug, Clone)]
pub struct InstrumentedStore<S> {
    inner: S,
    /// `true` while paused.
    paused: Arc<watch::Sender<bool>>,
    /// Requests made (each store call counts one; watch events do not).
    requests: Arc<AtomicU64>,
    /// `true` while cut off: calls fail at once with `Unavailable`.
    offline: Arc<std::sync::atomic::AtomicBool>,
    /// Added to every call, in microseconds (0: none).
    latency_micros: Arc<AtomicU64>,
}

impl<S: Store> InstrumentedStore<S> {
    /// Wraps `inner`, running and with no requests counted.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            paused: Arc::new(watch::channel(false).0),
            requests: Arc::new(AtomicU64::new(0)),
            offline: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            latency_micros: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Makes every call take `latency` longer (a Tokio sleep before it is
    /// sent), as a round trip to a remote store would; zero for none.
    pub fn set_latency(&self, latency: Duration) {
        let micros = latency.as_micros().min(u128::from(u64::MAX)) as u64;
        self.latency_micros.store(micros, Ordering::Relaxed);
    }

    /// Cuts the process off from the store (a network partition from its
    /// side): every call fails at once with [`StoreError::Unavailable`],
    /// having sent nothing, until [`reconnect`](Self::reconnect).
    pub fn disconnect(&self) {
        self.offline.store(true, Ordering::Relaxed);
    }

    /// Ends a [`disconnect`](Self::disconnect).
    pub fn reconnect(&self) {
        self.offline.store(false, Ordering::Relaxed);
    }

    /// Freezes the process: calls block until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Lets blocked and new calls proceed.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Whether the process is paused.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Waits while the process is paused (at once if it is not): an await
    /// point of the process's own code that a pause holds, as it holds
    /// the process's store calls.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait_while_paused(&self) {
        gate(&self.paused).await;
    }

    /// Requests made so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Waits while paused, then counts one request; fails it if cut off.
    async fn enter(&self) -> Result<(), StoreError> {
        let latency = self.latency_micros.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        gate(&self.paused).await;
        self.requests.fetch_add(1, Ordering::Relaxed);
        if self.offline.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable {
                source: "disconnected by the fault harness".into(),
            });
        }
        Ok(())
    }
}

/// Waits until `paused` is false.
async fn gate(paused: &watch::Sender<bool>) {
    let mut rx = paused.subscribe();
    // The sender lives as long as `paused` does, so this cannot fail.
    let _ = rx.wait_for(|p| !*p).await;
}

impl<S: Store> Store for InstrumentedStore<S> {
    type Watch = InstrumentedWatch<S::Watch>;

    async fn revision(&self) -> Result<Version, StoreError> {
        self.enter().await?;
        self.inner.revision().await
    }
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        self.enter().await?;
        self.inner.get(key).await
    }
    async fn range(&self, prefix: &[u8], limit: Option<usize>) -> Result<RangeResult, StoreError> {
        self.enter().await?;
        self.inner.range(prefix, limit).await
    }
    async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<WriteOutcome, StoreError> {
        self.enter().await?;
        self.inner.put(key, value, options).await
    }
    async fn delete(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        self.enter().await?;
        self.inner.delete(key, expect).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        self.enter().await?;
        self.inner.txn(txn).await
    }
    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant, StoreError> {
        self.enter().await?;
        self.inner.grant(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.enter().await?;
        self.inner.keep_alive(lease).await
    }
    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.enter().await?;
        self.inner.revoke(lease).await
    }
    async fn time_to_live(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.enter().await?;
        self.inner.time_to_live(lease).await
    }
    async fn compact(&self, revision: Version) -> Result<(), StoreError> {
        self.enter().await?;
        self.inner.compact(revision).await
    }
    async fn watch(&self, span: KeySpan, from: Version) -> Result<Self::Watch, StoreError> {
        self.enter().await?;
        Ok(InstrumentedWatch {
            inner: self.inner.watch(span, from).await?,
            paused: Arc::clone(&self.paused),
        })
    }
}

/// A watch of a paused-able process: events are held while it is paused.
#[derive(Debug)]
pub struct InstrumentedWatch<W> {
    inner: W,
    paused: Arc<watch::Sender<bool>>,
}

impl<W: Watch> Watch for InstrumentedWatch<W> {
    async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        gate(&self.paused).await;
        let event = self.inner.next().await;
        // An event that arrives during a pause is seen after it.
        gate(&self.paused).await;
        event
    }
}
