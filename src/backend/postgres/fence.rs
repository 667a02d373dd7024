//! Fencing inside the user's own PostgreSQL transactions.

use std::ops::{Deref, DerefMut};

use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Transaction, TransactionBuilder};

use super::store::{check_schema, pg_error};
#[cfg(feature = "sqlx")]
use super::store::{classify, session_lost};
use crate::coord::{CoordError, Fenced, FencingToken};
use crate::store::StoreError;

/// The longest fence name, in bytes.
pub const MAX_FENCE_NAME: usize = 256;

/// A fence kept in a table of your own PostgreSQL database, checked inside
/// your own transactions: the resource enforces the token, next to the
/// data it guards.
///
/// An admission raises the highest token recorded for a fence name to
/// yours, or, if a higher one was recorded, refuses with
/// [`CoordError::Fenced`] naming both; your writes in the same
/// transaction commit or roll back with it. Two ways to admit:
///
/// - [`begin`](PgFence::begin) opens a [`FencedTransaction`] whose
///   [`commit`](FencedTransaction::commit) sends the admission with
///   `COMMIT` in one message: a fenced transaction makes the round trips
///   of an unfenced one, and the fence is locked only while the
///   transaction commits. The token is checked when your writes land,
///   as a storage service checking each write's token would
///   ([`commit_sqlx`](PgFence::commit_sqlx) for sqlx).
/// - [`admit`](PgFence::admit) runs the admission as a statement of its
///   own where you call it, usually first: everything the transaction
///   reads afterwards follows every older holder's commit
///   ([`admit_sqlx`](PgFence::admit_sqlx) for sqlx).
///
/// Tokens come from any calm grant on any backend
/// ([`Lock`](crate::coord::Lock), [`Election`](crate::coord::Election),
/// [`Ownership`](crate::coord::Ownership) views, [`Idempotent`](crate::coord::Idempotent)
/// claims): a leader elected on etcd can guard tables in PostgreSQL.
///
/// # Why a stale holder can never commit after a newer one
///
/// Every admission on a name takes that name's advisory lock
/// (`pg_advisory_xact_lock(FENCE_LOCK_CLASS, hashtext(name))`), held until
/// its transaction ends: *exclusive* to raise the recorded token (then it
/// writes the fence's row), *shared* to present the recorded token again
/// under READ COMMITTED (no row is written, so a holder's transactions on
/// one name run side by side and cost a lookup and a lock in memory). A
/// token below the recorded one is refused without waiting: tokens only
/// grow.
///
/// - READ COMMITTED: a raise waits for every open admission on the name
///   to end, and an admission waits for an open raise to end, then reads
///   the row again with a fresh snapshot. A lower token that arrives
///   second is refused; a higher token that arrives second waits, so the
///   lower token's transaction commits first. Either way commits are in
///   token order.
/// - REPEATABLE READ and SERIALIZABLE: a snapshot may predate a raise, so
///   every admission takes the lock exclusive and writes the row (as a
///   raise does); one that finds the row changed since its snapshot fails
///   with a serialization error ([`StoreError::Unavailable`], retryable:
///   nothing was written); run the transaction again and it is admitted
///   or refused on the current row. The ordering argument is otherwise
///   the same.
///
/// An application that takes advisory locks of its own with the two-key
/// form and [`FENCE_LOCK_CLASS`] as the first key shares them with the
/// fences (a collision costs waiting, never a wrong answer).
///
/// Admit before acting on what you read: under READ COMMITTED, rows read
/// before the admission may predate a newer holder's commit.
///
/// A holder frozen *inside* its transaction (a GC pause after `admit`)
/// keeps the fence locked, so its successor's admission waits for
/// that transaction to end. Set `idle_in_transaction_session_timeout` on
/// the sessions that admit (a few seconds, say): the server then ends a
/// frozen session and rolls its writes back, and the successor goes on.
/// `lock_timeout` makes the successor give up sooner instead (a retryable
/// [`StoreError::Unavailable`]). Either way the frozen holder's commit
/// fails when it wakes.
///
/// A resource that cannot check tokens at all (an external API, email)
/// cannot be fenced: give each effect an idempotency key instead
/// ([`Idempotent`](crate::coord::Idempotent)), so a repeat is harmless.
///
/// # Schema
///
/// One table and one function, created by [`migrate`](PgFence::migrate)
/// or by your own migration tool with the SQL of
/// [`migration`](PgFence::migration) (idempotent):
///
/// ```sql
/// CREATE SCHEMA IF NOT EXISTS calm;
/// CREATE TABLE IF NOT EXISTS calm.fences (
///     name text PRIMARY KEY,
///     token bigint NOT NULL CHECK (token >= 0));
/// -- fence_admit(n, t): refuses t below the recorded token; takes the
/// -- advisory lock (FENCE_LOCK_CLASS, hashtext(n)) shared for t equal to
/// -- it under READ COMMITTED, else exclusive with one upsert raising
/// -- fence n to t (ON CONFLICT ... WHERE f.token <= t); returns the
/// -- fence's token.
/// CREATE OR REPLACE FUNCTION calm.fence_admit(n text, t bigint) RETURNS bigint ...
/// -- fence_require(n, t): fence_admit, raising SQLSTATE CF001 (the
/// -- recorded token as its detail) if t is refused; sent before COMMIT.
/// CREATE OR REPLACE FUNCTION calm.fence_require(n text, t bigint) RETURNS void ...
/// ```
///
/// Run the migration again after upgrading calm: it is idempotent and
/// installs functions added since.
///
/// The function keeps the admission to one round trip with a plan the
/// server caches per session (a bare upsert sent unprepared is planned on
/// every call).
///
/// # Examples
///
/// ```no_run
/// use calm::backend::postgres::PgFence;
/// use calm::coord::FencingToken;
///
/// # async fn run(client: &mut tokio_postgres::Client, token: FencingToken)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// let fence = PgFence::new("calm")?;
/// fence.migrate(&*client).await?;
/// let tx = client.transaction().await?;
/// fence.admit(&tx, "accounts", token).await?; // refused if a newer holder wrote
/// tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]).await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PgFence {
    /// [`migration`](PgFence::migration)'s SQL.
    migration: String,
    /// The admission: a call of the `fence_admit` function the migration
    /// installs, which returns the fence's token after it.
    admit: String,
    /// The start of a call of `fence_require`, which refuses by raising:
    /// the name and token follow as literals, for statements sent in one
    /// simple query with `BEGIN` or `COMMIT`.
    require: String,
}

/// The SQLSTATE `fence_require` raises when it refuses a token.
const FENCED_SQLSTATE: &str = "CF001";

/// The first key of the fences' advisory locks (`pg_advisory_xact_lock(
/// class, hashtext(name))`; "calm" in ASCII). The two-key form never
/// meets a lock taken with one `bigint` key.
pub const FENCE_LOCK_CLASS: i32 = 0x6361_6c6d;

impl PgFence {
    /// A fence table in `schema` (1-40 ASCII letters, digits or `_`).
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidEndpoint`] for an invalid schema name.
    pub fn new(schema: &str) -> Result<Self, StoreError> {
        check_schema(schema)?;
        let s = schema;
        Ok(Self {
            migration: format!(
                "SELECT pg_advisory_xact_lock(hashtext('calm_fence_migrate'));\n\
                 CREATE SCHEMA IF NOT EXISTS {s};\n\
                 CREATE TABLE IF NOT EXISTS {s}.fences (\n    \
                     name text PRIMARY KEY,\n    \
                     token bigint NOT NULL CHECK (token >= 0));\n\
                 -- Raises fence n to token t unless a higher one is recorded;\n\
                 -- returns the fence's token after it (t when admitted). A token\n\
                 -- equal to the recorded one takes the fence's advisory lock\n\
                 -- shared under READ COMMITTED (no row written: its holders run\n\
                 -- side by side); raising takes it exclusive, then the row.\n\
                 CREATE OR REPLACE FUNCTION {s}.fence_admit(n text, t bigint)\n\
                 RETURNS bigint LANGUAGE plpgsql AS $$\n\
                 DECLARE\n    \
                     highest bigint;\n\
                 BEGIN\n    \
                     SELECT f.token INTO highest FROM {s}.fences f WHERE f.name = n;\n    \
                     IF highest > t THEN\n        \
                         RETURN highest;\n    \
                     END IF;\n    \
                     IF highest = t AND current_setting('transaction_isolation') = 'read committed' THEN\n        \
                         PERFORM pg_advisory_xact_lock_shared({FENCE_LOCK_CLASS}, hashtext(n));\n        \
                         SELECT f.token INTO highest FROM {s}.fences f WHERE f.name = n;\n        \
                         IF highest >= t THEN\n            \
                             RETURN highest;\n        \
                         END IF;\n    \
                     END IF;\n    \
                     PERFORM pg_advisory_xact_lock({FENCE_LOCK_CLASS}, hashtext(n));\n    \
                     INSERT INTO {s}.fences AS f (name, token) VALUES (n, t)\n    \
                     ON CONFLICT (name) DO UPDATE SET token = excluded.token\n    \
                     WHERE f.token <= excluded.token\n    \
                     RETURNING f.token INTO highest;\n    \
                     IF highest IS NULL THEN\n        \
                         SELECT f.token INTO highest FROM {s}.fences f WHERE f.name = n;\n    \
                     END IF;\n    \
                     RETURN highest;\n\
                 END $$;\n\
                 -- fence_admit, raising SQLSTATE CF001 (the recorded token in\n\
                 -- its detail) when a higher token is recorded: it aborts the\n\
                 -- transaction, so a COMMIT sent after it never runs.\n\
                 CREATE OR REPLACE FUNCTION {s}.fence_require(n text, t bigint)\n\
                 RETURNS void LANGUAGE plpgsql AS $$\n\
                 DECLARE\n    \
                     highest bigint := {s}.fence_admit(n, t);\n\
                 BEGIN\n    \
                     IF highest <> t THEN\n        \
                         RAISE EXCEPTION 'fence %: token % refused, % recorded', n, t, highest\n            \
                         USING ERRCODE = '{FENCED_SQLSTATE}', DETAIL = highest::text;\n    \
                     END IF;\n\
                 END $$;\n"
            ),
            admit: format!("SELECT {s}.fence_admit($1, $2)"),
            require: format!("SELECT {s}.fence_require("),
        })
    }

    /// The SQL that creates the fence table (idempotent), for teams that
    /// apply schema changes with their own tools.
    pub fn migration(&self) -> &str {
        &self.migration
    }

    /// The statement that admits `presented` (checked) for fence `name`
    /// or aborts the transaction, with both as literals: it goes in one
    /// simple-query message with `BEGIN` or `COMMIT`.
    fn require(&self, name: &str, presented: i64) -> String {
        format!("{}{}, {presented})", self.require, literal(name))
    }

    /// Runs [`migration`](PgFence::migration) on `client`.
    ///
    /// # Errors
    ///
    /// A database error, as a [`StoreError`].
    ///
    /// # Cancel safety
    ///
    /// Safe to drop: the statements are idempotent.
    pub async fn migrate(&self, client: &impl GenericClient) -> Result<(), StoreError> {
        client
            .batch_execute(&self.migration)
            .await
            .map_err(|e| pg_error(e, false))
    }

    /// Admits `token` for fence `name` inside `tx`, or refuses it.
    ///
    /// One round trip: a call of the `fence_admit` function the migration
    /// installs (sent with its parameter types, so nothing is prepared
    /// first; the server keeps the function's plan per session). A
    /// [`deadpool_postgres::Transaction`] dereferences to the
    /// `tokio_postgres` one this takes.
    ///
    /// # Errors
    ///
    /// [`CoordError::Fenced`] if a higher token was recorded for `name`
    /// (roll the transaction back: the holder has been superseded);
    /// [`CoordError::InvalidName`] for an empty name or one over
    /// [`MAX_FENCE_NAME`] bytes, or a token above `i64::MAX`; a database
    /// error as [`CoordError::Store`] (a serialization failure is
    /// retryable). After any error the transaction is aborted or unchanged;
    /// nothing of the admission stays.
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves the transaction in an unknown state: roll it
    /// back.
    ///
    /// # Performance
    ///
    /// Awaited before your first statement, the admission adds one round
    /// trip and one statement to the transaction. Polled concurrently with
    /// your first statement (tokio-postgres then pipelines both on the
    /// connection) it adds no wait for the network, though each statement
    /// still carries its own sync and round of server work, which near the
    /// database (loopback, a fast LAN) is most of the cost: prefer
    /// [`begin`](PgFence::begin), whose admission shares `COMMIT`'s
    /// message. BENCHMARKS.md measures the three side by side.
    ///
    /// ```no_run
    /// # use calm::backend::postgres::PgFence;
    /// # use calm::coord::FencingToken;
    /// # async fn run(client: &mut tokio_postgres::Client, fence: PgFence, token: FencingToken)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let tx = client.transaction().await?;
    /// let (admitted, updated) = tokio::join!(
    ///     fence.admit(&tx, "accounts", token),
    ///     tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]),
    /// );
    /// match (admitted, updated) {
    ///     (Ok(()), Ok(_)) => tx.commit().await?,
    ///     (admitted, updated) => {
    ///         tx.rollback().await?;
    ///         admitted?;
    ///         updated?;
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn admit(
        &self,
        tx: &Transaction<'_>,
        name: &str,
        token: FencingToken,
    ) -> Result<(), CoordError> {
        let presented = check_admission(name, token)?;
        // A transaction's statement applies nothing if its connection
        // breaks: the transaction rolls back.
        let highest: i64 = tx
            .query_typed_one(
                &self.admit,
                &[(&name, Type::TEXT), (&presented, Type::INT8)],
            )
            .await
            .map_err(|e| CoordError::Store(pg_error(e, false)))?
            .get(0);
        admission(token, presented, highest)
    }

    /// Opens a transaction on `client` whose commit admits `token` for
    /// fence `name`: [`FencedTransaction::commit`] sends the admission and
    /// `COMMIT` as one message, so a fenced transaction costs the round
    /// trips of an unfenced one. A [`deadpool_postgres::Client`]
    /// dereferences to the `tokio_postgres` one this takes.
    ///
    /// The name and token are checked here; the fence, when the
    /// transaction commits. Until then your statements run unfenced, as
    /// they would against a storage service that checks the token of each
    /// write: if a newer token was admitted meanwhile, the commit is
    /// refused and everything rolls back. Under READ COMMITTED, rows your
    /// transaction *reads* may therefore predate an older holder's
    /// concurrent commit; if you compute writes from reads in your own
    /// code, use REPEATABLE READ ([`begin_with`](PgFence::begin_with)),
    /// where such a commit in between fails yours with a retryable
    /// serialization error, or [`admit`](PgFence::admit) first.
    ///
    /// Use one way per fence name: a transaction that admits first takes
    /// the fence before your rows, one that admits at commit takes
    /// your rows first, and two taking them in opposite orders deadlock
    /// (the server breaks it, failing one with a retryable error).
    ///
    /// # Errors
    ///
    /// [`CoordError::InvalidName`] for an empty name, one over
    /// [`MAX_FENCE_NAME`] bytes or containing NUL, or a token above
    /// `i64::MAX`; a database error as [`CoordError::Store`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it returns, the transaction (if it was
    /// opened) rolls back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use calm::backend::postgres::PgFence;
    /// use calm::coord::FencingToken;
    ///
    /// # async fn run(client: &mut tokio_postgres::Client, token: FencingToken)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let fence = PgFence::new("calm")?;
    /// let tx = fence.begin(client, "accounts", token).await?;
    /// tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]).await?;
    /// tx.commit().await?; // refused, and rolled back, if a newer holder wrote
    /// # Ok(())
    /// # }
    /// ```
    pub async fn begin<'c>(
        &self,
        client: &'c mut Client,
        name: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction<'c>, CoordError> {
        self.begin_with(client.build_transaction(), name, token)
            .await
    }

    /// [`begin`](PgFence::begin) with the transaction's options (isolation
    /// level, read only, deferrable) set on `builder`.
    ///
    /// # Errors
    ///
    /// As [`begin`](PgFence::begin).
    ///
    /// # Cancel safety
    ///
    /// As [`begin`](PgFence::begin).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use calm::backend::postgres::PgFence;
    /// use calm::coord::FencingToken;
    /// use tokio_postgres::IsolationLevel;
    ///
    /// # async fn run(client: &mut tokio_postgres::Client, fence: PgFence, token: FencingToken)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let builder = client
    ///     .build_transaction()
    ///     .isolation_level(IsolationLevel::RepeatableRead);
    /// let tx = fence.begin_with(builder, "accounts", token).await?;
    /// let balance: i64 = tx
    ///     .query_one("SELECT balance FROM accounts WHERE id = 1", &[])
    ///     .await?
    ///     .get(0);
    /// tx.execute("UPDATE accounts SET balance = $1 WHERE id = 1", &[&(balance - 10)])
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn begin_with<'c>(
        &self,
        builder: TransactionBuilder<'c>,
        name: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction<'c>, CoordError> {
        let presented = check_admission(name, token)?;
        let commit = format!("{}; COMMIT", self.require(name, presented));
        let tx = builder
            .start()
            .await
            .map_err(|e| CoordError::Store(pg_error(e, false)))?;
        Ok(FencedTransaction { tx, commit, token })
    }

    /// [`admit`](PgFence::admit) for [`sqlx`] (feature `sqlx`): admits
    /// `token` for fence `name` on `conn`, which must be inside a
    /// transaction (pass `&mut *tx` for a `sqlx::Transaction<'_, Postgres>`),
    /// or refuses it. The same SQL and the same guarantees as `admit`.
    ///
    /// # Errors
    ///
    /// As [`admit`](PgFence::admit); a database error is
    /// [`CoordError::Store`] with the sqlx error as its source
    /// ([`StoreError::Unavailable`] for a serialization failure, a
    /// deadlock or a lost connection: nothing was written).
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves the transaction in an unknown state: roll it
    /// back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use calm::backend::postgres::PgFence;
    /// use calm::coord::FencingToken;
    ///
    /// # async fn run(pool: sqlx::PgPool, token: FencingToken)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let fence = PgFence::new("calm")?;
    /// let mut tx = pool.begin().await?;
    /// fence.admit_sqlx(&mut tx, "accounts", token).await?;
    /// sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "sqlx")]
    pub async fn admit_sqlx(
        &self,
        conn: &mut sqlx::PgConnection,
        name: &str,
        token: FencingToken,
    ) -> Result<(), CoordError> {
        let presented = check_admission(name, token)?;
        let highest: i64 = sqlx::query_scalar(&self.admit)
            .bind(name)
            .bind(presented)
            .fetch_one(conn)
            .await
            .map_err(|e| sqlx_error(e, false))?;
        admission(token, presented, highest)
    }

    /// Admits `token` for fence `name` and commits `tx`, in one round
    /// trip: the sqlx form of [`FencedTransaction::commit`] (feature
    /// `sqlx`), with the same guarantees and the same caveat on what the
    /// transaction read (see [`begin`](PgFence::begin)). `tx` must be a
    /// transaction, not a savepoint inside one.
    ///
    /// The admission, `COMMIT` and a `BEGIN` go as one message; dropping
    /// `tx` then queues sqlx's `ROLLBACK`, which ends that empty
    /// transaction when the connection is next used (with the ping a pool
    /// sends when the connection comes back). Without the `BEGIN`, the
    /// `ROLLBACK` would find no transaction and the server would log a
    /// warning.
    ///
    /// # Errors
    ///
    /// As [`FencedTransaction::commit`]; [`CoordError::InvalidName`] for a
    /// bad name or token, [`CoordError::InvalidArgument`] for a savepoint
    /// (nothing is sent then, and dropping `tx` rolls the savepoint back).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped once the commit was sent, the transaction
    /// may have committed or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use calm::backend::postgres::PgFence;
    /// use calm::coord::FencingToken;
    ///
    /// # async fn run(pool: sqlx::PgPool, fence: PgFence, token: FencingToken)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// fence.commit_sqlx(tx, "accounts", token).await?; // refused if a newer holder wrote
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "sqlx")]
    pub async fn commit_sqlx(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        name: &str,
        token: FencingToken,
    ) -> Result<(), CoordError> {
        use sqlx::{Database, Postgres, TransactionManager};

        let presented = check_admission(name, token)?;
        if <Postgres as Database>::TransactionManager::get_transaction_depth(&tx) != 1 {
            return Err(CoordError::InvalidArgument {
                reason: "a fenced commit ends a whole transaction, not a savepoint",
            });
        }
        let sql = format!("{}; COMMIT; BEGIN", self.require(name, presented));
        // On failure the rest of the message is skipped, and dropping
        // `tx` rolls back whatever is open.
        let outcome = sqlx::raw_sql(&sql).execute(&mut *tx).await;
        drop(tx);
        match outcome {
            Ok(_) => Ok(()),
            Err(e) => {
                let db = e
                    .as_database_error()
                    .and_then(|d| d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>());
                Err(
                    refusal(token, db.map(|d| d.code()), db.and_then(|d| d.detail()))
                        .unwrap_or_else(|| sqlx_error(e, true)),
                )
            }
        }
    }
}

/// The token as the table stores it, after checking the name.
fn check_admission(name: &str, token: FencingToken) -> Result<i64, CoordError> {
    if name.is_empty() || name.len() > MAX_FENCE_NAME || name.contains('\0') {
        return Err(CoordError::InvalidName {
            reason: "fence names are 1 to MAX_FENCE_NAME (256) bytes, without NUL",
        });
    }
    i64::try_from(token.get()).map_err(|_| CoordError::InvalidName {
        reason: "a token above i64::MAX cannot be recorded",
    })
}

/// `name` as an SQL escape string literal (`E'...'`), which reads the
/// same whatever `standard_conforming_strings` says.
fn literal(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    out.push_str("E'");
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The error of a fenced commit or begin that failed with SQLSTATE
/// `code` and `detail`: `Fenced` if `fence_require` refused `token`,
/// `None` for any other failure.
fn refusal(token: FencingToken, code: Option<&str>, detail: Option<&str>) -> Option<CoordError> {
    if code != Some(FENCED_SQLSTATE) {
        return None;
    }
    let highest: i64 = detail?.parse().ok()?;
    Some(CoordError::Fenced(Fenced::new(
        token,
        FencingToken::new(highest.unsigned_abs()),
    )))
}

/// A transaction whose commit admits a fencing token first, in the same
/// message: opened by [`PgFence::begin`]. It dereferences to the
/// `tokio_postgres` [`Transaction`] it wraps, so statements (and
/// savepoints) run on it as on any transaction. Dropped without
/// [`commit`](FencedTransaction::commit), it rolls back.
pub struct FencedTransaction<'c> {
    /// The open transaction: always a top-level one (begun here), so
    /// `COMMIT` ends it.
    tx: Transaction<'c>,
    /// `SELECT <schema>.fence_require(<name>, <token>); COMMIT`.
    commit: String,
    /// The token admitted at commit.
    token: FencingToken,
}

impl FencedTransaction<'_> {
    /// The token this transaction's commit admits.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Admits the token and commits, in one round trip: the admission
    /// raises the fence's token to this one, or refuses it if a higher
    /// one was recorded, and then nothing of the transaction commits.
    ///
    /// # Errors
    ///
    /// [`CoordError::Fenced`] if a higher token was recorded (everything
    /// rolled back: the holder has been superseded); a database error as
    /// [`CoordError::Store`]: a serialization failure is retryable
    /// ([`StoreError::Unavailable`]), a connection lost once the commit
    /// was sent leaves its outcome unknown ([`StoreError::Indeterminate`]).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped once the commit was sent, the transaction
    /// may have committed or not.
    pub async fn commit(self) -> Result<(), CoordError> {
        let Self { tx, commit, token } = self;
        match tx.batch_execute(&commit).await {
            Ok(()) => {
                // `COMMIT` ended the transaction; the wrapper's only drop
                // work is sending `ROLLBACK` (it owns nothing else: it
                // is not a savepoint), which now has nothing to end.
                std::mem::forget(tx);
                Ok(())
            }
            // Dropping `tx` sends `ROLLBACK`, which ends the transaction
            // if the admission aborted it.
            Err(e) => Err(refusal(
                token,
                e.code().map(|c| c.code()),
                e.as_db_error().and_then(|d| d.detail()),
            )
            .unwrap_or_else(|| CoordError::Store(pg_error(e, true)))),
        }
    }

    /// Rolls the transaction back; nothing is admitted.
    ///
    /// # Errors
    ///
    /// A database error as [`CoordError::Store`] (the transaction ends
    /// either way: a server whose session is gone rolls it back).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped, the transaction still rolls back.
    pub async fn rollback(self) -> Result<(), CoordError> {
        self.tx
            .rollback()
            .await
            .map_err(|e| CoordError::Store(pg_error(e, false)))
    }
}

impl std::fmt::Debug for FencedTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTransaction")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl<'c> Deref for FencedTransaction<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

impl<'c> DerefMut for FencedTransaction<'c> {
    fn deref_mut(&mut self) -> &mut Transaction<'c> {
        &mut self.tx
    }
}

/// The outcome of an admission of `token` (`presented` as stored) after
/// which the fence's token is `highest`.
fn admission(token: FencingToken, presented: i64, highest: i64) -> Result<(), CoordError> {
    if highest == presented {
        Ok(())
    } else {
        Err(CoordError::Fenced(Fenced::new(
            token,
            FencingToken::new(highest.unsigned_abs()),
        )))
    }
}

/// A sqlx failure inside the user's transaction, classified as the
/// tokio-postgres ones are; `sent` marks a commit that was sent, whose
/// outcome a lost connection leaves unknown. Otherwise the transaction
/// wrote nothing that will commit.
#[cfg(feature = "sqlx")]
fn sqlx_error(e: sqlx::Error, sent: bool) -> CoordError {
    let code = match &e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    let lost = match &e {
        sqlx::Error::Database(_) => code.as_deref().is_some_and(session_lost),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    CoordError::Store(classify(code.as_deref(), lost, sent, Box::new(e)))
}
