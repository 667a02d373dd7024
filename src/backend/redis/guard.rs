use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::RedisLockError;
use super::nodes::Nodes;

/// Why an [`EfficiencyGuard`] ended.
///
/// Two losses are equal when they are of the same kind.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EfficiencyLoss {
    /// The lock's validity ran out without an extension (auto-extend off,
    /// or the holder was paused past it), or Redis said the key no longer
    /// holds this guard's value: it expired and may be someone else's.
    Expired,
    /// Extensions could not reach a majority of the instances before the
    /// validity ended, so the key may have expired: the holder must assume
    /// it did.
    Unreachable {
        /// The last extension's error (`None`: it hung until the end).
        cause: Option<Arc<RedisLockError>>,
    },
    /// This process released it (or dropped the guard).
    Released,
}

impl PartialEq for EfficiencyLoss {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl Eq for EfficiencyLoss {}

impl std::fmt::Display for EfficiencyLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EfficiencyLoss::Expired => f.write_str("the lock expired"),
            EfficiencyLoss::Unreachable { cause: Some(e) } => {
                f.write_str("redis was unreachable until the lock's validity ended (")?;
                crate::error::write_chain(f, &**e)?;
                f.write_str(")")
            }
            EfficiencyLoss::Unreachable { cause: None } => {
                f.write_str("redis did not answer until the lock's validity ended")
            }
            EfficiencyLoss::Released => f.write_str("this process released it"),
        }
    }
}

/// Where an [`EfficiencyGuard`] stands, as its extender last saw it.
///
/// Two states are equal when they are of the same kind (and, suspended,
/// with as many failures).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EfficiencyState {
    /// The last extension (or the acquisition) reached a majority.
    Held,
    /// Extensions are failing but the validity has not ended: the lock may
    /// still be held, or may have expired. Pause the work; go on at
    /// `Held`, give up at `Lost`.
    Suspended {
        /// Extensions failed in a row.
        failures: u32,
        /// The last one's error.
        cause: Arc<RedisLockError>,
    },
    /// The lock is over; it never comes back.
    Lost(EfficiencyLoss),
}

impl PartialEq for EfficiencyState {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (EfficiencyState::Held, EfficiencyState::Held) => true,
            (
                EfficiencyState::Suspended { failures: a, .. },
                EfficiencyState::Suspended { failures: b, .. },
            ) => a == b,
            (EfficiencyState::Lost(a), EfficiencyState::Lost(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for EfficiencyState {}

/// What the guard and its extender share.
#[derive(Debug)]
struct Held {
    nodes: Nodes,
    key: Vec<u8>,
    /// This holder's random value, stored in the key.
    value: Vec<u8>,
    /// When the last successful acquisition or extension was *sent*: the
    /// key lives at least until `sent + ttl` by Redis' clock, so the lock
    /// is valid until `sent + ttl - drift` by ours. Never held across an
    /// await.
    last_ok: Mutex<Instant>,
}

impl Held {
    fn valid_until(&self) -> Instant {
        let o = &self.nodes.options;
        *self.last_ok.lock().unwrap_or_else(|p| p.into_inner()) + o.ttl - o.drift()
    }

    /// One extension on every instance; on a majority within the validity
    /// it moves `last_ok` forward.
    async fn extend(&self) -> Result<(), RedisLockError> {
        let sent = Instant::now();
        let tally = self.nodes.extend(&self.key, &self.value).await;
        let o = &self.nodes.options;
        if tally.yes >= self.nodes.quorum() && sent.elapsed() < o.ttl - o.drift() {
            let mut last = self.last_ok.lock().unwrap_or_else(|p| p.into_inner());
            *last = (*last).max(sent);
            Ok(())
        } else {
            Err(self.nodes.short(tally))
        }
    }
}

/// A lock held on Redis **for efficiency only**: proof that, at the time
/// it was taken, no other holder had it, and nothing more.
///
/// # Why there is no fencing token
///
/// This guard has no `token()`, and nothing in calm that guards a resource
/// ([`Fence`](crate::coord::Fence), [`StoreFence`](crate::coord::StoreFence),
/// the backends' fenced writes) accepts it. That is deliberate. A Redis
/// key's value is random, not a number that grows with every grant, so a
/// resource cannot tell an old holder from a new one. And a holder can be
/// paused (a GC pause, a descheduled VM, a slow network) after checking
/// [`is_held`](EfficiencyGuard::is_held) and before acting; meanwhile its
/// key expires, a second holder acquires, and when the first one wakes it
/// acts believing it still holds the lock. Both act. Extending in the
/// background does not help: the extender is paused with the rest of the
/// process. Redlock across several instances does not help either: it
/// changes who may grant the lock, not what a paused holder does.
///
/// So use it where doing the work twice is merely wasteful (a cache
/// refresh, a report, a batch whose outputs are idempotent). Where two
/// holders would corrupt data, take a [`Lock`](crate::coord::Lock) or an
/// [`Election`](crate::coord::Election) on a consensus store and pass its
/// [`FencingToken`](crate::coord::FencingToken) to a fence at the
/// resource. This is the efficiency row of the README's decision table.
///
/// ```compile_fail
/// // No token to pass to a fence: this does not compile.
/// fn fenced(guard: &calm::backend::redis::EfficiencyGuard, fence: &calm::coord::Fence) {
///     fence.check(guard.token()).unwrap();
/// }
/// ```
///
/// # The lost signal
///
/// With auto-extend on (the default), a Tokio task extends the key every
/// third of the TTL. When Redis says the key is no longer ours, or a
/// majority cannot be reached before the validity ends (`ttl - drift`
/// after the last extension that succeeded was sent), the guard is
/// declared lost, loudly: [`lost`](EfficiencyGuard::lost) completes,
/// [`is_held`](EfficiencyGuard::is_held) turns false,
/// [`check`](EfficiencyGuard::check) fails. A paused holder learns it only
/// when it runs again, which is why the work must tolerate a duplicate.
///
/// Dropping the guard stops the extender and, inside a Tokio runtime,
/// releases the lock in the background (best effort); otherwise the key
/// expires after its TTL. Call [`release`](EfficiencyGuard::release) to
/// know that it was released.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use calm::backend::redis::{RedisLock, RedisLockOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::backend::redis::RedisLockError> {
/// let locks = RedisLock::new("redis://127.0.0.1/", RedisLockOptions::new(Duration::from_secs(30)))?;
/// if let Some(guard) = locks.try_acquire(b"jobs/nightly-report").await? {
///     // Another worker is not building the report right now; if this
///     // one pauses past the TTL, another may start a second copy.
///     guard.check()?;
///     guard.release().await?;
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct EfficiencyGuard {
    held: Arc<Held>,
    /// The extender's view. Written by the extender, `release` and drop.
    status: watch::Receiver<EfficiencyState>,
    status_tx: Arc<watch::Sender<EfficiencyState>>,
    /// The extension (or validity-watching) task.
    extender: Option<tokio::task::JoinHandle<()>>,
}

impl EfficiencyGuard {
    /// A guard for a key just set to `value` by a request sent at `sent`.
    pub(super) fn start(
        nodes: Nodes,
        key: Vec<u8>,
        value: Vec<u8>,
        sent: Instant,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let held = Arc::new(Held {
            nodes,
            key,
            value,
            last_ok: Mutex::new(sent),
        });
        let (tx, rx) = watch::channel(EfficiencyState::Held);
        let tx = Arc::new(tx);
        let extender = runtime.spawn(extend_loop(Arc::clone(&held), Arc::clone(&tx)));
        Self {
            held,
            status: rx,
            status_tx: tx,
            extender: Some(extender),
        }
    }

    /// The locked key.
    pub fn key(&self) -> &[u8] {
        &self.held.key
    }

    /// This holder's random value, as stored in the key.
    pub fn value(&self) -> &[u8] {
        &self.held.value
    }

    /// The time left of the lock's validity as last confirmed (zero once
    /// it ran out): `ttl - drift` after the last successful acquisition or
    /// extension was sent.
    pub fn valid_for(&self) -> Duration {
        self.held
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// Whether the lock is still believed held (held, or suspended with
    /// validity left). A paused process cannot see the answer change.
    pub fn is_held(&self) -> bool {
        !matches!(*self.status.borrow(), EfficiencyState::Lost(_))
    }

    /// Where the lock stands.
    pub fn state(&self) -> EfficiencyState {
        self.status.borrow().clone()
    }

    /// Why the lock was lost, if it was.
    pub fn loss(&self) -> Option<EfficiencyLoss> {
        match &*self.status.borrow() {
            EfficiencyState::Lost(loss) => Some(loss.clone()),
            _ => None,
        }
    }

    /// `Ok` while the lock is believed held.
    ///
    /// # Errors
    ///
    /// [`RedisLockError::NotHeld`] once it is lost.
    pub fn check(&self) -> Result<(), RedisLockError> {
        match self.loss() {
            None => Ok(()),
            Some(_) => Err(RedisLockError::NotHeld),
        }
    }

    /// Completes when the lock is lost; returns why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> EfficiencyLoss {
        let mut rx = self.status.clone();
        loop {
            if let EfficiencyState::Lost(loss) = &*rx.borrow_and_update() {
                return loss.clone();
            }
            if rx.changed().await.is_err() {
                return self
                    .loss()
                    .unwrap_or(EfficiencyLoss::Unreachable { cause: None });
            }
        }
    }

    /// Extends the key's TTL now, if it still holds this guard's value on
    /// a majority of the instances (one Lua script per instance, so the
    /// compare and the `PEXPIRE` are atomic on each).
    ///
    /// # Errors
    ///
    /// [`RedisLockError::NotHeld`] if the key is no longer ours (nothing
    /// was changed; the guard is then lost), [`RedisLockError::NoQuorum`]
    /// or a request error if too few instances answered.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped, some instances may have been extended,
    /// which only keeps our own key alive longer.
    pub async fn extend(&self) -> Result<(), RedisLockError> {
        self.check()?;
        match self.held.extend().await {
            Err(RedisLockError::NotHeld) => {
                self.status_tx
                    .send_replace(EfficiencyState::Lost(EfficiencyLoss::Expired));
                Err(RedisLockError::NotHeld)
            }
            other => other,
        }
    }

    /// Stops extending and deletes the key on every instance where it
    /// still holds this guard's value (a Lua script each: a successor's
    /// key is never deleted).
    ///
    /// # Errors
    ///
    /// [`RedisLockError::NotHeld`] if no majority of instances still held
    /// our value (it expired; nothing was deleted that was not ours),
    /// [`RedisLockError::NoQuorum`] if too few answered (the key expires
    /// after its TTL where it remains).
    ///
    /// # Cancel safety
    ///
    /// Extension stops at once; if dropped before the deletes reach Redis,
    /// the key expires after its TTL.
    pub async fn release(mut self) -> Result<(), RedisLockError> {
        self.stop();
        let tally = self
            .held
            .nodes
            .release(&self.held.key, &self.held.value)
            .await;
        if tally.yes >= self.held.nodes.quorum() {
            Ok(())
        } else {
            Err(self.held.nodes.short(tally))
        }
    }

    /// Stops the extender and marks the guard released.
    fn stop(&mut self) -> bool {
        let Some(extender) = self.extender.take() else {
            return false;
        };
        extender.abort();
        self.status_tx.send_if_modified(|s| {
            if matches!(s, EfficiencyState::Lost(_)) {
                false
            } else {
                *s = EfficiencyState::Lost(EfficiencyLoss::Released);
                true
            }
        });
        true
    }
}

impl Drop for EfficiencyGuard {
    fn drop(&mut self) {
        if !self.stop() {
            return; // released explicitly
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let held = Arc::clone(&self.held);
            handle.spawn(async move {
                let _ = held.nodes.release(&held.key, &held.value).await;
            });
        }
    }
}

impl std::fmt::Debug for EfficiencyGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EfficiencyGuard")
            .field("key", &String::from_utf8_lossy(&self.held.key))
            .field("instances", &self.held.nodes.len())
            .field("valid_for", &self.valid_for())
            .field("loss", &self.loss())
            .finish()
    }
}

/// The extender: every `renew_fraction` of the TTL, extend on every
/// instance; lost when Redis says the key is not ours, or when the
/// validity ends with no majority confirmed. With auto-extend off it only
/// waits for the validity to end.
async fn extend_loop(held: Arc<Held>, status: Arc<watch::Sender<EfficiencyState>>) {
    let options = held.nodes.options.clone();
    let every = options.ttl.mul_f64(options.renew_fraction);
    let mut failures = 0u32;
    let mut cause: Option<Arc<RedisLockError>> = None;
    let lose = |loss: EfficiencyLoss| {
        crate::trace::error!(key = %String::from_utf8_lossy(&held.key), %loss, "redis lock lost");
        status.send_replace(EfficiencyState::Lost(loss));
    };
    loop {
        let deadline = held.valid_until();
        let wait = if !options.auto_extend {
            deadline.saturating_duration_since(Instant::now())
        } else if failures == 0 {
            every
        } else {
            // Retry sooner after a failure, but not in a tight loop.
            (every / 4).max(Duration::from_millis(10))
        };
        tokio::time::sleep_until((Instant::now() + wait).min(deadline).into()).await;
        // Read again: a manual `extend` may have moved it.
        let deadline = held.valid_until();
        if Instant::now() >= deadline {
            lose(match (options.auto_extend, cause.take()) {
                (true, cause) if failures > 0 => EfficiencyLoss::Unreachable { cause },
                _ => EfficiencyLoss::Expired,
            });
            return;
        }
        if !options.auto_extend {
            continue;
        }
        match tokio::time::timeout_at(deadline.into(), held.extend()).await {
            Ok(Ok(())) => {
                if failures > 0 {
                    status.send_replace(EfficiencyState::Held);
                }
                failures = 0;
                cause = None;
            }
            Ok(Err(RedisLockError::NotHeld)) => {
                lose(EfficiencyLoss::Expired);
                return;
            }
            Ok(Err(e)) => {
                failures += 1;
                crate::trace::warn!(
                    key = %String::from_utf8_lossy(&held.key),
                    failures,
                    error = &e as &(dyn std::error::Error + 'static),
                    "redis lock extension failed"
                );
                let e = Arc::new(e);
                cause = Some(Arc::clone(&e));
                status.send_replace(EfficiencyState::Suspended { failures, cause: e });
            }
            Err(_) => {
                lose(EfficiencyLoss::Unreachable { cause });
                return;
            }
        }
    }
}
