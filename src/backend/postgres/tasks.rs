//! The background tasks of a [`PostgresStore`](super::PostgresStore): the
//! `LISTEN` connection that wakes watches (held while the store has
//! watches), and the lease reaper. Both hold
//! only a weak reference to the store and end with it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::watch;
use tokio_postgres::Socket;
use tokio_postgres::tls::MakeTlsConnect;

use super::sql::ANNOUNCED_SECS;
use super::store::{Shared, compact, marks, query};

/// How long the listener keeps listening after the last watch ended
/// (watches come and go, an election's waiters say; `LISTEN` and
/// `UNLISTEN` are a round trip each).
pub(super) const LISTEN_IDLE: Duration = Duration::from_secs(10);

/// How often a listening session renews its announcement to writers,
/// well within the [`ANNOUNCED_SECS`] it lasts.
const RENEW_EVERY: Duration = Duration::from_secs(ANNOUNCED_SECS / 3);

/// Where the listener stands, for a new watch deciding whether to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListenState {
    /// Not listening: no watch wants it, or it is being set up.
    Off,
    /// `LISTEN` is in effect.
    On,
    /// The last attempt failed; retrying (a new watch need not wait: it
    /// polls meanwhile).
    Failing,
}

/// Holds a `LISTEN` connection while the store has watches (`wanted`
/// above zero), telling them through `state` when it is in effect, and
/// wakes them on notifications; reconnects after failures (watches
/// re-read every second meanwhile). While it listens, it keeps the
/// store's writers (in every process) told that somebody does, renewing
/// the announcement every [`RENEW_EVERY`]; writers send no `NOTIFY` when
/// none is in force.
///
/// Nothing listens while no watch lives: every notifying commit in the
/// database wakes each listening session, which costs the server (and,
/// on a small machine, the writers) CPU per write.
pub(super) async fn listen<T>(
    config: tokio_postgres::Config,
    tls: T,
    shared: Weak<Shared>,
    state: watch::Sender<ListenState>,
    mut wanted: watch::Receiver<usize>,
) where
    T: MakeTlsConnect<Socket> + Clone,
    T::Stream: Send,
{
    loop {
        if wanted.wait_for(|n| *n > 0).await.is_err() {
            return;
        }
        let Some(sql) = shared.upgrade().map(|s| Arc::clone(&s.sql)) else {
            return;
        };
        let connected = config.connect(tls.clone()).await;
        if connected.is_err() {
            state.send_replace(ListenState::Failing);
        }
        if let Err(_e) = &connected {
            crate::trace::info!(
                error = _e as &(dyn std::error::Error + 'static),
                "LISTEN connection failed; reconnecting"
            );
        }
        if let Ok((client, mut connection)) = connected {
            let drive = async {
                loop {
                    match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                        Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => {
                            match shared.upgrade() {
                                Some(s) => s.changed.notify_waiters(),
                                None => return,
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => return,
                    }
                }
            };
            let control = async {
                loop {
                    if wanted.wait_for(|n| *n > 0).await.is_err() {
                        return;
                    }
                    // Listening first, then telling writers: a write that
                    // commits after the announcement notifies, and one
                    // before it is seen by the watch's first read.
                    let listen = format!("LISTEN {}", sql.channel);
                    if client.batch_execute(&listen).await.is_err()
                        || client.batch_execute(&sql.announce).await.is_err()
                    {
                        state.send_replace(ListenState::Failing);
                        return;
                    }
                    state.send_replace(ListenState::On);
                    // Until no watch has lived for LISTEN_IDLE.
                    let idle = async {
                        loop {
                            wanted.wait_for(|n| *n == 0).await.ok()?;
                            let again = wanted.wait_for(|n| *n > 0);
                            match tokio::time::timeout(LISTEN_IDLE, again).await {
                                Err(_) => return Some(()),
                                Ok(again) => again.ok()?,
                            };
                        }
                    };
                    let renew = async {
                        loop {
                            tokio::time::sleep(RENEW_EVERY).await;
                            if client.batch_execute(&sql.announce).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        idle = idle => if idle.is_none() {
                            return;
                        },
                        () = renew => {
                            state.send_replace(ListenState::Failing);
                            return;
                        }
                    }
                    state.send_replace(ListenState::Off);
                    if client
                        .batch_execute(&format!("UNLISTEN {}", sql.channel))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            };
            tokio::select! {
                () = drive => {}
                () = control => {}
            }
        }
        // A connection lost while listening: retrying, watches poll.
        state.send_if_modified(|s| {
            let on = *s == ListenState::On;
            if on {
                *s = ListenState::Failing;
            }
            on
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How often the reaper looks for expired leases. A lease therefore ends
/// (its keys deleted, watchers told) at most this long after its deadline
/// by the database clock; reads and writes treat its keys as gone from
/// the deadline itself.
const REAP_EVERY: Duration = Duration::from_millis(100);

/// Reaps expired leases (one cheap indexed probe when none has expired)
/// and trims history beyond the configured length, every
/// [`REAP_EVERY`]. Writes never wait for it: it is one server-side call
/// that takes the store-wide lock only when a lease has expired.
pub(super) async fn reap(pool: Pool, shared: Weak<Shared>) {
    let mut round: u32 = 0;
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        round = round.wrapping_add(1);
        let Some(s) = shared.upgrade() else {
            return;
        };
        let sql = Arc::clone(&s.sql);
        let history = i64::try_from(s.history).unwrap_or(i64::MAX);
        drop(s);
        // A failure (the server restarting) is retried next round.
        let _ = query(&pool, &sql.reap, &[], true).await;
        if round % 10 == 0 {
            if let Ok((revision, compacted)) = marks(&pool, &sql).await {
                if revision - compacted > history.saturating_mul(2) {
                    let _ = compact(&pool, &sql, revision - history).await;
                }
            }
        }
    }
}
