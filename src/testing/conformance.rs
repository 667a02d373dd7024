//! One conformance suite for every [`Store`] backend.
//!
//! The suite is the store model written as tests: every operation and
//! `Expect` case, transaction atomicity, revision monotonicity, lease
//! expiry, watch ordering, `merge_into` under concurrent writers, invalid
//! input, and a linearizability check of concurrent histories. calm runs it
//! on [`MemoryStore`] in every `cargo test`, and on PostgreSQL and etcd
//! servers when those backends are built; a store of your own can run it
//! too, by implementing [`Fixture`].
//!
//! Each check is a public async function taking a [`Case`] (a store, a key
//! prefix no other case uses, and a way to move the store's time), so a
//! test binary can give each its own `#[test]`; [`run_all`] runs them in
//! order.
//!
//! # Examples
//!
//! ```
//! use calm::testing::conformance::{self, MemoryFixture};
//!
//! # #[tokio::main]
//! # async fn main() {
//! conformance::run_all(&MemoryFixture::default()).await.unwrap();
//! # }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::linearizability::{self, KvInput, KvOutput, Operation, Verdict};
use crate::GCounter;
use crate::causal::ReplicaId;
use crate::occ::Version;
use crate::store::{
    Compare, CompareOp, EventKind, Expect, KeySpan, MAX_KEY_LEN, MAX_VALUE_LEN, ManualClock,
    MemoryStore, MemoryStoreOptions, PutOptions, Store, StoreError, StoreExt, Txn, TxnOp,
    TxnOpResult, Typed, UpdateError, Watch, WriteOutcome,
};

/// How a case moves the store's time forward.
#[derive(Clone, Debug)]
pub enum TimeControl {
    /// The store runs on this manual clock: advancing is instant.
    Manual(ManualClock),
    /// The store runs on real time (a server): advancing sleeps.
    Real,
}

impl TimeControl {
    /// Moves the store's time forward by at least `by`.
    pub async fn advance(&self, by: Duration) {
        match self {
            TimeControl::Manual(c) => {
                c.advance(by);
                // Let the store's reaper and watchers run.
                tokio::task::yield_now().await;
            }
            TimeControl::Real => tokio::time::sleep(by).await,
        }
    }
}

/// One run of one check: a store, a private key prefix, and its time.
#[derive(Clone, Debug)]
pub struct Case<S> {
    /// The store under test.
    pub store: S,
    /// A prefix no other case uses; every key of the case starts with it.
    pub prefix: Vec<u8>,
    /// How to move the store's time.
    pub time: TimeControl,
    /// The shortest lease TTL the store honours exactly (etcd rounds
    /// TTLs up to whole seconds, with a minimum).
    pub ttl: Duration,
    /// A multiplier for workload sizes: 1 for an in-memory store, less
    /// work per unit for a remote one is chosen by the fixture.
    pub ops_per_client: usize,
}

impl<S> Case<S> {
    /// The case's key for `name`.
    pub fn key(&self, name: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(name.as_bytes());
        k
    }
}

/// Makes fresh cases for a backend.
pub trait Fixture: Send + Sync {
    /// The store under test.
    type Store: Store + Clone + 'static;

    /// A case with a fresh store or a fresh key prefix.
    fn case(&self) -> impl Future<Output = Case<Self::Store>> + Send;
}

/// The fixture for [`MemoryStore`]: a fresh store on a [`ManualClock`] per
/// case.
#[derive(Debug, Clone, Default)]
pub struct MemoryFixture;

impl Fixture for MemoryFixture {
    type Store = MemoryStore;

    async fn case(&self) -> Case<MemoryStore> {
        let clock = ManualClock::new();
        Case {
            store: MemoryStore::with_options(
                MemoryStoreOptions::default().with_clock(clock.clone()),
            ),
            prefix: b"conformance/".to_vec(),
            time: TimeControl::Manual(clock),
            ttl: Duration::from_secs(10),
            ops_per_client: 1000,
        }
    }
}

/// A check that failed.
#[derive(Debug, thiserror::Error)]
#[error("conformance check `{check}` failed: {message}")]
#[non_exhaustive]
pub struct ConformanceFailure {
    /// Which check.
    pub check: &'static str,
    /// What went wrong.
    pub message: String,
}

/// The result of one check.
pub type CheckResult = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Turns a store error into a check failure.
fn store<T>(r: Result<T, StoreError>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: unexpected error: {e}"))
}

fn committed(o: WriteOutcome, what: &str) -> Result<Version, String> {
    match o {
        WriteOutcome::Committed { revision, .. } => Ok(revision),
        WriteOutcome::Conflict { current } => {
            Err(format!("{what}: unexpected conflict, key is {current:?}"))
        }
    }
}

/// A check's future.
pub type BoxCheck<'a> = Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>>;

/// A check, as a function pointer.
pub type CheckFn<S> = for<'a> fn(&'a Case<S>) -> BoxCheck<'a>;

/// What [`Store::put`]'s cancel-safety section promises: a conditional
/// write dropped at a random point (before sending, in flight, or after
/// it applied) is settled by writing again under the same expectation.
/// If the second write commits, the dropped one never applies, even
/// later; if it conflicts, the dropped one applied.
pub async fn dropped_conditional_write<S: Store>(c: &Case<S>) -> CheckResult {
    let k = c.key("dropped");
    for round in 0..10u64 {
        let base = committed(
            store(c.store.put(&k, b"base", PutOptions::new()).await, "put")?,
            "put",
        )?;
        let expect = PutOptions::new().with_expect(Expect::Version(base));
        let dropped = format!("dropped {round}").into_bytes();
        let mine = format!("mine {round}").into_bytes();
        // Cut the first write short somewhere between 0 and ~1 ms.
        let cut = Duration::from_micros(round * 97 % 1000);
        let first = tokio::time::timeout(cut, c.store.put(&k, &dropped, expect)).await;
        if first.is_ok() {
            continue; // it finished: nothing was dropped
        }
        let second = store(c.store.put(&k, &mine, expect).await, "second put")?;
        // Give a write still in flight every chance to land.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = store(c.store.get(&k).await, "get")?.map(|kv| kv.value);
        match second {
            WriteOutcome::Committed { .. } => ensure!(
                now.as_deref() == Some(mine.as_slice()),
                "round {round}: the second write committed, then the key became {now:?}"
            ),
            WriteOutcome::Conflict { .. } => ensure!(
                now.as_deref() == Some(dropped.as_slice()),
                "round {round}: the second write conflicted, yet the key is {now:?}"
            ),
        }
    }
    Ok(())
}

/// A watch does not keep its store alive: given the only handle of a
/// store, starts a watch, drops the store, and expects the watch to end
/// with [`StoreError::Closed`] (not hang). Not in [`checks`], which share
/// their store with the fixture; each backend's tests call it with a store
/// of their own.
///
/// # Errors
///
/// What went wrong, for the test to report.
pub async fn watch_ends_with_its_store<S: Store>(only: S, prefix: &[u8]) -> CheckResult {
    let mut watch = store(
        only.watch(KeySpan::Prefix(prefix.to_vec()), Version::ZERO)
            .await,
        "watch",
    )?;
    drop(only);
    match tokio::time::timeout(Duration::from_secs(5), watch.next()).await {
        Ok(Err(StoreError::Closed)) => Ok(()),
        Ok(other) => Err(format!(
            "after the store was dropped, the watch gave {other:?}"
        )),
        Err(_) => Err("the watch still waits 5 s after its store was dropped".into()),
    }
}

/// Every check, by name, in the order [`run_all`] runs them.
pub fn checks<S: Store + Clone + 'static>() -> Vec<(&'static str, CheckFn<S>)> {
    vec![
        ("put_get_metadata", |c| Box::pin(put_get_metadata(c))),
        ("expect_cases", |c| Box::pin(expect_cases(c))),
        ("revision_monotonic", |c| Box::pin(revision_monotonic(c))),
        ("range_prefix_limit", |c| Box::pin(range_prefix_limit(c))),
        ("txn_atomicity", |c| Box::pin(txn_atomicity(c))),
        ("invalid_input", |c| Box::pin(invalid_input(c))),
        ("lease_expiry", |c| Box::pin(lease_expiry(c))),
        ("lease_revoke", |c| Box::pin(lease_revoke(c))),
        ("watch_from_revision", |c| Box::pin(watch_from_revision(c))),
        ("watch_compacted", |c| Box::pin(watch_compacted(c))),
        ("merge_into_concurrent", |c| {
            Box::pin(merge_into_concurrent(c))
        }),
        ("typed_update_contention", |c| {
            Box::pin(typed_update_contention(c))
        }),
        ("dropped_conditional_write", |c| {
            Box::pin(dropped_conditional_write(c))
        }),
        ("linearizable", |c| Box::pin(linearizable(c))),
    ]
}

/// Runs every check on fresh cases from `fixture`, stopping at the first
/// failure.
///
/// # Errors
///
/// The first [`ConformanceFailure`].
pub async fn run_all<F: Fixture>(fixture: &F) -> Result<(), ConformanceFailure> {
    for (check, f) in checks::<F::Store>() {
        let case = fixture.case().await;
        f(&case)
            .await
            .map_err(|message| ConformanceFailure { check, message })?;
    }
    Ok(())
}

/// Puts and gets: a new key's revisions and write count, then an update's.
pub async fn put_get_metadata<S: Store>(c: &Case<S>) -> CheckResult {
    let k = c.key("meta");
    ensure!(
        store(c.store.get(&k).await, "get absent")?.is_none(),
        "absent key read as present"
    );
    let r1 = committed(
        store(c.store.put(&k, b"one", PutOptions::new()).await, "put")?,
        "put",
    )?;
    let kv = store(c.store.get(&k).await, "get")?.ok_or("written key missing")?;
    ensure!(kv.value == b"one", "value {:?}", kv.value);
    ensure!(
        kv.create_revision == r1 && kv.mod_revision == r1,
        "revisions {kv:?} after write at {r1}"
    );
    ensure!(kv.writes == 1, "writes {} after one write", kv.writes);
    let r2 = committed(
        store(c.store.put(&k, b"two", PutOptions::new()).await, "put")?,
        "put",
    )?;
    ensure!(r2 > r1, "second write at {r2} not after {r1}");
    let kv = store(c.store.get(&k).await, "get")?.ok_or("written key missing")?;
    ensure!(
        kv.create_revision == r1 && kv.mod_revision == r2 && kv.writes == 2,
        "after update: {kv:?}"
    );
    ensure!(kv.value == b"two", "value {:?}", kv.value);
    // A new life after delete starts over.
    committed(
        store(c.store.delete(&k, Expect::Any).await, "delete")?,
        "delete",
    )?;
    let r3 = committed(
        store(c.store.put(&k, b"three", PutOptions::new()).await, "put")?,
        "put",
    )?;
    let kv = store(c.store.get(&k).await, "get")?.ok_or("written key missing")?;
    ensure!(
        kv.create_revision == r3 && kv.writes == 1,
        "recreated key kept old life: {kv:?}"
    );
    Ok(())
}

/// Every `Expect` on put and delete, present and absent; a refused write
/// changes nothing.
pub async fn expect_cases<S: Store>(c: &Case<S>) -> CheckResult {
    let k = c.key("cas");
    let put = |e: Expect, v: &'static [u8]| c.store.put(&k, v, PutOptions::new().with_expect(e));
    let r1 = committed(
        store(put(Expect::Absent, b"a").await, "create")?,
        "create on absent",
    )?;
    match store(put(Expect::Absent, b"b").await, "create")? {
        WriteOutcome::Conflict { current: Some(kv) } => {
            ensure!(
                kv.value == b"a" && kv.mod_revision == r1,
                "conflict reports {kv:?}"
            )
        }
        other => return Err(format!("create on present key: {other:?}")),
    }
    let r2 = committed(
        store(put(Expect::Version(r1), b"c").await, "cas")?,
        "cas with current version",
    )?;
    let before = store(c.store.get(&k).await, "get")?;
    match store(put(Expect::Version(r1), b"d").await, "cas")? {
        WriteOutcome::Conflict { current: Some(kv) } => {
            ensure!(kv.mod_revision == r2, "conflict reports {kv:?}")
        }
        other => return Err(format!("stale cas: {other:?}")),
    }
    let after = store(c.store.get(&k).await, "get")?;
    ensure!(
        before == after,
        "a refused cas changed the key: {before:?} -> {after:?}"
    );
    // Deletes.
    let stale = store(c.store.delete(&k, Expect::Version(r1)).await, "delete")?;
    ensure!(stale.is_conflict(), "stale delete: {stale:?}");
    ensure!(
        store(c.store.delete(&k, Expect::Absent).await, "delete")?.is_conflict(),
        "delete expecting absent on present key"
    );
    let del = store(c.store.delete(&k, Expect::Version(r2)).await, "delete")?;
    match del {
        WriteOutcome::Committed {
            prev: Some(kv),
            revision,
        } => {
            ensure!(
                kv.value == b"c" && revision > r2,
                "delete result {kv:?} at {revision}"
            )
        }
        other => return Err(format!("delete with current version: {other:?}")),
    }
    ensure!(
        store(c.store.get(&k).await, "get")?.is_none(),
        "deleted key still there"
    );
    let rev = store(c.store.revision().await, "revision")?;
    match store(c.store.delete(&k, Expect::Any).await, "delete")? {
        WriteOutcome::Committed {
            prev: None,
            revision,
        } => {
            ensure!(
                revision == rev,
                "deleting nothing moved the revision {rev} -> {revision}"
            )
        }
        other => return Err(format!("delete of absent key: {other:?}")),
    }
    ensure!(
        store(put(Expect::Version(r2), b"e").await, "cas")?.is_conflict(),
        "cas on absent key succeeded"
    );
    Ok(())
}

/// Every write moves the store revision up by exactly its own revision;
/// reads never move it.
pub async fn revision_monotonic<S: Store>(c: &Case<S>) -> CheckResult {
    let mut last = store(c.store.revision().await, "revision")?;
    for i in 0..20u8 {
        let k = c.key(&format!("mono/{}", i % 3));
        let r = committed(
            store(c.store.put(&k, &[i], PutOptions::new()).await, "put")?,
            "put",
        )?;
        ensure!(r > last, "write {i} at {r}, not after {last}");
        last = r;
        let _ = store(c.store.get(&k).await, "get")?;
        let now = store(c.store.revision().await, "revision")?;
        ensure!(now >= r, "revision {now} behind the write at {r}");
    }
    Ok(())
}

/// Range reads select by prefix, in key order, with a limit.
pub async fn range_prefix_limit<S: Store>(c: &Case<S>) -> CheckResult {
    for name in ["r/c", "r/a", "r/b", "rx", "s/a"] {
        committed(
            store(
                c.store
                    .put(&c.key(name), name.as_bytes(), PutOptions::new())
                    .await,
                "put",
            )?,
            "put",
        )?;
    }
    let all = store(c.store.range(&c.key("r/"), None).await, "range")?;
    let keys: Vec<Vec<u8>> = all.kvs.iter().map(|kv| kv.key.clone()).collect();
    ensure!(
        keys == vec![c.key("r/a"), c.key("r/b"), c.key("r/c")],
        "range returned {:?}",
        all.kvs
    );
    ensure!(!all.more, "more set without a limit");
    let two = store(c.store.range(&c.key("r/"), Some(2)).await, "range")?;
    ensure!(
        two.kvs.len() == 2 && two.more,
        "limit 2 gave {} keys, more={}",
        two.kvs.len(),
        two.more
    );
    let none = store(c.store.range(&c.key("zzz/"), None).await, "range")?;
    ensure!(
        none.kvs.is_empty() && !none.more,
        "empty range returned {:?}",
        none.kvs
    );
    Ok(())
}

/// Transactions are all or nothing, at one revision; failure branches run
/// when a compare fails; reads see earlier writes of the branch.
pub async fn txn_atomicity<S: Store>(c: &Case<S>) -> CheckResult {
    let (a, b) = (c.key("txn/a"), c.key("txn/b"));
    let r0 = committed(
        store(c.store.put(&a, b"100", PutOptions::new()).await, "put")?,
        "put",
    )?;
    let t = Txn::new()
        .when(Compare::value(&a, CompareOp::Equal, b"100"))
        .when(Compare::absent(&b))
        .then(TxnOp::put(&a, b"90"))
        .then(TxnOp::put(&b, b"10"))
        .then(TxnOp::get(&b))
        .otherwise(TxnOp::get(&a));
    let out = store(c.store.txn(t.clone()).await, "txn")?;
    ensure!(out.succeeded, "compares that hold failed");
    ensure!(
        matches!(&out.results[2], TxnOpResult::Get { kv: Some(kv) } if kv.value == b"10"),
        "read in txn: {:?}",
        out.results[2]
    );
    let (ka, kb) = (
        store(c.store.get(&a).await, "get")?,
        store(c.store.get(&b).await, "get")?,
    );
    let (ka, kb) = (ka.ok_or("a missing")?, kb.ok_or("b missing")?);
    ensure!(
        ka.mod_revision == kb.mod_revision && ka.mod_revision == out.revision,
        "txn writes at {} and {}, txn at {}",
        ka.mod_revision,
        kb.mod_revision,
        out.revision
    );
    ensure!(out.revision > r0, "txn revision did not move");
    // The same transaction again fails its compares and runs `otherwise`.
    let out = store(c.store.txn(t).await, "txn")?;
    ensure!(!out.succeeded, "compares that no longer hold succeeded");
    ensure!(
        matches!(&out.results[0], TxnOpResult::Get { kv: Some(kv) } if kv.value == b"90"),
        "failure branch result {:?}",
        out.results
    );
    let rev = store(c.store.revision().await, "revision")?;
    ensure!(out.revision == rev, "read-only txn moved the revision");
    // A branch that cannot apply (dead lease) writes nothing at all.
    let lease = store(c.store.grant(c.ttl).await, "grant")?;
    store(c.store.revoke(lease.id).await, "revoke")?;
    let bad = Txn::new().then(TxnOp::put(&a, b"0")).then(TxnOp::Put {
        key: b.clone(),
        value: b"0".to_vec(),
        lease: Some(lease.id),
    });
    let err = c.store.txn(bad).await;
    ensure!(
        matches!(err, Err(StoreError::LeaseNotFound { .. })),
        "txn with a dead lease: {err:?}"
    );
    let ka2 = store(c.store.get(&a).await, "get")?.ok_or("a missing")?;
    ensure!(ka2 == ka, "a failed txn changed a: {ka2:?}");
    let dup = Txn::new()
        .then(TxnOp::put(&a, b"1"))
        .then(TxnOp::delete(&a));
    ensure!(
        matches!(c.store.txn(dup).await, Err(StoreError::InvalidTxn { .. })),
        "txn writing a key twice accepted"
    );
    // Compares on create revision, write count, and a value ordering.
    let t = Txn::new()
        .when(Compare::create_revision(&a, CompareOp::Equal, r0))
        .when(Compare::writes(&a, CompareOp::Equal, 2))
        .when(Compare::value(&a, CompareOp::Greater, b"80"))
        .when(Compare::value(&a, CompareOp::Less, b"95"))
        .then(TxnOp::delete(&b));
    let out = store(c.store.txn(t).await, "txn")?;
    ensure!(
        out.succeeded,
        "compares on create revision / writes / value order failed"
    );
    ensure!(
        matches!(&out.results[0], TxnOpResult::Delete { prev: Some(_) }),
        "delete in txn: {:?}",
        out.results
    );
    ensure!(
        store(c.store.get(&b).await, "get")?.is_none(),
        "txn delete did not delete"
    );
    Ok(())
}

/// Empty and oversized keys, oversized values, zero TTLs: typed errors,
/// nothing changed.
pub async fn invalid_input<S: Store>(c: &Case<S>) -> CheckResult {
    let k = c.key("valid");
    committed(
        store(c.store.put(&k, b"v", PutOptions::new()).await, "put")?,
        "put",
    )?;
    let rev = store(c.store.revision().await, "revision")?;
    let long = vec![b'k'; MAX_KEY_LEN + 1];
    ensure!(
        matches!(
            c.store.put(b"", b"v", PutOptions::new()).await,
            Err(StoreError::InvalidKey { .. })
        ),
        "empty key accepted"
    );
    ensure!(
        matches!(
            c.store.put(&long, b"v", PutOptions::new()).await,
            Err(StoreError::InvalidKey { .. })
        ),
        "long key accepted"
    );
    ensure!(
        matches!(c.store.get(&long).await, Err(StoreError::InvalidKey { .. })),
        "long key read"
    );
    let big = vec![0u8; MAX_VALUE_LEN + 1];
    ensure!(
        matches!(
            c.store.put(&k, &big, PutOptions::new()).await,
            Err(StoreError::ValueTooLarge { .. })
        ),
        "huge value accepted"
    );
    ensure!(
        matches!(
            c.store.grant(Duration::ZERO).await,
            Err(StoreError::InvalidTtl { .. })
        ),
        "zero ttl accepted"
    );
    let stale = crate::store::LeaseId::new(i64::MAX - 7);
    let kept = c.store.keep_alive(stale).await;
    ensure!(
        matches!(kept, Err(StoreError::LeaseNotFound { .. })),
        "unknown lease kept alive: {kept:?}"
    );
    ensure!(
        matches!(
            c.store
                .put(&k, b"x", PutOptions::new().with_lease(stale))
                .await,
            Err(StoreError::LeaseNotFound { .. })
        ),
        "put on unknown lease"
    );
    // One set of transaction and prefix limits on every backend, checked
    // before anything is sent; the largest allowed transaction commits.
    let puts = |n: usize, value: &[u8]| {
        (0..n).fold(Txn::new(), |t, i| {
            t.then(TxnOp::put(&c.key(&format!("txn/{i}")), value))
        })
    };
    let over = c.store.txn(puts(crate::store::MAX_TXN_OPS + 1, b"v")).await;
    ensure!(
        matches!(over, Err(StoreError::InvalidTxn { .. })),
        "a transaction of {} puts: {over:?}",
        crate::store::MAX_TXN_OPS + 1
    );
    let heavy = c.store.txn(puts(2, &big[1..])).await;
    ensure!(
        matches!(heavy, Err(StoreError::InvalidTxn { .. })),
        "a transaction of two 1 MiB values: {:?}",
        heavy.map(|o| o.succeeded)
    );
    let wide = c.store.range(&vec![b'p'; MAX_VALUE_LEN], None).await;
    ensure!(
        matches!(wide, Err(StoreError::InvalidKey { .. })),
        "a 1 MiB range prefix: {:?}",
        wide.map(|r| r.kvs.len())
    );
    ensure!(
        store(c.store.revision().await, "revision")? == rev,
        "a refused transaction moved the revision"
    );
    let rev = {
        let full = store(
            c.store.txn(puts(crate::store::MAX_TXN_OPS, b"v")).await,
            "a transaction of MAX_TXN_OPS puts",
        )?;
        ensure!(full.succeeded, "a transaction of MAX_TXN_OPS puts failed");
        full.revision
    };
    // Lease 0 is no lease on any backend (etcd would read it as "none").
    let zero = crate::store::LeaseId::new(0);
    let put = c
        .store
        .put(&k, b"x", PutOptions::new().with_lease(zero))
        .await;
    ensure!(
        matches!(put, Err(StoreError::LeaseNotFound { .. })),
        "put on lease 0: {put:?}"
    );
    let txn = c
        .store
        .txn(Txn::new().then(TxnOp::Put {
            key: k.clone(),
            value: b"x".to_vec(),
            lease: Some(zero),
        }))
        .await;
    ensure!(
        matches!(txn, Err(StoreError::LeaseNotFound { .. })),
        "txn put on lease 0: {txn:?}"
    );
    for ttl in [
        crate::store::MAX_LEASE_TTL + Duration::from_secs(1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ] {
        let grant = c.store.grant(ttl).await;
        ensure!(
            matches!(grant, Err(StoreError::InvalidTtl { .. })),
            "grant({ttl:?}) gave {grant:?}"
        );
    }
    ensure!(
        store(c.store.revision().await, "revision")? == rev,
        "a rejected call moved the revision"
    );
    ensure!(
        store(c.store.get(&k).await, "get")?.map(|kv| kv.value) == Some(b"v".to_vec()),
        "a rejected call changed the value"
    );
    Ok(())
}

/// A lease kept alive survives its TTL; one left alone expires, taking its
/// keys (all at one revision, seen by a watch) and refusing keep-alives.
pub async fn lease_expiry<S: Store>(c: &Case<S>) -> CheckResult {
    let (a, b) = (c.key("lease/a"), c.key("lease/b"));
    let grant = store(c.store.grant(c.ttl).await, "grant")?;
    ensure!(
        grant.ttl >= c.ttl,
        "granted {:?} < asked {:?}",
        grant.ttl,
        c.ttl
    );
    let mut watch = store(
        c.store
            .watch(KeySpan::Prefix(c.key("lease/")), Version::ZERO)
            .await,
        "watch",
    )?;
    for k in [&a, &b] {
        committed(
            store(
                c.store
                    .put(k, b"held", PutOptions::new().with_lease(grant.id))
                    .await,
                "put",
            )?,
            "put",
        )?;
    }
    let ttl = grant.ttl;
    c.time.advance(ttl * 6 / 10).await;
    store(c.store.keep_alive(grant.id).await, "keep_alive")?;
    c.time.advance(ttl * 6 / 10).await;
    ensure!(
        store(c.store.get(&a).await, "get")?.is_some(),
        "key gone although its lease was kept alive"
    );
    let left = store(c.store.time_to_live(grant.id).await, "time_to_live")?;
    ensure!(left <= ttl, "time to live {left:?} above ttl {ttl:?}");
    c.time
        .advance(ttl + ttl / 2 + Duration::from_millis(500))
        .await;
    // Expiry must be visible to reads, to watches, and to the lease API.
    ensure!(
        store(c.store.get(&a).await, "get")?.is_none(),
        "key of an expired lease still there"
    );
    ensure!(
        store(c.store.get(&b).await, "get")?.is_none(),
        "key of an expired lease still there"
    );
    let err = c.store.keep_alive(grant.id).await;
    ensure!(
        matches!(err, Err(StoreError::LeaseNotFound { .. })),
        "keep-alive of an expired lease: {err:?}"
    );
    ensure!(
        matches!(
            c.store.time_to_live(grant.id).await,
            Err(StoreError::LeaseNotFound { .. })
        ),
        "ttl of an expired lease"
    );
    let mut deletes = Vec::new();
    while deletes.len() < 2 {
        let e = next_event(&mut watch).await?;
        if e.kind == EventKind::Delete {
            deletes.push(e);
        }
    }
    ensure!(
        deletes[0].revision() == deletes[1].revision(),
        "lease keys deleted at {} and {}",
        deletes[0].revision(),
        deletes[1].revision()
    );
    Ok(())
}

/// Revoking deletes the lease's keys now; revoking twice is an error.
pub async fn lease_revoke<S: Store>(c: &Case<S>) -> CheckResult {
    let k = c.key("revoke");
    let grant = store(c.store.grant(c.ttl).await, "grant")?;
    committed(
        store(
            c.store
                .put(&k, b"x", PutOptions::new().with_lease(grant.id))
                .await,
            "put",
        )?,
        "put",
    )?;
    store(c.store.revoke(grant.id).await, "revoke")?;
    ensure!(
        store(c.store.get(&k).await, "get")?.is_none(),
        "key of a revoked lease still there"
    );
    ensure!(
        matches!(
            c.store.revoke(grant.id).await,
            Err(StoreError::LeaseNotFound { .. })
        ),
        "double revoke accepted"
    );
    Ok(())
}

/// A watch from a past revision replays every matching change from there,
/// in order, once, then follows live writes.
pub async fn watch_from_revision<S: Store>(c: &Case<S>) -> CheckResult {
    let span = c.key("w/");
    let mut revs = Vec::new();
    for i in 0..5u8 {
        let k = c.key(&format!("w/{}", i % 2));
        revs.push(committed(
            store(c.store.put(&k, &[i], PutOptions::new()).await, "put")?,
            "put",
        )?);
        // Noise outside the watched prefix.
        committed(
            store(
                c.store.put(&c.key("other"), &[i], PutOptions::new()).await,
                "put",
            )?,
            "put",
        )?;
    }
    committed(
        store(c.store.delete(&c.key("w/0"), Expect::Any).await, "delete")?,
        "delete",
    )?;
    let mut w = store(
        c.store.watch(KeySpan::Prefix(span.clone()), revs[1]).await,
        "watch",
    )?;
    for (i, want) in revs.iter().enumerate().skip(1) {
        let e = next_event(&mut w).await?;
        ensure!(
            e.kind == EventKind::Put && e.revision() == *want,
            "event {i}: {e:?}, wanted put at {want}"
        );
        ensure!(e.kv.value == [i as u8], "event {i} value {:?}", e.kv.value);
    }
    let e = next_event(&mut w).await?;
    ensure!(
        e.kind == EventKind::Delete && e.kv.key == c.key("w/0"),
        "wanted the delete, got {e:?}"
    );
    let live = committed(
        store(
            c.store.put(&c.key("w/9"), b"live", PutOptions::new()).await,
            "put",
        )?,
        "put",
    )?;
    let e = next_event(&mut w).await?;
    ensure!(
        e.revision() == live && e.kv.value == b"live",
        "live event {e:?}"
    );
    // A watch on one key sees only it.
    let mut one = store(
        c.store.watch(KeySpan::Key(c.key("w/1")), revs[0]).await,
        "watch",
    )?;
    let e = next_event(&mut one).await?;
    ensure!(
        e.kv.key == c.key("w/1") && e.revision() == revs[1],
        "single-key watch: {e:?}"
    );
    Ok(())
}

/// After compaction, watching from a compacted revision is a typed error.
pub async fn watch_compacted<S: Store>(c: &Case<S>) -> CheckResult {
    let k = c.key("compact");
    let first = committed(
        store(c.store.put(&k, b"1", PutOptions::new()).await, "put")?,
        "put",
    )?;
    let mut revisions = vec![first];
    for i in 0..3u8 {
        revisions.push(committed(
            store(c.store.put(&k, &[i], PutOptions::new()).await, "put")?,
            "put",
        )?);
    }
    let (mid, last) = (revisions[1], revisions[3]);
    // Compacting at R drops R itself: the first revision kept is R + 1,
    // the same on every backend.
    store(c.store.compact(mid).await, "compact")?;
    match c.store.watch(KeySpan::Key(k.clone()), mid).await {
        Err(StoreError::Compacted { first_kept, .. }) => ensure!(
            first_kept == mid.next(),
            "after compact({mid}), a watch from it says {first_kept} is the first kept"
        ),
        Err(e) => return Err(format!("watch from the compaction point: {e}")),
        Ok(_) => return Err(format!("after compact({mid}), a watch from {mid} started")),
    }
    drop(store(
        c.store.watch(KeySpan::Key(k.clone()), mid.next()).await,
        "watch from the first kept revision",
    )?);
    store(c.store.compact(last).await, "compact")?;
    match c.store.watch(KeySpan::Key(k.clone()), first).await {
        Err(StoreError::Compacted { requested, .. }) => {
            ensure!(requested == first, "compacted error names {requested}")
        }
        Err(e) => return Err(format!("watch from a compacted revision: {e}")),
        Ok(_) => return Err("watch from a compacted revision started".into()),
    }
    // From after the compaction point it works.
    let mut w = store(
        c.store.watch(KeySpan::Key(k.clone()), last.next()).await,
        "watch",
    )?;
    let r = committed(
        store(c.store.put(&k, b"after", PutOptions::new()).await, "put")?,
        "put",
    )?;
    ensure!(
        next_event(&mut w).await?.revision() == r,
        "watch after compaction missed the write"
    );
    Ok(())
}

/// 8 tasks each merge 1 into a counter `ops_per_client` times: the total
/// is exact, whatever the conflicts.
pub async fn merge_into_concurrent<S: Store + Clone + 'static>(c: &Case<S>) -> CheckResult {
    let k = Arc::new(c.key("counter"));
    let per = c.ops_per_client;
    let tasks: Vec<_> = (0..8u64)
        .map(|t| {
            let (s, k) = (c.store.clone(), Arc::clone(&k));
            tokio::spawn(async move {
                let mut mine = GCounter::new();
                for _ in 0..per {
                    mine.increment(ReplicaId::new(t + 1), 1);
                    // Ship our whole slot: idempotent, so a retry after an
                    // ambiguous failure cannot double count.
                    s.merge_into(&k, &mine).await?;
                }
                Ok::<_, StoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await
            .map_err(|e| format!("task panicked: {e}"))?
            .map_err(|e| format!("merge_into: {e}"))?;
    }
    let total: GCounter = store(c.store.read_merged(&k).await, "read")?.ok_or("counter missing")?;
    ensure!(
        total.value() == 8 * per as u128,
        "counter is {}, expected {}",
        total.value(),
        8 * per
    );
    Ok(())
}

/// Sixteen writers update one typed key ten times each under the default
/// retry policy: every update gets through, none is lost; a fallible update
/// that refuses writes nothing.
pub async fn typed_update_contention<S: Store + Clone + 'static>(c: &Case<S>) -> CheckResult {
    const WRITERS: u64 = 16;
    const EACH: u64 = 10;
    let key = c.key("typed/counter");
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (typed, key) = (Typed::<S, u64>::new(c.store.clone()), key.clone());
            tokio::spawn(async move {
                for _ in 0..EACH {
                    let u = typed.update(&key, |n| n.copied().unwrap_or(0) + 1).await?;
                    assert!(u.written && u.attempts >= 1);
                }
                Ok::<(), StoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await
            .map_err(|e| format!("writer panicked: {e}"))?
            .map_err(|e| format!("update gave up under the default policy: {e}"))?;
    }
    let typed = Typed::<S, u64>::new(c.store.clone());
    let total = *store(typed.get(&key).await, "get")?
        .ok_or("counter missing")?
        .value();
    if total != WRITERS * EACH {
        return Err(format!("{total} of {} updates kept", WRITERS * EACH));
    }
    let before = store(c.store.get(&key).await, "get")?;
    let refused = typed
        .try_update(&key, |n| Err::<Option<u64>, _>(n.copied()))
        .await;
    if !matches!(refused, Err(UpdateError::Refused(Some(n))) if n == total) {
        return Err(format!("a refusing update returned {refused:?}"));
    }
    let declined = typed
        .try_update(&key, |_| Ok::<_, ()>(None))
        .await
        .map_err(|e| format!("declined update: {e:?}"))?;
    if declined.written || declined.version != before.as_ref().map(|kv| kv.mod_revision) {
        return Err(format!("a declined update reported {declined:?}"));
    }
    if store(c.store.get(&key).await, "get")? != before {
        return Err("a refused or declined update changed the key".into());
    }
    Ok(())
}

/// Concurrent clients issue random reads, writes, compare-and-sets,
/// creates and deletes on three keys; the recorded history must be
/// linearizable.
pub async fn linearizable<S: Store + Clone + 'static>(c: &Case<S>) -> CheckResult {
    let keys = (0..3).map(|i| c.key(&format!("lin/{i}"))).collect();
    let history = record_history(c.store.clone(), keys, 8, c.ops_per_client, None).await?;
    check_history(&history)
}

/// Checks a history recorded by [`record_history`] with a one-minute
/// deadline; a timeout is a failure too.
///
/// # Errors
///
/// The violating key's operations (the first 40), or the timeout.
pub fn check_history(history: &[Operation]) -> CheckResult {
    match linearizability::check(history, Duration::from_secs(60)) {
        Verdict::Linearizable => Ok(()),
        Verdict::Unknown => Err(format!("checker timed out on {} operations", history.len())),
        Verdict::Violation { key, operations } => Err(format!(
            "history of key {key} is not linearizable ({} operations): {:?}",
            operations.len(),
            &operations[..operations.len().min(40)]
        )),
    }
}

/// Records the history of `clients` concurrent clients issuing random
/// reads, writes, compare-and-sets, creates and deletes on `keys`, each
/// until it has completed `ops_per_client` operations or `until` passes.
///
/// Built to run while a fault is injected: a write that fails with
/// [`StoreError::Indeterminate`] is recorded with an
/// [`Unknown`](KvOutput::Unknown) outcome (it may or may not have applied),
/// and an operation that fails with [`StoreError::Unavailable`] is left
/// out (nothing was applied) after a short pause.
///
/// # Errors
///
/// Any other store error, or a client that panicked.
pub async fn record_history<S: Store + Clone + 'static>(
    store: S,
    keys: Vec<Vec<u8>>,
    clients: usize,
    ops_per_client: usize,
    until: Option<Instant>,
) -> Result<Vec<Operation>, String> {
    let origin = Instant::now();
    let keys = Arc::new(keys);
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (s, keys) = (store.clone(), Arc::clone(&keys));
            tokio::spawn(async move {
                let mut history = Vec::with_capacity(ops_per_client.min(4096));
                let mut last_seen: BTreeMap<usize, u64> = BTreeMap::new();
                let mut rng = (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let n = keys.len() as u64;
                let mut seq = 0;
                while seq < ops_per_client && until.is_none_or(|u| Instant::now() < u) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = (rng % n) as usize;
                    let k = &keys[key];
                    let value = (client * 1_000_000 + seq) as u64;
                    seq += 1;
                    let call = origin.elapsed().as_nanos() as u64;
                    let (input, result) = match (rng >> 8) % 10 {
                        0..=2 => {
                            let result = s.get(k).await.map(|kv| {
                                if let Some(kv) = &kv {
                                    last_seen.insert(key, kv.mod_revision.get());
                                }
                                KvOutput::Value(
                                    kv.map(|kv| (decode_u64(&kv.value), kv.mod_revision.get())),
                                )
                            });
                            (KvInput::Get, result)
                        }
                        3..=4 => {
                            let o = s.put(k, &value.to_be_bytes(), PutOptions::new()).await;
                            (KvInput::Put(value), o.map(|o| write_output(&o)))
                        }
                        5..=7 => {
                            let expected = last_seen.get(&key).copied().unwrap_or(1);
                            let expect = Expect::Version(Version::new(expected));
                            let o = s
                                .put(
                                    k,
                                    &value.to_be_bytes(),
                                    PutOptions::new().with_expect(expect),
                                )
                                .await;
                            (
                                KvInput::CompareAndSet { expected, value },
                                o.map(|o| write_output(&o)),
                            )
                        }
                        8 => {
                            let expect = PutOptions::new().with_expect(Expect::Absent);
                            let o = s.put(k, &value.to_be_bytes(), expect).await;
                            (KvInput::Create(value), o.map(|o| write_output(&o)))
                        }
                        _ => {
                            let o = s.delete(k, Expect::Any).await.map(|o| {
                                KvOutput::Deleted(matches!(
                                    o,
                                    WriteOutcome::Committed { prev: Some(_), .. }
                                ))
                            });
                            (KvInput::Delete, o)
                        }
                    };
                    let (output, ret) = match result {
                        Ok(output) => (output, origin.elapsed().as_nanos() as u64),
                        Err(StoreError::Indeterminate { .. }) if input != KvInput::Get => {
                            (KvOutput::Unknown, u64::MAX)
                        }
                        Err(StoreError::Unavailable { .. } | StoreError::Indeterminate { .. }) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if rng % 3 == 0 {
                        // Interleave clients more than the scheduler would.
                        tokio::task::yield_now().await;
                    }
                    history.push(Operation {
                        client,
                        key: key as u64,
                        call,
                        ret,
                        input,
                        output,
                    });
                }
                Ok::<_, StoreError>(history)
            })
        })
        .collect();
    let mut history = Vec::new();
    for t in tasks {
        history.extend(
            t.await
                .map_err(|e| format!("client panicked: {e}"))?
                .map_err(|e| format!("client: {e}"))?,
        );
    }
    Ok(history)
}

/// The next watch event, or a failure if none comes within 10 seconds.
async fn next_event<W: Watch>(w: &mut W) -> Result<crate::store::WatchEvent, String> {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .map_err(|_| "watch stalled: no event within 10 s".to_string())?
        .map_err(|e| format!("watch: {e}"))
}

fn decode_u64(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(u64::MAX)
}

fn write_output(o: &WriteOutcome) -> KvOutput {
    match o {
        WriteOutcome::Committed { revision, .. } => KvOutput::Written(revision.get()),
        WriteOutcome::Conflict { .. } => KvOutput::Conflict,
    }
}
