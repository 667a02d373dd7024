//! The serde bridge: [`Serde<T>`] gives any `Serialize + DeserializeOwned`
//! type calm's [`Codec`], so it can be an element of calm's collections
//! without a hand-written impl.
//!
//! The format is calm's own, driven by serde: integers as (zig-zag) LEB128
//! varints, strings, byte strings, sequences and maps length-prefixed,
//! `Option` and `bool` as one tag byte, enums as a variant index, structs
//! and tuples as their fields in order (no names). Decoding goes through
//! [`Decoder`], so it has every check calm's own decoders have: a declared
//! length larger than the remaining input is refused before anything is
//! allocated, every read is bounds-checked, and nothing panics.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde::ser::{self, Serialize};

use super::{Codec, DecodeError, Decoder, Encoder};

/// A value encoded through its serde impls, so it needs no [`Codec`] of
/// its own: `OrSet<Serde<MyStruct>>` for any
/// `MyStruct: Serialize + DeserializeOwned + Ord + Clone`.
///
/// The value is written length-prefixed, in a compact serde format built
/// on calm's varints (see the [module docs](crate::codec)); decoding is as
/// strict and as bounded as calm's own decoders. Encodings are canonical
/// (equal values give equal bytes) as long as `T`'s serde impls are: a
/// `HashMap` inside `T` serializes in no fixed order.
///
/// The format is not self-describing, so `T` must not need it: no
/// `#[serde(untagged)]`, `#[serde(flatten)]` or `serde_json::Value`
/// inside. Such a value encodes, but decoding it fails with
/// [`DecodeError::Refused`] (calm's law harness, run on your type, says
/// so at once).
///
/// `Serde<T>` is transparent to serde itself, so a state holding it still
/// serializes to JSON as if it held `T`.
///
/// # Panics
///
/// Encoding panics if `T`'s own `Serialize` impl returns an error (a
/// `RefCell` already borrowed, say): that is a bug in the caller, as no
/// encoding of the value exists.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::codec::{self, Serde};
/// use calm::OrSet;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
/// enum Topping { Cheese, Olives { count: u8 } }
///
/// let mut pizza = OrSet::new();
/// pizza.insert(ReplicaId::new(1), Serde(Topping::Olives { count: 12 }));
/// pizza.insert(ReplicaId::new(1), Serde(Topping::Cheese));
///
/// let bytes = codec::to_bytes(&pizza);
/// let back: OrSet<Serde<Topping>> = codec::from_bytes(&bytes)?;
/// assert_eq!(back, pizza);
/// assert!(back.contains(&Serde(Topping::Cheese)));
/// # Ok::<(), calm::codec::DecodeError>(())
/// ```
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Serde<T>(pub T);

impl<T> Serde<T> {
    /// Returns the wrapped value.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::codec::Serde;
    ///
    /// assert_eq!(Serde("x").into_inner(), "x");
    /// ```
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Serde<T> {
    fn from(value: T) -> Self {
        Serde(value)
    }
}

impl<T> std::ops::Deref for Serde<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Serde<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: Serialize + DeserializeOwned> Codec for Serde<T> {
    fn encode(&self, enc: &mut Encoder) {
        let mut payload = Encoder::new();
        if let Err(e) = self.0.serialize(Ser { enc: &mut payload }) {
            serialize_failed(&e);
        }
        // The length prefix makes every value at least one byte (the Codec
        // contract) and bounds the value's bytes for the decoder.
        enc.bytes(&payload.into_bytes());
    }

    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let len = dec.length()?;
        let mut payload = dec.split_off(len);
        let value = T::deserialize(De { dec: &mut payload })
            .map_err(|e| e.into_decode_error(payload.offset()))?;
        payload.finish()?;
        Ok(Serde(value))
    }
}

#[cold]
#[track_caller]
fn serialize_failed(e: &SerError) -> ! {
    panic!("calm::codec::Serde: the value's Serialize impl failed: {e}")
}

/// An error raised by the encoded type's own `Serialize` impl.
#[derive(Debug)]
struct SerError(String);

impl fmt::Display for SerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SerError {}

impl ser::Error for SerError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        SerError(msg.to_string())
    }
}

/// Writes serde's data model into an [`Encoder`].
struct Ser<'a> {
    enc: &'a mut Encoder,
}

/// A sequence, tuple, map or struct being written. Sequences and maps of
/// unknown length go to a buffer first, so their length can prefix them.
struct Compound<'a> {
    /// Where the finished compound goes.
    enc: &'a mut Encoder,
    /// For an unknown length: the items written so far, and their count.
    pending: Option<(Encoder, usize)>,
}

impl<'a> Compound<'a> {
    /// Starts a compound of `len` items (`None`: not known yet), writing the
    /// length prefix now if it is known and `prefixed`.
    fn start(enc: &'a mut Encoder, len: Option<usize>, prefixed: bool) -> Self {
        match len {
            Some(n) => {
                if prefixed {
                    enc.length(n);
                }
                Self { enc, pending: None }
            }
            None => Self {
                enc,
                pending: Some((Encoder::new(), 0)),
            },
        }
    }

    /// Writes one item (a sequence element, a map key, a field).
    fn item<T: Serialize + ?Sized>(&mut self, value: &T, counts: bool) -> Result<(), SerError> {
        let target = match &mut self.pending {
            Some((buffer, count)) => {
                *count += usize::from(counts);
                buffer
            }
            None => &mut *self.enc,
        };
        value.serialize(Ser { enc: target })
    }

    /// Finishes: a buffered compound is written with its length now.
    fn end(self) -> Result<(), SerError> {
        if let Some((buffer, count)) = self.pending {
            self.enc.length(count);
            self.enc.raw(&buffer.into_bytes());
        }
        Ok(())
    }
}

impl<'a> Ser<'a> {
    /// Starts the fields of an enum variant: its index, then the fields in
    /// order (their number is fixed by the type).
    fn variant_fields(self, index: u32, len: usize) -> Compound<'a> {
        index.encode(self.enc);
        Compound::start(self.enc, Some(len), false)
    }
}

/// Writes scalars: through their [`Codec`] impl (varints, checked tags),
/// or as little-endian bytes for the types calm's codec has no impl for.
macro_rules! encode_via {
    (codec: $($c:ident($ct:ty)),*; le_bytes: $($l:ident($lt:ty)),*;) => {
        $(fn $c(self, v: $ct) -> Result<(), SerError> {
            v.encode(self.enc);
            Ok(())
        })*
        $(fn $l(self, v: $lt) -> Result<(), SerError> {
            self.enc.raw(&v.to_le_bytes());
            Ok(())
        })*
    };
}

/// Tuple and struct variants: the index, then the fields in order.
macro_rules! variant_fields {
    ($($method:ident),*) => {$(
        fn $method(
            self,
            _: &'static str,
            index: u32,
            _: &'static str,
            len: usize,
        ) -> Result<Compound<'a>, SerError> {
            Ok(self.variant_fields(index, len))
        }
    )*};
}

impl<'a> ser::Serializer for Ser<'a> {
    type Ok = ();
    type Error = SerError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    encode_via!(
        codec: serialize_bool(bool), serialize_i8(i8), serialize_i16(i16),
        serialize_i32(i32), serialize_i64(i64), serialize_u8(u8), serialize_u16(u16),
        serialize_u32(u32), serialize_u64(u64), serialize_char(char);
        le_bytes: serialize_i128(i128), serialize_u128(u128), serialize_f32(f32),
        serialize_f64(f64);
    );
    fn serialize_str(self, v: &str) -> Result<(), SerError> {
        self.enc.bytes(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), SerError> {
        self.enc.bytes(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), SerError> {
        self.enc.byte(0);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), SerError> {
        self.enc.byte(1);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), SerError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), SerError> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
    ) -> Result<(), SerError> {
        index.encode(self.enc);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), SerError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), SerError> {
        index.encode(self.enc);
        value.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a>, SerError> {
        Ok(Compound::start(self.enc, len, true))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, SerError> {
        Ok(Compound::start(self.enc, Some(len), false))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Compound<'a>, SerError> {
        Ok(Compound::start(self.enc, Some(len), false))
    }
    variant_fields!(serialize_tuple_variant, serialize_struct_variant);
    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'a>, SerError> {
        Ok(Compound::start(self.enc, len, true))
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Compound<'a>, SerError> {
        Ok(Compound::start(self.enc, Some(len), false))
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

/// The compound kinds all write their items in order; only maps count
/// entries by key rather than by item.
macro_rules! compound_impls {
    ($($trait:ident :: $method:ident ($($name:ident),*)),* $(,)?) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = SerError;
            fn $method<T: Serialize + ?Sized>(&mut self, $($name: &'static str,)* value: &T) -> Result<(), SerError> {
                $(let _ = $name;)*
                self.item(value, true)
            }
            fn end(self) -> Result<(), SerError> {
                Compound::end(self)
            }
        }
    )*};
}
compound_impls!(
    SerializeSeq::serialize_element(),
    SerializeTuple::serialize_element(),
    SerializeTupleStruct::serialize_field(),
    SerializeTupleVariant::serialize_field(),
    SerializeStruct::serialize_field(key),
    SerializeStructVariant::serialize_field(key),
);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = SerError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), SerError> {
        self.item(key, true)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        self.item(value, false)
    }
    fn end(self) -> Result<(), SerError> {
        Compound::end(self)
    }
}

/// Why a serde-driven decode failed: malformed bytes, or the type's own
/// `Deserialize` impl refusing what they hold.
#[derive(Debug)]
enum DeError {
    /// The bytes themselves are malformed.
    Decode(DecodeError),
    /// The type refused the value, with serde's message.
    Refused(String),
}

impl DeError {
    /// The [`DecodeError`] to report, `offset` being where decoding stopped.
    fn into_decode_error(self, offset: usize) -> DecodeError {
        match self {
            DeError::Decode(e) => e,
            DeError::Refused(reason) => DecodeError::Refused { offset, reason },
        }
    }
}

impl From<DecodeError> for DeError {
    fn from(e: DecodeError) -> Self {
        DeError::Decode(e)
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeError::Decode(e) => e.fmt(f),
            DeError::Refused(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        DeError::Refused(msg.to_string())
    }
}

/// Reads serde's data model from a [`Decoder`].
struct De<'d, 'a> {
    dec: &'d mut Decoder<'a>,
}

impl<'a> De<'_, 'a> {
    /// Reads a `u32` enum variant index.
    fn variant_index(&mut self) -> Result<u32, DeError> {
        Ok(u32::decode(self.dec)?)
    }

    /// A reader of `count` items, for a sequence, tuple, map or struct.
    fn items(&mut self, count: usize) -> Items<'_, 'a> {
        Items {
            dec: &mut *self.dec,
            left: count,
        }
    }
}

/// Forwards each `deserialize_*` to the value's [`Codec`] impl, which
/// checks ranges, tags and UTF-8.
macro_rules! via_codec {
    ($($method:ident => $visit:ident($t:ty)),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            visitor.$visit(<$t>::decode(self.dec)?)
        }
    )*};
}

/// Reads what [`encode_via`] wrote as little-endian bytes.
macro_rules! decode_le_bytes {
    ($($method:ident => $visit:ident($t:ty)),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            const N: usize = std::mem::size_of::<$t>();
            let mut le = [0; N];
            le.copy_from_slice(self.dec.raw(N)?);
            visitor.$visit(<$t>::from_le_bytes(le))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for De<'_, 'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, DeError> {
        Err(DeError::Refused(
            "the type needs a self-describing format (untagged or flattened serde \
             attributes, or a dynamic value), which calm's serde bridge is not"
                .to_owned(),
        ))
    }

    via_codec!(
        deserialize_bool => visit_bool(bool),
        deserialize_i8 => visit_i8(i8),
        deserialize_i16 => visit_i16(i16),
        deserialize_i32 => visit_i32(i32),
        deserialize_i64 => visit_i64(i64),
        deserialize_u8 => visit_u8(u8),
        deserialize_u16 => visit_u16(u16),
        deserialize_u32 => visit_u32(u32),
        deserialize_u64 => visit_u64(u64),
        deserialize_char => visit_char(char),
        deserialize_identifier => visit_u32(u32),
    );

    decode_le_bytes!(
        deserialize_i128 => visit_i128(i128),
        deserialize_u128 => visit_u128(u128),
        deserialize_f32 => visit_f32(f32),
        deserialize_f64 => visit_f64(f64),
    );
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let offset = self.dec.offset();
        let bytes = self.dec.bytes()?;
        let s = std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { offset })?;
        visitor.visit_borrowed_str(s)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_borrowed_bytes(self.dec.bytes()?)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_bytes(visitor)
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let offset = self.dec.offset();
        match self.dec.byte()? {
            0 => visitor.visit_none(),
            1 => visitor.visit_some(self),
            tag => Err(DecodeError::BadTag {
                offset,
                tag: u64::from(tag),
                what: "option",
            }
            .into()),
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, DeError> {
        // `length` refuses a count above the bytes left, before the visitor
        // sees it (and reserves anything from its size hint).
        let n = self.dec.length()?;
        visitor.visit_seq(self.items(n))
    }
    fn deserialize_tuple<V: Visitor<'de>>(
        mut self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_seq(self.items(len))
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        mut self,
        _: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_seq(self.items(len))
    }
    fn deserialize_map<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, DeError> {
        let n = self.dec.length()?;
        visitor.visit_map(self.items(n))
    }
    fn deserialize_struct<V: Visitor<'de>>(
        mut self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_seq(self.items(fields.len()))
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_enum(self)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_any(visitor)
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

/// `count` items in a row: a sequence's elements, a tuple's or struct's
/// fields, or a map's entries.
struct Items<'d, 'a> {
    dec: &'d mut Decoder<'a>,
    /// Items not read yet.
    left: usize,
}

impl<'a> Items<'_, 'a> {
    /// Counts one item off, or says there are none left.
    fn next(&mut self) -> Option<De<'_, 'a>> {
        self.left = self.left.checked_sub(1)?;
        Some(De {
            dec: &mut *self.dec,
        })
    }
}

impl<'de> de::SeqAccess<'de> for Items<'_, 'de> {
    type Error = DeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        self.next().map(|de| seed.deserialize(de)).transpose()
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> de::MapAccess<'de> for Items<'_, 'de> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        self.next().map(|de| seed.deserialize(de)).transpose()
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        seed.deserialize(De {
            dec: &mut *self.dec,
        })
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> de::EnumAccess<'de> for De<'_, 'de> {
    type Error = DeError;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(
        mut self,
        seed: V,
    ) -> Result<(V::Value, Self), DeError> {
        let index = self.variant_index()?;
        let value = seed.deserialize(IntoDeserializer::<DeError>::into_deserializer(index))?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for De<'_, 'de> {
    type Error = DeError;
    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(
        mut self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_seq(self.items(len))
    }
    fn struct_variant<V: Visitor<'de>>(
        mut self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_seq(self.items(fields.len()))
    }
}

#[cfg(feature = "testing")]
impl<T: proptest::arbitrary::Arbitrary + 'static> proptest::arbitrary::Arbitrary for Serde<T> {
    type Parameters = T::Parameters;
    type Strategy = proptest::strategy::Map<T::Strategy, fn(T) -> Serde<T>>;
    fn arbitrary_with(args: T::Parameters) -> Self::Strategy {
        use proptest::strategy::Strategy;
        T::arbitrary_with(args).prop_map(Serde)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    enum Shape {
        Dot,
        Circle(f64),
        Rect(u16, u16),
        Poly {
            points: Vec<(i32, i32)>,
            closed: bool,
        },
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Unit;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Everything {
        shapes: Vec<Shape>,
        label: Option<String>,
        tags: BTreeMap<String, u64>,
        big: i128,
        huge: u128,
        small: i8,
        ratio: f32,
        letter: char,
        #[serde(with = "serde_bytes_like")]
        raw: Vec<u8>,
        unit: Unit,
        nothing: (),
        nested: Option<Option<bool>>,
    }

    /// `Vec<u8>` through `serialize_bytes` rather than as a sequence.
    mod serde_bytes_like {
        pub(super) fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
        pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<u8>, D::Error> {
            struct Bytes;
            impl serde::de::Visitor<'_> for Bytes {
                type Value = Vec<u8>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                    Ok(v.to_vec())
                }
            }
            d.deserialize_bytes(Bytes)
        }
    }

    fn encode<T: Serialize + DeserializeOwned>(v: T) -> Vec<u8> {
        let mut enc = Encoder::new();
        Serde(v).encode(&mut enc);
        enc.into_bytes()
    }

    fn decode<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
        let mut dec = Decoder::new(bytes);
        let v = Serde::<T>::decode(&mut dec)?;
        dec.finish()?;
        Ok(v.0)
    }

    fn everything() -> Everything {
        Everything {
            shapes: vec![
                Shape::Dot,
                Shape::Circle(-0.5),
                Shape::Rect(3, 65535),
                Shape::Poly {
                    points: vec![(-1, 2), (i32::MAX, i32::MIN)],
                    closed: true,
                },
            ],
            label: Some("héllo".to_owned()),
            tags: [("a".to_owned(), 1), ("b".to_owned(), u64::MAX)].into(),
            big: i128::MIN,
            huge: u128::MAX,
            small: -128,
            ratio: f32::NAN,
            letter: '🌍',
            raw: vec![0, 255, 7],
            unit: Unit,
            nothing: (),
            nested: Some(None),
        }
    }

    /// Every part of serde's data model survives a round trip, and every
    /// strict prefix of the encoding is an error.
    #[test]
    fn data_model_round_trips() {
        let bytes = encode(everything());
        let back: Everything = decode(&bytes).expect("round trip");
        // NaN != NaN: compare the rest, and the float bit for bit.
        assert_eq!(back.ratio.to_bits(), f32::NAN.to_bits());
        assert_eq!(
            Everything { ratio: 0.0, ..back },
            Everything {
                ratio: 0.0,
                ..everything()
            }
        );
        assert_eq!(encode(decode::<Everything>(&bytes).expect("again")), bytes);
        for cut in 0..bytes.len() {
            assert!(decode::<Everything>(&bytes[..cut]).is_err(), "prefix {cut}");
        }
    }

    /// A sequence or map count above the bytes left is refused before the
    /// visitor sees it, even for zero-sized elements.
    #[test]
    fn hostile_lengths_are_refused() {
        for payload in [
            vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10],
            vec![5, 0],
        ] {
            let mut enc = Encoder::new();
            enc.bytes(&payload);
            let bytes = enc.into_bytes();
            let err = decode::<Vec<()>>(&bytes).expect_err("refused");
            assert!(
                matches!(err, DecodeError::LengthOverflow { offset: 1, .. }),
                "{err}"
            );
            let err = decode::<BTreeMap<u8, u8>>(&bytes).expect_err("refused");
            assert!(matches!(err, DecodeError::LengthOverflow { .. }), "{err}");
        }
    }

    /// What the type refuses, what the format cannot describe and bytes
    /// left inside the value are typed errors at absolute offsets.
    #[test]
    fn typed_errors() {
        // Variant 9 of a four-variant enum, after one byte of prefix.
        let err = decode::<Shape>(&[1, 9]).expect_err("unknown variant");
        assert!(
            matches!(err, DecodeError::Refused { offset: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("variant index"), "{err}");

        let err = decode::<serde_json::Value>(&[1, 0]).expect_err("not self-describing");
        assert!(err.to_string().contains("self-describing"), "{err}");

        let err = decode::<u8>(&[2, 7, 7]).expect_err("trailing");
        assert_eq!(
            err,
            DecodeError::TrailingBytes {
                offset: 2,
                count: 1
            }
        );

        let err = decode::<bool>(&[1, 2]).expect_err("bad bool");
        assert!(
            matches!(err, DecodeError::BadTag { offset: 1, .. }),
            "{err}"
        );
    }

    /// A sequence whose length is unknown until it ends (an iterator
    /// without an exact size) is buffered and length-prefixed like any.
    #[test]
    fn unknown_lengths_are_counted() {
        struct Evens(Vec<u32>);
        impl Serialize for Evens {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().filter(|v| *v % 2 == 0))
            }
        }
        let mut enc = Encoder::new();
        let evens = Evens((0..10).collect());
        evens.serialize(Ser { enc: &mut enc }).expect("serializes");
        let bytes = enc.into_bytes();
        let mut dec = Decoder::new(&bytes);
        let back: Vec<u32> = Vec::deserialize(De { dec: &mut dec }).expect("decodes");
        assert_eq!(back, [0, 2, 4, 6, 8]);
    }
}
