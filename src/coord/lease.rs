use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::CoordError;
use crate::store::{Clock, LeaseId, Store, StoreError, SystemClock};

/// Why a [`Lease`] ended.
///
/// A lease is declared lost the moment its deadline passes, even with a
/// renewal still in flight (`Unreachable`); if that renewal's answer then
/// says the store had already ended the lease, the loss is corrected once
/// to `Expired` (the TTL was shorter than a round trip, or the process
/// was paused). Either way the lease never comes back.
///
/// Two losses are equal when they are of the same kind (the cause of an
/// `Unreachable` is for people and logs, not for comparisons).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LeaseLoss {
    /// The store said the lease is gone (it expired by the store's clock,
    /// or someone revoked it).
    Expired,
    /// Keep-alives could not reach the store for a whole TTL, so the
    /// store may have expired it: the holder must assume it did.
    Unreachable {
        /// The last renewal's error (`None`: renewals hung until the
        /// deadline passed).
        cause: Option<Arc<StoreError>>,
    },
    /// This process revoked it.
    Revoked,
}

impl PartialEq for LeaseLoss {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl Eq for LeaseLoss {}

impl std::fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseLoss::Expired => f.write_str("the store ended it"),
            LeaseLoss::Unreachable { cause: Some(e) } => {
                // The whole chain: this is a report, not an error link.
                f.write_str("the store was unreachable for a whole TTL (last error: ")?;
                crate::error::write_chain(f, &**e)?;
                f.write_str(")")
            }
            LeaseLoss::Unreachable { cause: None } => {
                f.write_str("the store did not answer for a whole TTL")
            }
            LeaseLoss::Revoked => f.write_str("this process revoked it"),
        }
    }
}

/// Where a [`Lease`] stands, as its keeper last saw it.
///
/// Two states are equal when they are of the same kind (and, suspended,
/// with as many failures).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LeaseState {
    /// The last renewal succeeded.
    Alive,
    /// Renewals are failing, but a TTL has not yet passed since the last
    /// good one (Curator's SUSPENDED): the lease may still be alive, or the
    /// store may already have ended it. Pause work that needs it; go on at
    /// `Alive`, give up at `Lost`.
    Suspended {
        /// Renewals failed in a row.
        failures: u32,
        /// The last one's error.
        cause: Arc<StoreError>,
    },
    /// The lease is over; it never comes back.
    Lost(LeaseLoss),
}

impl PartialEq for LeaseState {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (LeaseState::Alive, LeaseState::Alive) => true,
            (
                LeaseState::Suspended { failures: a, .. },
                LeaseState::Suspended { failures: b, .. },
            ) => a == b,
            (LeaseState::Lost(a), LeaseState::Lost(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for LeaseState {}

/// Settings of a [`Lease`].
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to Lease::grant_with"]
pub struct LeaseOptions {
    /// The time to live asked of the store.
    pub ttl: Duration,
    /// Renew after this fraction of the TTL has passed (default 1/3: two
    /// renewals can fail before the lease is in danger).
    pub renew_fraction: f64,
    /// The clock that paces renewals and, when the store is unreachable,
    /// decides that the lease must be assumed lost. Expiry itself is
    /// always judged by the store.
    pub clock: Arc<dyn Clock>,
}

impl LeaseOptions {
    /// A TTL, renewing every third of it, on the system clock.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            renew_fraction: 1.0 / 3.0,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// Sets the clock (use the store's manual clock in tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets when to renew, as a fraction of the TTL in `(0, 1)`.
    pub fn with_renew_fraction(mut self, fraction: f64) -> Self {
        self.renew_fraction = fraction;
        self
    }
}

/// The largest TTL calm asks for (a day): beyond that, "lease" no longer
/// means liveness.
pub const MAX_TTL: Duration = crate::store::MAX_LEASE_TTL;

/// A session: a lease kept alive in the background, with a loud signal
/// when it is lost.
///
/// A lease gives **liveness**, not safety: when its holder stops (crash,
/// pause, partition) the store ends the lease after its TTL and others may
/// take over. The holder learns of the loss through
/// [`lost`](Lease::lost) / [`is_alive`](Lease::is_alive) and must stop
/// acting; because it may be paused and learn too late, everything it does
/// must also be fenced ([`Fence`](super::Fence)).
///
/// Renewals run in a Tokio task every third of the TTL. If the store says
/// the lease is gone, or cannot be reached for a whole TTL (measured from
/// the sending of the last renewal that succeeded, on this process's
/// monotonic clock), the lease is declared lost and stays lost.
///
/// Dropping a `Lease` stops the renewals and, inside a Tokio runtime,
/// revokes it in the background (best effort); otherwise it expires after
/// its TTL. Call [`revoke`](Lease::revoke) to end it and know that it
/// ended.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::coord::Lease;
/// use calm::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::coord::CoordError> {
/// let lease = Lease::grant(MemoryStore::new(), Duration::from_secs(10)).await?;
/// assert!(lease.is_alive());
/// lease.check()?; // before every action taken on the lease's behalf
/// lease.revoke().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a lease revokes it (best effort)"]
pub struct Lease<S: Store + Clone + 'static> {
    store: S,
    id: LeaseId,
    ttl: Duration,
    /// The keeper's view of the lease. Written by the keeper.
    status: watch::Receiver<LeaseState>,
    /// Lets `revoke` mark the lease lost itself.
    status_tx: Arc<watch::Sender<LeaseState>>,
    /// The renewal task.
    keeper: Option<tokio::task::JoinHandle<()>>,
}

impl<S: Store + Clone + 'static> Lease<S> {
    /// Grants a lease of `ttl` on the system clock and starts keeping it
    /// alive in a Tokio task.
    ///
    /// # Errors
    ///
    /// [`CoordError::InvalidTtl`] for a zero TTL or one above [`MAX_TTL`],
    /// [`CoordError::NoRuntime`] outside a Tokio runtime (checked before
    /// anything is granted), or a store error.
    ///
    /// # Cancel safety
    ///
    /// Dropping it before it returns may leave a lease granted that nobody
    /// renews; it expires after `ttl`.
    pub async fn grant(store: S, ttl: Duration) -> Result<Self, CoordError> {
        Self::grant_with(store, LeaseOptions::new(ttl)).await
    }

    /// As [`grant`](Lease::grant), with options.
    ///
    /// # Errors
    ///
    /// As [`grant`](Lease::grant), plus [`CoordError::InvalidTtl`] for a
    /// renew fraction outside `(0, 1)`.
    ///
    /// # Cancel safety
    ///
    /// As [`grant`](Lease::grant).
    pub async fn grant_with(store: S, options: LeaseOptions) -> Result<Self, CoordError> {
        if options.ttl.is_zero() {
            return Err(CoordError::InvalidTtl {
                reason: "a lease needs a positive time to live",
            });
        }
        if options.ttl > MAX_TTL {
            return Err(CoordError::InvalidTtl {
                reason: "time to live above one day (MAX_TTL)",
            });
        }
        if !(options.renew_fraction > 0.0 && options.renew_fraction < 1.0) {
            return Err(CoordError::InvalidTtl {
                reason: "renew fraction must be strictly between 0 and 1",
            });
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| CoordError::NoRuntime)?;
        let sent = options.clock.now();
        let grant = store.grant(options.ttl).await?;
        let (tx, rx) = watch::channel(LeaseState::Alive);
        let tx = Arc::new(tx);
        let keeper = runtime.spawn(keep_alive(
            store.clone(),
            grant.id,
            grant.ttl,
            options.renew_fraction,
            options.clock,
            sent,
            Arc::clone(&tx),
        ));
        Ok(Self {
            store,
            id: grant.id,
            ttl: grant.ttl,
            status: rx,
            status_tx: tx,
            keeper: Some(keeper),
        })
    }

    /// The lease's id in the store.
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// The TTL the store granted.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The store the lease lives in.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Whether the lease is still believed alive (renewing, or suspended
    /// with time left).
    pub fn is_alive(&self) -> bool {
        !matches!(*self.status.borrow(), LeaseState::Lost(_))
    }

    /// A receiver of the keeper's view, for grants that outlive a borrow
    /// of the lease (a term's synchronous "still leader?").
    pub(super) fn status(&self) -> watch::Receiver<LeaseState> {
        self.status.clone()
    }

    /// Where the lease stands.
    pub fn state(&self) -> LeaseState {
        self.status.borrow().clone()
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<LeaseLoss> {
        match &*self.status.borrow() {
            LeaseState::Lost(loss) => Some(loss.clone()),
            _ => None,
        }
    }

    /// Completes when the lease's state is no longer `seen`; returns the
    /// new state (observe Alive → Suspended → Alive or Lost).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use calm::coord::{Lease, LeaseState};
    /// use calm::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::coord::CoordError> {
    /// let store = MemoryStore::new();
    /// let lease = Lease::grant(store.clone(), Duration::from_secs(10)).await?;
    /// assert_eq!(lease.state(), LeaseState::Alive);
    /// // Someone ends the lease behind our back; the keeper notices at its
    /// // next renewal.
    /// calm::store::Store::revoke(&store, lease.id()).await?;
    /// let next = lease.state_change(&LeaseState::Alive).await;
    /// assert!(matches!(next, LeaseState::Lost(_)));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn state_change(&self, seen: &LeaseState) -> LeaseState {
        let mut rx = self.status.clone();
        loop {
            let now = rx.borrow_and_update().clone();
            if &now != seen {
                return now;
            }
            if rx.changed().await.is_err() {
                return self.state();
            }
        }
    }

    /// `Ok` while the lease is believed alive.
    ///
    /// # Errors
    ///
    /// [`CoordError::LeaseLost`] once it is lost.
    pub fn check(&self) -> Result<(), CoordError> {
        match self.loss() {
            None => Ok(()),
            Some(_) => Err(CoordError::LeaseLost { lease: self.id }),
        }
    }

    /// Completes when the lease is lost; returns why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> LeaseLoss {
        let mut rx = self.status.clone();
        loop {
            if let LeaseState::Lost(loss) = &*rx.borrow_and_update() {
                return loss.clone();
            }
            if rx.changed().await.is_err() {
                // The keeper is gone without saying why: treat as lost.
                return self
                    .loss()
                    .unwrap_or(LeaseLoss::Unreachable { cause: None });
            }
        }
    }

    /// Stops renewing and revokes the lease, deleting its keys now.
    ///
    /// # Errors
    ///
    /// A store error other than "already gone" (a lease that already
    /// expired is simply gone).
    ///
    /// # Cancel safety
    ///
    /// Renewals stop at once; if dropped before the revoke reaches the
    /// store, the lease expires after its TTL.
    pub async fn revoke(mut self) -> Result<(), CoordError> {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        self.status_tx
            .send_replace(LeaseState::Lost(LeaseLoss::Revoked));
        match self.store.revoke(self.id).await {
            Ok(()) | Err(StoreError::LeaseNotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl<S: Store + Clone + 'static> Drop for Lease<S> {
    fn drop(&mut self) {
        let Some(keeper) = self.keeper.take() else {
            return; // revoked explicitly
        };
        keeper.abort();
        self.status_tx
            .send_replace(LeaseState::Lost(LeaseLoss::Revoked));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (store, id) = (self.store.clone(), self.id);
            handle.spawn(async move {
                let _ = store.revoke(id).await;
            });
        }
    }
}

impl<S: Store + Clone + 'static> std::fmt::Debug for Lease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .field("loss", &self.loss())
            .finish()
    }
}

/// The renewal loop. `last_ok` is when the last successful renewal (or the
/// grant) was *sent*: the store's deadline is at least `last_ok + ttl` in
/// this process's time, assuming clocks tick at the same rate; past that
/// without a confirmed renewal, the lease must be assumed lost.
async fn keep_alive<S: Store>(
    store: S,
    id: LeaseId,
    ttl: Duration,
    fraction: f64,
    clock: Arc<dyn Clock>,
    mut last_ok: Duration,
    status: Arc<watch::Sender<LeaseState>>,
) {
    let every = ttl.mul_f64(fraction);
    let mut failures = 0u32;
    let mut cause: Option<Arc<StoreError>> = None;
    let lose = |loss: LeaseLoss| {
        crate::trace::error!(lease = ?id, %loss, "lease lost");
        status.send_replace(LeaseState::Lost(loss));
    };
    loop {
        let wait = if failures == 0 {
            every
        } else {
            (every / 4).max(Duration::from_millis(10))
        };
        let deadline = last_ok + ttl;
        clock.sleep_until((clock.now() + wait).min(deadline)).await;
        if clock.now() >= deadline {
            lose(LeaseLoss::Unreachable { cause });
            return;
        }
        let sent = clock.now();
        let renewal = store.keep_alive(id);
        tokio::pin!(renewal);
        let result = tokio::select! {
            r = &mut renewal => Some(r),
            () = clock.sleep_until(deadline) => None,
        };
        match result {
            Some(Ok(_)) => {
                last_ok = sent;
                if failures > 0 {
                    crate::trace::info!(lease = ?id, failures, "lease renewal recovered");
                    status.send_replace(LeaseState::Alive);
                }
                failures = 0;
                cause = None;
            }
            Some(Err(StoreError::LeaseNotFound { .. })) => {
                lose(LeaseLoss::Expired);
                return;
            }
            Some(Err(e)) => {
                failures += 1;
                crate::trace::warn!(
                    lease = ?id,
                    failures,
                    error = &e as &(dyn std::error::Error + 'static),
                    left = ?deadline.saturating_sub(clock.now()),
                    "lease renewal failed"
                );
                let e = Arc::new(e);
                cause = Some(Arc::clone(&e));
                status.send_replace(LeaseState::Suspended { failures, cause: e });
            }
            None => {
                // The deadline passed with a renewal in flight: the lease
                // is lost now (the holder must stop). If the store's
                // answer still comes and says the lease had ended, the
                // loss is told for what it was: an expiry (a TTL shorter
                // than a round trip, or a pause), not an outage.
                lose(LeaseLoss::Unreachable { cause });
                if let Ok(Err(StoreError::LeaseNotFound { .. })) =
                    tokio::time::timeout(ttl.max(Duration::from_secs(1)), renewal).await
                {
                    status.send_replace(LeaseState::Lost(LeaseLoss::Expired));
                }
                return;
            }
        }
    }
}
