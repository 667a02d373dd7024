use std::fmt;

use serde::{Deserialize, Serialize};

use crate::codec::{Codec, DecodeError, Decoder, Encoder};

/// The identity of one replica: a process, thread or session that makes
/// updates.
///
/// Two replicas that update concurrently must never share an id: their
/// updates would get the same [`Dot`] and one of them would be lost. Derive
/// ids from something unique (a node id, a database sequence) or use
/// [`ReplicaId::random`].
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
///
/// let a = ReplicaId::new(7);
/// assert_eq!(a.get(), 7);
/// assert_ne!(ReplicaId::random(), ReplicaId::random());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReplicaId(u64);

impl ReplicaId {
    /// Creates a replica id from a number the caller keeps unique.
    pub const fn new(id: u64) -> Self {
        Self(id)
    }

    /// Creates a random replica id: 64 bits from the operating system's
    /// random source (collisions between a few million replicas are
    /// vanishingly unlikely). Should the OS source fail, it falls back to
    /// the standard library's per-process hash keys, the clock, the pid and
    /// a counter.
    pub fn random() -> Self {
        match getrandom::u64() {
            Ok(bits) => Self(bits),
            Err(_) => Self::fallback_random(),
        }
    }

    /// The random id used when the OS random source fails.
    fn fallback_random() -> Self {
        use std::hash::{BuildHasher, Hasher};
        use std::sync::atomic::{AtomicU64, Ordering};
        // The counter makes two calls in one process differ even when the
        // clock does not move between them; Relaxed is enough because only
        // uniqueness of the fetched value matters, not ordering.
        static CALLS: AtomicU64 = AtomicU64::new(0);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        h.write_u32(std::process::id());
        Self(h.finish())
    }

    /// The number behind this id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<u64> for ReplicaId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

impl Codec for ReplicaId {
    fn encode(&self, enc: &mut Encoder) {
        enc.varint(self.0);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        dec.varint().map(Self)
    }
}

/// One event: the `counter`-th update made by `replica`.
///
/// Counters start at 1; a replica's dots are `1, 2, 3, ...` with no gaps.
///
/// # Examples
///
/// ```
/// use calm::causal::{Dot, ReplicaId};
///
/// let d = Dot::new(ReplicaId::new(1), 3);
/// assert_eq!(d.replica(), ReplicaId::new(1));
/// assert_eq!(d.counter(), 3);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "DotRepr")]
pub struct Dot {
    /// Who made the update.
    replica: ReplicaId,
    /// Which of that replica's updates it was; at least 1.
    counter: u64,
}

impl Dot {
    /// Creates a dot.
    ///
    /// # Panics
    ///
    /// If `counter` is 0: counters start at 1, and 0 means "nothing seen".
    #[track_caller]
    pub fn new(replica: ReplicaId, counter: u64) -> Self {
        if counter == 0 {
            zero_counter();
        }
        Self { replica, counter }
    }

    /// The replica that made the update.
    pub const fn replica(self) -> ReplicaId {
        self.replica
    }

    /// The replica's update counter, at least 1.
    pub const fn counter(self) -> u64 {
        self.counter
    }
}

/// The serde form of a [`Dot`], checked on the way in.
#[derive(Deserialize)]
struct DotRepr {
    replica: ReplicaId,
    counter: u64,
}

/// A dot with counter 0 was deserialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("dot counters start at 1; got 0")]
struct ZeroCounter;

impl TryFrom<DotRepr> for Dot {
    type Error = ZeroCounter;
    fn try_from(r: DotRepr) -> Result<Self, ZeroCounter> {
        match r.counter {
            0 => Err(ZeroCounter),
            counter => Ok(Self {
                replica: r.replica,
                counter,
            }),
        }
    }
}

#[cold]
#[track_caller]
fn zero_counter() -> ! {
    panic!("dot counters start at 1; 0 means no event")
}

impl fmt::Debug for Dot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}.{}", self.replica, self.counter)
    }
}

impl Codec for Dot {
    fn encode(&self, enc: &mut Encoder) {
        self.replica.encode(enc);
        enc.varint(self.counter);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let replica = ReplicaId::decode(dec)?;
        match dec.varint()? {
            0 => Err(dec.invalid("dot counter is zero")),
            counter => Ok(Self { replica, counter }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random ids differ, from the OS source and from the fallback.
    #[test]
    fn random_ids_differ() {
        let ids: std::collections::BTreeSet<u64> =
            (0..1000).map(|_| ReplicaId::random().get()).collect();
        assert_eq!(ids.len(), 1000);
        let fallback: std::collections::BTreeSet<u64> = (0..1000)
            .map(|_| ReplicaId::fallback_random().get())
            .collect();
        assert_eq!(fallback.len(), 1000);
    }
}
