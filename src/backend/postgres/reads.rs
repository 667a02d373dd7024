//! Read coalescing: gets that arrive while other gets of the same store
//! are pending go to the server together, as one statement.
//!
//! A get made while no other get of the store is pending is sent by its
//! caller, as a plain statement. Gets made while one is pending queue; a
//! reader task takes everything queued (up to [`MAX_READS`] keys) and
//! reads those keys in one statement, one snapshot. Under load that is
//! one statement per round of gets instead of one per get, and a key many
//! tasks read at once (a contended compare-and-set loop) is read once.
//!
//! Each get is still linearizable: a queued get is sent in a statement
//! that starts after the get was called, and answered when that statement
//! returns, so the statement's snapshot lies within the get's wait. A get
//! whose caller stopped waiting before it was sent is not sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deadpool_postgres::Pool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::batch::Shared;
use super::sql::Sql;
use super::store::{kv_of_columns, query};
use crate::store::{KeyValue, StoreError};

/// The most keys in one statement.
const MAX_READS: usize = 256;

/// How many coalesced statements may be on the wire at once: while one is
/// out, the next gathers what queued meanwhile and goes too.
const READERS: usize = 2;

/// One queued get.
struct Get {
    key: Vec<u8>,
    reply: oneshot::Sender<Result<Option<KeyValue>, StoreError>>,
}

/// Where a store's gets go: straight to the server when no other get of
/// the store is pending, else to the readers' queue.
pub(super) struct Reads {
    queue: mpsc::Sender<Get>,
    /// Gets called and not yet answered (or given up).
    pending: AtomicUsize,
    /// While fewer gets than this are pending, a get is sent alone.
    direct: usize,
}

/// Counts one pending call (a get, or a store's write) while it lives.
pub(super) struct Pending<'a>(pub(super) &'a AtomicUsize);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Reads {
    /// Starts the reader tasks; they end when the returned [`Reads`] is
    /// dropped, after answering what they hold.
    pub(super) fn spawn(pool: Pool, sql: Arc<Sql>) -> Self {
        let (queue, rx) = mpsc::channel(MAX_READS * 4);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..READERS {
            tokio::spawn(read_loop(pool.clone(), Arc::clone(&sql), Arc::clone(&rx)));
        }
        Self {
            queue,
            pending: AtomicUsize::new(0),
            direct: (pool.status().max_size / 2).max(1),
        }
    }

    /// The live key `key`, if any.
    ///
    /// Cancel safety: cancel safe (a read changes nothing).
    pub(super) async fn get(
        &self,
        pool: &Pool,
        sql: &Sql,
        key: &[u8],
    ) -> Result<Option<KeyValue>, StoreError> {
        let direct = self.pending.fetch_add(1, Ordering::AcqRel) < self.direct;
        let _pending = Pending(&self.pending);
        if direct {
            let rows = query(pool, &sql.get, &[&key], false).await?;
            return Ok(rows.first().map(|r| kv_of_columns(r, 0)));
        }
        let (reply, answer) = oneshot::channel();
        let get = Get {
            key: key.to_vec(),
            reply,
        };
        self.queue.send(get).await.map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or(Err(StoreError::Closed))
    }
}

async fn read_loop(pool: Pool, sql: Arc<Sql>, rx: Arc<Mutex<mpsc::Receiver<Get>>>) {
    loop {
        let batch = {
            // One reader gathers at a time, so a statement holds
            // everything that queued while the previous one was out.
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < MAX_READS {
                match rx.try_recv() {
                    Ok(get) => batch.push(get),
                    Err(_) => break,
                }
            }
            batch
        };
        let batch: Vec<Get> = batch.into_iter().filter(|g| !g.reply.is_closed()).collect();
        if batch.is_empty() {
            continue;
        }
        let mut keys: Vec<&[u8]> = batch.iter().map(|g| g.key.as_slice()).collect();
        keys.sort_unstable();
        keys.dedup();
        match query(&pool, &sql.get_many, &[&keys], false).await {
            Ok(rows) => {
                let found: HashMap<Vec<u8>, KeyValue> = rows
                    .iter()
                    .map(|r| {
                        let kv = kv_of_columns(r, 0);
                        (kv.key.clone(), kv)
                    })
                    .collect();
                for g in batch {
                    let _ = g.reply.send(Ok(found.get(&g.key).cloned()));
                }
            }
            Err(e) => {
                let shared = Shared::new(e);
                for g in batch {
                    let _ = g.reply.send(Err(shared.copy()));
                }
            }
        }
    }
}
