//! A [`Text`] document as bytes (format versions 3 and 4, which differ
//! only in how the text is parsed for copies: see `codec::lz`): its own
//! structures,
//! written as they are, so that loading is a linear scan that integrates
//! nothing.
//!
//! ```text
//!   replicas   count; per replica, in the document's order: its id and
//!              how many of its events are here (> 0)
//!   items      how many characters were ever inserted
//!   structure  the numbers below, in columns (`columns.rs`): the counts
//!              of runs and entries, then each kind of number in a block
//!              of its own, Huffman-coded (`codec::huffman`)
//!     runs       per run, in document order: its first local version
//!                (zig-zag, from the previous run's end), and its length
//!                shifted left once, the low bit set when deleted
//!     inserts    per insert entry, in local-version order (its first
//!                local version is the sum of the lengths before): the
//!                replica's index (per stretch of entries of one replica,
//!                with the stretch's length; left out when there is one),
//!                the counter (as the gap after the replica's previous entry),
//!                the length shifted left three times with how the origins
//!                are given in the low bits, and the origins given in full
//!                as distances back from the entry's first local version
//!                (0: a document end)
//!     deletes    per replica, per delete entry, in counter order (its
//!                counter is implicit: the next one no insert entry
//!                holds): how far its last target sits before the end of
//!                the replica's latest insert entry (zig-zag; 0 for a
//!                backspace over what was just typed), and the length
//!                shifted left once, the low bit set when reversed
//!   text       the visible text, UTF-8, compressed (`codec::lz`: LZ77
//!              tokens in five Huffman-coded streams)
//!   buffered   count, then each buffered op in full
//! ```
//!
//! Origins are mostly guessed rather than written: the runs say where
//! each character sits, and in a history without concurrency a
//! character's right origin is the nearest character after it with a
//! lower local version, and its left origin the nearest before it (or the
//! nearest visible one, when it was typed after deleted text). The low
//! bits say which guess holds (left: 0 the nearest, 1 the nearest visible,
//! 2 in full; right: 0 the guess, 1 in full; left + 3 × right), and only
//! origins no guess names are written.
//!
//! Every entry and run is maximal (no two neighbours could be joined) and
//! every origin in its shortest form, so a decoded document encodes back
//! to the same bytes. Local versions are the encoding replica's own
//! numbering, so two replicas that integrated the same edits in
//! different orders may write different bytes for equal documents.
//!
//! # What decoding checks
//!
//! Every rule the structures rely on, in time linear in the input (up to
//! a logarithm): replicas listed once; per replica, insert and delete
//! entries tiling counters `1 ..= known` exactly; origins earlier than
//! the characters that name them (so local-version order stays a causal
//! order); the runs covering every local version once; every character
//! some delete entry targets deleted; the text as long as
//! the visible runs; and in document order every character after its left
//! origin and before its right origin. Allocation is bounded by the input:
//! a run or entry claiming a billion characters costs its few bytes.
//!
//! What it does not check is that concurrent insertions between one pair
//! of origins sit in the order the integration rule would give them: that
//! takes integrating them, which is what this layout saves. A document
//! crafted to break that order loads, edits and merges without error, but
//! may not converge with replicas that got the same edits as ops. Take
//! documents from peers you trust to run calm, or exchange ops and deltas
//! with untrusted ones: ops are integrated, never trusted.
//!
//! Format version 2 wrote the same numbers entry by entry and the text's
//! tokens as they are, with no entropy coding; [`read`] still reads it
//! (through `Decoded::split_version_2` and `lz::read_version_2`). Format
//! version 1 wrote the document as its ops and replayed them on load;
//! [`super::encoding`] still reads it.

use std::sync::OnceLock;

use super::columns::{Columns, Counts, Decoded, Stretches};
use super::document::Text;
use super::encoding::{read_buffered, write_buffered};
use super::history::History;
use super::leaf::{Run, char_len};
use super::tree::Tree;
use super::{MAX_COUNTER, MAX_ITEMS, NONE};
use crate::causal::ReplicaId;
use crate::codec::{Codec, DecodeError, Decoder, Encoder, lz};

/// Writes `text` in the layout of the module docs.
pub(super) fn write(text: &Text, enc: &mut Encoder) {
    let h = &text.history;
    // Replicas with events, renumbered in the document's order.
    let mut index = vec![NONE; h.agents.len()];
    let kept: Vec<usize> = (0..h.agents.len())
        .filter(|&a| h.agents[a].known > 0)
        .collect();
    enc.length(kept.len());
    for (i, &a) in kept.iter().enumerate() {
        index[a] = i as u32;
        h.agents[a].id.encode(enc);
        enc.varint(h.agents[a].known);
    }
    enc.varint(u64::from(h.items));
    // Runs in document order, joined across leaf boundaries.
    let mut runs: Vec<Run> = Vec::new();
    for leaf in text.tree.leaves() {
        for &r in &leaf.runs {
            match runs.last_mut() {
                Some(last) if last.joins(r) => *last = last.with_len(last.len() + r.len()),
                _ => runs.push(r),
            }
        }
    }
    let mut c = Columns::<Encoder>::default();
    let mut counts = Counts {
        runs: runs.len(),
        inserts: h.inserts.len(),
        deletes: Vec::with_capacity(kept.len()),
    };
    let mut end = 0i64;
    for r in &runs {
        c.run_starts.signed_varint(i64::from(r.lv) - end);
        end = i64::from(r.end());
        c.run_lens
            .varint(u64::from(r.len()) << 1 | u64::from(r.deleted()));
    }
    let layout = Layout::new(&runs, h.items);
    let guesses = layout.guesses(&h.lvs);
    let mut next = vec![1u64; kept.len()];
    let mut stretches = Stretches::default();
    for (i, e) in h.inserts.iter().enumerate() {
        let a = index[e.agent as usize] as usize;
        let len = h.entry_len(i);
        if kept.len() != 1 {
            stretches.push(&mut c, a as u64);
        }
        c.gaps.varint(e.counter() - next[a]);
        next[a] = e.counter() + u64::from(len);
        let [after, after_visible, before, _] = guesses[i];
        let left = if e.origin_left == after {
            0
        } else if e.origin_left == after_visible {
            1
        } else {
            2
        };
        let right = u64::from(e.origin_right != before);
        c.lens.varint(u64::from(len) << 3 | (left + 3 * right));
        if left == 2 {
            write_origin(&mut c.origins, h.lvs[i], e.origin_left);
        }
        if right == 1 {
            write_origin(&mut c.origins, h.lvs[i], e.origin_right);
        }
    }
    stretches.end(&mut c);
    for &a in &kept {
        let deletes = &h.agents[a].deletes;
        counts.deletes.push(deletes.len());
        let mut typed = Typed::default();
        for d in deletes {
            let counter = typed.skip(h, a);
            debug_assert_eq!(counter, d.counter());
            typed.at += u64::from(d.len());
            c.backs
                .signed_varint(i64::from(typed.end) - i64::from(d.target + d.len()));
            c.delete_lens
                .varint(u64::from(d.len()) << 1 | u64::from(d.reversed()));
        }
    }
    c.write(&counts, enc);
    let mut visible = String::with_capacity(text.tree.metrics().bytes);
    visible.extend(text.chunks());
    lz::write(enc, visible.as_bytes());
    write_buffered(text, enc);
}

/// An origin of the entry starting at `lv`: 0 for a document end, else
/// how far back it is.
fn write_origin(enc: &mut Encoder, lv: u32, origin: u32) {
    enc.varint(if origin == NONE {
        0
    } else {
        u64::from(lv - origin)
    });
}

fn read_origin(dec: &mut Decoder<'_>, lv: u32) -> Result<u32, DecodeError> {
    match dec.varint()? {
        0 => Ok(NONE),
        back if back <= u64::from(lv) => Ok(lv - back as u32),
        _ => Err(dec.invalid("origin not before the character naming it")),
    }
}

/// `base + delta` as a local version below `items`.
fn read_lv(dec: &mut Decoder<'_>, base: i64, items: u32) -> Result<u32, DecodeError> {
    let delta = dec.signed_varint()?;
    base.checked_add(delta)
        .and_then(|lv| u32::try_from(lv).ok())
        .filter(|&lv| lv < items)
        .ok_or_else(|| dec.invalid("local version out of range"))
}

/// A length and flag packed as `len << 1 | flag`, with `1 <= len <= max`.
fn read_len(dec: &mut Decoder<'_>, max: u32) -> Result<(u32, bool), DecodeError> {
    let packed = dec.varint()?;
    match u32::try_from(packed >> 1) {
        Ok(len) if len > 0 && len <= max => Ok((len, packed & 1 == 1)),
        _ => Err(dec.invalid("empty or overlong stretch")),
    }
}

/// A replica's insert entries walked in counter order beside its delete
/// entries: a delete entry's counter is the first from `at` on that no
/// insert entry holds (the two kinds tile the counters), so it is never
/// written; and `end`, where the replica's latest insert entry before it
/// ended, is what its target is written against (a backspace deletes
/// what was just typed).
struct Typed {
    /// The next insert entry of the replica (an index into its list).
    next: usize,
    /// The next counter not yet placed.
    at: u64,
    /// One past the last local version of the latest insert entry placed.
    end: u32,
}

impl Default for Typed {
    /// Before a replica's first event (counters start at 1).
    fn default() -> Self {
        Self {
            next: 0,
            at: 1,
            end: 0,
        }
    }
}

impl Typed {
    /// Places the insert entries of replica `a` that start at `at`, in
    /// turn, and returns the counter left for the next delete entry.
    fn skip(&mut self, h: &History, a: usize) -> u64 {
        let entries = h.entries_of(a);
        while let Some(e) = entries.get(self.next) {
            let entry = &h.inserts[e];
            if entry.counter() != self.at {
                break;
            }
            let len = h.entry_len(e);
            self.at += u64::from(len);
            self.end = h.lvs[e] + len;
            self.next += 1;
        }
        self.at
    }
}

/// One insert entry as read, before its guessed origins are resolved.
struct RawEntry {
    agent: u32,
    counter: u64,
    len: u32,
    /// How each origin is given: 0 (left: the guess "after", right: the
    /// guess "before"), 1 (left: the guess "after visible"; right: in
    /// full), 2 (left: in full).
    left: u8,
    right: u8,
    origin_left: u32,
    origin_right: u32,
}

/// Reads a document in the layout of the module docs, checking it.
pub(super) fn read(dec: &mut Decoder<'_>) -> Result<Text, DecodeError> {
    let mut history = History::default();
    let h = &mut history;
    let n = dec.length()?;
    h.agents.reserve_exact(n);
    let mut known = Vec::with_capacity(n);
    for _ in 0..n {
        let id = ReplicaId::decode(dec)?;
        let k = dec.varint()?;
        if k == 0 || k > MAX_COUNTER || h.agent(id).is_some() {
            return Err(
                dec.invalid("replica without events, past the last counter or listed twice")
            );
        }
        h.intern(id);
        known.push(k);
    }
    let items = u32::try_from(dec.varint()?)
        .ok()
        .filter(|&i| i <= MAX_ITEMS)
        .ok_or_else(|| dec.invalid("too many characters"))?;

    let (counts, columns) = if dec.version() >= 3 {
        Decoded::read(dec, n)?
    } else {
        Decoded::split_version_2(dec, n)?
    };
    let mut c = columns.decoders();
    let mut runs: Vec<Run> = Vec::with_capacity(counts.runs);
    let mut end = 0i64;
    let mut visible = 0u64;
    for _ in 0..counts.runs {
        let lv = read_lv(&mut c.run_starts, end, items)?;
        let (len, deleted) = read_len(&mut c.run_lens, items - lv)?;
        let run = Run::new(lv, len, deleted);
        if runs.last().is_some_and(|p| p.joins(run)) {
            return Err(dec.invalid("runs not joined"));
        }
        runs.push(run);
        visible += u64::from(run.visible());
        end = i64::from(run.end());
    }
    let layout = Layout::new(&runs, items);
    if !layout.tiles(items) {
        return Err(dec.invalid("runs overlap or leave a gap"));
    }

    let entries = counts.inserts;
    let mut raw: Vec<RawEntry> = Vec::with_capacity(entries);
    let mut firsts: Vec<u32> = Vec::with_capacity(entries);
    let mut next = vec![1u64; n];
    let mut lv = 0u32;
    // The current stretch of one replica's entries: its replica, and how
    // many entries it still holds.
    let (mut a, mut left) = (0usize, 0u64);
    for i in 0..entries {
        if n > 1 && left == 0 {
            let r = usize::try_from(c.replicas.varint()?)
                .ok()
                .filter(|&r| r < n && (i == 0 || r != a))
                .ok_or_else(|| dec.invalid("replica index out of range or stretch not joined"))?;
            (a, left) = (r, c.stretches.varint()?.saturating_add(1));
        }
        left = left.saturating_sub(1);
        let counter = next[a].checked_add(c.gaps.varint()?);
        let packed = c.lens.varint()?;
        let (len, code) = (packed >> 3, packed & 7);
        let end = counter.and_then(|c| c.checked_add(len));
        let (Some(counter), Some(end)) = (counter, end) else {
            return Err(dec.invalid("counter out of range"));
        };
        if len == 0 || len > u64::from(items - lv) || end - 1 > known[a] || code > 5 {
            return Err(dec.invalid("insert entry empty, too long, past its replica or miscoded"));
        }
        let (left, right) = ((code % 3) as u8, (code / 3) as u8);
        let origin_left = if left == 2 {
            read_origin(&mut c.origins, lv)?
        } else {
            NONE
        };
        let origin_right = if right == 1 {
            read_origin(&mut c.origins, lv)?
        } else {
            NONE
        };
        raw.push(RawEntry {
            agent: a as u32,
            counter,
            len: len as u32,
            left,
            right,
            origin_left,
            origin_right,
        });
        firsts.push(lv);
        next[a] = end;
        lv += len as u32;
    }
    if lv != items || left > 0 {
        return Err(dec.invalid("insert entries and runs disagree on the characters"));
    }
    let guesses = layout.guesses(&firsts);
    // Counted against the columns: exact room, so pushing never regrows.
    h.inserts.reserve_exact(entries);
    h.lvs.reserve_exact(entries);
    for (e, g) in raw.iter().zip(&guesses) {
        let [after, after_visible, before, _] = *g;
        let origin_left = match e.left {
            0 => after,
            1 if after_visible != after => after_visible,
            2 if e.origin_left != after && e.origin_left != after_visible => e.origin_left,
            _ => return Err(dec.invalid("an origin not in its shortest form")),
        };
        let origin_right = match e.right {
            0 => before,
            _ if e.origin_right != before => e.origin_right,
            _ => return Err(dec.invalid("an origin not in its shortest form")),
        };
        let count = h.inserts.len();
        h.push_insert(e.agent, e.counter, e.len, origin_left, origin_right);
        if h.inserts.len() == count {
            return Err(dec.invalid("insert entries not joined"));
        }
    }

    // Every character a delete entry names must be deleted (a character
    // can also arrive deleted, in an op that carried it hidden, before the
    // delete event itself).
    let mut dead = Dead::new(&runs, items, dec.offset() + dec.remaining());
    for (a, &k) in known.iter().enumerate() {
        let mut typed = Typed::default();
        h.agents[a].deletes.reserve_exact(counts.deletes[a]);
        for _ in 0..counts.deletes[a] {
            let counter = typed.skip(h, a);
            let back = c.backs.signed_varint()?;
            let (len, reversed) = read_len(&mut c.delete_lens, items)?;
            let target = i64::from(typed.end)
                .checked_sub(back)
                .and_then(|end| end.checked_sub(i64::from(len)))
                .and_then(|t| u32::try_from(t).ok())
                .filter(|&t| u64::from(t) + u64::from(len) <= u64::from(items))
                .ok_or_else(|| dec.invalid("delete target out of range"))?;
            let Some(end) = counter.checked_add(u64::from(len)) else {
                return Err(dec.invalid("counter out of range"));
            };
            typed.at = end;
            let agent = &h.agents[a];
            let joined = agent.deletes.len();
            if end - 1 > k || (reversed && len == 1) {
                return Err(dec.invalid("delete entry past its replica or not canonical"));
            }
            h.push_delete(a as u32, counter, target, len, reversed);
            if h.agents[a].deletes.len() == joined {
                return Err(dec.invalid("delete entries not joined"));
            }
            dead.add(target, target + len);
        }
    }
    c.finish()?;
    let offset = dec.offset();
    let invalid = |what| DecodeError::Invalid { offset, what };
    // Each replica's entries tile its counters.
    for (a, &k) in known.iter().enumerate() {
        let agent = &h.agents[a];
        let entries = h.entries_of(a);
        let mut ins = entries
            .iter()
            .map(|e| (h.inserts[e].counter(), u64::from(h.entry_len(e))));
        let mut del = agent
            .deletes
            .iter()
            .map(|d| (d.counter(), u64::from(d.len())));
        let (mut i, mut d) = (ins.next(), del.next());
        let mut at = 1;
        loop {
            match (i, d) {
                (Some((c, len)), _) if c == at => (at, i) = (c + len, ins.next()),
                (_, Some((c, len))) if c == at => (at, d) = (c + len, del.next()),
                (None, None) => break,
                _ => return Err(invalid("a replica's events overlap or leave a gap")),
            }
        }
        if at - 1 != k {
            return Err(invalid("a replica's events overlap or leave a gap"));
        }
    }
    for (agent, &k) in history.agents.iter_mut().zip(&known) {
        agent.known = k;
    }
    let h = &history;

    if !dead.all_deleted(&layout, items) {
        return Err(invalid("a character deleted by a delete entry is visible"));
    }
    // Every character between its origins in document order. Inside a
    // run, a character's left origin is the one before it unless it
    // starts an insert entry, so entries' and runs' first characters are
    // all there is to check. Entries and runs are both in local-version
    // order: walk them together, searching only for the origins.
    let mut k = 0;
    for (e, entry) in h.inserts.iter().enumerate() {
        let first = h.lvs[e];
        let last = first + h.entry_len(e) - 1;
        while layout.end(k) <= first {
            k += 1;
        }
        let first_pos = (layout.doc(k), first - layout.lv(k));
        while layout.end(k) <= last {
            k += 1;
        }
        let last_pos = (layout.doc(k), last - layout.lv(k));
        // A guessed left origin lies before the entry's first character
        // by construction; a guessed right one is the first character of
        // the run the guess names.
        let left_ok = raw[e].left < 2
            || entry.origin_left == NONE
            || layout.pos(entry.origin_left) < first_pos;
        let right_ok = match (raw[e].right, guesses[e][3]) {
            (0, NONE) => true,
            (0, doc) => last_pos < (doc, 0),
            _ => entry.origin_right == NONE || last_pos < layout.pos(entry.origin_right),
        };
        if !left_ok || !right_ok {
            return Err(invalid("a character outside its origins"));
        }
    }
    // A run's first character whose left origin is the character before
    // it (it does not start an entry) comes after that one, which ends
    // the run before it in local-version order.
    let mut e = 0;
    for k in 1..runs.len() {
        let x = layout.lv(k);
        while h.lvs.get(e + 1).is_some_and(|&n| n <= x) {
            e += 1;
        }
        if h.lvs[e] != x && layout.doc(k - 1) >= layout.doc(k) {
            return Err(invalid("a character outside its origins"));
        }
    }

    let at = dec.offset();
    let visible_text = if dec.version() >= 3 {
        lz::read(dec)?
    } else {
        lz::read_version_2(dec)?
    };
    let visible_text =
        String::from_utf8(visible_text).map_err(|_| DecodeError::InvalidUtf8 { offset: at })?;
    let visible_text = visible_text.as_str();
    if char_len(visible_text) as u64 != visible {
        return Err(DecodeError::Invalid {
            offset: at,
            what: "text not as long as the visible runs",
        });
    }
    let tree = Tree::build(&runs, visible_text);
    let mut text = Text::from_parts(OnceLock::new(), tree, history);
    read_buffered(dec, &mut text)?;
    Ok(text)
}

/// The check that every character a delete entry names is deleted.
enum Dead {
    /// One bit per character, set for those in deleted runs, so each
    /// target is checked as it is read (`hit`: whether all were so far).
    Bits { bits: Vec<u64>, hit: bool },
    /// The targets (`start << 32 | end`), checked once all are read by
    /// sorting them against the deleted runs: for a document whose bitmap
    /// would outweigh the input (a long deleted run costs a few bytes).
    Sorted(Vec<u64>),
}

impl Dead {
    /// The check for a document of `items` characters in `runs`, read
    /// from `input` bytes: the bitmap when it is no larger than them
    /// (every real document: a load of the five traces or of words
    /// replaced at random places takes 2-6.5% fewer instructions than with
    /// the targets sorted).
    fn new(runs: &[Run], items: u32, input: usize) -> Self {
        let words = (items as usize).div_ceil(64);
        if words.saturating_mul(8) > input {
            return Dead::Sorted(Vec::new());
        }
        let mut bits = vec![0u64; words];
        for r in runs.iter().filter(|r| r.deleted()) {
            let (a, lo, b, hi) = bit_span(r.lv, r.end());
            if a == b {
                bits[a] |= lo & hi;
            } else {
                bits[a] |= lo;
                bits[a + 1..b].fill(!0);
                bits[b] |= hi;
            }
        }
        Dead::Bits { bits, hit: true }
    }

    /// Notes a delete entry's target, characters `start .. end` (`start <
    /// end <= items`).
    fn add(&mut self, start: u32, end: u32) {
        match self {
            Dead::Bits { bits, hit } => {
                let (a, lo, b, hi) = bit_span(start, end);
                *hit &= if a == b {
                    bits[a] & lo & hi == lo & hi
                } else {
                    bits[a] & lo == lo
                        && bits[a + 1..b].iter().all(|&w| w == !0)
                        && bits[b] & hi == hi
                };
            }
            Dead::Sorted(targets) => targets.push(u64::from(start) << 32 | u64::from(end)),
        }
    }

    /// Whether every target noted lies in deleted runs.
    fn all_deleted(self, layout: &Layout<'_>, items: u32) -> bool {
        let targets = match self {
            Dead::Bits { hit, .. } => return hit,
            Dead::Sorted(targets) => targets,
        };
        let shift = (items / targets.len().max(1) as u32).max(1).ilog2();
        let targets = sort_spread(targets, 32 + shift, (items >> shift) as usize + 1);
        let tombs = union(
            (0..layout.runs.len())
                .map(|k| layout.run(k))
                .filter(|r| r.deleted())
                .map(|r| (r.lv, r.end())),
        );
        let mut t = 0;
        let targets = union(targets.into_iter().map(|d| ((d >> 32) as u32, d as u32)));
        targets.into_iter().all(|(start, end)| {
            while tombs.get(t).is_some_and(|&(_, e)| e <= start) {
                t += 1;
            }
            tombs.get(t).is_some_and(|&(s, e)| s <= start && end <= e)
        })
    }
}

/// Bits `start .. end` (`start < end`) of a bitmap in 64-bit words: the
/// first word and its mask, the last word and its mask.
fn bit_span(start: u32, end: u32) -> (usize, u64, usize, u64) {
    let (first, last) = (start as usize, end as usize - 1);
    (
        first / 64,
        !0 << (first % 64),
        last / 64,
        !0 >> (63 - last % 64),
    )
}

/// The runs in both orders: document order as given, and local-version
/// order (`by_lv`, as `lv << 32 | document index`, then `items << 32 |
/// NONE`, so that once [`Layout::tiles`] holds each run's end is the next
/// one's start, read without touching the runs).
struct Layout<'a> {
    runs: &'a [Run],
    by_lv: Vec<u64>,
}

impl<'a> Layout<'a> {
    fn new(runs: &'a [Run], items: u32) -> Self {
        // Buckets of about one run each, so the sort is one counting pass.
        let shift = (items / runs.len().max(1) as u32).max(1).ilog2();
        // Room for the end marker, so pushing it never regrows.
        let mut keys = Vec::with_capacity(runs.len() + 1);
        keys.extend(
            runs.iter()
                .enumerate()
                .map(|(i, r)| u64::from(r.lv) << 32 | i as u64),
        );
        let mut by_lv = sort_spread(keys, 32 + shift, (items >> shift) as usize + 1);
        by_lv.push(u64::from(items) << 32 | u64::from(NONE));
        Self { runs, by_lv }
    }

    /// Whether the runs cover `0 .. items`, each local version once (the
    /// other methods assume it).
    fn tiles(&self, items: u32) -> bool {
        let mut at = 0;
        for k in 0..self.runs.len() {
            let r = self.run(k);
            if r.lv != at {
                return false;
            }
            at = r.end();
        }
        at == items
    }

    /// The `k`-th run in local-version order.
    fn run(&self, k: usize) -> Run {
        self.runs[self.doc(k) as usize]
    }

    /// The document index of the `k`-th run in local-version order.
    fn doc(&self, k: usize) -> u32 {
        self.by_lv[k] as u32
    }

    /// The first local version of the `k`-th run in local-version order.
    fn lv(&self, k: usize) -> u32 {
        (self.by_lv[k] >> 32) as u32
    }

    /// The end of the `k`-th run in local-version order (the runs tile).
    fn end(&self, k: usize) -> u32 {
        self.lv(k + 1)
    }

    /// Where item `lv` is: its run's document index and its offset there
    /// (a binary search: only origins given in full need it).
    fn pos(&self, lv: u32) -> (u32, u32) {
        let key = u64::from(lv) << 32 | 0xffff_ffff;
        let k = self.by_lv.partition_point(|&x| x <= key) - 1;
        (self.doc(k), lv - self.lv(k))
    }

    /// For each character `x` of `firsts` (in increasing order), three guesses at its origins,
    /// read off the document: the nearest character before it with a
    /// lower local version ("after"), the same among visible characters
    /// ("after visible"), and the nearest after it with a lower local
    /// version ("before"), or [`NONE`]; then the document index of the
    /// run that "before" starts (it always starts one), or [`NONE`]. In a
    /// history without concurrency
    /// the right origin is always "before" (the characters that were
    /// there when `x` was typed keep their order, and everything typed
    /// between since has a higher local version), and the left origin is
    /// "after" unless text deleted before `x` was typed sits in between,
    /// when it is mostly "after visible". Two sweeps over the runs with a
    /// stack of the runs that can still be an answer.
    fn guesses(&self, firsts: &[u32]) -> Vec<[u32; 4]> {
        let runs = self.runs;
        // `firsts` grow, so one walk over the runs in local-version order
        // finds each one's run (its document index).
        let mut k = 0;
        let mut has_query = vec![false; runs.len()];
        let run_of: Vec<u32> = firsts
            .iter()
            .map(|&x| {
                while self.end(k) <= x {
                    k += 1;
                }
                has_query[self.doc(k) as usize] = true;
                self.doc(k)
            })
            .collect();
        // Per run: the nearest run before it with a lower first local
        // version, the same among visible runs, and the nearest after it
        // with a lower one. The stacks hold runs (first local version,
        // document index) whose first local versions grow towards the
        // top: a run hides every run further away whose first local
        // version is not lower. Runs hold disjoint local versions, so for
        // a character of run `r` the nearest run on a stack with a lower
        // first local version is the nearest below `r.lv`: the top, once
        // `r` has popped what it hides.
        let pop = |stack: &mut Vec<(u32, u32)>, lv: u32| {
            while stack.last().is_some_and(|&(p, _)| p >= lv) {
                stack.pop();
            }
            stack.last().map_or(NONE, |&(_, d)| d)
        };
        let mut near = vec![[NONE; 3]; runs.len()];
        let (mut all, mut shown) = (Vec::new(), Vec::new());
        for (d, r) in runs.iter().enumerate() {
            near[d][0] = pop(&mut all, r.lv);
            all.push((r.lv, d as u32));
            if !r.deleted() {
                near[d][1] = pop(&mut shown, r.lv);
                shown.push((r.lv, d as u32));
            } else if has_query[d] {
                // A deleted run joins no visible stack, so must not pop it.
                let i = shown.partition_point(|&(lv, _)| lv < r.lv);
                near[d][1] = if i > 0 { shown[i - 1].1 } else { NONE };
            }
        }
        all.clear();
        for d in (0..runs.len()).rev() {
            near[d][2] = pop(&mut all, runs[d].lv);
            all.push((runs[d].lv, d as u32));
        }
        firsts
            .iter()
            .zip(&run_of)
            .map(|(&x, &d)| {
                let r = runs[d as usize];
                let [before, visible_before, after] = near[d as usize];
                let left = |d: u32| {
                    if d == NONE {
                        NONE
                    } else {
                        runs[d as usize].end().min(x) - 1
                    }
                };
                [
                    if x > r.lv { x - 1 } else { left(before) },
                    if x > r.lv && !r.deleted() {
                        x - 1
                    } else {
                        left(visible_before)
                    },
                    if after == NONE {
                        NONE
                    } else {
                        runs[after as usize].lv
                    },
                    after,
                ]
            })
            .collect()
    }
}

/// `keys` sorted, in time linear in their number and `buckets` when they
/// spread evenly: counted into buckets by `key >> shift` (each below
/// `buckets`), then each bucket sorted on its own. A few keys are sorted
/// as they are, sparing the buckets' allocations. The result keeps the
/// capacity `keys` had.
fn sort_spread(mut keys: Vec<u64>, shift: u32, buckets: usize) -> Vec<u64> {
    if keys.len() <= 64 {
        keys.sort_unstable();
        return keys;
    }
    // Counted into `ends[b + 1]`, summed, then each key placed at
    // `ends[b]`, which it advances: afterwards `ends[b]` is where bucket
    // `b` ends (and `ends[b - 1]` where it starts).
    let mut ends = vec![0u32; buckets + 1];
    for &k in &keys {
        ends[(k >> shift) as usize + 1] += 1;
    }
    for b in 1..=buckets {
        ends[b] += ends[b - 1];
    }
    let mut out = Vec::with_capacity(keys.capacity());
    out.resize(keys.len(), 0u64);
    for &k in &keys {
        let b = (k >> shift) as usize;
        out[ends[b] as usize] = k;
        ends[b] += 1;
    }
    let mut start = 0;
    for &end in &ends[..buckets] {
        let bucket = &mut out[start as usize..end as usize];
        if bucket.len() > 1 {
            bucket.sort_unstable();
        }
        start = end;
    }
    out
}

/// The union of sorted ranges, as sorted disjoint ranges with gaps
/// between them (touching ranges are joined).
fn union(ranges: impl Iterator<Item = (u32, u32)>) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Dead, Layout, Run, sort_spread};

    /// Both ways of checking that delete entries name only deleted
    /// characters (the bitmap, and sorting the targets) agree with a
    /// character-by-character check, on random documents and targets that
    /// cross word and run boundaries.
    #[test]
    fn both_dead_checks_agree_with_each_character() {
        let mut x = 5u64;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % n
        };
        let mut outcomes = [0; 2];
        for round in 0..300 {
            // Runs covering 0..items in local-version order, deleted at
            // random, then shuffled into a document order.
            let mut runs = Vec::new();
            let mut items = 0u32;
            for _ in 0..1 + next(40) {
                let len = 1 + next(if round % 3 == 0 { 200 } else { 5 }) as u32;
                runs.push(Run::new(items, len, next(3) > 0));
                items += len;
            }
            for i in (1..runs.len()).rev() {
                runs.swap(i, next(i as u64 + 1) as usize);
            }
            let mut deleted = vec![false; items as usize];
            for r in &runs {
                deleted[r.lv as usize..r.end() as usize].fill(r.deleted());
            }
            let layout = Layout::new(&runs, items);
            assert!(layout.tiles(items));
            // Targets anywhere, or (more often) inside one deleted run.
            let tombs: Vec<Run> = runs.iter().copied().filter(|r| r.deleted()).collect();
            let targets: Vec<(u32, u32)> = (0..1 + next(5))
                .map(|_| {
                    let (from, to) = match tombs.len() {
                        n if n > 0 && next(4) > 0 => {
                            let r = tombs[next(n as u64) as usize];
                            (r.lv, r.end())
                        }
                        _ => (0, items),
                    };
                    let start = from + next(u64::from(to - from)) as u32;
                    let len = 1 + next(u64::from(to - start).min(150)) as u32;
                    (start, start + len)
                })
                .collect();
            let expected = targets
                .iter()
                .all(|&(s, e)| deleted[s as usize..e as usize].iter().all(|&d| d));
            outcomes[usize::from(expected)] += 1;
            for input in [usize::MAX, 0] {
                let mut dead = Dead::new(&runs, items, input);
                assert_eq!(matches!(dead, Dead::Bits { .. }), input > 0);
                for &(s, e) in &targets {
                    dead.add(s, e);
                }
                assert_eq!(dead.all_deleted(&layout, items), expected, "round {round}");
            }
        }
        assert!(outcomes.iter().all(|&n| n > 50), "{outcomes:?}");
    }

    /// Keys sorted as a plain sort sorts them, few (sorted as they are)
    /// or many (by buckets), spread evenly or piled into one bucket, with
    /// the capacity they came with kept.
    #[test]
    fn sort_spread_sorts_and_keeps_room() {
        let mut x = 11u64;
        for n in [0usize, 1, 2, 64, 65, 300, 5_000] {
            for piled in [false, true] {
                let items = 1u64 << 20;
                let keys: Vec<u64> = (0..n)
                    .map(|i| {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let lv = if piled { x >> 61 } else { (x >> 40) % items };
                        lv << 32 | i as u64
                    })
                    .collect();
                let mut expected = keys.clone();
                expected.sort_unstable();
                let shift = (items as u32 / n.max(1) as u32).max(1).ilog2();
                let mut with_room = Vec::with_capacity(n + 1);
                with_room.extend_from_slice(&keys);
                let sorted = sort_spread(with_room, 32 + shift, (items >> shift) as usize + 1);
                assert_eq!(sorted, expected, "n = {n}, piled: {piled}");
                assert!(sorted.capacity() > n, "n = {n}: room for one more kept");
            }
        }
    }
}
