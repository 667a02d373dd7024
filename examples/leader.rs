//! Three candidates run an election; the leader is killed (its process
//! stops, its lease expires), and a waiter takes over with a higher token.
//! Only the waiter next in line wakes up.
//!
//! Real time, short TTL, embedded store. Run with
//! `cargo run --example leader`.

use std::time::{Duration, Instant};

use calm::coord::{CoordError, Election, LeaseOptions, StoreFence};
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
        let election = Election::new(conn.clone(), "demo/leader/")?;
        let fence = StoreFence::new(conn.clone(), b"demo/fence".to_vec())?;
        let tx = tx.clone();
        // The run-loop: campaign, run the work while the term lasts,
        // cancel it when the term ends, campaign again.
        let leader = election.leader_loop(name, LeaseOptions::new(ttl));
        tokio::spawn(leader.run(std::future::pending::<()>(), move |term| {
            let (fence, tx) = (fence.clone(), tx.clone());
            async move {
                // Every write of the leader carries its term's token.
                fence
                    .put(term.token(), b"demo/owner", name.as_bytes())
                    .await?;
                tx.send((name, term.token(), start.elapsed())).ok();
                std::future::pending::<Result<(), CoordError>>().await
            }
        }));
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
