//! A small LZ77 compressor for byte strings inside the binary format (a
//! document's text, say), safe to decompress from untrusted input.
//!
//! The compressed form is a sequence of tokens, each a run of literal
//! bytes and then, unless the output is complete, a copy of earlier
//! output:
//!
//! ```text
//!   token   literal count (varint), the literal bytes,
//!           distance back (varint, >= 1), copy length - 4 (varint)
//! ```
//!
//! The compressor is greedy with one candidate per 4-byte hash, so it is
//! fast (a few hundred MB/s) and deterministic: equal inputs compress to
//! equal bytes, and the decompressor accepts only those bytes (it
//! compresses what it read again and compares), so the format stays
//! canonical. Copies are at most [`MAX_COPY`] bytes, so every token of
//! three bytes or more yields at most `MAX_COPY` bytes and the output can
//! be at most [`MAX_RATIO`] times the compressed size: the decompressor
//! checks the declared length against that before allocating anything.

use super::{DecodeError, Decoder, Encoder};

/// Shortest copy worth a token.
const MIN_COPY: usize = 4;

/// Longest copy, which bounds the expansion of a token.
const MAX_COPY: usize = 192;

/// The most output bytes per compressed byte (a token of three bytes
/// yields at most [`MAX_COPY`] + its literals).
pub(crate) const MAX_RATIO: usize = MAX_COPY / 3 + 1;

/// Most bits of the hash table index (a 64 KiB table); short inputs use
/// fewer, down to 6, so compressing a few bytes allocates a few bytes.
const HASH_BITS: u32 = 14;

fn word(input: &[u8], at: usize) -> u32 {
    let b = &input[at..at + 4];
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn hash(word: u32, bits: u32) -> usize {
    (word.wrapping_mul(2_654_435_761) >> (32 - bits)) as usize
}

/// How many bytes from `a` and `b` on agree, up to `max`, eight at a
/// time.
fn common(input: &[u8], a: usize, b: usize, max: usize) -> usize {
    let mut len = 0;
    while len + 8 <= max {
        let x = u64::from_le_bytes(input[a + len..a + len + 8].try_into().unwrap_or([0; 8]));
        let y = u64::from_le_bytes(input[b + len..b + len + 8].try_into().unwrap_or([0; 8]));
        if x != y {
            return len + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        len += 8;
    }
    while len < max && input[a + len] == input[b + len] {
        len += 1;
    }
    len
}

/// Where compressed tokens go: an [`Encoder`], or a [`Check`] against
/// bytes already read.
trait Sink {
    fn raw(&mut self, b: &[u8]);
    fn varint(&mut self, v: u64);
}

impl Sink for Encoder {
    fn raw(&mut self, b: &[u8]) {
        Encoder::raw(self, b);
    }
    fn varint(&mut self, v: u64) {
        Encoder::varint(self, v);
    }
}

/// Compares the numbers in the tokens the compressor emits (literal
/// counts, distances, copy lengths) with `expected`, the ones read, in
/// order. That suffices for the bytes: the literal bytes sit where equal
/// numbers put them in the output, which the reader copied them into, and
/// the decoder refuses overlong varints, so equal numbers are equal bytes.
struct Check<'a> {
    expected: &'a [u64],
    at: usize,
    same: bool,
}

impl Sink for Check<'_> {
    fn raw(&mut self, _: &[u8]) {}
    fn varint(&mut self, v: u64) {
        self.same = self.same && self.expected.get(self.at) == Some(&v);
        self.at += 1;
    }
}

/// Writes `input` compressed: its length, then the compressed bytes
/// (length-prefixed).
pub(crate) fn write(enc: &mut Encoder, input: &[u8]) {
    let mut out = Encoder::new();
    compress(input, &mut out);
    enc.length(input.len());
    enc.bytes(&out.into_bytes());
}

/// The tokens of `input` (see the module docs), into `out`.
fn compress(input: &[u8], out: &mut impl Sink) {
    let bits = (usize::BITS - input.len().leading_zeros()).clamp(6, HASH_BITS);
    let mut table = vec![u32::MAX; 1 << bits];
    let (mut i, mut literals) = (0, 0);
    let last = input.len().saturating_sub(MIN_COPY - 1);
    while i < last {
        let w = word(input, i);
        let h = hash(w, bits);
        let candidate = table[h] as usize;
        table[h] = i as u32;
        if candidate == u32::MAX as usize || word(input, candidate) != w {
            i += 1;
            continue;
        }
        let max = (input.len() - i).min(MAX_COPY);
        let len = MIN_COPY + common(input, candidate + MIN_COPY, i + MIN_COPY, max - MIN_COPY);
        out.varint((i - literals) as u64);
        out.raw(&input[literals..i]);
        out.varint((i - candidate) as u64);
        out.varint((len - MIN_COPY) as u64);
        // Only the copy's last two places are remembered (as LZ4 does):
        // hashing every place inside copies doubles the time for little.
        for j in (i + len).saturating_sub(2).max(i + 1)..(i + len).min(last) {
            table[hash(word(input, j), bits)] = j as u32;
        }
        i += len;
        literals = i;
    }
    out.varint((input.len() - literals) as u64);
    out.raw(&input[literals..]);
}

/// Reads what [`write`] wrote, and only that (see the module docs).
/// Allocates at most [`MAX_RATIO`] times the compressed bytes, checked
/// before anything is reserved.
pub(crate) fn read(dec: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
    let offset = dec.offset();
    let n = dec.varint()?;
    let packed = dec.bytes()?;
    let invalid = |what| DecodeError::Invalid { offset, what };
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= packed.len().saturating_mul(MAX_RATIO))
        .ok_or(invalid("compressed length out of proportion"))?;
    let mut out = Vec::with_capacity(n);
    let mut tokens = Decoder::new(packed);
    // The numbers read, for the canonical check (fewer than the packed
    // bytes: each takes at least one).
    let mut numbers = Vec::new();
    loop {
        let literals = tokens.length()?;
        numbers.push(literals as u64);
        if literals > n - out.len() {
            return Err(invalid("compressed bytes longer than declared"));
        }
        out.extend_from_slice(tokens.raw(literals)?);
        if out.len() == n {
            break;
        }
        let distance = tokens.varint()?;
        let copy = tokens.varint()?;
        numbers.extend([distance, copy]);
        let len = copy.saturating_add(MIN_COPY as u64);
        let start = usize::try_from(distance)
            .ok()
            .filter(|&d| d >= 1 && d <= out.len())
            .map(|d| out.len() - d)
            .ok_or(invalid("copy from before the start"))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= MAX_COPY && l <= n - out.len())
            .ok_or(invalid("copy too long"))?;
        if start + len <= out.len() {
            out.extend_from_within(start..start + len);
        } else {
            for k in 0..len {
                out.push(out[start + k]);
            }
        }
    }
    if tokens.remaining() > 0 {
        return Err(invalid("bytes after the compressed data"));
    }
    // Canonical: exactly what `write` makes of the output, so accepted
    // bytes re-encode to themselves.
    let mut check = Check {
        expected: &numbers,
        at: 0,
        same: true,
    };
    compress(&out, &mut check);
    if !check.same || check.at != numbers.len() {
        return Err(invalid("compressed bytes not in their canonical form"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(input: &[u8]) -> usize {
        let mut enc = Encoder::new();
        write(&mut enc, input);
        let bytes = enc.into_bytes();
        let mut dec = Decoder::new(&bytes);
        assert_eq!(read(&mut dec).expect("decodes"), input);
        dec.finish().expect("nothing left");
        bytes.len()
    }

    /// Text, repeats, overlapping copies, and the empty string round-trip;
    /// repetitive input shrinks, but never past the ratio bound.
    #[test]
    fn round_trips_and_shrinks() {
        assert!(round_trip(b"") <= 3);
        round_trip(b"abc");
        let prose = "the quick brown fox jumps over the lazy dog; ".repeat(40);
        assert!(round_trip(prose.as_bytes()) < prose.len() / 5);
        let same = vec![b'x'; 100_000];
        let size = round_trip(&same);
        assert!(size * MAX_RATIO >= same.len(), "{size}");
        let mut noise = Vec::new();
        let mut x = 1u64;
        for _ in 0..5000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            noise.push((x >> 56) as u8);
        }
        assert!(round_trip(&noise) <= noise.len() + noise.len() / 64 + 8);
    }

    /// Hostile input: a declared length out of proportion allocates
    /// nothing; copies from before the start, past the declared length or
    /// too long, and trailing bytes are errors.
    #[test]
    fn hostile_input_is_refused() {
        let case = |n: u64, tokens: &[u64], literal: &[u8]| {
            let mut inner = Encoder::new();
            inner.varint(tokens[0]);
            inner.raw(literal);
            for &t in &tokens[1..] {
                inner.varint(t);
            }
            let mut enc = Encoder::new();
            enc.varint(n);
            enc.bytes(&inner.into_bytes());
            let bytes = enc.into_bytes();
            read(&mut Decoder::new(&bytes))
        };
        assert!(case(1 << 40, &[1], b"a").is_err());
        assert!(case(10, &[1, 2, 0], b"a").is_err()); // copy from before the start
        assert!(case(6, &[1, 1, 10], b"a").is_err()); // past the declared length
        assert!(case(300, &[1, 1, 250], b"a").is_err()); // longer than MAX_COPY
        assert!(case(1, &[1, 0], b"a").is_err()); // trailing byte
        // Valid, but not what the compressor makes of "aaaaaa": refused.
        assert!(case(6, &[6], b"aaaaaa").is_err());
        assert_eq!(case(5, &[1, 1, 0, 0], b"a").expect("valid"), b"aaaaa");
    }
}
