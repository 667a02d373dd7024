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

/// Joins the line as `lease` (idempotent: a lease has one key per line).
pub(crate) async fn enqueue<S: Store + Clone + 'static>(
    store: &S,
    prefix: &[u8],
    lease: &Lease<S>,
    value: &[u8],
    cap: Option<usize>,
) -> Result<Ticket, CoordError> {
    lease.check()?;
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{:016x}", lease.id().get()).as_bytes());
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
pub(crate) async fn wait_turn<S: Store + Clone + 'static>(
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
