//! The seed scenario, step by step: why a lock needs a fencing token.
//!
//! A gets the lock with token 33 and pauses (a long GC pause, a
//! descheduled VM). Its lease expires. B gets the lock with a higher token
//! and writes. A wakes up, still believing it holds the lock, and writes
//! with token 33: the resource refuses it.
//!
//! Runs on the embedded store with a manual clock, so the "pause" is
//! exact. Run with `cargo run --example fencing`.

use std::sync::Arc;
use std::time::Duration;

use calm::coord::{CoordError, Lease, LeaseOptions, Lock, StoreFence};
use calm::store::{ManualClock, MemoryStore, MemoryStoreOptions, PutOptions, Store};
use calm::testing::faults::InstrumentedStore;

#[tokio::main]
async fn main() -> Result<(), CoordError> {
    let clock = ManualClock::new();
    let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
    let ttl = Duration::from_secs(10);
    let opts = LeaseOptions::new(ttl).with_clock(Arc::new(clock.clone()));
    for i in 0..32u8 {
        // Earlier history of the store: 32 writes.
        let _ = store.put(b"history", &[i], PutOptions::new()).await?;
    }

    // Each client sees the store through its own connection; A's can be
    // frozen, as a paused process is.
    let a_conn = InstrumentedStore::new(store.clone());
    let a_lock = Lock::new(a_conn.clone(), "locks/ledger/")?;
    let a_ledger = StoreFence::new(a_conn.clone(), b"ledger/fence".to_vec())?;
    let a_lease = Lease::grant_with(a_conn.clone(), opts.clone()).await?;
    let a = a_lock.lock(&a_lease).await?;
    println!("1. A acquires the lock: token {}", a.token());

    a_conn.pause();
    println!("2. A pauses (GC, descheduled VM): no renewals, no writes");
    clock.advance(ttl + Duration::from_secs(1));
    println!(
        "3. {} s pass on the store's clock: A's lease expires, its lock key is deleted",
        ttl.as_secs() + 1
    );

    let b_lock = Lock::new(store.clone(), "locks/ledger/")?;
    let b_ledger = StoreFence::new(store.clone(), b"ledger/fence".to_vec())?;
    let b_lease = Lease::grant_with(store.clone(), opts).await?;
    let b = b_lock.lock(&b_lease).await?;
    println!(
        "4. B acquires the lock: token {} (the store deleted A's key at the revision in between)",
        b.token()
    );
    b_ledger.put(b.token(), b"ledger/balance", b"100").await?;
    println!(
        "5. B writes balance = 100 with token {}: accepted",
        b.token()
    );

    a_conn.resume();
    println!("6. A wakes up, still believing it holds the lock, and writes balance = 0");
    match a_ledger.put(a.token(), b"ledger/balance", b"0").await {
        Err(CoordError::Fenced(f)) => {
            println!("7. refused by the resource: {f}");
        }
        other => panic!("the stale write was not fenced: {other:?}"),
    }
    let balance = store.get(b"ledger/balance").await?.map(|kv| kv.value);
    assert_eq!(balance.as_deref(), Some(&b"100"[..]));
    println!(
        "8. balance is still 100; A's lease reports: {:?}",
        a_lease.lost().await
    );
    println!("   (without the fence, A's write would have silently overwritten B's)");
    drop(a);
    b.unlock().await?;
    Ok(())
}
