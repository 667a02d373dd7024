//! A service's state as one struct of CRDTs: `#[derive(Merge, DeltaMerge,
//! Codec)]` makes it a state, `codec::Serde` lets a serde type be an
//! element, and `sync::Peer` keeps two replicas in sync by deltas over a
//! channel that loses, repeats and reorders messages.
//!
//! Run with `cargo run --example composite_state`.

use calm::causal::ReplicaId;
use calm::codec::{self, Codec, Serde};
use calm::sync::Peer;
use calm::{DeltaMerge, LwwRegister, Merge, OrSet, PnCounter};
use serde::{Deserialize, Serialize};

/// A cart line: a plain serde type, no calm code needed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: u32,
}

/// The whole cart: every field merges on its own; the struct merges,
/// ships deltas and encodes as one value.
#[derive(Clone, Debug, Default, PartialEq, Merge, DeltaMerge, Codec)]
#[calm(tag = 200)]
struct Cart {
    lines: OrSet<Serde<Line>>,
    total_cents: PnCounter,
    note: LwwRegister<String>,
}

/// One replica: its state and what it knows of the other one.
struct Replica {
    id: ReplicaId,
    cart: Cart,
    other: Peer<Cart>,
}

impl Replica {
    fn new(id: u64) -> Self {
        Self {
            id: ReplicaId::new(id),
            cart: Cart::default(),
            other: Peer::new(),
        }
    }

    fn add(&mut self, sku: &str, quantity: u32, cents: u64) {
        let line = Line {
            sku: sku.into(),
            quantity,
        };
        self.cart.lines.insert(self.id, Serde(line));
        self.cart.total_cents.increment(self.id, cents);
    }

    /// The next message for the other replica, as bytes.
    fn send(&self) -> Vec<u8> {
        self.other.encode_message(&self.cart)
    }

    fn receive(&mut self, bytes: &[u8]) -> Result<(), codec::DecodeError> {
        self.other.receive_bytes(&mut self.cart, bytes)
    }
}

fn main() -> Result<(), calm::Error> {
    let (mut a, mut b) = (Replica::new(1), Replica::new(2));

    // Both work offline.
    a.add("apples", 6, 300);
    a.add("bread", 1, 250);
    for i in 0..40 {
        b.add(&format!("spice #{i}"), 1, 99);
    }
    b.cart.note.set(b.id, "leave at the door".into());

    // The channel loses a's first message, so a's next one carries it too;
    // b's message arrives twice.
    let lost = a.send();
    a.cart.note.set(a.id, "ring twice".into());
    let from_a = a.send();
    let from_b = b.send();
    b.receive(&from_a)?;
    a.receive(&from_b)?;
    a.receive(&from_b)?;
    drop(lost);

    // Once a message from each side has arrived after the last update, the
    // replicas agree. (a's note was written after it heard nothing from b,
    // at Lamport time 1 like b's, so the higher replica id, b, wins.)
    b.receive(&a.send())?;
    assert_eq!(a.cart, b.cart);
    println!(
        "converged: {} lines, {} cents, note {:?}",
        a.cart.lines.len(),
        a.cart.total_cents.value(),
        a.cart.note.get()
    );

    // Now each knows what the other has: a small change is a small message.
    let full = codec::to_bytes(&a.cart).len();
    a.cart.total_cents.decrement(a.id, 50);
    let update = a.send();
    b.receive(&update)?;
    assert_eq!(a.cart, b.cart);
    assert!(update.len() * 10 < full);
    println!(
        "a 50-cent discount travels in {} bytes; the whole cart is {full}",
        update.len()
    );
    Ok(())
}
