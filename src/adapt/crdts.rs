//! [`Merge`] and the codec for the `crdts` crate's state types.
//!
//! `crdts` merges by value (`CvRDT::merge(&mut self, other: Self)`); the
//! adapter clones `other` and calls it, so a `crdts` value works wherever
//! calm expects a [`Merge`]: the law harness,
//! [`StoreExt::merge_into`](crate::store::StoreExt::merge_into) on every
//! backend, your own code.
//!
//! | `crdts` type | laws (calm's harness) |
//! | --- | --- |
//! | `GCounter`, `PNCounter`, `GSet`, `VClock` | all hold |
//! | `Orswot`, `MVReg` | all hold on histories made through their own APIs |
//! | `Map` | **monotonicity fails**: merging a state into its own successor can change the successor (reset-remove trims dots that a nested value took from the map's context for another key), so "merge only moves up" does not hold and neither does the chaos check built on it |
//! | `LWWReg` | hold only if no two writes share a marker; `crdts` keeps whichever value arrives first on a tie, so merge is not commutative then |
//!
//! `crdts` has no delta sync, so these types implement [`Merge`] but not
//! [`DeltaMerge`](crate::DeltaMerge).
//!
//! # Encoding
//!
//! The codec route is `crdts`' own serde representation in bincode, inside
//! calm's header (format version and a type tag), with bincode's size
//! limit set to the input's length: truncated or hostile bytes give a
//! [`DecodeError`], and no collection is pre-allocated beyond what the
//! input can hold.
//!
//! # Examples
//!
//! ```
//! use calm::{Merge, codec};
//! use crdts::{CmRDT, GCounter};
//!
//! let mut a: GCounter<u64> = GCounter::new();
//! a.apply(a.inc(1));
//! let mut b: GCounter<u64> = GCounter::new();
//! b.apply(b.inc(2));
//! Merge::merge(&mut a, &b);
//! assert_eq!(a.read(), 2u32.into());
//! let back: GCounter<u64> = codec::from_bytes(&codec::to_bytes(&a))?;
//! assert_eq!(back, a);
//! # Ok::<(), calm::codec::DecodeError>(())
//! ```

use std::fmt::Debug;
use std::hash::Hash;

use bincode::Options;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::Merge;

/// bincode with calm's rules: fixed-width little-endian integers (crdts'
/// own format), rejecting trailing bytes, and never reading more than
/// `limit` bytes (which bounds every pre-allocation by the input's size).
fn bincode_options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
        .with_limit(limit)
}

/// Writes a serde value as length-prefixed bincode.
fn encode_serde<T: Serialize>(value: &T, enc: &mut Encoder) {
    // Serializing an in-memory crdts value cannot fail: its types have no
    // failing Serialize impls and the limit is the largest possible.
    let bytes = bincode_options(u64::MAX)
        .serialize(value)
        .unwrap_or_default();
    enc.bytes(&bytes);
}

/// Reads length-prefixed bincode into a serde value.
fn decode_serde<T: DeserializeOwned>(dec: &mut Decoder<'_>) -> Result<T, DecodeError> {
    let offset = dec.offset();
    let bytes = dec.bytes()?;
    bincode_options(bytes.len() as u64)
        .deserialize(bytes)
        .map_err(|_| DecodeError::Invalid {
            offset,
            what: "not a valid crdts value in bincode",
        })
}

macro_rules! adapt {
    ($(#[$doc:meta])* $ty:ty, [$($bounds:tt)*], $tag:expr) => {
        $(#[$doc])*
        impl<$($bounds)*> Merge for $ty {
            fn merge(&mut self, other: &Self) {
                crdts::CvRDT::merge(self, other.clone());
            }
        }

        impl<$($bounds)*> Codec for $ty {
            fn encode(&self, enc: &mut Encoder) {
                encode_serde(self, enc);
            }
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                decode_serde(dec)
            }
        }

        impl<$($bounds)*> Tagged for $ty {
            const TAG: u8 = $tag;
        }
    };
}

adapt!(
    /// Merges two `crdts::GCounter`s (entry-wise maximum).
    crdts::GCounter<A>,
    [A: Ord + Clone + Debug + Serialize + DeserializeOwned],
    crate::codec::tags::CRDTS_G_COUNTER
);
adapt!(
    /// Merges two `crdts::PNCounter`s.
    crdts::PNCounter<A>,
    [A: Ord + Clone + Debug + Serialize + DeserializeOwned],
    crate::codec::tags::CRDTS_PN_COUNTER
);
adapt!(
    /// Merges two `crdts::GSet`s (union).
    crdts::GSet<T>,
    [T: Ord + Clone + Serialize + DeserializeOwned],
    crate::codec::tags::CRDTS_G_SET
);
adapt!(
    /// Merges two `crdts::VClock`s (entry-wise maximum).
    crdts::VClock<A>,
    [A: Ord + Clone + Debug + Serialize + DeserializeOwned],
    crate::codec::tags::CRDTS_VCLOCK
);
adapt!(
    /// Merges two `crdts::Orswot`s (add-wins observed-remove set).
    crdts::Orswot<M, A>,
    [M: Hash + Eq + Clone + Debug + Serialize + DeserializeOwned, A: Ord + Hash + Clone + Debug + Serialize + DeserializeOwned],
    crate::codec::tags::CRDTS_ORSWOT
);
adapt!(
    /// Merges two `crdts::MVReg`s (concurrent values kept).
    crdts::MVReg<V, A>,
    [V: Clone + Debug + Serialize + DeserializeOwned, A: Ord + Clone + Debug + Serialize + DeserializeOwned],
    crate::codec::tags::CRDTS_MV_REG
);
adapt!(
    /// Merges two `crdts::LWWReg`s: the higher marker wins. On equal
    /// markers with different values `crdts` keeps its own value, which
    /// breaks commutativity: give every write a unique marker.
    crdts::LWWReg<V, M>,
    [V: PartialEq + Clone + Serialize + DeserializeOwned, M: Ord + Clone + Serialize + DeserializeOwned],
    crate::codec::tags::CRDTS_LWW_REG
);
adapt!(
    /// Merges two `crdts::Map`s (reset-remove semantics: a remove concurrent
    /// with an update keeps the key, without what the remover had seen).
    /// Not monotone: see the table in the module docs.
    crdts::Map<K, V, A>,
    [
        K: Ord + Clone + Debug + Serialize + DeserializeOwned,
        V: crdts::map::Val<A> + crdts::CvRDT + Debug + Serialize + DeserializeOwned,
        A: Ord + Hash + Clone + Debug + Serialize + DeserializeOwned
    ],
    crate::codec::tags::CRDTS_MAP
);

#[cfg(feature = "testing")]
mod random_ops {
    //! Random operations on `crdts` types for calm's law harness, made
    //! through `crdts`' own APIs (add/remove contexts from reads).

    use std::fmt::Debug;
    use std::hash::Hash;

    use crdts::{CmRDT, GCounter, GSet, LWWReg, MVReg, Map, Orswot, PNCounter};
    use proptest::prelude::*;
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use crate::causal::ReplicaId;
    use crate::testing::{MapOp, RandomOps, SetOp};

    impl RandomOps for GCounter<u64> {
        type Op = u8;
        fn op_strategy() -> BoxedStrategy<u8> {
            (1..20u8).boxed()
        }
        fn apply(&mut self, replica: ReplicaId, op: &u8) {
            let dot = self.inc_many(replica.get(), u64::from(*op));
            CmRDT::apply(self, dot);
        }
    }

    impl RandomOps for PNCounter<u64> {
        type Op = bool;
        fn op_strategy() -> BoxedStrategy<bool> {
            any::<bool>().boxed()
        }
        fn apply(&mut self, replica: ReplicaId, up: &bool) {
            let op = if *up {
                self.inc(replica.get())
            } else {
                self.dec(replica.get())
            };
            CmRDT::apply(self, op);
        }
    }

    impl RandomOps for GSet<u8> {
        type Op = u8;
        fn op_strategy() -> BoxedStrategy<u8> {
            any::<u8>().boxed()
        }
        fn apply(&mut self, _: ReplicaId, op: &u8) {
            self.insert(*op);
        }
    }

    impl<M> RandomOps for Orswot<M, u64>
    where
        M: Arbitrary + Hash + Eq + Ord + Clone + Debug + Serialize + DeserializeOwned + 'static,
    {
        type Op = SetOp<M>;
        fn op_strategy() -> BoxedStrategy<SetOp<M>> {
            prop_oneof![
                3 => any::<M>().prop_map(SetOp::Insert),
                2 => any::<M>().prop_map(SetOp::Remove),
            ]
            .boxed()
        }
        fn apply(&mut self, replica: ReplicaId, op: &SetOp<M>) {
            match op {
                SetOp::Insert(m) => {
                    let ctx = self.read_ctx().derive_add_ctx(replica.get());
                    let op = self.add(m.clone(), ctx);
                    CmRDT::apply(self, op);
                }
                SetOp::Remove(m) => {
                    let ctx = self.contains(m).derive_rm_ctx();
                    let op = self.rm(m.clone(), ctx);
                    CmRDT::apply(self, op);
                }
                SetOp::Clear => {}
            }
        }
    }

    impl RandomOps for MVReg<u8, u64> {
        type Op = u8;
        fn op_strategy() -> BoxedStrategy<u8> {
            any::<u8>().boxed()
        }
        fn apply(&mut self, replica: ReplicaId, op: &u8) {
            let ctx = self.read_ctx().derive_add_ctx(replica.get());
            let op = self.write(*op, ctx);
            CmRDT::apply(self, op);
        }
    }

    impl RandomOps for LWWReg<u8, (u64, u64)> {
        /// A write; its marker is `(one past the current marker's time,
        /// replica)`, unique per write as `crdts` requires.
        type Op = u8;
        fn op_strategy() -> BoxedStrategy<u8> {
            any::<u8>().boxed()
        }
        fn apply(&mut self, replica: ReplicaId, op: &u8) {
            let marker = (self.marker.0 + 1, replica.get());
            self.update(*op, marker);
        }
    }

    impl RandomOps for Map<u8, MVReg<u8, u64>, u64> {
        type Op = MapOp<u8, u8>;
        fn op_strategy() -> BoxedStrategy<Self::Op> {
            prop_oneof![
                4 => (0..6u8, any::<u8>()).prop_map(|(k, v)| MapOp::Update(k, v)),
                1 => (0..6u8).prop_map(MapOp::Remove),
            ]
            .boxed()
        }
        fn apply(&mut self, replica: ReplicaId, op: &Self::Op) {
            match op {
                MapOp::Update(k, v) | MapOp::Insert(k, v) => {
                    let ctx = self.read_ctx().derive_add_ctx(replica.get());
                    let op = self.update(*k, ctx, |reg, ctx| reg.write(*v, ctx));
                    CmRDT::apply(self, op);
                }
                MapOp::Remove(k) => {
                    let ctx = self.get(k).derive_rm_ctx();
                    let op = self.rm(*k, ctx);
                    CmRDT::apply(self, op);
                }
            }
        }
    }
}
