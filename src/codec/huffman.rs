//! Canonical Huffman coding of byte strings inside the binary format (a
//! document's sections, the streams of its compressed text), safe to
//! decode from untrusted input.
//!
//! Each byte is coded on its own (order 0) with a prefix code built from
//! the string's byte counts, at most [`MAX_LEN`] bits per byte:
//!
//! ```text
//!   block   n << 1 | coded (varint); when not coded, the n bytes;
//!           when coded: the code, then four bit streams (byte i of the
//!           string coded in stream i % 4), each length-prefixed bytes,
//!           least significant bit first, the last byte zero-padded
//!   code    how many byte values occur (varint, >= 1); per value, in
//!           increasing order, its distance from the previous one
//!           (varint; the first from -1); then their code lengths, four
//!           bits each, two to a byte
//! ```
//!
//! Codes are canonical (equal lengths take consecutive codes in byte
//! order), and the lengths are a deterministic function of the counts, so
//! equal strings code to equal bytes. A block is coded exactly when that
//! is shorter than the string itself. The decoder accepts only what the
//! encoder writes: it rebuilds the lengths from the counts of what it
//! decoded and compares, checks the choice between coded and plain, and
//! refuses padding that is not zero, so accepted bytes re-encode to
//! themselves. It allocates at most eight bytes per coded byte read (a
//! code is at least one bit long), checked before anything is reserved.

use super::{DecodeError, Decoder, Encoder};

/// The longest code, in bits: it bounds the decoding table (2^12
/// entries) and fits the four bits the code lengths are written in.
const MAX_LEN: u32 = 12;

/// Code lengths per byte value (0: the value does not occur).
type Lengths = [u8; 256];

/// How often each byte value occurs in `input` (a long one in four
/// tables, so that runs of one value do not wait on one counter; clearing
/// them costs more than that saves on a short one).
fn counts(input: &[u8]) -> [u32; 256] {
    if input.len() < 1024 {
        let mut c = [0u32; 256];
        for &b in input {
            c[usize::from(b)] += 1;
        }
        return c;
    }
    let mut c = [[0u32; 256]; 4];
    let mut quads = input.chunks_exact(4);
    for q in &mut quads {
        for (table, &b) in c.iter_mut().zip(q) {
            table[usize::from(b)] += 1;
        }
    }
    for &b in quads.remainder() {
        c[0][usize::from(b)] += 1;
    }
    std::array::from_fn(|b| c.iter().map(|t| t[b]).sum())
}

/// Huffman code lengths for `counts`, limited to [`MAX_LEN`] bits and
/// fully determined by the counts (ties broken by byte value).
fn lengths(counts: &[u32; 256]) -> Lengths {
    lengths_among(counts, 0..=u8::MAX)
}

/// [`lengths`], for counts that are zero but at byte values among
/// `candidates` (distinct values): a decoder knows which values its code
/// can make, and passing them spares a scan of all 256.
fn lengths_among(counts: &[u32; 256], candidates: impl IntoIterator<Item = u8>) -> Lengths {
    let mut len = [0u8; 256];
    // The byte values that occur, rarest first (sorted as count << 8 | b),
    // gathered without branching: which values occur is data, and a
    // branch on it mispredicts.
    let mut all = [0u64; 256];
    let mut n = 0;
    for b in candidates {
        let c = counts[usize::from(b)];
        all[n] = u64::from(c) << 8 | u64::from(b);
        n += usize::from(c > 0);
    }
    let keys = &mut all[..n];
    keys.sort_unstable();
    match *keys {
        [] => return len,
        [only] => {
            len[usize::from(only as u8)] = 1;
            return len;
        }
        _ => {}
    }
    // Two-queue Huffman: leaves in order of weight, and internal nodes,
    // which are made in order of weight; each node remembers its parent.
    let mut weight = [0u64; 511];
    for (w, k) in weight.iter_mut().zip(keys.iter()) {
        *w = k >> 8;
    }
    let mut parent = [0u16; 511];
    let (mut leaf, mut node) = (0, n);
    for made in n..2 * n - 1 {
        let mut kids = [0usize; 2];
        for kid in &mut kids {
            if leaf < n && (node >= made || weight[leaf] <= weight[node]) {
                *kid = leaf;
                leaf += 1;
            } else {
                *kid = node;
                node += 1;
            }
        }
        weight[made] = weight[kids[0]] + weight[kids[1]];
        parent[kids[0]] = made as u16;
        parent[kids[1]] = made as u16;
    }
    // Depths from the root (the last node) down, each node's written over
    // its parent's index once read: parents come later.
    let depth = &mut parent[..2 * n - 1];
    depth[2 * n - 2] = 0;
    for i in (0..2 * n - 2).rev() {
        depth[i] = depth[usize::from(depth[i])] + 1;
    }
    for (&d, &k) in depth.iter().zip(keys.iter()) {
        len[usize::from(k as u8)] = d.min(MAX_LEN as u16) as u8;
    }
    limit(&mut len, keys);
    len
}

/// Makes clamped lengths a complete prefix code again: while the Kraft
/// sum is over one, lengthen the rarest code that can grow; then, while
/// there is room, shorten the most frequent codes that fit. `keys` are
/// the byte values in their low eight bits, rarest first.
fn limit(len: &mut Lengths, keys: &[u64]) {
    let unit = |l: u8| 1u32 << (MAX_LEN - u32::from(l));
    let cap = 1u32 << MAX_LEN;
    let value = |k: u64| usize::from(k as u8);
    let mut kraft: u32 = keys.iter().map(|&k| unit(len[value(k)])).sum();
    // The rarest code shorter than MAX_LEN only moves towards the more
    // frequent (a code at MAX_LEN stays there), so one cursor finds it.
    // While the sum is over one, some code is shorter than MAX_LEN: 256
    // codes of MAX_LEN bits sum to 1/16.
    let mut next = 0;
    while kraft > cap && next < keys.len() {
        let l = &mut len[value(keys[next])];
        if u32::from(*l) == MAX_LEN {
            next += 1;
            continue;
        }
        kraft -= unit(*l + 1);
        *l += 1;
    }
    for &k in keys.iter().rev() {
        let l = &mut len[value(k)];
        while *l > 1 && kraft + unit(*l) <= cap {
            kraft += unit(*l);
            *l -= 1;
        }
    }
}

/// The canonical codes of `len`, bit-reversed for writing least
/// significant bit first; `values` are the byte values with a code, in
/// increasing order.
fn codes(len: &Lengths, values: &[u8]) -> [u16; 256] {
    let mut per_len = [0u16; MAX_LEN as usize + 1];
    for &b in values {
        per_len[usize::from(len[usize::from(b)])] += 1;
    }
    let mut next = [0u16; MAX_LEN as usize + 1];
    let mut code = 0u16;
    for l in 1..=MAX_LEN as usize {
        code = (code + per_len[l - 1]) << 1;
        next[l] = code;
    }
    let mut out = [0u16; 256];
    for &b in values {
        let l = len[usize::from(b)];
        let c = next[usize::from(l)];
        next[usize::from(l)] += 1;
        out[usize::from(b)] = c.reverse_bits() >> (16 - u32::from(l));
    }
    out
}

/// The byte values with a code under `len`, in increasing order.
fn coded_values(len: &Lengths) -> Vec<u8> {
    (0..=u8::MAX).filter(|&b| len[usize::from(b)] > 0).collect()
}

/// The bytes the code takes (see the module docs).
fn code_size(len: &Lengths) -> usize {
    let mut size = 0;
    let (mut used, mut prev) = (0usize, -1i32);
    for (b, &l) in len.iter().enumerate() {
        if l > 0 {
            size += varint_len((b as i32 - prev - 1) as u64);
            prev = b as i32;
            used += 1;
        }
    }
    size + varint_len(used as u64) + used.div_ceil(2)
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// How many bit streams a block's bytes are dealt to, in turn (byte `i`
/// to stream `i % STREAMS`), so that decoding runs that many independent
/// chains of table lookups at once.
const STREAMS: usize = 4;

/// The fewest bytes a coded block takes: the code (how many values, one
/// value, its length) and each stream's length. A block no longer than
/// this is never coded.
const MIN_CODED: usize = 3 + STREAMS;

/// How many bits each stream takes for `input` under `len`.
fn stream_bits(input: &[u8], len: &Lengths) -> [u64; STREAMS] {
    let mut bits = [0u64; STREAMS];
    for group in input.chunks(STREAMS) {
        for (b, &x) in bits.iter_mut().zip(group) {
            *b += u64::from(len[usize::from(x)]);
        }
    }
    bits
}

/// The coded size of a block whose streams take `bytes`: the code, then
/// each stream length-prefixed.
fn coded_size(len: &Lengths, bytes: impl Iterator<Item = usize>) -> usize {
    code_size(len) + bytes.map(|n| varint_len(n as u64) + n).sum::<usize>()
}

/// `input` coded under `len`, dealt to the streams.
fn encode(input: &[u8], len: &Lengths, values: &[u8]) -> [Vec<u8>; STREAMS] {
    let code = codes(len, values);
    // Code and length in one word: one load per byte.
    let entry: [u32; 256] = std::array::from_fn(|b| u32::from(code[b]) | u32::from(len[b]) << 16);
    std::array::from_fn(|s| {
        let mut out = Vec::with_capacity(input.len() / STREAMS + 8);
        let (mut acc, mut have) = (0u64, 0u32);
        for &x in input.iter().skip(s).step_by(STREAMS) {
            let e = entry[usize::from(x)];
            acc |= u64::from(e & 0xffff) << have;
            have += e >> 16;
            if have >= 32 {
                out.extend_from_slice(&(acc as u32).to_le_bytes());
                acc >>= 32;
                have -= 32;
            }
        }
        out.extend_from_slice(&acc.to_le_bytes()[..have.div_ceil(8) as usize]);
        out
    })
}

/// Writes `input` as one block (see the module docs).
pub(crate) fn write(enc: &mut Encoder, input: &[u8]) {
    let len = lengths(&counts(input));
    let values = coded_values(&len);
    let streams = (!input.is_empty()).then(|| encode(input, &len, &values));
    match streams.filter(|s| coded_size(&len, s.iter().map(Vec::len)) < input.len()) {
        Some(streams) => write_coded(enc, input.len(), &len, &values, &streams),
        None => {
            enc.varint((input.len() as u64) << 1);
            enc.raw(input);
        }
    }
}

/// Writes a coded block of `n` bytes: its code and `streams`.
fn write_coded(
    enc: &mut Encoder,
    n: usize,
    len: &Lengths,
    values: &[u8],
    streams: &[Vec<u8>; STREAMS],
) {
    enc.varint((n as u64) << 1 | 1);
    enc.length(values.len());
    let mut prev = -1i32;
    for &b in values {
        enc.varint((i32::from(b) - prev - 1) as u64);
        prev = i32::from(b);
    }
    for pair in values.chunks(2) {
        let high = pair.get(1).map_or(0, |&b| len[usize::from(b)] << 4);
        enc.byte(len[usize::from(pair[0])] | high);
    }
    for s in streams {
        enc.bytes(s);
    }
}

/// Reads what [`write`] wrote, and only that (see the module docs),
/// appending the bytes to `out`; returns how many.
pub(crate) fn read_into(dec: &mut Decoder<'_>, out: &mut Vec<u8>) -> Result<usize, DecodeError> {
    let offset = dec.offset();
    let invalid = |what| DecodeError::Invalid { offset, what };
    let head = dec.varint()?;
    let n = usize::try_from(head >> 1).map_err(|_| invalid("block too long"))?;
    if head & 1 == 0 {
        let plain = dec.raw(n)?;
        if n > MIN_CODED {
            let len = lengths(&counts(plain));
            let bits = stream_bits(plain, &len);
            if coded_size(&len, bits.iter().map(|b| b.div_ceil(8) as usize)) < n {
                return Err(invalid("block not coded where coding is shorter"));
            }
        }
        out.extend_from_slice(plain);
        return Ok(n);
    }
    let code_at = dec.offset();
    let used = dec.length()?;
    if used == 0 || used > 256 {
        return Err(invalid("coded block with no or too many byte values"));
    }
    let mut values = Vec::with_capacity(used);
    let mut prev = -1i64;
    for _ in 0..used {
        let gap = dec.varint()?;
        let b = i64::try_from(gap).map_or(256, |g| prev + 1 + g);
        if b > 255 {
            return Err(invalid("byte value out of range"));
        }
        values.push(b as u8);
        prev = b;
    }
    let mut len: Lengths = [0; 256];
    let packed = dec.raw(used.div_ceil(2))?;
    for (i, &b) in values.iter().enumerate() {
        let l = packed[i / 2] >> (4 * (i % 2)) & 15;
        if l == 0 || u32::from(l) > MAX_LEN {
            return Err(invalid("code length out of range"));
        }
        len[usize::from(b)] = l;
    }
    if used % 2 == 1 && packed[used / 2] >> 4 != 0 {
        return Err(invalid("code lengths padded with other than zero"));
    }
    let kraft: u32 = values
        .iter()
        .map(|&b| 1u32 << (MAX_LEN - u32::from(len[usize::from(b)])))
        .sum();
    if kraft > 1 << MAX_LEN {
        return Err(invalid("code lengths over-subscribed"));
    }
    let mut streams = [&[][..]; STREAMS];
    for s in &mut streams {
        *s = dec.bytes()?;
    }
    let stored: usize = streams.iter().map(|s| s.len()).sum();
    if n > stored.saturating_mul(8) {
        return Err(invalid("more bytes declared than the bits can hold"));
    }
    let start = out.len();
    out.resize(start + n, 0);
    let decoded = decode(&len, &values, streams, &mut out[start..]);
    // Canonical: the code is the one the counts give, coding was the
    // shorter choice (the code and streams took the bytes read since
    // `code_at`, every varint among them minimal), and each stream ends
    // in its last byte.
    let canonical = decoded.is_some()
        && dec.offset() - code_at < n
        && lengths_among(&counts(&out[start..]), values.iter().copied()) == len;
    if !canonical {
        out.truncate(start);
        return Err(invalid(if decoded.is_some() {
            "coded block not in its canonical form"
        } else {
            "coded bits do not decode"
        }));
    }
    Ok(n)
}

/// One stream being decoded.
#[derive(Clone, Copy)]
struct Bits<'a> {
    bits: &'a [u8],
    /// `have` unread bits (and possibly, above them, bits of the byte at
    /// `at`, which the next refill ORs in again unchanged).
    acc: u64,
    have: u32,
    /// The bytes loaded so far (`at * 8 - have` bits were decoded).
    at: usize,
}

impl<'a> Bits<'a> {
    fn new(bits: &'a [u8]) -> Self {
        Self {
            bits,
            acc: 0,
            have: 0,
            at: 0,
        }
    }

    /// Loads bits until at least 56 are unread or the input ends: four
    /// codes of at most [`MAX_LEN`] bits always fit unless it ended.
    #[inline]
    fn refill(&mut self) {
        if let Some(word) = self.bits.get(self.at..self.at + 8) {
            let word = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
            self.acc |= word << self.have;
            self.at += ((63 - self.have) / 8) as usize;
            self.have |= 56;
        } else {
            while self.have <= 56 && self.at < self.bits.len() {
                self.acc |= u64::from(self.bits[self.at]) << self.have;
                self.at += 1;
                self.have += 8;
            }
        }
    }

    /// The next byte, or `None` at an unused code or past the end.
    #[inline]
    fn take(&mut self, table: &[u16], mask: usize) -> Option<u8> {
        let entry = table[(self.acc as usize) & mask];
        let l = u32::from(entry >> 8);
        if l > self.have {
            return None;
        }
        self.acc >>= l;
        self.have -= l;
        Some(entry as u8)
    }

    /// Whether the bits ended in the last byte, its unused high bits zero.
    fn ended(&self) -> bool {
        let total = self.at * 8 - self.have as usize;
        let last = self.bits.last().map_or(0, |&b| u32::from(b) >> (total % 8));
        self.at == self.bits.len() && self.have < 8 && (total % 8 == 0 || last == 0)
    }
}

/// Decodes `out.len()` bytes from `streams` under the code `len`, or
/// `None` if the bits hold an unused code, run short, or do not end in
/// their last byte with zero padding.
fn decode(len: &Lengths, values: &[u8], streams: [&[u8]; STREAMS], out: &mut [u8]) -> Option<()> {
    let code = codes(len, values);
    // Entry: the byte value and its code length (past any bit count
    // where no code is there), at every index whose low bits are a code;
    // indexed by as many bits as the longest code has (a table of 256
    // entries for most text, not the 4096 of the longest codes).
    let width = values
        .iter()
        .map(|&b| len[usize::from(b)])
        .max()
        .unwrap_or(0);
    let used = 1usize << width;
    let mut table = vec![u16::MAX; used];
    for &b in values {
        let l = len[usize::from(b)];
        for i in (usize::from(code[usize::from(b)])..used).step_by(1 << l) {
            table[i] = u16::from(b) | u16::from(l) << 8;
        }
    }
    let mask = used - 1;
    // As long as the mask allows, so indices masked by it need no check.
    let table = &table[..=mask];
    let mut bits = streams.map(Bits::new);
    let mut chunks = out.chunks_exact_mut(4 * STREAMS);
    for chunk in &mut chunks {
        for b in &mut bits {
            b.refill();
        }
        for k in 0..4 {
            for s in 0..STREAMS {
                chunk[k * STREAMS + s] = bits[s].take(table, mask)?;
            }
        }
    }
    for b in &mut bits {
        b.refill();
    }
    for (i, slot) in chunks.into_remainder().iter_mut().enumerate() {
        *slot = bits[i % STREAMS].take(table, mask)?;
    }
    bits.iter().all(Bits::ended).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dec: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::new();
        read_into(dec, &mut out).map(|_| out)
    }

    fn round_trip(input: &[u8]) -> usize {
        crate::codec::round_trip_bytes(write, read, input)
    }

    fn noise(n: usize) -> Vec<u8> {
        let mut x = 1u64;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (x >> 56) as u8
            })
            .collect()
    }

    /// Skewed bytes shrink, uniform ones stay plain (one byte more), and
    /// the empty string and one repeated byte round-trip.
    #[test]
    fn round_trips_and_shrinks() {
        assert_eq!(round_trip(b""), 1);
        assert_eq!(round_trip(b"ab"), 3);
        assert!(round_trip(&[7; 1000]) < 140);
        let prose = "the quick brown fox jumps over the lazy dog; ".repeat(40);
        assert!(round_trip(prose.as_bytes()) < prose.len() * 6 / 10);
        let n = noise(5000);
        assert_eq!(round_trip(&n), n.len() + 2);
    }

    /// Counts from a Fibonacci sequence give a Huffman tree deeper than
    /// [`MAX_LEN`]; the limited code is still a complete prefix code.
    #[test]
    fn deep_trees_are_limited() {
        let mut input = Vec::new();
        let (mut a, mut b) = (1usize, 1usize);
        for v in 0..20u8 {
            input.extend(std::iter::repeat_n(v, a));
            (a, b) = (b, a + b);
        }
        let len = lengths(&counts(&input));
        assert_eq!(len.iter().map(|&l| u32::from(l)).max(), Some(MAX_LEN));
        let kraft: u32 = len
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1 << (MAX_LEN - u32::from(l)))
            .sum();
        assert_eq!(kraft, 1 << MAX_LEN);
        round_trip(&input);
    }

    /// Every block the encoder would not write is refused: a plain block
    /// that coding would shrink, a declared length the bits cannot hold,
    /// an over-subscribed or non-canonical code, a code never assigned,
    /// and bits or padding left over.
    #[test]
    fn non_canonical_and_hostile_blocks_are_refused() {
        let read_all = |bytes: &[u8]| {
            let mut dec = Decoder::new(bytes);
            read(&mut dec).and_then(|out| dec.finish().map(|()| out))
        };
        let mut plain = Encoder::new();
        plain.varint(1000 << 1);
        plain.raw(&[7; 1000]);
        assert!(read_all(&plain.into_bytes()).is_err());
        // Short blocks: plain is accepted exactly when the writer leaves
        // it plain (one value repeated is coded from 12 bytes on).
        for n in 0..40 {
            let input = vec![7; n];
            let mut plain = Encoder::new();
            plain.varint((n as u64) << 1);
            plain.raw(&input);
            let plain = plain.into_bytes();
            let mut written = Encoder::new();
            write(&mut written, &input);
            let kept_plain = written.into_bytes() == plain;
            assert_eq!(kept_plain, n < 12, "{n} bytes");
            assert_eq!(read_all(&plain).is_ok(), kept_plain, "{n} bytes");
        }
        // Short blocks coded anyway: accepted exactly when coding is
        // shorter, which is when the writer codes them.
        for n in 1..40 {
            let input: Vec<u8> = (0..n).map(|i| [7, 7, 7, 9][i % 4]).collect();
            let len = lengths(&counts(&input));
            let values = coded_values(&len);
            let mut coded = Encoder::new();
            write_coded(&mut coded, n, &len, &values, &encode(&input, &len, &values));
            let coded = coded.into_bytes();
            let mut written = Encoder::new();
            write(&mut written, &input);
            let kept_coded = written.into_bytes() == coded;
            assert_eq!(kept_coded, coded.len() < n + 1, "{n} bytes");
            assert_eq!(read_all(&coded).is_ok(), kept_coded, "{n} bytes");
        }
        // "aab" coded: a = 0 (one bit), b = 1.
        let block = |n: u64, lens: u8, bits: &[u8]| {
            let mut enc = Encoder::new();
            enc.varint(n << 1 | 1);
            enc.length(2);
            enc.varint(u64::from(b'a'));
            enc.varint(0);
            enc.byte(lens);
            enc.bytes(bits);
            enc.into_bytes()
        };
        // Valid in form but not shorter than the three plain bytes.
        assert!(read_all(&block(3, 0x11, &[0b100])).is_err());
        assert!(read_all(&block(1 << 40, 0x11, &[0b100])).is_err());
        assert!(read_all(&block(3, 0x12, &[0b100])).is_err());
        let mut dec_bytes = block(3, 0x11, &[0b100]);
        dec_bytes.push(0);
        assert!(read_all(&dec_bytes).is_err());
        let mut over = Encoder::new();
        over.varint(64 << 1 | 1);
        over.length(3);
        for v in [0, 0, 0] {
            over.varint(v);
        }
        over.raw(&[0x11, 0x01]);
        over.bytes(&[0; 8]);
        assert!(read_all(&over.into_bytes()).is_err());
        // A longer run of a's and b's, coded, with a trailing byte of bits
        // or non-zero padding.
        let input = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaab";
        let mut enc = Encoder::new();
        write(&mut enc, input);
        let good = enc.into_bytes();
        assert_eq!(read_all(&good).expect("valid"), input);
        let mut padded = good.clone();
        *padded.last_mut().expect("bits") |= 0x80;
        assert!(read_all(&padded).is_err());
    }
}
