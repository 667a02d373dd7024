//! The binary form of [`TextOp`] and [`Text`] (see [`crate::codec`] for the
//! header, varints and the trust rules).
//!
//! An op is its id, a kind byte and a body: for an insertion the two
//! origins, the visible text and the hidden stretches; for a deletion its
//! targets. Ids inside a body that belong to the op's own replica are
//! written as "this replica, `k` events back", one or two bytes.
//!
//! A document is written in the layout of [`super::snapshot`] (format
//! version 2). Format version 1 wrote it as the ops that rebuild it,
//! grouped by replica, and this module still reads that:
//!
//! ```text
//!   replicas   count, ids in ascending order
//!   versions   per replica: how many events (its version vector entry)
//!   ops        per replica, counters 1, 2, ... with no gaps: each op as a
//!              kind byte and a body (its id is implicit); other replicas
//!              are named by their index in the table
//!   buffered   count, then each buffered op in full
//! ```
//!
//! Ops are maximal (no two neighbours could be joined) and in counter
//! order. Decoding replays the ops through [`Text::apply`]'s integration,
//! which checks every id, origin and target; an encoding whose ops cannot
//! all be integrated is a [`DecodeError`]. Every allocation is bounded by
//! the input: lengths are checked against the bytes left, and a long run
//! of deleted characters costs one 8-byte run however long it claims to
//! be.

use super::document::Text;
use super::leaf::char_len;
use super::op::{Content, Insertion, OpKind, Target, Targets, TextOp};
use super::snapshot;
use crate::causal::{Dot, ReplicaId};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged, tags};

/// How ids of other replicas are written inside a body.
#[derive(Clone, Copy)]
enum Names<'a> {
    /// As the replica id itself (a standalone op).
    Raw,
    /// As an index into the document's replica table.
    Table(&'a [ReplicaId]),
}

impl Names<'_> {
    fn write(self, enc: &mut Encoder, r: ReplicaId) {
        match self {
            Names::Raw => r.encode(enc),
            Names::Table(t) => enc.varint(t.partition_point(|&x| x < r) as u64),
        }
    }

    fn read(self, dec: &mut Decoder<'_>) -> Result<ReplicaId, DecodeError> {
        match self {
            Names::Raw => ReplicaId::decode(dec),
            Names::Table(t) => {
                let i = dec.varint()?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| t.get(i).copied())
                    .ok_or_else(|| dec.invalid("replica index out of range"))
            }
        }
    }
}

/// Writes an id seen from an op with id `me`: 1 and a distance back for
/// the op's own replica, 2 and the replica for another.
fn write_dot(enc: &mut Encoder, names: Names<'_>, me: Dot, d: Dot) {
    if d.replica() == me.replica() && d.counter() < me.counter() {
        enc.byte(1);
        enc.varint(me.counter() - d.counter());
    } else {
        enc.byte(2);
        names.write(enc, d.replica());
        enc.varint(d.counter());
    }
}

fn read_dot(dec: &mut Decoder<'_>, names: Names<'_>, me: Dot, tag: u8) -> Result<Dot, DecodeError> {
    let offset = dec.offset();
    match tag {
        1 => {
            let back = dec.varint()?;
            match me.counter().checked_sub(back) {
                Some(c) if back > 0 && c > 0 => Ok(Dot::new(me.replica(), c)),
                _ => Err(dec.invalid("id distance out of range")),
            }
        }
        2 => {
            let r = names.read(dec)?;
            let c = dec.varint()?;
            if r == me.replica() && c < me.counter() {
                // Must have been written as a distance.
                return Err(DecodeError::Invalid {
                    offset,
                    what: "id not in its shortest form",
                });
            }
            if c == 0 {
                return Err(dec.invalid("dot counter is zero"));
            }
            Ok(Dot::new(r, c))
        }
        tag => Err(DecodeError::BadTag {
            offset,
            tag: u64::from(tag),
            what: "text id",
        }),
    }
}

fn write_origin(enc: &mut Encoder, names: Names<'_>, me: Dot, d: Option<Dot>) {
    match d {
        None => enc.byte(0),
        Some(d) => write_dot(enc, names, me, d),
    }
}

fn read_origin(
    dec: &mut Decoder<'_>,
    names: Names<'_>,
    me: Dot,
) -> Result<Option<Dot>, DecodeError> {
    match dec.byte()? {
        0 => Ok(None),
        tag => read_dot(dec, names, me, tag).map(Some),
    }
}

/// Writes the kind and body of `op` (not its id).
fn write_body(enc: &mut Encoder, names: Names<'_>, op: &TextOp) {
    match &op.kind {
        OpKind::Insert(ins) => {
            enc.byte(0);
            write_origin(enc, names, op.id, ins.origin_left);
            write_origin(enc, names, op.id, ins.origin_right);
            enc.bytes(ins.text.as_bytes());
            enc.length(ins.hidden.len());
            let mut prev = 0;
            for &(o, l) in &ins.hidden {
                enc.varint(u64::from(o - prev));
                enc.varint(u64::from(l));
                prev = o + l;
            }
        }
        OpKind::Delete(targets) => {
            enc.byte(1);
            enc.length(targets.len());
            for t in targets {
                write_dot(enc, names, op.id, t.start);
                enc.varint(u64::from(t.len) << 1 | u64::from(t.reversed));
            }
        }
    }
}

/// Reads a kind and body for an op with id `id`, checking the op rules.
fn read_body(dec: &mut Decoder<'_>, names: Names<'_>, id: Dot) -> Result<TextOp, DecodeError> {
    let offset = dec.offset();
    let kind = match dec.byte()? {
        0 => {
            let origin_left = read_origin(dec, names, id)?;
            let origin_right = read_origin(dec, names, id)?;
            let at = dec.offset();
            let bytes = dec.bytes()?;
            // Short texts go inline without a `String` in between.
            let text = std::str::from_utf8(bytes)
                .map(Content::from)
                .map_err(|_| DecodeError::InvalidUtf8 { offset: at })?;
            let n = dec.length()?;
            let mut hidden = Vec::with_capacity(n);
            let mut prev = 0u64;
            for _ in 0..n {
                let Some(o) = prev.checked_add(dec.varint()?) else {
                    return Err(dec.invalid("hidden stretch too long"));
                };
                let l = dec.varint()?;
                let (Ok(o32), Ok(l32)) = (u32::try_from(o), u32::try_from(l)) else {
                    return Err(dec.invalid("hidden stretch too long"));
                };
                hidden.push((o32, l32));
                prev = o + l;
            }
            let len = char_len(&text) as u64 + hidden.iter().map(|h| u64::from(h.1)).sum::<u64>();
            let len = u32::try_from(len).map_err(|_| dec.invalid("insert too long"))?;
            OpKind::Insert(Insertion {
                origin_left,
                origin_right,
                len,
                text,
                hidden,
            })
        }
        1 => {
            let n = dec.length()?;
            let mut targets = Vec::with_capacity(n);
            for _ in 0..n {
                let tag = dec.byte()?;
                let start = read_dot(dec, names, id, tag)?;
                let packed = dec.varint()?;
                let len = u32::try_from(packed >> 1).map_err(|_| dec.invalid("delete too long"))?;
                targets.push(Target {
                    start,
                    len,
                    reversed: packed & 1 == 1,
                });
            }
            OpKind::Delete(Targets::from(targets))
        }
        tag => {
            return Err(DecodeError::BadTag {
                offset,
                tag: u64::from(tag),
                what: "text op kind",
            });
        }
    };
    let op = TextOp { id, kind };
    op.check()
        .map_err(|what| DecodeError::Invalid { offset, what })?;
    Ok(op)
}

impl Codec for TextOp {
    fn encode(&self, enc: &mut Encoder) {
        self.id.encode(enc);
        write_body(enc, Names::Raw, self);
    }

    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let id = Dot::decode(dec)?;
        read_body(dec, Names::Raw, id)
    }
}

impl Tagged for TextOp {
    const TAG: u8 = tags::TEXT_OP;
}

impl Codec for Text {
    fn encode(&self, enc: &mut Encoder) {
        snapshot::write(self, enc);
    }

    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        match dec.version() {
            1 => read_ops_layout(dec),
            _ => snapshot::read(dec),
        }
    }
}

/// Writes the buffered ops of `text`: their count, then each in full.
pub(super) fn write_buffered(text: &Text, enc: &mut Encoder) {
    enc.length(text.pending.iter().count());
    for op in text.pending.iter() {
        op.encode(enc);
    }
}

/// Reads what [`write_buffered`] wrote into `text`'s buffer, checking
/// that the ops are new, in order, and in their normal form.
pub(super) fn read_buffered(dec: &mut Decoder<'_>, text: &mut Text) -> Result<(), DecodeError> {
    let n = dec.length()?;
    let mut last: Option<(ReplicaId, u64)> = None;
    for _ in 0..n {
        let offset = dec.offset();
        let op = TextOp::decode(dec)?;
        let invalid = |what| DecodeError::Invalid { offset, what };
        if op.is_empty() || op.id.counter() <= text.history.known(op.replica()) {
            return Err(invalid("buffered op empty or already applied"));
        }
        let queue = text.pending.by_replica.entry(op.replica()).or_default();
        let in_order = last.is_none_or(|l| l <= (op.replica(), op.id.counter()));
        if !in_order || queue.back().is_some_and(|p| p.joins(&op)) {
            return Err(invalid(
                "buffered ops out of order, overlapping or not joined",
            ));
        }
        last = Some((op.replica(), op.end()));
        queue.push_back(op);
    }
    Ok(())
}

/// Reads a document in the layout of format version 1 (see the module
/// docs), replaying its ops.
fn read_ops_layout(dec: &mut Decoder<'_>) -> Result<Text, DecodeError> {
    let mut table = Vec::new();
    codec::decode_sorted(dec, ReplicaId::decode, |r| table.push(r))?;
    let mut known = Vec::with_capacity(table.len());
    for _ in &table {
        match dec.varint()? {
            0 => return Err(dec.invalid("replica without events")),
            k => known.push(k),
        }
    }
    let mut text = Text::default();
    let mut visible = 0usize;
    for (&r, &k) in table.iter().zip(&known) {
        let mut counter = 1;
        // The op read before, to check ops are maximal.
        let mut prev: Option<TextOp> = None;
        while counter <= k {
            let offset = dec.offset();
            let op = read_body(dec, Names::Table(&table), Dot::new(r, counter))?;
            let invalid = |what| DecodeError::Invalid { offset, what };
            if op.is_empty() || op.end() - 1 > k {
                return Err(invalid("op empty or past its replica's version"));
            }
            if prev.as_ref().is_some_and(|p| p.joins(&op)) {
                return Err(invalid("ops not joined"));
            }
            counter = op.end();
            if let OpKind::Insert(ins) = &op.kind {
                visible += char_len(&ins.text);
            }
            // An op whose dependencies are all here (every op of a
            // document with one replica) is integrated at once; the
            // others wait in the buffer, already in its normal form
            // (in counter order, not overlapping, not joinable).
            let waiting = text
                .pending
                .by_replica
                .get(&r)
                .is_some_and(|q| !q.is_empty());
            if !waiting && op.id.counter() - 1 == text.history.known(r) {
                match text.try_integrate(&op) {
                    Ok(true) => {
                        prev = Some(op);
                        continue;
                    }
                    Ok(false) => {}
                    Err(_) => return Err(invalid("op that can never be integrated")),
                }
            }
            text.pending
                .by_replica
                .entry(r)
                .or_default()
                .push_back(op.clone());
            prev = Some(op);
        }
    }
    text.drain();
    let end = dec.offset();
    let complete = table
        .iter()
        .zip(&known)
        .all(|(&r, &k)| text.history.known(r) == k);
    if !complete || !text.pending.is_empty() {
        return Err(DecodeError::Invalid {
            offset: end,
            what: "ops with missing or invalid dependencies",
        });
    }
    if text.len() != visible {
        return Err(DecodeError::Invalid {
            offset: end,
            what: "text sent for a deleted character",
        });
    }
    read_buffered(dec, &mut text)?;
    Ok(text)
}

impl Tagged for Text {
    const TAG: u8 = tags::TEXT;
}

/// serde support for the two top-level text types, through the checked
/// binary codec: the serde form is the codec's bytes (header included), so
/// input from any serde format gets the same validation as [`from_bytes`]
/// (`codec::from_bytes`).
///
/// [`from_bytes`]: crate::codec::from_bytes
macro_rules! serde_via_codec {
    ($($t:ty),*) => {$(
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&codec::to_bytes(self))
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let bytes = <Vec<u8> as serde::Deserialize>::deserialize(d)?;
                codec::from_bytes(&bytes).map_err(serde::de::Error::custom)
            }
        }
    )*};
}
serde_via_codec!(Text, TextOp);
