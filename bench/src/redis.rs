//! What calm's Redis efficiency lock costs over the bare recipe, and how
//! waiting for a held lock behaves: `RedisLock` against `SET key value NX
//! PX ttl` plus a Lua compare-and-delete, written directly with the
//! `redis` crate on a `ConnectionManager`, on one `redis-server` this
//! suite starts itself.
//!
//! # What is measured
//!
//! - **Uncontended acquire + release.** 1, 4 and 16 Tokio tasks on a
//!   two-worker runtime each lock a key of their own and release it, one
//!   cycle after another: calm's `try_acquire` then `guard.release()`,
//!   the raw side's `SET NX PX` then `EVAL` of the release script (the
//!   same script text calm sends). Rounds alternate between the sides as
//!   in the backend suite (five of 0.6 s each, after a warm-up); a row
//!   gives the median round's wall time per cycle, with the cycles per
//!   second and the p50 and p99 of one cycle. calm runs with its defaults
//!   (the guard's background extender on, as users get it), and again at
//!   1 and 16 tasks with `with_auto_extend(false)`. Every acquisition must
//!   succeed (the key is the task's own) and every release must find the
//!   key still holding the holder's value.
//! - **One key, 16 tasks.** Every task loops acquire → hold 1 ms →
//!   release on the same key: calm's `acquire` (jittered exponential
//!   backoff, its default 5 ms to 200 ms) against a naive loop of `SET NX`
//!   retried at once, and one retried after a fixed 1 ms sleep. A row
//!   gives the wall time per successful acquisition (its rate, and the
//!   p50 and p99 of one task's cycle: wait, hold and release), and the
//!   server requests per successful acquisition. Each side counts its
//!   holders in process; two at once panics the run.
//! - **Server requests** come from Redis itself: `INFO commandstats` read
//!   on a connection of its own just before and after every measured
//!   round, every command's `calls` summed except `INFO`'s (the meter's
//!   own) and those a Lua script runs inside (`GET`, `DEL`, `PEXPIRE`,
//!   which neither side sends itself), so an `EVAL` counts once. After each comparison the database must be empty: no lock was
//!   left behind.
//!
//! The Rust Redlock crates were not added as peers: `rslock` 0.10 needs
//! `redis` 1.8 (whose minimum Rust is 1.88, above calm's 1.85, and the
//! workspace shares one lock file) with TLS (`tokio-rustls-comp`) to expose
//! anything; `redlock` 2.0 is a blocking client on `redis` 0.23.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use calm::backend::redis::{RedisLock, RedisLockOptions};
use calm::testing::servers::RedisServer;
use redis::aio::ConnectionManager;
use tokio::runtime::Runtime;

use crate::backend::{Op, Worker, interleaved_metered, runtime};
use crate::harness::{Figure, Row, Summary, throughput_row_of, time_row};
use crate::rng::Rng;

/// The locks' time to live: far longer than any hold, so no key expires
/// under its holder and no extension is due within a cycle.
const TTL: Duration = Duration::from_secs(10);
/// Task counts of the uncontended rows.
const TASKS: [usize; 3] = [1, 4, 16];
/// The most tasks of the uncontended rows.
const MAX_TASKS: usize = 16;
/// Task counts at which calm also runs with its extender off.
const NO_EXTENDER_TASKS: [usize; 2] = [1, 16];
/// Tasks contending for the one key.
const CONTENDERS: usize = 16;
/// How long a contender holds the lock once it has it.
const HOLD: Duration = Duration::from_millis(1);
/// The naive sleeping loop's fixed pause between attempts.
const NAIVE_PAUSE: Duration = Duration::from_millis(1);
/// The one key every contender locks.
const CONTENDED_KEY: &[u8] = b"bench/redis/contended";
/// The raw side's release: delete the key only if it holds our value.
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                       return redis.call('del', KEYS[1]) else return 0 end";

const WORKLOAD: &str = "Redis lock, one redis-server";
const RAW_PEER: &str = "raw SET NX PX + Lua release (redis crate)";

/// The key of task `task` in the uncontended rows (only it locks it).
fn own_key(task: usize) -> Vec<u8> {
    format!("bench/redis/task{task:02}").into_bytes()
}

/// Holds the contended lock for [`HOLD`], checking that nobody else holds
/// it meanwhile.
///
/// # Panics
///
/// If another task of the same side holds it too.
async fn hold(holders: &AtomicUsize) {
    let others = holders.fetch_add(1, Ordering::AcqRel);
    assert_eq!(others, 0, "two holders of the contended lock at once");
    tokio::time::sleep(HOLD).await;
    // Left before the release is sent: once it reaches Redis, the next
    // holder may enter, before this task would run again.
    holders.fetch_sub(1, Ordering::AcqRel);
}

/// calm's side: a clone of one `RedisLock` per task.
struct CalmLocker {
    locks: RedisLock,
    key: Vec<u8>,
    /// The contended case's holder count (`None`: the key is the task's
    /// own, and a `try_acquire` must get it).
    holders: Option<Arc<AtomicUsize>>,
}

impl CalmLocker {
    /// `tasks` lockers of their own keys.
    fn own(locks: &RedisLock, tasks: usize) -> Vec<Self> {
        (0..tasks)
            .map(|task| Self {
                locks: locks.clone(),
                key: own_key(task),
                holders: None,
            })
            .collect()
    }

    /// `tasks` lockers of [`CONTENDED_KEY`].
    fn contending(locks: &RedisLock, tasks: usize) -> Vec<Self> {
        let holders = Arc::new(AtomicUsize::new(0));
        (0..tasks)
            .map(|_| Self {
                locks: locks.clone(),
                key: CONTENDED_KEY.to_vec(),
                holders: Some(Arc::clone(&holders)),
            })
            .collect()
    }
}

impl Worker for CalmLocker {
    async fn preload(&mut self) {}

    async fn run(&mut self, _op: Op) -> bool {
        match &self.holders {
            None => {
                let guard = self.locks.try_acquire(&self.key).await;
                let guard = guard
                    .expect("calm try_acquire")
                    .expect("a key no other task locks is free");
                guard.release().await.expect("calm release");
            }
            Some(holders) => {
                let guard = self.locks.acquire(&self.key).await;
                let guard = guard.expect("calm acquire within its wait");
                hold(holders).await;
                guard.release().await.expect("calm release");
            }
        }
        true
    }
}

/// The raw side: `SET NX PX` and the release script on a clone of one
/// `ConnectionManager` per task, a fresh random value per acquisition.
struct RawLocker {
    conn: ConnectionManager,
    key: Vec<u8>,
    /// The holder values' source (seeded per task, so values differ
    /// across tasks).
    rng: Rng,
    /// The contended case's holder count and pause between attempts (zero:
    /// retry at once), or `None` for a key of the task's own.
    contended: Option<(Arc<AtomicUsize>, Duration)>,
}

impl RawLocker {
    /// `tasks` lockers of their own keys.
    fn own(conn: &ConnectionManager, tasks: usize) -> Vec<Self> {
        (0..tasks)
            .map(|task| Self::new(conn, own_key(task), task, None))
            .collect()
    }

    /// `tasks` lockers of [`CONTENDED_KEY`], pausing `pause` after a
    /// refused attempt.
    fn contending(conn: &ConnectionManager, tasks: usize, pause: Duration) -> Vec<Self> {
        let holders = Arc::new(AtomicUsize::new(0));
        (0..tasks)
            .map(|task| {
                let contended = Some((Arc::clone(&holders), pause));
                Self::new(conn, CONTENDED_KEY.to_vec(), task, contended)
            })
            .collect()
    }

    fn new(
        conn: &ConnectionManager,
        key: Vec<u8>,
        task: usize,
        contended: Option<(Arc<AtomicUsize>, Duration)>,
    ) -> Self {
        Self {
            conn: conn.clone(),
            key,
            rng: Rng::new(0x7ed1_5000 + task as u64),
            contended,
        }
    }

    /// `SET key value NX PX ttl`: whether it was set.
    async fn set_nx(&mut self, value: &str) -> bool {
        let set: redis::Value = redis::cmd("SET")
            .arg(&self.key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut self.conn)
            .await
            .expect("raw SET");
        !matches!(set, redis::Value::Nil)
    }

    /// The release script, which must find our value.
    async fn release(&mut self, value: &str) {
        let deleted: i64 = redis::cmd("EVAL")
            .arg(RELEASE)
            .arg(1)
            .arg(&self.key)
            .arg(value)
            .query_async(&mut self.conn)
            .await
            .expect("raw release");
        assert_eq!(deleted, 1, "raw release: the key did not hold our value");
    }
}

impl Worker for RawLocker {
    async fn preload(&mut self) {}

    async fn run(&mut self, _op: Op) -> bool {
        let value = format!("{:016x}{:016x}", self.rng.next_u64(), self.rng.next_u64());
        match self.contended.clone() {
            None => assert!(
                self.set_nx(&value).await,
                "a key no other task locks is free"
            ),
            Some((holders, pause)) => {
                while !self.set_nx(&value).await {
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
                hold(&holders).await;
            }
        }
        self.release(&value).await;
        true
    }
}

/// Commands Redis counts that no client here sends: the meter's `INFO`,
/// and what the release and extend scripts run inside (Redis counts a
/// script's `GET`, `DEL` and `PEXPIRE` as commands too; leaving them out
/// counts a script once, as the one request it is).
const NOT_REQUESTS: [&str; 4] = ["info", "get", "del", "pexpire"];

/// Redis' own count of the requests it served: every command's calls but
/// [`NOT_REQUESTS`].
async fn served(mut conn: ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(command, _)| !NOT_REQUESTS.contains(command))
        .filter_map(|(_, fields)| {
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

/// One comparison on the first `tasks` workers of each side, metered;
/// returns each side's summary and server requests per counted cycle.
///
/// # Panics
///
/// If a key is left in the database afterwards.
fn compare<A: Worker, B: Worker>(
    rt: &Runtime,
    meter: &ConnectionManager,
    calm: &mut Vec<A>,
    raw: &mut Vec<B>,
    tasks: usize,
    op: Op,
) -> ((Summary, f64), (Summary, f64)) {
    let ((a, a_used), (b, b_used)) =
        interleaved_metered(rt, calm, raw, tasks, op, || served(meter.clone()));
    let keys: u64 = rt.block_on(async {
        redis::cmd("DBSIZE")
            .query_async(&mut meter.clone())
            .await
            .expect("DBSIZE")
    });
    assert_eq!(keys, 0, "a lock was left behind");
    let per = |used: u64, s: Summary| used as f64 / s.counted.max(1) as f64;
    ((a, per(a_used, a)), (b, per(b_used, b)))
}

fn plural(tasks: usize) -> &'static str {
    if tasks == 1 { "" } else { "s" }
}

/// Runs the suite on a `redis-server` of its own; no rows (and a note on
/// stderr) when it cannot be started.
pub fn run() -> Vec<Row> {
    let server = match RedisServer::start_own() {
        Ok(server) => server,
        Err(e) => {
            eprintln!("redis: SKIPPED: {e}");
            return Vec::new();
        }
    };
    let rt = runtime();
    let url = server.url();
    let (defaults, no_extender, raw_conn, meter) = rt.block_on(async {
        let options = RedisLockOptions::new(TTL);
        let defaults = RedisLock::new(url, options.clone()).expect("calm RedisLock");
        let no_extender =
            RedisLock::new(url, options.with_auto_extend(false)).expect("calm RedisLock");
        let connect = || async {
            let client = redis::Client::open(url).expect("redis URL");
            ConnectionManager::new(client)
                .await
                .expect("connect to redis-server")
        };
        (defaults, no_extender, connect().await, connect().await)
    });
    let mut rows = Vec::new();

    let mut calm = CalmLocker::own(&defaults, MAX_TASKS);
    let mut quiet = CalmLocker::own(&no_extender, MAX_TASKS);
    let mut raw = RawLocker::own(&raw_conn, MAX_TASKS);
    for tasks in TASKS {
        let ((a, a_req), (b, b_req)) = compare(&rt, &meter, &mut calm, &mut raw, tasks, Op::Put);
        eprintln!(
            "redis: acquire+release × {tasks}: calm {:.0}/s (p50 {}, {a_req:.2} requests), \
             raw {:.0}/s (p50 {}, {b_req:.2} requests)",
            a.rate,
            Figure::Time(a.p50),
            b.rate,
            Figure::Time(b.p50),
        );
        let metric = format!(
            "acquire+release, {tasks} task{}, 1/throughput",
            plural(tasks)
        );
        rows.push(throughput_row_of(WORKLOAD, metric, RAW_PEER, a, b));
        if tasks == 1 {
            for (q, x, y) in [("p50", a.p50, b.p50), ("p99", a.p99, b.p99)] {
                let metric = format!("acquire+release, 1 task: latency {q}");
                rows.push(time_row(WORKLOAD, &metric, RAW_PEER, (x, y)));
            }
            rows.push(Row {
                workload: WORKLOAD.into(),
                metric: "acquire+release, 1 task: server requests per cycle".into(),
                peer: RAW_PEER.into(),
                ours: Figure::PerOp(a_req),
                theirs: Figure::PerOp(b_req),
            });
        }
        if NO_EXTENDER_TASKS.contains(&tasks) {
            let ((a, _), (b, _)) = compare(&rt, &meter, &mut quiet, &mut raw, tasks, Op::Put);
            eprintln!(
                "redis: acquire+release × {tasks}, auto-extend off: calm {:.0}/s (p50 {}), \
                 raw {:.0}/s (p50 {})",
                a.rate,
                Figure::Time(a.p50),
                b.rate,
                Figure::Time(b.p50),
            );
            let metric = format!(
                "acquire+release, auto-extend off, {tasks} task{}, 1/throughput",
                plural(tasks)
            );
            rows.push(throughput_row_of(WORKLOAD, metric, RAW_PEER, a, b));
        }
    }

    let workload = format!(
        "Redis lock, one key, {CONTENDERS} tasks, {} ms hold",
        HOLD.as_millis()
    );
    let mut calm = CalmLocker::contending(&defaults, CONTENDERS);
    let naive = [
        ("naive loop: SET NX retried at once", Duration::ZERO),
        ("naive loop: SET NX, 1 ms sleep between tries", NAIVE_PAUSE),
    ];
    for (peer, pause) in naive {
        let mut raw = RawLocker::contending(&raw_conn, CONTENDERS, pause);
        let ((a, a_req), (b, b_req)) = compare(
            &rt,
            &meter,
            &mut calm,
            &mut raw,
            CONTENDERS,
            Op::ContendedCas,
        );
        eprintln!(
            "redis: one key × {CONTENDERS}: calm acquire {:.0} acquisitions/s, {a_req:.2} \
             requests each; {peer}: {:.0}/s, {b_req:.2} requests each",
            a.rate, b.rate
        );
        let metric = "calm acquire (jittered backoff): 1/successful acquisition".to_owned();
        rows.push(throughput_row_of(&workload, metric, peer, a, b));
        rows.push(Row {
            workload: workload.clone(),
            metric: "calm acquire: server requests per successful acquisition".into(),
            peer: peer.into(),
            ours: Figure::PerOp(a_req),
            theirs: Figure::PerOp(b_req),
        });
    }
    rows
}
