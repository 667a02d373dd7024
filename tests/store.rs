//! The store conformance suite on `MemoryStore`, one test per check, plus
//! behaviour specific to the embedded store.

use std::time::Duration;

use calm::occ::Version;
use calm::store::{
    KeySpan, ManualClock, MemoryStore, MemoryStoreOptions, PutOptions, Store, StoreError, Watch,
};
use calm::testing::conformance::{self, Fixture, MemoryFixture};

/// One `#[tokio::test]` per conformance check, on a fresh `MemoryStore`.
macro_rules! conformance_tests {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let case = MemoryFixture.case().await;
            conformance::$check(&case).await.unwrap_or_else(|e| panic!("{e}"));
        }
    )*};
}

conformance_tests!(
    put_get_metadata,
    expect_cases,
    revision_monotonic,
    range_prefix_limit,
    txn_atomicity,
    invalid_input,
    lease_expiry,
    lease_revoke,
    watch_from_revision,
    watch_compacted,
    merge_into_concurrent,
    typed_update_contention,
    linearizable,
);

/// `run_all` covers every check listed by `checks`, so a new check cannot
/// be forgotten by backends that run the whole suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_passes() {
    assert_eq!(conformance::checks::<MemoryStore>().len(), 14);
    conformance::run_all(&MemoryFixture).await.unwrap();
}

/// A watcher that falls behind a small history gets `Compacted`, not a
/// silent gap.
#[tokio::test]
async fn slow_watcher_is_told_it_was_compacted() {
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_history(4));
    let mut w = store
        .watch(KeySpan::Prefix(b"k".to_vec()), Version::ZERO)
        .await
        .unwrap();
    for i in 0..10u8 {
        let _ = store.put(b"k", &[i], PutOptions::new()).await.unwrap();
    }
    let err = w.next().await.unwrap_err();
    assert!(matches!(err, StoreError::Compacted { .. }), "{err}");
}

/// Without any Tokio runtime, the store's non-waiting calls complete at
/// their first poll, and expiry by a manual clock is applied lazily.
#[test]
fn usable_without_a_runtime() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
    let lease = poll_once(store.grant(Duration::from_secs(5))).unwrap();
    let _ = poll_once(store.put(b"a", b"1", PutOptions::new().with_lease(lease.id))).unwrap();
    assert!(poll_once(store.get(b"a")).unwrap().is_some());
    clock.advance(Duration::from_secs(6));
    assert!(poll_once(store.get(b"a")).unwrap().is_none());
}

/// Polls a future once with a no-op waker; it must be ready.
fn poll_once<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("MemoryStore call did not complete at its first poll"),
    }
}

/// A lease expiring with nobody calling the store still wakes a watcher:
/// the background reaper deletes the key at the deadline.
#[tokio::test]
async fn reaper_wakes_watchers_on_expiry() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
    let lease = store.grant(Duration::from_secs(3)).await.unwrap();
    let _ = store
        .put(b"l", b"x", PutOptions::new().with_lease(lease.id))
        .await
        .unwrap();
    let mut w = store
        .watch(KeySpan::Key(b"l".to_vec()), Version::ZERO)
        .await
        .unwrap();
    let waiter = tokio::spawn(async move { w.next().await });
    tokio::task::yield_now().await;
    clock.advance(Duration::from_secs(4));
    let e = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(e.kind, calm::store::EventKind::Delete);
}

/// A watch ends with `Closed` once its store's last handle is dropped.
#[tokio::test]
async fn watch_ends_with_its_store() {
    conformance::watch_ends_with_its_store(MemoryStore::new(), b"w/")
        .await
        .unwrap();
}
