//! A single writer per key against locks: `SerialExecutor` beside a
//! `Mutex<HashMap>`, `DashMap` entry updates, a Tokio mutex per key, an
//! actor (task and channel) per key and one global Tokio mutex; and the
//! `PartitionLog`'s cost per applied command against the raw store
//! transaction it issues.
//!
//! # The in-process rows
//!
//! 64 client tasks on a Tokio multi-thread runtime each run commands back
//! to back for a round (100 ms), each command on a key drawn uniformly or
//! from Zipf(1.1) (rank 0 hottest), and wait for it to finish; the
//! latency is from the call to the finish. Every side is measured in the
//! same alternating rounds (7 per side, the starting side rotating), and
//! each row is calm's median throughput and latency quantiles against one
//! peer's.
//!
//! Two kinds of command:
//!
//! - **tiny**: add 1 to the key's counter. The lock peers update their map
//!   in place; calm and the actor update a `Vec<AtomicU64>` by index with a
//!   plain load and store (no atomic add), so a broken exclusion would lose
//!   counts.
//! - **awaiting**: read the counter, await 50 µs of simulated I/O, write
//!   it back plus one: a read-modify-write across an `.await`, which only
//!   exclusion keeps correct. `tokio::time::sleep` has millisecond
//!   granularity, so the I/O is a `yield_now` loop until 50 µs have passed
//!   on the clock: the task is suspended as in real I/O, and other tasks
//!   run between its polls, but its polls cost CPU (the same for every
//!   side). `Mutex<HashMap>` and `DashMap` are not in these rows: their
//!   guards cannot be held across an `.await`. calm runs tiny commands
//!   with `submit_fn` and awaiting ones with `run`, each awaited in place
//!   as a lock's caller would (on an idle key, both run the work in the
//!   caller's task).
//!
//! Every side checks afterwards that its counters add up to the commands
//! its clients finished, so a broken peer gives no figure.
//!
//! The full cross product (3 thread counts × 2 key distributions × 2 key
//! counts × 2 kinds of work) would take too long inside `report`; measured
//! are 1, 2 and 8 worker threads × uniform and Zipf keys on 1,000 keys for
//! both kinds of work, and 100,000 keys on 8 threads only, where the cost
//! of many idle keys (calm: none; the actor and per-key mutex peers: a
//! task or a mutex each) shows. The machine's core count is in every row:
//! on 2 cores, 8 worker threads mostly measure oversubscription.
//!
//! # The log rows
//!
//! `PartitionLog::apply_owned` on `MemoryStore`, per applied command, in
//! passes over 64 waiting commands and over one, against the same
//! transactions issued directly (the fence compare and put, the progress
//! and entry compares, the effect put, the progress put, the entry
//! delete), with the commands appended beforehand on both sides (not
//! timed). Only `MemoryStore`: PostgreSQL and etcd would need their
//! servers started here, and their round trips would dominate both sides.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use calm::coord::{Lease, Ownership};
use calm::occ::Version;
use calm::partition::{Command, Completion, PartitionLog, Rejected, SerialExecutor};
use calm::store::{Compare, CompareOp, MemoryStore, PutOptions, Store, Txn, TxnOp, WriteOutcome};
use dashmap::DashMap;
use tokio::sync::{Barrier, mpsc, oneshot};

use crate::harness::{
    Round, Row, Side, Summary, compare, now, summarise, throughput_row_of, time_row,
};
use crate::rng::{Rng, Zipf};

/// Client tasks, each running one command at a time.
const CLIENTS: usize = 64;
/// One measured round of one side.
const ROUND: Duration = Duration::from_millis(100);
/// An unmeasured round of each side first.
const WARM_UP: Duration = Duration::from_millis(50);
/// Measured rounds per side; the median rate is reported.
const ROUNDS: usize = 7;
/// The simulated I/O of an awaiting command.
const IO: Duration = Duration::from_micros(50);
/// Commands per pass in the log rows' batched case.
const PASS: usize = 64;

/// What a command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// Add 1 to the key's counter.
    Tiny,
    /// Read the counter, await [`IO`], write it plus 1.
    Awaiting,
}

/// How keys are drawn.
enum Keys {
    /// Uniformly over `0..n`.
    Uniform(u64),
    /// Zipf(1.1) over `0..n`.
    Zipf(Zipf),
}

impl Keys {
    fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            Keys::Uniform(n) => rng.below(*n),
            Keys::Zipf(z) => z.sample(rng),
        }
    }
}

/// Simulated I/O: suspended until [`IO`] has passed (see the module docs).
async fn io() {
    let end = Instant::now() + IO;
    while Instant::now() < end {
        tokio::task::yield_now().await;
    }
}

/// The read-modify-write of one command on a counter that only the
/// caller's exclusion protects: a load and a store, not an atomic add.
/// Relaxed suffices because the exclusion (calm's hand-over from one
/// piece of work to the next under its lock, or the actor being one task)
/// already orders one command's store before the next one's load.
async fn bump(counter: &AtomicU64, work: Work) {
    let v = counter.load(Relaxed);
    if work == Work::Awaiting {
        io().await;
    }
    counter.store(v + 1, Relaxed);
}

fn counters(keys: usize) -> Arc<Vec<AtomicU64>> {
    Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect())
}

/// One way of running a command for a key.
trait Peer: Send + Sync + 'static {
    /// Runs one command for `key`; returns when it has finished.
    fn command(&self, key: u64) -> impl Future<Output = ()> + Send;
    /// Every key's counter, summed.
    fn total(&self) -> u64;
}

/// calm: the command goes through the key's queue.
struct Calm {
    exec: SerialExecutor<u64>,
    counters: Arc<Vec<AtomicU64>>,
    work: Work,
}

/// The completion of accepted work; the bench never closes or overfills
/// the executor, so a refusal is a bug.
fn accepted<T, G>(submitted: Result<Completion<T>, Rejected<G>>) -> Completion<T> {
    submitted.unwrap_or_else(|r| panic!("refused: {}", r.error()))
}

impl Peer for Calm {
    async fn command(&self, key: u64) {
        let (counters, work) = (Arc::clone(&self.counters), self.work);
        let i = key as usize;
        if work == Work::Tiny {
            // Synchronous work as a closure: no future to poll.
            let done = accepted(
                self.exec
                    .submit_fn(key, move || {
                        let v = counters[i].load(Relaxed);
                        counters[i].store(v + 1, Relaxed);
                    })
                    .await,
            );
            done.await.expect("the command ran");
        } else {
            // Awaited in place, as a lock's caller would: inline on an idle key.
            self.exec
                .run(key, async move { bump(&counters[i], work).await })
                .await
                .expect("the command ran");
        }
    }

    fn total(&self) -> u64 {
        self.counters.iter().map(|c| c.load(Relaxed)).sum()
    }
}

/// `std::sync::Mutex<HashMap>`: every command locks the whole map.
struct MutexMap(std::sync::Mutex<HashMap<u64, u64>>);

impl Peer for MutexMap {
    async fn command(&self, key: u64) {
        *self.0.lock().expect("unpoisoned").entry(key).or_insert(0) += 1;
    }

    fn total(&self) -> u64 {
        self.0.lock().expect("unpoisoned").values().sum()
    }
}

/// `DashMap`: every command locks its key's shard.
struct Dash(DashMap<u64, u64>);

impl Peer for Dash {
    async fn command(&self, key: u64) {
        *self.0.entry(key).or_insert(0) += 1;
    }

    fn total(&self) -> u64 {
        self.0.iter().map(|e| *e.value()).sum()
    }
}

/// A `tokio::sync::Mutex` per key, created on first use, found in a
/// `DashMap`; held across the command's await.
struct KeyMutexes {
    locks: DashMap<u64, Arc<tokio::sync::Mutex<u64>>>,
    work: Work,
}

impl Peer for KeyMutexes {
    async fn command(&self, key: u64) {
        // A read lock of the shard when the key has its mutex already.
        let found = self.locks.get(&key).map(|l| Arc::clone(&l));
        let lock = found.unwrap_or_else(|| Arc::clone(&self.locks.entry(key).or_default()));
        let mut counter = lock.lock().await;
        let v = *counter;
        if self.work == Work::Awaiting {
            io().await;
        }
        *counter = v + 1;
    }

    fn total(&self) -> u64 {
        self.locks
            .iter()
            .map(|l| *l.try_lock().expect("no command running"))
            .sum()
    }
}

/// An actor per key: a task and a channel, started on the key's first
/// command; a command is a message and a reply.
struct Actors {
    senders: DashMap<u64, mpsc::Sender<oneshot::Sender<()>>>,
    counters: Arc<Vec<AtomicU64>>,
    work: Work,
}

impl Actors {
    fn start(&self, key: u64) -> mpsc::Sender<oneshot::Sender<()>> {
        let (tx, mut rx) = mpsc::channel::<oneshot::Sender<()>>(CLIENTS);
        let (counters, work) = (Arc::clone(&self.counters), self.work);
        tokio::spawn(async move {
            while let Some(reply) = rx.recv().await {
                bump(&counters[key as usize], work).await;
                let _ = reply.send(());
            }
        });
        tx
    }
}

impl Peer for Actors {
    async fn command(&self, key: u64) {
        let found = self.senders.get(&key).map(|s| s.clone());
        let tx = found.unwrap_or_else(|| {
            self.senders
                .entry(key)
                .or_insert_with(|| self.start(key))
                .clone()
        });
        let (reply, done) = oneshot::channel();
        tx.send(reply).await.expect("the actor runs");
        done.await.expect("the actor replied");
    }

    fn total(&self) -> u64 {
        self.counters.iter().map(|c| c.load(Relaxed)).sum()
    }
}

/// One `tokio::sync::Mutex` around every counter, held across the
/// command's await.
struct GlobalMutex(tokio::sync::Mutex<HashMap<u64, u64>>);

impl Peer for GlobalMutex {
    async fn command(&self, key: u64) {
        let mut map = self.0.lock().await;
        let v = map.get(&key).copied().unwrap_or(0);
        io().await;
        map.insert(key, v + 1);
    }

    fn total(&self) -> u64 {
        self.0
            .try_lock()
            .expect("no command running")
            .values()
            .sum()
    }
}

/// A round in flight: its rate and latencies, and the commands finished.
type RoundFuture = Pin<Box<dyn Future<Output = (Round, u64)> + Send>>;

/// One side of a comparison, its peer type erased per round (not per
/// command).
struct Contender {
    name: &'static str,
    /// Runs one round of the given length.
    round: Box<dyn Fn(Duration) -> RoundFuture>,
    /// The peer's counters, summed.
    total: Box<dyn Fn() -> u64>,
    /// Commands its clients finished, over every round.
    finished: u64,
    rounds: Vec<Round>,
}

fn contender<P: Peer>(name: &'static str, peer: P, keys: &Arc<Keys>) -> Contender {
    let peer = Arc::new(peer);
    let (p, keys) = (Arc::clone(&peer), Arc::clone(keys));
    Contender {
        name,
        round: Box::new(move |length| Box::pin(round(Arc::clone(&p), Arc::clone(&keys), length))),
        total: Box::new(move || peer.total()),
        finished: 0,
        rounds: Vec::new(),
    }
}

/// [`CLIENTS`] tasks run commands on `peer` back to back for `length`;
/// returns the rate and latencies, and how many commands finished.
async fn round<P: Peer>(peer: Arc<P>, keys: Arc<Keys>, length: Duration) -> (Round, u64) {
    // All clients start together and stop at one deadline (a client whose
    // commands never suspend holds its worker thread until then, and the
    // others on that thread start late: they must not get a round of
    // their own). The wall time runs from the first start to the last
    // finish, so a command in flight at the deadline counts.
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let deadline = Arc::new(OnceLock::new());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (peer, keys) = (Arc::clone(&peer), Arc::clone(&keys));
            let (barrier, deadline) = (Arc::clone(&barrier), Arc::clone(&deadline));
            tokio::spawn(async move {
                let mut rng = Rng::new(0x9e37_79b9 + c as u64);
                barrier.wait().await;
                let start = Instant::now();
                let deadline = *deadline.get_or_init(|| start + length);
                let mut latencies = Vec::with_capacity(4096);
                loop {
                    let t = Instant::now();
                    if t >= deadline {
                        break;
                    }
                    peer.command(keys.sample(&mut rng)).await;
                    latencies.push(u32::try_from(t.elapsed().as_nanos()).unwrap_or(u32::MAX));
                }
                (start, Instant::now(), latencies)
            })
        })
        .collect();
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    let mut latencies = Vec::new();
    for c in clients {
        let (start, end, lat) = c.await.expect("a client panicked");
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        latencies.extend(lat);
    }
    let wall = match (first, last) {
        (Some(f), Some(l)) => (l - f).as_secs_f64(),
        _ => 0.0,
    };
    let n = latencies.len() as u64;
    let rate = n as f64 / wall.max(1e-9);
    (
        Round {
            rate,
            counted: n,
            latencies,
        },
        n,
    )
}

/// One configuration of the in-process rows.
#[derive(Debug, Clone, Copy)]
struct Config {
    threads: usize,
    keys: usize,
    zipf: bool,
    work: Work,
}

/// Measures calm and every peer of `cfg.work` in alternating rounds,
/// checks their counters, and returns calm's row against each peer.
fn in_process(cfg: Config) -> Vec<Row> {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.threads)
        .build()
        .expect("a Tokio runtime");
    let keys = Arc::new(if cfg.zipf {
        Keys::Zipf(Zipf::new(cfg.keys, 1.1))
    } else {
        Keys::Uniform(cfg.keys as u64)
    });
    let work = cfg.work;
    let mut sides = vec![contender(
        "calm",
        Calm {
            exec: SerialExecutor::new(),
            counters: counters(cfg.keys),
            work,
        },
        &keys,
    )];
    if work == Work::Tiny {
        sides.push(contender(
            "std Mutex<HashMap>",
            MutexMap(std::sync::Mutex::new(HashMap::new())),
            &keys,
        ));
        sides.push(contender("DashMap entry", Dash(DashMap::new()), &keys));
    }
    sides.push(contender(
        "tokio Mutex per key (in a DashMap)",
        KeyMutexes {
            locks: DashMap::new(),
            work,
        },
        &keys,
    ));
    sides.push(contender(
        "actor per key (task + mpsc)",
        Actors {
            senders: DashMap::new(),
            counters: counters(cfg.keys),
            work,
        },
        &keys,
    ));
    if work == Work::Awaiting {
        sides.push(contender(
            "one global tokio Mutex",
            GlobalMutex(tokio::sync::Mutex::new(HashMap::new())),
            &keys,
        ));
    }
    rt.block_on(async {
        for s in &mut sides {
            s.finished += (s.round)(WARM_UP).await.1;
        }
        let count = sides.len();
        for i in 0..ROUNDS {
            for j in 0..count {
                let s = &mut sides[(i + j) % count];
                let (r, n) = (s.round)(ROUND).await;
                s.finished += n;
                s.rounds.push(r);
            }
        }
    });
    let summaries: Vec<(&'static str, Summary)> = sides
        .into_iter()
        .map(|s| {
            assert_eq!((s.total)(), s.finished, "{}: counts lost or added", s.name);
            (s.name, summarise(s.rounds))
        })
        .collect();
    drop(rt);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let what = match work {
        Work::Tiny => "tiny command (add 1)",
        Work::Awaiting => "awaiting command (50 µs I/O)",
    };
    let workload = format!(
        "{what}, {} keys {}, {CLIENTS} tasks",
        cfg.keys,
        if cfg.zipf { "Zipf(1.1)" } else { "uniform" }
    );
    let plural = if cfg.threads == 1 { "" } else { "s" };
    eprintln!(
        "partition: {workload}, {} thread{plural}: {} sides measured in {:.1} s",
        cfg.threads,
        summaries.len(),
        started.elapsed().as_secs_f64()
    );
    let (_, ours) = summaries[0];
    let mut rows = Vec::new();
    for &(peer, theirs) in &summaries[1..] {
        eprintln!(
            "partition: {workload}, {} thread{plural}: calm {:.0}/s p99 {:.0} µs, {peer} {:.0}/s p99 {:.0} µs",
            cfg.threads,
            ours.rate,
            ours.p99 * 1e6,
            theirs.rate,
            theirs.p99 * 1e6
        );
        rows.push(throughput_row_of(
            &workload,
            format!(
                "{} worker thread{plural} on {cores} cores, 1/throughput",
                cfg.threads
            ),
            peer,
            ours,
            theirs,
        ));
    }
    rows
}

/// The configurations measured (see the module docs for why these).
fn configs() -> Vec<Config> {
    let mut out = Vec::new();
    for work in [Work::Tiny, Work::Awaiting] {
        for threads in [1, 2, 8] {
            for zipf in [false, true] {
                out.push(Config {
                    threads,
                    keys: 1_000,
                    zipf,
                    work,
                });
            }
        }
        for zipf in [false, true] {
            out.push(Config {
                threads: 8,
                keys: 100_000,
                zipf,
                work,
            });
        }
    }
    out
}

/// `PartitionLog` apply per command against the raw transactions, in
/// passes of `pass` commands.
fn log_row(pass: usize) -> Row {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a Tokio runtime");
    let store = MemoryStore::new();
    // One partition: every command is this member's, and a pass reads
    // exactly the commands appended for it.
    let log = PartitionLog::new(store.clone(), "bench/log/", 1).expect("valid log");
    let (view, lease) = rt.block_on(async {
        let group = Ownership::new(store.clone(), "bench/members/").expect("valid prefix");
        let lease = Lease::grant(store.clone(), Duration::from_secs(600))
            .await
            .expect("lease");
        group.join("m", &lease).await.expect("join");
        (group.view().await.expect("view"), lease)
    });
    let effect = |c: &Command| {
        vec![TxnOp::put(
            &[b"bench/effects/".as_slice(), &c.key].concat(),
            &c.payload,
        )]
    };
    let mut appended = 0u64;
    // One run is one command: `n` runs are `n` commands rounded up to
    // whole passes, and the time is scaled back to `n`.
    let passes = |n: usize| n.div_ceil(pass);
    let per_n = |timed: Duration, n: usize| timed.mul_f64(n as f64 / (passes(n) * pass) as f64);
    let calm = Side::custom(|n| {
        let mut timed = Duration::ZERO;
        for _ in 0..passes(n) {
            for i in 0..pass {
                let key = format!("acct-{}", i % 100);
                now(log.append(key.as_bytes(), &appended.to_be_bytes())).expect("append");
                appended += 1;
            }
            let start = Instant::now();
            let applied = now(log.apply_owned(&view, "m", effect)).expect("apply");
            timed += start.elapsed();
            assert_eq!((applied.commands, applied.fenced.len()), (pass, 0));
        }
        per_n(timed, n)
    });

    // The raw side: the same transaction per command, on its own keys.
    let token = view.token().to_bytes();
    let mut bound = token.to_vec();
    bound.push(0);
    let fence_key = b"bench/raw/fence".as_slice();
    let progress_key = b"bench/raw/progress".as_slice();
    let fence = now(store.put(fence_key, &token, PutOptions::new())).expect("fence");
    assert!(matches!(fence, WriteOutcome::Committed { .. }));
    let mut progress_rev = Version::ZERO;
    let mut raw_applied = 0u64;
    let raw = Side::custom(|n| {
        let mut timed = Duration::ZERO;
        for _ in 0..passes(n) {
            let mut entries = Vec::with_capacity(pass);
            for i in 0..pass {
                let entry = format!("bench/raw/log/{raw_applied:016x}-{i}").into_bytes();
                let value = format!("acct-{}", i % 100).into_bytes();
                let put = now(store.put(&entry, &value, PutOptions::new())).expect("entry");
                let WriteOutcome::Committed { revision, .. } = put else {
                    panic!("unconditional put refused");
                };
                entries.push((entry, value, revision));
            }
            let start = Instant::now();
            for (entry, value, revision) in entries {
                let txn = Txn::new()
                    .when(Compare::value(fence_key, CompareOp::Less, &bound))
                    .when(Compare::mod_revision(
                        progress_key,
                        CompareOp::Equal,
                        progress_rev,
                    ))
                    .when(Compare::create_revision(&entry, CompareOp::Equal, revision))
                    .then(TxnOp::put(fence_key, &token))
                    .then(TxnOp::put(
                        &[b"bench/raw/effects/".as_slice(), &value].concat(),
                        &value,
                    ))
                    .then(TxnOp::put(progress_key, &revision.get().to_be_bytes()))
                    .then(TxnOp::delete(&entry))
                    .otherwise(TxnOp::get(fence_key));
                let out = now(store.txn(txn)).expect("txn");
                assert!(out.succeeded, "the raw transaction's compares hold");
                progress_rev = out.revision;
                raw_applied += 1;
            }
            timed += start.elapsed();
        }
        per_n(timed, n)
    });
    let row = time_row(
        "PartitionLog on MemoryStore, one member, one partition",
        &format!(
            "apply per command, passes of {pass} waiting command{}",
            if pass == 1 { "" } else { "s" }
        ),
        "the same fenced Store::txn per command, issued directly",
        compare(calm, raw),
    );
    // Nothing left waiting on either side.
    assert!(now(log.pending(0)).expect("pending").is_empty());
    assert!(
        now(store.range(b"bench/raw/log/", None))
            .expect("range")
            .kvs
            .is_empty()
    );
    drop(lease);
    row
}

/// Runs every measurement (only the log rows with `only` = `log`) and
/// returns the rows.
pub fn run(only: Option<&str>) -> Vec<Row> {
    let mut rows: Vec<Row> = match only {
        Some("log") => Vec::new(),
        _ => configs().into_iter().flat_map(in_process).collect(),
    };
    rows.push(log_row(PASS));
    rows.push(log_row(1));
    rows
}
