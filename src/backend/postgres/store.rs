use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, QueueMode, RecyclingMethod};
use tokio::sync::{Notify, oneshot, watch};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{NoTls, Row, Socket};

use super::batch::{self, Queue, Reply, Request};
use super::reads::{Pending, Reads};
use super::sql::Sql;
use super::tasks::{self, ListenState};
use crate::occ::Version;
use crate::store::{
    BoxError, Compare, EventKind, Expect, History, KeySpan, KeyValue, LeaseGrant, LeaseId,
    PolledWatch, PutOptions, RangeResult, Store, StoreError, Txn, TxnOp, TxnOpResult, TxnOutcome,
    Watch, WatchEvent, WriteOutcome, check_key, check_lease, check_prefix, check_ttl, check_value,
    prefix_end,
};

/// Settings of a [`PostgresStore`].
///
/// # Examples
///
/// ```
/// use calm::backend::postgres::PostgresOptions;
///
/// let options = PostgresOptions::new("host=127.0.0.1 user=app dbname=app")
///     .with_schema("orders_calm")
///     .with_pool_size(16)
///     .with_history(1_000_000);
/// assert_eq!(options.history, 1_000_000);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to PostgresStore::connect_with"]
pub struct PostgresOptions {
    /// A libpq-style connection string or URL.
    pub url: String,
    /// The schema holding the store's tables (one store per schema).
    pub schema: String,
    /// Pooled connections (reads, lease calls and the committers' calls).
    pub pool_size: usize,
    /// Watch events kept; older ones are compacted in the background, so a
    /// watch that falls further behind ends with
    /// [`StoreError::Compacted`].
    pub history: u64,
    /// Tasks that send batches of writes (see the [module docs](super)).
    /// One gathers everything that queued while its previous batch was
    /// on the wire; more let a batch wait at the server for the lock while
    /// the previous one commits, but split the queue into smaller
    /// batches, each paying the call's fixed cost. One was the fastest at
    /// 1–64 writing tasks measured on a 2-core machine.
    pub committers: usize,
}

impl PostgresOptions {
    /// Connects to `url`, schema `calm`, 8 pooled connections, 100,000
    /// events of history, 1 committer.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: "calm".into(),
            pool_size: 8,
            history: 100_000,
            committers: 1,
        }
    }

    /// Uses another schema (1–40 ASCII letters, digits and `_`).
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the pool size (at least 1).
    pub fn with_pool_size(mut self, n: usize) -> Self {
        self.pool_size = n.max(1);
        self
    }

    /// Sets how many events of history are kept (at least 1).
    pub fn with_history(mut self, events: u64) -> Self {
        self.history = events.max(1);
        self
    }

    /// Sets the number of committer tasks (at least 1).
    pub fn with_committers(mut self, n: usize) -> Self {
        self.committers = n.max(1);
        self
    }
}

/// A [`Store`] on PostgreSQL. Clones share the pool and the committers.
///
/// See the [module docs](super) for the schema and why the model holds.
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
    pub(super) pool: Pool,
    pub(super) shared: Arc<Shared>,
}

/// What every clone of a store shares.
pub(crate) struct Shared {
    /// The statements of this store's schema.
    pub(super) sql: Arc<Sql>,
    /// Woken on every notification from the listener, and on drop.
    pub(super) changed: Arc<Notify>,
    /// The `LISTEN` connection's demand and state (`None`: a store on a
    /// user's pool, whose watches poll).
    listening: Option<Listening>,
    /// Events to keep.
    pub(super) history: u64,
    /// Watches read again at least this often (woken sooner by LISTEN).
    poll: Duration,
    /// Where writes queue for the committers; dropping it (with the last
    /// store handle) ends them once they have answered what they hold.
    queue: Queue,
    /// Writes called and not yet answered (or given up).
    writes: AtomicUsize,
    /// Where gets go; dropping it ends the reader tasks.
    reads: Reads,
    /// The listener and the reaper, stopped on drop.
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// What a store's watches and its listener task tell each other.
struct Listening {
    /// Live watches: the listener listens while there is one, and for
    /// [`tasks::LISTEN_IDLE`] after the last ends.
    wanted: watch::Sender<usize>,
    /// Whether `LISTEN` is in effect.
    state: watch::Receiver<ListenState>,
}

/// Counts one watch in [`Listening::wanted`] until dropped.
struct Listener(Weak<Shared>);

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(listening) = self.0.upgrade().as_ref().and_then(|s| s.listening.as_ref()) {
            listening.wanted.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

/// How long a new watch waits for the `LISTEN` to be in effect before it
/// reads (past that, or at once while the listener is failing, it reads
/// anyway, and polls until notifications come).
const LISTEN_WAIT: Duration = Duration::from_secs(1);

impl Drop for Shared {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().map(std::mem::take).unwrap_or_default();
        for t in tasks {
            t.abort();
        }
        // Watches end with the store.
        self.changed.notify_waiters();
    }
}

/// A PostgreSQL error with the server's message (tokio-postgres displays
/// database errors only as "db error").
#[derive(Debug)]
struct PgError(tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "postgres: {} ({})", db.message(), db.code().code()),
            None => write!(f, "postgres: {}", self.0),
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The client error's own source (an I/O error); the client error
        // itself says what this one already says.
        std::error::Error::source(&self.0)
    }
}

/// Maps a client error to a store error. `sent` marks a write whose
/// statement reached the server, whose outcome is unknown if the
/// connection then broke.
pub(super) fn pg_error(e: tokio_postgres::Error, sent: bool) -> StoreError {
    let code = e.code().map(|c| c.code().to_owned());
    // No SQLSTATE: the connection broke.
    let lost = e.is_closed() || code.as_deref().is_none_or(session_lost);
    classify(code.as_deref(), lost, sent, Box::new(PgError(e)))
}

/// The store error of a failed statement, from its SQLSTATE (if the
/// server sent one), whether its session is gone and whether it had been
/// sent; one rule for every PostgreSQL client calm drives.
pub(super) fn classify(code: Option<&str>, lost: bool, sent: bool, source: BoxError) -> StoreError {
    // The statement failed and its transaction rolled back, on a
    // connection that still works: nothing was written, and trying again
    // may succeed (serialization failure, deadlock, lock not available,
    // query cancelled, too many connections, starting up).
    const ABORTED: [&str; 6] = ["40001", "40P01", "55P03", "57014", "53300", "57P03"];
    if code.is_some_and(|c| ABORTED.contains(&c)) {
        return StoreError::Unavailable { source };
    }
    match (lost, sent) {
        (true, true) => StoreError::Indeterminate { source },
        (true, false) => StoreError::Unavailable { source },
        (false, _) => StoreError::Backend { source },
    }
}

/// Whether a SQLSTATE says the server ended the session (connection
/// exceptions and operator intervention: shutdown, termination).
pub(super) fn session_lost(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57P")
}

/// A pool failure happens before anything is sent.
pub(super) fn pool_error(e: PoolError) -> StoreError {
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

/// Runs one of a store's statements, prepared once per pooled connection
/// (a cached statement runs in one round trip), and returns its rows.
/// `write` marks a statement that writes: if the connection breaks once it
/// is sent, its outcome is unknown.
pub(super) async fn query(
    pool: &Pool,
    statement: &str,
    params: &[&(dyn ToSql + Sync)],
    write: bool,
) -> Result<Vec<Row>, StoreError> {
    let client = pool.get().await.map_err(pool_error)?;
    let prepared = client.prepare_cached(statement).await.map_err(err)?;
    client
        .query(&prepared, params)
        .await
        .map_err(|e| pg_error(e, write))
}

/// The first row of a statement that always returns one.
fn one(rows: Vec<Row>) -> Result<Row, StoreError> {
    rows.into_iter().next().ok_or_else(|| StoreError::Backend {
        source: "the statement returned no row".into(),
    })
}

/// Values by position: the columns of a row, or the fields of a
/// composite value.
pub(super) trait Columns {
    /// The value at `i`, as [`Row::get`] reads it (which panics if `T`
    /// does not match the column's type: calm's own statements fix both).
    fn column<'a, T: FromSql<'a>>(&'a self, i: usize) -> T;
}

impl Columns for Row {
    fn column<'a, T: FromSql<'a>>(&'a self, i: usize) -> T {
        self.get(i)
    }
}

/// A key from six values starting at `at`: key, value, create and mod
/// revisions, writes, lease.
pub(super) fn kv_of_columns(row: &impl Columns, at: usize) -> KeyValue {
    let lease: Option<i64> = row.column(at + 5);
    KeyValue::new(
        row.column(at),
        row.column(at + 1),
        Version::from_i64(row.column(at + 2)),
        Version::from_i64(row.column(at + 3)),
        u64::try_from(row.column::<i64>(at + 4)).unwrap_or(0),
        lease.map(LeaseId::new),
    )
}

/// The session settings calm puts on each of its connections: the server
/// ends a transaction left idle (nothing of calm's is, but a pooled
/// connection must never keep a lock because its process froze) and a
/// lock wait that lasts too long, instead of waiting for ever; and calm's
/// statements run at `READ COMMITTED` whatever the server's default
/// isolation (each statement of calm's functions reads what committed
/// before it took the store-wide lock; at `REPEATABLE READ` or
/// `SERIALIZABLE` concurrent writers would fail with serialization
/// errors instead of queueing).
///
/// These are the `options` of a connection string; add them to a pool
/// you pass to [`PostgresStore::from_pool`].
pub const SESSION_OPTIONS: &str = "-c idle_in_transaction_session_timeout=10000 \
     -c lock_timeout=10000 -c default_transaction_isolation=read\\ committed";

/// Checks a schema name: 1-40 ASCII letters, digits or underscores (it is
/// spliced into every statement).
pub(super) fn check_schema(schema: &str) -> Result<(), StoreError> {
    if schema.is_empty()
        || schema.len() > 40
        || !schema
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(StoreError::InvalidEndpoint {
            endpoint: schema.to_owned(),
            source: "schema names are 1-40 ASCII letters, digits or underscores".into(),
        });
    }
    Ok(())
}

impl PostgresStore {
    /// Connects with default options (schema `calm`).
    ///
    /// # Errors
    ///
    /// As [`connect_with`](Self::connect_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; dropped while migrating, the migration's transaction
    /// rolls back.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(PostgresOptions::new(url)).await
    }

    /// Connects, creates or upgrades the schema, and starts the committers,
    /// the listener and the lease reaper.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidEndpoint`] for an invalid schema name or URL,
    /// [`StoreError::Unavailable`] if the database cannot be reached, a
    /// backend error creating the schema.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (it spawns its background tasks).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; dropped while migrating, the migration's transaction
    /// rolls back.
    pub async fn connect_with(options: PostgresOptions) -> Result<Self, StoreError> {
        Self::connect_with_tls(options, NoTls).await
    }

    /// As [`connect_with`](Self::connect_with), over TLS: `tls` is any
    /// `tokio-postgres` TLS connector (`postgres-native-tls`'s
    /// `MakeTlsConnector`, `tokio-postgres-rustls`' `MakeRustlsConnect`,
    /// ...), built with the roots and client certificate you trust. Every
    /// connection of the store (the pool and the `LISTEN` connection) uses
    /// it; whether TLS is required is the URL's `sslmode`. A password goes
    /// in the URL as usual.
    ///
    /// # Errors
    ///
    /// As [`connect_with`](Self::connect_with); a failed handshake is
    /// [`StoreError::Unavailable`].
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (it spawns its background tasks).
    ///
    /// # Cancel safety
    ///
    /// As [`connect_with`](Self::connect_with).
    pub async fn connect_with_tls<T>(options: PostgresOptions, tls: T) -> Result<Self, StoreError>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        check_schema(&options.schema)?;
        let mut config: tokio_postgres::Config =
            options
                .url
                .parse()
                .map_err(|e| StoreError::InvalidEndpoint {
                    endpoint: options.url.clone(),
                    source: Box::new(e),
                })?;
        let session = match config.get_options() {
            Some(own) if !own.is_empty() => format!("{own} {SESSION_OPTIONS}"),
            _ => SESSION_OPTIONS.to_string(),
        };
        config.options(&session);
        if config.get_application_name().is_none() {
            config.application_name("calm");
        }
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // Last in, first out: calls go to the connections used most
        // recently, whose server processes are warm and few, instead of
        // rotating through the whole pool (measured: rotating through 8
        // connections halved the writes per second at 16 tasks).
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .queue_mode(QueueMode::Lifo)
            .build()
            .map_err(|e| StoreError::InvalidEndpoint {
                endpoint: options.url.clone(),
                source: Box::new(e),
            })?;
        let (state, state_rx) = watch::channel(ListenState::Off);
        let (wanted, wanted_rx) = watch::channel(0);
        let listening = Listening {
            wanted,
            state: state_rx,
        };
        let store = Self::start(pool, &options, Duration::from_secs(1), Some(listening)).await?;
        let listener = tokio::spawn(tasks::listen(
            config,
            tls,
            Arc::downgrade(&store.shared),
            state,
            wanted_rx,
        ));
        if let Ok(mut tasks) = store.shared.tasks.lock() {
            tasks.push(listener);
        }
        Ok(store)
    }

    /// A store on a pool you built (your TLS connector, pool size and
    /// hooks); `options.url` is not used. It creates or upgrades the
    /// schema like [`connect_with`](Self::connect_with).
    ///
    /// Two differences from a store that connects itself: it has no
    /// `LISTEN` connection (a pooled connection cannot receive
    /// notifications), so watches read the history every 50 ms instead of
    /// being woken at once; and calm's session settings are not applied
    /// to your connections: add [`SESSION_OPTIONS`] to your pool's
    /// connection options so that no calm statement waits on a lock
    /// forever, and so that calm's statements run at `READ COMMITTED`.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidEndpoint`] for an invalid schema name or a
    /// pool whose sessions default to another isolation level than
    /// `READ COMMITTED` (a server configured for `SERIALIZABLE`, say:
    /// calm's writers would fail with serialization errors instead of
    /// queueing), or as [`connect_with`](Self::connect_with) while
    /// creating the schema.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (it spawns its background tasks).
    ///
    /// # Cancel safety
    ///
    /// As [`connect_with`](Self::connect_with).
    pub async fn from_pool(pool: Pool, options: PostgresOptions) -> Result<Self, StoreError> {
        check_schema(&options.schema)?;
        Self::start(pool, &options, Duration::from_millis(50), None).await
    }

    /// Migrates, then starts the committers and the reaper; watches read
    /// again at least every `poll`.
    async fn start(
        pool: Pool,
        options: &PostgresOptions,
        poll: Duration,
        listening: Option<Listening>,
    ) -> Result<Self, StoreError> {
        let sql = Arc::new(Sql::new(&options.schema));
        migrate(&pool, &sql).await?;
        let (queue, committers) = batch::spawn(pool.clone(), Arc::clone(&sql), options.committers);
        drop(committers);
        let reads = Reads::spawn(pool.clone(), Arc::clone(&sql));
        let shared = Arc::new(Shared {
            reads,
            sql,
            changed: Arc::new(Notify::new()),
            listening,
            history: options.history.max(1),
            poll,
            queue,
            writes: AtomicUsize::new(0),
            tasks: std::sync::Mutex::new(Vec::new()),
        });
        let store = Self { pool, shared };
        let reaper = tokio::spawn(tasks::reap(
            store.pool.clone(),
            Arc::downgrade(&store.shared),
        ));
        if let Ok(mut tasks) = store.shared.tasks.lock() {
            tasks.push(reaper);
        }
        Ok(store)
    }

    /// Creates the schema, its tables and functions if they do not exist,
    /// and replaces the functions with this version's (safe to run
    /// concurrently; serialised by an advisory lock). [`connect_with`]
    /// runs it; call it yourself after changing calm's version while
    /// stores stay connected.
    ///
    /// [`connect_with`]: Self::connect_with
    ///
    /// # Errors
    ///
    /// A backend error, or [`StoreError::InvalidEndpoint`] when the
    /// connection's sessions do not default to `READ COMMITTED`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the migration is one transaction.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate(&self.pool, &self.shared.sql).await
    }

    /// Closes the pool: later calls fail with [`StoreError::Closed`].
    /// Writes already sent finish.
    pub fn close(&self) {
        self.pool.close();
        if let Ok(mut tasks) = self.shared.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }

    fn sql(&self) -> &Sql {
        &self.shared.sql
    }

    /// Sends one request (itself if no other write is pending, else
    /// through the committers) and waits for its outcome.
    async fn submit(
        &self,
        compares: Vec<Compare>,
        success: Vec<TxnOp>,
        failure: Vec<TxnOp>,
        single: Option<Expect>,
    ) -> Result<Reply, StoreError> {
        if self.pool.is_closed() {
            return Err(StoreError::Closed);
        }
        let (reply, answer) = oneshot::channel();
        let request = Request {
            compares,
            success,
            failure,
            single,
            reply,
        };
        // With no other write of this store pending there is nothing to
        // batch with: the caller sends it, sparing the hops to a committer
        // and back. A write called meanwhile queues, so batches still form
        // under load.
        let alone = self.shared.writes.fetch_add(1, Ordering::AcqRel) == 0;
        let _pending = Pending(&self.shared.writes);
        if alone {
            return batch::run_alone(&self.pool, self.sql(), request).await;
        }
        self.shared
            .queue
            .send(request)
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Indeterminate {
                source: "the committer stopped before answering".into(),
            })
        })
    }

    /// A single-key write: `write` if `expect` holds, else a read of the
    /// key.
    async fn write_one(
        &self,
        key: &[u8],
        expect: Expect,
        write: TxnOp,
    ) -> Result<WriteOutcome, StoreError> {
        let reply = self
            .submit(
                expect.to_compares(key),
                vec![write],
                vec![TxnOp::get(key)],
                Some(expect),
            )
            .await?;
        let result = reply.results.into_iter().next();
        Ok(if reply.succeeded {
            let prev = match result {
                Some(TxnOpResult::Put { prev } | TxnOpResult::Delete { prev }) => prev,
                _ => None,
            };
            WriteOutcome::Committed {
                revision: reply.revision,
                prev,
            }
        } else {
            let current = match result {
                Some(TxnOpResult::Get { kv }) => kv,
                _ => None,
            };
            WriteOutcome::Conflict { current }
        })
    }
}

/// Checks the pool's sessions and runs [`Sql::migrate`]: its statements go
/// in one message, which the server runs as one transaction and commits
/// (or rolls back) on its own, so a caller that freezes mid-migration
/// holds no lock while the server waits for it.
async fn migrate(pool: &Pool, sql: &Sql) -> Result<(), StoreError> {
    let client = pool.get().await.map_err(pool_error)?;
    let isolation: String = client
        .query_one("SHOW transaction_isolation", &[])
        .await
        .map_err(err)?
        .get(0);
    if isolation != "read committed" {
        return Err(StoreError::InvalidEndpoint {
            endpoint: "the pool's connections".into(),
            source: format!(
                "calm's sessions must default to READ COMMITTED, these to {}: \
                 add SESSION_OPTIONS to the pool's connection options",
                isolation.to_uppercase()
            )
            .into(),
        });
    }
    client
        .batch_execute(&sql.migrate)
        .await
        .map_err(|e| pg_error(e, true))
}

impl Store for PostgresStore {
    type Watch = PostgresWatch;

    async fn revision(&self) -> Result<Version, StoreError> {
        let row = one(query(&self.pool, &self.sql().revision, &[], false).await?)?;
        Ok(Version::from_i64(row.get(0)))
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        self.shared.reads.get(&self.pool, self.sql(), key).await
    }

    async fn range(&self, prefix: &[u8], limit: Option<usize>) -> Result<RangeResult, StoreError> {
        check_prefix(prefix)?;
        let end = prefix_end(prefix);
        let fetch = limit.map_or(i64::MAX, |l| {
            i64::try_from(l).unwrap_or(i64::MAX).saturating_add(1)
        });
        // One statement, one snapshot: the keys and the revision agree.
        let params: [&(dyn ToSql + Sync); 3] = [&prefix, &end, &fetch];
        let rows = query(&self.pool, &self.sql().range, &params, false).await?;
        let revision = rows.first().map_or(0, |r| r.get::<_, i64>(0));
        let mut kvs: Vec<KeyValue> = rows
            .iter()
            .filter(|r| r.get::<_, Option<Vec<u8>>>(1).is_some())
            .map(|r| kv_of_columns(r, 1))
            .collect();
        let more = limit.is_some_and(|l| kvs.len() > l);
        if let Some(l) = limit {
            kvs.truncate(l);
        }
        Ok(RangeResult::new(kvs, more, Version::from_i64(revision)))
    }

    async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        check_value(value)?;
        check_lease(options.lease)?;
        let write = TxnOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: options.lease,
        };
        self.write_one(key, options.expect, write).await
    }

    async fn delete(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        self.write_one(key, expect, TxnOp::delete(key)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        txn.check()?;
        let reply = self
            .submit(txn.compares, txn.success, txn.failure, None)
            .await?;
        Ok(TxnOutcome::new(
            reply.succeeded,
            reply.revision,
            reply.results,
        ))
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant, StoreError> {
        let ms = ttl_ms(ttl)?;
        let row = one(query(&self.pool, &self.sql().grant, &[&ms], true).await?)?;
        Ok(LeaseGrant::new(
            LeaseId::new(row.get(0)),
            Duration::from_millis(ms.unsigned_abs()),
        ))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let rows = query(&self.pool, &self.sql().keep_alive, &[&lease.get()], false).await?;
        match rows.first() {
            Some(r) => Ok(Duration::from_millis(r.get::<_, i64>(0).unsigned_abs())),
            None => Err(StoreError::LeaseNotFound { lease }),
        }
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        let row = one(query(&self.pool, &self.sql().revoke, &[&lease.get()], true).await?)?;
        if row.get::<_, bool>(0) {
            Ok(())
        } else {
            Err(StoreError::LeaseNotFound { lease })
        }
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let rows = query(&self.pool, &self.sql().time_to_live, &[&lease.get()], false).await?;
        match rows.first() {
            Some(r) => Ok(Duration::from_millis(
                r.get::<_, i64>(0).max(0).unsigned_abs(),
            )),
            None => Err(StoreError::LeaseNotFound { lease }),
        }
    }

    async fn compact(&self, revision: Version) -> Result<(), StoreError> {
        compact(&self.pool, self.sql(), revision.to_i64()).await
    }

    async fn watch(&self, span: KeySpan, from: Version) -> Result<PostgresWatch, StoreError> {
        match &span {
            KeySpan::Key(k) => check_key(k)?,
            KeySpan::Prefix(p) => check_prefix(p)?,
        }
        // Notifications first, so that every commit after the read below
        // wakes this watch.
        let listener = self.shared.listening.as_ref().map(|l| {
            l.wanted.send_modify(|n| *n += 1);
            (Listener(Arc::downgrade(&self.shared)), l.state.clone())
        });
        let listener = match listener {
            Some((guard, mut state)) => {
                // Unless the listener is failing (then this watch polls).
                let settled = state.wait_for(|s| *s != ListenState::Off);
                let _ = tokio::time::timeout(LISTEN_WAIT, settled).await;
                Some(guard)
            }
            None => None,
        };
        let (revision, compacted) = marks(&self.pool, self.sql()).await?;
        let next = if from == Version::ZERO {
            revision + 1
        } else {
            from.to_i64()
        };
        if next <= compacted {
            return Err(StoreError::Compacted {
                requested: from,
                first_kept: Version::from_i64(compacted + 1),
            });
        }
        Ok(PostgresWatch {
            inner: PolledWatch::new(self, span, next.unsigned_abs()),
            _listener: listener,
        })
    }
}

fn ttl_ms(ttl: Duration) -> Result<i64, StoreError> {
    check_ttl(ttl)?;
    // Whole milliseconds, rounded up so a lease never lives less than asked.
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).map_err(|_| StoreError::InvalidTtl {
        reason: "time to live too large",
    })
}

/// The store revision and the highest compacted revision.
pub(super) async fn marks(pool: &Pool, sql: &Sql) -> Result<(i64, i64), StoreError> {
    let row = one(query(pool, &sql.marks, &[], false).await?)?;
    Ok((row.get(0), row.get(1)))
}

/// Drops events up to `upto` (capped at the current revision).
pub(super) async fn compact(pool: &Pool, sql: &Sql, upto: i64) -> Result<(), StoreError> {
    query(pool, &sql.compact, &[&upto], true).await.map(drop)
}

/// Revisions one watch read covers at most (bounding the rows fetched).
const WATCH_WINDOW: i64 = 1_000;

impl History for PostgresStore {
    type Weak = (Pool, Weak<Shared>);

    fn downgrade(&self) -> Self::Weak {
        (self.pool.clone(), Arc::downgrade(&self.shared))
    }

    fn upgrade((pool, shared): &Self::Weak) -> Option<Self> {
        let shared = shared.upgrade()?;
        Some(Self {
            pool: pool.clone(),
            shared,
        })
    }

    fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.shared.changed)
    }

    async fn read(
        &self,
        span: &KeySpan,
        next: &mut u64,
        out: &mut VecDeque<WatchEvent>,
    ) -> Result<(), StoreError> {
        let from = i64::try_from(*next).unwrap_or(i64::MAX);
        let (start, prefix, end): (&[u8], bool, Option<Vec<u8>>) = match span {
            KeySpan::Key(k) => (k, false, None),
            KeySpan::Prefix(p) => (p, true, prefix_end(p)),
        };
        let params: [&(dyn ToSql + Sync); 5] = [&from, &WATCH_WINDOW, &start, &prefix, &end];
        let rows = query(&self.pool, &self.sql().events, &params, false).await?;
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let (revision, compacted): (i64, i64) = (first.get(0), first.get(1));
        if from <= compacted {
            return Err(StoreError::Compacted {
                requested: Version::new(*next),
                first_kept: Version::from_i64(compacted + 1),
            });
        }
        if from > revision {
            return Ok(());
        }
        for row in &rows {
            let Some(r) = row.get::<_, Option<i64>>(2) else {
                continue;
            };
            let key: Vec<u8> = row.get(3);
            let event = if row.get::<_, i16>(4) == 1 {
                WatchEvent::deleted(key, Version::from_i64(r))
            } else {
                let lease: Option<i64> = row.get(8);
                WatchEvent::new(
                    EventKind::Put,
                    KeyValue::new(
                        key,
                        row.get(5),
                        Version::from_i64(row.get(6)),
                        Version::from_i64(r),
                        u64::try_from(row.get::<_, i64>(7)).unwrap_or(0),
                        lease.map(LeaseId::new),
                    ),
                )
            };
            out.push_back(event);
        }
        *next = revision
            .min(from.saturating_add(WATCH_WINDOW))
            .unsigned_abs()
            + 1;
        Ok(())
    }

    fn poll_interval(&self) -> Option<Duration> {
        // A notification sent while the listener reconnects is lost; the
        // events are not, and a read at least this often finds them.
        Some(self.shared.poll)
    }

    fn resumes_after(&self, error: &StoreError) -> bool {
        // A broken connection or a restarting server: read again from the
        // same revision once it is back.
        matches!(
            error,
            StoreError::Unavailable { .. } | StoreError::Indeterminate { .. }
        )
    }
}

/// A watch on a [`PostgresStore`]: reads `events` from the next revision
/// it has not delivered, woken by `LISTEN` and re-reading at least every
/// second regardless. It outlives connection failures and server restarts
/// (reading again from where it was, so nothing is skipped or repeated);
/// it ends when its history is compacted under it or the store is closed.
pub struct PostgresWatch {
    inner: PolledWatch<PostgresStore>,
    /// Keeps the store listening while this watch lives.
    _listener: Option<Listener>,
}

impl std::fmt::Debug for PostgresWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresWatch").finish_non_exhaustive()
    }
}

impl Watch for PostgresWatch {
    async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        self.inner.next().await
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.shared.sql.schema)
            .finish_non_exhaustive()
    }
}
