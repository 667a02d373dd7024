//! Closed-loop rounds of many tasks, alternated between calm and the raw
//! client, and the watch-latency samples; plus calm's side of both, which
//! is the same code on every backend.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use calm::occ::Version;
use calm::store::{Expect, KeySpan, PutOptions, Store, Watch, WriteOutcome};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::{Op, Probe, Stamps, Worker};
use crate::harness::{Round, Summary, percentile, summarise};

/// Task counts of the scaling rows.
pub(crate) const TASKS: [usize; 4] = [1, 4, 16, 64];
/// The most tasks any round runs (also the contended case's).
pub(crate) const MAX_TASKS: usize = 64;
/// Keys each task reads and writes in turn.
const KEYS_PER_TASK: usize = 16;
/// Bytes per value.
pub(crate) const VALUE: usize = 64;
/// How long one measured round runs. Twelve comparisons (four task counts,
/// three operations) of ten rounds each, per backend, keep the suite
/// within a few minutes.
const ROUND: Duration = Duration::from_millis(600);
/// An unmeasured round before each comparison, so pools and server
/// caches are warm for both sides.
const WARM_UP: Duration = Duration::from_millis(150);
/// Measured rounds per side; the median is reported.
const ROUNDS: usize = 5;
/// Watch-latency samples per side.
pub(crate) const WATCH_SAMPLES: usize = 200;
/// Unmeasured watch samples per side first.
const WATCH_WARM_UP: usize = 10;
/// How long a watch event may take before the suite calls it lost.
pub(crate) const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The key `i` of task `task` (only that task touches it).
pub(crate) fn key(task: usize, i: usize) -> Vec<u8> {
    format!("bench/task{task:02}/key{:02}", i % KEYS_PER_TASK).into_bytes()
}

/// Every key of task `task`.
pub(crate) fn keys(task: usize) -> Vec<Vec<u8>> {
    (0..KEYS_PER_TASK).map(|i| key(task, i)).collect()
}

/// The one key every task of the contended case writes.
pub(crate) const CONTENDED_KEY: &[u8] = b"bench/contended";
/// The key the watch-latency probes write.
pub(crate) const WATCH_KEY: &[u8] = b"bench/watched";

/// Runs `op` on every worker, each in its own task, back to back until
/// `length` has passed; gives the workers back.
async fn round<W: Worker>(workers: Vec<W>, op: Op, length: Duration) -> (Vec<W>, Round) {
    // All tasks start together; the round's wall time runs from the first
    // start to the last finish, so an operation still in flight at the
    // deadline is counted and its time is too.
    let barrier = Arc::new(tokio::sync::Barrier::new(workers.len()));
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let start = Instant::now();
                let deadline = start + length;
                let mut counted = 0u64;
                let mut latencies = Vec::with_capacity(4096);
                loop {
                    let t = Instant::now();
                    if t >= deadline {
                        break;
                    }
                    counted += u64::from(w.run(op).await);
                    let nanos = t.elapsed().as_nanos();
                    latencies.push(u32::try_from(nanos).unwrap_or(u32::MAX));
                }
                (w, start, Instant::now(), counted, latencies)
            })
        })
        .collect();
    let mut workers = Vec::with_capacity(handles.len());
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    let mut counted = 0;
    let mut latencies = Vec::new();
    for h in handles {
        let (w, start, end, n, lat) = h.await.expect("a bench task panicked");
        workers.push(w);
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        counted += n;
        latencies.extend(lat);
    }
    let wall = match (first, last) {
        (Some(f), Some(l)) => (l - f).as_secs_f64(),
        _ => 0.0,
    };
    let rate = counted as f64 / wall.max(1e-9);
    (
        workers,
        Round {
            rate,
            counted,
            latencies,
        },
    )
}

/// Writes every worker's keys, concurrently.
pub(crate) fn preload<W: Worker>(rt: &Runtime, workers: Vec<W>) -> Vec<W> {
    rt.block_on(async {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|mut w| {
                tokio::spawn(async move {
                    w.preload().await;
                    w
                })
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(h.await.expect("a preload task panicked"));
        }
        out
    })
}

/// calm's and the raw side's summaries of `op` on the first `tasks`
/// workers of each, in alternating rounds (calm first in even rounds, raw
/// first in odd ones, so neither always follows the other).
pub(crate) fn interleaved<A: Worker, B: Worker>(
    rt: &Runtime,
    calm: &mut Vec<A>,
    raw: &mut Vec<B>,
    tasks: usize,
    op: Op,
) -> (Summary, Summary) {
    let ((a, _), (b, _)) = interleaved_metered(rt, calm, raw, tasks, op, || async { 0 });
    (a, b)
}

/// As [`interleaved`], reading `meter` (a server's own count of the
/// requests it served, say) just before and just after every measured
/// round; also returns how much each side's rounds moved it in all.
pub(crate) fn interleaved_metered<A: Worker, B: Worker, M, F>(
    rt: &Runtime,
    calm: &mut Vec<A>,
    raw: &mut Vec<B>,
    tasks: usize,
    op: Op,
    mut meter: M,
) -> ((Summary, u64), (Summary, u64))
where
    M: FnMut() -> F,
    F: Future<Output = u64>,
{
    let a: Vec<A> = calm.drain(..tasks).collect();
    let b: Vec<B> = raw.drain(..tasks).collect();
    let (a, b, ra, rb, used) = rt.block_on(async move {
        let mut a = round(a, op, WARM_UP).await.0;
        let mut b = round(b, op, WARM_UP).await.0;
        let (mut ra, mut rb) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
        let mut used = [0u64; 2];
        for i in 0..ROUNDS {
            // 0 is calm, 1 the raw side.
            for side in [i % 2, 1 - i % 2] {
                let before = meter().await;
                if side == 0 {
                    let (w, r) = round(a, op, ROUND).await;
                    a = w;
                    ra.push(r);
                } else {
                    let (w, r) = round(b, op, ROUND).await;
                    b = w;
                    rb.push(r);
                }
                used[side] += meter().await - before;
            }
        }
        (a, b, ra, rb, used)
    });
    calm.splice(0..0, a);
    raw.splice(0..0, b);
    ((summarise(ra), used[0]), (summarise(rb), used[1]))
}

/// Watch latencies of one side, in seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchSummary {
    /// Write acknowledged to event, p50 (zero when the event came first).
    pub(crate) ack_p50: f64,
    /// Write acknowledged to event, p99.
    pub(crate) ack_p99: f64,
    /// Write sent to event, p50.
    pub(crate) call_p50: f64,
}

/// Watch latencies of calm's and the raw probe, sampled alternately.
pub(crate) fn watch_latency<A: Probe, B: Probe>(
    rt: &Runtime,
    calm: &mut A,
    raw: &mut B,
) -> (WatchSummary, WatchSummary) {
    rt.block_on(async {
        for _ in 0..WATCH_WARM_UP {
            calm.sample().await;
            raw.sample().await;
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..WATCH_SAMPLES {
            if i % 2 == 0 {
                a.push(calm.sample().await);
                b.push(raw.sample().await);
            } else {
                b.push(raw.sample().await);
                a.push(calm.sample().await);
            }
        }
        (watch_summary(&a), watch_summary(&b))
    })
}

fn watch_summary(stamps: &[Stamps]) -> WatchSummary {
    let sorted = |since: fn(&Stamps) -> Instant| {
        let mut xs: Vec<u32> = stamps
            .iter()
            .map(|s| s.arrived.saturating_duration_since(since(s)).as_nanos())
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
            .collect();
        xs.sort_unstable();
        xs
    };
    let (ack, call) = (sorted(|s| s.ack), sorted(|s| s.call));
    WatchSummary {
        ack_p50: percentile(&ack, 0.5),
        ack_p99: percentile(&ack, 0.99),
        call_p50: percentile(&call, 0.5),
    }
}

/// Waits for the event a probe's watcher stamped, at most
/// [`EVENT_TIMEOUT`].
pub(crate) async fn arrival<T>(rx: &mut mpsc::UnboundedReceiver<(Instant, T)>) -> (Instant, T) {
    match tokio::time::timeout(EVENT_TIMEOUT, rx.recv()).await {
        Ok(Some(stamped)) => stamped,
        Ok(None) => panic!("the watcher stopped"),
        Err(_) => panic!("no watch event within {EVENT_TIMEOUT:?}"),
    }
}

/// calm's side of the closed loop, on any store: a clone of one store per
/// task, and the versions the task last wrote.
pub(crate) struct CalmWorker<S> {
    /// The store, shared with every other task's clone.
    store: S,
    /// The task's own keys.
    keys: Vec<Vec<u8>>,
    /// `versions[i]` is the `mod_revision` of `keys[i]` after this task's
    /// last write (only this task writes it).
    versions: Vec<Version>,
    /// The next key to use, cycling.
    next: usize,
    /// The value written.
    value: Vec<u8>,
}

impl<S: Store + Clone + 'static> CalmWorker<S> {
    /// `tasks` workers on clones of `store`.
    pub(crate) fn many(store: &S, tasks: usize) -> Vec<Self> {
        (0..tasks)
            .map(|task| Self {
                store: store.clone(),
                keys: keys(task),
                versions: vec![Version::ZERO; KEYS_PER_TASK],
                next: 0,
                value: vec![7; VALUE],
            })
            .collect()
    }

    /// A put that must commit; returns the key's new version.
    async fn put(&self, key: &[u8], expect: Expect) -> Version {
        match self
            .store
            .put(key, &self.value, PutOptions::new().with_expect(expect))
            .await
        {
            Ok(WriteOutcome::Committed { revision, .. }) => revision,
            other => panic!("calm put on a key only one task writes did not commit: {other:?}"),
        }
    }
}

impl<S: Store + Clone + 'static> Worker for CalmWorker<S> {
    async fn preload(&mut self) {
        for i in 0..self.keys.len() {
            self.versions[i] = self.put(&self.keys[i], Expect::Any).await;
        }
        self.put(CONTENDED_KEY, Expect::Any).await;
    }

    async fn run(&mut self, op: Op) -> bool {
        let i = self.next;
        self.next = (i + 1) % self.keys.len();
        match op {
            Op::Get => {
                let kv = self.store.get(&self.keys[i]).await.expect("calm get");
                let kv = kv.expect("a preloaded key");
                assert_eq!(kv.mod_revision, self.versions[i], "calm get: stale read");
                std::hint::black_box(kv);
            }
            Op::Put => self.versions[i] = self.put(&self.keys[i], Expect::Any).await,
            Op::Cas => {
                let expect = Expect::Version(self.versions[i]);
                self.versions[i] = self.put(&self.keys[i], expect).await;
            }
            Op::ContendedCas => {
                let kv = self.store.get(CONTENDED_KEY).await.expect("calm get");
                let expect = Expect::Version(kv.expect("the contended key").mod_revision);
                let put = self
                    .store
                    .put(
                        CONTENDED_KEY,
                        &self.value,
                        PutOptions::new().with_expect(expect),
                    )
                    .await;
                return match put.expect("calm contended put") {
                    WriteOutcome::Committed { .. } => true,
                    WriteOutcome::Conflict { .. } => false,
                };
            }
        }
        true
    }
}

/// calm's watch latency: a watch on [`WATCH_KEY`] whose events a task
/// stamps on arrival, and puts of that key through the store.
pub(crate) struct CalmProbe<S> {
    /// The store the writer uses.
    store: S,
    /// Arrival instant and revision of each event, from the watcher task.
    events: mpsc::UnboundedReceiver<(Instant, Version)>,
    /// The watcher task, aborted on drop.
    watcher: tokio::task::JoinHandle<()>,
}

impl<S: Store + Clone + 'static> CalmProbe<S>
where
    S::Watch: 'static,
{
    /// Starts the watch (inside `rt`).
    pub(crate) fn start(rt: &Runtime, store: &S) -> Self {
        rt.block_on(async {
            let mut watch = store
                .watch(KeySpan::Key(WATCH_KEY.to_vec()), Version::ZERO)
                .await
                .expect("calm watch");
            let (tx, events) = mpsc::unbounded_channel();
            let watcher = tokio::spawn(async move {
                while let Ok(event) = watch.next().await {
                    if tx.send((Instant::now(), event.revision())).is_err() {
                        break;
                    }
                }
            });
            Self {
                store: store.clone(),
                events,
                watcher,
            }
        })
    }
}

impl<S> Drop for CalmProbe<S> {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl<S: Store + Clone + 'static> Probe for CalmProbe<S> {
    async fn sample(&mut self) -> Stamps {
        let call = Instant::now();
        let put = self
            .store
            .put(WATCH_KEY, &[7; VALUE], PutOptions::new())
            .await
            .expect("calm watched put");
        let ack = Instant::now();
        let revision = put.committed().expect("an unconditional put commits");
        let (arrived, seen) = arrival(&mut self.events).await;
        assert_eq!(seen, revision, "calm watch: not the event of the put");
        Stamps { call, ack, arrived }
    }
}
