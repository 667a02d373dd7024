use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use super::queue::{self, Ticket};
use super::{CoordError, FencingToken, Lease, LeaseState};
use crate::occ::RetryPolicy;
use crate::store::{Compare, CompareOp, KeySpan, Store, Txn, TxnOp, Watch};

/// Leader election on a [`Store`]: the candidate with the oldest key under
/// the prefix leads, and its key's create revision is its fencing token.
///
/// The recipe is etcd's, with its known gaps closed:
///
/// - [`campaign`](Election::campaign) writes a key attached to the
///   candidate's [`Lease`] and waits, watching only its predecessor (one
///   release wakes one waiter; see the queue notes in the module docs);
/// - before returning, `campaign` **verifies** in a transaction that the
///   key still exists with its create revision, so a candidate whose lease
///   expired while it waited is told so instead of crowned (etcd's Go
///   `Campaign` skipped this, etcd#11456);
/// - the leader gets a [`FencingToken`]: hand it to every write the leader
///   makes, and check it at the resource ([`Fence`](super::Fence),
///   [`StoreFence`](super::StoreFence)). Leadership without a fence only
///   gives liveness;
/// - [`Leadership::verify`] re-checks before acting;
///   [`observe`](Election::observe) streams leader changes and ends with an
///   error, never silently.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::coord::{Election, Lease};
/// use calm::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::coord::CoordError> {
/// let store = MemoryStore::new();
/// let election = Election::new(store.clone(), "jobs/leader/")?;
/// let lease = Lease::grant(store.clone(), Duration::from_secs(10)).await?;
/// let term = election.campaign(&lease, b"node-a").await?;
/// term.verify().await?;                       // before acting
/// println!("leading with token {}", term.token());
/// term.resign().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Election<S> {
    store: S,
    prefix: Vec<u8>,
    /// At most this many candidates wait; more are refused.
    cap: Option<usize>,
    /// Retries of transient store errors while waiting.
    retry: RetryPolicy,
}

/// The current leader as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leader's key.
    pub key: Vec<u8>,
    /// What the leader proclaimed.
    pub value: Vec<u8>,
    /// The leader's fencing token (its key's create revision).
    pub token: FencingToken,
}

impl<S: Store + Clone + 'static> Election<S> {
    /// An election among the keys under `prefix`.
    ///
    /// # Errors
    ///
    /// [`CoordError::InvalidName`] for an empty or oversized prefix.
    pub fn new(store: S, prefix: impl Into<Vec<u8>>) -> Result<Self, CoordError> {
        let prefix = prefix.into();
        queue::check_prefix(&prefix)?;
        Ok(Self {
            store,
            prefix,
            cap: None,
            retry: RetryPolicy::default().with_max_attempts(20),
        })
    }

    /// The store the election runs on.
    pub(super) fn store(&self) -> &S {
        &self.store
    }

    /// Refuses to join when `cap` candidates already wait ahead.
    #[must_use = "the builder returns the configured value"]
    pub fn with_max_candidates(mut self, cap: usize) -> Self {
        self.cap = Some(cap);
        self
    }

    /// Sets how transient store errors are retried while waiting.
    #[must_use = "the builder returns the configured value"]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Joins the election as `lease` and waits to lead; returns the term
    /// once leading **and verified**.
    ///
    /// # Errors
    ///
    /// [`CoordError::LeaseLost`] if the lease ends while waiting,
    /// [`CoordError::TooManyCandidates`] over the cap, or a store error
    /// that did not clear after retries.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped while waiting (a timeout, a `select!`), the
    /// candidate's key is deleted in the background, so no abandoned
    /// candidate can become leader with nobody acting. One campaign per
    /// lease at a time.
    pub async fn campaign(
        &self,
        lease: &Lease<S>,
        value: &[u8],
    ) -> Result<Leadership<S>, CoordError> {
        let ticket = queue::take_turn(
            &self.store,
            &self.prefix,
            lease,
            value,
            self.cap,
            &self.retry,
            true,
        )
        .await?
        .ok_or(CoordError::LeaseLost { lease: lease.id() })?;
        Ok(Leadership {
            store: self.store.clone(),
            ticket,
            lease: lease.status(),
            resigned: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The current leader, if any.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, CoordError> {
        let (kvs, _) = queue::line(&self.store, &self.prefix).await?;
        Ok(kvs.into_iter().next().map(|kv| LeaderInfo {
            key: kv.key,
            value: kv.value,
            token: kv.create_revision.into(),
        }))
    }

    /// Follows the leader: the stream yields the leader as it is now, then
    /// every change (new leader, new proclaimed value, no leader).
    ///
    /// # Errors
    ///
    /// A store error starting the watch.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it before it returns starts nothing.
    pub async fn observe(&self) -> Result<Observer<S>, CoordError> {
        let (kvs, revision) = queue::line(&self.store, &self.prefix).await?;
        let watch = self
            .store
            .watch(KeySpan::Prefix(self.prefix.clone()), revision.next())
            .await?;
        Ok(Observer {
            election: self.clone(),
            watch,
            pending: Some(kvs.into_iter().next().map(leader_info)),
            current: None,
        })
    }
}

fn leader_info(kv: crate::store::KeyValue) -> LeaderInfo {
    LeaderInfo {
        key: kv.key,
        value: kv.value,
        token: kv.create_revision.into(),
    }
}

/// A term of leadership won by [`Election::campaign`].
///
/// Dropping it does not resign: the term lasts as long as the lease.
/// Clones share the term: resigning one ends it for all.
#[derive(Debug, Clone)]
#[must_use = "a term is a claim to act as leader: use its token, or resign it"]
pub struct Leadership<S> {
    store: S,
    ticket: Ticket,
    /// The term's lease as its keeper sees it.
    lease: watch::Receiver<LeaseState>,
    /// Set by `resign`.
    resigned: Arc<AtomicBool>,
}

impl<S: Store + Clone + 'static> Leadership<S> {
    /// The term's fencing token: the leader key's create revision.
    pub fn token(&self) -> FencingToken {
        self.ticket.token()
    }

    /// The leader's key.
    pub fn key(&self) -> &[u8] {
        &self.ticket.key
    }

    /// Whether this process may still act as leader, as far as it knows
    /// without asking the store: the term was not resigned and its lease's
    /// last renewal succeeded ([`LeaseState::Alive`]). Costs a memory read,
    /// so it fits before every step of a loop.
    ///
    /// `false` is final except while the lease is
    /// [`Suspended`](LeaseState::Suspended) (renewals failing; the store
    /// may already have ended the term): it turns `true` again if a
    /// renewal gets through. `true` can be stale (this process may have
    /// been paused since), which is why writes carry the
    /// [`token`](Leadership::token) to a fence and why
    /// [`verify`](Leadership::verify) asks the store.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use calm::coord::{Election, Lease};
    /// use calm::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::coord::CoordError> {
    /// let store = MemoryStore::new();
    /// let election = Election::new(store.clone(), "jobs/leader/")?;
    /// let lease = Lease::grant(store, Duration::from_secs(10)).await?;
    /// let term = election.campaign(&lease, b"node-a").await?;
    /// assert!(term.is_leading());
    /// lease.revoke().await?;
    /// assert!(!term.is_leading());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_leading(&self) -> bool {
        !self.resigned.load(Ordering::Acquire) && matches!(*self.lease.borrow(), LeaseState::Alive)
    }

    /// Completes when the store ends this term: its key is deleted
    /// (resigned, or its lease expired or was revoked) or replaced. Store
    /// failures while following it are retried with backoff; this does
    /// not decide that an unreachable store ended the term (the lease's
    /// keeper does, see [`Lease::lost`]).
    ///
    /// # Errors
    ///
    /// A store error that retrying cannot clear.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads and watches.
    pub async fn ended(&self) -> Result<(), CoordError> {
        queue::ended(&self.store, &self.ticket).await
    }

    /// The term's lease state, as its keeper last saw it.
    pub fn lease_state(&self) -> LeaseState {
        self.lease.borrow().clone()
    }

    /// Checks, in one transaction, that this term is still current (its key
    /// exists with its create revision). Call it before acting; pass the
    /// token to the resource as well, since a pause can follow the check.
    ///
    /// # Errors
    ///
    /// [`CoordError::NotLeader`] if the term ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn verify(&self) -> Result<(), CoordError> {
        queue::verify(&self.store, &self.ticket).await
    }

    /// Publishes a new value under the leader key, if still leader.
    ///
    /// # Errors
    ///
    /// [`CoordError::NotLeader`] if the term ended.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::txn`].
    pub async fn proclaim(&self, value: &[u8]) -> Result<(), CoordError> {
        let out = self
            .store
            .txn(
                Txn::new()
                    .when(Compare::create_revision(
                        &self.ticket.key,
                        CompareOp::Equal,
                        self.ticket.rev,
                    ))
                    .then(TxnOp::get(&self.ticket.key)),
            )
            .await?;
        let lease = match out.results.first() {
            Some(crate::store::TxnOpResult::Get { kv: Some(kv) }) if out.succeeded => kv.lease,
            _ => {
                return Err(CoordError::NotLeader {
                    token: self.token(),
                });
            }
        };
        let put = Txn::new()
            .when(Compare::create_revision(
                &self.ticket.key,
                CompareOp::Equal,
                self.ticket.rev,
            ))
            .then(TxnOp::Put {
                key: self.ticket.key.clone(),
                value: value.to_vec(),
                lease,
            });
        if self.store.txn(put).await?.succeeded {
            Ok(())
        } else {
            Err(CoordError::NotLeader {
                token: self.token(),
            })
        }
    }

    /// Ends the term now (deletes the leader key if it is still this
    /// term's), waking the next candidate.
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::txn`]; if it never reaches the store, the term ends with
    /// the lease.
    pub async fn resign(self) -> Result<(), CoordError> {
        self.resigned.store(true, Ordering::Release);
        queue::leave(&self.store, &self.ticket).await
    }
}

/// A stream of leader changes from [`Election::observe`].
pub struct Observer<S: Store> {
    election: Election<S>,
    watch: S::Watch,
    /// A change read but not yet returned.
    pending: Option<Option<LeaderInfo>>,
    /// The leader last returned.
    current: Option<Option<LeaderInfo>>,
}

impl<S: Store + Clone + 'static> Observer<S> {
    /// The next leader (or `None`: nobody leads), different from the last
    /// one returned.
    ///
    /// # Errors
    ///
    /// [`CoordError::ObserveEnded`] when the watch can no longer follow
    /// (history compacted, store closed); observe again to resume.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change is consumed only when returned.
    pub async fn next(&mut self) -> Result<Option<LeaderInfo>, CoordError> {
        loop {
            if let Some(leader) = self.pending.take() {
                if self.current.as_ref() != Some(&leader) {
                    self.current = Some(leader.clone());
                    return Ok(leader);
                }
            }
            self.watch.next().await.map_err(CoordError::ObserveEnded)?;
            self.pending = Some(self.election.leader().await?);
        }
    }
}
