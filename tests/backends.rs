//! The conformance suite and the coordination recipes on real PostgreSQL
//! and etcd servers that the tests start themselves (or reach through
//! `CALM_POSTGRES_URL` / `CALM_ETCD_ENDPOINTS`). A missing server binary is
//! a loud skip, or a failure under `CALM_REQUIRE_SERVERS=1`.

/// Calls `connect` until it succeeds (a just-started server warms up).
#[cfg(any(feature = "postgres", feature = "etcd"))]
async fn retry_connect<T, Fut>(mut connect: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Result<T, calm::store::StoreError>>,
{
    let mut last = None;
    for _ in 0..50 {
        match connect().await {
            Ok(t) => return t,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("cannot connect: {last:?}");
}

/// A put under `prefix` commits, reads back, and reaches a watch.
#[cfg(any(feature = "postgres", feature = "etcd"))]
async fn put_is_read_and_watched<S: calm::store::Store>(store: &S, prefix: &[u8]) {
    use calm::store::{KeySpan, PutOptions, Watch};
    let mut watch = store
        .watch(KeySpan::Prefix(prefix.to_vec()), calm::occ::Version::ZERO)
        .await
        .unwrap();
    let key = [prefix, b"k"].concat();
    let written = store
        .put(&key, b"v", PutOptions::new())
        .await
        .unwrap()
        .committed()
        .expect("committed");
    let event = tokio::time::timeout(std::time::Duration::from_secs(5), watch.next())
        .await
        .expect("the event arrives")
        .unwrap();
    assert_eq!(event.kv.mod_revision, written);
    assert_eq!(
        store.get(&key).await.unwrap().map(|kv| kv.value),
        Some(b"v".to_vec())
    );
}

/// Writers on two stores of one backend race on three keys: unconditional
/// puts, compare-and-sets on the version just read, creates, deletes and
/// leased puts. Afterwards the history from the first write on must hold
/// every revision once and in order (no gap: a write that backed out left
/// no hole), each acknowledged write at its revision, and each `prev` it
/// returned must be the key exactly as the history had it just before.
pub(crate) async fn racing_stores_keep_an_exact_history<S>(a: S, b: S, prefix: &str)
where
    S: calm::store::Store + Clone + 'static,
{
    use std::collections::BTreeMap;

    use calm::occ::Version;
    use calm::store::{EventKind, Expect, KeySpan, KeyValue, PutOptions, Watch, WriteOutcome};

    const TASKS: usize = 6;
    const OPS: usize = 120;
    let start = a.revision().await.unwrap();
    let keys: Vec<Vec<u8>> = (0..3)
        .map(|k| format!("{prefix}{k}").into_bytes())
        .collect();
    // Revision -> (key, value written or None for a deletion, prev returned).
    type Acked = BTreeMap<Version, (Vec<u8>, Option<Vec<u8>>, Option<KeyValue>)>;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = if t % 2 == 0 { a.clone() } else { b.clone() };
            let keys = keys.clone();
            tokio::spawn(async move {
                let lease = store
                    .grant(std::time::Duration::from_secs(120))
                    .await
                    .unwrap()
                    .id;
                let mut acked = Acked::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                for i in 0..OPS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = &keys[(x % 3) as usize];
                    let value = format!("{t}:{i}").into_bytes();
                    let (outcome, written) = match (x >> 8) % 10 {
                        0..=3 => {
                            let expect = match store.get(key).await.unwrap() {
                                Some(kv) => Expect::Version(kv.mod_revision),
                                None => Expect::Absent,
                            };
                            let options = PutOptions::new().with_expect(expect);
                            (store.put(key, &value, options).await, Some(value))
                        }
                        4..=6 => (store.put(key, &value, PutOptions::new()).await, Some(value)),
                        7 => (store.delete(key, Expect::Any).await, None),
                        8 => {
                            let options = PutOptions::new().with_expect(Expect::Absent);
                            (store.put(key, &value, options).await, Some(value))
                        }
                        _ => {
                            let options = PutOptions::new().with_lease(lease);
                            (store.put(key, &value, options).await, Some(value))
                        }
                    };
                    match outcome.unwrap() {
                        // A delete of an absent key writes nothing.
                        WriteOutcome::Committed { prev: None, .. } if written.is_none() => {}
                        WriteOutcome::Committed { revision, prev } => {
                            let old = acked.insert(revision, (key.clone(), written, prev));
                            assert!(old.is_none(), "two writes of one task at {revision}");
                        }
                        WriteOutcome::Conflict { .. } => {}
                    }
                }
                acked
            })
        })
        .collect();
    let mut acked = Acked::new();
    for task in tasks {
        for (revision, write) in task.await.unwrap() {
            assert!(
                acked.insert(revision, write).is_none(),
                "two acknowledged writes at {revision}"
            );
        }
    }
    let last = *acked.keys().next_back().expect("some write committed");
    let mut watch = a
        .watch(KeySpan::Prefix(prefix.as_bytes().to_vec()), start.next())
        .await
        .unwrap();
    let mut state: BTreeMap<Vec<u8>, KeyValue> = BTreeMap::new();
    let mut expected = start.next();
    while expected <= last {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
            .await
            .expect("the history arrives")
            .unwrap();
        let revision = event.kv.mod_revision;
        assert_eq!(revision, expected, "a revision missing or out of order");
        expected = revision.next();
        let key = event.kv.key.clone();
        let before = state.get(&key).cloned();
        let (written_key, written, prev) = acked
            .remove(&revision)
            .unwrap_or_else(|| panic!("{revision} was written by nobody"));
        assert_eq!(written_key, key, "the write at {revision}");
        assert_eq!(prev, before, "prev returned by the write at {revision}");
        match event.kind {
            EventKind::Put => {
                assert_eq!(
                    Some(&event.kv.value),
                    written.as_ref(),
                    "value at {revision}"
                );
                let created = before.as_ref().map_or(revision, |kv| kv.create_revision);
                let writes = before.as_ref().map_or(1, |kv| kv.writes + 1);
                assert_eq!(
                    (event.kv.create_revision, event.kv.writes),
                    (created, writes),
                    "counters at {revision}"
                );
                state.insert(key, event.kv);
            }
            EventKind::Delete => {
                assert!(
                    written.is_none(),
                    "a deletion at {revision} nobody asked for"
                );
                state.remove(&key);
            }
        }
    }
    assert!(
        acked.is_empty(),
        "acknowledged but not in the history: {acked:?}"
    );
    for key in &keys {
        assert_eq!(
            a.get(key).await.unwrap(),
            state.get(key).cloned(),
            "final state"
        );
    }
}

/// The history check passes on the in-memory store (it checks the
/// checker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_stores_keep_an_exact_history_in_memory() {
    let store = calm::store::MemoryStore::new();
    racing_stores_keep_an_exact_history(store.clone(), store, "race/").await;
}

/// A server backend the shared suite runs on: how to start its server,
/// open a store on it, and kill it.
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub(crate) trait Backend: Sized + Send + 'static {
    /// Its store.
    type Store: calm::store::Store + Clone + 'static;
    /// Its name, in logs and for the fault tests' child processes.
    const NAME: &'static str;
    /// The lease TTL its tests use (etcd's minimum is about two seconds).
    const TTL: std::time::Duration;
    /// Starts a fresh server (or names an external one).
    fn start() -> Result<Self, calm::testing::servers::ServerError>;
    /// What a client connects with: a URL, or endpoints joined by commas
    /// (as passed to the fault tests' child processes).
    fn target(&self) -> String;
    /// A store at `target` for `namespace` (a schema on PostgreSQL; on
    /// etcd the server's one keyspace, so callers prefix keys with it
    /// too), retrying while a just-started server warms up.
    fn store_at(
        target: &str,
        namespace: &str,
    ) -> impl std::future::Future<Output = Self::Store> + Send;
    /// A store on this server for `namespace`, as [`store_at`](Self::store_at).
    fn store(&self, namespace: &str) -> impl std::future::Future<Output = Self::Store> + Send {
        let (target, namespace) = (self.target(), namespace.to_owned());
        async move { Self::store_at(&target, &namespace).await }
    }
    /// Whether this process started the server (an external one cannot be
    /// killed).
    fn is_ours(&self) -> bool;
    /// Kills the server with SIGKILL.
    fn kill(&mut self);
    /// Starts it again on the same data and port.
    fn restart(&mut self);
}

/// A case per check: a store for a namespace of its own, keys under it.
#[cfg(any(feature = "postgres", feature = "etcd"))]
struct BackendFixture<'a, B> {
    backend: &'a B,
    tag: String,
    next: std::sync::atomic::AtomicU32,
}

#[cfg(any(feature = "postgres", feature = "etcd"))]
impl<B: Backend + Sync> calm::testing::conformance::Fixture for BackendFixture<'_, B> {
    type Store = B::Store;

    async fn case(&self) -> calm::testing::conformance::Case<B::Store> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let namespace = format!("{}_{n}", self.tag);
        calm::testing::conformance::Case {
            store: self.backend.store(&namespace).await,
            prefix: format!("{namespace}/").into_bytes(),
            time: calm::testing::conformance::TimeControl::Real,
            ttl: B::TTL,
            ops_per_client: 100,
        }
    }
}

/// Every conformance check on `backend`, each case in a namespace of its
/// own; `what` names the target in the log.
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub(crate) async fn run_conformance<B: Backend + Sync>(backend: &B, what: &str) {
    use calm::testing::conformance::{self, Fixture};
    let fixture = BackendFixture {
        backend,
        tag: format!("conf{}", std::process::id()),
        next: std::sync::atomic::AtomicU32::new(0),
    };
    for (name, check) in conformance::checks::<B::Store>() {
        let case = fixture.case().await;
        let started = std::time::Instant::now();
        check(&case)
            .await
            .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        eprintln!("{what} conformance {name}: ok in {:?}", started.elapsed());
    }
}

/// The tests every server backend runs, each on a server of its own:
/// `suite!(SomeBackend);` inside the backend's module.
#[cfg(any(feature = "postgres", feature = "etcd"))]
macro_rules! suite {
    ($backend:ty) => {
        /// Every conformance check passes.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn conformance() {
            use crate::backends::Backend;
            let Some(server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            crate::backends::run_conformance(&server, <$backend>::NAME).await;
        }

        /// Two stores' racing writers leave an exact, gapless history.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn racing_stores_keep_an_exact_history() {
            use crate::backends::Backend;
            let Some(server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            let (a, b) = (server.store("race").await, server.store("race").await);
            crate::backends::racing_stores_keep_an_exact_history(a, b, "race/").await;
        }

        /// A watch ends when its store's last handle is dropped.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn watch_ends_with_its_store() {
            use crate::backends::Backend;
            let Some(server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            let store = server.store("dropped").await;
            calm::testing::conformance::watch_ends_with_its_store(store, b"w/")
                .await
                .unwrap();
        }

        /// The partition log's single writer under pauses and crashes.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_log() {
            use crate::backends::Backend;
            let Some(server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            let store = server.store("partitions").await;
            crate::partition_log::single_writer_under_pauses_and_crashes(
                store,
                "pl/",
                <$backend>::TTL,
            )
            .await;
        }

        /// The partition log's single writer with its members as OS
        /// processes, one frozen by SIGSTOP and one killed by SIGKILL.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_log_across_processes() {
            let Some(server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            crate::partition_log::processes::single_writer_across_processes(&server, "plp/").await;
        }

        /// Fencing, election, lock, idempotency and ownership.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn recipes() {
            use crate::backends::Backend;
            let Some(server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            let store = server.store("recipes").await;
            crate::faults::recipes(store, "recipes/", <$backend>::TTL).await;
        }

        /// A leader process frozen with SIGSTOP is fenced out.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sigstop_leader_is_fenced() {
            use crate::backends::Backend;
            let Some(server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            let store = server.store("fault").await;
            crate::faults::sigstop_leader_is_fenced(
                store,
                <$backend>::NAME,
                &server.target(),
                "sigstop/",
                <$backend>::TTL,
            )
            .await;
        }

        /// Killing and restarting the server loses no acknowledged
        /// transaction.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn txns_survive_a_server_kill() {
            use crate::backends::Backend;
            let Some(mut server) = calm::testing::servers::skip_or_fail(<$backend>::start()) else {
                return;
            };
            if !server.is_ours() {
                eprintln!("SKIPPED: an external server cannot be killed");
                return;
            }
            let store = server.store("kill").await;
            let server = std::sync::Mutex::new(&mut server);
            crate::faults::txns_survive_a_server_kill(
                store.clone(),
                "kill/",
                || <$backend as Backend>::kill(&mut server.lock().unwrap()),
                || <$backend as Backend>::restart(&mut server.lock().unwrap()),
            )
            .await;
        }
    };
}
#[cfg(any(feature = "postgres", feature = "etcd"))]
use suite;

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use std::time::Duration;

    use calm::backend::postgres::{PostgresOptions, PostgresStore};
    use calm::testing::conformance::{self, Case, TimeControl};
    use calm::testing::servers::{PostgresServer, ServerError, skip_or_fail};

    impl super::Backend for PostgresServer {
        type Store = PostgresStore;
        const NAME: &'static str = "postgres";
        const TTL: Duration = Duration::from_secs(1);

        fn start() -> Result<Self, ServerError> {
            PostgresServer::start()
        }

        async fn store_at(target: &str, namespace: &str) -> PostgresStore {
            connect(PostgresOptions::new(target).with_schema(namespace)).await
        }

        fn target(&self) -> String {
            self.url().to_owned()
        }

        fn is_ours(&self) -> bool {
            self.process().is_some()
        }

        fn kill(&mut self) {
            PostgresServer::kill(self);
        }

        fn restart(&mut self) {
            PostgresServer::restart(self).unwrap();
        }
    }

    super::suite!(PostgresServer);

    /// Connects, retrying while a just-started server warms up.
    pub(crate) async fn connect(options: PostgresOptions) -> PostgresStore {
        let mut last = None;
        for _ in 0..50 {
            match PostgresStore::connect_with(options.clone()).await {
                Ok(s) => return s,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("cannot connect to PostgreSQL: {last:?}");
    }

    /// Watches `key` on `store` from now: a task that returns the first
    /// event and when it came, once the watch has had 50 ms to set up.
    async fn first_event(
        store: &PostgresStore,
        key: &[u8],
    ) -> tokio::task::JoinHandle<(
        Result<calm::store::WatchEvent, calm::store::StoreError>,
        std::time::Instant,
    )> {
        use calm::store::{KeySpan, Store, Watch};
        let mut watch = store
            .watch(KeySpan::Key(key.to_vec()), calm::occ::Version::ZERO)
            .await
            .unwrap();
        let waiter = tokio::spawn(async move {
            let event = watch.next().await;
            (event, std::time::Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        waiter
    }

    /// A plain SQL session on the server at `url`, its connection driven
    /// by a task of its own.
    async fn sql_client(url: &str) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("a connection");
        tokio::spawn(connection);
        client
    }

    /// A store holds no `LISTEN` session until it has a watch (an open
    /// one costs every notifying write server CPU); its first watch gets
    /// one and is woken by the next commit at once, not by its one-second
    /// poll.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listens_only_while_it_has_a_watch() {
        use calm::store::{PutOptions, Store};
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let store = connect(PostgresOptions::new(server.url()).with_schema("lazy")).await;
        let client = sql_client(server.url()).await;
        let listening = async || -> i64 {
            // The listening session's last statement: its LISTEN, or the
            // announcement to writers that follows it.
            let sql = "SELECT count(*) FROM pg_stat_activity \
                       WHERE query = 'LISTEN calm_lazy' \
                          OR query LIKE 'UPDATE lazy.meta SET listened = %'";
            client
                .query_one(sql, &[])
                .await
                .expect("pg_stat_activity")
                .get(0)
        };
        let first = store.put(b"k", b"0", PutOptions::new()).await.unwrap();
        assert!(first.committed().is_some());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(listening().await, 0, "no watch, no LISTEN");
        for round in 1..=3 {
            // The watch reads, finds nothing new, and waits; then the put.
            let waiter = first_event(&store, b"k").await;
            let value = format!("{round}").into_bytes();
            let sent = std::time::Instant::now();
            let put = store.put(b"k", &value, PutOptions::new()).await.unwrap();
            assert!(put.committed().is_some());
            let (event, arrived) = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the event arrives")
                .unwrap();
            assert_eq!(event.unwrap().kv.value, value);
            let waited = arrived - sent;
            assert!(
                waited < Duration::from_millis(500),
                "woken by NOTIFY, not the poll: {waited:?}"
            );
            assert_eq!(listening().await, 1, "a watch listens");
        }
    }

    /// Writers send `NOTIFY` only while a store listens: a bare `LISTEN`
    /// session that no store announced hears nothing, whichever kind of
    /// write commits; once another store (of another pool) has a watch,
    /// the same writes wake that watch at once, and the bare session hears
    /// each of them too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_notify_only_while_a_store_listens() {
        use calm::store::{Compare, PutOptions, Store, Txn, TxnOp};
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let options = PostgresOptions::new(server.url()).with_schema("heard");
        let writer = connect(options.clone()).await;
        let watcher = connect(options).await;
        let (client, mut connection) = tokio_postgres::connect(server.url(), tokio_postgres::NoTls)
            .await
            .expect("a connection");
        let (heard, mut hearing) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    let _ = heard.send(n.payload().to_owned());
                }
            }
        });
        client.batch_execute("LISTEN calm_heard").await.unwrap();
        // One write of each path: a lone put, a batch of puts, a
        // transaction, a delete.
        let writes = async |round: u8| {
            let key = [b'k', round];
            let put = writer.put(&key, b"v", PutOptions::new()).await;
            assert!(put.unwrap().committed().is_some());
            let (a, b) = ([b'a', round], [b'b', round]);
            let (a, b) = tokio::join!(
                writer.put(&a, b"v", PutOptions::new()),
                writer.put(&b, b"v", PutOptions::new())
            );
            assert!(a.unwrap().committed().is_some() && b.unwrap().committed().is_some());
            let txn = Txn::new()
                .when(Compare::exists(&key))
                .then(TxnOp::put(&key, b"w"));
            assert!(writer.txn(txn).await.unwrap().succeeded);
            let delete = writer.delete(&key, calm::store::Expect::Any).await;
            assert!(delete.unwrap().committed().is_some());
        };
        writes(0).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(hearing.try_recv().is_err(), "nobody announced: no NOTIFY");

        let waiter = first_event(&watcher, b"late").await;
        // The announcement lasts a minute by the database clock.
        let ahead: f64 = client
            .query_one(
                "SELECT extract(epoch FROM listened - clock_timestamp())::float8 \
                 FROM heard.meta",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!((50.0..=60.0).contains(&ahead), "announced {ahead} s ahead");
        writes(1).await;
        let sent = std::time::Instant::now();
        let late = writer.put(b"late", b"v", PutOptions::new()).await.unwrap();
        assert!(late.committed().is_some());
        let (event, arrived) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the event arrives")
            .unwrap();
        assert_eq!(event.unwrap().kv.key, b"late");
        let waited = arrived.saturating_duration_since(sent);
        assert!(
            waited < Duration::from_millis(500),
            "woken by NOTIFY, not the poll: {waited:?}"
        );
        let mut notified = 0;
        while tokio::time::timeout(Duration::from_millis(300), hearing.recv())
            .await
            .is_ok_and(|n| n.is_some())
        {
            notified += 1;
        }
        // The puts of the batch may share one commit.
        assert!(notified >= 4, "every commit notifies: {notified}");
    }

    /// A store whose tables an earlier version made (`meta` with a CHECK
    /// constraint, no `listened` column, the default fillfactor) is brought
    /// to this version by the next store to connect, keeping its keys and
    /// revision; a second connect changes nothing more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migrates_a_schema_of_an_earlier_version() {
        use calm::occ::Version;
        use calm::store::{PutOptions, Store};
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let client = sql_client(server.url()).await;
        client
            .batch_execute(
                "CREATE SCHEMA old;
                 CREATE TABLE old.meta (id smallint PRIMARY KEY CHECK (id = 1),
                                        revision bigint NOT NULL);
                 INSERT INTO old.meta VALUES (1, 7);
                 CREATE TABLE old.kv (key bytea PRIMARY KEY, value bytea NOT NULL,
                     create_revision bigint NOT NULL, mod_revision bigint NOT NULL,
                     writes bigint NOT NULL, lease bigint);
                 INSERT INTO old.kv VALUES ('\\x6b'::bytea, '\\x76'::bytea, 7, 7, 1, NULL);",
            )
            .await
            .unwrap();
        let shape = async || {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM pg_constraint
                             WHERE conrelid = 'old.meta'::regclass AND contype = 'c'),
                            (SELECT reloptions FROM pg_class WHERE oid = 'old.meta'::regclass),
                            (SELECT count(*) FROM pg_attribute WHERE attrelid = 'old.meta'::regclass
                             AND attname = 'listened' AND NOT attisdropped)",
                    &[],
                )
                .await
                .unwrap();
            let options: Option<Vec<String>> = row.get(1);
            (row.get::<_, i64>(0), options, row.get::<_, i64>(2))
        };
        assert_eq!(shape().await, (1, None, 0), "the earlier version's table");
        let options = PostgresOptions::new(server.url()).with_schema("old");
        let mut expected = (b"v".to_vec(), Version::new(7));
        for value in [b"w", b"x"] {
            let store = connect(options.clone()).await;
            let migrated = (0, Some(vec!["fillfactor=10".to_owned()]), 1);
            assert_eq!(shape().await, migrated, "migrated");
            let kv = store.get(b"k").await.unwrap().expect("the key kept");
            assert_eq!((kv.value, kv.mod_revision), expected);
            assert_eq!(store.revision().await.unwrap(), expected.1);
            let put = store.put(b"k", value, PutOptions::new()).await.unwrap();
            let revision = put.committed().expect("a put commits");
            assert_eq!(revision, Version::new(expected.1.get() + 1));
            expected = (value.to_vec(), revision);
        }
        // The single row stays the only one the functions use.
        let rows: i64 = client
            .query_one("SELECT count(*) FROM old.meta", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 1);
    }

    /// A store that starts while a transaction holds write locks on the
    /// keys table (a write in flight) neither waits for it nor makes the
    /// writes after it wait: its migration takes no table lock when the
    /// schema is current.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_starting_store_does_not_wait_for_writes_in_flight() {
        use calm::store::{PutOptions, Store};
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let options = PostgresOptions::new(server.url()).with_schema("busy");
        let first = connect(options.clone()).await;
        let put = first.put(b"k", b"v", PutOptions::new()).await.unwrap();
        assert!(put.committed().is_some());
        let mut client = sql_client(server.url()).await;
        let writing = client.transaction().await.unwrap();
        writing
            .execute(
                "UPDATE busy.kv SET writes = writes WHERE key = '\\x6b'::bytea",
                &[],
            )
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let second = tokio::time::timeout(Duration::from_secs(5), connect(options))
            .await
            .expect("the store starts without waiting for the open transaction");
        let other = second.put(b"other", b"v", PutOptions::new()).await.unwrap();
        assert!(other.committed().is_some());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        writing.rollback().await.unwrap();
        assert_eq!(first.get(b"k").await.unwrap().unwrap().value, b"v");
    }

    /// A store on a pool the user built (`from_pool`) passes every
    /// conformance check, its watches polling instead of listening.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance_on_a_users_pool() {
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let mut config: tokio_postgres::Config = server.url().parse().expect("a URL");
        config.options(calm::backend::postgres::SESSION_OPTIONS);
        let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(4)
            .build()
            .expect("a pool");
        for (n, (name, check)) in conformance::checks::<PostgresStore>()
            .into_iter()
            .enumerate()
        {
            let options = PostgresOptions::new("unused").with_schema(format!("pool{n}"));
            let store = crate::backends::retry_connect(|| {
                PostgresStore::from_pool(pool.clone(), options.clone())
            })
            .await;
            let case = Case {
                store,
                prefix: b"conformance/".to_vec(),
                time: TimeControl::Real,
                ttl: Duration::from_secs(1),
                ops_per_client: 100,
            };
            check(&case).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let bad =
            PostgresStore::from_pool(pool, PostgresOptions::new("unused").with_schema("no-dash"))
                .await;
        assert!(
            matches!(bad, Err(calm::store::StoreError::InvalidEndpoint { .. })),
            "{:?}",
            bad.map(|_| ())
        );
    }

    /// A server whose sessions default to `SERIALIZABLE` (the URL's own
    /// options say so here, as a server's configuration may): calm's
    /// sessions still run at `READ COMMITTED`, so two stores racing on
    /// one key queue for the lock instead of failing with serialization
    /// errors. A user's pool without calm's session options is refused
    /// up front with an error that names them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_serializable_default_isolation_is_overridden() {
        use calm::store::{PutOptions, Store, StoreError};
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let serializable = "-c default_transaction_isolation=serializable";
        let url = format!("{} options='{serializable}'", server.url());
        let a = connect(PostgresOptions::new(&url).with_schema("iso")).await;
        let b = connect(PostgresOptions::new(&url).with_schema("iso")).await;
        let tasks: Vec<_> = [a.clone(), b.clone()]
            .into_iter()
            .cycle()
            .take(8)
            .enumerate()
            .map(|(task, store)| {
                tokio::spawn(async move {
                    for round in 0..25 {
                        let value = format!("{task}/{round}").into_bytes();
                        let put = store.put(b"hot", &value, PutOptions::new()).await?;
                        assert!(put.committed().is_some(), "an unconditional put applies");
                    }
                    Ok::<_, StoreError>(())
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().expect("no serialization failure");
        }
        let kv = a.get(b"hot").await.unwrap().expect("written");
        assert_eq!(kv.writes, 200, "every put applied once");

        let pool_with = |options: &str| {
            let mut config: tokio_postgres::Config = server.url().parse().expect("a URL");
            config.options(options);
            let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
            deadpool_postgres::Pool::builder(manager)
                .max_size(2)
                .build()
                .expect("a pool")
        };
        let options = PostgresOptions::new("unused").with_schema("iso");
        let refused = PostgresStore::from_pool(pool_with(serializable), options.clone()).await;
        match refused {
            Err(StoreError::InvalidEndpoint { source, .. }) => {
                assert!(source.to_string().contains("SESSION_OPTIONS"), "{source}");
            }
            other => panic!("a pool at SERIALIZABLE is refused: {:?}", other.map(|_| ())),
        }
        let both = format!(
            "{serializable} {}",
            calm::backend::postgres::SESSION_OPTIONS
        );
        let store = PostgresStore::from_pool(pool_with(&both), options)
            .await
            .expect("calm's options come last and win");
        assert_eq!(
            store.get(b"hot").await.unwrap().expect("shared").writes,
            200
        );
    }

    /// A server that accepts TLS only: calm connects through
    /// `connect_with_tls` (here with rustls trusting the server's
    /// certificate) for its pool and its LISTEN connection; without TLS it
    /// is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_only_server() {
        let Some(mut server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        if server.process().is_none() {
            eprintln!("SKIPPED tls_only_server: an external server's TLS is its own");
            return;
        }
        let ca = server.require_tls().expect("TLS set up");
        let plain = PostgresStore::connect(&format!("{} sslmode=disable", server.url())).await;
        assert!(
            matches!(
                plain,
                Err(calm::store::StoreError::Unavailable { .. })
                    | Err(calm::store::StoreError::Backend { .. })
            ),
            "a plain connection is refused: {:?}",
            plain.map(|_| ())
        );
        let tls = {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(&ca).expect("PEM"))
                .expect("a root");
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            tokio_postgres_rustls::MakeRustlsConnect::new(config)
        };
        let options =
            PostgresOptions::new(format!("{} sslmode=require", server.url())).with_schema("tls");
        let store = crate::backends::retry_connect(|| {
            PostgresStore::connect_with_tls(options.clone(), tls.clone())
        })
        .await;
        crate::backends::put_is_read_and_watched(&store, b"tls/").await;
    }

    /// A closed pool gives `Closed`; oversized input gives typed errors and
    /// changes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_pool_and_bad_input() {
        use calm::store::{PutOptions, Store, StoreError};
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let store = connect(PostgresOptions::new(server.url()).with_schema("bad")).await;
        let _ = store.put(b"k", b"v", PutOptions::new()).await.unwrap();
        let big = vec![0u8; calm::store::MAX_VALUE_LEN + 1];
        assert!(matches!(
            store.put(b"k", &big, PutOptions::new()).await,
            Err(StoreError::ValueTooLarge { .. })
        ));
        assert_eq!(store.get(b"k").await.unwrap().unwrap().value, b"v");
        store.close();
        assert!(matches!(store.get(b"k").await, Err(StoreError::Closed)));
        assert!(matches!(
            store.put(b"k", b"w", PutOptions::new()).await,
            Err(StoreError::Closed)
        ));
    }

    /// Many concurrent gets (coalesced into shared statements once the
    /// pool is busy) each get their own key's value, absent keys none, and
    /// never a value older than the caller's own completed write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_gets_each_see_their_own_key() {
        use calm::store::{PutOptions, Store};
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let store = connect(PostgresOptions::new(server.url()).with_schema("gets")).await;
        let tasks: Vec<_> = (0..64u32)
            .map(|task| {
                let store = store.clone();
                tokio::spawn(async move {
                    // Tasks share keys in pairs; odd pairs' keys never exist.
                    let key = format!("key-{}", task / 2).into_bytes();
                    let absent = (task / 2) % 2 == 1;
                    for round in 0..20u32 {
                        if absent {
                            assert_eq!(store.get(&key).await.unwrap(), None);
                            continue;
                        }
                        let value = format!("{task}/{round}").into_bytes();
                        let put = store.put(&key, &value, PutOptions::new()).await.unwrap();
                        let written = put.committed().unwrap();
                        let kv = store.get(&key).await.unwrap().unwrap();
                        assert_eq!(kv.key, key);
                        // Only this task and its pair write the key: the
                        // read is this write or the pair's later one.
                        assert!(kv.mod_revision >= written, "a stale read");
                        let text = String::from_utf8(kv.value).unwrap();
                        let writer: u32 = text.split('/').next().unwrap().parse().unwrap();
                        assert_eq!(writer / 2, task / 2, "another key's value");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
}

#[cfg(feature = "etcd")]
pub(crate) mod etcd {
    use std::time::Duration;

    use calm::backend::etcd::{EtcdOptions, EtcdStore};
    use calm::store::{PutOptions, Store};
    use calm::testing::servers::{EtcdServer, ServerError, skip_or_fail};

    impl super::Backend for EtcdServer {
        type Store = EtcdStore;
        const NAME: &'static str = "etcd";
        const TTL: Duration = Duration::from_secs(2);

        fn start() -> Result<Self, ServerError> {
            EtcdServer::start()
        }

        async fn store_at(target: &str, _namespace: &str) -> EtcdStore {
            let endpoints: Vec<String> = target.split(',').map(str::to_owned).collect();
            connect(&endpoints).await
        }

        fn target(&self) -> String {
            self.endpoints().join(",")
        }

        fn is_ours(&self) -> bool {
            self.process().is_some()
        }

        fn kill(&mut self) {
            EtcdServer::kill(self);
        }

        fn restart(&mut self) {
            EtcdServer::restart(self).unwrap();
        }
    }

    super::suite!(EtcdServer);

    /// Connects, retrying while a just-started server warms up.
    pub(crate) async fn connect(endpoints: &[String]) -> EtcdStore {
        let mut last = None;
        for _ in 0..50 {
            match EtcdStore::connect(endpoints).await {
                Ok(s) => match calm::store::Store::revision(&s).await {
                    Ok(_) => return s,
                    Err(e) => last = Some(e),
                },
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("cannot connect to etcd: {last:?}");
    }

    /// An etcd that serves TLS only: calm connects through a tonic channel
    /// configured with the server's certificate (`EtcdStore::from_channel`);
    /// a plain connection is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_only_server() {
        let Some((server, pem)) = skip_or_fail(EtcdServer::start_tls()) else {
            return;
        };
        let endpoint = server.endpoints()[0].clone();
        let plain = EtcdStore::connect(&[endpoint.replace("https://", "http://")]).await;
        assert!(plain.is_err(), "a plain connection was let in");
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&pem));
        let store = crate::backends::retry_connect(|| {
            let channel = tonic::transport::Channel::from_shared(endpoint.clone())
                .expect("an endpoint")
                .tls_config(tls.clone())
                .expect("a TLS config")
                .connect_lazy();
            EtcdStore::from_channel(channel, EtcdOptions::default())
        })
        .await;
        crate::backends::put_is_read_and_watched(&store, b"tls/").await;
    }

    /// An etcd with authentication on: calm signs in with
    /// `EtcdOptions::with_user` and works; without credentials, or with a
    /// wrong password, it is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn auth_enabled_server() {
        let Some(server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        if server.process().is_none() {
            eprintln!("SKIPPED auth_enabled_server: an external server's auth is its own");
            return;
        }
        let ep = server.endpoints()[0].clone();
        // Wait until the server answers, then turn auth on through its
        // JSON gateway: a root role and user, then enable.
        drop(connect(server.endpoints()).await);
        for (path, body) in [
            ("/v3/auth/role/add", r#"{"name":"root"}"#),
            (
                "/v3/auth/user/add",
                r#"{"name":"root","password":"s3cret"}"#,
            ),
            ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
            ("/v3/auth/enable", "{}"),
        ] {
            let reply = calm::testing::servers::etcd_gateway(&ep, path, body).expect("gateway");
            assert!(reply.starts_with("HTTP/1.1 200"), "{path}: {reply}");
        }
        let anonymous = EtcdStore::connect(server.endpoints()).await;
        let refused = match anonymous {
            Err(e) => Some(e),
            Ok(store) => store.put(b"auth/k", b"v", PutOptions::new()).await.err(),
        };
        assert!(refused.is_some(), "an anonymous client was let in");
        let wrong = EtcdStore::connect_with(
            server.endpoints(),
            EtcdOptions::default().with_user("root", "wrong"),
        )
        .await;
        assert!(wrong.is_err(), "a wrong password was let in");
        let store = EtcdStore::connect_with(
            server.endpoints(),
            EtcdOptions::default().with_user("root", "s3cret"),
        )
        .await
        .expect("signed in");
        crate::backends::put_is_read_and_watched(&store, b"auth/").await;
    }
}

#[cfg(feature = "etcd")]
mod etcd_connect {
    use std::time::{Duration, Instant};

    use calm::backend::etcd::{EtcdOptions, EtcdStore};
    use calm::store::StoreError;

    /// Connecting to a port nobody listens on fails with `Unavailable`
    /// within the connect timeout, and its message says so once.
    #[tokio::test]
    async fn unreachable_endpoint_is_unavailable() {
        let options = EtcdOptions::new().with_connect_timeout(Duration::from_millis(500));
        let started = Instant::now();
        let err = EtcdStore::connect_with(&["http://127.0.0.1:1"], options)
            .await
            .expect_err("nothing listens on port 1");
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        assert!(err.is_retryable());
    }

    /// An endpoint that is not a URL, or no endpoint at all, is a
    /// configuration error, not an outage.
    #[tokio::test]
    async fn bad_endpoints_are_invalid() {
        let err = EtcdStore::connect(&["not a url"])
            .await
            .expect_err("not a URL");
        assert!(matches!(err, StoreError::InvalidEndpoint { .. }), "{err:?}");
        let none: [&str; 0] = [];
        let err = EtcdStore::connect(&none).await.expect_err("no endpoints");
        assert!(matches!(err, StoreError::InvalidEndpoint { .. }), "{err:?}");
    }
}
