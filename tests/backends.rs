//! The conformance suite and the coordination recipes on real PostgreSQL
//! and etcd servers that the tests start themselves (or reach through
//! `CALM_POSTGRES_URL` / `CALM_ETCD_ENDPOINTS`). A missing server binary is
//! a loud skip, or a failure under `CALM_REQUIRE_SERVERS=1`.

#[cfg(feature = "postgres")]
mod postgres {
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
    pub(super) async fn connect(options: PostgresOptions) -> PostgresStore {
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
}

#[cfg(feature = "etcd")]
mod etcd {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use calm::backend::etcd::EtcdStore;
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
    pub(super) async fn connect(endpoints: &[String]) -> EtcdStore {
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

    /// Every conformance check passes on etcd.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let Some(server) = skip_or_fail(EtcdServer::start()) else {
            return;
        };
        let fixture = EtcdFixture {
            store: connect(server.endpoints()).await,
            tag: format!("conf{}", std::process::id()),
            next: AtomicU32::new(0),
        };
        for (name, check) in conformance::checks::<EtcdStore>() {
            let case = fixture.case().await;
            let started = std::time::Instant::now();
            check(&case).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!("etcd conformance {name}: ok in {:?}", started.elapsed());
        }
    }
}
