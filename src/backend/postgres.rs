//! The [`Store`] model on PostgreSQL.
//!
//! # Schema
//!
//! Each store lives in one PostgreSQL schema (default `calm`), created on
//! first use (or by [`PostgresStore::migrate`]):
//!
//! | table | holds |
//! | --- | --- |
//! | `meta` | one row: the store revision, and the compacted revision |
//! | `kv` | key, value, `create_revision`, `mod_revision`, `writes`, lease |
//! | `leases` | id, TTL, deadline (a `timestamptz` of the database's clock) |
//! | `events` | every put and delete by revision, for watches |
//!
//! # Why it is correct
//!
//! Every write (put, delete, transaction, revoke, lease expiry) runs in one
//! database transaction that first locks the `meta` row (`SELECT ... FOR
//! UPDATE`). Writers are therefore serialised: each sees every earlier
//! write, takes the next revision, and commits before the next one starts,
//! so revision order *is* commit order. (A PostgreSQL `SEQUENCE` would hand
//! out numbers outside transactions, in an order commits need not follow,
//! and a watcher could skip a revision that commits late; the counter row
//! cannot.) Compare-and-set is then a plain check of the key's row inside
//! the serialised transaction, and a transaction's writes share its one
//! revision.
//!
//! Leases are judged by the database's clock (`clock_timestamp()`), never
//! the client's. Expired leases are reaped at the start of every write,
//! and by a background task at each deadline; reads skip keys whose lease
//! has passed its deadline even before the reaper deletes them.
//!
//! Watches read the `events` table by revision, so they miss nothing; a
//! `LISTEN` connection only wakes them early (they also re-read at least
//! every second, so a lost notification costs latency, not events).
//!
//! # Errors
//!
//! A connection that cannot be made, or breaks before a write is sent, is
//! [`StoreError::Unavailable`] (retry). A connection that breaks while a
//! commit is in flight is [`StoreError::Indeterminate`]: the write may have
//! happened; re-read the key's version. A closed pool is
//! [`StoreError::Closed`].

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    GenericClient, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Transaction,
};
use tokio::sync::Notify;
use tokio_postgres::{NoTls, Row, Statement};

use crate::occ::Version;
use crate::store::{
    BoxError, Compare, EventKind, Expect, KeySpan, KeyValue, LeaseGrant, LeaseId, PutOptions,
    RangeResult, Store, StoreError, Txn, TxnOp, TxnOpResult, TxnOutcome, Watch, WatchEvent,
    WriteOutcome, check_key, check_value,
};

/// Settings of a [`PostgresStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// A libpq-style connection string or URL.
    pub url: String,
    /// The schema holding the store's tables (one store per schema).
    pub schema: String,
    /// Pooled connections.
    pub pool_size: usize,
    /// Watch events kept; older ones are compacted by the reaper.
    pub history: u64,
}

impl PostgresOptions {
    /// Connects to `url`, schema `calm`, 8 pooled connections, 100,000
    /// events of history.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: "calm".into(),
            pool_size: 8,
            history: 100_000,
        }
    }

    /// Uses another schema (letters, digits and `_` only).
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the pool size (at least 1).
    pub fn with_pool_size(mut self, n: usize) -> Self {
        self.pool_size = n.max(1);
        self
    }
}

/// A [`Store`] on PostgreSQL. Clones share the pool.
///
/// See the [module docs](self) for the schema and why the model holds.
///
/// # Examples
///
/// ```no_run
/// use calm::backend::postgres::PostgresStore;
/// use calm::store::{PutOptions, Store};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), calm::store::StoreError> {
/// let store = PostgresStore::connect("postgres://calm@127.0.0.1:5432/calm").await?;
/// let _ = store.put(b"greeting", b"hello", PutOptions::new()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    shared: Arc<Shared>,
}

struct Shared {
    /// The schema, validated.
    schema: String,
    /// The `LISTEN` channel name.
    channel: String,
    /// Woken on every notification from the listener.
    changed: Notify,
    /// Events to keep.
    history: u64,
    /// Background tasks (listener, reaper), stopped on drop.
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().map(std::mem::take).unwrap_or_default();
        for t in tasks {
            t.abort();
        }
    }
}

/// A PostgreSQL error with the server's message (tokio-postgres displays
/// database errors only as "db error").
#[derive(Debug)]
struct PgError(tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{} ({})", db.message(), db.code().code()),
            None => write!(f, "{}", self.0),
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Maps a client error to a store error. `committing` marks errors from a
/// commit in flight, whose outcome is unknown.
fn pg_error(e: tokio_postgres::Error, committing: bool) -> StoreError {
    let lost = e.is_closed() || e.code().is_none();
    let source: BoxError = Box::new(PgError(e));
    match (lost, committing) {
        (true, true) => StoreError::Indeterminate { source },
        (true, false) => StoreError::Unavailable { source },
        (false, _) => StoreError::Backend { source },
    }
}

fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Closed => StoreError::Closed,
        PoolError::Backend(e) => pg_error(e, false),
        other => StoreError::Unavailable {
            source: Box::new(other),
        },
    }
}

fn err(e: tokio_postgres::Error) -> StoreError {
    pg_error(e, false)
}

impl PostgresStore {
    /// Connects with default options (schema `calm`).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] if the database cannot be reached, or a
    /// backend error creating the schema.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(PostgresOptions::new(url)).await
    }

    /// Connects, creates the schema if needed, and starts the listener and
    /// the lease reaper. Must be called inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); a backend error for an invalid
    /// schema name or URL.
    pub async fn connect_with(options: PostgresOptions) -> Result<Self, StoreError> {
        if options.schema.is_empty()
            || options.schema.len() > 40
            || !options
                .schema
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(StoreError::Backend {
                source: "schema names are 1-40 ASCII letters, digits or underscores".into(),
            });
        }
        let config: tokio_postgres::Config =
            options.url.parse().map_err(|e| StoreError::Backend {
                source: Box::new(e),
            })?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .build()
            .map_err(|e| StoreError::Backend {
                source: Box::new(e),
            })?;
        let shared = Arc::new(Shared {
            channel: format!("calm_{}", options.schema),
            schema: options.schema,
            changed: Notify::new(),
            history: options.history.max(1),
            tasks: std::sync::Mutex::new(Vec::new()),
        });
        let store = Self { pool, shared };
        store.migrate().await?;
        let listener = tokio::spawn(listen(config, Arc::downgrade(&store.shared)));
        let reaper = tokio::spawn(reap(store.pool.clone(), Arc::downgrade(&store.shared)));
        if let Ok(mut tasks) = store.shared.tasks.lock() {
            tasks.push(listener);
            tasks.push(reaper);
        }
        Ok(store)
    }

    /// Creates the schema and tables if they do not exist (safe to run
    /// concurrently; serialised by an advisory lock).
    ///
    /// # Errors
    ///
    /// A backend error.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let s = &self.shared.schema;
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(err)?;
        tx.batch_execute(&format!(
            "SELECT pg_advisory_xact_lock(hashtext('calm_migrate'));
             CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE IF NOT EXISTS {s}.meta (
                 id smallint PRIMARY KEY CHECK (id = 1),
                 revision bigint NOT NULL,
                 compacted bigint NOT NULL);
             INSERT INTO {s}.meta VALUES (1, 0, 0) ON CONFLICT DO NOTHING;
             CREATE TABLE IF NOT EXISTS {s}.kv (
                 key bytea PRIMARY KEY,
                 value bytea NOT NULL,
                 create_revision bigint NOT NULL,
                 mod_revision bigint NOT NULL,
                 writes bigint NOT NULL,
                 lease bigint);
             CREATE INDEX IF NOT EXISTS kv_lease ON {s}.kv (lease) WHERE lease IS NOT NULL;
             CREATE TABLE IF NOT EXISTS {s}.leases (
                 id bigserial PRIMARY KEY,
                 ttl_ms bigint NOT NULL,
                 deadline timestamptz NOT NULL);
             CREATE TABLE IF NOT EXISTS {s}.events (
                 revision bigint NOT NULL,
                 key bytea NOT NULL,
                 kind smallint NOT NULL,
                 value bytea NOT NULL,
                 create_revision bigint NOT NULL,
                 writes bigint NOT NULL,
                 lease bigint,
                 PRIMARY KEY (revision, key));"
        ))
        .await
        .map_err(err)?;
        tx.commit().await.map_err(|e| pg_error(e, true))
    }

    /// Closes the pool: later calls fail with [`StoreError::Closed`].
    pub fn close(&self) {
        self.pool.close();
        if let Ok(mut tasks) = self.shared.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }

    /// Runs `f` inside a serialised write transaction (meta row locked,
    /// expired leases reaped first), commits, and notifies watchers if the
    /// revision moved.
    async fn write<T>(
        &self,
        f: impl AsyncFnOnce(&Transaction<'_>, &mut Rev) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let s = &self.shared.schema;
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(err)?;
        let row = tx
            .query_one(
                &prepared(
                    &tx,
                    &format!("SELECT revision FROM {s}.meta WHERE id = 1 FOR UPDATE"),
                )
                .await?,
                &[],
            )
            .await
            .map_err(err)?;
        let mut rev = Rev {
            schema: s.clone(),
            start: row.get(0),
            current: row.get(0),
        };
        expire_leases(&tx, &mut rev).await?;
        let out = f(&tx, &mut rev).await?;
        if rev.current != rev.start {
            // The new revision and the watchers' wake-up in one round trip.
            let sql = format!(
                "WITH u AS (UPDATE {s}.meta SET revision = $1 WHERE id = 1)
                 SELECT pg_notify($2, $3)"
            );
            tx.execute(
                &prepared(&tx, &sql).await?,
                &[&rev.current, &self.shared.channel, &rev.current.to_string()],
            )
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(|e| pg_error(e, true))?;
        Ok(out)
    }

    fn schema(&self) -> &str {
        &self.shared.schema
    }
}

/// `sql` as a statement prepared once per pooled connection (deadpool's
/// statement cache): a cached statement runs in one round trip, where
/// query text is parsed and described in a round trip of its own first.
async fn prepared<C: GenericClient>(c: &C, sql: &str) -> Result<Statement, StoreError> {
    c.prepare_cached(sql).await.map_err(err)
}

/// The revision counter of one write transaction.
struct Rev {
    schema: String,
    /// The revision when the transaction started.
    start: i64,
    /// The latest revision this transaction assigned.
    current: i64,
}

impl Rev {
    fn bump(&mut self) -> i64 {
        self.current += 1;
        self.current
    }
}

/// The live-lease condition for a `kv` row aliased `k`.
fn live(s: &str) -> String {
    format!(
        "(k.lease IS NULL OR EXISTS (SELECT 1 FROM {s}.leases l WHERE l.id = k.lease AND l.deadline > clock_timestamp()))"
    )
}

const KV_COLUMNS: &str = "k.key, k.value, k.create_revision, k.mod_revision, k.writes, k.lease";

fn kv_of(row: &Row) -> KeyValue {
    let lease: Option<i64> = row.get(5);
    KeyValue::new(
        row.get(0),
        row.get(1),
        version(row.get(2)),
        version(row.get(3)),
        u64::try_from(row.get::<_, i64>(4)).unwrap_or(0),
        lease.map(LeaseId::new),
    )
}

fn version(v: i64) -> Version {
    Version::new(u64::try_from(v).unwrap_or(0))
}

fn rev_param(v: Version) -> i64 {
    i64::try_from(v.get()).unwrap_or(i64::MAX)
}

/// Deletes the keys of every expired lease, one revision per lease with
/// keys, and the leases themselves.
async fn expire_leases(tx: &Transaction<'_>, rev: &mut Rev) -> Result<(), StoreError> {
    let s = rev.schema.clone();
    let expired = tx
        .query(
            &prepared(tx, &format!(
                "DELETE FROM {s}.leases WHERE deadline <= clock_timestamp() RETURNING id, deadline"
            )).await?,
            &[],
        )
        .await
        .map_err(err)?;
    let mut ids: Vec<(std::time::SystemTime, i64)> =
        expired.iter().map(|r| (r.get(1), r.get(0))).collect();
    ids.sort();
    for (_, id) in ids {
        delete_lease_keys(tx, rev, id).await?;
    }
    Ok(())
}

/// Deletes every key attached to `lease` at one new revision.
async fn delete_lease_keys(
    tx: &Transaction<'_>,
    rev: &mut Rev,
    lease: i64,
) -> Result<(), StoreError> {
    let s = rev.schema.clone();
    let keys = tx
        .query(
            &prepared(
                tx,
                &format!("SELECT key FROM {s}.kv WHERE lease = $1 ORDER BY key"),
            )
            .await?,
            &[&lease],
        )
        .await
        .map_err(err)?;
    if keys.is_empty() {
        return Ok(());
    }
    let r = rev.bump();
    for row in keys {
        let key: Vec<u8> = row.get(0);
        delete_key(tx, &s, &key, r).await?;
    }
    Ok(())
}

/// Deletes `key` at revision `r` (recording the event); returns the
/// deleted record.
async fn delete_key(
    tx: &Transaction<'_>,
    s: &str,
    key: &[u8],
    r: i64,
) -> Result<Option<KeyValue>, StoreError> {
    let row = tx
        .query_opt(
            &prepared(
                tx,
                &format!("DELETE FROM {s}.kv k WHERE k.key = $1 RETURNING {KV_COLUMNS}"),
            )
            .await?,
            &[&key],
        )
        .await
        .map_err(err)?;
    let Some(row) = row else {
        return Ok(None);
    };
    tx.execute(
        &prepared(
            tx,
            &format!("INSERT INTO {s}.events VALUES ($1, $2, 1, ''::bytea, 0, 0, NULL)"),
        )
        .await?,
        &[&r, &key],
    )
    .await
    .map_err(err)?;
    Ok(Some(kv_of(&row)))
}

/// Writes `key` at revision `r` and records the event, in one statement.
/// `prev` is the key's record before the write, which the caller has read
/// in this transaction.
async fn put_key(
    tx: &Transaction<'_>,
    s: &str,
    key: &[u8],
    value: &[u8],
    lease: Option<LeaseId>,
    r: i64,
    prev: Option<KeyValue>,
) -> Result<Option<KeyValue>, StoreError> {
    let lease = lease.map(LeaseId::get);
    let sql = format!(
        "WITH k AS (
             INSERT INTO {s}.kv AS k VALUES ($1, $2, $3, $3, 1, $4)
             ON CONFLICT (key) DO UPDATE SET value = $2, mod_revision = $3,
                 writes = k.writes + 1, lease = $4
             RETURNING k.create_revision, k.writes)
         INSERT INTO {s}.events SELECT $3, $1, 0, $2, k.create_revision, k.writes, $4 FROM k"
    );
    tx.execute(&prepared(tx, &sql).await?, &[&key, &value, &r, &lease])
        .await
        .map_err(err)?;
    Ok(prev)
}

/// The key's row inside a write transaction (expired leases are already
/// reaped there).
async fn current(
    tx: &Transaction<'_>,
    s: &str,
    key: &[u8],
) -> Result<Option<KeyValue>, StoreError> {
    let row = tx
        .query_opt(
            &prepared(
                tx,
                &format!("SELECT {KV_COLUMNS} FROM {s}.kv k WHERE k.key = $1"),
            )
            .await?,
            &[&key],
        )
        .await
        .map_err(err)?;
    Ok(row.as_ref().map(kv_of))
}

/// Fails with [`StoreError::LeaseNotFound`] unless `lease` is alive.
async fn lease_alive(
    tx: &Transaction<'_>,
    s: &str,
    lease: Option<LeaseId>,
) -> Result<(), StoreError> {
    let Some(l) = lease else {
        return Ok(());
    };
    let row = tx
        .query_opt(
            &prepared(
                tx,
                &format!("SELECT 1 FROM {s}.leases WHERE id = $1 AND deadline > clock_timestamp()"),
            )
            .await?,
            &[&l.get()],
        )
        .await
        .map_err(err)?;
    match row {
        Some(_) => Ok(()),
        None => Err(StoreError::LeaseNotFound { lease: l }),
    }
}

async fn holds(tx: &Transaction<'_>, s: &str, c: &Compare) -> Result<bool, StoreError> {
    Ok(c.holds(current(tx, s, &c.key).await?.as_ref()))
}

impl Store for PostgresStore {
    type Watch = PostgresWatch;

    async fn revision(&self) -> Result<Version, StoreError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_one(
                &prepared(
                    &client,
                    &format!("SELECT revision FROM {}.meta WHERE id = 1", self.schema()),
                )
                .await?,
                &[],
            )
            .await
            .map_err(err)?;
        Ok(version(row.get(0)))
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        let s = self.schema();
        let client = self.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_opt(
                &prepared(
                    &client,
                    &format!(
                        "SELECT {KV_COLUMNS} FROM {s}.kv k WHERE k.key = $1 AND {}",
                        live(s)
                    ),
                )
                .await?,
                &[&key],
            )
            .await
            .map_err(err)?;
        Ok(row.as_ref().map(kv_of))
    }

    async fn range(&self, prefix: &[u8], limit: Option<usize>) -> Result<RangeResult, StoreError> {
        let s = self.schema();
        let mut client = self.pool.get().await.map_err(pool_error)?;
        // One snapshot for the keys and the revision.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(err)?;
        let revision: i64 = tx
            .query_one(
                &prepared(&tx, &format!("SELECT revision FROM {s}.meta WHERE id = 1")).await?,
                &[],
            )
            .await
            .map_err(err)?
            .get(0);
        let fetch = limit.map_or(i64::MAX, |l| {
            i64::try_from(l).unwrap_or(i64::MAX).saturating_add(1)
        });
        let len = i32::try_from(prefix.len()).unwrap_or(i32::MAX);
        let rows = tx
            .query(
                &prepared(
                    &tx,
                    &format!(
                        "SELECT {KV_COLUMNS} FROM {s}.kv k WHERE substr(k.key, 1, $2) = $1 AND {}
                     ORDER BY k.key LIMIT $3",
                        live(s)
                    ),
                )
                .await?,
                &[&prefix, &len, &fetch],
            )
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        let mut kvs: Vec<KeyValue> = rows.iter().map(kv_of).collect();
        let more = limit.is_some_and(|l| kvs.len() > l);
        if let Some(l) = limit {
            kvs.truncate(l);
        }
        Ok(RangeResult::new(kvs, more, version(revision)))
    }

    async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        check_value(value)?;
        let s = self.schema().to_owned();
        self.write(async |tx, rev| {
            lease_alive(tx, &s, options.lease).await?;
            let cur = current(tx, &s, key).await?;
            if !options.expect.holds(cur.as_ref()) {
                return Ok(WriteOutcome::Conflict { current: cur });
            }
            let r = rev.bump();
            let prev = put_key(tx, &s, key, value, options.lease, r, cur).await?;
            Ok(WriteOutcome::Committed {
                revision: version(r),
                prev,
            })
        })
        .await
    }

    async fn delete(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        let s = self.schema().to_owned();
        self.write(async |tx, rev| {
            let cur = current(tx, &s, key).await?;
            if !expect.holds(cur.as_ref()) {
                return Ok(WriteOutcome::Conflict { current: cur });
            }
            if cur.is_none() {
                return Ok(WriteOutcome::Committed {
                    revision: version(rev.current),
                    prev: None,
                });
            }
            let r = rev.bump();
            let prev = delete_key(tx, &s, key, r).await?;
            Ok(WriteOutcome::Committed {
                revision: version(r),
                prev,
            })
        })
        .await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        txn.check()?;
        let s = self.schema().to_owned();
        self.write(async |tx, rev| {
            let mut succeeded = true;
            for c in &txn.compares {
                if !holds(tx, &s, c).await? {
                    succeeded = false;
                    break;
                }
            }
            let ops = if succeeded {
                &txn.success
            } else {
                &txn.failure
            };
            for op in ops {
                if let TxnOp::Put { lease, .. } = op {
                    lease_alive(tx, &s, *lease).await?;
                }
            }
            let mut writes = false;
            for op in ops {
                writes |= match op {
                    TxnOp::Put { .. } => true,
                    TxnOp::Delete { key } => current(tx, &s, key).await?.is_some(),
                    TxnOp::Get { .. } => false,
                };
            }
            let r = if writes { rev.bump() } else { rev.current };
            let mut results = Vec::with_capacity(ops.len());
            for op in ops {
                results.push(match op {
                    TxnOp::Put { key, value, lease } => TxnOpResult::Put {
                        prev: put_key(tx, &s, key, value, *lease, r, current(tx, &s, key).await?)
                            .await?,
                    },
                    TxnOp::Delete { key } => TxnOpResult::Delete {
                        prev: delete_key(tx, &s, key, r).await?,
                    },
                    TxnOp::Get { key } => TxnOpResult::Get {
                        kv: current(tx, &s, key).await?,
                    },
                });
            }
            Ok(TxnOutcome::new(succeeded, version(r), results))
        })
        .await
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant, StoreError> {
        let ms = ttl_ms(ttl)?;
        let client = self.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_one(
                &prepared(&client, &format!(
                    "INSERT INTO {}.leases (ttl_ms, deadline)
                     VALUES ($1, clock_timestamp() + $1::bigint * interval '1 millisecond') RETURNING id",
                    self.schema()
                )).await?,
                &[&ms],
            )
            .await
            .map_err(err)?;
        self.shared.changed.notify_waiters();
        Ok(LeaseGrant::new(
            LeaseId::new(row.get(0)),
            Duration::from_millis(ms.unsigned_abs()),
        ))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_opt(
                &prepared(&client, &format!(
                    "UPDATE {}.leases SET deadline = clock_timestamp() + ttl_ms * interval '1 millisecond'
                     WHERE id = $1 AND deadline > clock_timestamp() RETURNING ttl_ms",
                    self.schema()
                )).await?,
                &[&lease.get()],
            )
            .await
            .map_err(err)?;
        match row {
            Some(r) => Ok(Duration::from_millis(r.get::<_, i64>(0).unsigned_abs())),
            None => Err(StoreError::LeaseNotFound { lease }),
        }
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        let s = self.schema().to_owned();
        self.write(async |tx, rev| {
            let gone = tx
                .execute(
                    &prepared(tx, &format!("DELETE FROM {s}.leases WHERE id = $1")).await?,
                    &[&lease.get()],
                )
                .await
                .map_err(err)?;
            if gone == 0 {
                return Err(StoreError::LeaseNotFound { lease });
            }
            delete_lease_keys(tx, rev, lease.get()).await
        })
        .await
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_opt(
                &prepared(
                    &client,
                    &format!(
                        "SELECT (extract(epoch FROM deadline - clock_timestamp()) * 1000)::bigint
                     FROM {}.leases WHERE id = $1 AND deadline > clock_timestamp()",
                        self.schema()
                    ),
                )
                .await?,
                &[&lease.get()],
            )
            .await
            .map_err(err)?;
        match row {
            Some(r) => Ok(Duration::from_millis(
                r.get::<_, i64>(0).max(0).unsigned_abs(),
            )),
            None => Err(StoreError::LeaseNotFound { lease }),
        }
    }

    async fn compact(&self, revision: Version) -> Result<(), StoreError> {
        compact(&self.pool, self.schema(), rev_param(revision)).await
    }

    async fn watch(&self, span: KeySpan, from: Version) -> Result<PostgresWatch, StoreError> {
        if let KeySpan::Key(k) = &span {
            check_key(k)?;
        }
        let client = self.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_one(
                &prepared(
                    &client,
                    &format!(
                        "SELECT revision, compacted FROM {}.meta WHERE id = 1",
                        self.schema()
                    ),
                )
                .await?,
                &[],
            )
            .await
            .map_err(err)?;
        let (revision, compacted): (i64, i64) = (row.get(0), row.get(1));
        let next = if from == Version::ZERO {
            revision + 1
        } else {
            rev_param(from)
        };
        if next <= compacted {
            return Err(StoreError::Compacted {
                requested: from,
                first_kept: version(compacted + 1),
            });
        }
        Ok(PostgresWatch {
            store: self.clone(),
            span,
            next,
            ready: std::collections::VecDeque::new(),
        })
    }
}

fn ttl_ms(ttl: Duration) -> Result<i64, StoreError> {
    if ttl.is_zero() {
        return Err(StoreError::InvalidTtl {
            reason: "a lease needs a positive time to live",
        });
    }
    // Whole milliseconds, rounded up so a lease never lives less than asked.
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).map_err(|_| StoreError::InvalidTtl {
        reason: "time to live too large",
    })
}

/// Drops events up to `upto` (capped at the current revision).
async fn compact(pool: &Pool, s: &str, upto: i64) -> Result<(), StoreError> {
    let mut client = pool.get().await.map_err(pool_error)?;
    let tx = client.transaction().await.map_err(err)?;
    let row = tx
        .query_one(
            &prepared(
                &tx,
                &format!("SELECT revision, compacted FROM {s}.meta WHERE id = 1 FOR UPDATE"),
            )
            .await?,
            &[],
        )
        .await
        .map_err(err)?;
    let (revision, compacted): (i64, i64) = (row.get(0), row.get(1));
    let upto = upto.min(revision);
    if upto > compacted {
        tx.execute(
            &prepared(&tx, &format!("DELETE FROM {s}.events WHERE revision <= $1")).await?,
            &[&upto],
        )
        .await
        .map_err(err)?;
        tx.execute(
            &prepared(
                &tx,
                &format!("UPDATE {s}.meta SET compacted = $1 WHERE id = 1"),
            )
            .await?,
            &[&upto],
        )
        .await
        .map_err(err)?;
    }
    tx.commit().await.map_err(|e| pg_error(e, true))
}

/// A watch on a [`PostgresStore`]: reads `events` from the next revision
/// it has not delivered; woken by `LISTEN`, and re-reading at least every
/// second regardless.
pub struct PostgresWatch {
    store: PostgresStore,
    span: KeySpan,
    /// The first revision not yet read.
    next: i64,
    ready: std::collections::VecDeque<WatchEvent>,
}

impl PostgresWatch {
    async fn fill(&mut self) -> Result<(), StoreError> {
        let s = self.store.schema().to_owned();
        let mut client = self.store.pool.get().await.map_err(pool_error)?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(err)?;
        let meta = tx
            .query_one(
                &prepared(
                    &tx,
                    &format!("SELECT revision, compacted FROM {s}.meta WHERE id = 1"),
                )
                .await?,
                &[],
            )
            .await
            .map_err(err)?;
        let (revision, compacted): (i64, i64) = (meta.get(0), meta.get(1));
        if self.next <= compacted {
            return Err(StoreError::Compacted {
                requested: version(self.next),
                first_kept: version(compacted + 1),
            });
        }
        if self.next > revision {
            return Ok(());
        }
        let (key, prefix): (&[u8], bool) = match &self.span {
            KeySpan::Key(k) => (k, false),
            KeySpan::Prefix(p) => (p, true),
        };
        let len = i32::try_from(key.len()).unwrap_or(i32::MAX);
        let rows = tx
            .query(
                &prepared(&tx, &format!(
                    "SELECT revision, key, kind, value, create_revision, writes, lease FROM {s}.events
                     WHERE revision >= $1 AND revision <= $2
                       AND (CASE WHEN $4 THEN substr(key, 1, $5) = $3 ELSE key = $3 END)
                     ORDER BY revision, key"
                )).await?,
                &[&self.next, &revision, &key, &prefix, &len],
            )
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        for row in rows {
            let (r, key, kind): (i64, Vec<u8>, i16) = (row.get(0), row.get(1), row.get(2));
            let event = if kind == 1 {
                WatchEvent::deleted(key, version(r))
            } else {
                let lease: Option<i64> = row.get(6);
                WatchEvent::new(
                    EventKind::Put,
                    KeyValue::new(
                        key,
                        row.get(3),
                        version(row.get(4)),
                        version(r),
                        u64::try_from(row.get::<_, i64>(5)).unwrap_or(0),
                        lease.map(LeaseId::new),
                    ),
                )
            };
            self.ready.push_back(event);
        }
        self.next = revision + 1;
        Ok(())
    }
}

impl Watch for PostgresWatch {
    async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(e);
            }
            let shared = Arc::clone(&self.store.shared);
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            self.fill().await?;
            if self.ready.is_empty() {
                // Notifications are an optimisation: re-read every second.
                let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
            }
        }
    }
}

/// Holds a `LISTEN` connection and wakes watchers on notifications;
/// reconnects after failures.
async fn listen(config: tokio_postgres::Config, shared: std::sync::Weak<Shared>) {
    loop {
        let Some(channel) = shared.upgrade().map(|s| s.channel.clone()) else {
            return;
        };
        if let Ok((client, mut connection)) = config.connect(NoTls).await {
            let sql = format!("LISTEN {channel}");
            let listen = client.batch_execute(&sql);
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
            let (listened, ()) = tokio::join!(listen, drive);
            let _ = listened;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reaps expired leases at their deadlines (checking at least every
/// 250 ms) and trims history beyond the configured length.
async fn reap(pool: Pool, shared: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(s) = shared.upgrade() else {
            return;
        };
        let store = PostgresStore {
            pool: pool.clone(),
            shared: Arc::clone(&s),
        };
        drop(s);
        let due = async {
            let client = store.pool.get().await.map_err(pool_error)?;
            let row = client
                .query_one(
                    &prepared(&client, &format!(
                        "SELECT EXISTS (SELECT 1 FROM {}.leases WHERE deadline <= clock_timestamp()),
                                (SELECT revision FROM {0}.meta WHERE id = 1),
                                (SELECT compacted FROM {0}.meta WHERE id = 1)",
                        store.schema()
                    )).await?,
                    &[],
                )
                .await
                .map_err(err)?;
            Ok::<(bool, i64, i64), StoreError>((row.get(0), row.get(1), row.get(2)))
        };
        if let Ok((expired, revision, compacted)) = due.await {
            if expired {
                let _ = store.write(async |_, _| Ok(())).await;
            }
            let keep = i64::try_from(store.shared.history).unwrap_or(i64::MAX);
            if revision - compacted > keep.saturating_mul(2) {
                let _ = compact(&store.pool, store.schema(), revision - keep).await;
            }
        }
        // `store` (and its strong reference) is dropped before sleeping.
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}
