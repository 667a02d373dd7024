//! Coordination costs: how long an election takes to fail over, against
//! the limit of one lease TTL; what a `Fence::check` costs against a bare
//! atomic compare; what a `StoreFence::put` costs against a plain put.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calm::coord::{CoordError, Election, Fence, FencingToken, Lease, StoreFence};
use calm::occ::Version;
use calm::store::{Expect, MemoryStore, PutOptions, Store, WriteOutcome};
use calm::testing::faults::InstrumentedStore;

use crate::harness::{Row, Side, compare, now, on_threads, time_row};
use crate::rng::Rng;

/// The leases' time to live in the failover runs: short, so the runs are
/// quick, and long against the Tokio timer's millisecond resolution.
const TTL: Duration = Duration::from_millis(200);
/// Failovers measured.
const FAILOVERS: usize = 9;

/// One failover, timed.
#[derive(Debug, Clone, Copy)]
struct Failover {
    /// From the moment the leader froze to the successor's first fenced
    /// write.
    from_stop: Duration,
    /// From the moment the store ended the leader's lease (by its own
    /// deadline) to the successor's first fenced write.
    from_expiry: Duration,
}

/// Leader A wins and writes; candidate B waits; A freezes (a paused
/// process: it stops renewing, nothing else); B takes over when the store
/// ends A's lease and makes its first fenced write. A's late write with its
/// old token is then refused (asserted, so a broken run is not timed).
///
/// What the time from A's stop to B's write is made of:
///
/// 1. the rest of A's lease. The store ends a lease one TTL after the last
///    keep-alive it received, and the keeper renews every third of the
///    TTL, so when a leader stops at a random moment between 2/3 and all of
///    a TTL is left. This is the price of liveness by leases: nobody can
///    tell a paused leader from a dead one sooner, and B must not act
///    before the store has ended A's lease;
/// 2. the gap after the store's deadline: the store's reaper wakes on a
///    Tokio timer (millisecond resolution, plus scheduling) and deletes A's
///    key; B, watching only its predecessor's key, is woken, reads the line
///    once, verifies its own key in one transaction, and makes its fenced
///    write, one more transaction. Everything after the timer is a few
///    in-memory steps.
async fn one_failover(rng: &mut Rng) -> Result<Failover, CoordError> {
    let store = MemoryStore::new();
    let a_store = InstrumentedStore::new(store.clone());
    let a_lease = Lease::grant(a_store.clone(), TTL).await?;
    let a_term = Election::new(a_store.clone(), "leader/")?
        .campaign(&a_lease, b"a")
        .await?;
    let a_fence = StoreFence::new(a_store.clone(), b"fence/leader".to_vec())?;
    a_fence.put(a_term.token(), b"data", b"from a").await?;

    let b_lease = Lease::grant(store.clone(), TTL).await?;
    let b_election = Election::new(store.clone(), "leader/")?;
    let b_fence = StoreFence::new(store.clone(), b"fence/leader".to_vec())?;
    let successor = tokio::spawn(async move {
        let term = b_election.campaign(&b_lease, b"b").await?;
        b_fence.put(term.token(), b"data", b"from b").await?;
        let wrote = Instant::now();
        Ok::<_, CoordError>((wrote, term.token(), b_lease))
    });

    // Stop A at a random point of its renewal cycle.
    let phase = TTL.mul_f64(rng.below(1000) as f64 / 1000.0);
    tokio::time::sleep(Duration::from_millis(10) + phase).await;
    let stopped = Instant::now();
    a_store.pause();
    // The store's own count of what is left of A's lease. Read just after
    // `probe`, so `probe + remaining` is at most the real deadline and the
    // gap below is, if anything, overstated.
    let probe = Instant::now();
    let remaining = store.time_to_live(a_lease.id()).await?;
    let deadline = probe + remaining;

    let (wrote, b_token, b_lease) = successor
        .await
        .expect("the successor task does not panic")?;
    assert!(b_token > a_term.token());
    a_store.resume();
    let late = a_fence.put(a_term.token(), b"data", b"late from a").await;
    assert!(matches!(late, Err(CoordError::Fenced(_))), "{late:?}");
    let data = store.get(b"data").await?.expect("written");
    assert_eq!(data.value, b"from b");
    b_lease.revoke().await?;
    Ok(Failover {
        from_stop: wrote - stopped,
        from_expiry: wrote.saturating_duration_since(deadline),
    })
}

/// Median and maximum, in seconds.
fn median_max(mut xs: Vec<Duration>) -> (f64, f64) {
    xs.sort();
    (
        xs[xs.len() / 2].as_secs_f64(),
        xs[xs.len() - 1].as_secs_f64(),
    )
}

fn failover_rows() -> Vec<Row> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a Tokio runtime");
    let mut rng = Rng::new(0x5eed_f00d);
    let runs: Vec<Failover> = (0..FAILOVERS)
        .map(|_| rt.block_on(one_failover(&mut rng)).expect("failover run"))
        .collect();
    for (i, r) in runs.iter().enumerate() {
        eprintln!(
            "failover run {i}: leader stop -> first fenced write {:.1} ms, lease end -> write {:.3} ms",
            r.from_stop.as_secs_f64() * 1e3,
            r.from_expiry.as_secs_f64() * 1e3
        );
    }
    let (stop_med, stop_max) = median_max(runs.iter().map(|r| r.from_stop).collect());
    let (gap_med, gap_max) = median_max(runs.iter().map(|r| r.from_expiry).collect());
    let workload = format!(
        "election failover, TTL {} ms, {FAILOVERS} runs",
        TTL.as_millis()
    );
    // Against the TTL, so the last column is the multiple of the TTL.
    let row = |metric: &str, ours: f64| {
        time_row(
            &workload,
            metric,
            "limit: one TTL",
            (ours, TTL.as_secs_f64()),
        )
    };
    vec![
        row(
            "leader stops → next leader's first fenced write, median",
            stop_med,
        ),
        row(
            "leader stops → next leader's first fenced write, max",
            stop_max,
        ),
        row("store ends the lease → first fenced write, median", gap_med),
        row("store ends the lease → first fenced write, max", gap_max),
    ]
}

fn fence_rows() -> Vec<Row> {
    // A holder writing many times with its token: equal tokens pass.
    let token = FencingToken::new(34);
    let fence = Fence::new();
    fence.check(token).expect("first token");
    let atomic = AtomicU64::new(token.get());
    let check = || fence.check(token).is_ok();
    // The least any fence can do: read the highest token and compare.
    let load = || token.get() >= atomic.load(Ordering::Acquire);
    // What `Fence::check` does by hand: raise and compare in one step.
    let fetch_max = || token.get() >= atomic.fetch_max(token.get(), Ordering::AcqRel);
    let mut rows = Vec::new();
    let w = "fence check, one thread";
    rows.push(time_row(
        w,
        "check",
        "AtomicU64 load + compare",
        compare(Side::looped(check), Side::looped(load)),
    ));
    rows.push(time_row(
        w,
        "check",
        "AtomicU64 fetch_max + compare",
        compare(Side::looped(check), Side::looped(fetch_max)),
    ));
    // Across threads a run is a batch of checks, so that starting the
    // threads (tens of µs) never dominates a round, even when calibration
    // settles on a handful of runs.
    const BATCH: usize = 4096;
    let per_check = |(ours, theirs): (f64, f64)| (ours / BATCH as f64, theirs / BATCH as f64);
    let w = "fence check, two threads, one fence";
    rows.push(time_row(
        w,
        "check",
        "AtomicU64 load + compare",
        per_check(compare(
            Side::custom(|n| on_threads(2, n * BATCH, || assert!(check()))),
            Side::custom(|n| on_threads(2, n * BATCH, || assert!(load()))),
        )),
    ));
    rows.push(time_row(
        w,
        "check",
        "AtomicU64 fetch_max + compare",
        per_check(compare(
            Side::custom(|n| on_threads(2, n * BATCH, || assert!(check()))),
            Side::custom(|n| on_threads(2, n * BATCH, || assert!(fetch_max()))),
        )),
    ));
    // A stale token is still refused after all that.
    assert!(fence.check(FencingToken::new(33)).is_err());
    assert_eq!(fence.highest(), token);
    for r in &rows {
        eprintln!(
            "{}: Fence::check {:.0} M checks/s, {} {:.0} M checks/s",
            r.workload,
            1e-6 / r.ours.value(),
            r.peer,
            1e-6 / r.theirs.value()
        );
    }
    rows
}

fn store_fence_rows() -> Vec<Row> {
    let store = MemoryStore::new();
    let fence = StoreFence::new(store.clone(), b"fence/orders".to_vec()).expect("valid key");
    let token = FencingToken::new(1);
    let fenced = || now(fence.put(token, b"orders/1", b"value")).expect("admitted");
    let plain = || {
        let o = now(store.put(b"orders/2", b"value", PutOptions::new())).expect("put");
        assert!(matches!(o, WriteOutcome::Committed { .. }));
    };
    // Compare-and-set: read the version, write if unchanged.
    let cas = || {
        let v = now(store.get(b"orders/3"))
            .expect("get")
            .map_or(Version::ZERO, |kv| kv.mod_revision);
        let expect = if v == Version::ZERO {
            Expect::Absent
        } else {
            Expect::Version(v)
        };
        let o = now(store.put(b"orders/3", b"value", PutOptions::new().with_expect(expect)))
            .expect("put");
        assert!(matches!(o, WriteOutcome::Committed { .. }));
    };
    let w = "store write, one key, one thread";
    let rows = vec![
        time_row(
            w,
            "StoreFence::put",
            "MemoryStore::put",
            compare(Side::looped(fenced), Side::looped(plain)),
        ),
        time_row(
            w,
            "StoreFence::put",
            "MemoryStore get + compare-and-set put",
            compare(Side::looped(fenced), Side::looped(cas)),
        ),
    ];
    // The fence still refuses a stale token, and the data is the last
    // admitted write.
    let late = now(fence.put(FencingToken::new(0), b"orders/1", b"stale"));
    assert!(matches!(late, Err(CoordError::Fenced(_))));
    let kv = now(store.get(b"orders/1")).expect("get").expect("written");
    assert_eq!(kv.value, b"value");
    rows
}

/// Runs every measurement and returns the rows.
pub fn run() -> Vec<Row> {
    let mut rows = failover_rows();
    rows.extend(fence_rows());
    rows.extend(store_fence_rows());
    rows
}
