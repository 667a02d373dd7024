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

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use calm::backend::postgres::{PostgresOptions, PostgresStore};
    use calm::testing::conformance::{self, Case, Fixture, TimeControl};
    use calm::testing::servers::{PostgresServer, skip_or_fail};

    /// A fresh schema (a fresh store) per case on one server.
    struct PgFixture {
        url: String,
        tag: String,
        next: AtomicU32,
    }

    impl Fixture for PgFixture {
        type Store = PostgresStore;

        async fn case(&self) -> Case<PostgresStore> {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let options =
                PostgresOptions::new(self.url.clone()).with_schema(format!("{}_{n}", self.tag));
            let store = connect(options).await;
            Case {
                store,
                prefix: b"conformance/".to_vec(),
                time: TimeControl::Real,
                ttl: Duration::from_secs(1),
                ops_per_client: 100,
            }
        }
    }

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

    /// Every conformance check passes on PostgreSQL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let fixture = PgFixture {
            url: server.url().to_owned(),
            tag: format!("conf{}", std::process::id()),
            next: AtomicU32::new(0),
        };
        for (name, check) in conformance::checks::<PostgresStore>() {
            let case = fixture.case().await;
            let started = std::time::Instant::now();
            check(&case).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!("postgres conformance {name}: ok in {:?}", started.elapsed());
        }
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

    /// A watch ends when its store's last handle is dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_ends_with_its_store() {
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let store = connect(PostgresOptions::new(server.url()).with_schema("dropped")).await;
        conformance::watch_ends_with_its_store(store, b"w/")
            .await
            .unwrap();
    }

    /// The partition log's single writer under pauses and crashes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partition_log() {
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let store = connect(PostgresOptions::new(server.url()).with_schema("partitions")).await;
        crate::partition_log::single_writer_under_pauses_and_crashes(
            store,
            "pl/",
            Duration::from_secs(1),
        )
        .await;
    }

    /// Fencing, election, lock, idempotency and ownership on PostgreSQL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn recipes() {
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let store = connect(PostgresOptions::new(server.url()).with_schema("recipes")).await;
        crate::faults::recipes(store, "recipes/", Duration::from_secs(1)).await;
    }

    /// A leader process frozen with SIGSTOP is fenced out on PostgreSQL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigstop_leader_is_fenced() {
        let Some(server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        let store = connect(PostgresOptions::new(server.url()).with_schema("fault")).await;
        crate::faults::sigstop_leader_is_fenced(
            store,
            "postgres",
            server.url(),
            "sigstop/",
            Duration::from_secs(1),
        )
        .await;
    }

    /// Killing and restarting PostgreSQL loses no acknowledged transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn txns_survive_a_server_kill() {
        let Some(mut server) = skip_or_fail(PostgresServer::start()) else {
            return;
        };
        if server.process().is_none() {
            eprintln!("SKIPPED: an external server (CALM_POSTGRES_URL) cannot be killed");
            return;
        }
        let store = connect(PostgresOptions::new(server.url()).with_schema("kill")).await;
        let server = std::sync::Mutex::new(&mut server);
        crate::faults::txns_survive_a_server_kill(
            store.clone(),
            "kill/",
            || server.lock().unwrap().kill(),
            || server.lock().unwrap().restart().unwrap(),
        )
        .await;
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
}

#[cfg(feature = "etcd")]
pub(crate) mod etcd {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use calm::backend::etcd::{EtcdOptions, EtcdStore};
    use calm::store::{PutOptions, Store};
    use calm::testing::conformance::{self, Case, Fixture, TimeControl};
    use calm::testing::servers::{EtcdServer, skip_or_fail};

    /// One server; each case gets its own key prefix.
    struct EtcdFixture {
        store: EtcdStore,
        tag: String,
        next: AtomicU32,
    }

    impl Fixture for EtcdFixture {
        type Store = EtcdStore;

        async fn case(&self) -> Case<EtcdStore> {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            Case {
                store: self.store.clone(),
                prefix: format!("{}/{n}/", self.tag).into_bytes(),
                time: TimeControl::Real,
                // etcd's minimum TTL is about two seconds.
                ttl: Duration::from_secs(2),
                ops_per_client: 100,
            }
        }
    }

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

    /// A watch ends when its store's last handle is dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_ends_with_its_store() {
        let Some(server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        let store = connect(server.endpoints()).await;
        conformance::watch_ends_with_its_store(store, b"w/")
            .await
            .unwrap();
    }

    /// Every conformance check passes on etcd.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let Some(server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        run_conformance(connect(server.endpoints()).await, "etcd").await;
    }

    /// Runs every conformance check on `store`, each case under a prefix
    /// of its own; `what` names the target in the log.
    pub(crate) async fn run_conformance(store: EtcdStore, what: &str) {
        let fixture = EtcdFixture {
            store,
            tag: format!("conf{}", std::process::id()),
            next: AtomicU32::new(0),
        };
        for (name, check) in conformance::checks::<EtcdStore>() {
            let case = fixture.case().await;
            let started = std::time::Instant::now();
            check(&case)
                .await
                .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
            eprintln!("{what} conformance {name}: ok in {:?}", started.elapsed());
        }
    }

    /// The partition log's single writer under pauses and crashes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partition_log() {
        let Some(server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        let store = connect(server.endpoints()).await;
        crate::partition_log::single_writer_under_pauses_and_crashes(
            store,
            "pl/",
            Duration::from_secs(2),
        )
        .await;
    }

    /// Fencing, election, lock, idempotency and ownership on etcd.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn recipes() {
        let Some(server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        let store = connect(server.endpoints()).await;
        crate::faults::recipes(store, "recipes/", Duration::from_secs(2)).await;
    }

    /// A leader process frozen with SIGSTOP is fenced out on etcd.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigstop_leader_is_fenced() {
        let Some(server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        let store = connect(server.endpoints()).await;
        let target = server.endpoints()[0].clone();
        crate::faults::sigstop_leader_is_fenced(
            store,
            "etcd",
            &target,
            "sigstop/",
            Duration::from_secs(2),
        )
        .await;
    }

    /// Killing and restarting etcd loses no acknowledged transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn txns_survive_a_server_kill() {
        let Some(mut server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        if server.process().is_none() {
            eprintln!("SKIPPED: an external server (CALM_ETCD_ENDPOINTS) cannot be killed");
            return;
        }
        let store = connect(server.endpoints()).await;
        let server = std::sync::Mutex::new(&mut server);
        crate::faults::txns_survive_a_server_kill(
            store.clone(),
            "kill/",
            || server.lock().unwrap().kill(),
            || server.lock().unwrap().restart().unwrap(),
        )
        .await;
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
