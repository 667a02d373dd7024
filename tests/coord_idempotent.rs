//! `coord::Idempotent`: one run per key, the recorded outcome for repeats,
//! takeover of crashed runs with a higher token, and fencing of the old
//! runner, checked by scenarios and by a property test over random
//! interleavings of callers, pauses, crashes and lease expiries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use calm::coord::{CoordError, FencingToken, Idempotent, LeaseOptions, MAX_TTL, StoreFence};
use calm::store::{Clock, ManualClock, MemoryStore, PutOptions, Store, StoreError};
use calm::testing::faults::InstrumentedStore;
use proptest::prelude::*;
use tokio::sync::oneshot;

/// The claims' time to live in the manual-clock tests.
const TTL: Duration = Duration::from_secs(4);

/// A store and lease options of [`TTL`] on one manual clock.
fn world() -> (ManualClock, MemoryStore, LeaseOptions) {
    crate::common::world::world(TTL)
}

/// A repeat gets the recorded outcome and token without running the
/// operation, and the claim's lease is gone once the record is written.
#[tokio::test]
async fn repeat_returns_the_recorded_outcome() {
    let (_clock, store, opts) = world();
    let payments = Idempotent::with_lease_options(store.clone(), "pay/", opts).expect("valid");
    let runs = AtomicUsize::new(0);
    let op = |value: u64| {
        let runs = &runs;
        move |_token: FencingToken| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            value
        }
    };
    let first = payments.run("order-1", op(4200)).await.expect("first run");
    let again = payments.run("order-1", op(1)).await.expect("repeat");
    let other = payments.run("order-2", op(7)).await.expect("other key");
    assert!(first.ran_here && !again.ran_here && other.ran_here);
    assert_eq!((first.value, again.value, other.value), (4200, 4200, 7));
    assert_eq!(first.token, again.token);
    assert!(other.token > first.token);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The record outlives the claim's lease: it has none.
    let record = store
        .get(b"pay/order-1")
        .await
        .expect("get")
        .expect("recorded");
    assert_eq!(record.lease, None);
}

/// A recorded outcome read back as a different type is a typed `Record`
/// error, not a panic, and the operation does not run.
#[tokio::test]
async fn recorded_outcome_of_another_type_is_a_typed_error() {
    let (_clock, store, opts) = world();
    let jobs = Idempotent::with_lease_options(store, "jobs/", opts).expect("valid");
    let _ = jobs.run("j", |_| async { 5u64 }).await.expect("first run");
    let ran = AtomicUsize::new(0);
    let err = jobs
        .run("j", |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            String::from("never")
        })
        .await
        .expect_err("a number is not a string");
    assert!(matches!(err, CoordError::Record(_)), "{err}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// Eight tasks calling one key at once: the operation runs once, exactly
/// one caller ran it, and all get the same value and token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_run() {
    let store = MemoryStore::new();
    let jobs = Idempotent::new(store, "jobs/", Duration::from_secs(10)).expect("valid");
    let runs = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..8u64)
        .map(|i| {
            let (jobs, runs) = (jobs.clone(), Arc::clone(&runs));
            tokio::spawn(async move {
                jobs.run("report", move |_token| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Long enough that every other caller arrives while
                    // this run is in progress.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    i
                })
                .await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for c in callers {
        outcomes.push(c.await.expect("task joins").expect("run succeeds"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(outcomes.iter().filter(|c| c.ran_here).count(), 1);
    let winner = outcomes.iter().find(|c| c.ran_here).expect("one ran");
    for c in &outcomes {
        assert_eq!((c.value, c.token), (winner.value, winner.token));
    }
}

/// What a runner's fenced write returned when it finally went out.
type Effect = Arc<Mutex<Option<Result<(), CoordError>>>>;

/// A run in its own task whose operation the test steps through.
struct Runner {
    /// The claim's token, sent when the operation starts.
    started: oneshot::Receiver<FencingToken>,
    /// Lets the operation write when taken and dropped.
    go: Option<oneshot::Sender<()>>,
    /// Sent once the fenced write returned.
    wrote: oneshot::Receiver<()>,
    /// Lets the operation return after its write when taken and dropped.
    finish: Option<oneshot::Sender<()>>,
    /// How the fenced write went.
    effect: Effect,
    task: tokio::task::JoinHandle<Result<calm::coord::Completed<u64>, CoordError>>,
}

/// Spawns a run of `key` on `process` whose operation reports its token,
/// waits for `go`, writes `value` to `ledger/<key>` through a `StoreFence`
/// with its token, waits for `finish` and returns `value`.
fn spawn_runner(
    process: &InstrumentedStore<MemoryStore>,
    opts: &LeaseOptions,
    key: &'static str,
    value: u64,
) -> Runner {
    let idem = Idempotent::with_lease_options(process.clone(), "pay/", opts.clone()).expect("ok");
    let fence = StoreFence::new(process.clone(), b"fence/ledger".to_vec()).expect("valid key");
    let (started_tx, started) = oneshot::channel();
    let (go, go_rx) = oneshot::channel::<()>();
    let (wrote_tx, wrote) = oneshot::channel();
    let (finish, finish_rx) = oneshot::channel::<()>();
    let effect: Effect = Arc::default();
    let slot = Arc::clone(&effect);
    let task = tokio::spawn(async move {
        idem.run(key, move |token| async move {
            let _ = started_tx.send(token);
            let _ = go_rx.await;
            let ledger = format!("ledger/{key}");
            let result = fence
                .put(token, ledger.as_bytes(), &value.to_be_bytes())
                .await;
            *slot.lock().expect("not poisoned") = Some(result.map(|_| ()));
            let _ = wrote_tx.send(());
            let _ = finish_rx.await;
            value
        })
        .await
    });
    Runner {
        started,
        go: Some(go),
        wrote,
        finish: Some(finish),
        effect,
        task,
    }
}

impl Runner {
    /// Lets the operation make its write.
    fn write(&mut self) {
        self.go.take();
    }

    /// Lets the operation return once it has written.
    fn finish(&mut self) {
        self.finish.take();
    }

    /// Lets the operation run to the end.
    fn release(&mut self) {
        self.write();
        self.finish();
    }

    /// Whether the fenced write was admitted.
    fn admitted(&self) -> bool {
        matches!(*self.effect.lock().expect("not poisoned"), Some(Ok(())))
    }

    /// Whether the fenced write was refused for `presented` by `highest`.
    fn refused(&self, presented: FencingToken, highest: FencingToken) -> bool {
        matches!(
            &*self.effect.lock().expect("not poisoned"),
            Some(Err(CoordError::Fenced(f))) if f.presented == presented && f.highest == highest
        )
    }
}

/// A runner paused past its claim's lease is taken over by the next caller
/// with a higher token; when it resumes, its fenced write and its recording
/// are both refused, leaving the store unchanged, and repeats get the
/// taker's outcome.
#[tokio::test]
async fn crashed_runner_is_taken_over_and_fenced() {
    let (clock, store, opts) = world();
    let a = InstrumentedStore::new(store.clone());
    let mut run_a = spawn_runner(&a, &opts, "p-1", 1);
    let a_token = (&mut run_a.started).await.expect("A's operation started");
    a.pause(); // A freezes inside its operation, before its write
    run_a.release();
    crate::common::world::settle().await;
    clock.advance(TTL + Duration::from_secs(1));
    crate::common::world::settle().await;
    assert!(
        store.get(b"pay/p-1").await.expect("get").is_none(),
        "claim expired"
    );

    let b = InstrumentedStore::new(store.clone());
    let mut run_b = spawn_runner(&b, &opts, "p-1", 2);
    let b_token = (&mut run_b.started).await.expect("B took over");
    assert!(b_token > a_token);
    run_b.release();
    let b_done = (&mut run_b.task).await.expect("joins").expect("B records");
    assert!(b_done.ran_here);
    assert_eq!((b_done.value, b_done.token), (2, b_token));
    assert!(run_b.admitted());

    let before = store.revision().await.expect("revision");
    a.resume();
    let a_done = (&mut run_a.task).await.expect("joins");
    assert!(run_a.refused(a_token, b_token), "A's write is fenced");
    assert_eq!(
        store.revision().await.expect("revision"),
        before,
        "A wrote nothing"
    );
    match a_done {
        Err(CoordError::Fenced(f)) => assert_eq!((f.presented, f.highest), (a_token, b_token)),
        other => panic!("A's recording must be fenced, got {other:?}"),
    }
    let ledger = store
        .get(b"ledger/p-1")
        .await
        .expect("get")
        .expect("written");
    assert_eq!(ledger.value, 2u64.to_be_bytes());
    let idem = Idempotent::with_lease_options(store, "pay/", opts).expect("valid");
    let repeat = idem.run("p-1", |_| async { 3u64 }).await.expect("repeat");
    assert_eq!(
        (repeat.value, repeat.token, repeat.ran_here),
        (2, b_token, false)
    );
}

/// Regression: a runner whose claim was taken over must not record, even
/// if the taker's own claim has expired in turn by the time it tries (it
/// used to record into the then-empty key with the lower token, although
/// the resource had admitted the taker's higher one), and the outcome that
/// ends up recorded is the one the resource holds.
#[tokio::test]
async fn runner_taken_over_cannot_record_after_the_taker_expired() {
    let (clock, store, opts) = world();
    let a = InstrumentedStore::new(store.clone());
    let mut run_a = spawn_runner(&a, &opts, "p-2", 1);
    let a_token = (&mut run_a.started).await.expect("A started");
    a.pause(); // before A's write
    run_a.release();
    crate::common::world::settle().await;
    clock.advance(TTL + Duration::from_secs(1));
    crate::common::world::settle().await;

    let b = InstrumentedStore::new(store.clone());
    let mut run_b = spawn_runner(&b, &opts, "p-2", 2);
    let b_token = (&mut run_b.started).await.expect("B took over");
    run_b.write();
    (&mut run_b.wrote).await.expect("B wrote");
    assert!(run_b.admitted());
    b.pause(); // after B's write, before B records
    run_b.finish();
    crate::common::world::settle().await;
    clock.advance(TTL + Duration::from_secs(1));
    crate::common::world::settle().await;
    assert!(
        store.get(b"pay/p-2").await.expect("get").is_none(),
        "B's claim expired"
    );

    a.resume();
    let a_done = (&mut run_a.task).await.expect("joins");
    assert!(run_a.refused(a_token, b_token), "A's write is fenced");
    let err = a_done.expect_err("A was taken over: it must not record");
    assert!(err.is_lost_grant(), "{err}");
    b.resume();
    let _ = (&mut run_b.task).await.expect("joins");

    // Whoever recorded, the record agrees with what the ledger admitted.
    let c = InstrumentedStore::new(store.clone());
    let mut run_c = spawn_runner(&c, &opts, "p-2", 3);
    run_c.release();
    let repeat = (&mut run_c.task).await.expect("joins").expect("recorded");
    let ledger = store
        .get(b"ledger/p-2")
        .await
        .expect("get")
        .expect("written");
    assert_eq!(ledger.value, repeat.value.to_be_bytes());
    assert_ne!(repeat.token, a_token);
}

/// Empty key, empty prefix, zero or huge TTL, an oversized key: typed
/// errors, the operation never runs, the store's revision is unchanged.
#[tokio::test]
async fn bad_input_is_refused_with_typed_errors_and_no_write() {
    let (_clock, store, opts) = world();
    let _ = store
        .put(b"seed", b"x", PutOptions::new())
        .await
        .expect("put");
    let before = store.revision().await.expect("revision");
    let ran = AtomicUsize::new(0);
    let op = |_: FencingToken| async {
        ran.fetch_add(1, Ordering::SeqCst);
        1u64
    };

    let err = Idempotent::with_lease_options(store.clone(), "", opts.clone()).expect_err("empty");
    assert!(matches!(err, CoordError::InvalidName { .. }), "{err}");
    let err = Idempotent::new(store.clone(), "p/", Duration::ZERO).expect_err("zero ttl");
    assert!(matches!(err, CoordError::InvalidTtl { .. }), "{err}");
    // A TTL above MAX_TTL is refused at construction.
    let err = Idempotent::new(store.clone(), "p/", MAX_TTL + Duration::from_secs(1))
        .expect_err("huge ttl");
    assert!(matches!(err, CoordError::InvalidTtl { .. }), "{err}");

    let idem = Idempotent::with_lease_options(store.clone(), "p/", opts).expect("valid");
    let err = idem.run("", op).await.expect_err("empty key");
    assert!(matches!(err, CoordError::InvalidName { .. }), "{err}");
    let long = "k".repeat(64 * 1024);
    let err = idem.run(&long, op).await.expect_err("oversized key");
    assert!(
        matches!(err, CoordError::Store(StoreError::InvalidKey { .. })),
        "{err}"
    );

    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(store.revision().await.expect("revision"), before);
}

// ---------------------------------------------------------------------------
// The property test: random interleavings of callers, pauses, crashes and
// lease expiries, on a manual clock, each case on its own runtime.

/// Simulated processes, each with its own pausable view of the store.
const PROCESSES: usize = 3;
/// Idempotency keys in play.
const KEYS: usize = 2;
/// One step of the manual clock, half the claims' TTL: a live lease is
/// renewed every third of its TTL, so at every tick, and a process paused
/// for two ticks loses it.
const TICK: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
enum Step {
    /// `process` calls `run` on `key`; the operation thinks for `think`
    /// ticks, writes its effect through the fence, lingers for `linger`
    /// ticks and returns.
    Call {
        process: usize,
        key: usize,
        think: u8,
        linger: u8,
    },
    /// Freezes a process (its store calls and lease renewals block) for
    /// `ticks` ticks, or until resumed.
    Pause { process: usize, ticks: u8 },
    /// Unfreezes it.
    Resume(usize),
    /// Time passes by one tick.
    Tick,
    /// Aborts every unfinished call of a process.
    Crash(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..PROCESSES, prop_oneof![3 => Just(0), 1 => 0..KEYS], 0..4u8, 0..4u8)
            .prop_map(|(process, key, think, linger)| Step::Call { process, key, think, linger }),
        3 => (0..PROCESSES, 1..7u8).prop_map(|(process, ticks)| Step::Pause { process, ticks }),
        1 => (0..PROCESSES).prop_map(Step::Resume),
        6 => Just(Step::Tick),
        2 => (0..PROCESSES).prop_map(Step::Crash),
    ]
}

/// One execution of an operation.
#[derive(Debug, Clone)]
struct Execution {
    key: usize,
    token: FencingToken,
    /// Whether the resource admitted its fenced write (`None`: not tried).
    admitted: Option<bool>,
}

type Outcome = Result<calm::coord::Completed<u64>, CoordError>;

/// The simulated system of one case.
struct Sim {
    clock: ManualClock,
    store: MemoryStore,
    opts: LeaseOptions,
    processes: Vec<InstrumentedStore<MemoryStore>>,
    /// Every execution, in the order the operations started.
    log: Arc<Mutex<Vec<Execution>>>,
    /// Calls: key, process, and the task.
    calls: Vec<(usize, usize, tokio::task::JoinHandle<Outcome>)>,
    /// Ticks so far.
    ticks: u32,
    /// When each paused process resumes by itself.
    wake_at: [Option<u32>; PROCESSES],
}

fn effect_key(key: usize) -> Vec<u8> {
    format!("effect/{key}").into_bytes()
}

impl Sim {
    fn new() -> Self {
        let (clock, store, opts) = world();
        let processes = (0..PROCESSES)
            .map(|_| InstrumentedStore::new(store.clone()))
            .collect();
        Self {
            clock,
            store,
            opts,
            processes,
            log: Arc::default(),
            calls: Vec::new(),
            ticks: 0,
            wake_at: [None; PROCESSES],
        }
    }

    fn call(&mut self, process: usize, key: usize, think: u8, linger: u8) {
        let p = self.processes[process].clone();
        let idem = Idempotent::with_lease_options(p.clone(), "op/", self.opts.clone()).expect("ok");
        let fence = StoreFence::new(p, format!("fence/{key}").into_bytes()).expect("valid");
        let (log, clock) = (Arc::clone(&self.log), self.clock.clone());
        let task = tokio::spawn(async move {
            idem.run(&format!("k{key}"), move |token| async move {
                let id = {
                    let mut log = log.lock().expect("not poisoned");
                    log.push(Execution {
                        key,
                        token,
                        admitted: None,
                    });
                    log.len() - 1
                };
                let ticks = |n: u8| TICK * u32::from(n);
                clock.sleep_until(clock.now() + ticks(think)).await;
                let (target, value) = (effect_key(key), (id as u64).to_be_bytes());
                let admitted = match fence.put(token, &target, &value).await {
                    Ok(_) => true,
                    Err(CoordError::Fenced(_)) => false,
                    Err(e) => panic!("unexpected error from the fenced write: {e}"),
                };
                log.lock().expect("not poisoned")[id].admitted = Some(admitted);
                clock.sleep_until(clock.now() + ticks(linger)).await;
                id as u64
            })
            .await
        });
        self.calls.push((key, process, task));
    }

    async fn apply(&mut self, step: &Step) {
        match *step {
            Step::Call {
                process,
                key,
                think,
                linger,
            } => self.call(process, key, think, linger),
            Step::Pause { process, ticks } => {
                self.processes[process].pause();
                self.wake_at[process] = Some(self.ticks + u32::from(ticks));
            }
            Step::Resume(p) => self.processes[p].resume(),
            Step::Tick => {
                self.clock.advance(TICK);
                self.ticks += 1;
                for (p, at) in self.processes.iter().zip(&mut self.wake_at) {
                    if at.is_some_and(|at| at <= self.ticks) {
                        p.resume();
                        *at = None;
                    }
                }
            }
            Step::Crash(p) => {
                for (_, process, task) in &self.calls {
                    if *process == p {
                        task.abort();
                    }
                }
            }
        }
        crate::common::world::settle().await;
    }

    /// Resumes everyone, lets time pass until every call ended, makes one
    /// last call per key, and returns every outcome by key (aborted calls
    /// left out).
    async fn finish(mut self) -> Result<Checked, String> {
        for p in &self.processes {
            p.resume();
        }
        for key in 0..KEYS {
            self.call(0, key, 0, 0);
        }
        for _ in 0..200 {
            if self.calls.iter().all(|(_, _, t)| t.is_finished()) {
                break;
            }
            self.clock.advance(TICK);
            crate::common::world::settle().await;
        }
        let mut outcomes: Vec<Vec<Outcome>> = (0..KEYS).map(|_| Vec::new()).collect();
        for (key, _, task) in self.calls {
            if !task.is_finished() {
                return Err(format!("a call on key {key} never ended"));
            }
            match task.await {
                Ok(outcome) => outcomes[key].push(outcome),
                Err(e) if e.is_cancelled() => {}
                Err(e) => return Err(format!("a call panicked: {e}")),
            }
        }
        let mut effects = Vec::new();
        for key in 0..KEYS {
            let kv = self
                .store
                .get(&effect_key(key))
                .await
                .map_err(|e| e.to_string())?;
            effects.push(kv.and_then(|kv| kv.value.try_into().ok().map(u64::from_be_bytes)));
        }
        let log = self.log.lock().expect("not poisoned").clone();
        Ok(Checked {
            outcomes,
            effects,
            log,
        })
    }
}

/// What a finished case is checked on.
struct Checked {
    outcomes: Vec<Vec<Outcome>>,
    /// The value the resource holds per key (an execution id).
    effects: Vec<Option<u64>>,
    log: Vec<Execution>,
}

impl Checked {
    fn check(&self) -> Result<(), String> {
        // Grants' tokens strictly increase in the order operations started.
        for w in self.log.windows(2) {
            if w[0].token >= w[1].token {
                return Err(format!("tokens not increasing: {:?}", self.log));
            }
        }
        for (key, outcomes) in self.outcomes.iter().enumerate() {
            let mut ok = Vec::new();
            for o in outcomes {
                match o {
                    Ok(c) => ok.push(c),
                    Err(e) if e.is_lost_grant() => {}
                    Err(e) => return Err(format!("key {key}: unexpected error {e}")),
                }
            }
            let Some(first) = ok.first() else {
                return Err(format!("key {key}: even the last call failed"));
            };
            // Every successful caller saw the same execution, so among the
            // successful outcomes the operation ran exactly once.
            if let Some(c) = ok
                .iter()
                .find(|c| (c.value, c.token) != (first.value, first.token))
            {
                return Err(format!("key {key}: outcomes differ: {first:?} vs {c:?}"));
            }
            if ok.iter().filter(|c| c.ran_here).count() > 1 {
                return Err(format!("key {key}: two callers ran it: {ok:?}"));
            }
            let Some(exec) = usize::try_from(first.value)
                .ok()
                .and_then(|i| self.log.get(i))
            else {
                return Err(format!("key {key}: {first:?} names no execution"));
            };
            if exec.key != key || exec.token != first.token {
                return Err(format!("key {key}: {first:?} does not match {exec:?}"));
            }
            // Once a caller took over, the runners before it are fenced
            // out: the recorded run is the key's last claim.
            let last = self
                .log
                .iter()
                .filter(|e| e.key == key)
                .map(|e| e.token)
                .max();
            if last != Some(exec.token) {
                return Err(format!(
                    "key {key}: recorded {exec:?}, but {last:?} claimed later"
                ));
            }
            // The recorded run's fenced write was admitted, and the resource
            // still holds it: nothing stale landed after it.
            if exec.admitted != Some(true) {
                return Err(format!("key {key}: recorded {exec:?} was fenced out"));
            }
            if self.effects[key] != Some(first.value) {
                return Err(format!(
                    "key {key}: resource holds execution {:?}, recorded {}",
                    self.effects[key], first.value
                ));
            }
        }
        Ok(())
    }
}

fn simulate(steps: &[Step]) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut sim = Sim::new();
        for s in steps {
            sim.apply(s).await;
        }
        sim.finish().await?.check()
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: calm::testing::Config::default().cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Under random calls, pauses, crashes and expiries: tokens increase,
    /// every successful caller of a key gets one execution's outcome, that
    /// execution's fenced write was admitted and is what the resource holds.
    #[test]
    fn exactly_once_among_successes(steps in proptest::collection::vec(step(), 1..80)) {
        let verdict = simulate(&steps);
        prop_assert!(verdict.is_ok(), "{}", verdict.err().unwrap_or_default());
    }
}
