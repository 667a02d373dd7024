//! [`TextOp`]: what a local edit sends to the other replicas.

use std::fmt;

use super::history::History;
use super::leaf::{byte_at, char_len};
use super::{MAX_COUNTER, MAX_ITEMS};
use crate::causal::{Dot, ReplicaId};

/// One edit, as shipped between replicas: an insertion of characters or a
/// deletion of characters, with the ids that place it in every replica's
/// copy.
///
/// [`Text::insert`](super::Text::insert) and
/// [`Text::delete`](super::Text::delete) return one; another replica's
/// [`Text::apply`](super::Text::apply) integrates it. An op of `n`
/// characters takes the `n` consecutive event ids starting at
/// [`id`](TextOp::id), one per inserted or deleted character.
///
/// Ops name characters by id, never by position, so they can arrive late,
/// twice or out of order: a replica buffers an op until the ops it builds on
/// have arrived, and ignores a repeat. The binary form
/// ([`codec::to_bytes`](crate::codec::to_bytes)) is compact, typically a
/// handful of bytes plus the inserted text.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::text::{Applied, Text, TextOp};
/// use calm::codec;
///
/// let mut a = Text::new(ReplicaId::new(1));
/// let mut b = Text::new(ReplicaId::new(2));
/// let op = a.insert(0, "héllo")?;
/// assert_eq!((op.len(), op.inserted_text()), (5, Some("héllo")));
///
/// let wire = codec::to_bytes(&op);
/// let op: TextOp = codec::from_bytes(&wire)?;
/// assert_eq!(b.apply(&op)?, Applied::Integrated);
/// assert_eq!(b.apply(&op)?, Applied::AlreadyKnown);
/// assert_eq!(b.to_string(), "héllo");
/// # Ok::<(), calm::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TextOp {
    /// Id of the first event.
    pub(crate) id: Dot,
    /// What the events do.
    pub(crate) kind: OpKind,
}

/// The two kinds of op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// Consecutive characters inserted at one place.
    Insert(Insertion),
    /// Characters deleted, event by event, in the order of the targets.
    Delete(Targets),
}

/// The body of an insertion.
///
/// The characters get the ids `id, id + 1, ...`. The first one's origins
/// are `origin_left` and `origin_right`; each later one's left origin is the
/// character before it and its right origin is `origin_right`, exactly as if
/// they were typed one by one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Insertion {
    /// The character just left of the first one when it was inserted, or
    /// `None` at the start of the document.
    pub(crate) origin_left: Option<Dot>,
    /// The character just right of it, or `None` at the end.
    pub(crate) origin_right: Option<Dot>,
    /// Number of characters, visible or hidden.
    pub(crate) len: u32,
    /// The visible characters, in order.
    pub(crate) text: Content,
    /// `(offset, len)` stretches of characters sent without content because
    /// the sender had already deleted them (the deletions travel along).
    /// Sorted, non-empty, not touching each other.
    pub(crate) hidden: Vec<(u32, u32)>,
}

/// Bytes of text kept inline in a [`Content`]: most ops are one keystroke,
/// and an op that holds its text inline costs no allocation.
const INLINE: usize = 22;

/// The text of an insertion: inline when short, else on the heap.
///
/// Invariant: the inline bytes `bytes[..len]` are valid UTF-8 (they are
/// only ever copied from a `&str`).
#[derive(Clone)]
pub(crate) enum Content {
    /// Up to [`INLINE`] bytes.
    Inline(u8, [u8; INLINE]),
    /// Anything longer.
    Heap(String),
}

impl Content {
    /// Appends `s`, moving to the heap when it no longer fits inline.
    pub(crate) fn push_str(&mut self, s: &str) {
        match self {
            Content::Heap(h) => h.push_str(s),
            Content::Inline(len, bytes) => {
                let n = *len as usize;
                if n + s.len() <= INLINE {
                    bytes[n..n + s.len()].copy_from_slice(s.as_bytes());
                    *len += s.len() as u8;
                } else {
                    let mut h = String::with_capacity(n + s.len());
                    h.push_str(self);
                    h.push_str(s);
                    *self = Content::Heap(h);
                }
            }
        }
    }
}

impl Default for Content {
    fn default() -> Self {
        Content::Inline(0, [0; INLINE])
    }
}

impl From<&str> for Content {
    #[inline]
    fn from(s: &str) -> Self {
        if s.len() <= INLINE {
            Content::Inline(s.len() as u8, inline_bytes(s.as_bytes()))
        } else {
            Content::Heap(s.to_owned())
        }
    }
}

/// `s` (at most [`INLINE`] bytes) followed by zeros, built from a few
/// overlapping word loads of `s` combined in registers. Copying `s` into
/// a zeroed array byte-wise and then moving the array stalls: the moves
/// read it back in words that span the copy's smaller stores, which the
/// processor cannot forward.
#[inline]
fn inline_bytes(s: &[u8]) -> [u8; INLINE] {
    fn word(s: &[u8], at: usize) -> u64 {
        let mut w = [0; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_le_bytes(w)
    }
    fn half(s: &[u8], at: usize) -> u64 {
        let mut w = [0; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u64::from(u32::from_le_bytes(w))
    }
    let n = s.len();
    // The last word's bytes, shifted down so that byte `n - 1` is its
    // highest: bytes `8 * k .. n` of the result for word `k`.
    let tail = |k: usize| word(s, n - 8) >> (8 * (8 * (k + 1) - n));
    let (w0, w1, w2) = match n {
        0 => (0, 0, 0),
        1..=3 => {
            let b = |i: usize| u64::from(s[i]) << (8 * i);
            (b(0) | b(n / 2) | b(n - 1), 0, 0)
        }
        4..=7 => (half(s, 0) | half(s, n - 4) << (8 * (n - 4)), 0, 0),
        8 => (word(s, 0), 0, 0),
        9..=16 => (word(s, 0), tail(1), 0),
        17..=INLINE => (word(s, 0), word(s, 8), tail(2)),
        _ => unreachable!("inline_bytes is given at most INLINE bytes"),
    };
    let mut out = [0; INLINE];
    out[..8].copy_from_slice(&w0.to_le_bytes());
    out[8..16].copy_from_slice(&w1.to_le_bytes());
    out[16..].copy_from_slice(&w2.to_le_bytes()[..INLINE - 16]);
    out
}

impl From<String> for Content {
    fn from(s: String) -> Self {
        if s.len() <= INLINE {
            Content::from(s.as_str())
        } else {
            Content::Heap(s)
        }
    }
}

impl std::ops::Deref for Content {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Content::Heap(h) => h,
            Content::Inline(len, bytes) => match std::str::from_utf8(&bytes[..*len as usize]) {
                Ok(s) => s,
                Err(_) => broken_content(),
            },
        }
    }
}

#[cold]
#[track_caller]
fn broken_content() -> ! {
    panic!("inline op text is not UTF-8: calm's invariant is broken")
}

impl PartialEq for Content {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Content {}

impl fmt::Debug for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A stretch of consecutive ids of one replica deleted by consecutive
/// events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// The lowest id of the stretch.
    pub(crate) start: Dot,
    /// Number of characters (and events).
    pub(crate) len: u32,
    /// Whether the events went from the highest id down (backspacing).
    /// Never set when `len == 1`.
    pub(crate) reversed: bool,
}

/// A delete op's targets, in the order of its events. Most deletions are
/// one keystroke's or one selection's, a single target, which is held
/// inline: a local deletion then allocates nothing for its op.
///
/// Exactly one target is always `One`, so equal lists compare equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Targets {
    /// Exactly one target.
    One(Target),
    /// None, or two and more.
    Many(Vec<Target>),
}

/// The room a list of targets starts with once it holds two.
const MANY_TARGETS: usize = 8;

impl Default for Targets {
    fn default() -> Self {
        Targets::Many(Vec::new())
    }
}

impl Targets {
    /// Appends `t` as it is (see [`push_target`] to join it).
    pub(crate) fn push(&mut self, t: Target) {
        match self {
            Targets::Many(v) if v.is_empty() => *self = Targets::One(t),
            Targets::Many(v) => v.push(t),
            Targets::One(first) => {
                // A deletion of two pieces often spans more (more than
                // half of sveltecomponent's do): start with room for
                // several, not the two a `vec!` would hold.
                let mut v = Vec::with_capacity(MANY_TARGETS);
                v.extend([*first, t]);
                *self = Targets::Many(v);
            }
        }
    }

    /// Removes the targets from `at` on and returns them.
    fn split_off(&mut self, at: usize) -> Vec<Target> {
        let mut all = match std::mem::take(self) {
            Targets::One(t) => vec![t],
            Targets::Many(v) => v,
        };
        let tail = all.split_off(at);
        *self = Targets::from(all);
        tail
    }
}

impl From<Vec<Target>> for Targets {
    fn from(v: Vec<Target>) -> Self {
        match v.as_slice() {
            &[t] => Targets::One(t),
            _ => Targets::Many(v),
        }
    }
}

impl std::ops::Deref for Targets {
    type Target = [Target];

    fn deref(&self) -> &[Target] {
        match self {
            Targets::One(t) => std::slice::from_ref(t),
            Targets::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Targets {
    fn deref_mut(&mut self) -> &mut [Target] {
        match self {
            Targets::One(t) => std::slice::from_mut(t),
            Targets::Many(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a Targets {
    type Item = &'a Target;
    type IntoIter = std::slice::Iter<'a, Target>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl TextOp {
    /// The id of the op's first event; the others follow consecutively.
    pub fn id(&self) -> Dot {
        self.id
    }

    /// The replica that made the edit.
    pub fn replica(&self) -> ReplicaId {
        self.id.replica()
    }

    /// Number of characters inserted or deleted (and of event ids used).
    pub fn len(&self) -> u64 {
        u64::from(self.len32())
    }

    /// Whether the op does nothing (an empty insert or delete).
    pub fn is_empty(&self) -> bool {
        self.len32() == 0
    }

    /// The visible inserted text, for an insertion; `None` for a deletion.
    pub fn inserted_text(&self) -> Option<&str> {
        match &self.kind {
            OpKind::Insert(ins) => Some(&ins.text),
            OpKind::Delete(_) => None,
        }
    }

    /// Whether the op deletes characters.
    pub fn is_delete(&self) -> bool {
        matches!(self.kind, OpKind::Delete(_))
    }

    pub(crate) fn len32(&self) -> u32 {
        match &self.kind {
            OpKind::Insert(ins) => ins.len,
            OpKind::Delete(targets) => targets.iter().map(|t| t.len).sum(),
        }
    }

    /// The counter one past the last event.
    pub(crate) fn end(&self) -> u64 {
        self.id.counter() + self.len()
    }

    /// The id of event `k` of this op.
    fn event(&self, k: u32) -> Dot {
        Dot::new(self.replica(), self.id.counter() + u64::from(k))
    }

    /// The events `from .. to` of this op as an op of their own.
    pub(crate) fn slice(&self, from: u32, to: u32) -> TextOp {
        debug_assert!(from < to && to <= self.len32());
        let kind = match &self.kind {
            OpKind::Insert(ins) => {
                let hidden_before = |x: u32| -> u32 {
                    ins.hidden
                        .iter()
                        .map(|&(o, l)| (o + l).min(x).saturating_sub(o))
                        .sum()
                };
                let (c0, c1) = (from - hidden_before(from), to - hidden_before(to));
                let byte = |c: u32| byte_at(&ins.text, c as usize);
                let hidden = ins
                    .hidden
                    .iter()
                    .filter_map(|&(o, l)| {
                        let (s, e) = (o.max(from), (o + l).min(to));
                        (s < e).then(|| (s - from, e - s))
                    })
                    .collect();
                OpKind::Insert(Insertion {
                    origin_left: if from > 0 {
                        Some(self.event(from - 1))
                    } else {
                        ins.origin_left
                    },
                    origin_right: ins.origin_right,
                    len: to - from,
                    text: Content::from(&ins.text[byte(c0)..byte(c1)]),
                    hidden,
                })
            }
            OpKind::Delete(targets) => {
                let mut out = Targets::default();
                let mut at = 0;
                for t in targets {
                    let (s, e) = (from.max(at), to.min(at + t.len));
                    if s < e {
                        let (a, b) = (s - at, e - at);
                        let first = if t.reversed { t.len - b } else { a };
                        push_target(
                            &mut out,
                            Target {
                                start: Dot::new(
                                    t.start.replica(),
                                    t.start.counter() + u64::from(first),
                                ),
                                len: b - a,
                                reversed: t.reversed,
                            },
                        );
                    }
                    at += t.len;
                }
                OpKind::Delete(out)
            }
        };
        TextOp {
            id: self.event(from),
            kind,
        }
    }

    /// Whether `next` continues this op (same replica, next counter, and
    /// for an insertion typed right after it with the same right origin),
    /// so the two could be one op.
    pub(crate) fn joins(&self, next: &TextOp) -> bool {
        if next.replica() != self.replica() || next.id.counter() != self.end() || self.is_empty() {
            return false;
        }
        match (&self.kind, &next.kind) {
            (OpKind::Insert(a), OpKind::Insert(b)) => {
                b.origin_left == Some(self.event(self.len32() - 1))
                    && b.origin_right == a.origin_right
            }
            (OpKind::Delete(_), OpKind::Delete(_)) => true,
            _ => false,
        }
    }

    /// Appends `next` to this op if it [`joins`](TextOp::joins) it.
    /// Returns whether it did.
    pub(crate) fn try_append(&mut self, next: &TextOp) -> bool {
        if !self.joins(next) {
            return false;
        }
        match (&mut self.kind, &next.kind) {
            (OpKind::Insert(a), OpKind::Insert(b)) => {
                for &(o, l) in &b.hidden {
                    let o = o + a.len;
                    match a.hidden.last_mut() {
                        Some(h) if h.0 + h.1 == o => h.1 += l,
                        _ => a.hidden.push((o, l)),
                    }
                }
                a.text.push_str(&b.text);
                a.len += b.len;
            }
            (OpKind::Delete(a), OpKind::Delete(b)) => {
                for t in b {
                    push_target(a, *t);
                }
            }
            _ => {}
        }
        true
    }

    /// Checks the rules every op obeys; returns the broken one.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        let len = match &self.kind {
            OpKind::Insert(ins) => {
                let mut next = 0u64;
                let mut hidden = 0u64;
                for &(o, l) in &ins.hidden {
                    if l == 0 || u64::from(o) < next || (next > 0 && u64::from(o) == next) {
                        return Err("hidden stretches empty, unsorted or touching");
                    }
                    next = u64::from(o) + u64::from(l);
                    hidden += u64::from(l);
                }
                if next > u64::from(ins.len)
                    || hidden + char_len(&ins.text) as u64 != u64::from(ins.len)
                {
                    return Err("insert length does not match its text");
                }
                for origin in [ins.origin_left, ins.origin_right].into_iter().flatten() {
                    if origin.replica() == self.replica() && origin.counter() >= self.id.counter() {
                        return Err("insert origin is not an earlier event");
                    }
                }
                u64::from(ins.len)
            }
            OpKind::Delete(targets) => {
                let mut sum = 0u64;
                for t in targets {
                    if t.len == 0 || (t.reversed && t.len == 1) {
                        return Err("empty or mislabelled delete target");
                    }
                    // Every later computation on a target (its end, its
                    // first event, joining) relies on this sum fitting.
                    let Some(end) = t.start.counter().checked_add(u64::from(t.len)) else {
                        return Err("delete target past the last counter");
                    };
                    if t.start.replica() == self.replica() && end > self.id.counter() {
                        return Err("delete target is not an earlier event");
                    }
                    sum += u64::from(t.len);
                }
                if targets
                    .windows(2)
                    .any(|w| continues(&w[0], &first_event(&w[1])).is_some())
                {
                    return Err("delete targets not joined");
                }
                sum
            }
        };
        if len > u64::from(MAX_ITEMS) {
            return Err("op too long");
        }
        // Its events are counters `counter .. counter + len`.
        if self.id.counter() > MAX_COUNTER + 1 - len {
            return Err("op's counters past the last a replica can have");
        }
        Ok(())
    }
}

/// How `next` continues `last` when deleted right after it: forward
/// (`Some(false)`), backward (`Some(true)`), or not at all (`None`).
fn continues(last: &Target, next: &Target) -> Option<bool> {
    if last.start.replica() != next.start.replica() {
        return None;
    }
    let (lc, nc) = (last.start.counter(), next.start.counter());
    let forward = (last.len == 1 || !last.reversed) && (next.len == 1 || !next.reversed);
    let backward = (last.len == 1 || last.reversed) && (next.len == 1 || next.reversed);
    if forward && nc == lc + u64::from(last.len) {
        Some(false)
    } else if backward && nc + u64::from(next.len) == lc {
        Some(true)
    } else {
        None
    }
}

/// The first event of `t` as a target of its own.
fn first_event(t: &Target) -> Target {
    let offset = if t.reversed { u64::from(t.len) - 1 } else { 0 };
    Target {
        start: Dot::new(t.start.replica(), t.start.counter() + offset),
        len: 1,
        reversed: false,
    }
}

/// Appends `t` to `targets`, joining it with the last target when they
/// continue each other (forward or backward).
///
/// Targets are joined greedily, event by event: if only the first event of
/// `t` continues the last target, it joins and the rest starts anew. Every
/// list of targets is thus the one unique greedy split of its events, which
/// keeps equal ops equal and their encoding canonical.
pub(crate) fn push_target(targets: &mut Targets, mut t: Target) {
    while let Some(last) = targets.last_mut() {
        match continues(last, &t) {
            Some(false) => {
                last.len += t.len;
                last.reversed = false;
                return;
            }
            Some(true) => {
                last.start = t.start;
                last.len += t.len;
                last.reversed = true;
                return;
            }
            None if t.len > 1 && continues(last, &first_event(&t)).is_some() => {
                let first = first_event(&t);
                t = Target {
                    start: if t.reversed {
                        t.start
                    } else {
                        Dot::new(t.start.replica(), t.start.counter() + 1)
                    },
                    len: t.len - 1,
                    reversed: t.reversed,
                };
                push_target(targets, first);
            }
            None => break,
        }
    }
    targets.push(Target {
        reversed: t.reversed && t.len > 1,
        ..t
    });
}

/// Appends the ids of items `lv .. lv + n` to `targets` (from the top down
/// when `reversed`).
pub(crate) fn push_targets(
    history: &History,
    hint: &mut usize,
    targets: &mut Targets,
    lv: u32,
    n: u32,
    reversed: bool,
) {
    let first = targets.len();
    history.pieces(hint, lv, n, |e, lv, k| {
        let entry = &history.inserts[e];
        let start = Dot::new(
            history.agents[entry.agent as usize].id,
            entry.counter() + u64::from(lv - history.lvs[e]),
        );
        let t = Target {
            start,
            len: k,
            reversed,
        };
        if reversed {
            // Pieces come lowest first; a backward deletion lists them
            // highest first. Collect them unjoined, then reverse and join.
            targets.push(t);
        } else {
            push_target(targets, t);
        }
    });
    if reversed {
        let pieces = targets.split_off(first);
        for t in pieces.into_iter().rev() {
            push_target(targets, t);
        }
    }
}

impl fmt::Debug for TextOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            OpKind::Insert(ins) => write!(
                f,
                "insert {:?}+{} {:?} after {:?} before {:?} hidden {:?}",
                self.id, ins.len, ins.text, ins.origin_left, ins.origin_right, ins.hidden
            ),
            OpKind::Delete(targets) => {
                write!(f, "delete {:?}:", self.id)?;
                for t in targets {
                    let arrow = if t.reversed { "<-" } else { "" };
                    write!(f, " {arrow}{:?}+{}", t.start, t.len)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(r: u64, c: u64) -> Dot {
        Dot::new(ReplicaId::new(r), c)
    }

    fn insert(c: u64, text: &str, hidden: Vec<(u32, u32)>, left: Option<Dot>) -> TextOp {
        let len = char_len(text) as u32 + hidden.iter().map(|h| h.1).sum::<u32>();
        TextOp {
            id: dot(1, c),
            kind: OpKind::Insert(Insertion {
                origin_left: left,
                origin_right: Some(dot(2, 1)),
                len,
                text: Content::from(text),
                hidden,
            }),
        }
    }

    /// Slicing an insertion keeps ids, origins, text and hidden stretches
    /// consistent, and appending the slices back gives the original.
    #[test]
    fn insert_slices_append_back() {
        let op = insert(5, "aé😀b", vec![(1, 2), (5, 1)], None);
        assert_eq!(op.check(), Ok(()));
        for cut in 1..op.len32() {
            let mut a = op.slice(0, cut);
            let b = op.slice(cut, op.len32());
            assert_eq!(a.check(), Ok(()), "{a:?}");
            assert_eq!(b.check(), Ok(()), "{b:?}");
            assert!(a.try_append(&b));
            assert_eq!(a, op);
        }
    }

    /// Delete targets join forward and backward, and slices of a reversed
    /// target pick the right ids.
    #[test]
    fn delete_targets_join_and_slice() {
        let mut targets = Targets::default();
        for c in [9, 8, 7] {
            push_target(
                &mut targets,
                Target {
                    start: dot(2, c),
                    len: 1,
                    reversed: false,
                },
            );
        }
        assert_eq!(targets.len(), 1);
        assert!(targets[0].reversed);
        let op = TextOp {
            id: dot(1, 1),
            kind: OpKind::Delete(targets),
        };
        assert_eq!(op.check(), Ok(()));
        let tail = op.slice(1, 3);
        let OpKind::Delete(t) = &tail.kind else {
            panic!("not a delete")
        };
        assert_eq!((t[0].start, t[0].len, t[0].reversed), (dot(2, 7), 2, true));
        let mut head = op.slice(0, 1);
        assert!(head.try_append(&tail));
        assert_eq!(head, op);
    }

    /// A list of exactly one target is always held inline, however it was
    /// made, so equal lists compare equal.
    #[test]
    fn one_target_is_inline() {
        let t = |c| Target {
            start: dot(2, c),
            len: 1,
            reversed: false,
        };
        let mut a = Targets::default();
        assert!(a.is_empty());
        a.push(t(1));
        assert_eq!(a, Targets::One(t(1)));
        assert_eq!(Targets::from(vec![t(1)]), a);
        a.push(t(5));
        assert_eq!(&*a, &[t(1), t(5)]);
        assert_eq!(a.split_off(1), vec![t(5)]);
        assert_eq!(a, Targets::One(t(1)));
        assert_eq!(a.split_off(0), vec![t(1)]);
        assert_eq!(a, Targets::default());
    }

    /// Target lists are the greedy split of their events, whichever way the
    /// pieces arrive: `2, 3, 2` is `[2..=3] [2]`, never `[2] [3..=2]`.
    #[test]
    fn targets_join_greedily() {
        let t = |c, len, reversed| Target {
            start: dot(2, c),
            len,
            reversed,
        };
        let mut a = Targets::One(t(2, 1, false));
        push_target(&mut a, t(2, 2, true));
        assert_eq!(a, Targets::from(vec![t(2, 2, false), t(2, 1, false)]));
        let mut b = Targets::default();
        for c in [2, 3, 2] {
            push_target(&mut b, t(c, 1, false));
        }
        assert_eq!(a, b);
        let op = TextOp {
            id: dot(1, 1),
            kind: OpKind::Delete(vec![t(2, 1, false), t(2, 2, true)].into()),
        };
        assert!(op.check().is_err(), "a non-greedy split is refused");
    }

    /// Ops that break the rules are reported.
    #[test]
    fn check_rejects_bad_ops() {
        let own_future = insert(5, "a", vec![], Some(dot(1, 5)));
        assert!(own_future.check().is_err());
        let mut bad_len = insert(5, "ab", vec![], None);
        if let OpKind::Insert(ins) = &mut bad_len.kind {
            ins.len = 3;
        }
        assert!(bad_len.check().is_err());
        // Counters up to MAX_COUNTER pass; one event past it does not.
        assert_eq!(insert(MAX_COUNTER - 1, "ab", vec![], None).check(), Ok(()));
        assert!(insert(MAX_COUNTER, "ab", vec![], None).check().is_err());
        assert!(insert(u64::MAX, "a", vec![], None).check().is_err());
    }
}
