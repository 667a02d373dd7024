//! The store model under server faults, on every server backend: histories
//! of many concurrent clients stay linearizable while the server is frozen
//! (SIGSTOP) and killed (SIGKILL) mid-run; watchers see every revision
//! exactly once across a restart; an election fails over within 1.5 TTL of
//! its leader process freezing, and the frozen leader's late writes are
//! all refused by the fence.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calm::coord::{CoordError, Election, Lease, StoreFence};
use calm::occ::Version;
use calm::store::{KeySpan, PutOptions, Store, Watch};
use calm::testing::conformance::{check_history, record_history};
use calm::testing::linearizability::KvOutput;
use calm::testing::servers::{Signal, send_signal};

/// What a fault test does to the server.
pub(crate) trait Server: Send + Sized {
    /// Whether this process started the server (an external one, from
    /// `CALM_POSTGRES_URL` or `CALM_ETCD_ENDPOINTS`, cannot be frozen or
    /// killed).
    fn is_ours(&self) -> bool;
    /// Freezes (`Stop`) or resumes (`Cont`) the whole server.
    fn signal(&mut self, signal: Signal);
    /// Kills the server and starts it again on the same data and port.
    fn crash_and_restart(&mut self);
}

/// Implements [`Server`] for one of `calm::testing::servers`' servers.
macro_rules! server {
    ($server:ty) => {
        impl super::Server for $server {
            fn is_ours(&self) -> bool {
                self.process().is_some()
            }

            fn signal(&mut self, signal: Signal) {
                self.process()
                    .expect("a server of ours")
                    .signal_all(signal)
                    .unwrap();
            }

            fn crash_and_restart(&mut self) {
                self.restart().unwrap();
            }
        }
    };
}
use server;

/// A server this process started, or a loud skip (a missing binary
/// without `CALM_REQUIRE_SERVERS=1`, or an external server).
fn own_server<T: Server>(started: Result<T, calm::testing::servers::ServerError>) -> Option<T> {
    let server = calm::testing::servers::skip_or_fail(started)?;
    if !server.is_ours() {
        eprintln!("SKIPPED: an external server cannot be frozen or killed");
        return None;
    }
    Some(server)
}

/// Runs blocking server control off the async workers.
fn control<T: Server>(server: &Mutex<&mut T>, f: impl FnOnce(&mut T)) {
    tokio::task::block_in_place(|| f(&mut **server.lock().unwrap()));
}

/// `clients` clients record a history on 16 keys for about six seconds;
/// one second in, the server is frozen for a second; two seconds later it
/// is killed and restarted. The history must be linearizable (writes whose
/// answer was lost count as either applied or not).
pub(crate) async fn linearizable_under_faults<S, T>(
    store: S,
    prefix: &str,
    clients: usize,
    server: &mut T,
) where
    S: Store + Clone + 'static,
    T: Server,
{
    let keys = (0..16)
        .map(|i| format!("{prefix}lin/{i}").into_bytes())
        .collect();
    let until = Instant::now() + Duration::from_secs(6);
    let recording = tokio::spawn(record_history(
        store.clone(),
        keys,
        clients,
        usize::MAX,
        Some(until),
    ));
    let server = Mutex::new(server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    control(&server, |s| s.signal(Signal::Stop));
    tokio::time::sleep(Duration::from_secs(1)).await;
    control(&server, |s| s.signal(Signal::Cont));
    tokio::time::sleep(Duration::from_secs(1)).await;
    control(&server, |s| s.crash_and_restart());
    let history = recording.await.unwrap().unwrap();
    let unknown = history
        .iter()
        .filter(|o| o.output == KvOutput::Unknown)
        .count();
    eprintln!(
        "{clients} clients: {} operations, {unknown} with unknown outcome",
        history.len(),
    );
    assert!(
        history.len() > clients * 10,
        "too few operations completed: {}",
        history.len()
    );
    check_history(&history).unwrap();
    // The same store handle works after the restart.
    recovers(&store, format!("{prefix}after").as_bytes()).await;
}

/// Asserts that a put through `store` commits within ten seconds of
/// retrying: the same handle works again after the faults.
pub(crate) async fn recovers<S: Store>(store: &S, key: &[u8]) {
    let mut last = None;
    for _ in 0..100 {
        match store.put(key, b"ok", PutOptions::new()).await {
            Ok(_) => return,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no recovery after the faults: {last:?}");
}

/// 16 writers race on their own keys while 4 watchers follow the whole
/// store from revision 1; the server is killed and restarted mid-run. Each
/// watcher must see every revision of the store, exactly once, in order,
/// with every acknowledged write at its revision. A watcher whose stream
/// breaks watches again from the revision after the last it saw.
pub(crate) async fn watchers_see_every_revision<S, T>(store: S, prefix: &str, server: &mut T)
where
    S: Store + Clone + 'static,
    T: Server,
{
    const WRITERS: usize = 16;
    const PER_WRITER: usize = 60;
    let start = store.revision().await.unwrap().next();
    let watchers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            let prefix = prefix.as_bytes().to_vec();
            tokio::spawn(async move {
                let mut seen: Vec<(Version, Vec<u8>, Vec<u8>)> = Vec::new();
                let mut next = start;
                let mut restarts = 0;
                let mut stream = None;
                loop {
                    if stream.is_none() {
                        match store.watch(KeySpan::Prefix(prefix.clone()), next).await {
                            Ok(w) => stream = Some(w),
                            Err(e) if e.is_retryable() => {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                continue;
                            }
                            Err(e) => panic!("watch: {e}"),
                        }
                    }
                    let w = stream.as_mut().unwrap();
                    match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
                        // Quiet for 5 s after the writers finished: done.
                        Err(_) => return (seen, restarts),
                        Ok(Ok(e)) => {
                            next = e.revision().next();
                            seen.push((e.revision(), e.kv.key.clone(), e.kv.value.clone()));
                        }
                        Ok(Err(e)) if e.is_retryable() => {
                            restarts += 1;
                            stream = None;
                        }
                        Ok(Err(e)) => panic!("watch: {e}"),
                    }
                }
            })
        })
        .collect();
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, acked) = (store.clone(), Arc::clone(&acked));
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                let mut i = 0;
                while i < PER_WRITER {
                    let key = format!("{prefix}w{w}/{}", i % 4).into_bytes();
                    let value = format!("{w}:{i}").into_bytes();
                    match store.put(&key, &value, PutOptions::new()).await {
                        Ok(o) => {
                            let revision = o.committed().unwrap();
                            acked.lock().unwrap().insert(revision, (key, value));
                            i += 1;
                        }
                        Err(e) if e.is_retryable() => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("write: {e}"),
                    }
                }
            })
        })
        .collect();
    let server = Mutex::new(server);
    tokio::time::sleep(Duration::from_millis(400)).await;
    control(&server, |s| s.crash_and_restart());
    for w in writers {
        w.await.unwrap();
    }
    let last = loop {
        match store.revision().await {
            Ok(r) => break r,
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("revision: {e}"),
        }
    };
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), WRITERS * PER_WRITER);
    for (n, watcher) in watchers.into_iter().enumerate() {
        let (seen, restarts) = watcher.await.unwrap();
        let revisions: Vec<u64> = seen.iter().map(|(r, _, _)| r.get()).collect();
        let expected: Vec<u64> = (start.get()..=last.get()).collect();
        assert_eq!(
            revisions.len(),
            expected.len(),
            "watcher {n} saw {} events for {} revisions ({restarts} re-watches)",
            revisions.len(),
            expected.len()
        );
        assert_eq!(
            revisions, expected,
            "watcher {n}: a revision missing, repeated or out of order"
        );
        let by_revision: BTreeMap<Version, (Vec<u8>, Vec<u8>)> =
            seen.into_iter().map(|(r, k, v)| (r, (k, v))).collect();
        for (revision, write) in &acked {
            assert_eq!(
                by_revision.get(revision),
                Some(write),
                "watcher {n} at {revision}"
            );
        }
        eprintln!(
            "watcher {n}: {} revisions in order, {restarts} re-watches",
            revisions.len()
        );
    }
}

/// The candidate loop of [`election_failover`]'s child processes: campaign,
/// then write through the fence every 20 ms (printing each outcome with
/// the revision it committed at) until fenced, then campaign again.
pub(crate) async fn candidate_loop<S: Store + Clone + 'static>(
    store: S,
    prefix: &str,
    ttl: Duration,
) {
    let name = std::process::id().to_string();
    let election = Election::new(store.clone(), format!("{prefix}leader/")).unwrap();
    let fence = StoreFence::new(store.clone(), format!("{prefix}fence").into_bytes()).unwrap();
    let data = format!("{prefix}data").into_bytes();
    loop {
        let Ok(lease) = Lease::grant(store.clone(), ttl).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(term) = election.campaign(&lease, name.as_bytes()).await else {
            continue;
        };
        println!("LEADER {}", term.token().get());
        loop {
            match fence.put(term.token(), &data, name.as_bytes()).await {
                Ok(revision) => println!("WROTE {} {}", term.token().get(), revision.get()),
                Err(CoordError::Fenced(f)) => {
                    println!("FENCED {} {}", term.token().get(), f.highest.get());
                    break;
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = term.resign().await;
    }
}

/// A line a candidate printed, with the instant it arrived.
struct Line {
    pid: u32,
    at: Instant,
    text: String,
}

/// Two candidate processes (the test binary run again with
/// `CALM_CANDIDATE` set to `backend|target|prefix|ttl_ms`) campaign on one
/// election. For each pause (in TTLs), `rounds` times: the current leader
/// is frozen with SIGSTOP; the other must make its first fenced write
/// within 1.5 TTL of the stop; the frozen one is resumed after the pause,
/// and none of its writes may commit after the new leader's first one.
/// Returns the failover times, in TTLs.
pub(crate) fn election_failover(
    backend: &str,
    target: &str,
    prefix: &str,
    ttl: Duration,
    pauses: &[u32],
    rounds: usize,
) -> Vec<f64> {
    let exe = std::env::current_exe().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Line>();
    let mut children = Vec::new();
    for _ in 0..2 {
        let mut child = Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                "--nocapture",
                "server_faults::candidate",
            ])
            .env(
                "CALM_CANDIDATE",
                format!("{backend}|{target}|{prefix}|{}", ttl.as_millis()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let stdout = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for text in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(Line {
                    pid,
                    at: Instant::now(),
                    text,
                });
            }
        });
        children.push(child);
    }
    let children = Kill(children);
    let next = |deadline: Instant| -> Line {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("a candidate went quiet")
    };
    let words = |l: &Line| -> Vec<u64> {
        l.text
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    // Wait for a leader's first write.
    let mut leader = loop {
        let l = next(Instant::now() + Duration::from_secs(60));
        if l.text.starts_with("WROTE ") {
            break l.pid;
        }
    };
    let mut failovers = Vec::new();
    for &pause in pauses {
        for round in 0..rounds {
            // Let the leader write for a moment, then freeze it.
            let settle = Instant::now() + ttl / 2;
            while Instant::now() < settle {
                let _ = rx.recv_timeout(settle.saturating_duration_since(Instant::now()));
            }
            send_signal(leader, Signal::Stop).unwrap();
            let stopped = Instant::now();
            // The other candidate's first write.
            let (first, first_revision) = loop {
                let l = next(stopped + ttl * 10);
                if l.pid != leader && l.text.starts_with("WROTE ") {
                    break (l.at, words(&l)[1]);
                }
            };
            let failover = first.duration_since(stopped).as_secs_f64() / ttl.as_secs_f64();
            eprintln!("pause {pause} TTL, round {round}: failover {failover:.2} TTL");
            failovers.push(failover);
            assert!(
                failover <= 1.5,
                "failover took {failover:.2} TTL (pause {pause}, round {round})"
            );
            // Keep the frozen one frozen for the rest of the pause.
            let resume = stopped + ttl * pause;
            while Instant::now() < resume {
                let _ = rx.recv_timeout(resume.saturating_duration_since(Instant::now()));
            }
            let old = leader;
            leader = children
                .0
                .iter()
                .map(|c| c.id())
                .find(|&p| p != old)
                .unwrap();
            send_signal(old, Signal::Cont).unwrap();
            // The resumed one must be fenced, and none of its writes may
            // have committed after the new leader's first.
            loop {
                let l = next(Instant::now() + ttl * 10);
                if l.pid != old {
                    continue;
                }
                if l.text.starts_with("WROTE ") {
                    let revision = words(&l)[1];
                    assert!(
                        revision < first_revision,
                        "a stale leader's write committed at {revision}, after the new leader's first at {first_revision}"
                    );
                }
                if l.text.starts_with("FENCED ") {
                    break;
                }
            }
        }
    }
    drop(children);
    failovers
}

/// Kills child processes when the test ends, however it ends (resuming
/// them first, so a frozen one dies too).
pub(crate) struct Kill(pub(crate) Vec<std::process::Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = send_signal(c.id(), Signal::Cont);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The number of rounds per pause length: `CALM_FAULT_ROUNDS`, default 3.
pub(crate) fn fault_rounds() -> usize {
    std::env::var("CALM_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// The entry point of [`election_failover`]'s child processes (for etcd,
/// `target` is a comma-separated list of endpoints): does
/// nothing unless `CALM_CANDIDATE` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the fault tests' candidate processes"]
async fn candidate() {
    let Some([backend, target, prefix, ttl_ms]) = crate::faults::child_config("CALM_CANDIDATE")
    else {
        return;
    };
    let ttl = Duration::from_millis(ttl_ms.parse().unwrap());
    match backend.as_str() {
        #[cfg(feature = "postgres")]
        "postgres" => {
            use calm::testing::servers::PostgresServer;
            let store =
                <PostgresServer as crate::backends::Backend>::store_at(&target, "election").await;
            candidate_loop(store, &prefix, ttl).await;
        }
        #[cfg(feature = "etcd")]
        "etcd" => {
            use calm::testing::servers::EtcdServer;
            let store =
                <EtcdServer as crate::backends::Backend>::store_at(&target, "election").await;
            candidate_loop(store, &prefix, ttl).await;
        }
        other => panic!("unknown backend {other}"),
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Duration;

    use calm::backend::postgres::PostgresOptions;
    use calm::testing::servers::{PostgresServer, Signal, skip_or_fail};

    super::server!(PostgresServer);

    async fn linearizable(clients: usize) {
        let Some(mut server) = super::own_server(PostgresServer::start()) else {
            return;
        };
        let options = PostgresOptions::new(server.url()).with_schema(format!("lin{clients}"));
        let store = crate::backends::postgres::connect(options).await;
        super::linearizable_under_faults(store, "f/", clients, &mut server).await;
    }

    /// 16 clients: linearizable across a frozen and a killed server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn linearizable_16_clients_under_faults() {
        linearizable(16).await;
    }

    /// 64 clients: linearizable across a frozen and a killed server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn linearizable_64_clients_under_faults() {
        linearizable(64).await;
    }

    /// Every watcher sees every revision once, in order, across a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watchers_see_every_revision() {
        let Some(mut server) = super::own_server(PostgresServer::start()) else {
            return;
        };
        let store = crate::backends::postgres::connect(
            PostgresOptions::new(server.url()).with_schema("watchers"),
        )
        .await;
        super::watchers_see_every_revision(store, "w/", &mut server).await;
    }

    /// Two candidate processes: the frozen leader's successor writes within
    /// 1.5 TTL (TTL 1 s), and the frozen leader is fenced, for pauses of 3
    /// and 8 TTL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn election_fails_over_within_1_5_ttl() {
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        // The candidates' schema is created before they race to create it.
        let _ = crate::backends::postgres::connect(
            PostgresOptions::new(server.url()).with_schema("election"),
        )
        .await;
        let url = server.url().to_string();
        let failovers = tokio::task::spawn_blocking(move || {
            super::election_failover(
                "postgres",
                &url,
                "e/",
                Duration::from_secs(1),
                &[3, 8],
                super::fault_rounds(),
            )
        })
        .await
        .unwrap();
        let worst = failovers.iter().cloned().fold(0.0, f64::max);
        eprintln!("postgres failovers (TTL): {failovers:.2?}, worst {worst:.2}");
        drop(server);
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use calm::testing::servers::{EtcdServer, Signal};

    super::server!(EtcdServer);

    /// 16 clients: linearizable across a frozen and a killed server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn linearizable_16_clients_under_faults() {
        let Some(mut server) = super::own_server(EtcdServer::start()) else {
            return;
        };
        let store = crate::backends::etcd::connect(server.endpoints()).await;
        super::linearizable_under_faults(store, "f16/", 16, &mut server).await;
    }

    /// Every watcher sees every revision once, in order, across a restart
    /// (re-watching from where it was when etcd's stream breaks).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watchers_see_every_revision() {
        let Some(mut server) = super::own_server(EtcdServer::start()) else {
            return;
        };
        let store = crate::backends::etcd::connect(server.endpoints()).await;
        super::watchers_see_every_revision(store, "w/", &mut server).await;
    }
}
