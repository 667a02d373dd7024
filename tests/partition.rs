//! The in-process single writer (`calm::partition::SerialExecutor`): per-key
//! order and exclusivity under random interleavings on a multi-thread
//! runtime, back-pressure, panic isolation, idle keys, shutdown, and what
//! dropping each future does.
//!
//! Property tests run `CALM_PROPTEST_CASES` cases (default 64).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use calm::partition::{Completion, SerialError, SerialExecutor, SerialOptions};
use calm::testing::Config;
use proptest::collection::vec;
use proptest::prelude::*;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// The number of property-test cases (`CALM_PROPTEST_CASES`).
fn cases() -> u32 {
    Config::default().cases
}

/// A multi-thread runtime with more workers than the machine may have
/// cores, so the OS interleaves them too.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

fn options(capacity: usize) -> SerialOptions {
    SerialOptions::default().with_queue_capacity(capacity)
}

/// What each key's work records: the order it ran in, and whether two
/// pieces of work for one key ever ran at once.
struct Probe {
    /// Per key: the tickets of its work, in the order the work ran.
    log: Vec<Mutex<Vec<u64>>>,
    /// Per key: how many pieces of its work are running right now.
    in_flight: Vec<AtomicUsize>,
    /// Set if any key ever had two pieces of work running at once.
    overlapped: AtomicBool,
}

impl Probe {
    fn new(keys: usize) -> Arc<Self> {
        Arc::new(Self {
            log: (0..keys).map(|_| Mutex::new(Vec::new())).collect(),
            in_flight: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            overlapped: AtomicBool::new(false),
        })
    }

    fn enter(&self, key: usize, ticket: u64) {
        if self.in_flight[key].fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlapped.store(true, Ordering::SeqCst);
        }
        self.log[key].lock().expect("log").push(ticket);
    }

    fn leave(&self, key: usize) {
        self.in_flight[key].fetch_sub(1, Ordering::SeqCst);
    }

    fn log(&self, key: usize) -> Vec<u64> {
        self.log[key].lock().expect("log").clone()
    }
}

/// Async work that records `ticket` for `key`, and awaits `yields` times
/// while it holds the key, so other work could overlap it if the executor
/// let it.
async fn record(probe: Arc<Probe>, key: usize, ticket: u64, yields: u8) -> u64 {
    probe.enter(key, ticket);
    for _ in 0..yields {
        tokio::task::yield_now().await;
    }
    probe.leave(key);
    ticket
}

/// Checks that no key ever ran two pieces of work at once and that each
/// submitter's work (ticket `sequence * 16 + submitter`) ran in its
/// submission order on every key; returns how many pieces ran.
fn runs_in_submitters_order(
    probe: &Probe,
    keys: usize,
    submitters: u64,
) -> Result<usize, TestCaseError> {
    prop_assert!(!probe.overlapped.load(Ordering::SeqCst));
    let mut ran = 0;
    for key in 0..keys {
        let log = probe.log(key);
        ran += log.len();
        for who in 0..submitters {
            let mine: Vec<u64> = log.iter().copied().filter(|t| t % 16 == who).collect();
            prop_assert!(mine.windows(2).all(|w| w[0] < w[1]), "key {key}: {log:?}");
        }
    }
    Ok(ran)
}

/// A gate: work that awaits `wait` holds its key until `open` is sent.
fn gate() -> (oneshot::Sender<()>, oneshot::Receiver<()>) {
    oneshot::channel()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Several tasks on a multi-thread runtime submit sync and async work
    /// across a few keys with `try_submit*`, each submission numbered under
    /// a per-key test lock, so the acceptance order is known exactly: every
    /// key's work ran in exactly that order, never two at once, and once
    /// drained no key is left behind. Full queues hand the work back, and
    /// the handed-back work is what gets resubmitted.
    #[test]
    fn per_key_order_is_acceptance_order(
        plans in vec(vec((0..4usize, 0..3u8), 1..40), 2..5),
        capacity in 1..6usize,
    ) {
        let rt = runtime();
        let probe = Probe::new(4);
        let serial = SerialExecutor::with_options(options(capacity));
        let tickets: Arc<Vec<Mutex<u64>>> = Arc::new((0..4).map(|_| Mutex::new(0)).collect());
        rt.block_on(async {
            let mut submitters = Vec::new();
            for plan in plans {
                let (serial, probe, tickets) = (serial.clone(), probe.clone(), tickets.clone());
                submitters.push(tokio::spawn(async move {
                    let mut done = Vec::new();
                    for (key, kind) in plan {
                        done.push(submit_numbered(&serial, &probe, &tickets, key, kind).await);
                    }
                    done
                }));
            }
            for submitter in submitters {
                for (ticket, done) in submitter.await.expect("submitter") {
                    assert_eq!(done.await, Ok(ticket));
                }
            }
            serial.idle().await;
        });
        prop_assert!(!probe.overlapped.load(Ordering::SeqCst));
        for key in 0..4 {
            let accepted = *tickets[key].lock().expect("tickets");
            prop_assert_eq!(probe.log(key), (0..accepted).collect::<Vec<_>>());
        }
        prop_assert_eq!(serial.active_keys(), 0);
    }

    /// Submitters that wait for room (`submit`, `submit_fn`, `run`, tiny
    /// queues) see their own work for each key run in the order they
    /// submitted it, never overlapping; every accepted piece runs exactly
    /// once.
    #[test]
    fn waiting_submitters_keep_their_order(
        plans in vec(vec((0..3usize, 0..4u8), 1..40), 2..5),
        capacity in 1..3usize,
    ) {
        let rt = runtime();
        let probe = Probe::new(3);
        let serial = SerialExecutor::with_options(options(capacity));
        let submitters = plans.len() as u64;
        let total: usize = plans.iter().map(Vec::len).sum();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for (who, plan) in plans.into_iter().enumerate() {
                let (serial, probe) = (serial.clone(), probe.clone());
                tasks.push(tokio::spawn(async move {
                    let mut done = Vec::new();
                    for (seq, (key, kind)) in plan.into_iter().enumerate() {
                        // Ticket: submitter in the low bits, its sequence above.
                        let ticket = seq as u64 * 16 + who as u64;
                        let probe = probe.clone();
                        let completion = if kind == 3 {
                            // Run and awaited here: inline if the key is idle.
                            let ran = serial.run(key, record(probe, key, ticket, 2)).await;
                            assert_eq!(ran, Ok(ticket));
                            continue;
                        } else if kind == 0 {
                            serial.submit_fn(key, move || {
                                probe.enter(key, ticket);
                                probe.leave(key);
                                ticket
                            }).await.map_err(SerialError::from)
                        } else {
                            serial.submit(key, record(probe, key, ticket, kind)).await.map_err(SerialError::from)
                        };
                        done.push(completion.expect("open executor accepts"));
                    }
                    done
                }));
            }
            for task in tasks {
                for done in task.await.expect("submitter") {
                    done.await.expect("work ran");
                }
            }
            serial.shutdown().await;
        });
        prop_assert_eq!(runs_in_submitters_order(&probe, 3, submitters)?, total);
        prop_assert_eq!(serial.active_keys(), 0);
    }

    /// `run` futures dropped after their first poll (the work accepted,
    /// and started if the key was idle) or after a few polls with yields
    /// between (waiting for the key's turn, handed it, or midway through
    /// the work) beside awaited runs and queued submissions: every piece
    /// still runs exactly once, each submitter's work for a key in its
    /// order, never two pieces of one key at once, and nothing is left
    /// behind.
    #[test]
    fn dropped_runs_still_finish_in_order(
        plans in vec(vec((0..3usize, 0..4u8, 0..4u8), 1..30), 2..5),
    ) {
        let rt = runtime();
        let probe = Probe::new(3);
        // Room for every submission: a first poll always accepts the work.
        let serial = SerialExecutor::new();
        let submitters = plans.len() as u64;
        let total: usize = plans.iter().map(Vec::len).sum();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for (who, plan) in plans.into_iter().enumerate() {
                let (serial, probe) = (serial.clone(), probe.clone());
                tasks.push(tokio::spawn(async move {
                    let mut queued = Vec::new();
                    for (seq, (key, how, yields)) in plan.into_iter().enumerate() {
                        let ticket = seq as u64 * 16 + who as u64;
                        let work = record(probe.clone(), key, ticket, yields);
                        match how {
                            0 => assert_eq!(serial.run(key, work).await, Ok(ticket)),
                            1 => queued.push(serial.submit(key, work).await.expect("open")),
                            2 => {
                                let mut run = std::pin::pin!(serial.run(key, work));
                                std::future::poll_fn(|cx| {
                                    let _ = run.as_mut().poll(cx);
                                    std::task::Poll::Ready(())
                                })
                                .await;
                            }
                            _ => {
                                let mut run = std::pin::pin!(serial.run(key, work));
                                for _ in 0..=yields {
                                    let ready = std::future::poll_fn(|cx| {
                                        std::task::Poll::Ready(run.as_mut().poll(cx).is_ready())
                                    })
                                    .await;
                                    if ready {
                                        break;
                                    }
                                    tokio::task::yield_now().await;
                                }
                            }
                        }
                    }
                    for done in queued {
                        done.await.expect("work ran");
                    }
                }));
            }
            for task in tasks {
                task.await.expect("submitter");
            }
            tokio::time::timeout(Duration::from_secs(30), serial.shutdown())
                .await
                .expect("every accepted piece ran and its key was freed");
        });
        prop_assert_eq!(runs_in_submitters_order(&probe, 3, submitters)?, total);
        prop_assert_eq!(serial.active_keys(), 0);
    }

    /// Random pieces of work panic (sync and async): each fails only its
    /// own Completion with `Panicked` and its message; every other piece,
    /// on the same key or another, runs and returns, in order.
    #[test]
    fn panics_fail_only_their_own_work(
        plan in vec((0..3usize, any::<bool>(), any::<bool>()), 1..30),
    ) {
        let rt = runtime();
        let probe = Probe::new(3);
        let serial = SerialExecutor::new();
        let outcomes = rt.block_on(async {
            let mut done = Vec::new();
            for (ticket, &(key, panics, sync)) in plan.iter().enumerate() {
                let (probe, ticket) = (probe.clone(), ticket as u64);
                let completion = if sync {
                    serial.submit_fn(key, move || {
                        probe.enter(key, ticket);
                        probe.leave(key);
                        assert!(!panics, "sync work {ticket} panics");
                        ticket
                    }).await.map_err(SerialError::from)
                } else {
                    serial.submit(key, async move {
                        probe.enter(key, ticket);
                        tokio::task::yield_now().await;
                        probe.leave(key);
                        assert!(!panics, "async work {ticket} panics");
                        ticket
                    }).await.map_err(SerialError::from)
                };
                done.push(completion.expect("accepted"));
            }
            let mut outcomes = Vec::new();
            for d in done {
                outcomes.push(d.await);
            }
            serial.shutdown().await;
            outcomes
        });
        for (ticket, (&(_, panics, sync), outcome)) in plan.iter().zip(outcomes).enumerate() {
            if panics {
                let kind = if sync { "sync" } else { "async" };
                let message = format!("{kind} work {ticket} panics");
                prop_assert_eq!(outcome, Err(SerialError::Panicked { message: Some(message) }));
            } else {
                prop_assert_eq!(outcome, Ok(ticket as u64));
            }
        }
        for key in 0..3 {
            let expected: Vec<u64> = plan.iter().enumerate()
                .filter(|(_, (k, _, _))| *k == key)
                .map(|(t, _)| t as u64)
                .collect();
            prop_assert_eq!(probe.log(key), expected);
        }
        prop_assert!(!probe.overlapped.load(Ordering::SeqCst));
        prop_assert_eq!(serial.active_keys(), 0);
    }

    /// However many keys were busy, once their work drains none is left:
    /// no map entry and no task per idle key.
    #[test]
    fn idle_keys_leave_nothing(keys in vec(0..500u32, 1..200)) {
        let rt = runtime();
        let serial = SerialExecutor::new();
        let distinct: BTreeSet<u32> = keys.iter().copied().collect();
        let (open, wait) = gate();
        rt.block_on(async {
            // One gated key keeps the executor busy while the others
            // come and go.
            let held = serial.submit(u32::MAX, async move {
                wait.await.ok();
            }).await.expect("accepted");
            let mut done = Vec::new();
            for key in &keys {
                done.push(serial.submit_fn(*key, || ()).await.expect("accepted"));
                assert!(serial.active_keys() <= distinct.len() + 1);
            }
            for d in done {
                d.await.expect("ran");
            }
            open.send(()).ok();
            held.await.expect("ran");
            serial.idle().await;
        });
        prop_assert_eq!(serial.active_keys(), 0);
        prop_assert!(!serial.is_closed());
    }

    /// Submitters race a shutdown called at a random moment: every
    /// submission that was accepted ran exactly once before `shutdown`
    /// returned, every refused one is `Closed` with its work handed back
    /// unrun, and nothing is left behind.
    #[test]
    fn shutdown_loses_no_accepted_work(
        submitters in 1..5usize,
        per_submitter in 1..60usize,
        capacity in 1..4usize,
        shutdown_after in 0..50u32,
    ) {
        let rt = runtime();
        let serial = SerialExecutor::with_options(options(capacity));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let (accepted, refused) = rt.block_on(async {
            let mut tasks = Vec::new();
            for who in 0..submitters {
                let (serial, ran) = (serial.clone(), ran.clone());
                tasks.push(tokio::spawn(async move {
                    let mut accepted = Vec::new();
                    let mut refused = Vec::new();
                    for i in 0..per_submitter {
                        let id = who * 1000 + i;
                        let ran = ran.clone();
                        let work = async move {
                            tokio::task::yield_now().await;
                            ran.lock().expect("ran").push(id);
                            id
                        };
                        match serial.submit(i % 3, work).await {
                            Ok(done) => accepted.push((id, done)),
                            Err(rejected) => {
                                assert_eq!(rejected.error(), &SerialError::Closed);
                                // Handed back unrun; run by the test later.
                                refused.push((id, rejected.into_work()));
                            }
                        }
                    }
                    (accepted, refused)
                }));
            }
            for _ in 0..shutdown_after {
                tokio::task::yield_now().await;
            }
            serial.shutdown().await;
            // Everything accepted has run by now, whether awaited or not.
            let ran_at_shutdown = ran.lock().expect("ran").len();
            let mut accepted = Vec::new();
            let mut refused = Vec::new();
            for task in tasks {
                let (a, r) = task.await.expect("submitter");
                for (id, done) in a {
                    assert_eq!(done.await, Ok(id));
                    accepted.push(id);
                }
                refused.extend(r);
            }
            assert_eq!(ran.lock().expect("ran").len(), ran_at_shutdown);
            let mut refused_ids = Vec::new();
            for (id, work) in refused {
                // Handed back intact: it still runs and yields its id.
                assert_eq!(work.await, id);
                refused_ids.push(id);
            }
            assert_eq!(ran_at_shutdown, accepted.len());
            (accepted, refused_ids)
        });
        let mut ran: Vec<usize> = ran.lock().expect("ran").clone();
        ran.sort_unstable();
        let mut expected: Vec<usize> = accepted.iter().chain(&refused).copied().collect();
        expected.sort_unstable();
        // Each accepted id once (by the executor), each refused id once (by
        // the test, from the handed-back work); no id twice.
        prop_assert_eq!(ran, expected);
        prop_assert_eq!(accepted.len() + refused.len(), submitters * per_submitter);
        prop_assert_eq!(serial.active_keys(), 0);
        prop_assert!(serial.is_closed());
    }
}

/// Submits work for `key` (sync if `kind` is 0, else async with `kind`
/// awaits) numbered by the key's next ticket, under the key's test lock so
/// that ticket order is acceptance order; on `Full` it resubmits the very
/// work it was handed back.
async fn submit_numbered(
    serial: &SerialExecutor<usize>,
    probe: &Arc<Probe>,
    tickets: &[Mutex<u64>],
    key: usize,
    kind: u8,
) -> (u64, Completion<u64>) {
    // The work reads its ticket from `slot`, set under the key's test lock
    // just before each attempt: handed-back work resubmitted after other
    // submitters took tickets still records the ticket it was accepted
    // with (it cannot run before it is accepted).
    let slot = Arc::new(AtomicU64::new(0));
    if kind == 0 {
        let mut work = None;
        loop {
            let accepted = {
                let mut next = tickets[key].lock().expect("tickets");
                let ticket = *next;
                slot.store(ticket, Ordering::SeqCst);
                let (probe, slot) = (probe.clone(), slot.clone());
                let w = work.take().unwrap_or_else(|| {
                    Box::new(move || {
                        let ticket = slot.load(Ordering::SeqCst);
                        probe.enter(key, ticket);
                        probe.leave(key);
                        ticket
                    }) as Box<dyn FnOnce() -> u64 + Send>
                });
                match serial.try_submit_fn(key, w) {
                    Ok(done) => {
                        *next += 1;
                        Some((ticket, done))
                    }
                    Err(rejected) => {
                        assert!(rejected.error().is_full(), "{rejected}");
                        work = Some(rejected.into_work());
                        None
                    }
                }
            };
            match accepted {
                Some(accepted) => return accepted,
                None => tokio::task::yield_now().await,
            }
        }
    } else {
        let mut work = None;
        loop {
            let accepted = {
                let mut next = tickets[key].lock().expect("tickets");
                let ticket = *next;
                slot.store(ticket, Ordering::SeqCst);
                let (probe, slot) = (probe.clone(), slot.clone());
                let w = work.take().unwrap_or_else(|| {
                    Box::pin(
                        async move { record(probe, key, slot.load(Ordering::SeqCst), kind).await },
                    )
                });
                match serial.try_submit(key, w) {
                    Ok(done) => {
                        *next += 1;
                        Some((ticket, done))
                    }
                    Err(rejected) => {
                        assert_eq!(
                            rejected.error(),
                            &SerialError::Full {
                                capacity: serial.queue_capacity()
                            }
                        );
                        work = Some(rejected.into_work());
                        None
                    }
                }
            };
            match accepted {
                Some(accepted) => return accepted,
                None => tokio::task::yield_now().await,
            }
        }
    }
}

/// A full queue refuses `try_submit` and `try_submit_fn` with `Full`,
/// handing back work that was never run; once room frees, the same work
/// is accepted and runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_submit_refuses_when_full_and_hands_work_back() {
    let serial = SerialExecutor::with_options(options(2));
    let runs = Arc::new(AtomicUsize::new(0));
    let (open, wait) = gate();
    let (started_tx, started) = oneshot::channel();
    let running = serial
        .try_submit("k", async move {
            started_tx.send(()).ok();
            wait.await.ok();
        })
        .expect("room");
    started.await.expect("first piece started");
    let queued: Vec<_> = (0..2)
        .map(|_| {
            let runs = runs.clone();
            serial
                .try_submit_fn("k", move || runs.fetch_add(1, Ordering::SeqCst))
                .expect("room")
        })
        .collect();

    let r = runs.clone();
    let refused = serial
        .try_submit_fn("k", move || r.fetch_add(1, Ordering::SeqCst))
        .expect_err("full");
    assert_eq!(refused.error(), &SerialError::Full { capacity: 2 });
    assert!(refused.error().is_retryable());
    assert_eq!(
        refused.to_string(),
        "the key's queue is full (2 pieces of work already wait)"
    );
    let closure = refused.into_work();
    let r = runs.clone();
    let refused_async = serial
        .try_submit("k", async move { r.fetch_add(1, Ordering::SeqCst) })
        .expect_err("full");
    assert!(refused_async.error().is_full());
    // Another key is unaffected by this key's full queue.
    assert_eq!(
        serial.try_submit_fn("other", || 9).expect("room").await,
        Ok(9)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "refused work never ran");

    open.send(()).ok();
    running.await.expect("ran");
    for q in queued {
        q.await.expect("ran");
    }
    // The handed-back work, resubmitted, runs once each.
    serial
        .try_submit_fn("k", closure)
        .expect("room")
        .await
        .expect("ran");
    let (_, future) = refused_async.into_parts();
    serial
        .try_submit("k", future)
        .expect("room")
        .await
        .expect("ran");
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    serial.shutdown().await;
}

/// `submit` on a full queue waits; dropping it while it waits queues
/// nothing (the work never runs), and a waiter that is not dropped is
/// accepted as soon as a place frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_waits_for_room_and_is_cancel_safe() {
    let serial = SerialExecutor::with_options(options(1));
    let runs = Arc::new(AtomicUsize::new(0));
    let (open, wait) = gate();
    let (started_tx, started) = oneshot::channel();
    let running = serial
        .submit(7, async move {
            started_tx.send(()).ok();
            wait.await.ok();
        })
        .await
        .expect("room");
    started.await.expect("started");
    let r = runs.clone();
    let queued = serial
        .submit_fn(7, move || r.fetch_add(1, Ordering::SeqCst))
        .await
        .expect("room");

    // Full: the submission waits, and a timeout drops it mid-wait.
    let r = runs.clone();
    let dropped = tokio::time::timeout(
        Duration::from_millis(20),
        serial.submit_fn(7, move || r.fetch_add(100, Ordering::SeqCst)),
    )
    .await;
    assert!(dropped.is_err(), "a full queue makes submit wait");

    // A waiter that stays is accepted once the running piece finishes.
    let waiter = tokio::spawn({
        let (serial, r) = (serial.clone(), runs.clone());
        async move {
            serial
                .submit_fn(7, move || r.fetch_add(1, Ordering::SeqCst))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "still waiting for room");
    open.send(()).ok();
    let late = waiter.await.expect("task").expect("accepted");
    running.await.expect("ran");
    queued.await.expect("ran");
    late.await.expect("ran");
    serial.shutdown().await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the dropped submission never ran"
    );
}

/// Dropping a Completion does not cancel the work: it runs, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_completion_still_runs() {
    let serial = SerialExecutor::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    for i in 0..50 {
        let log = log.clone();
        let done = serial
            .submit("k", async move {
                tokio::task::yield_now().await;
                log.lock().expect("log").push(i);
            })
            .await
            .expect("accepted");
        drop(done);
    }
    serial.idle().await;
    assert_eq!(*log.lock().expect("log"), (0..50).collect::<Vec<_>>());
    assert_eq!(serial.active_keys(), 0);
}

/// `idle` waiters on other threads return once the keys drain, whichever
/// thread empties the last shard: no wake-up is lost between a waiter's
/// look at the shards and its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_waiters_wake_when_keys_drain_elsewhere() {
    for _ in 0..50 {
        let serial = SerialExecutor::new();
        let ran = Arc::new(AtomicUsize::new(0));
        for i in 0..200_u32 {
            let ran = ran.clone();
            drop(
                serial
                    .submit(i % 40, async move {
                        for _ in 0..3 {
                            tokio::task::yield_now().await;
                        }
                        ran.fetch_add(1, Ordering::Relaxed);
                    })
                    .await
                    .expect("accepted"),
            );
        }
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let serial = serial.clone();
                tokio::spawn(async move {
                    serial.idle().await;
                    serial.active_keys()
                })
            })
            .collect();
        for waiter in waiters {
            let left = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("idle returned once the keys drained")
                .expect("the waiter did not panic");
            assert_eq!(left, 0);
        }
        assert_eq!(ran.load(Ordering::Relaxed), 200);
    }
}

/// Submitters waiting for room when the executor closes are refused with
/// `Closed` and get their work back; the accepted work still drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_refuses_waiting_submitters() {
    let serial = SerialExecutor::with_options(options(1));
    let (open, wait) = gate();
    let (started_tx, started) = oneshot::channel();
    let running = serial
        .submit(1, async move {
            started_tx.send(()).ok();
            wait.await.ok();
            "first"
        })
        .await
        .expect("room");
    started.await.expect("started");
    let queued = serial.submit(1, async { "second" }).await.expect("room");
    let waiter = tokio::spawn({
        let serial = serial.clone();
        async move { serial.submit(1, async { "third" }).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished());

    serial.close();
    let refused = waiter.await.expect("task").expect_err("closed");
    assert!(refused.error().is_closed());
    assert_eq!(refused.into_work().await, "third");
    assert!(
        serial
            .try_submit_fn(2, || ())
            .expect_err("closed")
            .error()
            .is_closed()
    );

    open.send(()).ok();
    serial.shutdown().await;
    assert_eq!(running.await, Ok("first"));
    assert_eq!(queued.await, Ok("second"));
    assert_eq!(serial.active_keys(), 0);
}

/// A dropped `shutdown` future has still closed the executor, and the
/// accepted work still drains in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_shutdown_still_closes_and_drains() {
    let serial = SerialExecutor::new();
    let (open, wait) = gate();
    let held = serial
        .submit("k", async move {
            wait.await.ok();
            1
        })
        .await
        .expect("accepted");
    let queued = serial.submit_fn("k", || 2).await.expect("accepted");
    let gave_up = tokio::time::timeout(Duration::from_millis(10), serial.shutdown()).await;
    assert!(gave_up.is_err(), "work is still held");
    assert!(serial.is_closed());
    assert!(serial.submit_fn("k", || 3).await.is_err());
    open.send(()).ok();
    assert_eq!(held.await, Ok(1));
    assert_eq!(queued.await, Ok(2));
    serial.idle().await;
    assert_eq!(serial.active_keys(), 0);
}

/// A key whose work is blocked does not hold up other keys, and a key
/// with a long queue of synchronous work lets other keys run between its
/// pieces, even on a current-thread runtime.
#[tokio::test(flavor = "current_thread")]
async fn keys_do_not_wait_for_each_other() {
    let serial = SerialExecutor::new();
    let (open, wait) = gate();
    let blocked = serial
        .submit("blocked", async move {
            wait.await.ok();
        })
        .await
        .expect("accepted");
    assert_eq!(
        serial
            .submit_fn("free", || 5)
            .await
            .expect("accepted")
            .await,
        Ok(5)
    );

    let order = Arc::new(Mutex::new(Vec::new()));
    // An async job first, so the closures below queue behind it on the
    // key's drain task instead of running inline while idle.
    drop(
        serial
            .submit("busy", async { tokio::task::yield_now().await })
            .await,
    );
    for i in 0..1000 {
        let order = order.clone();
        drop(
            serial
                .submit_fn("busy", move || order.lock().expect("order").push(i))
                .await,
        );
    }
    let o = order.clone();
    let other = serial
        .submit(
            "other",
            async move { o.lock().expect("order").push(u32::MAX) },
        )
        .await
        .expect("accepted");
    other.await.expect("ran");
    let position = order
        .lock()
        .expect("order")
        .iter()
        .position(|&i| i == u32::MAX);
    assert!(
        position.is_some_and(|p| p < 100),
        "other key waited for 'busy': {position:?}"
    );
    open.send(()).ok();
    blocked.await.expect("ran");
    serial.shutdown().await;
    assert_eq!(order.lock().expect("order").len(), 1001);
}

/// If the runtime that drains a key shuts down under it, the running and
/// queued work resolve to `Abandoned` (not silence), the key is torn
/// down, and the executor works on another runtime afterwards.
#[test]
fn runtime_shutdown_abandons_loudly_and_leaves_nothing() {
    let serial = SerialExecutor::new();
    let first = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let (_never_opened, wait) = gate();
    let (running, queued) = first.block_on(async {
        let running = serial
            .submit("k", async move {
                wait.await.ok();
            })
            .await
            .expect("accepted");
        tokio::task::yield_now().await; // the drain task starts and blocks
        let queued = serial.submit_fn("k", || 1).await.expect("accepted");
        (running, queued)
    });
    assert_eq!(serial.active_keys(), 1);
    drop(first);
    assert_eq!(serial.active_keys(), 0);

    let second = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    second.block_on(async {
        assert_eq!(running.await, Err(SerialError::Abandoned));
        assert_eq!(queued.await, Err(SerialError::Abandoned));
        assert_eq!(
            serial.submit_fn("k", || 2).await.expect("accepted").await,
            Ok(2)
        );
        serial.shutdown().await;
    });
}

/// Outside a runtime a new key cannot be drained: `NoRuntime`, with the
/// work handed back.
#[test]
fn no_runtime_refuses_and_hands_back() {
    let serial: SerialExecutor<u8> = SerialExecutor::default();
    let refused = serial.try_submit_fn(1, || 10).expect_err("no runtime");
    assert_eq!(refused.error(), &SerialError::NoRuntime);
    assert_eq!((refused.into_work())(), 10);
    let refused = serial.try_submit(1, async { 11 }).expect_err("no runtime");
    let err: SerialError = refused.into();
    assert_eq!(err, SerialError::NoRuntime);
    assert_eq!(serial.active_keys(), 0);
}

/// Polls `f` to its end on this thread, outside any runtime.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// `run` polled outside any runtime, on a key a runtime keeps busy: its
/// work queues for the key's drain task, and its output comes back.
#[test]
fn run_outside_a_runtime_on_a_busy_key_still_runs() {
    let rt = runtime();
    let serial = SerialExecutor::new();
    let (open, gate) = oneshot::channel::<()>();
    let busy = rt
        .block_on(serial.submit(1u8, async move {
            let _ = gate.await;
            1
        }))
        .expect("accepted");
    let (done, ran) = std::sync::mpsc::channel();
    let outside = serial.clone();
    std::thread::spawn(move || {
        let _ = done.send(block_on(outside.run(1u8, async { 2 })));
    });
    std::thread::sleep(Duration::from_millis(50));
    open.send(()).expect("the gate is awaited");
    let ran = ran
        .recv_timeout(Duration::from_secs(10))
        .expect("the run outside the runtime finished");
    assert_eq!(ran, Ok(2));
    assert_eq!(rt.block_on(busy), Ok(1));
}

/// `run` started inside a task and then dropped outside any runtime,
/// mid-work, with work queued behind it: no runtime is left to finish the
/// rest or drain the queue, so both resolve to `Abandoned` and the key is
/// torn down (not left busy forever); and `run` inside a task on another
/// runtime, dropped there, hands the rest of its work to a drain task as
/// usual.
#[test]
fn a_run_dropped_outside_its_runtime_abandons_the_queue_loudly() {
    let rt = runtime();
    let serial = SerialExecutor::new();
    let (_never_opened, wait) = gate();
    let s = serial.clone();
    let (started, queued) = rt.block_on(async {
        tokio::spawn(async move {
            let r = s.clone();
            let mut run = Box::pin(async move {
                r.run("k", async move {
                    wait.await.ok();
                })
                .await
            });
            std::future::poll_fn(|cx| {
                assert!(run.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
            let queued = s.try_submit_fn("k", || 1).expect("queued");
            (run, queued)
        })
        .await
        .expect("the task ran")
    });
    assert_eq!(serial.active_keys(), 1);
    std::thread::spawn(move || drop(started))
        .join()
        .expect("dropped outside the runtime");
    assert_eq!(serial.active_keys(), 0);
    assert_eq!(block_on(queued), Err(SerialError::Abandoned));

    let (open, wait) = gate();
    let s = serial.clone();
    let queued = rt.block_on(async {
        tokio::spawn(async move {
            let mut run = Box::pin(s.run("k", async move {
                wait.await.ok();
                2
            }));
            std::future::poll_fn(|cx| {
                assert!(run.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
            let queued = s.try_submit_fn("k", || 3).expect("queued");
            drop(run);
            open.send(()).expect("the rest of the run awaits the gate");
            queued.await
        })
        .await
        .expect("the task ran")
    });
    assert_eq!(queued, Ok(3));
    rt.block_on(serial.idle());
    assert_eq!(serial.active_keys(), 0);
}

/// A zero capacity is a caller bug, refused loudly.
#[test]
#[should_panic(expected = "queue capacity must be between 1")]
fn zero_capacity_panics() {
    let _ = SerialOptions::default().with_queue_capacity(0);
}

/// The executor, its handles and its errors cross threads; the error is
/// `'static` (boxable as `dyn Error + Send + Sync`).
#[test]
fn types_are_send_and_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<SerialExecutor<String>>();
    send_sync::<Completion<Vec<u8>>>();
    send_sync::<SerialError>();
    send_sync::<calm::partition::Rejected<fn() -> u8>>();
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(SerialError::Closed);
    assert_eq!(
        boxed.to_string(),
        "the executor is closed and accepts no more work"
    );
}

/// A closure for an idle key runs at once, inside the submission; work
/// submitted for the key while it runs (here, from inside it) queues
/// behind it instead of running nested, and the key leaves nothing behind
/// once drained.
#[tokio::test(flavor = "current_thread")]
async fn an_idle_keys_closure_runs_at_once_and_later_work_queues_behind_it() {
    let serial = SerialExecutor::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (inner_serial, inner_log) = (serial.clone(), log.clone());
    let first = serial
        .submit_fn("k", move || {
            let l = inner_log.clone();
            let queued = inner_serial
                .try_submit_fn("k", move || l.lock().expect("log").push(2))
                .expect("queued behind the running closure");
            inner_log.lock().expect("log").push(1);
            queued
        })
        .await
        .expect("accepted");
    // Ran before the submission returned; the nested one waits for a
    // drain task, which this current-thread runtime has not polled yet.
    assert_eq!(*log.lock().expect("log"), vec![1]);
    assert_eq!(serial.active_keys(), 1);
    let queued = first.await.expect("ran");
    queued.await.expect("ran");
    assert_eq!(*log.lock().expect("log"), vec![1, 2]);
    serial.idle().await;
    assert_eq!(serial.active_keys(), 0);
    // Idle again: the next closure runs inline too, and a panic in it is
    // that submission's typed error, with the key still usable.
    let panicked = serial.submit_fn("k", || -> u8 { panic!("boom") }).await;
    assert!(matches!(
        panicked.expect("accepted").await,
        Err(SerialError::Panicked { .. })
    ));
    assert_eq!(serial.active_keys(), 0);
    assert_eq!(
        serial.submit_fn("k", || 7).await.expect("accepted").await,
        Ok(7)
    );
}

/// `run` on an idle key runs the work inside the caller's future (no
/// drain task: the key is busy only while that future runs it); work
/// submitted meanwhile queues behind it; a panic is that run's typed
/// error and the key goes on; a closed executor refuses.
#[tokio::test(flavor = "current_thread")]
async fn run_on_an_idle_key_runs_inline_and_later_work_queues_behind_it() {
    let serial = SerialExecutor::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (inner_serial, inner_log) = (serial.clone(), log.clone());
    let slot = Arc::new(Mutex::new(None));
    let inner_slot = slot.clone();
    serial
        .run("k", async move {
            let l = inner_log.clone();
            let queued = inner_serial
                .try_submit("k", async move { l.lock().expect("log").push(2) })
                .expect("queued behind the running work");
            *inner_slot.lock().expect("slot") = Some(queued);
            tokio::task::yield_now().await;
            inner_log.lock().expect("log").push(1);
        })
        .await
        .expect("ran");
    let queued = slot.lock().expect("slot").take().expect("submitted");
    assert_eq!(*log.lock().expect("log"), vec![1]);
    queued.await.expect("ran");
    assert_eq!(*log.lock().expect("log"), vec![1, 2]);
    serial.idle().await;
    assert_eq!(serial.active_keys(), 0);
    let panicked = serial.run("k", async { panic!("boom") }).await;
    assert!(matches!(
        panicked,
        Err::<(), _>(SerialError::Panicked { .. })
    ));
    assert_eq!(serial.active_keys(), 0);
    assert_eq!(serial.run("k", async { 7 }).await, Ok(7));
    serial.close();
    assert_eq!(serial.run("k", async { 8 }).await, Err(SerialError::Closed));
}

/// A `run` dropped while its work waits mid-way: the rest of the work
/// still runs, before the work queued behind it, and the key is freed.
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_run_finishes_its_work_before_the_queue() {
    let serial = SerialExecutor::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (open, wait) = gate();
    let l = log.clone();
    let mut run = Box::pin(serial.run("k", async move {
        l.lock().expect("log").push("started");
        wait.await.ok();
        l.lock().expect("log").push("finished");
    }));
    std::future::poll_fn(|cx| {
        assert!(run.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
    let l = log.clone();
    let next = serial
        .try_submit("k", async move { l.lock().expect("log").push("next") })
        .expect("queued");
    drop(run);
    assert_eq!(serial.active_keys(), 1);
    open.send(()).ok();
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the rest of the dropped run and the queue drained")
        .expect("ran");
    assert_eq!(*log.lock().expect("log"), ["started", "finished", "next"]);
    serial.idle().await;
    assert_eq!(serial.active_keys(), 0);
}
