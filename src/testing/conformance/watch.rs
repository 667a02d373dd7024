//! The watch checks: replay from a revision, compaction, and a watch
//! that ends with its store.

use std::time::Duration;

use super::{Case, CheckResult, committed, next_event, store};
use crate::occ::Version;
use crate::store::{EventKind, Expect, KeySpan, PutOptions, Store, StoreError, Watch};

/// A watch does not keep its store alive: given the only handle of a
/// store, starts a watch, drops the store, and expects the watch to end
/// with [`StoreError::Closed`] (not hang). Not in [`checks`](super::checks), which share
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
