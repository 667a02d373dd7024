//! Runs and leaves: the bottom level of the run tree.
//!
//! A [`Run`] is a stretch of items (characters) that sit next to each other
//! in the document, carry consecutive local versions, and are either all
//! visible or all deleted. It is eight bytes, however many characters it
//! covers: this is where the "no object per character" rule is kept.
//!
//! A [`Leaf`] holds up to [`MAX_RUNS`] runs in document order and, next to
//! them, the UTF-8 text of its visible runs in one `String`. Keeping the text
//! in the leaf means one descent of the tree finds both the metadata and the
//! bytes of a position, instead of a CRDT walk plus a separate rope walk.
//!
//! ```text
//!   runs:  [lv 0..5 "hello"] [lv 5..6 deleted] [lv 9..15 " world"]
//!   text:  "hello world"          (deleted runs own no text)
//!   chars: 11, utf16: 11
//! ```

use std::cell::Cell;

use super::{NONE, reserve_lean};

/// Most runs a leaf holds before it is split in two.
///
/// Small enough that inserting into a leaf (a `Vec` shift of at most
/// 512 bytes) stays cheap, large enough that the tree stays shallow: with a
/// typical 3 to 5 characters per run, a 100,000-character document needs a
/// few hundred leaves.
pub(crate) const MAX_RUNS: usize = 64;

/// Most text bytes a leaf holds before it is split (unless it holds a single
/// character). Bounds the cost of the `String` shift on every insert.
pub(crate) const MAX_BYTES: usize = 2048;

/// Fewest runs a leaf's run list grows by when it is full. A split leaves
/// room for 40 runs, so one step takes a leaf past [`MAX_RUNS`]: one
/// reallocation between splits instead of four. That matters where the
/// allocator is slow, as in a long-running process's fragmented heap
/// (sveltecomponent's replay after 100,000 scattered frees: 1.65 ms with
/// steps of 8, 1.50 ms with 32; 1.35 and 1.32 ms on a fresh heap), for
/// 2-5% more memory kept.
const RUNS_STEP: usize = 32;

/// Bytes beyond the inserted text a leaf's text grows by when it is full.
const TEXT_STEP: usize = 64;

/// The top bit of [`Run::len`] marks a deleted run.
const DELETED: u32 = 1 << 31;

/// Consecutive items with consecutive local versions `lv .. lv + len`, all
/// visible or all deleted.
///
/// Lengths stay below 2^31 because the whole document is capped at
/// [`super::MAX_ITEMS`] items, so the top bit of the length field is free to
/// hold the deleted flag.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    /// Local version of the first item.
    pub(crate) lv: u32,
    /// Number of items, with [`DELETED`] or-ed in for a deleted run.
    packed: u32,
}

impl Run {
    /// A run of `len` items starting at `lv`.
    pub(crate) fn new(lv: u32, len: u32, deleted: bool) -> Self {
        debug_assert!(len > 0 && len < DELETED);
        Self {
            lv,
            packed: len | if deleted { DELETED } else { 0 },
        }
    }

    /// Number of items.
    pub(crate) fn len(self) -> u32 {
        self.packed & !DELETED
    }

    /// Whether the items are deleted (tombstones).
    pub(crate) fn deleted(self) -> bool {
        self.packed & DELETED != 0
    }

    /// Number of visible characters: the length, or 0 when deleted.
    pub(crate) fn visible(self) -> u32 {
        if self.deleted() { 0 } else { self.len() }
    }

    /// One past the last local version.
    pub(crate) fn end(self) -> u32 {
        self.lv + self.len()
    }

    /// Whether `lv` is one of this run's items.
    pub(crate) fn contains(self, lv: u32) -> bool {
        lv >= self.lv && lv < self.end()
    }

    /// The same run with a new length.
    pub(crate) fn with_len(self, len: u32) -> Self {
        Self::new(self.lv, len, self.deleted())
    }

    /// Splits at `at` items (`0 < at < len`), returning both halves.
    pub(crate) fn split(self, at: u32) -> (Self, Self) {
        debug_assert!(at > 0 && at < self.len());
        let d = self.deleted();
        (
            Self::new(self.lv, at, d),
            Self::new(self.lv + at, self.len() - at, d),
        )
    }

    /// Whether `next` can be appended to this run as one run.
    pub(crate) fn joins(self, next: Self) -> bool {
        self.end() == next.lv && self.deleted() == next.deleted()
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = if self.deleted() { "x" } else { "" };
        write!(f, "{}{}..{}", mark, self.lv, self.end())
    }
}

/// Up to [`MAX_RUNS`] runs in document order and the text of the visible
/// ones.
///
/// Invariants: `text` is exactly the concatenated content of the visible
/// runs, in order; `chars` is their total length (the number of `char`s in
/// `text`); `utf16` is the UTF-16 length of `text`. A leaf is never empty
/// unless it is the only leaf of an empty document.
#[derive(Clone, Debug, Default)]
pub(crate) struct Leaf {
    /// The runs, in document order.
    pub(crate) runs: Vec<Run>,
    /// The visible characters of `runs`, in order.
    pub(crate) text: String,
    /// Number of visible characters (`text.chars().count()`).
    pub(crate) chars: usize,
    /// UTF-16 length of `text`.
    pub(crate) utf16: usize,
    /// The internal node above, or [`NONE`] when this leaf is the root.
    pub(crate) parent: u32,
    /// This leaf's index among its parent's children (kept up to date so
    /// walks to the root need no search).
    pub(crate) slot: u8,
    /// The previous leaf in document order, or [`NONE`].
    pub(crate) prev: u32,
    /// The next leaf in document order, or [`NONE`].
    pub(crate) next: u32,
    /// A character offset in `text` and its byte offset, where the last
    /// lookup or edit was: edits cluster, so [`Leaf::byte_of`] counts
    /// from here when it is nearer than an end. Whatever changes `text`
    /// before it must move it (or reset it to the start).
    pub(crate) mark: Cell<(u32, u32)>,
    /// A lower bound of the depths (see
    /// [`History::depth`](super::history::History::depth)) of the items
    /// here; 0 says nothing. Raised by a search that found nothing this
    /// shallow here, reset by an insert (splits keep it: it bounds both
    /// halves).
    pub(crate) floor: u32,
}

impl Leaf {
    /// Inserts `run` at run index `at`, growing the run list a few runs at
    /// a time (see [`reserve_lean`]).
    pub(crate) fn insert_run(&mut self, at: usize, run: Run) {
        reserve_lean(&mut self.runs, 1, RUNS_STEP);
        self.runs.insert(at, run);
    }

    /// Inserts `runs` at run index `at`, moving the runs after it once.
    pub(crate) fn insert_runs(&mut self, at: usize, runs: [Run; 2]) {
        reserve_lean(&mut self.runs, runs.len(), RUNS_STEP);
        self.runs.splice(at..at, runs);
    }

    /// Inserts `text` at byte `byte` of the leaf's text, growing it by a
    /// little more than `text` when it lacks room.
    #[inline]
    pub(crate) fn insert_text(&mut self, byte: usize, text: &str) {
        if self.text.capacity() - self.text.len() < text.len() {
            self.text.reserve_exact(text.len() + TEXT_STEP);
        }
        self.text.insert_str(byte, text);
    }

    /// An empty root leaf.
    pub(crate) fn root() -> Self {
        Self {
            runs: Vec::new(),
            parent: NONE,
            prev: NONE,
            next: NONE,
            ..Self::default()
        }
    }

    /// The byte offset of the `chars`-th visible character of this leaf.
    ///
    /// ASCII-only leaves (the common case: bytes == chars) answer in O(1),
    /// and so does the mark (where the last edit was, so typing on counts
    /// nothing); otherwise characters are counted a block of bytes at a
    /// time from the nearest of the leaf's ends and its mark, and the mark
    /// moves here.
    #[inline]
    pub(crate) fn byte_of(&self, chars: usize) -> usize {
        if self.text.len() == self.chars {
            return chars;
        }
        let (mc, mb) = self.mark.get();
        if chars == mc as usize {
            // Typing on where the last edit was.
            return mb as usize;
        }
        self.count_to_byte(chars)
    }

    /// [`Leaf::byte_of`] in text that is not ASCII, away from the mark.
    #[inline(never)]
    fn count_to_byte(&self, chars: usize) -> usize {
        // Count from the nearest of the start, the mark and the end.
        let (mc, mb) = self.mark.get();
        let (mc, mb) = (mc as usize, mb as usize);
        let byte = if chars >= mc {
            if chars - mc <= self.chars - chars {
                mb + byte_at(&self.text[mb..], chars - mc)
            } else {
                byte_from_end(&self.text, self.chars - chars)
            }
        } else if chars <= mc - chars {
            byte_at(&self.text, chars)
        } else {
            byte_from_end(&self.text[..mb], mc - chars)
        };
        self.mark.set((chars as u32, byte as u32));
        byte
    }

    /// Whether the leaf must be split.
    pub(crate) fn overfull(&self) -> bool {
        self.runs.len() > MAX_RUNS || (self.text.len() > MAX_BYTES && self.chars > 1)
    }
}

/// The UTF-16 length of `s`: one unit per character, two for characters
/// outside the Basic Multilingual Plane (exactly those whose UTF-8 form
/// starts with a byte `>= 0xF0`).
pub(crate) fn utf16_len(s: &str) -> usize {
    utf16_len_of(s, char_len(s))
}

/// [`utf16_len`] of `s`, which holds `chars` characters: `chars` without
/// reading `s` when each is one byte (ASCII).
pub(crate) fn utf16_len_of(s: &str, chars: usize) -> usize {
    if s.len() == chars {
        chars
    } else {
        chars + count_bytes(s.as_bytes(), |b| b >= 0xF0)
    }
}

/// The top bit of each byte of a word.
const HIGH: u64 = 0x8080_8080_8080_8080;
/// The bottom bit of each byte of a word.
const LOW: u64 = 0x0101_0101_0101_0101;

/// Up to eight bytes as one little-endian word, the missing ones filled
/// with `0x80` (a continuation byte, so they start no character).
fn word_of(bytes: &[u8]) -> u64 {
    let mut word = [0x80u8; 8];
    if let Ok(all) = <[u8; 8]>::try_from(bytes) {
        word = all;
    } else {
        for (w, b) in word.iter_mut().zip(bytes) {
            *w = *b;
        }
    }
    u64::from_le_bytes(word)
}

/// Up to eight bytes as one little-endian word in reverse order (the
/// last byte lowest), the missing ones filled with `0x80`.
fn word_back(bytes: &[u8]) -> u64 {
    if bytes.len() == 8 {
        return word_of(bytes).swap_bytes();
    }
    let mut word = [0x80u8; 8];
    for (w, b) in word.iter_mut().zip(bytes.iter().rev()) {
        *w = *b;
    }
    u64::from_le_bytes(word)
}

/// One bit at the bottom of each byte of `word` that continues a
/// character (`10xxxxxx`: its top bit set and the next one clear).
fn continuations(word: u64) -> u64 {
    (word & !(word << 1) & HIGH) >> 7
}

/// The sum of the bytes of `lanes` (at most 255 in all), in one multiply
/// where `count_ones` would be a dozen instructions on targets without a
/// `popcnt` instruction (the default x86-64 one).
fn lane_sum(lanes: u64) -> usize {
    (lanes.wrapping_mul(LOW) >> 56) as usize
}

/// How many bytes of `block` (a multiple of eight bytes long, at most 248)
/// start a character.
fn starts_in(block: &[u8]) -> usize {
    let lanes: u64 = block
        .chunks_exact(8)
        .map(|c| continuations(word_of(c)))
        .sum();
    block.len() - lane_sum(lanes)
}

/// The byte index in `word` of its `n`-th (from 0) character start, if it
/// has more than `n`, found without a branch per byte: multiplying the
/// start bits by [`LOW`] leaves in each byte the starts up to it, and a
/// subtraction per byte finds the first of those past `n`.
fn nth_start(word: u64, n: usize) -> Option<usize> {
    if n >= 8 {
        return None;
    }
    let starts = (continuations(word) ^ LOW).wrapping_mul(LOW);
    // Each byte of `starts | HIGH` is at least 128, so none borrows.
    let past = (starts | HIGH).wrapping_sub((n as u64 + 1) * LOW) & HIGH;
    (past != 0).then(|| past.trailing_zeros() as usize / 8)
}

/// Bytes counted at once while the wanted character is further on.
const BLOCK: usize = 32;

/// The byte offset of character `chars` of `s` (`s.len()` if `s` has no
/// more), counting 32 and then eight bytes at a time.
pub(crate) fn byte_at(s: &str, chars: usize) -> usize {
    let bytes = s.as_bytes();
    let (mut at, mut left) = (0, chars);
    while at + BLOCK <= bytes.len() {
        let n = starts_in(&bytes[at..at + BLOCK]);
        if n > left {
            break;
        }
        left -= n;
        at += BLOCK;
    }
    while at < bytes.len() {
        let word = word_of(&bytes[at..bytes.len().min(at + 8)]);
        if let Some(i) = nth_start(word, left) {
            return at + i;
        }
        left -= 8 - lane_sum(continuations(word));
        at += 8;
    }
    bytes.len()
}

/// The byte offset where the last `chars` characters of `s` start (0 if
/// `s` has no more), counting 32 and then eight bytes at a time from the
/// end.
fn byte_from_end(s: &str, chars: usize) -> usize {
    let bytes = s.as_bytes();
    let (mut end, mut left) = (bytes.len(), chars);
    if left == 0 {
        return end;
    }
    while end >= BLOCK {
        let n = starts_in(&bytes[end - BLOCK..end]);
        if n >= left {
            break;
        }
        left -= n;
        end -= BLOCK;
    }
    while end > 0 {
        let from = end.saturating_sub(8);
        let word = word_back(&bytes[from..end]);
        if let Some(i) = nth_start(word, left - 1) {
            return end - 1 - i;
        }
        left -= 8 - lane_sum(continuations(word));
        end = from;
    }
    0
}

/// Number of `char`s in `s` (the standard library's count: a simple loop
/// for short strings, a word at a time for long ones).
pub(crate) fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// How many of `bytes` satisfy `test`, summed in bytes a chunk at a time
/// (where counting into a `usize` per byte, as `filter().count()` does,
/// vectorises into a quarter as many bytes per step).
fn count_bytes(bytes: &[u8], test: impl Fn(u8) -> bool) -> usize {
    let mut chunks = bytes.chunks_exact(usize::from(u8::MAX));
    let mut n = 0;
    for chunk in &mut chunks {
        // At most 255 ones: the byte sum cannot wrap.
        n += usize::from(chunk.iter().fold(0u8, |sum, &b| sum + u8::from(test(b))));
    }
    n + chunks.remainder().iter().filter(|&&b| test(b)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs pack the deleted flag without touching the length.
    #[test]
    fn run_packing() {
        let r = Run::new(7, 5, true);
        assert_eq!((r.lv, r.len(), r.deleted(), r.visible()), (7, 5, true, 0));
        let (a, b) = Run::new(7, 5, false).split(2);
        assert_eq!((a.lv, a.len(), b.lv, b.len()), (7, 2, 9, 3));
        assert!(a.joins(b));
        assert!(!a.joins(Run::new(9, 1, true)));
    }

    /// Byte offsets of characters, counted from either end, agree with
    /// `char_indices` at every position, across word boundaries.
    #[test]
    fn byte_offsets() {
        let long = "aé日😀".repeat(9) + "xyz" + &"ü".repeat(17);
        let mut texts: Vec<String> = [
            "",
            "a",
            "abc",
            "héllo wörld",
            "日本語のテキスト",
            "a😀b",
            long.as_str(),
        ]
        .map(String::from)
        .to_vec();
        // Every mix of one- to four-byte characters, at every length
        // around the word and block sizes.
        let mut seed = 7u64;
        for len in 0..90 {
            for _ in 0..4 {
                let text = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        ['a', 'é', '日', '😀'][(seed >> 60) as usize % 4]
                    })
                    .collect();
                texts.push(text);
            }
        }
        for s in &texts {
            let s = s.as_str();
            let starts: Vec<usize> = s.char_indices().map(|(b, _)| b).collect();
            let n = starts.len();
            for c in (0..=n + 2).chain([n + 9, n + 200]) {
                let want = starts.get(c).copied().unwrap_or(s.len());
                assert_eq!(byte_at(s, c), want, "{s:?} at {c}");
                let from_end = if c > n {
                    0
                } else {
                    starts.get(n - c).copied().unwrap_or(s.len())
                };
                assert_eq!(byte_from_end(s, c), from_end, "{s:?} last {c}");
            }
        }
    }

    /// UTF-16 and char lengths count surrogate pairs and multi-byte text.
    #[test]
    fn lengths() {
        // Long enough for whole chunks of 255 bytes and a remainder.
        let long = "aé日😀".repeat(97);
        for s in ["", "abc", "héllo", "日本語", "a😀b", "e\u{301}", &long] {
            assert_eq!(utf16_len(s), s.encode_utf16().count(), "{s}");
            assert_eq!(char_len(s), s.chars().count(), "{s}");
        }
    }
}
