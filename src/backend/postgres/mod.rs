//! The [`Store`](crate::store::Store) model on PostgreSQL.
//!
//! # Schema
//!
//! Each store lives in one PostgreSQL schema (default `calm`), created on
//! first use (or by [`PostgresStore::migrate`]):
//!
//! | table | holds |
//! | --- | --- |
//! | `meta` | one row: the store revision (its row lock is the write lock), and until when a session listens |
//! | `compaction` | one row: the highest compacted revision |
//! | `kv` | key, value, `create_revision`, `mod_revision`, `writes`, lease |
//! | `leases` | id, TTL, deadline (a `timestamptz` of the database's clock) |
//! | `events` | every put and delete by revision, for watches |
//!
//! and the functions `apply` (a batch of writes), `reap`, `revoke`,
//! `compact`. The full SQL is in `sql.rs`.
//!
//! # Why it is correct
//!
//! Every write (put, delete, transaction, revoke, lease expiry) runs inside
//! one server-side function call, one autocommit statement, which takes
//! the `meta` row lock (`SELECT ... FOR UPDATE`) before it writes.
//! Writers are therefore serialised: each sees every earlier write, takes
//! the next revision, and commits before the next one gets the lock, so
//! revision order *is* commit order, and a fencing token (a revision)
//! issued later in real time is always larger. Compare-and-set is a check
//! of the key's row under the lock, and a transaction's writes share its
//! one revision.
//!
//! The lock is held only while the server runs the function and commits:
//! never across a round trip to calm, so a client process that freezes
//! (a GC pause, SIGSTOP) cannot stall anybody else. calm's sessions also
//! set `idle_in_transaction_session_timeout` and `lock_timeout`, so the
//! server ends anything left waiting, and run at `READ COMMITTED` whatever
//! the server's default isolation ([`SESSION_OPTIONS`]). The migration a
//! store runs as it starts is one message too, which the server runs and
//! commits on its own, and it takes no lock on a table whose schema is
//! already current (an index is created, a column added, only where
//! missing), so a store that starts, or freezes as it starts, never
//! holds up the writers of the others.
//!
//! A compare that fails on the current committed state, with a failure
//! branch that only reads, is answered from a snapshot without the lock:
//! losers of a contended compare-and-set never queue behind the winner.
//! That answer is linearizable at the snapshot's instant, because the
//! snapshot holds a prefix of the revision order (commit order).
//!
//! Leases are judged by the database's clock (`clock_timestamp()`), never
//! the client's. Reads and compares treat keys of a lease past its
//! deadline as gone at once; a background reaper (every 100 ms) deletes
//! them at a new revision, and a write that touches such a key deletes
//! its lease's keys first, so the history stays exact.
//!
//! Watches read the `events` table by revision, so they miss nothing; a
//! `LISTEN` connection wakes them (a `NOTIFY` is sent in the writing
//! transaction, delivered at its commit), and they also re-read every
//! second, so a lost notification costs latency, not events. A store
//! listens only while it has a watch (and ten seconds after the last one
//! ends): each listening session in the database is woken by every
//! notifying commit, which the server pays for on every write (measured
//! on the 2-core bench machine, where server and client share the cores:
//! a lone write took 240 µs with the store's own `LISTEN` session open,
//! 165 µs without). A new watch waits for its `LISTEN` to be in effect
//! before its first read, so no commit after that read goes unannounced.
//!
//! Writers notify only while some store listens. A listening session
//! announces itself in the `meta` row (`listened`, a time by the
//! database clock a minute ahead, renewed every 20 seconds), after its
//! `LISTEN` and before the watch's first read; a write reads that time
//! where it takes the lock, in the row it locks, and sends `NOTIFY` only
//! if it lies ahead. A write that commits after the announcement
//! therefore notifies, and one before it is in the watch's first read.
//! A listener that stops renewing (its process paused) stops the
//! notifications a minute later; its watches, when it wakes, read the
//! history as they do every second anyway. The reason is the cost of a
//! `NOTIFY` nobody hears: PostgreSQL serialises the commits of every
//! notifying transaction in a database, the wait for the disk included,
//! on one lock. Measured on a server with `fsync` on (pgbench, 2026-12-07,
//! this VM): 8 clients' upsert transactions ran at 5,300-5,800 per second,
//! 2,700-2,900 with a `pg_notify` added; beside 8 clients of such
//! notifying transactions (a job queue, say), 4 clients calling calm's
//! `write_one` ran at 310-330 per second when every write notified and at
//! 1,250-1,300 when it did not. One client alone measured the same
//! either way, within the VM's spread.
//!
//! # Speed: group commit
//!
//! A store-wide revision in commit order means writers serialise on one
//! lock, and each writer holding it across its own commit would cap a
//! store at one commit at a time. Two designs avoid that:
//!
//! - **Group commit in calm** (this one): each [`PostgresStore`] queues
//!   concurrent writes, and a committer sends everything queued as one
//!   `apply` call: one lock hold, one commit (one WAL flush) and one round
//!   trip for the batch, each request with its own compare result. Under
//!   load, batches grow to what arrived during the previous batch, so the
//!   cost per write falls as concurrency rises. The committer yields once
//!   before it gathers, so the callers its last batch answered queue their
//!   next writes into this one. Within a batch, later compare-and-sets of
//!   a key whose expectation the first call's committed state already
//!   refuses are answered from that state with no statement of their own,
//!   so the losers of a contended key cost nothing at the server.
//!   Processes with their own stores still take the lock in turn, one
//!   batch each. A write called while no other write of its store is
//!   pending has nothing to batch with: its caller sends it, without the
//!   hops to a committer and back, and a lone single-key write goes to
//!   `write_one`, whose common cases (a put without leases) are one
//!   statement returning one composite value. Single-key writes on
//!   distinct keys in one batch go together in one call; puts without a
//!   lease (the common load) to `put_keys`, which takes the lock, then
//!   reads, writes and numbers the whole batch in one statement, so a
//!   batch pays one statement's fixed cost rather than one per write.
//!   The price: the SQL lives in server-side functions that
//!   [`PostgresStore::migrate`] installs.
//! - **Revisions from a sequence, no store-wide lock** (k3s' kine on
//!   PostgreSQL): every write takes `nextval` and commits on its own, so
//!   writes of different keys never wait for each other. But commits then
//!   become visible out of revision order: a watcher or reader can see
//!   revision 11 before 10 commits. kine handles this by waiting for gaps
//!   to fill and eventually skipping them, which can skip or reorder
//!   events under load, and a token taken earlier can commit later than a
//!   larger one. calm's fences and election need "a later grant has a
//!   larger token" and "a watcher never skips", so calm keeps the lock and
//!   batches behind it.
//!
//! What batching cannot hide is the cost of one write on its own: a
//! lone put does more at the server than a bare upsert, and at one task
//! it takes about twice as long. Measured with `pgbench -M prepared -c 1`
//! against a server without `fsync`, both pinned to one core (so each
//! figure is the client's and the server's CPU time per transaction): a
//! prepared `INSERT ... ON CONFLICT DO UPDATE` on a plain table took
//! 44-49 µs, `write_one` 101-111 µs. Wrapping the same upsert in a
//! PL/pgSQL function added about 10 µs, updating the `meta` row for the
//! revision about 20, the `events` row about 15, the `NOTIFY` up to 10.
//! Taking the lock as an advisory lock and the revision as the history's
//! highest, instead of the `meta` row, saved about 5% (97-103 µs against
//! 101-111 in alternating runs), too little to trade for the row's
//! simplicity. Neither did fewer statements help: the key's update, its
//! event and the notification as one data-modifying `WITH` statement
//! after the `meta` update (two statements in the function instead of
//! four) measured the same as `write_one` within the runs' spread, and so
//! did a `fillfactor` of 10 on `meta` (its row's chain of dead versions
//! stays under 20 tuples either way). What a lone put adds is work the
//! model needs: it writes 475 bytes of WAL in six records (the `meta`
//! row; a prune and an update of the key's page; the event and its index
//! entry; the commit) where the upsert writes 216 in four (a prune, a row
//! lock, the update, the commit). With `fsync` on, both wait for one
//! flush of the log, so the ratio depends on the disk: 1.25-1.32× the
//! upsert's latency in pgbench on this machine's disk in one session,
//! 1.41-1.49× in another (2026-12-07, medians of alternating 1-2 s
//! rounds, per set of rounds: upsert 291-376 µs, `write_one` 430-541
//! µs). There the gap was about twice what it is without `fsync`: the
//! server's work after each wait for the disk runs slower. A function
//! doing only the `meta` update, an upsert and the history row (which
//! cannot return the key's previous value) measured 352-459 µs where
//! `write_one` without its `NOTIFY` measured 419-524 in the same sets,
//! so updating the key joined to its old row (what returns the previous
//! value) costs about 40-65 µs of the gap there; reading the old row
//! first and then updating it by key measured the same as the join.
//!
//! Instruction counts settle what timings on a shared VM cannot
//! (callgrind on `postgres --single` with `fsync` off, each statement
//! sent 200 and 1,200 times, the difference per call, 2026-12-07): the
//! bare upsert 150k instructions, `write_one` 442k, 426k without its
//! `NOTIFY`, 416k with the `meta` update and the key's update as one
//! statement, 421k with all three writes as one statement. Starting
//! the executor for the three writes' plans (`ExecInitModifyTable` and
//! the scans under it), which PostgreSQL does on every execution even of
//! a cached plan, is about 72k of them, the nested loop of the key's
//! update joined to its old row about 35k: the cost is in the number of
//! rows and indexes a write touches, not in how the statements are
//! grouped. `write_one` now reads the key's row and then updates it by
//! its place (`ctid`; only writers holding the lock change `kv`, so the
//! row stays where it was read) instead of joining: 403k instructions a
//! call against 430k for the join (both without `NOTIFY`, measured the
//! same way); a bare version of the two statements, without
//! `write_one`'s checks, measured 369k against 424k. A lone
//! compare-and-set costs more than a put because it first reads the key
//! without the lock (so that a losing compare never takes it); folding
//! that read into the `meta` update as an `EXISTS` condition (one
//! statement fewer) measured 535k instructions a call against 534k
//! (2026-12-07, the same method, the expected version read by the
//! calling statement in both), so it was not kept.
//!
//! Where a lone put's instructions go, measured by taking one part away
//! at a time (the same method, 2026-12-07; 400k a put): the event's
//! index 14k, the event row with its index 44k, the `meta` update 70k
//! (against a sequence's `nextval`, which could not keep revisions in
//! commit order). Of that update, about 19k was the `CHECK (id = 1)` on
//! `meta`, whose expression the server reads back at every statement
//! that writes the row, and about 21k following the row's chain of dead
//! versions, up to a page's worth (about 140) before it was pruned.
//! `meta` now has no `CHECK` and a fillfactor of 10, so its page is
//! pruned once it holds about fifteen versions: 370k instructions a put
//! (−7.5%; without the `CHECK` alone 381k, with the fillfactor alone
//! 379k). `migrate` brings the table of an earlier version to this one.
//!
//! Reads coalesce the same way once the pool is busy: while fewer gets
//! than half the pool are pending, each is its own statement; beyond
//! that, gets queue, and a reader sends everything queued as one
//! `key = ANY($1)` statement (a key many tasks read at once is read
//! once). A queued get is sent after it was called and answered when its
//! statement returns, so each stays linearizable.
//!
//! # Errors
//!
//! A connection that cannot be made, or breaks before a write is sent, is
//! [`StoreError::Unavailable`](crate::store::StoreError::Unavailable)
//! (retry), as is a statement the server aborted (lock timeout,
//! serialization failure: nothing was written). A connection that breaks
//! while a write is in flight is
//! [`StoreError::Indeterminate`](crate::store::StoreError::Indeterminate):
//! the write may have happened, or may still happen; a conditional rewrite
//! settles it (see [`Store::put`](crate::store::Store::put)). A closed pool
//! is [`StoreError::Closed`](crate::store::StoreError::Closed).

mod batch;
mod fence;
mod reads;
mod record;
mod sql;
mod store;
mod tasks;

pub use fence::{FENCE_LOCK_CLASS, FencedTransaction, MAX_FENCE_NAME, PgFence};
pub use store::{PostgresOptions, PostgresStore, PostgresWatch, SESSION_OPTIONS};
