//! A small LZ77 compressor for byte strings inside the binary format (a
//! document's text, say), safe to decompress from untrusted input.
//!
//! The compressor turns its input into tokens, each a run of literal
//! bytes and then, unless the output is complete, a copy of earlier
//! output (a distance back, >= 1, and a length of at least
//! [`MIN_COPY`]). The tokens are written as five byte streams, each
//! Huffman-coded on its own ([`huffman`]), because each kind of number
//! has its own distribution and text's letters are far from uniform:
//!
//! ```text
//!   compressed   the output's length (varint), then five blocks:
//!     counts     each token's literal count (varints)
//!     literals   the literal bytes, in order
//!     low        each copy's distance, its low eight bits
//!     high       each copy's distance shifted right eight (varints)
//!     copies     each copy's length - 5 (varints)
//! ```
//!
//! The compressor is greedy with one candidate per 4-byte hash (taken
//! when at least [`MIN_COPY`] bytes match), so it is fast (a few hundred
//! MB/s) and deterministic: equal inputs compress to
//! equal bytes, and the decompressor accepts only those bytes (it
//! replays the compressor's hash table along what it read, and each
//! stream is canonical), so the format stays canonical. As in LZ4, a
//! stretch without copies is probed more and more sparsely (the step
//! grows by one every 32 probes that find nothing), so incompressible
//! bytes (random letters, say) cost the compressor and that check a few
//! hundred probes per 4 KiB instead of one per byte, for about 0.1–0.4%
//! more bytes on real text. Copies are at most
//! [`MAX_COPY`] bytes and every copy takes at least one byte of the
//! decoded `copies` stream, so the declared length is checked against the
//! streams before the output is allocated.
//!
//! Format version 3 probed every place; [`read`] checks its bytes against
//! that rule. Format version 2 wrote the tokens as they are, without
//! entropy coding, with copies of four bytes or more; [`read_version_2`]
//! still reads it.

use super::{DecodeError, Decoder, Encoder, huffman};

/// Shortest copy worth a token: literals are entropy-coded, so a token
/// (four numbers) pays only for copies of five bytes or more.
const MIN_COPY: usize = 5;

/// Shortest copy in format version 2, whose literals were written plain.
const MIN_COPY_V2: usize = 4;

/// In a stretch without copies, the step between probed places grows by
/// one after every `1 << SKIP` probes that found none (format version 4).
const SKIP: u32 = 5;

/// How a format version's compressor parses its input; the decoder
/// accepts only the tokens its version's rule makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    /// The shortest copy taken.
    min: usize,
    /// Whether the step between probes grows in a stretch without copies
    /// (as LZ4's does), so that incompressible bytes cost few probes.
    accelerate: bool,
}

impl Rule {
    /// Format version 2: copies of four bytes, every place probed.
    const V2: Self = Self {
        min: MIN_COPY_V2,
        accelerate: false,
    };
    /// Format version 3: copies of five bytes, every place probed.
    const V3: Self = Self {
        min: MIN_COPY,
        accelerate: false,
    };
    /// Format version 4 (written now): copies of five bytes, probes
    /// spreading out in stretches without copies.
    const V4: Self = Self {
        min: MIN_COPY,
        accelerate: true,
    };

    /// The step to the next probe after `misses` probes without a copy
    /// since the last copy (or the start).
    fn step(self, misses: usize) -> usize {
        if self.accelerate {
            1 + (misses >> SKIP)
        } else {
            1
        }
    }
}

/// Longest copy, which bounds the expansion of a token.
const MAX_COPY: usize = 192;

/// The most output bytes per compressed byte in format version 2 (a
/// token of three bytes yields at most [`MAX_COPY`] + its literals).
const MAX_RATIO: usize = MAX_COPY / 3 + 1;

/// Most bits of the hash table index (a 64 KiB table); short inputs use
/// fewer, down to 6, so compressing a few bytes allocates a few bytes.
const HASH_BITS: u32 = 14;

fn word(input: &[u8], at: usize) -> u32 {
    let b = &input[at..at + 4];
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The eight bytes of `input` from `at` (`at + 8 <= input.len()`), as
/// one little-endian word.
fn word8(input: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(input[at..at + 8].try_into().unwrap_or([0; 8]))
}

fn hash(word: u32, bits: u32) -> usize {
    (word.wrapping_mul(2_654_435_761) >> (32 - bits)) as usize
}

/// How many bytes from `a` and `b` on agree, up to `max`, eight at a
/// time.
fn common(input: &[u8], a: usize, b: usize, max: usize) -> usize {
    let mut len = 0;
    while len + 8 <= max {
        let (x, y) = (word8(input, a + len), word8(input, b + len));
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

/// Where the compressor's tokens go (each a run of literal bytes, then a
/// copy, distance back and length, which only the last token lacks).
trait Sink {
    fn token(&mut self, literals: &[u8], copy: Option<(usize, usize)>);
}

/// The tokens as five byte streams, each Huffman-coded on its own (see
/// the module docs).
#[derive(Default)]
struct Streams {
    counts: Encoder,
    literals: Vec<u8>,
    low: Vec<u8>,
    high: Encoder,
    copies: Encoder,
}

impl Sink for Streams {
    fn token(&mut self, literals: &[u8], copy: Option<(usize, usize)>) {
        self.counts.varint(literals.len() as u64);
        self.literals.extend_from_slice(literals);
        if let Some((distance, len)) = copy {
            self.low.push(distance as u8);
            self.high.varint((distance >> 8) as u64);
            self.copies.varint((len - MIN_COPY) as u64);
        }
    }
}

/// Writes `input` compressed: its length, then the five coded streams.
pub(crate) fn write(enc: &mut Encoder, input: &[u8]) {
    let mut streams = Streams::default();
    compress(input, Rule::V4, &mut streams);
    enc.length(input.len());
    huffman::write(enc, &streams.counts.into_bytes());
    huffman::write(enc, &streams.literals);
    huffman::write(enc, &streams.low);
    huffman::write(enc, &streams.high.into_bytes());
    huffman::write(enc, &streams.copies.into_bytes());
}

/// How many bits index the hash table for an input of `n` bytes.
fn table_bits(n: usize) -> u32 {
    (usize::BITS - n.leading_zeros()).clamp(6, HASH_BITS)
}

/// Remembers the places of a copy of `len` bytes at `at` that the
/// compressor hashes: only its last two (as LZ4 does), since hashing
/// every place inside copies doubles the time for little.
fn remember_tail(input: &[u8], table: &mut [u32], bits: u32, at: usize, len: usize, last: usize) {
    for j in (at + len).saturating_sub(2).max(at + 1)..(at + len).min(last) {
        table[hash(word(input, j), bits)] = j as u32;
    }
}

/// The tokens `rule` makes of `input` (see the module docs), into `out`.
fn compress(input: &[u8], rule: Rule, out: &mut impl Sink) {
    let bits = table_bits(input.len());
    let mut table = vec![u32::MAX; 1 << bits];
    let (mut i, mut literals, mut misses) = (0, 0, 0);
    let last = input.len().saturating_sub(3);
    while i < last {
        let w = word(input, i);
        let h = hash(w, bits);
        let candidate = table[h] as usize;
        table[h] = i as u32;
        let len = if candidate == u32::MAX as usize || word(input, candidate) != w {
            0
        } else {
            let max = (input.len() - i).min(MAX_COPY);
            4 + common(input, candidate + 4, i + 4, max - 4)
        };
        if len < rule.min {
            i += rule.step(misses);
            misses += 1;
            continue;
        }
        out.token(&input[literals..i], Some((i - candidate, len)));
        remember_tail(input, &mut table, bits, i, len, last);
        i += len;
        literals = i;
        misses = 0;
    }
    out.token(&input[literals..], None);
}

/// Tokens read back from the input, one at a time: the coded streams, or
/// the plain tokens of format version 2.
trait Source<'a> {
    /// The next token's literal bytes.
    fn literals(&mut self) -> Result<&'a [u8], DecodeError>;
    /// The next token's copy: its distance back and its length.
    fn copy(&mut self) -> Result<(u64, u64), DecodeError>;
    /// Whether every token was read.
    fn done(&self) -> bool;
}

/// The five streams of the coded form.
#[derive(Clone)]
struct Coded<'a> {
    counts: Decoder<'a>,
    literals: Decoder<'a>,
    low: std::slice::Iter<'a, u8>,
    high: Decoder<'a>,
    copies: Decoder<'a>,
}

impl<'a> Source<'a> for Coded<'a> {
    fn literals(&mut self) -> Result<&'a [u8], DecodeError> {
        let count = self.counts.varint()?;
        self.literals
            .raw(usize::try_from(count).unwrap_or(usize::MAX))
    }

    fn copy(&mut self) -> Result<(u64, u64), DecodeError> {
        let low = self
            .low
            .next()
            .ok_or(self.high.invalid("distance missing"))?;
        let distance = self
            .high
            .varint()?
            .checked_mul(256)
            .map_or(u64::MAX, |d| d | u64::from(*low));
        Ok((
            distance,
            self.copies.varint()?.saturating_add(MIN_COPY as u64),
        ))
    }

    fn done(&self) -> bool {
        self.low.len() == 0
            && [&self.counts, &self.literals, &self.high, &self.copies]
                .iter()
                .all(|d| d.remaining() == 0)
    }
}

/// The tokens of format version 2, as they are.
#[derive(Clone)]
struct Plain<'a>(Decoder<'a>);

impl<'a> Source<'a> for Plain<'a> {
    fn literals(&mut self) -> Result<&'a [u8], DecodeError> {
        let count = self.0.length()?;
        self.0.raw(count)
    }

    fn copy(&mut self) -> Result<(u64, u64), DecodeError> {
        let distance = self.0.varint()?;
        Ok((
            distance,
            self.0.varint()?.saturating_add(MIN_COPY_V2 as u64),
        ))
    }

    fn done(&self) -> bool {
        self.0.remaining() == 0
    }
}

/// Whether the compressor, probing from `start` with no copy found while
/// its probe is before `end` (at most the input's length less three),
/// would have started a copy at any probe under `rule`; enters each probe
/// in `table` as it does, and returns with that the place of its next
/// probe.
fn would_copy(
    input: &[u8],
    table: &mut [u32],
    bits: u32,
    start: usize,
    end: usize,
    rule: Rule,
) -> (bool, usize) {
    if !rule.accelerate {
        let end = end.max(start);
        return (probe_each(input, table, bits, start..end, rule.min), end);
    }
    let (mut found, mut p, mut misses) = (false, start, 0);
    while p < end {
        // The probes up to the next change of step, or to `end`.
        let step = rule.step(misses);
        let count = (end - p)
            .div_ceil(step)
            .min((1 << SKIP) - misses % (1 << SKIP));
        if step == 1 {
            found |= probe_each(input, table, bits, p..p + count, rule.min);
        } else {
            for q in (p..).step_by(step).take(count) {
                found |= probe(input, table, bits, q, rule.min);
            }
        }
        p += count * step;
        misses += count;
    }
    (found, p)
}

/// Whether the compressor, probing every place `at` (each before the
/// input's last three bytes) without a copy, would have started one at
/// any of them with copies of at least `min` (at most 8) bytes; enters
/// each place in `table` as it does. Without branching: in text a slot
/// often holds a place whose first four bytes agree and whose fifth does
/// not, which a branch would mispredict. Where eight bytes can be read,
/// the `min` bytes at both places are compared as one masked word.
fn probe_each(
    input: &[u8],
    table: &mut [u32],
    bits: u32,
    at: std::ops::Range<usize>,
    min: usize,
) -> bool {
    let n = input.len();
    let mask = u64::MAX >> (64 - 8 * min);
    let wide = at.end.min(n.saturating_sub(7)).max(at.start);
    let mut found = false;
    // Every eight bytes from each place before `wide` (none if `wide` is
    // the start: the range may then reach past the end).
    let eights = input.get(at.start..wide + 7).unwrap_or(&[]).windows(8);
    for (p, eight) in (at.start..wide).zip(eights) {
        let w = u64::from_le_bytes(eight.try_into().unwrap_or([0; 8]));
        let candidate = std::mem::replace(&mut table[hash(w as u32, bits)], p as u32);
        // An empty slot reads `p` itself, masked out below.
        let c = if candidate == u32::MAX {
            p
        } else {
            candidate as usize
        };
        found |= (candidate != u32::MAX) & ((word8(input, c) ^ w) & mask == 0);
    }
    for p in wide..at.end {
        found |= probe(input, table, bits, p, min);
    }
    found
}

/// [`probe_each`] for the one place `p`, of any width.
fn probe(input: &[u8], table: &mut [u32], bits: u32, p: usize, min: usize) -> bool {
    let n = input.len();
    let w = word(input, p);
    let candidate = std::mem::replace(&mut table[hash(w, bits)], p as u32);
    let c = if candidate == u32::MAX {
        p
    } else {
        candidate as usize
    };
    let mut same = word(input, c) == w;
    for k in 4..min {
        same &= input[(c + k).min(n - 1)] == input[(p + k).min(n - 1)];
    }
    (candidate != u32::MAX) & (n - p >= min) & same
}

/// Whether `tokens` (each its literal count, distance and copy length,
/// 0 and 0 for the last) are exactly those [`compress`] makes of `input`
/// under `rule`, where `input` is what the tokens
/// expand to. It replays the compressor's hash table along the tokens
/// instead of compressing again: in a stretch of literals it only notes,
/// without branching, whether the compressor would have found a copy
/// anywhere, and at a copy it checks the compressor's candidate and that
/// the match ends where the copy does. A copy's bytes equal those
/// `distance` back (the tokens made them so), so only the byte after it
/// needs comparing. Equal tokens are equal bytes: the literal bytes sit
/// where the tokens put them in the output, and the decoder refuses
/// overlong varints.
fn canonical(input: &[u8], tokens: &[[u32; 3]], rule: Rule) -> bool {
    let n = input.len();
    let bits = table_bits(n);
    let mut table = vec![u32::MAX; 1 << bits];
    let last = n.saturating_sub(3);
    let mut i = 0;
    for (t, &[count, distance, len]) in tokens.iter().enumerate() {
        let (start, count, distance, len) = (i, count as usize, distance as usize, len as usize);
        let copy = start + count;
        let (found, next) = would_copy(input, &mut table, bits, start, copy.min(last), rule);
        if found {
            return false;
        }
        if len == 0 {
            return t + 1 == tokens.len() && copy == n && distance == 0;
        }
        if copy >= last || next != copy || distance == 0 || distance > copy {
            return false;
        }
        let h = hash(word(input, copy), bits);
        let candidate = table[h] as usize;
        table[h] = copy as u32;
        let max = (n - copy).min(MAX_COPY);
        if candidate != copy - distance
            || len < rule.min
            || len > max
            || (len < max && input[candidate + len] == input[copy + len])
        {
            return false;
        }
        remember_tail(input, &mut table, bits, copy, len, last);
        i = copy + len;
    }
    false
}

/// The `n` bytes `tokens` make, if they are exactly the tokens
/// [`compress`] makes of them under `rule`, so
/// that accepted bytes re-encode to themselves. `most` bounds how many
/// tokens there can be.
fn expand<'a>(
    mut read: impl Source<'a>,
    n: usize,
    rule: Rule,
    most: usize,
) -> Result<Vec<u8>, &'static str> {
    // The output, with a margin that copies write past their end into.
    let mut out = vec![0u8; n + WILD];
    let mut at = 0;
    let mut tokens: Vec<[u32; 3]> = Vec::with_capacity(most);
    loop {
        let literals = read.literals().map_err(|_| "tokens cut short")?;
        if literals.len() > n - at {
            return Err("compressed bytes longer than declared");
        }
        out[at..at + literals.len()].copy_from_slice(literals);
        at += literals.len();
        if at == n {
            tokens.push([literals.len() as u32, 0, 0]);
            break;
        }
        let (distance, len) = read.copy().map_err(|_| "tokens cut short")?;
        at = copy_back(&mut out, at, distance, len, n)?;
        // Both fit: a copy is at most MAX_COPY long, from inside `out`.
        tokens.push([literals.len() as u32, distance as u32, len as u32]);
    }
    if !read.done() {
        return Err("compressed tokens longer than their output");
    }
    out.truncate(n);
    if canonical(&out, &tokens, rule) {
        Ok(out)
    } else {
        Err("compressed bytes not in their canonical form")
    }
}

/// Reads what [`write`] wrote, and only that (see the module docs), or
/// what it wrote in format version 3 when `dec` reads that version.
/// Allocates at most [`MAX_COPY`] output bytes per coded copy length and
/// one per literal, checked before anything is reserved.
pub(crate) fn read(dec: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
    let offset = dec.offset();
    let invalid = |what| DecodeError::Invalid { offset, what };
    let n = usize::try_from(dec.varint()?)
        .map_err(|_| invalid("compressed length out of proportion"))?;
    // The five streams, decoded into one buffer, in order.
    let mut buf = Vec::new();
    let mut ends = [0usize; 5];
    for end in &mut ends {
        huffman::read_into(dec, &mut buf)?;
        *end = buf.len();
    }
    let [counts, literals, low, high, copies] =
        std::array::from_fn(|i| &buf[if i == 0 { 0 } else { ends[i - 1] }..ends[i]]);
    if n > literals
        .len()
        .saturating_add(copies.len().saturating_mul(MAX_COPY))
    {
        return Err(invalid("compressed length out of proportion"));
    }
    let tokens = Coded {
        counts: Decoder::new(counts),
        literals: Decoder::new(literals),
        low: low.iter(),
        high: Decoder::new(high),
        copies: Decoder::new(copies),
    };
    let rule = if dec.version() >= 4 {
        Rule::V4
    } else {
        Rule::V3
    };
    expand(tokens, n, rule, counts.len()).map_err(invalid)
}

/// Bytes past the output's end that [`copy_back`] may write.
const WILD: usize = 16;

/// Writes the copy of `len` bytes from `distance` back at `at` in `out`
/// (`n` bytes of output, then [`WILD`] spare), which must stay within the
/// `n`; returns where the copy ends. A copy from at least [`WILD`] bytes
/// back goes [`WILD`] bytes at a time, its last piece writing past its end
/// (what the next token writes there replaces it).
fn copy_back(
    out: &mut [u8],
    at: usize,
    distance: u64,
    len: u64,
    n: usize,
) -> Result<usize, &'static str> {
    let start = usize::try_from(distance)
        .ok()
        .filter(|&d| d >= 1 && d <= at)
        .map(|d| at - d)
        .ok_or("copy from before the start")?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= MAX_COPY && l <= n - at)
        .ok_or("copy too long")?;
    if at - start >= WILD {
        for k in (0..len).step_by(WILD) {
            out.copy_within(start + k..start + k + WILD, at + k);
        }
    } else {
        for k in 0..len {
            out[at + k] = out[start + k];
        }
    }
    Ok(at + len)
}

/// Reads a string compressed in format version 2, whose tokens were
/// written as they are: the output's length, then the tokens
/// (length-prefixed), each its literal count (varint), its literal
/// bytes, and unless last its distance and copy length - 4 (varints).
/// Allocates at most [`MAX_RATIO`] times the compressed bytes.
pub(crate) fn read_version_2(dec: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
    let offset = dec.offset();
    let n = dec.varint()?;
    let packed = dec.bytes()?;
    let invalid = |what| DecodeError::Invalid { offset, what };
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= packed.len().saturating_mul(MAX_RATIO))
        .ok_or(invalid("compressed length out of proportion"))?;
    expand(Plain(Decoder::new(packed)), n, Rule::V2, packed.len()).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(input: &[u8]) -> usize {
        crate::codec::round_trip_bytes(write, read, input)
    }

    /// Text, repeats, overlapping copies, and the empty string round-trip;
    /// repetitive input shrinks.
    #[test]
    fn round_trips_and_shrinks() {
        assert_eq!(round_trip(b""), 7);
        round_trip(b"abc");
        let prose = "the quick brown fox jumps over the lazy dog; ".repeat(40);
        assert!(round_trip(prose.as_bytes()) < prose.len() / 10);
        let same = vec![b'x'; 100_000];
        let size = round_trip(&same);
        assert!(size < same.len() / 200, "{size}");
        let mut noise = Vec::new();
        let mut x = 1u64;
        for _ in 0..5000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            noise.push((x >> 56) as u8);
        }
        assert!(round_trip(&noise) <= noise.len() + noise.len() / 64 + 8);
    }

    /// The coded form built by hand: the declared length, and each
    /// stream's bytes (numbers as varints).
    fn coded(
        n: u64,
        counts: &[u64],
        literals: &[u8],
        distances: &[u64],
        copies: &[u64],
    ) -> Vec<u8> {
        let varints = |v: &mut dyn Iterator<Item = u64>| {
            let mut e = Encoder::new();
            v.for_each(|x| e.varint(x));
            e.into_bytes()
        };
        let mut enc = Encoder::new();
        enc.varint(n);
        huffman::write(&mut enc, &varints(&mut counts.iter().copied()));
        huffman::write(&mut enc, literals);
        let low: Vec<u8> = distances.iter().map(|&d| d as u8).collect();
        huffman::write(&mut enc, &low);
        huffman::write(&mut enc, &varints(&mut distances.iter().map(|&d| d >> 8)));
        huffman::write(&mut enc, &varints(&mut copies.iter().copied()));
        enc.into_bytes()
    }

    /// The tokens as [`canonical`] takes them.
    impl Sink for Vec<[u32; 3]> {
        fn token(&mut self, literals: &[u8], copy: Option<(usize, usize)>) {
            let (distance, len) = copy.unwrap_or((0, 0));
            self.push([literals.len(), distance, len].map(|x| x as u32));
        }
    }

    /// The bytes `tokens` make, their literals the bytes of `fill` at the
    /// same places (`b'z'` past its end), or `None` if they would make
    /// more than one byte past `fill`, a copy reaches before the start or
    /// past [`MAX_COPY`], or a token but the last has no copy.
    fn expand_tokens(tokens: &[[u32; 3]], fill: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for (t, &[count, distance, len]) in tokens.iter().enumerate() {
            if out.len() + count as usize + len as usize > fill.len() + 1 {
                return None;
            }
            for _ in 0..count {
                out.push(fill.get(out.len()).copied().unwrap_or(b'z'));
            }
            if len == 0 {
                return (t + 1 == tokens.len() && distance == 0).then_some(out);
            }
            let (distance, len) = (distance as usize, len as usize);
            if distance == 0 || distance > out.len() || len > MAX_COPY {
                return None;
            }
            for _ in 0..len {
                out.push(out[out.len() - distance]);
            }
        }
        None
    }

    /// `canonical` accepts the compressor's own tokens and nothing else:
    /// on inputs with short and long repeats, and on long stretches of
    /// random letters where version 4's probes spread out, under each
    /// version's rule, a token list that differs from the compressor's in
    /// one number is accepted only where it is what the compressor makes
    /// of the bytes it makes (one token fewer is refused), and so are the
    /// other rules' tokens wherever they differ.
    #[test]
    fn canonical_accepts_exactly_the_compressors_tokens() {
        let mut x = 7u64;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let rules = [Rule::V2, Rule::V3, Rule::V4];
        let (mut checked, mut refused, mut spread) = (0, 0, 0);
        for round in 0..300 {
            let (len, letters): (usize, &[u8]) = match round % 3 {
                0 => (next(400) as usize, b"ab"),
                1 => (next(400) as usize, b"ab cd"),
                _ => (next(1500) as usize, b"abcdefghijklmnopqrstuvwxyz"),
            };
            let mut input: Vec<u8> = Vec::with_capacity(len);
            while input.len() < len {
                let repeat = if round % 3 == 2 { 60 } else { 3 };
                if input.len() > 8 && next(repeat) == 0 {
                    let back = 1 + next(input.len() as u64) as usize;
                    let from = input.len() - back;
                    for k in 0..(3 + next(12) as usize) {
                        input.push(input[from + k % back]);
                    }
                } else {
                    input.push(letters[next(letters.len() as u64) as usize]);
                }
            }
            let tokens = |rule| {
                let mut t = Vec::new();
                compress(&input, rule, &mut t);
                t
            };
            spread += usize::from(tokens(Rule::V3) != tokens(Rule::V4));
            for rule in rules {
                let own = tokens(rule);
                assert!(canonical(&input, &own, rule), "round {round}, {rule:?}");
                for other in rules.map(tokens) {
                    assert_eq!(canonical(&input, &other, rule), other == own);
                }
                assert!(!canonical(&input, &own[..own.len() - 1], rule));
                for t in 0..own.len() {
                    for f in 0..3 {
                        for d in [1, u32::MAX] {
                            let mut changed = own.clone();
                            changed[t][f] = changed[t][f].wrapping_add(d);
                            // What the changed tokens make (its literals
                            // taken from the input), if they make anything:
                            // accepted exactly when they are its own tokens.
                            if let Some(out) = expand_tokens(&changed, &input) {
                                let mut theirs = Vec::new();
                                compress(&out, rule, &mut theirs);
                                let accepted = canonical(&out, &changed, rule);
                                assert_eq!(accepted, theirs == changed, "round {round}");
                                checked += 1;
                                refused += usize::from(!accepted);
                            }
                        }
                    }
                }
            }
        }
        assert!(
            refused > 50_000 && checked - refused > 1_000 && spread > 50,
            "{checked} {refused} {spread}"
        );
    }

    /// Hostile coded input: a declared length the streams cannot make
    /// allocates nothing; copies from before the start or too long,
    /// streams with numbers left over, and a parse the compressor would
    /// not make are errors.
    #[test]
    fn hostile_coded_input_is_refused() {
        let read_all = |bytes: &[u8]| {
            let mut dec = Decoder::new(bytes);
            read(&mut dec).and_then(|out| dec.finish().map(|()| out))
        };
        assert!(read_all(&coded(1 << 40, &[1], b"a", &[], &[])).is_err());
        assert!(read_all(&coded(10, &[1, 0], b"a", &[2], &[5])).is_err());
        assert!(read_all(&coded(300, &[1, 0], b"a", &[1], &[250])).is_err());
        assert!(read_all(&coded(1, &[1], b"a", &[1], &[])).is_err());
        assert!(read_all(&coded(1, &[1, 0], b"a", &[], &[])).is_err());
        assert!(read_all(&coded(8, &[8], b"aaaaaaaa", &[], &[])).is_err());
        assert_eq!(
            read_all(&coded(6, &[1, 0], b"a", &[1], &[0])).expect("valid"),
            b"aaaaaa"
        );
        assert!(read_all(&coded(600, &[1, 0], b"a", &[1 << 60], &[0])).is_err());
    }

    /// Hostile input in format version 2: a declared length out of
    /// proportion allocates nothing; copies from before the start, past
    /// the declared length or too long, and trailing bytes are errors.
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
            read_version_2(&mut Decoder::new(&bytes))
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
