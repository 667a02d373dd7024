//! `testing::sim`: the seed's double write found in a lock without a
//! fence, nothing found with `Lock` plus `StoreFence`, and every run
//! replayable from its seed.

use std::time::Duration;

use calm::coord::{CoordError, Lease, Lock, StoreFence};
use calm::store::{KeySpan, PutOptions, Store};
use calm::testing::sim::{self, Process, SimEvent, SimOptions, SimRun};

/// TTL of every lease in these runs.
const TTL: Duration = Duration::from_secs(2);

/// Seeds tried: `CALM_SIM_SEEDS` (default 200).
fn seeds() -> u64 {
    std::env::var("CALM_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// Takes the lock, waits a little (work), writes its token to `data`
/// (through a fence keyed by the lock's token if `fenced`, else with a
/// plain put), lets go; again and again.
async fn holder(p: Process, fenced: bool) {
    let store = p.store();
    let lock = Lock::new(store.clone(), "lock/").unwrap();
    let fence = StoreFence::new(store.clone(), b"fence".to_vec()).unwrap();
    loop {
        let Ok(lease) = Lease::grant_with(store.clone(), p.lease_options(TTL)).await else {
            continue;
        };
        if let Ok(guard) = lock.lock(&lease).await {
            tokio::time::sleep(Duration::from_millis(p.random() % 300)).await;
            p.checkpoint().await;
            let token = guard.token();
            let value = token.get().to_be_bytes();
            if fenced {
                match fence.put(token, b"data", &value).await {
                    Ok(_) | Err(CoordError::Fenced(_)) => {}
                    Err(e) => panic!("fenced write: {e}"),
                }
            } else {
                let _ = store.put(b"data", &value, PutOptions::new()).await;
            }
            let _ = guard.unlock().await;
        }
        tokio::time::sleep(Duration::from_millis(p.random() % 100)).await;
    }
}

async fn unfenced(p: Process) {
    holder(p, false).await;
}

async fn fenced(p: Process) {
    holder(p, true).await;
}

/// The tokens written to `data`, in commit order, never go down (a
/// holder never wrote after its successor had).
fn tokens_never_go_down(run: &SimRun) -> Result<(), String> {
    let tokens: Vec<u64> = run
        .changes(KeySpan::Key(b"data".to_vec()))
        .iter()
        .map(|e| u64::from_be_bytes(e.kv.value.as_slice().try_into().unwrap()))
        .collect();
    if tokens.len() < 5 {
        return Err(format!("only {} writes: the run did no work", tokens.len()));
    }
    match tokens.windows(2).find(|w| w[1] < w[0]) {
        Some(w) => Err(format!(
            "token {} written after {} ({} writes)",
            w[1],
            w[0],
            tokens.len()
        )),
        None => Ok(()),
    }
}

#[test]
fn an_unfenced_lock_is_caught_writing_stale() {
    let options = SimOptions::default();
    let failure = sim::find_failure(0..seeds(), &options, unfenced, tokens_never_go_down)
        .expect("an unfenced lock lets a paused holder write after its successor");
    eprintln!(
        "seed {}: {} ({} fault events)",
        failure.seed,
        failure.message,
        failure.run.events().len()
    );
    assert!(
        failure.message.contains("written after"),
        "{}",
        failure.message
    );
    assert!(
        failure
            .run
            .events()
            .iter()
            .any(|e| matches!(e, SimEvent::Paused { length, .. } if *length > TTL)),
        "the stale write needs a pause past the TTL"
    );
    // The seed replays the run: the same faults, the same writes.
    let again = sim::simulate(failure.seed, &options, unfenced);
    assert_eq!(again.events(), failure.run.events());
    assert_eq!(
        again.changes(KeySpan::Prefix(Vec::new())),
        failure.run.changes(KeySpan::Prefix(Vec::new()))
    );
}

#[test]
fn a_fenced_lock_never_writes_stale() {
    let options = SimOptions::default();
    if let Some(failure) = sim::find_failure(0..seeds(), &options, fenced, tokens_never_go_down) {
        panic!("seed {}: {}", failure.seed, failure.message);
    }
}

/// Crashes restart the process as a new incarnation, and the whole store
/// (every change) is the same on a replay.
#[test]
fn crashes_restart_and_runs_replay() {
    let options = SimOptions::default().with_crashes(0.01, Duration::from_millis(500));
    let run = sim::simulate(7, &options, fenced);
    let crashes = run
        .events()
        .iter()
        .filter(|e| matches!(e, SimEvent::Crashed { .. }))
        .count();
    let restarts = run
        .events()
        .iter()
        .filter(|e| matches!(e, SimEvent::Started { incarnation, .. } if *incarnation > 0))
        .count();
    assert!(crashes > 0, "no crash in 60 s at 1 % a tick");
    assert!(
        restarts + options.processes >= crashes,
        "{restarts} restarts for {crashes} crashes"
    );
    tokens_never_go_down(&run).unwrap();
    let again = sim::simulate(7, &options, fenced);
    assert_eq!(run.events(), again.events());
    assert_eq!(
        run.changes(KeySpan::Prefix(Vec::new())),
        again.changes(KeySpan::Prefix(Vec::new()))
    );
    let other = sim::simulate(8, &options, fenced);
    assert_ne!(run.events(), other.events(), "two seeds, one schedule");
    let _ = run.block_on(async { run.store().revision().await });
}
