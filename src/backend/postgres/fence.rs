//! Fencing inside the user's own PostgreSQL transactions.

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};

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
/// [`admit`](PgFence::admit) runs one statement in your transaction: it
/// raises the highest token recorded for a fence name to yours, or, if a
/// higher one was recorded, refuses with [`CoordError::Fenced`] naming
/// both. Your writes in the same transaction then commit or roll back
/// with the admission. Tokens come from any calm grant on any backend
/// ([`Lock`](crate::coord::Lock), [`Election`](crate::coord::Election),
/// [`Ownership`](crate::coord::Ownership) views, [`Idempotent`](crate::coord::Idempotent)
/// claims): a leader elected on etcd can guard tables in PostgreSQL.
///
/// # Why a stale holder can never commit after a newer one
///
/// Admission writes the fence's row, so it holds that row's lock until
/// the transaction ends; two transactions admitting on one name are
/// therefore serialised on it.
///
/// - READ COMMITTED: a later admission waits for an open one to end, then
///   re-checks the row as committed. A lower token that arrives second is
///   refused; a higher token that arrives second waits, so the lower
///   token's transaction commits first. Either way commits are in token
///   order.
/// - REPEATABLE READ and SERIALIZABLE: an admission that finds the row
///   changed since its snapshot fails with a serialization error
///   ([`StoreError::Unavailable`], retryable: nothing was written); run
///   the transaction again and it is admitted or refused on the current
///   row. The ordering argument is otherwise the same.
///
/// Admit before acting on what you read: under READ COMMITTED, rows read
/// before the admission may predate a newer holder's commit.
///
/// A holder frozen *inside* its transaction (a GC pause after `admit`)
/// keeps the fence row locked, so its successor's admission waits for
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
/// -- fence_admit(n, t): one upsert that raises fence n to t unless a
/// -- higher token is recorded (ON CONFLICT ... WHERE f.token <= t), then
/// -- returns the fence's token.
/// CREATE OR REPLACE FUNCTION calm.fence_admit(n text, t bigint) RETURNS bigint ...
/// ```
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
}

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
                 -- returns the fence's token after it (t when admitted).\n\
                 CREATE OR REPLACE FUNCTION {s}.fence_admit(n text, t bigint)\n\
                 RETURNS bigint LANGUAGE plpgsql AS $$\n\
                 DECLARE\n    \
                     highest bigint;\n\
                 BEGIN\n    \
                     INSERT INTO {s}.fences AS f (name, token) VALUES (n, t)\n    \
                     ON CONFLICT (name) DO UPDATE SET token = excluded.token\n    \
                     WHERE f.token <= excluded.token\n    \
                     RETURNING f.token INTO highest;\n    \
                     IF highest IS NULL THEN\n        \
                         SELECT f.token INTO highest FROM {s}.fences f WHERE f.name = n;\n    \
                     END IF;\n    \
                     RETURN highest;\n\
                 END $$;\n"
            ),
            admit: format!("SELECT {s}.fence_admit($1, $2)"),
        })
    }

    /// The SQL that creates the fence table (idempotent), for teams that
    /// apply schema changes with their own tools.
    pub fn migration(&self) -> &str {
        &self.migration
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
    /// trip to the transaction. Sent together with it instead (polled
    /// concurrently, so tokio-postgres pipelines both on the connection),
    /// it adds none: the server still runs the admission first, and if it
    /// is refused you roll back whatever ran after it. Near the database
    /// (loopback, a fast LAN) the round trip is not most of the cost,
    /// though: the extra statement is. calm's bench measures a one-row
    /// fenced `UPDATE` transaction at about 1.5× the unfenced one whether
    /// the admission is pipelined or awaited, and on the same server a
    /// bare `SELECT 1` added as its own statement costs 1.3–1.4× (pgbench):
    /// each statement carries its own sync and server round of work.
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
            .map_err(sqlx_error)?;
        admission(token, presented, highest)
    }
}

/// The token as the table stores it, after checking the name.
fn check_admission(name: &str, token: FencingToken) -> Result<i64, CoordError> {
    if name.is_empty() || name.len() > MAX_FENCE_NAME {
        return Err(CoordError::InvalidName {
            reason: "fence names are 1 to MAX_FENCE_NAME (256) bytes",
        });
    }
    i64::try_from(token.get()).map_err(|_| CoordError::InvalidName {
        reason: "a token above i64::MAX cannot be recorded",
    })
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
/// tokio-postgres ones are. Whatever it is, the transaction wrote nothing
/// that will commit.
#[cfg(feature = "sqlx")]
fn sqlx_error(e: sqlx::Error) -> CoordError {
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
    CoordError::Store(classify(code.as_deref(), lost, false, Box::new(e)))
}
