//! A counter CRDT kept in a store and updated by many tasks at once with
//! `merge_into`: no lock, no lost update, no conflict seen by the caller.
//!
//! Run with `cargo run --example counter_in_store`.

use calm::PnCounter;
use calm::causal::ReplicaId;
use calm::store::{MemoryStore, StoreExt};

#[tokio::main]
async fn main() -> Result<(), calm::store::StoreError> {
    let store = MemoryStore::new();
    let tasks: Vec<_> = (1..=16u64)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                // Each task is a replica with its own slot; it ships its
                // whole counter, so a retried merge can never double count.
                let me = ReplicaId::new(t);
                let mut mine = PnCounter::new();
                for i in 0..250 {
                    if i % 5 == 4 {
                        mine.decrement(me, 1);
                    } else {
                        mine.increment(me, 1);
                    }
                    store.merge_into(b"stock/apples", &mine).await?;
                }
                Ok::<_, calm::store::StoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task")?;
    }
    let total: PnCounter = store
        .read_merged(b"stock/apples")
        .await?
        .unwrap_or_default();
    // 16 tasks × (200 increments − 50 decrements).
    assert_eq!(total.value(), 16 * 150);
    println!(
        "16 tasks × 250 updates merged into one key: value {}",
        total.value()
    );
    Ok(())
}
