//! Fault tests against real servers run as child processes: a leader
//! paused with SIGSTOP past its TTL is fenced out when it resumes, and a
//! server killed with SIGKILL and restarted during a stream of
//! transactions loses no acknowledged write and half-applies none, while
//! the client sees typed errors and recovers without being restarted.
//!
//! Also the coordination recipes (fencing, election, lock, idempotency,
//! ownership) on each server.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use calm::coord::{CoordError, Election, Idempotent, Lease, Lock, Ownership, StoreFence};
use calm::store::{Store, StoreError, Txn, TxnOp};
use calm::testing::faults::InstrumentedStore;
use calm::testing::servers::{Signal, send_signal};

/// The recipes, end to end, on any store (with real time).
pub(crate) async fn recipes<S: Store + Clone + 'static>(store: S, prefix: &str, ttl: Duration) {
    let key = |s: &str| format!("{prefix}{s}").into_bytes();

    // Fencing: a paused lock holder is refused after a new holder wrote.
    let a_view = InstrumentedStore::new(store.clone());
    let lock_a = Lock::new(a_view.clone(), key("lock/")).unwrap();
    let lease_a = Lease::grant(a_view.clone(), ttl).await.unwrap();
    let a = lock_a.lock(&lease_a).await.unwrap();
    a_view.pause();
    tokio::time::sleep(ttl * 2 + Duration::from_millis(500)).await;
    let lock_b = Lock::new(store.clone(), key("lock/")).unwrap();
    let lease_b = Lease::grant(store.clone(), ttl).await.unwrap();
    let b = tokio::time::timeout(ttl * 4, lock_b.lock(&lease_b))
        .await
        .expect("B got the lock")
        .unwrap();
    assert!(b.token() > a.token());
    let fence = StoreFence::new(store.clone(), key("fence")).unwrap();
    fence.put(b.token(), &key("data"), b"B").await.unwrap();
    a_view.resume();
    let late = StoreFence::new(a_view.clone(), key("fence"))
        .unwrap()
        .put(a.token(), &key("data"), b"A")
        .await;
    assert!(matches!(late, Err(CoordError::Fenced(_))), "{late:?}");
    assert_eq!(store.get(&key("data")).await.unwrap().unwrap().value, b"B");
    b.unlock().await.unwrap();

    // Election: the second candidate takes over with a higher token.
    let election = Election::new(store.clone(), key("leader/")).unwrap();
    let l1 = Lease::grant(store.clone(), ttl).await.unwrap();
    let t1 = election.campaign(&l1, b"one").await.unwrap();
    let mut observer = election.observe().await.unwrap();
    assert_eq!(observer.next().await.unwrap().unwrap().value, b"one");
    let l2 = Lease::grant(store.clone(), ttl).await.unwrap();
    let e2 = election.clone();
    let waiting = tokio::spawn(async move { e2.campaign(&l2, b"two").await.map(|t| (t, l2)) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    t1.verify().await.unwrap();
    let t1_token = t1.token();
    t1.resign().await.unwrap();
    let (t2, _l2) = tokio::time::timeout(ttl * 4, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(t2.token() > t1_token);
    let seen = tokio::time::timeout(ttl * 4, observer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (seen.value.as_slice(), seen.token),
        (&b"two"[..], t2.token())
    );

    // Idempotent: the second run returns the first outcome.
    let idem = Idempotent::new(store.clone(), key("idem/"), ttl).unwrap();
    let first = idem.run("op-1", |t| async move { t.get() }).await.unwrap();
    let again = idem.run("op-1", |_| async { 0u64 }).await.unwrap();
    assert!(first.ran_here && !again.ran_here);
    assert_eq!(again.value, first.value);

    // Ownership: three members, one leaves, its keys move.
    let group = Ownership::new(store.clone(), key("members/")).unwrap();
    let mut leases = Vec::new();
    let mut members = Vec::new();
    for name in ["m1", "m2", "m3"] {
        let l = Lease::grant(store.clone(), ttl).await.unwrap();
        members.push(group.join(name, &l).await.unwrap());
        leases.push(l);
    }
    let view = group.view().await.unwrap();
    assert_eq!(view.members().len(), 3);
    group.leave(&members[0]).await.unwrap();
    let next = tokio::time::timeout(ttl * 4, group.next_view(&view))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.members().len(), 2);
    assert!(next.token() > view.token());
    for k in 0..200u32 {
        let k = k.to_be_bytes();
        let before = view.owner(&k).unwrap();
        let after = next.owner(&k).unwrap();
        if before.id != "m1" {
            assert_eq!(before.id, after.id, "a key of a remaining member moved");
        }
    }
}

/// What a fault test's child process (this test binary run again) was
/// told: the `N` fields, separated by `|`, of the environment variable
/// `var`, or `None` when it is not set (a normal run: its entry point does
/// nothing). The last field takes the rest.
pub(crate) fn child_config<const N: usize>(var: &str) -> Option<[String; N]> {
    let config = std::env::var(var).ok()?;
    let fields: Vec<String> = config.splitn(N, '|').map(str::to_owned).collect();
    match fields.try_into() {
        Ok(fields) => Some(fields),
        Err(_) => panic!("bad {var} {config}"),
    }
}

/// Runs the leader loop of the SIGSTOP test inside a child process: wins
/// the election, then writes through the fence every 50 ms, printing what
/// happens, until a write is fenced.
pub(crate) async fn child_leader_loop<S: Store + Clone + 'static>(
    store: S,
    prefix: &str,
    ttl: Duration,
) {
    let election = Election::new(store.clone(), format!("{prefix}leader/")).unwrap();
    let fence = StoreFence::new(store.clone(), format!("{prefix}fence").into_bytes()).unwrap();
    let lease = Lease::grant(store.clone(), ttl).await.unwrap();
    let term = election.campaign(&lease, b"child").await.unwrap();
    println!("LEADER {}", term.token().get());
    for i in 0.. {
        match fence
            .put(
                term.token(),
                format!("{prefix}data").as_bytes(),
                format!("child:{i}").as_bytes(),
            )
            .await
        {
            Ok(_) => println!("WROTE {i}"),
            Err(CoordError::Fenced(f)) => {
                println!("FENCED {}", f.highest.get());
                return;
            }
            Err(e) => println!("ERROR {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The entry point of the child process in `sigstop_leader_is_fenced`:
/// does nothing unless `CALM_CHILD_LEADER` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the fault tests' child process"]
async fn child_leader() {
    let Some([backend, target, prefix, ttl_ms]) = child_config("CALM_CHILD_LEADER") else {
        return;
    };
    let ttl = Duration::from_millis(ttl_ms.parse().unwrap());
    match backend.as_str() {
        #[cfg(feature = "postgres")]
        "postgres" => {
            use calm::testing::servers::PostgresServer;
            let store =
                <PostgresServer as crate::backends::Backend>::store_at(&target, "fault").await;
            child_leader_loop(store, &prefix, ttl).await;
        }
        #[cfg(feature = "etcd")]
        "etcd" => {
            use calm::testing::servers::EtcdServer;
            let store = <EtcdServer as crate::backends::Backend>::store_at(&target, "fault").await;
            child_leader_loop(store, &prefix, ttl).await;
        }
        other => panic!("unknown backend {other}"),
    }
}

/// A child process leads, is frozen with SIGSTOP past its TTL; this
/// process takes over and writes; the child, resumed, is fenced out and
/// none of its late writes is visible.
pub(crate) async fn sigstop_leader_is_fenced<S: Store + Clone + 'static>(
    store: S,
    backend: &str,
    target: &str,
    prefix: &str,
    ttl: Duration,
) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "--nocapture",
            "faults::child_leader",
        ])
        .env(
            "CALM_CHILD_LEADER",
            format!("{backend}|{target}|{prefix}|{}", ttl.as_millis()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_for = |prefix: &str, timeout: Duration| -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(_) => panic!("child never printed {prefix}"),
            }
        }
    };
    let leader_line = wait_for("LEADER ", Duration::from_secs(60));
    let child_token: u64 = leader_line["LEADER ".len()..].trim().parse().unwrap();
    wait_for("WROTE ", Duration::from_secs(30));

    let signal = |sig: Signal| send_signal(pid, sig).expect("signal the child");
    signal(Signal::Stop);
    // Past the TTL (plus the server's reaping delay), the child's key is gone.
    tokio::time::sleep(ttl * 2 + Duration::from_millis(500)).await;

    let election = Election::new(store.clone(), format!("{prefix}leader/")).unwrap();
    let lease = Lease::grant(store.clone(), ttl).await.unwrap();
    let term = tokio::time::timeout(ttl * 6, election.campaign(&lease, b"parent"))
        .await
        .expect("took over")
        .unwrap();
    assert!(
        term.token().get() > child_token,
        "{} vs child {child_token}",
        term.token()
    );
    let fence = StoreFence::new(store.clone(), format!("{prefix}fence").into_bytes()).unwrap();
    let data = format!("{prefix}data").into_bytes();
    fence.put(term.token(), &data, b"parent").await.unwrap();

    signal(Signal::Cont);
    let fenced = wait_for("FENCED ", Duration::from_secs(30));
    let highest: u64 = fenced["FENCED ".len()..].trim().parse().unwrap();
    assert_eq!(highest, term.token().get());
    assert_eq!(
        store.get(&data).await.unwrap().unwrap().value,
        b"parent",
        "a late child write is visible"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Streams two-key transactions while the server is killed and
/// restarted; returns after checking that every acknowledged transaction
/// survived whole, no transaction is half applied, errors were typed, and
/// the same client recovered.
pub(crate) async fn txns_survive_a_server_kill<S: Store + Clone + 'static>(
    store: S,
    prefix: &str,
    kill: impl FnOnce(),
    restart: impl FnOnce(),
) {
    const N: u32 = 60;
    let key = |side: &str, i: u32| format!("{prefix}{side}/{i:04}").into_bytes();
    let mut acked = Vec::new();
    let mut errors = Vec::new();
    let mut kill = Some(kill);
    let mut restart = Some(restart);
    let started = Instant::now();
    let mut i = 0;
    while i < N {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the client never recovered"
        );
        if i == N / 3 {
            if let Some(k) = kill.take() {
                k();
                // Let the kill land before the next request.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if errors.len() == 3 {
            if let Some(r) = restart.take() {
                r();
            }
        }
        let txn = Txn::new()
            .then(TxnOp::put(&key("a", i), &i.to_be_bytes()))
            .then(TxnOp::put(&key("b", i), &i.to_be_bytes()));
        match store.txn(txn).await {
            Ok(_) => {
                acked.push(i);
                i += 1;
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        StoreError::Unavailable { .. } | StoreError::Indeterminate { .. }
                    ),
                    "untyped outage error: {e:?}"
                );
                errors.push(e);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert!(
        !errors.is_empty(),
        "the outage produced no error: was the server killed?"
    );
    assert!(restart.is_none(), "the server was never restarted");
    for i in 0..N {
        let a = store.get(&key("a", i)).await.unwrap();
        let b = store.get(&key("b", i)).await.unwrap();
        assert_eq!(a.is_some(), b.is_some(), "transaction {i} half applied");
        if acked.contains(&i) {
            assert!(a.is_some(), "acknowledged transaction {i} lost");
        }
    }
    eprintln!(
        "{} transactions acknowledged, {} typed errors during the outage",
        acked.len(),
        errors.len()
    );
}
