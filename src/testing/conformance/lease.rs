//! The lease checks: expiry, keep-alive and revocation.

use std::time::Duration;

use super::{Case, CheckResult, committed, next_event, store};
use crate::occ::Version;
use crate::store::{EventKind, KeySpan, PutOptions, Store, StoreError};

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
