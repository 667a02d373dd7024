//! A bounded soak: the coordination recipes and `merge_into` run for a
//! chosen time under random pauses and real lease expiries, checking the
//! invariants throughout, and print what was checked.
//!
//! - **fencing**: candidates win terms, write through a `StoreFence`, and
//!   are paused at random past their TTL; the resource must never accept a
//!   token lower than one it already accepted;
//! - **no lost updates**: tasks increment their own slot of a counter with
//!   `merge_into`, paused at random; at the end the stored total equals
//!   the increments acknowledged;
//! - **idempotency**: workers race on the same keys with `Idempotent`,
//!   paused at random; each key has one recorded outcome, and every
//!   successful caller saw it.
//!
//! ```sh
//! cargo run --release --example soak -- 60            # 60 s on MemoryStore
//! CALM_SOAK_SERVERS=1 cargo run --release --all-features --example soak -- 60
//! ```
//!
//! The second form also soaks PostgreSQL and etcd (started by the example,
//! as the tests do). Exits non-zero on any violation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm::GCounter;
use calm::causal::ReplicaId;
use calm::coord::{CoordError, Election, FencingToken, Idempotent, Lease, StoreFence};
use calm::occ::Version;
use calm::store::{KeySpan, MemoryStore, Store, StoreExt, Watch};
use calm::testing::faults::InstrumentedStore;

/// Per idempotency key, each successful call's (value, ran here).
type Outcomes = BTreeMap<String, Vec<(u64, bool)>>;

/// What one soak saw.
#[derive(Debug, Default)]
struct Counts {
    terms: AtomicU64,
    accepted: AtomicU64,
    fenced: AtomicU64,
    pauses: AtomicU64,
    merges: AtomicU64,
    idempotent_runs: AtomicU64,
    idempotent_repeats: AtomicU64,
    violations: Mutex<Vec<String>>,
}

impl Counts {
    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().unwrap().push(what);
    }
}

/// A small xorshift for pause decisions.
fn rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed | 1;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    }
}

/// Pauses `view` now and then, for up to three TTLs.
async fn pauser<S: Store>(
    view: InstrumentedStore<S>,
    ttl: Duration,
    seed: u64,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    let mut r = rng(seed);
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(ttl.mul_f64(1.0 + r(30) as f64 / 10.0)).await;
        if r(3) == 0 {
            view.pause();
            counts.pauses.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(ttl.mul_f64(r(30) as f64 / 10.0)).await;
            view.resume();
        }
    }
    view.resume();
}

async fn candidate<S: Store + Clone + 'static>(
    view: InstrumentedStore<S>,
    prefix: String,
    ttl: Duration,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    let election = Election::new(view.clone(), format!("{prefix}leader/")).expect("valid prefix");
    let fence =
        StoreFence::new(view.clone(), format!("{prefix}fence").into_bytes()).expect("valid key");
    let data = format!("{prefix}data").into_bytes();
    while !stop.load(Ordering::Relaxed) {
        let Ok(lease) = Lease::grant(view.clone(), ttl).await else {
            continue;
        };
        let Ok(term) = tokio::time::timeout(ttl * 10, election.campaign(&lease, b"c"))
            .await
            .unwrap_or(Err(CoordError::LeaseLost { lease: lease.id() }))
        else {
            continue;
        };
        counts.terms.fetch_add(1, Ordering::Relaxed);
        while !stop.load(Ordering::Relaxed) && lease.is_alive() {
            match fence
                .put(term.token(), &data, &term.token().to_bytes())
                .await
            {
                Ok(_) => {
                    counts.accepted.fetch_add(1, Ordering::Relaxed);
                }
                Err(CoordError::Fenced(_)) => {
                    counts.fenced.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(_) => break,
            }
            tokio::time::sleep(ttl / 10).await;
        }
    }
}

async fn counter_task<S: Store + Clone + 'static>(
    view: InstrumentedStore<S>,
    key: Vec<u8>,
    me: u64,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) -> u64 {
    let mut mine = GCounter::new();
    let mut acked = 0;
    while !stop.load(Ordering::Relaxed) {
        mine.increment(ReplicaId::new(me), 1);
        if view.merge_into(&key, &mine).await.is_ok() {
            acked = mine.contribution(ReplicaId::new(me));
            counts.merges.fetch_add(1, Ordering::Relaxed);
        }
        tokio::task::yield_now().await;
    }
    // A final merge after the pauses end, so the last increments land.
    view.resume();
    if view.merge_into(&key, &mine).await.is_ok() {
        acked = mine.contribution(ReplicaId::new(me));
    }
    acked
}

async fn soak<S: Store + Clone + 'static>(
    name: &str,
    store: S,
    prefix: &str,
    ttl: Duration,
    seconds: u64,
) -> bool {
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    // The resource's own history: every accepted write to the fenced data,
    // in commit order, must carry a token at least the previous one's.
    let mut watch = store
        .watch(
            KeySpan::Key(format!("{prefix}data").into_bytes()),
            Version::ZERO,
        )
        .await
        .expect("watch the fenced resource");
    let resource_log = {
        let (stop, counts) = (Arc::clone(&stop), Arc::clone(&counts));
        tokio::spawn(async move {
            let mut highest = FencingToken::default();
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let Ok(Ok(e)) =
                    tokio::time::timeout(Duration::from_millis(200), watch.next()).await
                else {
                    continue;
                };
                let token = FencingToken::from_bytes(&e.kv.value).unwrap_or_default();
                if token < highest {
                    counts.violation(format!("resource accepted token {token} after {highest}"));
                }
                highest = highest.max(token);
                seen += 1;
            }
            seen
        })
    };
    let mut tasks = Vec::new();
    let mut pausers = Vec::new();
    for i in 0..3u64 {
        let view = InstrumentedStore::new(store.clone());
        pausers.push(tokio::spawn(pauser(
            view.clone(),
            ttl,
            11 + i,
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
        tasks.push(tokio::spawn(candidate(
            view,
            prefix.to_owned(),
            ttl,
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
    }
    let counter_key = format!("{prefix}counter").into_bytes();
    let mut counters = Vec::new();
    for i in 0..4u64 {
        let view = InstrumentedStore::new(store.clone());
        pausers.push(tokio::spawn(pauser(
            view.clone(),
            ttl,
            101 + i,
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
        counters.push(tokio::spawn(counter_task(
            view,
            counter_key.clone(),
            i + 1,
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
    }
    // Idempotency: workers race on a rolling set of keys.
    let outcomes: Arc<Mutex<Outcomes>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..3u64 {
        let view = InstrumentedStore::new(store.clone());
        pausers.push(tokio::spawn(pauser(
            view.clone(),
            ttl,
            201 + w,
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
        let (stop, counts, outcomes, prefix) = (
            Arc::clone(&stop),
            Arc::clone(&counts),
            Arc::clone(&outcomes),
            prefix.to_owned(),
        );
        workers.push(tokio::spawn(async move {
            let idem = Idempotent::new(view, format!("{prefix}idem/"), ttl).expect("valid");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("op-{}", n / 3);
                n += 1;
                tokio::time::sleep(ttl / 30).await;
                if let Ok(done) = idem.run(&key, |t| async move { t.get() }).await {
                    if done.ran_here {
                        counts.idempotent_runs.fetch_add(1, Ordering::Relaxed);
                    } else {
                        counts.idempotent_repeats.fetch_add(1, Ordering::Relaxed);
                    }
                    outcomes
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_default()
                        .push((done.value, done.ran_here));
                }
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for p in pausers {
        let _ = p.await;
    }
    let mut acked_total = 0;
    for c in counters {
        acked_total += c.await.unwrap_or(0);
    }
    for t in tasks {
        t.abort();
    }
    let resource_writes = resource_log.await.unwrap_or(0);
    for w in workers {
        w.abort();
    }
    let total: GCounter = store
        .read_merged(&counter_key)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    if total.value() != u128::from(acked_total) {
        counts.violation(format!(
            "counter {} but {} increments acknowledged",
            total.value(),
            acked_total
        ));
    }
    for (key, seen) in outcomes.lock().unwrap().iter() {
        let ran = seen.iter().filter(|(_, here)| *here).count();
        if ran > 1 {
            counts.violation(format!("{key} ran {ran} times"));
        }
        if seen.iter().any(|(v, _)| *v != seen[0].0) {
            counts.violation(format!("{key} returned different outcomes: {seen:?}"));
        }
    }
    let violations = counts.violations.lock().unwrap().len();
    println!(
        "{name}: {:.0?}, {} pauses; fencing: {} terms, {} fenced writes accepted ({resource_writes} checked in the resource's history), {} stale writes refused; \
         merge_into: {} merges, counter {} = acknowledged {}; idempotent: {} keys, {} runs, {} repeats; violations: {violations}",
        started.elapsed(),
        counts.pauses.load(Ordering::Relaxed),
        counts.terms.load(Ordering::Relaxed),
        counts.accepted.load(Ordering::Relaxed),
        counts.fenced.load(Ordering::Relaxed),
        counts.merges.load(Ordering::Relaxed),
        total.value(),
        acked_total,
        outcomes.lock().unwrap().len(),
        counts.idempotent_runs.load(Ordering::Relaxed),
        counts.idempotent_repeats.load(Ordering::Relaxed),
    );
    violations == 0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let mut ok = soak(
        "MemoryStore",
        MemoryStore::new(),
        "soak/",
        Duration::from_millis(300),
        seconds,
    )
    .await;
    if std::env::var("CALM_SOAK_SERVERS").is_ok_and(|v| v == "1") {
        ok &= servers(seconds).await;
    }
    if !ok {
        std::process::exit(1);
    }
}

#[cfg(all(feature = "postgres", feature = "etcd"))]
async fn servers(seconds: u64) -> bool {
    use calm::backend::{etcd::EtcdStore, postgres::PostgresStore};
    use calm::testing::servers::{EtcdServer, PostgresServer};
    let mut ok = true;
    match PostgresServer::start() {
        Ok(pg) => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match PostgresStore::connect(pg.url()).await {
                Ok(store) => {
                    ok &= soak(
                        "PostgreSQL",
                        store,
                        "soak/",
                        Duration::from_secs(1),
                        seconds,
                    )
                    .await
                }
                Err(e) => eprintln!("PostgreSQL soak skipped: {e}"),
            }
        }
        Err(e) => eprintln!("PostgreSQL soak skipped: {e}"),
    }
    match EtcdServer::start() {
        Ok(etcd) => match EtcdStore::connect(etcd.endpoints()).await {
            Ok(store) => ok &= soak("etcd", store, "soak/", Duration::from_secs(2), seconds).await,
            Err(e) => eprintln!("etcd soak skipped: {e}"),
        },
        Err(e) => eprintln!("etcd soak skipped: {e}"),
    }
    ok
}

#[cfg(not(all(feature = "postgres", feature = "etcd")))]
async fn servers(_: u64) -> bool {
    eprintln!("server soak needs --features postgres,etcd");
    true
}
