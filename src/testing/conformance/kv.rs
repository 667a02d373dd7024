//! The key-value checks: puts, gets, `Expect`, revisions, ranges,
//! transactions, invalid input and dropped writes.

use std::time::Duration;

use super::{Case, CheckResult, committed, store};
use crate::store::{
    Compare, CompareOp, Expect, MAX_KEY_LEN, MAX_VALUE_LEN, PutOptions, Store, StoreError, Txn,
    TxnOp, TxnOpResult, WriteOutcome,
};

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
