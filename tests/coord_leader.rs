//! The leader run-loop on `MemoryStore` with real time: work runs only
//! while leading, is cancelled the moment the term is lost, the loop
//! campaigns again, hands over on shutdown, and rides out store outages.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm::coord::{Election, Exit, LeaderLoop, Leadership, LeaseOptions, Role};
use calm::store::{MemoryStore, Store};
use calm::testing::faults::InstrumentedStore;
use tokio::sync::{oneshot, watch};

const TTL: Duration = Duration::from_millis(1500);

/// What the leaders' work did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Started(&'static str, u64),
    Cancelled(&'static str, u64),
}

type Log = Arc<Mutex<Vec<Event>>>;

/// Records `Cancelled` when the work's future is dropped.
struct OnDrop(Log, &'static str, u64);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap()
            .push(Event::Cancelled(self.1, self.2));
    }
}

/// Starts a loop whose work logs its start, keeps its term in `terms`, and
/// runs until cancelled. Returns the role receiver, the shutdown trigger
/// and the join handle.
fn spawn_leader<S: Store + Clone + Send + Sync + 'static>(
    election: &Election<S>,
    name: &'static str,
    log: &Log,
    terms: &Arc<Mutex<Vec<Leadership<S>>>>,
) -> (
    watch::Receiver<Role>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Exit<()>>,
)
where
    S::Watch: Send,
{
    let leader: LeaderLoop<S> = election.leader_loop(name, LeaseOptions::new(TTL));
    let roles = leader.roles();
    let (stop, stopped) = oneshot::channel::<()>();
    let (log, terms) = (Arc::clone(log), Arc::clone(terms));
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        leader
            .run(shutdown, |term: Leadership<S>| {
                let (log, terms) = (Arc::clone(&log), Arc::clone(&terms));
                async move {
                    let token = term.token().get();
                    log.lock().unwrap().push(Event::Started(name, token));
                    terms.lock().unwrap().push(term);
                    let _guard = OnDrop(Arc::clone(&log), name, token);
                    std::future::pending::<()>().await;
                }
            })
            .await
            .expect("the loop only ends on shutdown")
    });
    (roles, stop, task)
}

/// Waits until the work of a term has started (the role changes just
/// before the work is first polled).
async fn until_started(log: &Log, event: Event) {
    tokio::time::timeout(TTL, async {
        while !log.lock().unwrap().contains(&event) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the term's work starts");
}

async fn until_leading(roles: &mut watch::Receiver<Role>, within: Duration) -> u64 {
    let role = tokio::time::timeout(
        within,
        roles.wait_for(|r| matches!(r, Role::Leading { .. })),
    )
    .await
    .expect("leads in time")
    .expect("loop alive")
    .clone();
    match role {
        Role::Leading { token } => token.get(),
        other => unreachable!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_loop_cancels_lost_work_fails_over_and_hands_over_on_shutdown() {
    let store = MemoryStore::new();
    let election = Election::new(store.clone(), "svc/leader/").unwrap();
    let log: Log = Arc::default();
    let terms = Arc::new(Mutex::new(Vec::new()));

    let (mut a_roles, a_stop, a_task) = spawn_leader(&election, "a", &log, &terms);
    let a1 = until_leading(&mut a_roles, TTL).await;
    until_started(&log, Event::Started("a", a1)).await;
    let (mut b_roles, b_stop, b_task) = spawn_leader(&election, "b", &log, &terms);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(*b_roles.borrow(), Role::Candidate, "one leader at a time");
    let a_term = terms.lock().unwrap()[0].clone();
    assert!(a_term.is_leading());

    // The store ends A's lease behind its back (as an expiry would).
    let leader = election.leader().await.unwrap().expect("a leads");
    let kv = store.get(&leader.key).await.unwrap().expect("leader key");
    store.revoke(kv.lease.expect("leased")).await.unwrap();

    // B takes over; A's work is cancelled (concurrently: nothing orders
    // it before B's start, which is why writes carry tokens) and A
    // campaigns again.
    let b1 = until_leading(&mut b_roles, TTL * 2).await;
    assert!(b1 > a1, "the new term's token is higher");
    until_started(&log, Event::Started("b", b1)).await;
    tokio::time::timeout(TTL, a_roles.wait_for(|r| *r == Role::Candidate))
        .await
        .expect("A campaigns again")
        .unwrap();
    assert!(
        !a_term.is_leading(),
        "the lost term says so without a round trip"
    );
    assert!(
        log.lock().unwrap().contains(&Event::Cancelled("a", a1)),
        "{:?}",
        log.lock().unwrap()
    );

    // B shuts down: it resigns, so A leads well before a TTL passes.
    let handed = Instant::now();
    b_stop.send(()).unwrap();
    assert_eq!(b_task.await.unwrap(), Exit::Shutdown);
    assert_eq!(*b_roles.borrow(), Role::Stopped);
    let a2 = until_leading(&mut a_roles, TTL).await;
    assert!(handed.elapsed() < TTL / 2, "{:?}", handed.elapsed());
    assert!(a2 > b1);
    until_started(&log, Event::Started("a", a2)).await;

    a_stop.send(()).unwrap();
    assert_eq!(a_task.await.unwrap(), Exit::Shutdown);
    assert_eq!(
        election.leader().await.unwrap(),
        None,
        "nothing left in line"
    );
    let log = log.lock().unwrap().clone();
    assert_eq!(log[0], Event::Started("a", a1));
    let mut handover = log[1..3].to_vec();
    handover.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        handover,
        vec![Event::Cancelled("a", a1), Event::Started("b", b1)]
    );
    // A shutdown drops the work before resigning, so the next leader
    // starts after it.
    assert_eq!(
        log[3..],
        [
            Event::Cancelled("b", b1),
            Event::Started("a", a2),
            Event::Cancelled("a", a2),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_loop_work_that_finishes_resigns() {
    let store = MemoryStore::new();
    let election = Election::new(store, "svc/leader/").unwrap();
    let leader = election.leader_loop("a", LeaseOptions::new(TTL));
    let roles = leader.roles();
    let exit = leader
        .run(std::future::pending::<()>(), |term| async move {
            term.verify().await.map(|()| term.token().get())
        })
        .await
        .unwrap();
    assert!(matches!(exit, Exit::Finished(Ok(t)) if t > 0), "{exit:?}");
    assert_eq!(*roles.borrow(), Role::Stopped);
    assert_eq!(
        election.leader().await.unwrap(),
        None,
        "the term was resigned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_loop_rides_out_an_unreachable_store() {
    let store = InstrumentedStore::new(MemoryStore::new());
    let election = Election::new(store.clone(), "svc/leader/").unwrap();
    store.disconnect();
    let log: Log = Arc::default();
    let terms = Arc::new(Mutex::new(Vec::new()));
    let (mut roles, stop, task) = spawn_leader(&election, "a", &log, &terms);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(*roles.borrow(), Role::Candidate);
    assert!(
        store.requests() >= 3,
        "retried while down: {} requests",
        store.requests()
    );
    assert!(log.lock().unwrap().is_empty(), "no work without a term");
    store.reconnect();
    until_leading(&mut roles, TTL).await;
    stop.send(()).unwrap();
    assert_eq!(task.await.unwrap(), Exit::Shutdown);
}

#[tokio::test]
async fn leader_loop_with_a_bad_lease_option_is_an_error() {
    let election = Election::new(MemoryStore::new(), "svc/leader/").unwrap();
    let leader = election.leader_loop("a", LeaseOptions::new(Duration::ZERO));
    let out = leader
        .run(std::future::pending::<()>(), |_term| async {})
        .await;
    assert!(
        matches!(out, Err(calm::coord::CoordError::InvalidTtl { .. })),
        "{out:?}"
    );
}
