//! Registers: one value that replicas overwrite concurrently.
//!
//! - [`LwwRegister`] keeps one winner: the write with the highest Lamport
//!   timestamp (ties broken by replica id). Concurrent writes lose silently,
//!   which is right for "latest setting wins" and wrong for anything that
//!   must not lose a write.
//! - [`MvRegister`] keeps every concurrent write (multi-value) and lets the
//!   reader resolve them; a later write that has seen them replaces them
//!   all.
//!
//! Neither uses the wall clock: clocks on different machines disagree, and a
//! register ordered by them can let an older write win. The Lamport counter
//! orders every write after everything its replica had seen.
//!
//! # Examples
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::{LwwRegister, Merge, MvRegister};
//!
//! let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
//!
//! let mut x = LwwRegister::new("draft");
//! let mut y = x.clone();
//! x.set(a, "from a");
//! y.set(b, "from b"); // concurrent, same counter: replica 2 wins the tie
//! x.merge(&y);
//! assert_eq!(*x.get(), "from b");
//!
//! let mut p = MvRegister::new();
//! let mut q = MvRegister::new();
//! p.set(a, "blue");
//! q.set(b, "green");
//! p.merge(&q);
//! assert_eq!(p.values().copied().collect::<Vec<_>>(), ["blue", "green"]);
//! p.set(a, "teal"); // resolves the conflict
//! assert_eq!(p.values().copied().collect::<Vec<_>>(), ["teal"]);
//! ```

use serde::{Deserialize, Serialize};

use crate::causal::kernel::{check_dotted, delta_context, join_dotted};
use crate::causal::{CausalContext, Dot, ReplicaId, VersionVector};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::{DeltaMerge, Merge};

/// A Lamport timestamp: a logical counter, with the writing replica as the
/// tie-breaker. Ordered by counter, then replica.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::LamportStamp;
///
/// let early = LamportStamp::new(1, ReplicaId::new(9));
/// let late = LamportStamp::new(2, ReplicaId::new(1));
/// assert!(early < late);
/// ```
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct LamportStamp {
    /// The logical time: one past the highest counter the writer had seen.
    counter: u64,
    /// The replica that wrote, breaking ties between concurrent writes.
    replica: ReplicaId,
}

impl LamportStamp {
    /// Creates a stamp.
    pub const fn new(counter: u64, replica: ReplicaId) -> Self {
        Self { counter, replica }
    }

    /// The logical time.
    pub const fn counter(self) -> u64 {
        self.counter
    }

    /// The writer.
    pub const fn replica(self) -> ReplicaId {
        self.replica
    }
}

impl Codec for LamportStamp {
    fn encode(&self, enc: &mut Encoder) {
        enc.varint(self.counter);
        self.replica.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            counter: dec.varint()?,
            replica: ReplicaId::decode(dec)?,
        })
    }
}

/// A last-writer-wins register ordered by [`LamportStamp`].
///
/// Contract: merge keeps the value with the higher stamp, so it is
/// commutative, associative and idempotent, and any delivery works. A local
/// [`set`](LwwRegister::set) always gets a stamp above everything this
/// replica has merged, so it wins over every write it has seen; among
/// concurrent writes the higher counter wins, then the higher replica id.
/// Two writes with the same stamp (only possible if a replica id was
/// reused) are ordered by the values themselves so replicas still agree.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{LwwRegister, Merge};
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x = LwwRegister::new(0);
/// x.set(a, 1);
/// let mut y = x.clone();
/// y.set(b, 2); // y saw x's write, so this one is later
/// x.merge(&y);
/// assert_eq!(*x.get(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LwwRegister<T> {
    /// The current value.
    value: T,
    /// When it was written; the initial value has the zero stamp.
    stamp: LamportStamp,
}

impl<T> LwwRegister<T> {
    /// Creates a register holding `value` at the zero stamp (any write
    /// replaces it).
    pub fn new(value: T) -> Self {
        Self {
            value,
            stamp: LamportStamp::default(),
        }
    }

    /// Writes `value` as `replica`, with a stamp above every write seen.
    ///
    /// # Panics
    ///
    /// If the logical counter is already `u64::MAX`.
    #[track_caller]
    pub fn set(&mut self, replica: ReplicaId, value: T) {
        let counter = self
            .stamp
            .counter
            .checked_add(1)
            .unwrap_or_else(|| clock_exhausted());
        self.stamp = LamportStamp::new(counter, replica);
        self.value = value;
    }

    /// The current value.
    pub fn get(&self) -> &T {
        &self.value
    }

    /// The current value's stamp.
    pub fn stamp(&self) -> LamportStamp {
        self.stamp
    }

    /// Consumes the register, returning its value.
    pub fn into_inner(self) -> T {
        self.value
    }
}

#[cold]
#[track_caller]
fn clock_exhausted() -> ! {
    panic!("Lamport counter reached u64::MAX")
}

impl<T: Ord + Clone> Merge for LwwRegister<T> {
    fn merge(&mut self, other: &Self) {
        let theirs_wins = match other.stamp.cmp(&self.stamp) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => other.value > self.value,
        };
        if theirs_wins {
            self.value = other.value.clone();
            self.stamp = other.stamp;
        }
    }
}

/// Deltas for a register: its "version vector" names only the winning
/// write (`{writer: Lamport counter}`). A receiver whose vector covers that
/// entry has seen this write or a later one from the same writer (stamps
/// only grow), so it gets the empty register; anyone else gets the value.
impl<T: Ord + Clone + Default> DeltaMerge for LwwRegister<T> {
    type Summary = VersionVector;

    fn version_vector(&self) -> VersionVector {
        let mut vv = VersionVector::new();
        vv.observe(self.stamp.replica, self.stamp.counter);
        vv
    }

    fn delta(&self, since: &VersionVector) -> Self {
        // The zero stamp is never "seen": it ties with the empty register,
        // which only the value itself can break.
        if self.stamp.counter > 0 && since.get(self.stamp.replica) >= self.stamp.counter {
            Self::default()
        } else {
            self.clone()
        }
    }
}

impl<T: Codec> Codec for LwwRegister<T> {
    fn encode(&self, enc: &mut Encoder) {
        self.stamp.encode(enc);
        self.value.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let stamp = LamportStamp::decode(dec)?;
        Ok(Self {
            value: T::decode(dec)?,
            stamp,
        })
    }
}

impl<T: Codec> Tagged for LwwRegister<T> {
    const TAG: u8 = codec::tags::LWW_REGISTER;
}

/// A multi-value register: concurrent writes are all kept until a write
/// that has seen them replaces them.
///
/// Each write gets a fresh [`Dot`] and drops the values it has observed.
/// Merge is the observed-remove join (see [`OrSet`](crate::OrSet)): a value
/// survives unless the other side has seen its dot and dropped it.
///
/// Contract: commutative, associative, idempotent; any delivery works. After
/// concurrent writes, [`values`](MvRegister::values) returns all of them (in
/// dot order); the application resolves and writes the result. Each replica
/// must use its own [`ReplicaId`].
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{Merge, MvRegister};
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x = MvRegister::new();
/// x.set(a, 10);
/// let mut y = x.clone();
/// y.set(b, 20); // saw 10: replaces it
/// x.merge(&y);
/// assert_eq!(x.values().copied().collect::<Vec<_>>(), [20]);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "MvRegisterRepr<T>", into = "MvRegisterRepr<T>")]
#[serde(bound(
    deserialize = "T: Clone + Deserialize<'de>",
    serialize = "T: Clone + Serialize"
))]
pub struct MvRegister<T> {
    /// The concurrent values with the dot of the write that made each,
    /// sorted by dot. Every dot is in `ctx`.
    values: Vec<(Dot, T)>,
    /// Every write this replica has seen.
    ctx: CausalContext,
}

/// The serde form of an [`MvRegister`], checked on the way in.
#[derive(Serialize, Deserialize)]
struct MvRegisterRepr<T> {
    values: Vec<(Dot, T)>,
    ctx: CausalContext,
}

/// A deserialized [`MvRegister`] broke the dot invariants.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct InvalidValues(&'static str);

impl<T: Clone> TryFrom<MvRegisterRepr<T>> for MvRegister<T> {
    type Error = InvalidValues;
    fn try_from(r: MvRegisterRepr<T>) -> Result<Self, InvalidValues> {
        if !r.values.is_empty() {
            check_dotted(&r.values, &r.ctx).map_err(InvalidValues)?;
        }
        Ok(Self {
            values: r.values,
            ctx: r.ctx,
        })
    }
}

impl<T> From<MvRegister<T>> for MvRegisterRepr<T> {
    fn from(r: MvRegister<T>) -> Self {
        Self {
            values: r.values,
            ctx: r.ctx,
        }
    }
}

impl<T> Default for MvRegister<T> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            ctx: CausalContext::new(),
        }
    }
}

impl<T> MvRegister<T> {
    /// Creates an empty register (no value).
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `value` as `replica`, replacing every value seen so far.
    ///
    /// # Panics
    ///
    /// If `replica` has used every `u64` dot counter.
    #[track_caller]
    pub fn set(&mut self, replica: ReplicaId, value: T) {
        let dot = self.ctx.next_dot(replica);
        self.ctx.insert(dot);
        self.values.clear();
        self.values.push((dot, value));
    }

    /// Removes every value seen so far (a concurrent write survives).
    pub fn clear(&mut self) {
        self.values.clear();
    }

    /// The current values: one normally, several after concurrent writes,
    /// none if never written or cleared.
    pub fn values(&self) -> impl Iterator<Item = &T> + '_ {
        self.values.iter().map(|(_, v)| v)
    }

    /// How many concurrent values there are.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the register holds no value.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for MvRegister<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MvRegister")
            .field("values", &self.values)
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl<T: Clone> Merge for MvRegister<T> {
    fn merge(&mut self, other: &Self) {
        join_dotted(&mut self.values, &other.values, &self.ctx, &other.ctx);
        self.ctx.merge(&other.ctx);
    }
}

impl<T: Clone> DeltaMerge for MvRegister<T> {
    type Summary = VersionVector;

    fn version_vector(&self) -> VersionVector {
        self.ctx.version_vector()
    }

    fn delta(&self, since: &VersionVector) -> Self {
        Self {
            values: self
                .values
                .iter()
                .filter(|(d, _)| !since.contains(*d))
                .cloned()
                .collect(),
            ctx: delta_context(&self.ctx, self.values.iter().map(|(d, _)| *d), since),
        }
    }
}

impl<T: Codec + Clone> Codec for MvRegister<T> {
    fn encode(&self, enc: &mut Encoder) {
        self.ctx.encode(enc);
        codec::encode_seq(enc, self.values.len(), &self.values);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let ctx = CausalContext::decode(dec)?;
        let offset = dec.offset();
        let values = Vec::<(Dot, T)>::decode(dec)?;
        if !values.is_empty() {
            check_dotted(&values, &ctx).map_err(|what| DecodeError::Invalid { offset, what })?;
        }
        Ok(Self { values, ctx })
    }
}

impl<T: Codec + Clone> Tagged for MvRegister<T> {
    const TAG: u8 = codec::tags::MV_REGISTER;
}
