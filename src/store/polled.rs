//! The watch loop written once for stores that keep their history where a
//! watch can read it ([`MemoryStore`](super::MemoryStore)'s bounded log,
//! PostgreSQL's `events` table).
//!
//! A watch there needs no buffer of its own that could overflow: it
//! remembers the next revision it has not delivered, reads the history
//! from there when the store says something changed, and hands the events
//! out one by one. Registering for the wake-up *before* reading means a
//! write that lands between the read and the wait still wakes it.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::{KeySpan, StoreError, WatchEvent};

/// A history a [`PolledWatch`] reads.
///
/// The watch holds only a [`Weak`](History::Weak) handle between reads,
/// so it does not keep its store alive: once every handle of the store is
/// dropped, the store wakes its watches (`changed`) and they end with
/// [`StoreError::Closed`].
pub(crate) trait History: Send + Sync + Sized {
    /// A handle that does not keep the store alive.
    type Weak: Send + Sync;

    /// The weak handle of this store.
    fn downgrade(&self) -> Self::Weak;

    /// The store again, if any handle of it is left.
    fn upgrade(weak: &Self::Weak) -> Option<Self>;

    /// Woken whenever the history may have grown, and when the store is
    /// dropped.
    fn changed(&self) -> Arc<Notify>;

    /// Appends to `out` every event at revisions `*next` and later that
    /// `span` selects, in revision order, and moves `*next` past the
    /// revisions read.
    ///
    /// # Errors
    ///
    /// [`StoreError::Compacted`] if `*next` is no longer kept, or a
    /// backend failure.
    fn read(
        &self,
        span: &KeySpan,
        next: &mut u64,
        out: &mut VecDeque<WatchEvent>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// How long to wait for a wake-up before reading again anyway (`None`:
    /// wake-ups are never lost).
    fn poll_interval(&self) -> Option<Duration> {
        None
    }

    /// Whether a failed read is worth repeating (the connection will come
    /// back); the watch then waits and reads again from the same revision,
    /// so nothing is skipped or repeated.
    fn resumes_after(&self, _error: &StoreError) -> bool {
        false
    }
}

/// The longest wait between reads after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A watch over a [`History`].
pub(crate) struct PolledWatch<H: History> {
    /// Where the events come from, while the store lives.
    history: H::Weak,
    /// The store's wake-up.
    changed: Arc<Notify>,
    /// The keys watched.
    span: KeySpan,
    /// The first revision not yet read from the history.
    next: u64,
    /// Events read but not yet returned, in revision order; every one is
    /// below `next`.
    ready: VecDeque<WatchEvent>,
}

impl<H: History> PolledWatch<H> {
    /// A watch of `span` that starts at revision `next`.
    pub(crate) fn new(history: &H, span: KeySpan, next: u64) -> Self {
        Self {
            history: history.downgrade(),
            changed: history.changed(),
            span,
            next,
            ready: VecDeque::new(),
        }
    }

    /// The next event (see [`Watch::next`](super::Watch::next)).
    pub(crate) async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        let mut backoff = Duration::from_millis(20);
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(e);
            }
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before reading, so a write between the read and
            // the wait still wakes us.
            changed.as_mut().enable();
            // The store only while reading: a watch does not keep it alive.
            let Some(history) = H::upgrade(&self.history) else {
                return Err(StoreError::Closed);
            };
            let read = history
                .read(&self.span, &mut self.next, &mut self.ready)
                .await;
            let (poll, resumes) = match &read {
                Err(e) => (None, history.resumes_after(e)),
                Ok(()) => (history.poll_interval(), false),
            };
            drop(history);
            match read {
                Ok(()) => backoff = Duration::from_millis(20),
                Err(_e) if resumes => {
                    crate::trace::warn!(
                        error = &_e as &(dyn std::error::Error + 'static),
                        next = self.next,
                        retry_in = ?backoff,
                        "watch read failed; reading again from the same revision"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
                Err(e) => return Err(e),
            }
            if self.ready.is_empty() {
                match poll {
                    Some(d) => {
                        let _ = tokio::time::timeout(d, changed).await;
                    }
                    None => changed.await,
                }
            }
        }
    }
}
