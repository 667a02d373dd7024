//! Replacing a `Mutex`-guarded read-modify-write with optimistic
//! concurrency, in process and in a store.
//!
//! The lock version of a transfer is "lock both accounts, check, move,
//! unlock": a slow holder stalls everyone. Here, in process, a
//! `VersionedCell` holds the balances and `update` retries a pure function
//! on conflict; in the store, a transaction moves money only if neither
//! account changed since it was read, and loops on conflict.
//!
//! Run with `cargo run --example bank_transfer`.

use std::collections::BTreeMap;
use std::sync::Arc;

use calm::occ::{RetryPolicy, VersionedCell};
use calm::store::{Compare, CompareOp, MemoryStore, PutOptions, Store, StoreError, Txn, TxnOp};

/// Moves `amount` from `from` to `to` in the store if `from` can pay,
/// retrying on conflict. Returns false if the balance was insufficient.
async fn transfer(
    store: &MemoryStore,
    from: &[u8],
    to: &[u8],
    amount: i64,
) -> Result<bool, StoreError> {
    let policy = RetryPolicy::default();
    let mut attempts = policy.start();
    loop {
        let (a, b) = (store.get(from).await?, store.get(to).await?);
        let (a, b) = (a.expect("account exists"), b.expect("account exists"));
        let (bal_a, bal_b) = (parse(&a.value), parse(&b.value));
        if bal_a < amount {
            return Ok(false);
        }
        let txn = Txn::new()
            .when(Compare::mod_revision(
                from,
                CompareOp::Equal,
                a.mod_revision,
            ))
            .when(Compare::mod_revision(to, CompareOp::Equal, b.mod_revision))
            .then(TxnOp::put(from, (bal_a - amount).to_string().as_bytes()))
            .then(TxnOp::put(to, (bal_b + amount).to_string().as_bytes()));
        if store.txn(txn).await?.succeeded {
            return Ok(true);
        }
        // Someone else moved money meanwhile: back off, read again.
        attempts.retry().await.map_err(StoreError::Contention)?;
    }
}

fn parse(bytes: &[u8]) -> i64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // In process: a VersionedCell instead of Mutex<BTreeMap<..>>.
    let bank = Arc::new(VersionedCell::new(BTreeMap::from([
        ("alice", 100i64),
        ("bob", 100),
    ])));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let bank = Arc::clone(&bank);
            std::thread::spawn(move || {
                let (from, to) = if i % 2 == 0 {
                    ("alice", "bob")
                } else {
                    ("bob", "alice")
                };
                for _ in 0..500 {
                    bank.update(|accounts| {
                        let mut next = accounts.clone();
                        if next[from] >= 1 {
                            *next.get_mut(from).expect("exists") -= 1;
                            *next.get_mut(to).expect("exists") += 1;
                        }
                        next
                    })
                    .expect("within the retry budget");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let snapshot = bank.load();
    let total: i64 = snapshot.value().values().sum();
    assert_eq!(total, 200, "money was created or destroyed");
    println!(
        "in process: {:?} after {} writes, total {total}",
        snapshot.value(),
        snapshot.version().get() - 1
    );

    // In a store: a transaction conditioned on both versions.
    let store = MemoryStore::new();
    let _ = store.put(b"acct/alice", b"100", PutOptions::new()).await?;
    let _ = store.put(b"acct/bob", b"100", PutOptions::new()).await?;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let (from, to): (&[u8], &[u8]) = if i % 2 == 0 {
                    (b"acct/alice", b"acct/bob")
                } else {
                    (b"acct/bob", b"acct/alice")
                };
                let mut moved = 0;
                for _ in 0..200 {
                    if transfer(&store, from, to, 3).await? {
                        moved += 3;
                    }
                    tokio::task::yield_now().await;
                }
                Ok::<_, StoreError>(moved)
            })
        })
        .collect();
    let mut moved = 0;
    for t in tasks {
        moved += t.await??;
    }
    let alice = parse(&store.get(b"acct/alice").await?.expect("exists").value);
    let bob = parse(&store.get(b"acct/bob").await?.expect("exists").value);
    assert_eq!(alice + bob, 200, "money was created or destroyed");
    println!("in the store: alice {alice}, bob {bob}, {moved} moved in all, no lock taken");
    Ok(())
}
