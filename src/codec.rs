//! A compact binary encoding for every calm state, safe on untrusted input.
//!
//! Replicas exchange states, deltas and operations as bytes. This module
//! defines that format once:
//!
//! - a two-byte **header**: the format version ([`FORMAT_VERSION`]) and a
//!   type tag ([`Tagged::TAG`]), so bytes of one type are never read as
//!   another and a future format can be told apart;
//! - unsigned integers as **LEB128 varints** (small numbers take one byte),
//!   signed integers zig-zag encoded first;
//! - strings, byte strings and collections **length-prefixed**.
//!
//! Decoding is the trust boundary of the crate. [`from_bytes`] returns a
//! typed [`DecodeError`] for every malformed input (truncated, bad tag, bad
//! version, a length larger than the remaining input, trailing bytes,
//! non-canonical order) and never panics. It also never allocates more than
//! the input can justify: a declared length is checked against the bytes
//! that remain *before* anything is reserved, so a length prefix of 2^60
//! costs nothing but an error.
//!
//! Encodings are canonical: equal states encode to equal bytes (sets and maps
//! are written in key order, and decoding rejects out-of-order or duplicate
//! keys rather than silently dropping them). One exception: a
//! [`Text`](crate::text::Text) document is written in its replica's own
//! numbering of characters, so two replicas holding the same edits may
//! write different bytes; bytes it accepts still re-encode to themselves.
//!
//! serde stays available on every type for formats such as JSON; this codec
//! is the compact, checked one. An element type that has serde impls needs
//! no [`Codec`] of its own: wrap it in [`Serde`] (`OrSet<Serde<MyStruct>>`),
//! and it is encoded through serde into this same format, with the same
//! checks.
//!
//! # Examples
//!
//! ```
//! use calm::codec::{self, DecodeError};
//! use calm::GSet;
//!
//! let mut set = GSet::new();
//! set.insert("apple".to_string());
//! let bytes = codec::to_bytes(&set);
//! let back: GSet<String> = codec::from_bytes(&bytes)?;
//! assert_eq!(back, set);
//!
//! // Truncated input is an error, not a panic: here the string's length
//! // prefix promises more bytes than are left.
//! let err = codec::from_bytes::<GSet<String>>(&bytes[..bytes.len() - 1]).unwrap_err();
//! assert!(matches!(err, DecodeError::LengthOverflow { declared: 5, remaining: 4, .. }));
//! # Ok::<(), DecodeError>(())
//! ```
//!
//! # Implementing the codec for your own element types
//!
//! Elements of calm's collections (`GSet<T>`, `OrSet<T>`, `OrMap<K, V>`, ...)
//! implement [`Codec`]. It is implemented for the integers, `bool`, `char`,
//! `String`, `Option`, tuples, `Vec`, `BTreeSet` and `BTreeMap`; for your own
//! type, write the two methods in terms of those:
//!
//! ```
//! use calm::codec::{Codec, Decoder, DecodeError, Encoder};
//!
//! #[derive(Debug, PartialEq)]
//! struct Point { x: i64, y: i64 }
//!
//! impl Codec for Point {
//!     fn encode(&self, enc: &mut Encoder) {
//!         self.x.encode(enc);
//!         self.y.encode(enc);
//!     }
//!     fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
//!         Ok(Point { x: i64::decode(dec)?, y: i64::decode(dec)? })
//!     }
//! }
//!
//! let mut enc = Encoder::new();
//! Point { x: -1, y: 300 }.encode(&mut enc);
//! let bytes = enc.into_bytes();
//! let mut dec = Decoder::new(&bytes);
//! assert_eq!(Point::decode(&mut dec)?, Point { x: -1, y: 300 });
//! dec.finish()?;
//! # Ok::<(), DecodeError>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};

use crate::merge::for_each_tuple;

pub(crate) mod huffman;
pub(crate) mod lz;
mod serde_format;

/// `#[derive(Codec)]` (feature `derive`): the fields in order, and with
/// `#[calm(tag = N)]` a [`Tagged`] type.
#[cfg(feature = "derive")]
pub use calm_derive::Codec;
pub use serde_format::Serde;

/// The version of the binary format written by this crate.
///
/// Versions 2 to 4 changed only the layout of a
/// [`Text`](crate::text::Text) document (see its module docs: version 2
/// wrote its structures instead of its ops, version 3 entropy-codes them,
/// version 4 parses its text for copies more sparsely where none are
/// found); bytes of versions 1 to 3 are still read, as they were written.
/// Decoding bytes of any other version fails with
/// [`DecodeError::UnsupportedVersion`].
pub const FORMAT_VERSION: u8 = 4;

/// The oldest format version this crate still reads.
pub const OLDEST_FORMAT_VERSION: u8 = 1;

/// Why bytes could not be decoded.
///
/// Every variant carries the byte offset at which decoding stopped. None of
/// them is retryable: the input itself is wrong (corrupted, truncated, from
/// another program or another format version). The caller should discard it
/// and ask the sender again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended before the value did.
    #[error("input truncated at byte {offset}: {needed} more byte(s) needed")]
    Truncated {
        /// Where the missing bytes should have started.
        offset: usize,
        /// How many more bytes were needed at least.
        needed: usize,
    },
    /// The header names a format version this crate does not read.
    #[error("unsupported format version {found} (this build reads versions up to {supported})")]
    UnsupportedVersion {
        /// The version found in the header.
        found: u8,
        /// The newest version this build reads ([`FORMAT_VERSION`]).
        supported: u8,
    },
    /// The header names another type than the one asked for.
    #[error("bytes hold type tag {found}, expected tag {expected}")]
    WrongType {
        /// The tag of the type being decoded.
        expected: u8,
        /// The tag found in the header.
        found: u8,
    },
    /// A tag inside the value (an enum variant, a `bool`, an `Option`) is
    /// not one of the known values.
    #[error("unknown {what} tag {tag} at byte {offset}")]
    BadTag {
        /// Where the tag starts.
        offset: usize,
        /// The tag read.
        tag: u64,
        /// What kind of tag it was.
        what: &'static str,
    },
    /// A length prefix claims more items or bytes than the input has left.
    ///
    /// Checked before anything is allocated, so a hostile length costs
    /// nothing.
    #[error("length {declared} at byte {offset} exceeds the {remaining} byte(s) left")]
    LengthOverflow {
        /// Where the length prefix starts.
        offset: usize,
        /// The length the input declared.
        declared: u64,
        /// The bytes that were left after the prefix.
        remaining: usize,
    },
    /// A varint is longer than ten bytes, overflows its integer type, or is
    /// not in its shortest form.
    #[error("malformed or out-of-range varint at byte {offset}")]
    BadVarint {
        /// Where the varint starts.
        offset: usize,
    },
    /// A string is not valid UTF-8 (or a `char` not a Unicode scalar value).
    #[error("invalid UTF-8 text at byte {offset}")]
    InvalidUtf8 {
        /// Where the string starts.
        offset: usize,
    },
    /// Bytes were left after a complete value.
    #[error("{count} trailing byte(s) after the value at byte {offset}")]
    TrailingBytes {
        /// Where the value ended.
        offset: usize,
        /// How many bytes were left over.
        count: usize,
    },
    /// The bytes are well formed but break a rule of the type: keys out of
    /// order or repeated, a dot outside its causal context, a zero counter.
    #[error("invalid value at byte {offset}: {what}")]
    Invalid {
        /// Where the offending item starts (or the value ends).
        offset: usize,
        /// Which rule was broken.
        what: &'static str,
    },
    /// A [`Serde`] value's own `Deserialize` impl refused what the bytes
    /// hold (an unknown enum variant, a value out of its range), or the
    /// type needs a self-describing format, which this is not.
    #[error("value refused at byte {offset}: {reason}")]
    Refused {
        /// Where decoding stopped.
        offset: usize,
        /// The type's own message, as serde reported it.
        reason: String,
    },
}

/// An output buffer for the binary format.
///
/// The methods append; [`Encoder::into_bytes`] returns the result.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    /// The bytes written so far.
    buf: Vec<u8>,
}

impl Encoder {
    /// Creates an empty encoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one raw byte.
    pub fn byte(&mut self, b: u8) {
        self.buf.push(b);
    }

    /// Appends an unsigned LEB128 varint (1 to 10 bytes).
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// Appends a signed integer, zig-zag encoded so small magnitudes of
    /// either sign take one byte.
    pub fn signed_varint(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }

    /// Appends a length-prefixed byte string.
    pub fn bytes(&mut self, b: &[u8]) {
        self.length(b.len());
        self.buf.extend_from_slice(b);
    }

    /// Appends a sequence or string length.
    pub fn length(&mut self, n: usize) {
        self.varint(n as u64);
    }

    /// Appends bytes with no length prefix (the reader must know the size).
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// Returns the encoded bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// A cursor over untrusted input in the binary format.
///
/// Every read checks the remaining length first and reports a
/// [`DecodeError`] with the offset at which it failed.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    /// The whole input.
    input: &'a [u8],
    /// The offset of the next unread byte; always `<= input.len()`.
    pos: usize,
    /// The format version the input was written in.
    version: u8,
}

impl<'a> Decoder<'a> {
    /// Creates a decoder at the start of `input`, written in the current
    /// [`FORMAT_VERSION`].
    pub fn new(input: &'a [u8]) -> Self {
        Self {
            input,
            pos: 0,
            version: FORMAT_VERSION,
        }
    }

    /// The format version the input was written in: the header's, once
    /// [`from_bytes`] has read it, else [`FORMAT_VERSION`]. A type whose
    /// layout changed between versions reads it to choose its reader.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The offset of the next unread byte.
    pub fn offset(&self) -> usize {
        self.pos
    }

    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    /// Reads one raw byte.
    ///
    /// # Errors
    ///
    /// [`DecodeError::Truncated`] at the end of the input.
    pub fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.input.get(self.pos).ok_or(DecodeError::Truncated {
            offset: self.pos,
            needed: 1,
        })?;
        self.pos += 1;
        Ok(b)
    }

    /// Reads an unsigned LEB128 varint in its shortest form.
    ///
    /// # Errors
    ///
    /// [`DecodeError::Truncated`] if the input ends inside it,
    /// [`DecodeError::BadVarint`] if it overflows `u64` or has redundant
    /// trailing zero groups.
    #[inline]
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        // Most varints are one byte.
        if let Some(&b) = self.input.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        self.varint_long()
    }

    /// [`Decoder::varint`] past its one-byte case.
    fn varint_long(&mut self) -> Result<u64, DecodeError> {
        let start = self.pos;
        let mut value: u64 = 0;
        for i in 0..10 {
            let b = self.byte()?;
            let group = u64::from(b & 0x7f);
            // The tenth byte may only contribute the top bit of a u64.
            if i == 9 && group > 1 {
                return Err(DecodeError::BadVarint { offset: start });
            }
            value |= group << (7 * i);
            if b & 0x80 == 0 {
                // A final zero group after the first byte is an overlong
                // encoding; rejecting it keeps encodings canonical.
                if i > 0 && group == 0 {
                    return Err(DecodeError::BadVarint { offset: start });
                }
                return Ok(value);
            }
        }
        Err(DecodeError::BadVarint { offset: start })
    }

    /// Reads a zig-zag encoded signed integer.
    ///
    /// # Errors
    ///
    /// As [`Decoder::varint`].
    pub fn signed_varint(&mut self) -> Result<i64, DecodeError> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    /// Reads a length prefix for items that each take at least one byte.
    ///
    /// This is the allocation guard: the length is rejected unless that
    /// many bytes remain, so a caller may reserve `len` items safely.
    ///
    /// # Errors
    ///
    /// [`DecodeError::LengthOverflow`] if the length exceeds the remaining
    /// input, or the errors of [`Decoder::varint`].
    pub fn length(&mut self) -> Result<usize, DecodeError> {
        let offset = self.pos;
        let declared = self.varint()?;
        let remaining = self.remaining();
        match usize::try_from(declared) {
            Ok(n) if n <= remaining => Ok(n),
            _ => Err(DecodeError::LengthOverflow {
                offset,
                declared,
                remaining,
            }),
        }
    }

    /// Reads a length-prefixed byte string, borrowed from the input.
    ///
    /// # Errors
    ///
    /// As [`Decoder::length`].
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.length()?;
        self.raw(n)
    }

    /// Reads exactly `n` bytes with no length prefix.
    ///
    /// # Errors
    ///
    /// [`DecodeError::Truncated`] if fewer than `n` bytes remain.
    pub fn raw(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: n - self.remaining(),
            });
        }
        let out = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Splits off the next `len` bytes (at most what is left) as a decoder
    /// of their own, with offsets still counted from the start of the
    /// whole input, and moves past them.
    fn split_off(&mut self, len: usize) -> Decoder<'a> {
        let end = self.pos + len.min(self.remaining());
        let part = Decoder {
            input: &self.input[..end],
            pos: self.pos,
            version: self.version,
        };
        self.pos = end;
        part
    }

    /// Returns an [`DecodeError::Invalid`] error at the current offset.
    pub fn invalid(&self, what: &'static str) -> DecodeError {
        DecodeError::Invalid {
            offset: self.pos,
            what,
        }
    }

    /// Checks that the whole input was consumed.
    ///
    /// # Errors
    ///
    /// [`DecodeError::TrailingBytes`] if bytes are left.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes {
                offset: self.pos,
                count,
            }),
        }
    }
}

/// A value with a binary encoding.
///
/// Implementations must write at least one byte (length-prefixed sequences
/// rely on it to bound allocations) and must decode exactly what they
/// encode. `decode` must return an error, never panic, for any input.
pub trait Codec: Sized {
    /// Appends the encoding of `self`.
    fn encode(&self, enc: &mut Encoder);

    /// Reads one value.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] for malformed input.
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError>;
}

/// A top-level type: one that can be written with a header by [`to_bytes`].
///
/// Tags below 128 are reserved for calm's own types; use 128 and above for
/// your own.
pub trait Tagged: Codec {
    /// The type tag written in the header.
    const TAG: u8;
}

/// Encodes a value with its header (format version and type tag).
pub fn to_bytes<T: Tagged>(value: &T) -> Vec<u8> {
    let mut enc = Encoder::new();
    enc.byte(FORMAT_VERSION);
    enc.byte(T::TAG);
    value.encode(&mut enc);
    enc.into_bytes()
}

/// Decodes a value written by [`to_bytes`], checking the header and that no
/// bytes are left over.
///
/// # Errors
///
/// Any [`DecodeError`]; the input is never trusted.
pub fn from_bytes<T: Tagged>(bytes: &[u8]) -> Result<T, DecodeError> {
    let mut dec = Decoder::new(bytes);
    let version = dec.byte()?;
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(DecodeError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    dec.version = version;
    let tag = dec.byte()?;
    if tag != T::TAG {
        return Err(DecodeError::WrongType {
            expected: T::TAG,
            found: tag,
        });
    }
    let value = T::decode(&mut dec)?;
    dec.finish()?;
    Ok(value)
}

/// Type tags of calm's own top-level types, one place so none repeats.
pub(crate) mod tags {
    pub(crate) const VERSION_VECTOR: u8 = 1;
    pub(crate) const CAUSAL_CONTEXT: u8 = 2;
    pub(crate) const G_COUNTER: u8 = 3;
    pub(crate) const PN_COUNTER: u8 = 4;
    pub(crate) const G_SET: u8 = 5;
    pub(crate) const TWO_PHASE_SET: u8 = 6;
    pub(crate) const OR_SET: u8 = 7;
    pub(crate) const LWW_REGISTER: u8 = 8;
    pub(crate) const MV_REGISTER: u8 = 9;
    pub(crate) const OR_MAP: u8 = 10;
    pub(crate) const VERSIONED: u8 = 11;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_G_COUNTER: u8 = 40;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_PN_COUNTER: u8 = 41;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_G_SET: u8 = 42;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_VCLOCK: u8 = 43;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_ORSWOT: u8 = 44;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_MV_REG: u8 = 45;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_LWW_REG: u8 = 46;
    #[cfg(feature = "crdts")]
    pub(crate) const CRDTS_MAP: u8 = 47;
    #[cfg(feature = "automerge")]
    pub(crate) const AUTOMERGE: u8 = 50;
    pub(crate) const TEXT_OP: u8 = 12;
    pub(crate) const TEXT: u8 = 13;
    pub(crate) const OPTION: u8 = 14;
    /// A tuple of arity `n` (1 to 12) has the tag `TUPLES + n`: 15 to 26.
    pub(crate) const TUPLES: u8 = 14;
    pub(crate) const SYNC_MESSAGE: u8 = 27;
}

macro_rules! unsigned_codec {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            fn encode(&self, enc: &mut Encoder) {
                enc.varint(u64::from(*self));
            }
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                let offset = dec.offset();
                <$t>::try_from(dec.varint()?).map_err(|_| DecodeError::BadVarint { offset })
            }
        }
    )*};
}
unsigned_codec!(u16, u32, u64);

macro_rules! signed_codec {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            fn encode(&self, enc: &mut Encoder) {
                enc.signed_varint(i64::from(*self));
            }
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                let offset = dec.offset();
                <$t>::try_from(dec.signed_varint()?).map_err(|_| DecodeError::BadVarint { offset })
            }
        }
    )*};
}
signed_codec!(i8, i16, i32, i64);

impl Codec for u8 {
    fn encode(&self, enc: &mut Encoder) {
        enc.byte(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        dec.byte()
    }
}

impl Codec for bool {
    fn encode(&self, enc: &mut Encoder) {
        enc.byte(u8::from(*self));
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let offset = dec.offset();
        match dec.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::BadTag {
                offset,
                tag: u64::from(tag),
                what: "bool",
            }),
        }
    }
}

impl Codec for char {
    fn encode(&self, enc: &mut Encoder) {
        enc.varint(u64::from(u32::from(*self)));
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let offset = dec.offset();
        let v = dec.varint()?;
        u32::try_from(v)
            .ok()
            .and_then(char::from_u32)
            .ok_or(DecodeError::InvalidUtf8 { offset })
    }
}

impl Codec for String {
    fn encode(&self, enc: &mut Encoder) {
        enc.bytes(self.as_bytes());
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let offset = dec.offset();
        let bytes = dec.bytes()?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8 { offset })
    }
}

impl<T: Codec> Codec for Option<T> {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            None => enc.byte(0),
            Some(v) => {
                enc.byte(1);
                v.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let offset = dec.offset();
        match dec.byte()? {
            0 => Ok(None),
            1 => T::decode(dec).map(Some),
            tag => Err(DecodeError::BadTag {
                offset,
                tag: u64::from(tag),
                what: "option",
            }),
        }
    }
}

/// Tuples: the fields in order, no framing (every field frames itself).
/// At top level, a tuple of arity `n` has the tag `tags::TUPLES + n`.
macro_rules! tuple_codec {
    ($n:literal: $($t:ident $i:tt),+) => {
        impl<$($t: Codec),+> Codec for ($($t,)+) {
            fn encode(&self, enc: &mut Encoder) {
                $(self.$i.encode(enc);)+
            }
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                Ok(($($t::decode(dec)?,)+))
            }
        }

        impl<$($t: Codec),+> Tagged for ($($t,)+) {
            const TAG: u8 = tags::TUPLES + $n;
        }
    };
}
for_each_tuple!(tuple_codec);

impl<T: Codec> Tagged for Option<T> {
    const TAG: u8 = tags::OPTION;
}

impl<T: Codec> Codec for Vec<T> {
    fn encode(&self, enc: &mut Encoder) {
        encode_seq(enc, self.len(), self);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let n = dec.length()?;
        // `len` checked `n` against the remaining bytes and every item takes
        // at least one byte, so this reservation is bounded by the input.
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(T::decode(dec)?);
        }
        Ok(out)
    }
}

impl<T: Codec + Ord> Codec for BTreeSet<T> {
    fn encode(&self, enc: &mut Encoder) {
        encode_seq(enc, self.len(), self.iter());
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let mut out = BTreeSet::new();
        decode_sorted(
            dec,
            |dec| T::decode(dec),
            |item| {
                out.insert(item);
            },
        )?;
        Ok(out)
    }
}

impl<K: Codec + Ord, V: Codec> Codec for BTreeMap<K, V> {
    fn encode(&self, enc: &mut Encoder) {
        enc.length(self.len());
        for (k, v) in self {
            k.encode(enc);
            v.encode(enc);
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let mut out = BTreeMap::new();
        decode_sorted_by_key(
            dec,
            |dec| Ok((K::decode(dec)?, V::decode(dec)?)),
            |(k, _)| k,
            |(k, v)| {
                out.insert(k, v);
            },
        )?;
        Ok(out)
    }
}

/// Writes a length and then each item.
pub(crate) fn encode_seq<'a, T: Codec + 'a>(
    enc: &mut Encoder,
    len: usize,
    items: impl IntoIterator<Item = &'a T>,
) {
    enc.length(len);
    for item in items {
        item.encode(enc);
    }
}

/// Reads a length-prefixed sequence whose items must be strictly increasing,
/// handing each to `sink`. Canonical encodings are sorted and free of
/// duplicates; anything else is rejected instead of silently merged.
pub(crate) fn decode_sorted<T: Ord>(
    dec: &mut Decoder<'_>,
    item: impl FnMut(&mut Decoder<'_>) -> Result<T, DecodeError>,
    sink: impl FnMut(T),
) -> Result<(), DecodeError> {
    decode_sorted_by_key(dec, item, |t| t, sink)
}

/// As [`decode_sorted`], ordering items by a key they contain.
pub(crate) fn decode_sorted_by_key<T, K: Ord + ?Sized>(
    dec: &mut Decoder<'_>,
    mut item: impl FnMut(&mut Decoder<'_>) -> Result<T, DecodeError>,
    key: impl Fn(&T) -> &K,
    mut sink: impl FnMut(T),
) -> Result<(), DecodeError> {
    let n = dec.length()?;
    let mut prev: Option<T> = None;
    for _ in 0..n {
        let offset = dec.offset();
        let next = item(dec)?;
        if let Some(p) = prev.take() {
            if key(&p) >= key(&next) {
                return Err(DecodeError::Invalid {
                    offset,
                    what: "keys out of order or repeated",
                });
            }
            sink(p);
        }
        prev = Some(next);
    }
    if let Some(p) = prev {
        sink(p);
    }
    Ok(())
}

/// Writes `input` with `write`, reads it back with `read` (which must
/// take exactly the bytes written and return `input`), and returns how
/// many bytes it took: the round trip the byte-string codecs' tests share.
#[cfg(test)]
fn round_trip_bytes(
    write: impl Fn(&mut Encoder, &[u8]),
    read: impl Fn(&mut Decoder<'_>) -> Result<Vec<u8>, DecodeError>,
    input: &[u8],
) -> usize {
    let mut enc = Encoder::new();
    write(&mut enc, input);
    let bytes = enc.into_bytes();
    let mut dec = Decoder::new(&bytes);
    assert_eq!(read(&mut dec).expect("decodes"), input);
    dec.finish().expect("nothing left");
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Codec + PartialEq + std::fmt::Debug>(v: T) {
        let mut enc = Encoder::new();
        v.encode(&mut enc);
        let bytes = enc.into_bytes();
        let mut dec = Decoder::new(&bytes);
        assert_eq!(T::decode(&mut dec).unwrap(), v);
        dec.finish().unwrap();
    }

    /// Integers of every width survive a round trip, including the extremes.
    #[test]
    fn integers_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u64::MAX - 1, u64::MAX] {
            round_trip(v);
        }
        for v in [0i64, -1, 1, -64, 64, i64::MIN, i64::MAX] {
            round_trip(v);
        }
        round_trip(u16::MAX);
        round_trip(i8::MIN);
        round_trip('ü');
        round_trip("héllo 🌍".to_string());
        round_trip(Some((1u32, false)));
        round_trip(vec![Some(1u8), None]);
    }

    /// A length prefix of 2^60 is refused before anything is allocated.
    #[test]
    fn huge_length_prefix_is_refused() {
        let mut enc = Encoder::new();
        enc.varint(1 << 60);
        let bytes = enc.into_bytes();
        let err = Vec::<u64>::decode(&mut Decoder::new(&bytes)).unwrap_err();
        assert_eq!(
            err,
            DecodeError::LengthOverflow {
                offset: 0,
                declared: 1 << 60,
                remaining: 0
            }
        );
        let err = String::decode(&mut Decoder::new(&bytes)).unwrap_err();
        assert!(matches!(err, DecodeError::LengthOverflow { .. }));
    }

    /// Overlong and overflowing varints are rejected, keeping encodings
    /// canonical.
    #[test]
    fn malformed_varints_are_rejected() {
        // 0 written in two bytes.
        assert_eq!(
            Decoder::new(&[0x80, 0x00]).varint(),
            Err(DecodeError::BadVarint { offset: 0 })
        );
        // Eleven continuation bytes.
        assert!(Decoder::new(&[0xff; 11]).varint().is_err());
        // 2^64: the tenth byte carries more than one bit.
        let mut too_big = vec![0x80; 9];
        too_big.push(0x02);
        assert_eq!(
            Decoder::new(&too_big).varint(),
            Err(DecodeError::BadVarint { offset: 0 })
        );
        // A u16 field holding 70000.
        let mut enc = Encoder::new();
        enc.varint(70_000);
        assert!(u16::decode(&mut Decoder::new(&enc.into_bytes())).is_err());
    }

    /// Sets and maps must be strictly sorted; duplicates are an error, not a
    /// silent merge.
    #[test]
    fn unsorted_sets_are_rejected() {
        let mut enc = Encoder::new();
        vec![2u64, 1].encode(&mut enc);
        let bytes = enc.into_bytes();
        assert!(matches!(
            BTreeSet::<u64>::decode(&mut Decoder::new(&bytes)),
            Err(DecodeError::Invalid { .. })
        ));
        let mut enc = Encoder::new();
        vec![(1u64, 1u64), (1, 2)].encode(&mut enc);
        let bytes = enc.into_bytes();
        assert!(matches!(
            BTreeMap::<u64, u64>::decode(&mut Decoder::new(&bytes)),
            Err(DecodeError::Invalid { .. })
        ));
    }

    /// Invalid UTF-8, bad bool tags and trailing bytes each get their own
    /// error.
    #[test]
    fn typed_errors() {
        let mut enc = Encoder::new();
        enc.bytes(&[0xff, 0xfe]);
        let bytes = enc.into_bytes();
        assert_eq!(
            String::decode(&mut Decoder::new(&bytes)),
            Err(DecodeError::InvalidUtf8 { offset: 0 })
        );
        assert!(matches!(
            bool::decode(&mut Decoder::new(&[2])),
            Err(DecodeError::BadTag { what: "bool", .. })
        ));
        let mut dec = Decoder::new(&[1, 2]);
        u8::decode(&mut dec).unwrap();
        assert_eq!(
            dec.finish(),
            Err(DecodeError::TrailingBytes {
                offset: 1,
                count: 1
            })
        );
    }
}
