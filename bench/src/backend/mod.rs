//! What calm's store model costs over the raw clients on real servers, and
//! how it scales: `PostgresStore` against prepared `tokio-postgres`
//! statements on a plain key-value table, and `EtcdStore` against bare
//! `etcd-client` calls.
//!
//! # What is measured
//!
//! - **Throughput against tasks.** 1, 4, 16 and 64 Tokio tasks on a
//!   two-worker runtime each do one operation after another (a closed
//!   loop) for a fixed round, on keys no other task touches (16 per task,
//!   64-byte values): `get`, an unconditional `put`, and a compare-and-set
//!   put whose expected version is the one the task's previous write
//!   returned. No compare-and-set can lose on keys only one task writes, and
//!   the suite panics if one does; every read checks that the version it
//!   sees is the one the task last wrote. For each task count and
//!   operation, calm and raw rounds alternate (five each, after an
//!   unmeasured warm-up); a row reports the median round's wall time per
//!   operation (1 / throughput, so below 1 in the ratio column favours
//!   calm, as in every other table), with its ops/s and the per-operation
//!   latency p50 and p99 of all five rounds in brackets. The one-task rows
//!   are also the single-client latency, reported as p50 rows.
//! - **Contention.** 64 tasks loop read-then-compare-and-set on one key;
//!   a row reports the time per *successful* compare-and-set (median of
//!   five alternating rounds per side).
//! - **Watch latency.** One writer changes one watched key, 200 times per
//!   side, alternating: the time from the writer seeing its write
//!   acknowledged to the watcher receiving the event (zero when the event
//!   arrives first, which is common: a server may send the event before
//!   the writer has read its reply), and the time from the writer sending
//!   the write to the event, which includes the write. On PostgreSQL the raw side is a bare `LISTEN`
//!   connection and `SELECT pg_notify(...)` on another; on etcd it is an
//!   `etcd-client` watch and put.
//!
//! # What the two sides are
//!
//! calm uses one `PostgresStore` with its default pool, or one `EtcdStore`
//! cloned into every task. The raw PostgreSQL side opens one connection per
//! task (the most concurrency the server can give) with three prepared
//! statements on `raw_kv(key bytea primary key, value bytea, version
//! bigint)`; the raw etcd side shares one `etcd_client::Client`, which
//! multiplexes over one channel like `EtcdStore`.
//!
//! The raw side is the limit, not an equivalent: a calm write on PostgreSQL
//! also takes the store-wide revision (which serialises writers, as etcd's
//! do), appends a watch event and notifies watchers; the raw upsert does
//! none of that, and its table keeps no history. On etcd the models are the
//! same, so the ratio is calm's own overhead.
//!
//! - **Fencing in the user's own tables.** `PgFence::begin; UPDATE;
//!   commit` (the admission sent with `COMMIT`, one message) against
//!   `BEGIN; UPDATE; COMMIT`, 1, 4 and 16 writers on their own
//!   connections and account rows, with fence names of their own and
//!   with one shared name (every writer then queues on the fence row, as
//!   writers of one resource do); and at 1 writer with the admission as
//!   its own statement (`PgFence::admit`), awaited before the update and
//!   pipelined with it.
//!
//! The servers are started like the tests start them (`calm::testing::
//! servers`); when a binary is missing the suite says so and skips it.

use std::future::Future;
use std::time::Instant;

mod etcd;
mod fence;
mod load;
mod postgres;
mod suite;

pub use suite::{ScalePoint, note, run, run_fence, run_with_scaling, scaling_table};
// The closed-loop machinery, shared with the redis suite.
pub(crate) use load::interleaved_metered;
pub(crate) use suite::runtime;

/// An operation of a closed-loop round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Read one of the task's keys.
    Get,
    /// Write one of the task's keys unconditionally.
    Put,
    /// Write one of the task's keys expecting the version the task last
    /// wrote; must commit.
    Cas,
    /// Read the one shared key, then write it expecting the version read;
    /// may lose to another task.
    ContendedCas,
}

impl Op {
    /// The operation's name in rows and plots.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
            Op::Cas => "compare-and-set",
            Op::ContendedCas => "contended compare-and-set",
        }
    }
}

/// One task's client and keys, for either side of a comparison.
pub(crate) trait Worker: Send + 'static {
    /// Writes the task's keys (and the shared contended key) once, and
    /// remembers their versions.
    fn preload(&mut self) -> impl Future<Output = ()> + Send;

    /// Does one `op`. Returns whether it counts: every operation does but
    /// a contended compare-and-set that lost.
    ///
    /// # Panics
    ///
    /// On any client error, on a compare-and-set that loses on a key only
    /// this task writes, and on a read that does not see the task's last
    /// write.
    fn run(&mut self, op: Op) -> impl Future<Output = bool> + Send;
}

/// A watcher and a writer of one key, for the watch latency.
pub(crate) trait Probe: Send {
    /// Writes the key once and waits for the watcher to see that write.
    ///
    /// # Panics
    ///
    /// On a client error, or if the event does not arrive within
    /// [`load::EVENT_TIMEOUT`].
    fn sample(&mut self) -> impl Future<Output = Stamps> + Send;
}

/// When one watched write happened, as seen by the writer and the watcher.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamps {
    /// Just before the writer sent the write.
    pub(crate) call: Instant,
    /// Just after the writer saw the write acknowledged.
    pub(crate) ack: Instant,
    /// When the watcher received the write's event (may be before `ack`).
    pub(crate) arrived: Instant,
}
