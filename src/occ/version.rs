use std::fmt;

use serde::{Deserialize, Serialize};

use crate::codec::{Codec, DecodeError, Decoder, Encoder};
use crate::merge::Merge;

/// A version number: strictly increasing with every write of the thing it
/// versions.
///
/// In a [`VersionedCell`](super::VersionedCell) it counts writes from 1. In
/// a [`Store`](crate::store::Store) it is the store-wide revision at which
/// a key was last written, so it also orders writes *across* keys and can
/// serve as a fencing token.
///
/// # Examples
///
/// ```
/// use calm::occ::Version;
///
/// let v = Version::new(41);
/// assert_eq!(v.next(), Version::new(42));
/// assert!(v < v.next());
/// ```
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Version(u64);

impl Version {
    /// Version 0: "never written".
    pub const ZERO: Version = Version(0);

    /// Wraps a number.
    pub const fn new(v: u64) -> Self {
        Self(v)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The version after this one.
    ///
    /// # Panics
    ///
    /// At `u64::MAX` (after 2^64 writes).
    #[track_caller]
    pub const fn next(self) -> Self {
        match self.0.checked_add(1) {
            Some(v) => Self(v),
            None => panic!("version counter exhausted"),
        }
    }

    /// The version before this one (saturating at zero).
    pub const fn prev(self) -> Self {
        Self(self.0.saturating_sub(1))
    }

    /// A version from a signed 64-bit integer, as databases and etcd keep
    /// revisions (PostgreSQL's `bigint`, etcd's `int64`). A negative
    /// number, which no store hands out, reads as zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::occ::Version;
    ///
    /// assert_eq!(Version::from_i64(42), Version::new(42));
    /// assert_eq!(Version::from_i64(-1), Version::ZERO);
    /// assert_eq!(Version::new(u64::MAX).to_i64(), i64::MAX);
    /// ```
    pub const fn from_i64(v: i64) -> Self {
        if v < 0 {
            Self(0)
        } else {
            Self(v.unsigned_abs())
        }
    }

    /// The version as a signed 64-bit integer, saturating at `i64::MAX`
    /// (2^63 writes away).
    pub const fn to_i64(self) -> i64 {
        if self.0 > i64::MAX as u64 {
            i64::MAX
        } else {
            self.0 as i64
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl From<u64> for Version {
    fn from(v: u64) -> Self {
        Self(v)
    }
}

impl Codec for Version {
    fn encode(&self, enc: &mut Encoder) {
        enc.varint(self.0);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        dec.varint().map(Self)
    }
}

/// A value with the version it was written at.
///
/// As a [`Merge`] type, the higher version wins; two different values at
/// the same version (only possible when two writers bypassed the
/// compare-and-set) are ordered by the values themselves, so every replica
/// picks the same one.
///
/// # Examples
///
/// ```
/// use calm::occ::{Version, Versioned};
/// use calm::Merge;
///
/// let mut a = Versioned::new(Version::new(3), "old");
/// let b = Versioned::new(Version::new(4), "new");
/// a.merge(&b);
/// assert_eq!(a.value(), &"new");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Versioned<T> {
    /// The version `value` was written at.
    version: Version,
    /// The value.
    value: T,
}

impl<T> Versioned<T> {
    /// Pairs a value with its version.
    pub const fn new(version: Version, value: T) -> Self {
        Self { version, value }
    }

    /// The version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// Splits into version and value.
    pub fn into_parts(self) -> (Version, T) {
        (self.version, self.value)
    }
}

impl<T: Ord + Clone> Merge for Versioned<T> {
    fn merge(&mut self, other: &Self) {
        if (other.version, &other.value) > (self.version, &self.value) {
            self.version = other.version;
            self.value = other.value.clone();
        }
    }
}

impl<T: Codec> Codec for Versioned<T> {
    fn encode(&self, enc: &mut Encoder) {
        self.version.encode(enc);
        self.value.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            version: Version::decode(dec)?,
            value: T::decode(dec)?,
        })
    }
}

impl<T: Codec> crate::codec::Tagged for Versioned<T> {
    const TAG: u8 = crate::codec::tags::VERSIONED;
}
