//! The quickstart: three replicas of a shopping cart and a page-view
//! counter, updated with no lock and no coordination, synced by deltas over
//! bytes, and converged.
//!
//! Run with `cargo run --example quickstart`.

use calm::causal::ReplicaId;
use calm::{DeltaMerge, Merge, OrMap, OrSet, PnCounter, codec};

fn main() -> Result<(), calm::Error> {
    let replicas = [ReplicaId::new(1), ReplicaId::new(2), ReplicaId::new(3)];
    let mut carts: Vec<OrSet<String>> = vec![OrSet::new(); 3];
    let mut stock: Vec<OrMap<String, PnCounter>> = vec![OrMap::new(); 3];

    // Every replica works offline.
    carts[0].insert(replicas[0], "apples".into());
    carts[0].insert(replicas[0], "bread".into());
    carts[1].insert(replicas[1], "cheese".into());
    carts[2].insert(replicas[2], "apples".into());
    carts[2].remove(&"apples".into()); // removes only the apples replica 3 saw
    for (i, r) in replicas.iter().enumerate() {
        stock[i].update(*r, "apples".into(), |c| c.decrement(*r, 1 + i as u64));
    }

    // Anti-entropy: each replica asks each other one for what it lacks,
    // gets a delta, ships it as bytes, merges it.
    let mut bytes_sent = 0;
    for to in 0..3 {
        for from in 0..3 {
            if from == to {
                continue;
            }
            let wire = codec::to_bytes(&carts[from].delta(&carts[to].version_vector()));
            bytes_sent += wire.len();
            let delta: OrSet<String> = codec::from_bytes(&wire)?;
            carts[to].merge(&delta);

            let wire = codec::to_bytes(&stock[from].delta(&stock[to].version_vector()));
            bytes_sent += wire.len();
            let delta: OrMap<String, PnCounter> = codec::from_bytes(&wire)?;
            stock[to].merge(&delta);
        }
    }

    assert!(carts.iter().all(|c| c == &carts[0]));
    assert!(stock.iter().all(|s| s == &stock[0]));
    let items: Vec<&String> = carts[0].iter().collect();
    // Replica 1's apples were never seen by replica 3's remove: add wins.
    assert_eq!(items, ["apples", "bread", "cheese"]);
    let apples = stock[0].get(&"apples".into()).map(|c| c.value());
    assert_eq!(apples, Some(-6));

    println!("cart on every replica: {items:?}");
    println!("apples stock change on every replica: {apples:?}");
    println!("converged after exchanging {bytes_sent} bytes of deltas");
    Ok(())
}
