//! What calm's store model costs over the raw clients, on real servers:
//! `PostgresStore` against single `tokio-postgres` statements on a plain
//! key-value table, and `EtcdStore` against bare `etcd-client` calls.
//!
//! The raw side is the limit, not an equivalent: a calm write on
//! PostgreSQL also takes the store-wide revision (one row lock, so writers
//! are serialised as etcd's are), reaps expired leases, appends a watch
//! event and sends a `NOTIFY`; a read goes through the connection pool.
//! On etcd the models are the same, so the ratio is calm's own overhead
//! (its key checks and conversions, and a put sent as a transaction that
//! also returns the previous record).
//!
//! The servers are started like the tests start them (`calm::testing::
//! servers`); when a binary is missing the suite says so and skips it.

use std::future::Future;
use std::time::Duration;

use calm::backend::etcd::EtcdStore;
use calm::backend::postgres::{PostgresOptions, PostgresStore};
use calm::occ::Version;
use calm::store::{Expect, PutOptions, Store, WriteOutcome};
use calm::testing::servers::{EtcdServer, PostgresServer};
use tokio::runtime::Runtime;

use crate::harness::{Row, Side, compare, time_row};

/// Keys written and read in turn.
const KEYS: usize = 100;
/// Bytes per value.
const VALUE: usize = 100;

fn key(i: usize) -> Vec<u8> {
    format!("bench/key/{:04}", i % KEYS).into_bytes()
}

/// Retries `connect` while a just-started server warms up.
fn connect<T, F: Future<Output = Result<T, E>>, E: std::fmt::Debug>(
    rt: &Runtime,
    mut connect: impl FnMut() -> F,
) -> T {
    let mut last = None;
    for _ in 0..50 {
        match rt.block_on(connect()) {
            Ok(t) => return t,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("cannot connect: {last:?}");
}

/// Runs every comparison on the servers that can be started.
pub fn run() -> Vec<Row> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let mut rows = Vec::new();
    match PostgresServer::start() {
        Ok(server) => rows.extend(postgres(&rt, &server)),
        Err(e) => eprintln!("backend: SKIPPED PostgreSQL: {e}"),
    }
    match EtcdServer::start() {
        Ok(server) => rows.extend(etcd(&rt, &server)),
        Err(e) => eprintln!("backend: SKIPPED etcd: {e}"),
    }
    for r in &rows {
        eprintln!(
            "{}: {} {} vs {} {}",
            r.workload, r.metric, r.ours, r.peer, r.theirs
        );
    }
    rows
}

/// A put that must commit; returns the key's new version.
async fn put_ok<S: Store>(store: &S, key: &[u8], value: &[u8], expect: Expect) -> Version {
    match store
        .put(key, value, PutOptions::new().with_expect(expect))
        .await
    {
        Ok(WriteOutcome::Committed { revision, .. }) => revision,
        other => panic!("bench put did not commit: {other:?}"),
    }
}

/// calm's `get`, `put` and compare-and-set put against the same three
/// operations as one raw call each.
fn compare_three<S: Store>(
    rt: &Runtime,
    store: &S,
    workload: &str,
    peer: &str,
    mut raw_get: impl FnMut(&[u8]),
    mut raw_put: impl FnMut(&[u8], &[u8]),
    mut raw_cas: impl FnMut(&[u8]),
) -> Vec<Row> {
    let value = vec![7u8; VALUE];
    for i in 0..KEYS {
        rt.block_on(put_ok(store, &key(i), &value, Expect::Any));
        raw_put(&key(i), &value);
    }
    let mut rows = Vec::new();
    let (mut a, mut b) = (0, 0);
    rows.push(time_row(
        workload,
        "get",
        peer,
        compare(
            Side::looped(|| {
                a += 1;
                rt.block_on(store.get(&key(a)))
                    .expect("get")
                    .expect("present")
            }),
            Side::looped(|| {
                b += 1;
                raw_get(&key(b));
            }),
        ),
    ));
    rows.push(time_row(
        workload,
        "put",
        peer,
        compare(
            Side::looped(|| {
                a += 1;
                rt.block_on(put_ok(store, &key(a), &value, Expect::Any))
            }),
            Side::looped(|| {
                b += 1;
                raw_put(&key(b), &value);
            }),
        ),
    ));
    // One key, its version carried from write to write, so every
    // compare-and-set commits.
    let cas_key = b"bench/cas".to_vec();
    let mut version = rt.block_on(put_ok(store, &cas_key, &value, Expect::Any));
    rows.push(time_row(
        workload,
        "compare-and-set put",
        peer,
        compare(
            Side::looped(|| {
                version = rt.block_on(put_ok(store, &cas_key, &value, Expect::Version(version)));
            }),
            Side::looped(|| raw_cas(&value)),
        ),
    ));
    rows
}

fn postgres(rt: &Runtime, server: &PostgresServer) -> Vec<Row> {
    let store = connect(rt, || {
        PostgresStore::connect_with(PostgresOptions::new(server.url()).with_schema("bench"))
    });
    let client = connect(rt, || async {
        let (client, conn) = tokio_postgres::connect(server.url(), tokio_postgres::NoTls).await?;
        rt.spawn(conn);
        Ok::<_, tokio_postgres::Error>(client)
    });
    rt.block_on(client.batch_execute(
        "CREATE TABLE IF NOT EXISTS raw_kv (k bytea PRIMARY KEY, v bytea NOT NULL, version bigint NOT NULL)",
    ))
    .expect("raw table");
    let prepare = |sql: &str| rt.block_on(client.prepare(sql)).expect("prepare");
    let get = prepare("SELECT v FROM raw_kv WHERE k = $1");
    let put = prepare(
        "INSERT INTO raw_kv (k, v, version) VALUES ($1, $2, 1) \
         ON CONFLICT (k) DO UPDATE SET v = excluded.v, version = raw_kv.version + 1",
    );
    let cas =
        prepare("UPDATE raw_kv SET v = $2, version = version + 1 WHERE k = $1 AND version = $3");
    let cas_key: &[u8] = b"bench/cas";
    rt.block_on(client.execute(&put, &[&cas_key, &cas_key]))
        .expect("raw cas key");
    let mut version: i64 = rt
        .block_on(client.query_one("SELECT version FROM raw_kv WHERE k = $1", &[&cas_key]))
        .expect("raw cas version")
        .get(0);
    compare_three(
        rt,
        &store,
        "PostgreSQL, one client, 100 keys, 100-byte values",
        "tokio-postgres, one statement",
        |k| {
            let row = rt.block_on(client.query_one(&get, &[&k])).expect("raw get");
            std::hint::black_box(row.get::<_, Vec<u8>>(0));
        },
        |k, v| {
            rt.block_on(client.execute(&put, &[&k, &v]))
                .expect("raw put");
        },
        |v| {
            let n = rt
                .block_on(client.execute(&cas, &[&cas_key, &v, &version]))
                .expect("raw cas");
            assert_eq!(n, 1, "raw compare-and-set did not apply");
            version += 1;
        },
    )
}

fn etcd(rt: &Runtime, server: &EtcdServer) -> Vec<Row> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let store = connect(rt, || EtcdStore::connect(server.endpoints()));
    let client = connect(rt, || {
        etcd_client::Client::connect(server.endpoints(), None)
    });
    let kv = std::cell::RefCell::new(client.kv_client());
    let raw_cas_key = b"raw/cas".to_vec();
    let put_raw = |k: &[u8], v: &[u8]| -> Result<i64, etcd_client::Error> {
        let resp = rt.block_on(kv.borrow_mut().put(k, v, None))?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    };
    let mut revision = put_raw(&raw_cas_key, b"start").expect("raw cas key");
    compare_three(
        rt,
        &store,
        "etcd, one client, 100 keys, 100-byte values",
        "etcd-client, one call",
        |k| {
            let resp = rt.block_on(kv.borrow_mut().get(k, None)).expect("raw get");
            std::hint::black_box(resp.kvs().len());
        },
        |k, v| {
            put_raw(k, v).expect("raw put");
        },
        |v| {
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    raw_cas_key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(raw_cas_key.clone(), v, None)]);
            let resp = rt.block_on(kv.borrow_mut().txn(txn)).expect("raw cas");
            assert!(resp.succeeded(), "raw compare-and-set did not apply");
            revision = resp.header().map_or(0, |h| h.revision());
        },
    )
}
