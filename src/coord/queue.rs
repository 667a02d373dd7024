//! The waiting line behind [`Election`](super::Election) and
//! [`Lock`](super::Lock), written once.
//!
//! Each candidate writes a key under the prefix, attached to its lease;
//! the store gives the key a create revision, and the candidate with the
//! lowest live create revision is first in line (leader, lock holder). The
//! create revision is also the fencing token: it is strictly larger for
//! every later candidate.
//!
//! A waiter does not watch the whole prefix (every release would wake
//! every waiter: a thundering herd). It watches only its **predecessor**,
//! the key with the largest create revision below its own. When that key
//! goes, only this waiter wakes, reads the line once, and either is first
//! or watches its new predecessor. A hand-off costs O(1) requests and
//! wakes one waiter.
//!
//! ```text
//! create rev:   33 (leader)   40 (waiter A)   41 (waiter B)
//! A watches 33, B watches 40.  33 is deleted -> only A wakes, A leads.
//! ```

use super::{CoordError, FencingToken, Lease};
use crate::occ::{RetryPolicy, Version};
use crate::store::{
    Compare, EventKind, KeySpan, KeyValue, MAX_KEY_LEN, Store, StoreError, Txn, TxnOp, TxnOpResult,
    Watch,
};

/// A place in line: the candidate's key and its create revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) key: Vec<u8>,
    pub(crate) rev: Version,
}

impl Ticket {
    pub(crate) fn token(&self) -> FencingToken {
        FencingToken::from(self.rev)
    }
}

/// Checks a line's prefix: non-empty, and short enough to hold a
/// candidate's key.
pub(crate) fn check_prefix(prefix: &[u8]) -> Result<(), CoordError> {
    if prefix.is_empty() {
        return Err(CoordError::InvalidName {
            reason: "the prefix must not be empty (it would contain every key)",
        });
    }
    if prefix.len() + 17 > MAX_KEY_LEN {
        return Err(CoordError::InvalidName {
            reason: "the prefix leaves no room for a candidate key",
        });
    }
    Ok(())
}

/// Takes a place in line as `lease` and, if `wait`, waits to be first;
/// without `wait`, leaves again at once unless already first. Returns the
/// ticket once first and verified (`None`: not first, and not waiting).
///
/// Cancel safe: if the future is dropped at any point, a background task
/// deletes the place it took (if it took one), so an abandoned or
/// timed-out wait leaves no key in line. One wait per lease and line at a
/// time (a lease has one key per line).
pub(crate) async fn take_turn<S: Store + Clone + 'static>(
    store: &S,
    prefix: &[u8],
    lease: &Lease<S>,
    value: &[u8],
    cap: Option<usize>,
    retry: &RetryPolicy,
    wait: bool,
) -> Result<Option<Ticket>, CoordError> {
    let mut place = Abandoned {
        store: store.clone(),
        key: key_of(prefix, lease),
        rev: None,
        armed: true,
    };
    let ticket = enqueue(store, prefix, lease, value, cap).await?;
    place.rev = Some(ticket.rev);
    if wait {
        wait_turn(store, prefix, &ticket, lease, retry).await?;
    } else {
        let (kvs, _) = line(store, prefix).await?;
        if kvs.first().map(|kv| kv.create_revision) != Some(ticket.rev) {
            leave(store, &ticket).await?;
            place.armed = false;
            return Ok(None);
        }
        verify(store, &ticket).await?;
    }
    place.armed = false;
    Ok(Some(ticket))
}

/// A place in line whose wait was abandoned: dropped while armed, it
/// deletes the key in the background (only the one it took, when its
/// create revision is known).
struct Abandoned<S: Store + Clone + 'static> {
    store: S,
    key: Vec<u8>,
    /// The key's create revision, once known.
    rev: Option<Version>,
    /// Cleared when the place is handed to the caller or already left.
    armed: bool,
}

impl<S: Store + Clone + 'static> Drop for Abandoned<S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the key ends with its lease
        };
        let (store, key, rev) = (self.store.clone(), std::mem::take(&mut self.key), self.rev);
        runtime.spawn(async move {
            let _ = match rev {
                Some(rev) => leave(&store, &Ticket { key, rev }).await,
                // The write that joins may still be in flight: delete
                // whatever it left under this lease's key.
                None => store
                    .delete(&key, crate::store::Expect::Any)
                    .await
                    .map(drop)
                    .map_err(CoordError::from),
            };
        });
    }
}

/// The key `lease` takes in the line under `prefix`.
fn key_of<S: Store + Clone + 'static>(prefix: &[u8], lease: &Lease<S>) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{:016x}", lease.id().get()).as_bytes());
    key
}

/// Joins the line as `lease` (idempotent: a lease has one key per line).
async fn enqueue<S: Store + Clone + 'static>(
    store: &S,
    prefix: &[u8],
    lease: &Lease<S>,
    value: &[u8],
    cap: Option<usize>,
) -> Result<Ticket, CoordError> {
    lease.check()?;
    let key = key_of(prefix, lease);
    let txn = Txn::new()
        .when(Compare::absent(&key))
        .then(TxnOp::Put {
            key: key.clone(),
            value: value.to_vec(),
            lease: Some(lease.id()),
        })
        .otherwise(TxnOp::get(&key));
    let out = store.txn(txn).await.map_err(|e| lease_error(e, lease))?;
    let rev = match out.results.first() {
        _ if out.succeeded => out.revision,
        Some(TxnOpResult::Get { kv: Some(kv) }) => kv.create_revision,
        // The key vanished between the compare and the read: only an
        // expired lease does that.
        _ => return Err(CoordError::LeaseLost { lease: lease.id() }),
    };
    let ticket = Ticket { key, rev };
    if let Some(cap) = cap {
        let ahead = store
            .range(prefix, None)
            .await?
            .kvs
            .iter()
            .filter(|kv| kv.create_revision < rev)
            .count();
        if ahead >= cap {
            let _ = store.delete(&ticket.key, crate::store::Expect::Any).await;
            return Err(CoordError::TooManyCandidates { cap });
        }
    }
    Ok(ticket)
}

/// Maps a store error to the lease's loss when that is what it means.
fn lease_error<S: Store + Clone + 'static>(e: StoreError, lease: &Lease<S>) -> CoordError {
    if e.is_lease_lost() {
        CoordError::LeaseLost { lease: lease.id() }
    } else {
        e.into()
    }
}

/// The line as it is: every candidate in create-revision order, and the
/// store revision of the read.
pub(crate) async fn line<S: Store>(
    store: &S,
    prefix: &[u8],
) -> Result<(Vec<KeyValue>, Version), StoreError> {
    let r = store.range(prefix, None).await?;
    let mut kvs = r.kvs;
    kvs.sort_by_key(|kv| kv.create_revision);
    Ok((kvs, r.revision))
}

/// Waits until `ticket` is first in line, watching only its predecessor.
/// Returns once first and verified; retryable store errors are retried
/// with jittered backoff under `retry`.
async fn wait_turn<S: Store + Clone + 'static>(
    store: &S,
    prefix: &[u8],
    ticket: &Ticket,
    lease: &Lease<S>,
    retry: &RetryPolicy,
) -> Result<(), CoordError> {
    let mut attempts = retry.start();
    loop {
        lease.check()?;
        match wait_step(store, prefix, ticket, lease).await {
            Ok(true) => {
                verify(store, ticket).await?;
                return Ok(());
            }
            Ok(false) => attempts = retry.start(),
            Err(CoordError::Store(e))
                if e.is_retryable() || matches!(e, StoreError::Compacted { .. }) =>
            {
                if attempts.retry().await.is_err() {
                    return Err(e.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// One look at the line: `Ok(true)` if first; `Ok(false)` after the
/// predecessor went away (look again).
async fn wait_step<S: Store + Clone + 'static>(
    store: &S,
    prefix: &[u8],
    ticket: &Ticket,
    lease: &Lease<S>,
) -> Result<bool, CoordError> {
    let (kvs, revision) = line(store, prefix).await?;
    if !kvs
        .iter()
        .any(|kv| kv.key == ticket.key && kv.create_revision == ticket.rev)
    {
        // Our key is gone: our lease ended, or someone resigned for us.
        return Err(if lease.is_alive() {
            CoordError::NotLeader {
                token: ticket.token(),
            }
        } else {
            CoordError::LeaseLost { lease: lease.id() }
        });
    }
    let Some(pred) = kvs.iter().rev().find(|kv| kv.create_revision < ticket.rev) else {
        return Ok(true);
    };
    // Watch from just after the read: a deletion after it cannot be missed.
    let mut watch = store
        .watch(KeySpan::Key(pred.key.clone()), revision.next())
        .await?;
    loop {
        tokio::select! {
            event = watch.next() => {
                let event = event?;
                if event.kind == EventKind::Delete {
                    return Ok(false);
                }
                // A put is the predecessor proclaiming: keep waiting.
            }
            _ = lease.lost() => return Err(CoordError::LeaseLost { lease: lease.id() }),
        }
    }
}

/// Checks, in one transaction, that the ticket's key still exists with its
/// create revision: the holder is still first (keys ahead of it can only
/// have gone, never come back).
pub(crate) async fn verify<S: Store>(store: &S, ticket: &Ticket) -> Result<(), CoordError> {
    let txn = Txn::new().when(Compare::create_revision(
        &ticket.key,
        crate::store::CompareOp::Equal,
        ticket.rev,
    ));
    if store.txn(txn).await?.succeeded {
        Ok(())
    } else {
        Err(CoordError::NotLeader {
            token: ticket.token(),
        })
    }
}

/// Completes when the store ends `ticket`: its key deleted (released, or
/// its lease ended) or replaced. Follows the key with a watch; a watch
/// that fails is started again after a fresh check.
pub(crate) async fn ended<S: Store>(store: &S, ticket: &Ticket) -> Result<(), CoordError> {
    let mut failures = 0u32;
    loop {
        let followed = async {
            let check = Txn::new().when(Compare::create_revision(
                &ticket.key,
                crate::store::CompareOp::Equal,
                ticket.rev,
            ));
            let now = store.txn(check).await?;
            if !now.succeeded {
                return Ok(());
            }
            let mut watch = store
                .watch(KeySpan::Key(ticket.key.clone()), now.revision.next())
                .await?;
            loop {
                let event = watch.next().await?;
                if event.kind == EventKind::Delete || event.kv.create_revision != ticket.rev {
                    return Ok::<_, StoreError>(());
                }
            }
        };
        match followed.await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_retryable() || matches!(e, StoreError::Compacted { .. }) => {
                // A pause before checking again, growing while the store
                // stays unreachable.
                let pause = RetryPolicy::default().backoff(failures);
                failures = failures.saturating_add(1);
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Leaves the line (resign, unlock), only if the key is still ours.
pub(crate) async fn leave<S: Store>(store: &S, ticket: &Ticket) -> Result<(), CoordError> {
    let txn = Txn::new()
        .when(Compare::create_revision(
            &ticket.key,
            crate::store::CompareOp::Equal,
            ticket.rev,
        ))
        .then(TxnOp::delete(&ticket.key));
    store.txn(txn).await?;
    Ok(())
}
