//! An account ledger with a single writer per account and no lock
//! anywhere: every deposit and withdrawal for an account goes through the
//! one owner of its partition.
//!
//! In process, a `SerialExecutor` runs each account's operations one at a
//! time, so a read-check-write of the balance needs no mutex. Across
//! processes (three members simulated here, each with its own lease), a
//! `PartitionLog` gives each partition one owner among the live members;
//! one member stops mid-stream and the others take its partitions over.
//!
//! Run with `cargo run --example single_writer`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::time::Duration;

use calm::coord::{Lease, Ownership};
use calm::partition::{Command, PartitionLog, SerialExecutor};
use calm::store::{MemoryStore, Store, TxnOp};

const ACCOUNTS: usize = 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // In process: eight tellers, 500 operations each, on twenty accounts.
    // A withdrawal is refused when it would overdraw: a check-then-act
    // that is only safe because nothing else touches the account meanwhile.
    let balances: Arc<Vec<AtomicI64>> =
        Arc::new((0..ACCOUNTS).map(|_| AtomicI64::new(0)).collect());
    let writer = SerialExecutor::new();
    let mut tellers = Vec::new();
    for teller in 0..8_i64 {
        let (writer, balances) = (writer.clone(), balances.clone());
        tellers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            for i in 0..500_i64 {
                let account = ((teller * 7 + i) % ACCOUNTS as i64) as usize;
                let amount = if i % 3 == 2 { -25 } else { 10 + teller };
                let balances = balances.clone();
                let op = move || {
                    // Load and store, not fetch_add: the executor is the lock.
                    let balance = balances[account].load(Relaxed);
                    if balance + amount < 0 {
                        return 0; // refused: insufficient funds
                    }
                    balances[account].store(balance + amount, Relaxed);
                    amount
                };
                done.push(writer.submit_fn(account, op).await.expect("accepted"));
            }
            let mut applied = Vec::new();
            for d in done {
                applied.push(d.await.expect("ran"));
            }
            applied
        }));
    }
    let (mut total, mut refused) = (0, 0);
    for teller in tellers {
        for amount in teller.await? {
            total += amount;
            refused += usize::from(amount == 0);
        }
    }
    writer.shutdown().await;
    let sum: i64 = balances.iter().map(|b| b.load(Relaxed)).sum();
    assert_eq!(sum, total, "every accepted operation counted once");
    assert!(
        balances.iter().all(|b| b.load(Relaxed) >= 0),
        "never overdrawn"
    );
    println!(
        "in process: 4000 operations on {ACCOUNTS} accounts, {refused} withdrawals refused, total {sum}"
    );

    // Across processes. Each command's effect is one ledger entry of its
    // own, `entries/<account>/<revision>` = the signed amount, written in
    // the command's fenced transaction; a balance is the sum of its
    // account's entries. (A handler that read-modify-wrote a balance key
    // would need the balance read inside the transaction, which a sync
    // handler cannot do; an entry per command is exactly-once by
    // construction, and checkable: one key per command, written once.)
    let store = MemoryStore::new();
    let log = PartitionLog::new(store.clone(), "ledger/log/", 12)?;
    let group = Ownership::new(store.clone(), "ledger/members/")?;
    let mut members = Vec::new();
    for name in ["m0", "m1", "m2"] {
        let (log, group, stop) = (log.clone(), group.clone(), Arc::new(AtomicBool::new(false)));
        let lease = Lease::grant(store.clone(), Duration::from_secs(5)).await?;
        group.join(name, &lease).await?;
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut applied = 0;
            while !flag.load(Relaxed) {
                let view = group.view().await.expect("view");
                let entry = |c: &Command| {
                    let account = String::from_utf8_lossy(&c.key);
                    let key = format!("ledger/entries/{account}/{:020}", c.revision.get());
                    vec![TxnOp::put(key.as_bytes(), &c.payload)]
                };
                applied += log
                    .apply_owned(&view, name, entry)
                    .await
                    .expect("apply")
                    .commands;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            // Leaving: the lease's end removes the member from the group.
            lease.revoke().await.expect("revoke");
            applied
        });
        members.push((name, stop, task));
    }

    // Producers: 600 deposits and withdrawals, appended in two halves;
    // m2 stops between them.
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut applied = 0;
    for n in 0..600_i64 {
        let account = format!("acct-{:02}", n % ACCOUNTS as i64);
        let amount = if n % 4 == 3 { -(n % 50) } else { n % 100 };
        log.append(account.as_bytes(), amount.to_string().as_bytes())
            .await?;
        *expected.entry(account).or_default() += amount;
        if n == 300 {
            let (name, stop, task) = members.pop().expect("three members");
            stop.store(true, Relaxed);
            let count = task.await?;
            applied += count;
            println!("{name} stops (its lease revoked) after applying {count} commands");
        }
        if n % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // Wait until the survivors have drained every partition.
    for p in 0..log.partitions() {
        while !log.pending(p).await?.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    for (name, stop, task) in members {
        stop.store(true, Relaxed);
        let count = task.await?;
        applied += count;
        println!("{name} applied {count} commands");
    }
    assert_eq!(applied, 600, "the members' counts add up to the commands");

    // Exactly once: one entry per command, each written once; balances
    // are the producers' sums.
    let entries = store.range(b"ledger/entries/", None).await?.kvs;
    assert_eq!(entries.len(), 600, "a command was lost or applied twice");
    assert!(entries.iter().all(|kv| kv.writes == 1));
    let mut balances: BTreeMap<String, i64> = BTreeMap::new();
    for kv in &entries {
        let key = String::from_utf8_lossy(&kv.key);
        let account = key.split('/').nth(2).expect("entries/<account>/<revision>");
        *balances.entry(account.to_owned()).or_default() +=
            std::str::from_utf8(&kv.value)?.parse::<i64>()?;
    }
    assert_eq!(balances, expected);
    println!("across members: 600 commands applied exactly once; balances match");
    Ok(())
}
