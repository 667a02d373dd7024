//! The seed scenario with the resource in your own PostgreSQL tables: the
//! paused holder's `UPDATE accounts` is refused inside its transaction,
//! and the balance it would have overwritten stays.
//!
//! The lock comes from calm's embedded store with a manual clock (so the
//! pause and the tokens 33 and 34 are exact); the fence is a table next to
//! `accounts`, checked in the same transaction as the update: by
//! `PgFence::admit` before B's update, and, for A, by the commit of a
//! transaction opened with `PgFence::begin` (the admission goes with
//! `COMMIT`, no extra round trip). Any calm grant on any backend works
//! the same way.
//!
//! Starts a throwaway PostgreSQL (Debian package `postgresql`), or uses
//! the server at `CALM_POSTGRES_URL`. Run with
//! `cargo run --example fenced_postgres --features postgres`.

use std::sync::Arc;
use std::time::Duration;

use calm::backend::postgres::PgFence;
use calm::coord::{CoordError, Lease, LeaseOptions, Lock};
use calm::store::{ManualClock, MemoryStore, MemoryStoreOptions, PutOptions, Store};
use calm::testing::faults::InstrumentedStore;
use calm::testing::servers::PostgresServer;
use tokio_postgres::NoTls;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = PostgresServer::start()?;
    let (mut db, connection) = tokio_postgres::connect(server.url(), NoTls).await?;
    tokio::spawn(connection);
    let fence = PgFence::new("calm")?;
    fence.migrate(&db).await?;
    db.batch_execute(
        "DROP TABLE IF EXISTS accounts;
         CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts VALUES (1, 100);
         DELETE FROM calm.fences WHERE name = 'accounts';",
    )
    .await?;

    // The lock service: 32 earlier writes, so A's grant is 33 (and B's 35:
    // the expiry of A's lease deletes its key at 34).
    let clock = ManualClock::new();
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
    for i in 0..32u8 {
        let _ = store.put(b"history", &[i], PutOptions::new()).await?;
    }
    let ttl = Duration::from_secs(10);
    let opts = LeaseOptions::new(ttl).with_clock(Arc::new(clock.clone()));
    let a_conn = InstrumentedStore::new(store.clone());
    let a_lease = Lease::grant_with(a_conn.clone(), opts.clone()).await?;
    let a = Lock::new(a_conn.clone(), "locks/accounts/")?
        .lock(&a_lease)
        .await?;
    println!("1. A acquires the lock: token {}", a.token());
    a_conn.pause();
    clock.advance(ttl + Duration::from_secs(1));
    println!("2. A pauses past its lease; the lock service lets it go");

    let b_lease = Lease::grant_with(store.clone(), opts).await?;
    let b = Lock::new(store.clone(), "locks/accounts/")?
        .lock(&b_lease)
        .await?;
    let tx = db.transaction().await?;
    fence.admit(&tx, "accounts", b.token()).await?;
    tx.execute("UPDATE accounts SET balance = 50 WHERE id = 1", &[])
        .await?;
    tx.commit().await?;
    println!(
        "3. B acquires it (token {}; A's expiry took 34) and sets the balance to 50 in PostgreSQL",
        b.token()
    );

    a_conn.resume();
    let tx = fence.begin(&mut db, "accounts", a.token()).await?;
    tx.execute("UPDATE accounts SET balance = 0 WHERE id = 1", &[])
        .await?;
    match tx.commit().await {
        Err(CoordError::Fenced(f)) => println!(
            "4. A wakes, runs UPDATE accounts with token {} and commits: {f}",
            a.token()
        ),
        other => panic!("the stale holder's commit was admitted: {other:?}"),
    }
    let balance: i64 = db
        .query_one("SELECT balance FROM accounts WHERE id = 1", &[])
        .await?
        .get(0);
    assert_eq!(balance, 50, "the stale update landed");
    println!("5. balance is still {balance}: the stale write never reached the table");
    drop(a);
    b.unlock().await?;
    Ok(())
}
