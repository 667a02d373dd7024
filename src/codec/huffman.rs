//! Canonical Huffman coding of byte strings inside the binary format (a
//! document's sections, the streams of its compressed text), safe to
//! decode from untrusted input.
//!
//! Each byte is coded on its own (order 0) with a prefix code built from
//! the string's byte counts, at most [`MAX_LEN`] bits per byte:
//!
//! ```text
//!   block   n << 1 | coded (varint); when not coded, the n bytes;
//!           when coded: the code, then the bits (length-prefixed bytes,
//!           least significant bit first, the last byte zero-padded)
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

/// How often each byte value occurs in `input`.
fn counts(input: &[u8]) -> [u32; 256] {
    let mut c = [0u32; 256];
    for &b in input {
        c[usize::from(b)] += 1;
    }
    c
}

/// Huffman code lengths for `counts`, limited to [`MAX_LEN`] bits and
/// fully determined by the counts (ties broken by byte value).
fn lengths(counts: &[u32; 256]) -> Lengths {
    let mut len = [0u8; 256];
    // The byte values that occur, rarest first.
    let mut leaves: Vec<u8> = (0..=255u8)
        .filter(|&b| counts[usize::from(b)] > 0)
        .collect();
    leaves.sort_by_key(|&b| (counts[usize::from(b)], b));
    match leaves[..] {
        [] => return len,
        [only] => {
            len[usize::from(only)] = 1;
            return len;
        }
        _ => {}
    }
    // Two-queue Huffman: leaves in order of weight, and internal nodes,
    // which are made in order of weight; each node remembers its parent.
    let n = leaves.len();
    let mut weight: Vec<u64> = leaves
        .iter()
        .map(|&b| u64::from(counts[usize::from(b)]))
        .collect();
    let mut parent = vec![0usize; 2 * n - 1];
    let (mut leaf, mut node) = (0, n);
    for made in n..2 * n - 1 {
        let mut pick = || {
            let take_leaf = leaf < n && (node >= made || weight[leaf] <= weight[node]);
            let i = if take_leaf { &mut leaf } else { &mut node };
            *i += 1;
            *i - 1
        };
        let (a, b) = (pick(), pick());
        weight.push(weight[a] + weight[b]);
        parent[a] = made;
        parent[b] = made;
    }
    // Depths from the root (the last node) down: parents come later.
    let mut depth = vec![0u32; 2 * n - 1];
    for i in (0..2 * n - 2).rev() {
        depth[i] = depth[parent[i]] + 1;
    }
    for (i, &b) in leaves.iter().enumerate() {
        len[usize::from(b)] = depth[i].min(MAX_LEN) as u8;
    }
    limit(&mut len, &leaves);
    len
}

/// Makes clamped lengths a complete prefix code again: while the Kraft
/// sum is over one, lengthen the rarest code that can grow; then, while
/// there is room, shorten the most frequent codes that fit.
fn limit(len: &mut Lengths, rarest_first: &[u8]) {
    let unit = |l: u8| 1u32 << (MAX_LEN - u32::from(l));
    let cap = 1u32 << MAX_LEN;
    let mut kraft: u32 = rarest_first
        .iter()
        .map(|&b| unit(len[usize::from(b)]))
        .sum();
    while kraft > cap {
        // Some code is shorter than MAX_LEN while the sum is over one:
        // 256 codes of MAX_LEN bits sum to 1/16.
        let Some(&b) = rarest_first
            .iter()
            .find(|&&b| u32::from(len[usize::from(b)]) < MAX_LEN)
        else {
            break;
        };
        let l = &mut len[usize::from(b)];
        kraft -= unit(*l + 1);
        *l += 1;
    }
    for &b in rarest_first.iter().rev() {
        let l = &mut len[usize::from(b)];
        while *l > 1 && kraft + unit(*l) <= cap {
            kraft += unit(*l);
            *l -= 1;
        }
    }
}

/// The canonical codes of `len`, bit-reversed for writing least
/// significant bit first.
fn codes(len: &Lengths) -> [u16; 256] {
    let mut per_len = [0u16; MAX_LEN as usize + 2];
    for &l in len {
        per_len[usize::from(l)] += 1;
    }
    per_len[0] = 0;
    let mut next = [0u16; MAX_LEN as usize + 2];
    let mut code = 0u16;
    for l in 1..=MAX_LEN as usize {
        code = (code + per_len[l - 1]) << 1;
        next[l] = code;
    }
    let mut out = [0u16; 256];
    for (b, &l) in len.iter().enumerate() {
        if l > 0 {
            let c = next[usize::from(l)];
            next[usize::from(l)] += 1;
            out[b] = c.reverse_bits() >> (16 - u32::from(l));
        }
    }
    out
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

/// The coded size of a string with `counts` under `len`: the code, the
/// bits' length prefix and the bits.
fn coded_size(counts: &[u32; 256], len: &Lengths) -> usize {
    let bits: u64 = counts
        .iter()
        .zip(len)
        .map(|(&c, &l)| u64::from(c) * u64::from(l))
        .sum();
    let bytes = bits.div_ceil(8) as usize;
    code_size(len) + varint_len(bytes as u64) + bytes
}

/// Writes `input` as one block (see the module docs).
pub(crate) fn write(enc: &mut Encoder, input: &[u8]) {
    let c = counts(input);
    let len = lengths(&c);
    if input.is_empty() || coded_size(&c, &len) >= input.len() {
        enc.varint((input.len() as u64) << 1);
        enc.raw(input);
        return;
    }
    enc.varint((input.len() as u64) << 1 | 1);
    let used: Vec<usize> = (0..256).filter(|&b| len[b] > 0).collect();
    enc.length(used.len());
    let mut prev = -1i32;
    for &b in &used {
        enc.varint((b as i32 - prev - 1) as u64);
        prev = b as i32;
    }
    for pair in used.chunks(2) {
        let high = pair.get(1).map_or(0, |&b| len[b] << 4);
        enc.byte(len[pair[0]] | high);
    }
    let code = codes(&len);
    let mut bits = Vec::with_capacity(coded_size(&c, &len));
    let (mut acc, mut n) = (0u64, 0u32);
    for &b in input {
        acc |= u64::from(code[usize::from(b)]) << n;
        n += u32::from(len[usize::from(b)]);
        if n >= 32 {
            bits.extend_from_slice(&(acc as u32).to_le_bytes());
            acc >>= 32;
            n -= 32;
        }
    }
    bits.extend_from_slice(&acc.to_le_bytes()[..n.div_ceil(8) as usize]);
    enc.bytes(&bits);
}

/// Reads what [`write`] wrote, and only that (see the module docs).
pub(crate) fn read(dec: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
    let offset = dec.offset();
    let invalid = |what| DecodeError::Invalid { offset, what };
    let head = dec.varint()?;
    let n = usize::try_from(head >> 1).map_err(|_| invalid("block too long"))?;
    if head & 1 == 0 {
        let out = dec.raw(n)?.to_vec();
        let c = counts(&out);
        if !out.is_empty() && coded_size(&c, &lengths(&c)) < n {
            return Err(invalid("block not coded where coding is shorter"));
        }
        return Ok(out);
    }
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
    let bits = dec.bytes()?;
    if n > bits.len().saturating_mul(8) {
        return Err(invalid("more bytes declared than the bits can hold"));
    }
    let out = decode(&len, bits, n).ok_or(invalid("coded bits do not decode"))?;
    // Canonical: the code is the one the counts give, coding was the
    // shorter choice, and the bits end in the last byte.
    let c = counts(&out);
    if lengths(&c) != len || coded_size(&c, &len) >= n {
        return Err(invalid("coded block not in its canonical form"));
    }
    Ok(out)
}

/// Decodes `n` bytes from `bits` under the code `len`, or `None` if the
/// bits hold an unused code, run short, or do not end in their last
/// byte with zero padding.
fn decode(len: &Lengths, bits: &[u8], n: usize) -> Option<Vec<u8>> {
    let code = codes(len);
    let width = u32::from(*len.iter().max()?);
    // Entry: the byte value and its code length (past any bit count
    // where no code is there).
    let mut table = vec![u16::MAX; 1 << width];
    for (b, &l) in len.iter().enumerate() {
        if l > 0 {
            let step = 1usize << l;
            for i in (usize::from(code[b])..table.len()).step_by(step) {
                table[i] = b as u16 | u16::from(l) << 8;
            }
        }
    }
    let mask = (1u64 << width) - 1;
    let mut out = vec![0u8; n];
    // `acc` holds `have` unread bits (and possibly, above them, bits of
    // the byte at `at`, which the next refill ORs in again unchanged).
    let (mut acc, mut have, mut at) = (0u64, 0u32, 0usize);
    let mut total = 0usize;
    // Four codes of at most MAX_LEN bits fit in the 56 bits or more a
    // refill leaves, unless the input ends (then every bit is loaded).
    for chunk in out.chunks_mut(4) {
        if let Some(word) = bits.get(at..at + 8) {
            acc |= u64::from_le_bytes(word.try_into().ok()?) << have;
            at += ((63 - have) / 8) as usize;
            have |= 56;
        } else {
            while have <= 56 && at < bits.len() {
                acc |= u64::from(bits[at]) << have;
                at += 1;
                have += 8;
            }
        }
        for slot in chunk {
            let entry = table[(acc & mask) as usize];
            let l = u32::from(entry >> 8);
            if l > have {
                return None;
            }
            *slot = entry as u8;
            acc >>= l;
            have -= l;
            total += l as usize;
        }
    }
    // The bits end in the last byte, and its unused high bits are zero.
    let last = bits.last().map_or(0, |&b| u32::from(b) >> (total % 8));
    (total.div_ceil(8) == bits.len() && (total % 8 == 0 || last == 0)).then_some(out)
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
