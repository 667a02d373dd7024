//! Delta sync through `calm::sync::Peer`: two and three replicas over a
//! chaotic network, message sizes, and hostile bytes.

use calm::causal::ReplicaId;
use calm::codec;
use calm::sync::{Message, Peer};
use calm::testing::{Config, chaos};
use calm::{OrMap, PnCounter, Text};

use crate::derive::Cart;

const A: ReplicaId = ReplicaId::new(1);
const B: ReplicaId = ReplicaId::new(2);

/// Two and three replicas with random updates, through a network that
/// loses, repeats and reorders messages, converge once messages flow.
#[test]
fn two_and_three_replicas_converge() {
    for replicas in [2, 3] {
        let cfg = Config::default().with_replicas(replicas);
        chaos::check_sync_convergence::<Cart>(&cfg).unwrap_or_else(|v| panic!("{v}"));
        chaos::check_sync_convergence::<OrMap<u8, PnCounter>>(&cfg)
            .unwrap_or_else(|v| panic!("{v}"));
        chaos::check_sync_convergence::<Text>(&cfg).unwrap_or_else(|v| panic!("{v}"));
    }
}

/// Once the peers know each other, a small change travels as a small
/// message, and a message nobody received is made up by the next one.
#[test]
fn messages_shrink_to_what_changed() -> Result<(), calm::Error> {
    let (mut at_a, mut at_b) = (Cart::default(), Cart::default());
    let (mut b_from_a, mut a_from_b) = (Peer::new(), Peer::new());
    for i in 0..500 {
        at_a.items.insert(A, format!("item {i}"));
    }
    let first = b_from_a.encode_message(&at_a);
    a_from_b.receive_bytes(&mut at_b, &first)?;
    b_from_a.receive_bytes(&mut at_a, &a_from_b.encode_message(&at_b))?;
    assert_eq!(at_a, at_b);

    at_a.total.increment(A, 12);
    let lost = b_from_a.encode_message(&at_a); // never delivered
    at_a.note.set(A, "back door".to_owned());
    let next = b_from_a.encode_message(&at_a);
    assert!(
        next.len() * 50 < first.len(),
        "{} bytes after a small change, {} for the whole cart",
        next.len(),
        first.len()
    );
    assert!(lost.len() <= next.len());
    a_from_b.receive_bytes(&mut at_b, &next)?;
    assert_eq!(at_a, at_b);
    Ok(())
}

/// Every strict prefix of a message and a message of another state type
/// are refused, and a refused message changes nothing.
#[test]
fn hostile_bytes_change_nothing() {
    let mut at_a = Cart::default();
    at_a.items.insert(A, "pears".to_owned());
    at_a.note.set(A, "hi".to_owned());
    let bytes = Peer::new().encode_message(&at_a);

    let mut at_b = Cart::default();
    at_b.total.increment(B, 1);
    let before = at_b.clone();
    let mut peer = Peer::new();
    for cut in 0..bytes.len() {
        assert!(peer.receive_bytes(&mut at_b, &bytes[..cut]).is_err());
    }
    let counter_message = Peer::new().encode_message(&PnCounter::new());
    assert!(peer.receive_bytes(&mut at_b, &counter_message).is_err());
    assert_eq!(at_b, before);
    assert_eq!(peer.known(), Peer::<Cart>::new().known());

    let msg: Message<Cart> = codec::from_bytes(&bytes).expect("well formed");
    peer.receive(&mut at_b, &msg);
    assert!(at_b.items.contains(&"pears".to_owned()));
}
