//! [`RandomOps`] for calm's own types, so the harness checks them and so
//! your own composite types (an `OrMap` of your type, say) can reuse them.

use std::fmt::Debug;

use proptest::prelude::*;

use super::RandomOps;
use crate::causal::ReplicaId;
use crate::occ::Versioned;
use crate::{
    GCounter, GSet, LwwRegister, Merge, MvRegister, OrMap, OrSet, PnCounter, Text, TwoPhaseSet,
};

/// A random update of a set.
#[derive(Clone, Debug)]
pub enum SetOp<T> {
    /// Insert an element.
    Insert(T),
    /// Remove an element.
    Remove(T),
    /// Remove every element (where the type supports it).
    Clear,
}

/// A random update of a map.
#[derive(Clone, Debug)]
pub enum MapOp<K, Op> {
    /// Update a key's value with the value type's own update.
    Update(K, Op),
    /// Set a key to the default value with one update applied.
    Insert(K, Op),
    /// Remove a key.
    Remove(K),
}

/// A random local edit of a [`Text`].
///
/// Positions are taken modulo the text's length (plus one for an insert),
/// so every edit applies to any state.
#[derive(Clone, Debug)]
pub enum TextEdit {
    /// Insert the string at a position.
    Insert(usize, String),
    /// Delete up to `len` characters from a position.
    Delete(usize, usize),
}

impl RandomOps for GCounter {
    type Op = u8;
    fn op_strategy() -> BoxedStrategy<u8> {
        any::<u8>().boxed()
    }
    fn apply(&mut self, replica: ReplicaId, op: &u8) {
        self.increment(replica, u64::from(*op));
    }
}

impl RandomOps for PnCounter {
    /// `(increment?, amount)`.
    type Op = (bool, u8);
    fn op_strategy() -> BoxedStrategy<(bool, u8)> {
        any::<(bool, u8)>().boxed()
    }
    fn apply(&mut self, replica: ReplicaId, &(up, by): &(bool, u8)) {
        if up {
            self.increment(replica, u64::from(by));
        } else {
            self.decrement(replica, u64::from(by));
        }
    }
}

impl<T: Arbitrary + Ord + Clone + Debug + 'static> RandomOps for GSet<T> {
    type Op = T;
    fn op_strategy() -> BoxedStrategy<T> {
        any::<T>().boxed()
    }
    fn apply(&mut self, _: ReplicaId, op: &T) {
        self.insert(op.clone());
    }
}

fn set_op<T: Arbitrary + Clone + Debug + 'static>(with_clear: bool) -> BoxedStrategy<SetOp<T>> {
    let clear_weight = if with_clear { 1 } else { 0 };
    prop_oneof![
        6 => any::<T>().prop_map(SetOp::Insert),
        4 => any::<T>().prop_map(SetOp::Remove),
        clear_weight => Just(SetOp::Clear),
    ]
    .boxed()
}

impl<T: Arbitrary + Ord + Clone + Debug + 'static> RandomOps for TwoPhaseSet<T> {
    type Op = SetOp<T>;
    fn op_strategy() -> BoxedStrategy<SetOp<T>> {
        set_op(false)
    }
    fn apply(&mut self, _: ReplicaId, op: &SetOp<T>) {
        match op {
            SetOp::Insert(v) => {
                self.insert(v.clone());
            }
            SetOp::Remove(v) => {
                self.remove(v);
            }
            SetOp::Clear => {}
        }
    }
}

impl<T: Arbitrary + Ord + Clone + Debug + 'static> RandomOps for OrSet<T> {
    type Op = SetOp<T>;
    fn op_strategy() -> BoxedStrategy<SetOp<T>> {
        set_op(true)
    }
    fn apply(&mut self, replica: ReplicaId, op: &SetOp<T>) {
        match op {
            SetOp::Insert(v) => {
                self.insert(replica, v.clone());
            }
            SetOp::Remove(v) => {
                self.remove(v);
            }
            SetOp::Clear => self.clear(),
        }
    }
}

impl<T: Arbitrary + Ord + Clone + Debug + Default + 'static> RandomOps for LwwRegister<T> {
    type Op = T;
    fn op_strategy() -> BoxedStrategy<T> {
        any::<T>().boxed()
    }
    fn apply(&mut self, replica: ReplicaId, op: &T) {
        self.set(replica, op.clone());
    }
}

impl<T: Arbitrary + Clone + Debug + PartialEq + 'static> RandomOps for MvRegister<T> {
    /// `Some(v)` writes `v`; `None` clears.
    type Op = Option<T>;
    fn op_strategy() -> BoxedStrategy<Option<T>> {
        prop_oneof![5 => any::<T>().prop_map(Some), 1 => Just(None)].boxed()
    }
    fn apply(&mut self, replica: ReplicaId, op: &Option<T>) {
        match op {
            Some(v) => self.set(replica, v.clone()),
            None => self.clear(),
        }
    }
}

impl<K, V> RandomOps for OrMap<K, V>
where
    K: Arbitrary + Ord + Clone + Debug + 'static,
    V: RandomOps + Merge + 'static,
{
    type Op = MapOp<K, V::Op>;
    fn op_strategy() -> BoxedStrategy<Self::Op> {
        prop_oneof![
            5 => (any::<K>(), V::op_strategy()).prop_map(|(k, op)| MapOp::Update(k, op)),
            1 => (any::<K>(), V::op_strategy()).prop_map(|(k, op)| MapOp::Insert(k, op)),
            2 => any::<K>().prop_map(MapOp::Remove),
        ]
        .boxed()
    }
    fn apply(&mut self, replica: ReplicaId, op: &Self::Op) {
        match op {
            MapOp::Update(k, op) => self.update(replica, k.clone(), |v| v.apply(replica, op)),
            MapOp::Insert(k, op) => {
                let mut v = V::default();
                v.apply(replica, op);
                self.insert(replica, k.clone(), v);
            }
            MapOp::Remove(k) => {
                self.remove(k);
            }
        }
    }
}

impl<T: Arbitrary + Ord + Clone + Debug + Default + 'static> RandomOps for Versioned<T> {
    /// A write of this value at the next version.
    type Op = T;
    fn op_strategy() -> BoxedStrategy<T> {
        any::<T>().boxed()
    }
    fn apply(&mut self, _: ReplicaId, op: &T) {
        *self = Versioned::new(self.version().next(), op.clone());
    }
}

impl RandomOps for Text {
    type Op = TextEdit;
    fn op_strategy() -> BoxedStrategy<TextEdit> {
        // A small alphabet (so runs meet and conflict often) with two-byte,
        // three-byte and four-byte (UTF-16 surrogate pair) characters.
        let text = proptest::collection::vec(
            prop_oneof![
                6 => proptest::char::range('a', 'e'),
                1 => Just('é'),
                1 => Just('日'),
                1 => Just('😀'),
            ],
            1..5,
        )
        .prop_map(|cs| cs.into_iter().collect::<String>());
        prop_oneof![
            3 => (any::<usize>(), text).prop_map(|(at, s)| TextEdit::Insert(at, s)),
            1 => (any::<usize>(), 1..4usize).prop_map(|(at, n)| TextEdit::Delete(at, n)),
        ]
        .boxed()
    }
    fn apply(&mut self, replica: ReplicaId, op: &TextEdit) {
        self.set_replica(replica);
        let len = self.len();
        // In-range by construction, so the results are always `Ok`.
        match op {
            TextEdit::Insert(at, s) => {
                let _ = self.insert(at % (len + 1), s);
            }
            TextEdit::Delete(at, n) => {
                if len > 0 {
                    let start = at % len;
                    let _ = self.delete(start..(start + n).min(len));
                }
            }
        }
    }
}

/// Tuples: an update touches any subset of the fields (`None` leaves a
/// field alone), so histories interleave updates of different fields.
macro_rules! tuple_random_ops {
    ($n:literal: $($t:ident $i:tt),+) => {
        impl<$($t: RandomOps + 'static),+> RandomOps for ($($t,)+) {
            type Op = ($(Option<$t::Op>,)+);
            fn op_strategy() -> BoxedStrategy<Self::Op> {
                ($(proptest::option::of($t::op_strategy()),)+).boxed()
            }
            fn apply(&mut self, replica: ReplicaId, op: &Self::Op) {
                $(if let Some(op) = &op.$i {
                    self.$i.apply(replica, op);
                })+
            }
        }
    };
}
crate::merge::for_each_tuple!(tuple_random_ops);

/// `Option`: an update of an absent value first creates it (from the
/// bottom `None` to `Some(T::default())`, itself an inflation).
impl<T: RandomOps + 'static> RandomOps for Option<T> {
    type Op = T::Op;
    fn op_strategy() -> BoxedStrategy<T::Op> {
        T::op_strategy()
    }
    fn apply(&mut self, replica: ReplicaId, op: &T::Op) {
        self.get_or_insert_with(T::default).apply(replica, op);
    }
}
