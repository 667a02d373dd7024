//! Many writers at once: `merge_into` and `Typed::update` under
//! contention.

use std::sync::Arc;

use super::{Case, CheckResult, store};
use crate::GCounter;
use crate::causal::ReplicaId;
use crate::store::{Store, StoreError, StoreExt, Typed, UpdateError};

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
