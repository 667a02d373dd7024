use std::future::Future;
use std::pin::pin;

use tokio::sync::watch;

use super::{CoordError, Election, FencingToken, Leadership, Lease, LeaseOptions};
use crate::occ::RetryPolicy;
use crate::store::Store;

/// Where a [`LeaderLoop`] stands; follow it with [`LeaderLoop::roles`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// Granting a lease and waiting in line to lead (after a start, a lost
    /// term, or a failure being backed off).
    Candidate,
    /// Leading: the user's future runs with this term's token.
    Leading {
        /// The term's fencing token.
        token: FencingToken,
    },
    /// The loop has returned.
    Stopped,
}

/// How a [`LeaderLoop::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "says whether the leader's work finished or the loop was shut down"]
pub enum Exit<T> {
    /// The shutdown future completed; any term was resigned.
    Shutdown,
    /// The leader's future returned this (its term was then resigned).
    Finished(T),
}

/// Leadership as services run it (client-go's `RunOrDie`, Curator's
/// `LeaderSelector`): campaign, run the leader's work with the term while
/// it lasts, cancel the work the moment the term is lost, campaign again,
/// and stop cleanly on shutdown.
///
/// `lead` makes the work's future from the term (`|term| async move {
/// ... }`); the future owns what it uses, so the loop can be spawned.
///
/// Each round grants a fresh [`Lease`] (a lost lease never comes back),
/// campaigns with it, and, once leading, runs `lead(term)`. The work's
/// future is dropped as soon as the term ends: its key leaves the store
/// ([`Leadership::ended`], seen through a watch the moment the store
/// revokes or expires the lease), or the lease is lost ([`Lease::lost`]:
/// renewals failed for a whole TTL, after which the store may have
/// ended it). A pause can still make
/// the work act after that; give [`Leadership::token`] to every write so
/// a fence refuses it.
///
/// Store failures while granting or campaigning are backed off (the
/// loop's [`RetryPolicy`] backoff, with jitter, so candidates do not
/// stampede) and retried until shutdown; only errors that retrying cannot
/// fix end the loop.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::coord::{Election, Exit, LeaseOptions, Role};
/// use calm::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::coord::CoordError> {
/// let store = MemoryStore::new();
/// let election = Election::new(store, "jobs/leader/")?;
/// let leader = election.leader_loop(b"node-a", LeaseOptions::new(Duration::from_secs(10)));
/// let mut roles = leader.roles();
///
/// // The work runs while leading; here it finishes after one step.
/// let exit = leader
///     .run(std::future::pending::<()>(), async |term| {
///         term.token() // do the leader's work, fenced by this token
///     })
///     .await?;
/// assert!(matches!(exit, Exit::Finished(_)));
/// assert_eq!(*roles.borrow_and_update(), Role::Stopped);
/// # Ok(())
/// # }
/// ```
#[must_use = "a leader loop does nothing until run"]
pub struct LeaderLoop<S> {
    election: Election<S>,
    value: Vec<u8>,
    lease: LeaseOptions,
    backoff: RetryPolicy,
    role: watch::Sender<Role>,
}

impl<S: Store + Clone + 'static> Election<S> {
    /// A run-loop that campaigns in this election as `value`, each term on
    /// a lease granted with `lease`.
    pub fn leader_loop(&self, value: impl Into<Vec<u8>>, lease: LeaseOptions) -> LeaderLoop<S> {
        LeaderLoop {
            election: self.clone(),
            value: value.into(),
            lease,
            backoff: RetryPolicy::default(),
            role: watch::Sender::new(Role::Candidate),
        }
    }
}

impl<S: Store + Clone + 'static> LeaderLoop<S> {
    /// Sets the backoff after a failed grant or campaign (its
    /// [`backoff`](RetryPolicy::backoff), growing with consecutive
    /// failures; its attempt and time limits do not apply: the loop
    /// retries until shutdown).
    pub fn with_backoff(mut self, policy: RetryPolicy) -> Self {
        self.backoff = policy;
        self
    }

    /// The loop's role now and at every change (a receiver may skip a
    /// role that changed again before it looked).
    pub fn roles(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// Runs until `shutdown` completes or the leader's work finishes:
    /// campaigns, calls `lead` with each term won, drops the work's future
    /// when the term's lease is lost, and campaigns again.
    ///
    /// # Errors
    ///
    /// An error that retrying cannot clear (for example
    /// [`CoordError::InvalidTtl`] in the lease options, or a closed
    /// store). Transient store errors and lost terms are retried.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the work and the lease (whose drop
    /// revokes it in the background, ending the term); to resign and wait
    /// until it is done, complete `shutdown` instead.
    // Some bindings are only logged.
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub async fn run<F, W>(
        self,
        shutdown: impl Future<Output = ()>,
        mut lead: F,
    ) -> Result<Exit<W::Output>, CoordError>
    where
        F: FnMut(Leadership<S>) -> W,
        W: Future,
    {
        let mut shutdown = pin!(shutdown);
        let mut failures = 0u32;
        let exit = loop {
            self.role.send_replace(Role::Candidate);
            let store = self.election.store().clone();
            let won = tokio::select! {
                biased;
                () = &mut shutdown => break Ok(Exit::Shutdown),
                won = self.term(store) => won,
            };
            let (lease, term) = match won {
                Ok(won) => won,
                Err(e) if e.is_retryable() || e.is_lost_grant() || is_busy(&e) => {
                    crate::trace::warn!(
                        error = &e as &(dyn std::error::Error + 'static),
                        failures,
                        "leader loop: campaign failed; backing off"
                    );
                    let pause = self.backoff.backoff(failures);
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break Ok(Exit::Shutdown),
                        () = tokio::time::sleep(pause) => continue,
                    }
                }
                Err(e) => break Err(e),
            };
            failures = 0;
            let token = term.token();
            crate::trace::info!(%token, "leader loop: leading");
            self.role.send_replace(Role::Leading { token });
            let outcome = tokio::select! {
                biased;
                () = &mut shutdown => Some(Exit::Shutdown),
                loss = lease.lost() => {
                    crate::trace::warn!(%token, %loss, "leader loop: lease lost; work cancelled");
                    None
                }
                Ok(()) = term.ended() => {
                    crate::trace::warn!(%token, "leader loop: term ended in the store; work cancelled");
                    None
                }
                out = lead(term.clone()) => Some(Exit::Finished(out)),
            };
            let Some(exit) = outcome else {
                continue; // the lost lease is dropped; campaign anew
            };
            // Best effort: if these fail, the term ends with the lease's TTL.
            let _ = term.resign().await;
            let _ = lease.revoke().await;
            break Ok(exit);
        };
        self.role.send_replace(Role::Stopped);
        exit
    }

    /// Grants a lease and campaigns with it.
    async fn term(&self, store: S) -> Result<(Lease<S>, Leadership<S>), CoordError> {
        let lease = Lease::grant_with(store, self.lease.clone()).await?;
        let term = self.election.campaign(&lease, &self.value).await?;
        Ok((lease, term))
    }
}

/// Whether the election was full: waiting for room is the same as backing
/// off after a failure.
fn is_busy(e: &CoordError) -> bool {
    matches!(e, CoordError::TooManyCandidates { .. })
}

impl<S> std::fmt::Debug for LeaderLoop<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderLoop")
            .field("value", &self.value)
            .field("ttl", &self.lease.ttl)
            .field("role", &*self.role.borrow())
            .finish_non_exhaustive()
    }
}
