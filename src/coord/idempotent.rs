use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::lease::LeaseOptions;
use super::queue::check_prefix;
use super::{CoordError, Fenced, FencingToken, Lease};
use crate::occ::Version;
use crate::store::{
    EventKind, Expect, KeySpan, LeaseId, PutOptions, Store, Watch, WriteOutcome, check_key,
};

/// What a claim record under an idempotency key says.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    /// A runner holds the claim (the key is attached to its lease).
    Running,
    /// The operation completed; its outcome, as JSON.
    Done {
        /// The claim's token.
        token: u64,
        /// The recorded outcome.
        outcome: serde_json::Value,
    },
}

/// The result of [`Idempotent::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completed<T> {
    /// The operation's outcome (this call's, or the recorded one).
    pub value: T,
    /// Whether this call ran the operation (`false`: an earlier run's
    /// outcome was returned).
    pub ran_here: bool,
    /// The token of the claim that ran it.
    pub token: FencingToken,
}

/// Runs an operation at most once per key, and returns the recorded
/// outcome to every repeat.
///
/// Retries are how distributed systems survive failures, and they make
/// operations run twice. Give the operation a key (a payment id, a request
/// id); then:
///
/// 1. the first caller **claims** the key: a record written only if absent
///    ([`Expect::Absent`]), attached to a [`Lease`], whose create revision
///    is the claim's [`FencingToken`];
/// 2. it runs the operation, passing the token (to fence the operation's
///    own writes at the resource), then **records** the outcome under the
///    key, only if its claim is still the current one;
/// 3. any later or concurrent caller waits for the record and returns the
///    recorded outcome without running anything;
/// 4. if the runner crashes, its lease expires, the claim vanishes, and the
///    next caller takes over with a **higher** token; if the old runner
///    wakes up, its recording is refused ([`CoordError::Fenced`]) and its
///    token is refused at the resource. A runner whose claim expired is
///    never allowed to record, even into an empty key
///    ([`CoordError::LeaseLost`]): a newer claim may have come and gone.
///
/// Among the outcomes that were successfully recorded there is exactly one
/// per key.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::coord::Idempotent;
/// use calm::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::coord::CoordError> {
/// let payments = Idempotent::new(MemoryStore::new(), "payments/", Duration::from_secs(30))?;
/// let first = payments.run("order-17", |_token| async { 4200u64 }).await?;
/// let retry = payments.run("order-17", |_token| async { 0u64 }).await?; // not run
/// assert!(first.ran_here && !retry.ran_here);
/// assert_eq!(retry.value, 4200);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Idempotent<S> {
    store: S,
    prefix: Vec<u8>,
    /// The lease options of each claim.
    lease: LeaseOptions,
}

impl<S: Store + Clone + 'static> Idempotent<S> {
    /// Records under `prefix`; a claim's lease lives `ttl` without renewal
    /// (it is renewed while the operation runs).
    ///
    /// # Errors
    ///
    /// [`CoordError::InvalidName`] for an empty or oversized prefix,
    /// [`CoordError::InvalidTtl`] for a zero TTL.
    pub fn new(store: S, prefix: impl Into<Vec<u8>>, ttl: Duration) -> Result<Self, CoordError> {
        Self::with_lease_options(store, prefix, LeaseOptions::new(ttl))
    }

    /// As [`new`](Idempotent::new), with full lease options (a manual clock
    /// in tests).
    ///
    /// # Errors
    ///
    /// As [`new`](Idempotent::new).
    pub fn with_lease_options(
        store: S,
        prefix: impl Into<Vec<u8>>,
        lease: LeaseOptions,
    ) -> Result<Self, CoordError> {
        let prefix = prefix.into();
        check_prefix(&prefix)?;
        if lease.ttl.is_zero() || lease.ttl > super::MAX_TTL {
            return Err(CoordError::InvalidTtl {
                reason: "a claim needs a time to live above zero and at most MAX_TTL",
            });
        }
        Ok(Self {
            store,
            prefix,
            lease,
        })
    }

    /// Runs `op` unless an outcome is recorded under `key` (then returns
    /// it), or waits for a concurrent run to finish or expire.
    ///
    /// `op` receives the claim's fencing token.
    ///
    /// # Errors
    ///
    /// [`CoordError::Fenced`] if this call's claim expired while `op` ran
    /// and another caller took over (its outcome was not recorded);
    /// [`CoordError::LeaseLost`] if this call's claim expired while `op`
    /// ran and the key is empty (its outcome was not recorded: a newer
    /// claim may have come and gone);
    /// [`CoordError::InvalidName`] for an empty key, [`CoordError::Store`]
    /// with an invalid-key error for an oversized one;
    /// [`CoordError::Record`] if the recorded outcome is not a `T`; a store
    /// error.
    ///
    /// # Cancel safety
    ///
    /// If dropped while `op` runs, the claim's lease is revoked (in a Tokio
    /// runtime) or expires, and a later call runs `op` again: whatever `op`
    /// did before being dropped must be fenced by its token or be
    /// harmless to repeat.
    pub async fn run<T, F, Fut>(&self, key: &str, op: F) -> Result<Completed<T>, CoordError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut k = self.prefix.clone();
        k.extend_from_slice(key.as_bytes());
        check_key(&k)?;
        if key.is_empty() {
            return Err(CoordError::InvalidName {
                reason: "the idempotency key must not be empty",
            });
        }
        // Until the key holds our claim: return a recorded outcome, wait
        // out a running claim, or claim an absent key.
        let (lease, revision) = loop {
            match self.store.get(&k).await? {
                Some(kv) => match serde_json::from_slice::<Record>(&kv.value)? {
                    Record::Done { token, outcome } => {
                        return Ok(Completed {
                            value: serde_json::from_value(outcome)?,
                            ran_here: false,
                            token: FencingToken::new(token),
                        });
                    }
                    Record::Running => self.wait_change(&k, kv.mod_revision).await?,
                },
                None => {
                    let lease = Lease::grant_with(self.store.clone(), self.lease.clone()).await?;
                    let running = serde_json::to_vec(&Record::Running)?;
                    let claim = self
                        .store
                        .put(
                            &k,
                            &running,
                            PutOptions::new()
                                .with_expect(Expect::Absent)
                                .with_lease(lease.id()),
                        )
                        .await?;
                    if let WriteOutcome::Committed { revision, .. } = claim {
                        break (lease, revision);
                    }
                    // Somebody claimed first: read their record.
                    lease.revoke().await?;
                }
            }
        };
        let token = FencingToken::from(revision);
        let value = op(token).await;
        let done = serde_json::to_vec(&Record::Done {
            token: token.get(),
            outcome: serde_json::to_value(&value)?,
        })?;
        let recorded = self.record(&k, &done, revision, token, lease.id()).await;
        // The record no longer hangs on the lease; if revoking fails, the
        // lease just expires, and the outcome stands.
        let _ = lease.revoke().await;
        recorded.map(|()| Completed {
            value,
            ran_here: true,
            token,
        })
    }

    /// Records the outcome without a lease (the record outlives the
    /// claim), only if our claim is still the key's value.
    ///
    /// Once our claim is gone (its lease ended) another caller may have
    /// claimed the key with a higher token and written at the resource,
    /// and its claim may be gone by now too: an empty key does not mean
    /// that nobody took over, so recording into it could store an outcome
    /// the resource has fenced out. Refuse instead.
    async fn record(
        &self,
        key: &[u8],
        done: &[u8],
        claim: Version,
        token: FencingToken,
        lease: LeaseId,
    ) -> Result<(), CoordError> {
        let expect = Expect::Version(claim);
        match self
            .store
            .put(key, done, PutOptions::new().with_expect(expect))
            .await?
        {
            WriteOutcome::Committed { .. } => Ok(()),
            // Another caller claimed the key after ours expired: its claim,
            // and token, are newer.
            WriteOutcome::Conflict { current: Some(kv) } => {
                Err(Fenced::new(token, FencingToken::from(kv.create_revision)).into())
            }
            WriteOutcome::Conflict { current: None } => Err(CoordError::LeaseLost { lease }),
        }
    }

    /// Waits until the record under `key` changes after `seen`.
    async fn wait_change(&self, key: &[u8], seen: Version) -> Result<(), CoordError> {
        let mut watch = self
            .store
            .watch(KeySpan::Key(key.to_vec()), seen.next())
            .await?;
        let event = watch.next().await?;
        debug_assert!(matches!(event.kind, EventKind::Put | EventKind::Delete));
        Ok(())
    }
}
