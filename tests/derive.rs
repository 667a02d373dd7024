//! `#[derive(Merge, DeltaMerge, Codec)]` on structs of states: the types
//! the law harness checks (listed in `laws.rs` like every built-in type),
//! and what the derives generate beyond the laws: per-field deltas, the
//! tagged header, nested summaries past twelve fields.

use calm::causal::ReplicaId;
use calm::codec::{self, Codec, DecodeError, Tagged};
use calm::testing::{MapOp, RandomOps, SetOp};
use calm::{DeltaMerge, GCounter, LwwRegister, Merge, MvRegister, OrMap, OrSet, PnCounter};
use proptest::prelude::*;

/// The cart of the issue: a set of items, a running total and a note.
#[derive(Clone, Debug, Default, PartialEq, Merge, DeltaMerge, Codec)]
#[calm(tag = 200)]
pub struct Cart {
    /// What is in the cart.
    pub items: OrSet<String>,
    /// The total, in cents.
    pub total: PnCounter,
    /// A note for the courier; the latest write wins.
    pub note: LwwRegister<String>,
}

/// One random update of a [`Cart`].
#[derive(Clone, Debug)]
pub enum CartOp {
    /// An update of the item set.
    Items(SetOp<String>),
    /// `(add?, cents)` to the total.
    Total(bool, u8),
    /// A new note.
    Note(String),
}

/// Short names from a small alphabet, so replicas touch the same items.
fn name() -> impl Strategy<Value = String> {
    "[a-d]{1,2}"
}

impl RandomOps for Cart {
    type Op = CartOp;
    fn op_strategy() -> BoxedStrategy<CartOp> {
        prop_oneof![
            3 => name().prop_map(|n| CartOp::Items(SetOp::Insert(n))),
            2 => name().prop_map(|n| CartOp::Items(SetOp::Remove(n))),
            2 => any::<(bool, u8)>().prop_map(|(up, by)| CartOp::Total(up, by)),
            1 => name().prop_map(CartOp::Note),
        ]
        .boxed()
    }
    fn apply(&mut self, replica: ReplicaId, op: &CartOp) {
        match op {
            CartOp::Items(op) => self.items.apply(replica, op),
            CartOp::Total(up, by) => self.total.apply(replica, &(*up, *by)),
            CartOp::Note(n) => self.note.apply(replica, n),
        }
    }
}

/// A generic tuple struct with an optional field: per-key tallies, and a
/// counter that exists only once someone starts it.
#[derive(Clone, Debug, PartialEq, Merge, DeltaMerge, Codec)]
#[calm(tag = 201)]
pub struct Tally<K: Ord + Clone>(pub OrMap<K, PnCounter>, pub Option<GCounter>);

/// Empty, for any key type (`derive(Default)` would ask `K: Default`).
impl<K: Ord + Clone> Default for Tally<K> {
    fn default() -> Self {
        Self(OrMap::new(), None)
    }
}

impl<K: Arbitrary + Ord + Clone + std::fmt::Debug + 'static> RandomOps for Tally<K> {
    /// An update of either field or of both, as for a pair.
    type Op = (Option<MapOp<K, (bool, u8)>>, Option<u8>);
    fn op_strategy() -> BoxedStrategy<Self::Op> {
        <(OrMap<K, PnCounter>, Option<GCounter>)>::op_strategy()
    }
    fn apply(&mut self, replica: ReplicaId, (tallies, started): &Self::Op) {
        if let Some(op) = tallies {
            self.0.apply(replica, op);
        }
        if let Some(op) = started {
            self.1.apply(replica, op);
        }
    }
}

/// Fourteen fields: the summary nests (twelve and two), and still every
/// field gets exactly its own delta.
#[derive(Clone, Debug, Default, PartialEq, Merge, DeltaMerge, Codec)]
#[calm(tag = 202)]
struct Wide {
    f0: GCounter,
    f1: GCounter,
    f2: GCounter,
    f3: GCounter,
    f4: GCounter,
    f5: GCounter,
    f6: GCounter,
    f7: GCounter,
    f8: GCounter,
    f9: GCounter,
    f10: GCounter,
    f11: GCounter,
    f12: OrSet<u32>,
    f13: MvRegister<u8>,
}

const A: ReplicaId = ReplicaId::new(1);
const B: ReplicaId = ReplicaId::new(2);

/// Only the field that changed travels, and a field whose replica counts
/// lag another's still gets what it lacks.
#[test]
fn delta_carries_only_the_changed_field() {
    let mut x = Cart::default();
    for i in 0..200 {
        x.items.insert(A, format!("item {i}"));
    }
    x.total.increment(A, 1_000);
    let mut y = x.clone();
    y.note.set(B, "ring twice".to_owned());
    y.total.decrement(B, 5);

    let delta = y.delta(&x.version_vector());
    assert!(delta.items.is_empty());
    let (full, small) = (codec::to_bytes(&y).len(), codec::to_bytes(&delta).len());
    assert!(small * 20 < full, "delta {small} bytes vs state {full}");
    x.merge(&delta);
    assert_eq!(x, y);
    assert_eq!(x.total.value(), 995);
    assert_eq!(x.note.get(), "ring twice");
}

/// The summary is one version vector per field, in field order.
#[test]
fn summary_is_per_field() {
    let mut cart = Cart::default();
    cart.total.increment(A, 7);
    let (items, total, note) = cart.version_vector();
    assert!(items.is_empty() && note.is_empty());
    assert_eq!(total.get(A), 7);
}

/// Bytes carry calm's header with the struct's own tag; another type's
/// bytes, a truncation and trailing bytes are typed errors.
#[test]
fn codec_header_and_errors() -> Result<(), DecodeError> {
    let mut cart = Cart::default();
    cart.items.insert(A, "pears".to_owned());
    cart.note.set(A, "hi".to_owned());
    let bytes = codec::to_bytes(&cart);
    assert_eq!(bytes[..2], [codec::FORMAT_VERSION, Cart::TAG]);
    assert_eq!(codec::from_bytes::<Cart>(&bytes)?, cart);

    let tally = Tally::<u8>::default();
    let err = codec::from_bytes::<Cart>(&codec::to_bytes(&tally)).unwrap_err();
    assert_eq!(
        err,
        DecodeError::WrongType {
            expected: 200,
            found: 201
        }
    );
    assert!(matches!(
        codec::from_bytes::<Cart>(&bytes[..bytes.len() - 1]),
        Err(DecodeError::Truncated { .. } | DecodeError::LengthOverflow { .. })
    ));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        codec::from_bytes::<Cart>(&longer),
        Err(DecodeError::TrailingBytes { count: 1, .. })
    ));
    Ok(())
}

/// A derived struct without a tag is an element: it encodes inside
/// collections with no header of its own.
#[test]
fn untagged_struct_is_an_element() -> Result<(), DecodeError> {
    #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Codec)]
    struct Line {
        sku: u32,
        label: String,
    }
    let mut set = OrSet::new();
    set.insert(
        A,
        Line {
            sku: 7,
            label: "tea".to_owned(),
        },
    );
    let back: OrSet<Line> = codec::from_bytes(&codec::to_bytes(&set))?;
    assert_eq!(back, set);
    Ok(())
}

/// Past twelve fields the summary nests, and deltas stay exact per field.
#[test]
fn wide_struct_nests_its_summary() -> Result<(), DecodeError> {
    let mut x = Wide::default();
    x.f11.increment(A, 100);
    x.f13.set(A, 1);
    let mut y = x.clone();
    y.f12.insert(A, 1);
    y.f12.insert(A, 2);
    y.f13.set(B, 2);

    let summary = x.version_vector();
    assert_eq!(summary.0.11.get(A), 100);
    let delta = y.delta(&summary);
    assert_eq!(delta.f12.len(), 2);
    assert_eq!(delta.f11, GCounter::new());
    x.merge(&delta);
    assert_eq!(x.f13.values().collect::<Vec<_>>(), [&2]);
    assert_eq!(x, y);
    assert_eq!(codec::from_bytes::<Wide>(&codec::to_bytes(&x))?, x);
    Ok(())
}

/// A derived struct nests in calm's own types like any state.
#[test]
fn derived_states_nest() {
    let mut carts: OrMap<u32, Cart> = OrMap::new();
    carts.update(A, 1, |c| c.total.increment(A, 3));
    let mut other = carts.clone();
    other.update(B, 1, |c| {
        c.items.insert(B, "plums".to_owned());
    });
    carts.update(A, 1, |c| c.total.increment(A, 4));
    carts.merge(&other);
    let cart = carts.get(&1).expect("merged");
    assert_eq!(cart.total.value(), 7);
    assert!(cart.items.contains(&"plums".to_owned()));
}
