//! A payment that is retried is applied exactly once.
//!
//! Retries are how clients survive timeouts, and they are how payments get
//! charged twice. Here the client times out and retries while the first
//! attempt is still at the bank, and the message queue redelivers the
//! first request to a third worker at the same time. Every worker runs the
//! payment through `Idempotent` under the payment's id:
//!
//! - the first worker claims the id and calls the bank, passing the
//!   claim's fencing token (the bank checks it, so a worker that lost its
//!   claim while paused could not charge late);
//! - the other two find the claim, wait, and return the recorded receipt
//!   without calling the bank;
//! - a retry after they finished gets the receipt at once.
//!
//! Run with `cargo run --example idempotent`.

use std::sync::Mutex;
use std::time::Duration;

use calm::coord::{Completed, Fence, FencingToken, Idempotent};
use calm::store::MemoryStore;
use serde::{Deserialize, Serialize};

/// What a payment returns, recorded for every repeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    amount_cents: u64,
    bank_reference: u64,
}

/// The external resource: a bank that refuses charges carrying a stale
/// token.
#[derive(Default)]
struct Bank {
    /// The highest token seen for the payment. This example has one
    /// payment; a real resource keeps a fence per payment id (or per
    /// account, as a `StoreFence` in its database).
    fence: Fence,
    /// Charges applied: order and amount.
    charges: Mutex<Vec<(String, u64)>>,
}

impl Bank {
    /// Charges `amount_cents` for `order`, slowly, if `token` is current.
    async fn charge(
        &self,
        token: FencingToken,
        order: &str,
        amount_cents: u64,
    ) -> Result<u64, calm::coord::Fenced> {
        tokio::time::sleep(Duration::from_millis(300)).await; // a slow bank
        self.fence.check(token)?;
        let mut charges = self.charges.lock().unwrap_or_else(|e| e.into_inner());
        charges.push((order.to_owned(), amount_cents));
        Ok(9000 + charges.len() as u64)
    }
}

/// One worker handling one delivery of "pay `order`".
async fn handle(
    worker: u32,
    payments: &Idempotent<MemoryStore>,
    bank: &Bank,
    order: &str,
    amount_cents: u64,
) -> Result<Completed<Option<Receipt>>, calm::coord::CoordError> {
    payments
        .run(order, |token| async move {
            println!("   worker {worker}: claimed {order} with token {token}; calling the bank");
            match bank.charge(token, order, amount_cents).await {
                Ok(bank_reference) => {
                    println!("   worker {worker}: the bank charged {order} (ref {bank_reference})");
                    Some(Receipt {
                        order: order.to_owned(),
                        amount_cents,
                        bank_reference,
                    })
                }
                Err(fenced) => {
                    println!("   worker {worker}: the bank refused a stale charge: {fenced}");
                    None
                }
            }
        })
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::new();
    let payments = Idempotent::new(store.clone(), "payments/", Duration::from_secs(10))?;
    let bank = std::sync::Arc::new(Bank::default());
    let order = "order-17";

    println!("1. the client sends \"pay {order}: 42.00\"; worker 1 takes it");
    let mut first = tokio::spawn({
        let (payments, bank) = (payments.clone(), bank.clone());
        async move { handle(1, &payments, &bank, order, 4200).await }
    });

    let timeout = Duration::from_millis(100);
    let early = tokio::time::timeout(timeout, &mut first).await;
    assert!(
        early.is_err(),
        "the bank is slower than the client's patience"
    );
    println!("2. the client hears nothing for 100 ms, times out and retries: worker 2 takes it");
    let retry = tokio::spawn({
        let (payments, bank) = (payments.clone(), bank.clone());
        async move { handle(2, &payments, &bank, order, 4200).await }
    });
    println!("3. the queue redelivers the first message as well: worker 3 races them");
    let duplicate = tokio::spawn({
        let (payments, bank) = (payments.clone(), bank.clone());
        async move { handle(3, &payments, &bank, order, 4200).await }
    });

    let mut outcomes = Vec::new();
    for (worker, task) in [(1, first), (2, retry), (3, duplicate)] {
        let done = task.await??;
        println!(
            "4. worker {worker} answers with {:?} (ran the payment here: {}, token {})",
            done.value, done.ran_here, done.token
        );
        outcomes.push(done);
    }

    println!("5. a retry after all that gets the recorded receipt at once");
    let later = handle(4, &payments, &bank, order, 4200).await?;
    println!(
        "   worker 4: {:?} (ran here: {})",
        later.value, later.ran_here
    );
    outcomes.push(later);

    let charges = bank
        .charges
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    println!("the bank holds {} charge(s): {charges:?}", charges.len());
    assert_eq!(charges, [(order.to_owned(), 4200)], "charged exactly once");
    assert_eq!(outcomes.iter().filter(|o| o.ran_here).count(), 1);
    assert!(outcomes[0].ran_here, "worker 1 ran it");
    let receipt = outcomes[0].value.clone().expect("the charge went through");
    for o in &outcomes {
        assert_eq!(
            o.value.as_ref(),
            Some(&receipt),
            "everyone got the same receipt"
        );
        assert_eq!(o.token, outcomes[0].token);
    }
    println!("applied exactly once; four answers, one receipt: {receipt:?}");
    Ok(())
}
