//! Three candidates run an election; the leader is killed (its process
//! stops, its lease expires), and a waiter takes over with a higher token.
//! Only the waiter next in line wakes up.
//!
//! Real time, short TTL, embedded store. Run with
//! `cargo run --example leader`.

use std::time::{Duration, Instant};

use calm::coord::{CoordError, Election, Lease, StoreFence};
use calm::store::MemoryStore;
use calm::testing::faults::InstrumentedStore;

#[tokio::main]
async fn main() -> Result<(), CoordError> {
    let store = MemoryStore::new();
    let ttl = Duration::from_millis(600);
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut conns = Vec::new();
    for name in ["alpha", "bravo", "charlie"] {
        let conn = InstrumentedStore::new(store.clone());
        conns.push(conn.clone());
        let tx = tx.clone();
        tokio::spawn(async move {
            let election = Election::new(conn.clone(), "demo/leader/")?;
            let fence = StoreFence::new(conn.clone(), b"demo/fence".to_vec())?;
            let lease = Lease::grant(conn.clone(), ttl).await?;
            let term = election.campaign(&lease, name.as_bytes()).await?;
            fence
                .put(term.token(), b"demo/owner", name.as_bytes())
                .await?;
            tx.send((name, term.token(), start.elapsed())).ok();
            // Lead until the lease is lost (this process is "killed" below).
            lease.lost().await;
            Ok::<_, CoordError>(())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (first, token, at) = rx.recv().await.expect("a leader");
    println!("{first} leads with token {token} (at {at:?})");

    // Kill the leader: its process stops dead (no renewals, no resign).
    let leader = ["alpha", "bravo", "charlie"]
        .iter()
        .position(|n| *n == first)
        .expect("known");
    conns[leader].pause();
    let killed = start.elapsed();
    println!("{first} is killed at {killed:?}; its lease ({ttl:?}) must run out first");

    let (next, next_token, at) = rx.recv().await.expect("a new leader");
    assert!(next_token > token, "the new term must have a higher token");
    println!(
        "{next} takes over with token {next_token} at {at:?} ({:?} after the kill)",
        at - killed
    );
    let requests: Vec<u64> = conns.iter().map(|c| c.requests()).collect();
    println!("store requests per candidate so far: {requests:?}");
    Ok(())
}
