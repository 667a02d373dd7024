//! `coord::Idempotent`: one run per key, the recorded outcome for repeats,
//! takeover of crashed runs with a higher token, and fencing of the old
//! runner, checked by scenarios and by a property test over random
//! interleavings of callers, pauses, crashes and lease expiries.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use calm::coord::{CoordError, FencingToken, Idempotent, LeaseOptions, StoreFence};
use calm::store::{ManualClock, MemoryStore, MemoryStoreOptions, Store};
use calm::testing::faults::InstrumentedStore;
use tokio::sync::oneshot;

/// The claims' time to live in the manual-clock tests.
const TTL: Duration = Duration::from_secs(4);

/// A store judged by a manual clock, and lease options on the same clock.
fn world() -> (ManualClock, MemoryStore, LeaseOptions) {
    let clock = ManualClock::new();
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
    let opts = LeaseOptions::new(TTL).with_clock(Arc::new(clock.clone()));
    (clock, store, opts)
}

/// Lets every ready task on a current-thread runtime run until it blocks.
async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

/// What a runner's fenced write returned when it finally went out.
type Effect = Arc<Mutex<Option<Result<(), CoordError>>>>;

/// A run in its own task whose operation the test steps through.
struct Runner {
    /// The claim's token, sent when the operation starts.
    started: oneshot::Receiver<FencingToken>,
    /// Lets the operation write when taken and dropped.
    go: Option<oneshot::Sender<()>>,
    /// Sent once the fenced write returned.
    wrote: oneshot::Receiver<()>,
    /// Lets the operation return after its write when taken and dropped.
    finish: Option<oneshot::Sender<()>>,
    /// How the fenced write went.
    effect: Effect,
    task: tokio::task::JoinHandle<Result<calm::coord::Completed<u64>, CoordError>>,
}

/// Spawns a run of `key` on `process` whose operation reports its token,
/// waits for `go`, writes `value` to `ledger/<key>` through a `StoreFence`
/// with its token, waits for `finish` and returns `value`.
fn spawn_runner(
    process: &InstrumentedStore<MemoryStore>,
    opts: &LeaseOptions,
    key: &'static str,
    value: u64,
) -> Runner {
    let idem = Idempotent::with_lease_options(process.clone(), "pay/", opts.clone()).expect("ok");
    let fence = StoreFence::new(process.clone(), b"fence/ledger".to_vec()).expect("valid key");
    let (started_tx, started) = oneshot::channel();
    let (go, go_rx) = oneshot::channel::<()>();
    let (wrote_tx, wrote) = oneshot::channel();
    let (finish, finish_rx) = oneshot::channel::<()>();
    let effect: Effect = Arc::default();
    let slot = Arc::clone(&effect);
    let task = tokio::spawn(async move {
        idem.run(key, move |token| async move {
            let _ = started_tx.send(token);
            let _ = go_rx.await;
            let ledger = format!("ledger/{key}");
            let result = fence
                .put(token, ledger.as_bytes(), &value.to_be_bytes())
                .await;
            *slot.lock().expect("not poisoned") = Some(result.map(|_| ()));
            let _ = wrote_tx.send(());
            let _ = finish_rx.await;
            value
        })
        .await
    });
    Runner {
        started,
        go: Some(go),
        wrote,
        finish: Some(finish),
        effect,
        task,
    }
}

impl Runner {
    /// Lets the operation make its write.
    fn write(&mut self) {
        self.go.take();
    }

    /// Lets the operation return once it has written.
    fn finish(&mut self) {
        self.finish.take();
    }

    /// Lets the operation run to the end.
    fn release(&mut self) {
        self.write();
        self.finish();
    }

    /// Whether the fenced write was admitted.
    fn admitted(&self) -> bool {
        matches!(*self.effect.lock().expect("not poisoned"), Some(Ok(())))
    }

    /// Whether the fenced write was refused for `presented` by `highest`.
    fn refused(&self, presented: FencingToken, highest: FencingToken) -> bool {
        matches!(
            &*self.effect.lock().expect("not poisoned"),
            Some(Err(CoordError::Fenced(f))) if f.presented == presented && f.highest == highest
        )
    }
}

/// Regression: a runner whose claim was taken over must not record, even
/// if the taker's own claim has expired in turn by the time it tries (it
/// used to record into the then-empty key with the lower token, although
/// the resource had admitted the taker's higher one), and the outcome that
/// ends up recorded is the one the resource holds.
#[tokio::test]
async fn runner_taken_over_cannot_record_after_the_taker_expired() {
    let (clock, store, opts) = world();
    let a = InstrumentedStore::new(store.clone());
    let mut run_a = spawn_runner(&a, &opts, "p-2", 1);
    let a_token = (&mut run_a.started).await.expect("A started");
    a.pause(); // before A's write
    run_a.release();
    settle().await;
    clock.advance(TTL + Duration::from_secs(1));
    settle().await;

    let b = InstrumentedStore::new(store.clone());
    let mut run_b = spawn_runner(&b, &opts, "p-2", 2);
    let b_token = (&mut run_b.started).await.expect("B took over");
    run_b.write();
    (&mut run_b.wrote).await.expect("B wrote");
    assert!(run_b.admitted());
    b.pause(); // after B's write, before B records
    run_b.finish();
    settle().await;
    clock.advance(TTL + Duration::from_secs(1));
    settle().await;
    assert!(
        store.get(b"pay/p-2").await.expect("get").is_none(),
        "B's claim expired"
    );

    a.resume();
    let a_done = (&mut run_a.task).await.expect("joins");
    assert!(run_a.refused(a_token, b_token), "A's write is fenced");
    let err = a_done.expect_err("A was taken over: it must not record");
    assert!(err.is_lost_grant(), "{err}");
    b.resume();
    let _ = (&mut run_b.task).await.expect("joins");

    // Whoever recorded, the record agrees with what the ledger admitted.
    let c = InstrumentedStore::new(store.clone());
    let mut run_c = spawn_runner(&c, &opts, "p-2", 3);
    run_c.release();
    let repeat = (&mut run_c.task).await.expect("joins").expect("recorded");
    let ledger = store
        .get(b"ledger/p-2")
        .await
        .expect("get")
        .expect("written");
    assert_eq!(ledger.value, repeat.value.to_be_bytes());
    assert_ne!(repeat.token, a_token);
}
