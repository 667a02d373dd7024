//! Fencing inside the user's own PostgreSQL transactions.

use tokio_postgres::{GenericClient, Transaction};

use super::store::{check_schema, pg_error};
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
/// A resource that cannot check tokens at all (an external API, email)
/// cannot be fenced: give each effect an idempotency key instead
/// ([`Idempotent`](crate::coord::Idempotent)), so a repeat is harmless.
///
/// # Schema
///
/// One table, created by [`migrate`](PgFence::migrate) or by your own
/// migration tool with the SQL of [`migration`](PgFence::migration):
///
/// ```sql
/// CREATE SCHEMA IF NOT EXISTS calm;
/// CREATE TABLE IF NOT EXISTS calm.fences (
///     name text PRIMARY KEY,
///     token bigint NOT NULL CHECK (token >= 0));
/// ```
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
    migration: String,
    admit: String,
    highest: String,
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
                "CREATE SCHEMA IF NOT EXISTS {s};\n\
                 CREATE TABLE IF NOT EXISTS {s}.fences (\n    \
                     name text PRIMARY KEY,\n    \
                     token bigint NOT NULL CHECK (token >= 0));\n"
            ),
            admit: format!(
                "INSERT INTO {s}.fences AS f (name, token) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET token = excluded.token \
                 WHERE f.token <= excluded.token RETURNING f.token"
            ),
            highest: format!("SELECT token FROM {s}.fences WHERE name = $1"),
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
    pub async fn admit(
        &self,
        tx: &Transaction<'_>,
        name: &str,
        token: FencingToken,
    ) -> Result<(), CoordError> {
        if name.is_empty() || name.len() > MAX_FENCE_NAME {
            return Err(CoordError::InvalidName {
                reason: "fence names are 1 to MAX_FENCE_NAME (256) bytes",
            });
        }
        let presented = i64::try_from(token.get()).map_err(|_| CoordError::InvalidName {
            reason: "a token above i64::MAX cannot be recorded",
        })?;
        // A transaction's statement applies nothing if its connection
        // breaks: the transaction rolls back.
        let admitted = tx
            .query_opt(&self.admit, &[&name, &presented])
            .await
            .map_err(|e| pg_error(e, false))?;
        if admitted.is_some() {
            return Ok(());
        }
        let highest: i64 = tx
            .query_one(&self.highest, &[&name])
            .await
            .map_err(|e| pg_error(e, false))?
            .get(0);
        Err(CoordError::Fenced(Fenced::new(
            token,
            FencingToken::new(highest.unsigned_abs()),
        )))
    }
}
