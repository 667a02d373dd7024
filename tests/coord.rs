//! Fencing, leases, election and locks on `MemoryStore` with a manual
//! clock: the seed scenario, a paused holder, the herd, and a property test
//! over random pauses, expiries and crashes.

use std::sync::Arc;
use std::time::Duration;

use calm::coord::{
    CoordError, Election, Fence, FencingToken, Lease, LeaseLoss, LeaseOptions, LeaseState, Lock,
    StoreFence,
};
use calm::store::{KeySpan, ManualClock, MemoryStore, MemoryStoreOptions, PutOptions, Store};
use calm::testing::faults::InstrumentedStore;
use proptest::prelude::*;

const TTL: Duration = Duration::from_secs(10);

fn store_and_clock() -> (MemoryStore, ManualClock) {
    let (clock, store, _) = crate::common::world::world(TTL);
    (store, clock)
}

fn options(clock: &ManualClock) -> LeaseOptions {
    LeaseOptions::new(TTL).with_clock(Arc::new(clock.clone()))
}

use crate::common::world::settle;

/// The seed scenario: A gets a token and pauses, its lease expires, B gets
/// a higher token and writes; A wakes, writes with its old token, and the
/// resource refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenario() {
    let (store, clock) = store_and_clock();
    // 32 unrelated writes, so A's token is 33 as in the classic telling.
    for i in 0..32u8 {
        let _ = store.put(b"noise", &[i], PutOptions::new()).await.unwrap();
    }
    let a_view = InstrumentedStore::new(store.clone());
    let lock_a = Lock::new(a_view.clone(), "locks/ledger/").unwrap();
    let lease_a = Lease::grant_with(a_view.clone(), options(&clock))
        .await
        .unwrap();
    let a = lock_a.lock(&lease_a).await.unwrap();
    assert_eq!(a.token(), FencingToken::new(33));

    a_view.pause();
    clock.advance(TTL + Duration::from_secs(1));
    settle().await;

    let lock_b = Lock::new(store.clone(), "locks/ledger/").unwrap();
    let lease_b = Lease::grant_with(store.clone(), options(&clock))
        .await
        .unwrap();
    let b = lock_b.lock(&lease_b).await.unwrap();
    assert!(b.token() > a.token(), "{} vs {}", b.token(), a.token());
    let fence = StoreFence::new(store.clone(), b"ledger/fence".to_vec()).unwrap();
    fence
        .put(b.token(), b"ledger/balance", b"100 (B)")
        .await
        .unwrap();

    a_view.resume();
    let a_fence = StoreFence::new(a_view.clone(), b"ledger/fence".to_vec()).unwrap();
    let late = a_fence.put(a.token(), b"ledger/balance", b"0 (A)").await;
    match late {
        Err(CoordError::Fenced(f)) => assert_eq!((f.presented, f.highest), (a.token(), b.token())),
        other => panic!("stale write was not fenced: {other:?}"),
    }
    assert_eq!(
        store.get(b"ledger/balance").await.unwrap().unwrap().value,
        b"100 (B)"
    );
    assert!(a.verify().await.is_err(), "A still verifies as holder");
    assert!(!lease_a.is_alive() || lease_a.check().is_err() || a.verify().await.is_err());
}

/// A holder paused (not cancelled) past its TTL loses the lock; every write
/// it makes afterwards is refused by the fence, and none is visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_is_fenced_out() {
    let (store, clock) = store_and_clock();
    let a_view = InstrumentedStore::new(store.clone());
    let election_a = Election::new(a_view.clone(), "svc/leader/").unwrap();
    let lease_a = Lease::grant_with(a_view.clone(), options(&clock))
        .await
        .unwrap();
    let term_a = election_a.campaign(&lease_a, b"a").await.unwrap();
    let fence_a = StoreFence::new(a_view.clone(), b"svc/fence".to_vec()).unwrap();
    fence_a
        .put(term_a.token(), b"svc/state", b"a:1")
        .await
        .unwrap();

    // A pauses with writes queued behind the pause.
    a_view.pause();
    let queued: Vec<_> = (2..6)
        .map(|i| {
            let f = fence_a.clone();
            let t = term_a.token();
            tokio::spawn(async move { f.put(t, b"svc/state", format!("a:{i}").as_bytes()).await })
        })
        .collect();
    clock.advance(TTL * 2);
    settle().await;

    let election_b = Election::new(store.clone(), "svc/leader/").unwrap();
    let lease_b = Lease::grant_with(store.clone(), options(&clock))
        .await
        .unwrap();
    let term_b = election_b.campaign(&lease_b, b"b").await.unwrap();
    assert!(term_b.token() > term_a.token());
    let fence_b = StoreFence::new(store.clone(), b"svc/fence".to_vec()).unwrap();
    fence_b
        .put(term_b.token(), b"svc/state", b"b:1")
        .await
        .unwrap();

    a_view.resume();
    for q in queued {
        let r = q.await.unwrap();
        assert!(
            matches!(r, Err(CoordError::Fenced(_))),
            "queued stale write: {r:?}"
        );
    }
    for i in 6..9 {
        let r = fence_a
            .put(term_a.token(), b"svc/state", format!("a:{i}").as_bytes())
            .await;
        assert!(
            matches!(r, Err(CoordError::Fenced(_))),
            "late stale write: {r:?}"
        );
    }
    assert_eq!(
        store.get(b"svc/state").await.unwrap().unwrap().value,
        b"b:1"
    );
    assert!(matches!(
        term_a.verify().await,
        Err(CoordError::NotLeader { .. })
    ));
    assert!(lease_a.lost().await != calm::coord::LeaseLoss::Revoked);
}

/// Fifty waiters: each release wakes exactly one of them, and a hand-off
/// costs a constant number of requests, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    const WAITERS: usize = 50;
    let (store, clock) = store_and_clock();
    let holder_view = InstrumentedStore::new(store.clone());
    let holder_lease = Lease::grant_with(holder_view.clone(), options(&clock))
        .await
        .unwrap();
    let lock = Lock::new(holder_view, "herd/").unwrap();
    let mut holder = lock.lock(&holder_lease).await.unwrap();

    let views: Vec<InstrumentedStore<MemoryStore>> = (0..WAITERS)
        .map(|_| InstrumentedStore::new(store.clone()))
        .collect();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut leases = Vec::new();
    for (i, view) in views.iter().enumerate() {
        let lease = Lease::grant_with(view.clone(), options(&clock))
            .await
            .unwrap();
        let lock = Lock::new(view.clone(), "herd/").unwrap();
        let tx = done_tx.clone();
        let lease = Arc::new(lease);
        leases.push(Arc::clone(&lease));
        tokio::spawn(async move {
            let guard = lock.lock(&lease).await.unwrap();
            tx.send((i, guard)).unwrap();
        });
        // Enqueue in order, so the line is waiter 0, 1, 2, ...
        while store.range(b"herd/", None).await.unwrap().kvs.len() < i + 2 {
            tokio::task::yield_now().await;
        }
    }
    let counts = |views: &[InstrumentedStore<MemoryStore>]| {
        views.iter().map(|v| v.requests()).collect::<Vec<_>>()
    };
    // Wait until every waiter is parked on its watch (counts stop moving).
    let mut before = counts(&views);
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = counts(&views);
        if now == before {
            break;
        }
        before = now;
    }
    // The releasing holder's own requests (its unlock) are not the herd's.
    let mut releasing: Option<usize> = None;
    for handoff in 0..5 {
        holder.unlock().await.unwrap();
        let (i, guard) = tokio::time::timeout(Duration::from_secs(5), done_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(i, handoff, "the lock went out of line order");
        settle().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let after = counts(&views);
        let others = |w: &usize| Some(*w) != releasing;
        let woken: Vec<usize> = (0..WAITERS)
            .filter(others)
            .filter(|&w| after[w] != before[w])
            .collect();
        let requests: u64 = (0..WAITERS)
            .filter(others)
            .map(|w| after[w] - before[w])
            .sum();
        assert_eq!(woken, vec![i], "hand-off {handoff} woke {woken:?}");
        // The woken waiter reads the line once and verifies once.
        assert!(requests <= 3, "hand-off {handoff} cost {requests} requests");
        before = after;
        holder = guard;
        releasing = Some(i);
    }
    drop(leases);
}

/// Bad input gets typed errors and leaves the store unchanged.
#[tokio::test]
async fn bad_input_is_refused_without_change() {
    let (store, clock) = store_and_clock();
    let rev = store.revision().await.unwrap();
    assert!(matches!(
        Election::new(store.clone(), ""),
        Err(CoordError::InvalidName { .. })
    ));
    assert!(matches!(
        Lock::new(store.clone(), vec![b'x'; 2000]),
        Err(CoordError::InvalidName { .. })
    ));
    assert!(matches!(
        Lease::grant_with(store.clone(), LeaseOptions::new(Duration::ZERO)).await,
        Err(CoordError::InvalidTtl { .. })
    ));
    assert!(matches!(
        Lease::grant_with(
            store.clone(),
            LeaseOptions::new(Duration::from_secs(365 * 24 * 3600))
        )
        .await,
        Err(CoordError::InvalidTtl { .. })
    ));
    assert!(StoreFence::new(store.clone(), Vec::new()).is_err());
    assert_eq!(store.revision().await.unwrap(), rev, "a refused call wrote");

    // A lost lease cannot campaign, and the failed campaign leaves no key.
    let lease = Lease::grant_with(store.clone(), options(&clock))
        .await
        .unwrap();
    clock.advance(TTL * 2);
    let _ = lease.lost().await;
    let election = Election::new(store.clone(), "e/").unwrap();
    let r = election.campaign(&lease, b"x").await;
    assert!(matches!(r, Err(CoordError::LeaseLost { .. })), "{r:?}");
    assert!(store.range(b"e/", None).await.unwrap().kvs.is_empty());

    // A stale token is refused by both fences, naming both tokens.
    let fence = Fence::new();
    fence.check(FencingToken::new(9)).unwrap();
    fence.check(FencingToken::new(9)).unwrap(); // equal: the same holder again
    let err = fence.check(FencingToken::new(8)).unwrap_err();
    assert_eq!((err.presented.get(), err.highest.get()), (8, 9));
    let sf = StoreFence::new(store.clone(), b"f".to_vec()).unwrap();
    sf.put(FencingToken::new(9), b"data", b"9").await.unwrap();
    let rev = store.revision().await.unwrap();
    assert!(sf.put(FencingToken::new(8), b"data", b"8").await.is_err());
    assert_eq!(
        store.revision().await.unwrap(),
        rev,
        "a fenced write changed the store"
    );
    assert_eq!(store.get(b"data").await.unwrap().unwrap().value, b"9");
}

/// `StoreFence::write_if`: written when the token is admissible and the
/// compares hold (on an absent and on an existing fence key); `None` and
/// nothing written when a compare fails, whether the fence key exists or
/// not; `Fenced` for a lower token even when the compares hold.
#[tokio::test]
async fn store_fence_write_if_tells_its_outcomes_apart() {
    use calm::store::{Compare, CompareOp, TxnOp};
    let store = MemoryStore::new();
    let sf = StoreFence::new(store.clone(), b"wi/fence".to_vec()).unwrap();
    let absent = || {
        vec![Compare::create_revision(
            b"wi/k",
            CompareOp::Equal,
            calm::occ::Version::ZERO,
        )]
    };
    let put = |v: &[u8]| vec![TxnOp::put(b"wi/k", v)];

    // A failing compare before the fence key exists: nothing written.
    let _ = store.put(b"wi/k", b"0", PutOptions::new()).await.unwrap();
    let rev = store.revision().await.unwrap();
    assert_eq!(
        sf.write_if(FencingToken::new(5), absent(), put(b"1"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.revision().await.unwrap(), rev);
    assert!(store.get(b"wi/fence").await.unwrap().is_none());

    // Compares holding: written, and the fence raised.
    let _ = store
        .delete(b"wi/k", calm::store::Expect::Any)
        .await
        .unwrap();
    assert!(
        sf.write_if(FencingToken::new(5), absent(), put(b"1"))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(store.get(b"wi/k").await.unwrap().unwrap().value, b"1");

    // A failing compare with the fence key present: nothing written.
    let rev = store.revision().await.unwrap();
    assert_eq!(
        sf.write_if(FencingToken::new(6), absent(), put(b"2"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.revision().await.unwrap(), rev);

    // A lower token is fenced whether or not the compares hold.
    let holds = vec![Compare::create_revision(
        b"wi/nothing",
        CompareOp::Equal,
        calm::occ::Version::ZERO,
    )];
    let err = sf
        .write_if(FencingToken::new(4), holds, put(b"3"))
        .await
        .unwrap_err();
    assert!(matches!(err, CoordError::Fenced(_)), "{err:?}");
    assert_eq!(store.revision().await.unwrap(), rev);
    assert_eq!(store.get(b"wi/k").await.unwrap().unwrap().value, b"1");
}

/// Observers see every change of leader, and the stream reports the end
/// of its watch as an error rather than going quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_follows_leaders() {
    let (store, clock) = store_and_clock();
    let election = Election::new(store.clone(), "obs/").unwrap();
    let mut observer = election.observe().await.unwrap();
    assert_eq!(observer.next().await.unwrap(), None);
    let lease_a = Lease::grant_with(store.clone(), options(&clock))
        .await
        .unwrap();
    let a = election.campaign(&lease_a, b"a").await.unwrap();
    let seen = observer.next().await.unwrap().unwrap();
    assert_eq!((seen.value.as_slice(), seen.token), (&b"a"[..], a.token()));
    a.proclaim(b"a2").await.unwrap();
    assert_eq!(observer.next().await.unwrap().unwrap().value, b"a2");
    let lease_b = Lease::grant_with(store.clone(), options(&clock))
        .await
        .unwrap();
    let election_b = election.clone();
    let b = tokio::spawn(async move {
        election_b
            .campaign(&lease_b, b"b")
            .await
            .map(|t| (t, lease_b))
    });
    while store.range(b"obs/", None).await.unwrap().kvs.len() < 2 {
        tokio::task::yield_now().await;
    }
    a.resign().await.unwrap();
    let seen = observer.next().await.unwrap().unwrap();
    assert_eq!(seen.value, b"b");
    let (term_b, _lease_b) = b.await.unwrap().unwrap();
    assert_eq!(seen.token, term_b.token());

    // A watch that cannot continue ends the stream with an error.
    let small = MemoryStore::with_options(MemoryStoreOptions::default().with_history(2));
    let e2 = Election::new(small.clone(), "obs/").unwrap();
    let mut o2 = e2.observe().await.unwrap();
    assert_eq!(o2.next().await.unwrap(), None);
    for i in 0..10u8 {
        let _ = small.put(b"obs/x", &[i], PutOptions::new()).await.unwrap();
    }
    let rev = small.revision().await.unwrap();
    small.compact(rev).await.unwrap();
    let end = o2.next().await;
    assert!(matches!(end, Err(CoordError::ObserveEnded(_))), "{end:?}");
    let _ = small
        .watch(KeySpan::Key(b"obs/x".to_vec()), rev.next())
        .await
        .unwrap();
}

/// One simulated process in the election property test.
struct Candidate {
    view: InstrumentedStore<MemoryStore>,
    crashed: bool,
}

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Pause(usize),
    Resume(usize),
    Crash(usize),
    Run,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u64..15).prop_map(Step::Advance),
        2 => (0..3usize).prop_map(Step::Pause),
        2 => (0..3usize).prop_map(Step::Resume),
        1 => (0..3usize).prop_map(Step::Crash),
        4 => Just(Step::Run),
    ]
}

/// What the fenced resource recorded: (token, accepted).
type Log = Arc<std::sync::Mutex<Vec<(FencingToken, bool)>>>;

/// A candidate's life: campaign, then write with the term's token until
/// fenced or the lease is lost, then campaign again with a new lease.
async fn candidate_loop(
    id: usize,
    view: InstrumentedStore<MemoryStore>,
    clock: ManualClock,
    grants: Arc<std::sync::Mutex<Vec<FencingToken>>>,
    log: Log,
) {
    let election = Election::new(view.clone(), "prop/leader/").unwrap();
    let fence = StoreFence::new(view.clone(), b"prop/fence".to_vec()).unwrap();
    loop {
        let Ok(lease) =
            Lease::grant_with(view.clone(), options(&clock).with_renew_fraction(0.3)).await
        else {
            tokio::task::yield_now().await;
            continue;
        };
        let Ok(term) = election.campaign(&lease, format!("{id}").as_bytes()).await else {
            continue;
        };
        grants.lock().unwrap().push(term.token());
        loop {
            if lease.check().is_err() {
                break;
            }
            let r = fence
                .put(term.token(), b"prop/data", &term.token().to_bytes())
                .await;
            log.lock().unwrap().push((term.token(), r.is_ok()));
            if r.is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: calm::testing::Config::default().cases.min(64), ..ProptestConfig::default() })]

    /// Under random pauses, clock jumps (lease expiries) and crashes:
    /// leaders' tokens strictly increase in the order they are crowned,
    /// and the fenced resource never accepts a token lower than one it
    /// already accepted (no two terms overlap at the resource).
    #[test]
    fn terms_never_overlap_at_the_resource(steps in proptest::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (store, clock) = store_and_clock();
            let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
            let log: Log = Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut cands: Vec<Candidate> = Vec::new();
            let mut tasks = Vec::new();
            for id in 0..3 {
                let view = InstrumentedStore::new(store.clone());
                tasks.push(tokio::spawn(candidate_loop(id, view.clone(), clock.clone(), Arc::clone(&grants), Arc::clone(&log))));
                cands.push(Candidate { view, crashed: false });
            }
            for s in &steps {
                match *s {
                    Step::Advance(secs) => clock.advance(Duration::from_secs(secs)),
                    Step::Pause(i) => cands[i].view.pause(),
                    Step::Resume(i) if !cands[i].crashed => cands[i].view.resume(),
                    Step::Resume(_) => {}
                    Step::Crash(i) => {
                        // A crash is a pause that never ends.
                        cands[i].crashed = true;
                        cands[i].view.pause();
                    }
                    Step::Run => {}
                }
                settle().await;
            }
            // Everyone alive runs on; the clock moves so leases settle.
            for c in &cands {
                if !c.crashed { c.view.resume(); }
            }
            for _ in 0..3 {
                clock.advance(Duration::from_secs(4));
                settle().await;
            }
            for t in tasks { t.abort(); }
            let grants = grants.lock().unwrap().clone();
            for w in grants.windows(2) {
                prop_assert!(w[0] < w[1], "grant tokens not increasing: {grants:?}");
            }
            let log = log.lock().unwrap().clone();
            let mut highest = FencingToken::default();
            for &(token, accepted) in &log {
                if accepted {
                    prop_assert!(token >= highest, "token {token} accepted after {highest}: {log:?}");
                    highest = token;
                }
            }
            Ok(())
        })?;
    }
}

/// A lease whose renewals fail is `Suspended` (with the cause) while time
/// is left, `Alive` again when a renewal gets through, and `Lost` with the
/// last renewal's error once a whole TTL passes without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_suspends_recovers_and_is_lost_with_its_cause() {
    let store = InstrumentedStore::new(MemoryStore::new());
    let ttl = Duration::from_millis(600);
    let lease = Lease::grant(store.clone(), ttl).await.unwrap();
    assert_eq!(lease.state(), LeaseState::Alive);
    store.disconnect();
    let suspended = tokio::time::timeout(ttl, lease.state_change(&LeaseState::Alive))
        .await
        .expect("a failed renewal suspends the lease");
    match &suspended {
        LeaseState::Suspended { failures, cause } => {
            assert!(*failures >= 1);
            assert!(cause.is_retryable(), "{cause}");
        }
        other => panic!("expected Suspended, got {other:?}"),
    }
    assert!(lease.is_alive(), "suspended is not lost");
    store.reconnect();
    let mut state = suspended;
    while matches!(state, LeaseState::Suspended { .. }) {
        state = tokio::time::timeout(ttl, lease.state_change(&state))
            .await
            .expect("a renewal gets through");
    }
    assert_eq!(state, LeaseState::Alive);
    store.disconnect();
    let loss = tokio::time::timeout(ttl * 3, lease.lost())
        .await
        .expect("lost after a TTL without renewals");
    match &loss {
        LeaseLoss::Unreachable { cause: Some(e) } => {
            let cause = std::error::Error::source(&**e).map(ToString::to_string);
            assert!(cause.is_some_and(|c| c.contains("disconnected")), "{e:?}");
            assert!(loss.to_string().contains("disconnected"), "{loss}");
        }
        other => panic!("expected Unreachable with a cause, got {other:?}"),
    }
    assert!(!lease.is_alive());
    assert!(matches!(lease.check(), Err(CoordError::LeaseLost { .. })));
}

/// Granting a lease outside a Tokio runtime is an error, and grants
/// nothing.
#[test]
fn lease_outside_a_runtime_is_an_error() {
    let store = InstrumentedStore::new(MemoryStore::new());
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut grant = std::pin::pin!(Lease::grant(store.clone(), Duration::from_secs(5)));
    let result = loop {
        if let std::task::Poll::Ready(r) = std::future::Future::poll(grant.as_mut(), &mut cx) {
            break r;
        }
    };
    assert!(matches!(result, Err(CoordError::NoRuntime)), "{result:?}");
    assert_eq!(store.requests(), 0, "nothing was sent");
}

/// A campaign or a lock wait that is dropped (a timeout) leaves no key in
/// line: the next candidate is not stuck behind a ghost, and `try_lock`
/// takes a free lock but never waits for a held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_waits_leave_no_key() {
    let store = MemoryStore::new();
    let lease = |s: &MemoryStore| Lease::grant(s.clone(), Duration::from_secs(30));
    let (a, b, c) = (
        lease(&store).await.unwrap(),
        lease(&store).await.unwrap(),
        lease(&store).await.unwrap(),
    );

    let election = Election::new(store.clone(), "e/").unwrap();
    let leader = election.campaign(&a, b"a").await.unwrap();
    let gave_up =
        tokio::time::timeout(Duration::from_millis(100), election.campaign(&b, b"b")).await;
    assert!(gave_up.is_err(), "b cannot lead while a does");
    // The background clean-up runs right after the drop.
    let mut line = store.range(b"e/", None).await.unwrap().kvs.len();
    for _ in 0..100 {
        if line == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        line = store.range(b"e/", None).await.unwrap().kvs.len();
    }
    assert_eq!(line, 1, "the abandoned candidate's key is still in line");
    leader.resign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), election.campaign(&c, b"c"))
        .await
        .expect("c leads at once: nobody abandoned is ahead of it")
        .unwrap();
    next.resign().await.unwrap();

    let lock = Lock::new(store.clone(), "l/").unwrap();
    let held = lock.try_lock(&a).await.unwrap().expect("the lock is free");
    assert!(lock.try_lock(&b).await.unwrap().is_none());
    assert!(
        lock.lock_timeout(&b, Duration::from_millis(100))
            .await
            .unwrap()
            .is_none()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.range(b"l/", None).await.unwrap().kvs.len(), 1);
    held.unlock().await.unwrap();
    let got = lock
        .lock_timeout(&b, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free again");
    got.unlock().await.unwrap();
}

/// A lease whose renewal is still in flight at its deadline is lost at
/// once; when the answer then says the store had ended it, the loss is
/// told as `Expired`, not as an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_corrects_the_loss_to_expired() {
    let store = InstrumentedStore::new(MemoryStore::new());
    let ttl = Duration::from_millis(300);
    let lease = Lease::grant(store.clone(), ttl).await.unwrap();
    // Renewals hang from now on, and the store ends the lease meanwhile.
    store.pause();
    store.inner().revoke(lease.id()).await.unwrap();
    let first = tokio::time::timeout(ttl * 3, lease.lost())
        .await
        .expect("lost by its deadline");
    assert_eq!(first, LeaseLoss::Unreachable { cause: None });
    store.resume();
    let corrected = tokio::time::timeout(
        ttl * 3,
        lease.state_change(&LeaseState::Lost(LeaseLoss::Unreachable { cause: None })),
    )
    .await
    .expect("the in-flight renewal's answer arrives");
    assert_eq!(corrected, LeaseState::Lost(LeaseLoss::Expired));
    assert!(!lease.is_alive());
}

/// With feature `tracing`, a lease's trouble is logged: each failed
/// renewal as a warning with its error, the loss as an error with its
/// cause.
#[cfg(feature = "tracing")]
#[tokio::test]
async fn lease_trouble_is_logged() {
    use std::fmt::Write as _;
    use std::sync::Mutex;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    /// Keeps every event as "LEVEL field=value ...".
    struct Capture(Arc<Mutex<Vec<String>>>);
    struct Line(String);
    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
        fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
            let _ = write!(self.0, " {}={value}", field.name());
            let mut next = value.source();
            while let Some(cause) = next {
                let _ = write!(self.0, ": {cause}");
                next = cause.source();
            }
        }
    }
    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut line = Line(event.metadata().level().to_string());
            event.record(&mut line);
            self.0.lock().unwrap().push(line.0);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    // A process-wide subscriber: a thread-local one can miss events of
    // call sites another test thread reached first.
    static LINES: std::sync::OnceLock<Arc<Mutex<Vec<String>>>> = std::sync::OnceLock::new();
    let lines = LINES
        .get_or_init(|| {
            let lines = Arc::default();
            tracing::subscriber::set_global_default(Capture(Arc::clone(&lines)))
                .expect("the only global subscriber");
            lines
        })
        .clone();
    let store = InstrumentedStore::new(MemoryStore::new());
    // Leases of other tests' stores are numbered from 1: make this one's
    // id stand out.
    for _ in 0..4096 {
        store.inner().grant(Duration::from_secs(60)).await.unwrap();
    }
    let ttl = Duration::from_millis(300);
    let lease = Lease::grant(store.clone(), ttl).await.unwrap();
    let ours = format!("lease={:?}", lease.id());
    store.disconnect();
    tokio::time::timeout(ttl * 3, lease.lost())
        .await
        .expect("lost after a TTL without renewals");
    let lines: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&format!("{ours} ")) || l.ends_with(&ours))
        .cloned()
        .collect();
    assert!(
        lines.iter().any(|l| l.starts_with("WARN")
            && l.contains("lease renewal failed")
            && l.contains("backend unavailable: disconnected")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("ERROR")
            && l.contains("lease lost")
            && l.contains("disconnected")),
        "{lines:#?}"
    );
}
