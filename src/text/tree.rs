//! The run tree: every item of the document, in order, in a B-tree of runs.
//!
//! # Shape
//!
//! Leaves ([`Leaf`]) hold runs and their visible text. Internal nodes hold up
//! to [`FANOUT`] children and, per child, the [`Metrics`] of everything below
//! it: visible characters, UTF-8 bytes and UTF-16 units. All leaves sit at
//! the same depth. Both levels live in `Vec` arenas and point at each other
//! with `u32` indices (no raw pointers, no `unsafe`):
//!
//! ```text
//!                  node 0: [chars 11 | chars 6]          (root)
//!                   /                      \
//!   leaf 0: [0..5][x5..6][9..15]      leaf 1: [15..21]
//!           "hello world"                     " again"
//! ```
//!
//! Finding the character at position `p` descends from the root, skipping
//! children whose character count lies wholly before `p`: O(log n) with a
//! small constant (a scan of at most 17 counts per level).
//!
//! Leaves are never removed: deleting text turns runs into tombstones, which
//! stay, so the tree only grows. A leaf that overflows ([`Leaf::overfull`])
//! is split in two, and a node that overflows is split the same way, up to a
//! new root. A split never changes the metrics of any ancestor (the halves
//! sum to the old whole), so it costs no walk to the root. Leaf 0 is always
//! the first leaf, because a split moves the *tail* of a leaf into the new
//! one.
//!
//! # Finding an item by local version
//!
//! Remote operations name items by id, which the history turns into a local
//! version (`lv`). [`Tree::locate`] answers "where is item `lv`" through
//! `index`, an ordered map from the first `lv` of each range of local
//! versions to the leaf they were created in. Local typing appends to the
//! last range, so the index grows by one entry per leaf a burst of typing
//! lands in, not per character.
//!
//! A split moves the tail of a leaf into a new leaf right after it, so an
//! item is always in the leaf the index names or in a leaf a little further
//! along the leaf chain (the leaves split off it, which stay next to it).
//! Splits therefore leave the index alone (re-pointing every moved range
//! was the most expensive part of a split, and local editing never reads
//! the index); [`Tree::locate`] walks the chain from the indexed leaf, and
//! [`Tree::locate_fresh`], used by remote operations, re-points the range
//! it found so the walk stays short where remote edits happen.
//!
//! # Cursor cache
//!
//! Editors type where they typed last. `cursor` remembers the leaf of the
//! last local edit and the character position where that leaf starts, so the
//! next edit in the same leaf skips the descent entirely. An edit before the
//! cached leaf would move its start, so every edit either refreshes the
//! cache or clears it.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::NONE;
use super::leaf::{Leaf, MAX_RUNS, Run, char_len, utf16_len};

/// Most children of an internal node (one more is allowed for an instant,
/// before the node splits).
pub(crate) const FANOUT: usize = 16;

/// Sizes of a subtree in the three units editors use.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Metrics {
    /// Visible Unicode scalar values.
    pub(crate) chars: usize,
    /// UTF-8 bytes of the visible text.
    pub(crate) bytes: usize,
    /// UTF-16 code units of the visible text.
    pub(crate) utf16: usize,
}

impl Metrics {
    fn of(leaf: &Leaf) -> Self {
        Self {
            chars: leaf.chars,
            bytes: leaf.text.len(),
            utf16: leaf.utf16,
        }
    }

    /// `self + add - sub`; the result is never negative because `sub` was
    /// part of `self`.
    fn adjust(&mut self, add: Self, sub: Self) {
        self.chars = self.chars + add.chars - sub.chars;
        self.bytes = self.bytes + add.bytes - sub.bytes;
        self.utf16 = self.utf16 + add.utf16 - sub.utf16;
    }

    fn add(&mut self, other: Self) {
        self.adjust(other, Self::default());
    }
}

/// An internal node: children (all leaves or all nodes) and their metrics.
#[derive(Clone, Debug)]
struct Node {
    /// Number of children in use.
    len: usize,
    /// Arena indices of the children, in document order.
    children: [u32; FANOUT + 1],
    /// `metrics[i]` sums everything below `children[i]`.
    metrics: [Metrics; FANOUT + 1],
    /// The parent node, or [`NONE`] for the root.
    parent: u32,
    /// This node's index among its parent's children.
    slot: u8,
    /// Whether the children are leaves (else internal nodes).
    leaves: bool,
}

impl Node {
    fn sum(&self, range: std::ops::Range<usize>) -> Metrics {
        let mut m = Metrics::default();
        for x in &self.metrics[range] {
            m.add(*x);
        }
        m
    }
}

/// A place between two items: just before item `runs[run].lv + offset` of
/// `leaf`, or at the end of the leaf when `run == runs.len()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    /// The leaf.
    pub(crate) leaf: u32,
    /// Index of the run in the leaf (`<= runs.len()`).
    pub(crate) run: usize,
    /// Items of that run before the place (`< len`, or 0 at the leaf end).
    pub(crate) offset: u32,
    /// Visible characters of the leaf before the place.
    pub(crate) chars: usize,
}

/// The document's items in order; see the module docs.
#[derive(Clone, Debug)]
pub(crate) struct Tree {
    /// Leaf arena; leaf 0 is always the first leaf in document order.
    leaves: Vec<Leaf>,
    /// Internal node arena.
    nodes: Vec<Node>,
    /// The root: a node, or leaf 0 when `nodes` is empty.
    root: u32,
    /// First local version of each range of local versions living in one
    /// leaf, mapped to that leaf. A range runs up to the next key.
    index: BTreeMap<u32, u32>,
    /// The metrics of the whole document.
    total: Metrics,
    /// Where the last local edit was; cleared by any change that could
    /// move that leaf's start.
    cursor: Option<Cursor>,
}

/// The cursor cache (see the module docs): a leaf, where it starts, and a
/// run of it with the visible characters before that run, so a scan for
/// the next edit can start there instead of at the leaf's first run.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    /// The leaf of the last local edit.
    leaf: u32,
    /// Visible characters before the leaf.
    start: usize,
    /// A run index of the leaf (`<= runs.len()`).
    run: usize,
    /// Visible characters of the leaf's runs before `run`.
    run_chars: usize,
}

impl Default for Tree {
    fn default() -> Self {
        Self {
            leaves: vec![Leaf::root()],
            nodes: Vec::new(),
            root: 0,
            index: BTreeMap::new(),
            total: Metrics::default(),
            cursor: None,
        }
    }
}

impl Tree {
    /// The metrics of the whole document.
    pub(crate) fn metrics(&self) -> Metrics {
        self.total
    }

    /// The runs and text of one leaf.
    pub(crate) fn leaf(&self, leaf: u32) -> &Leaf {
        &self.leaves[leaf as usize]
    }

    /// The leaves in document order.
    pub(crate) fn leaves(&self) -> impl Iterator<Item = &Leaf> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let leaf = self.leaves.get(at as usize)?;
            at = leaf.next;
            Some(leaf)
        })
    }

    /// The leaf holding the place `chars` characters from the start and the
    /// metrics before that leaf. With `stick_left`, a place on a boundary
    /// goes to the leaf on its left (the one holding character `chars - 1`);
    /// otherwise to the one holding character `chars`. Uses the selected
    /// unit: `unit(m)` reads the count to descend by.
    fn descend(
        &self,
        mut target: usize,
        stick_left: bool,
        unit: fn(&Metrics) -> usize,
    ) -> (u32, Metrics) {
        let mut before = Metrics::default();
        if self.nodes.is_empty() {
            return (0, before);
        }
        let mut node = &self.nodes[self.root as usize];
        loop {
            let mut i = 0;
            while i + 1 < node.len {
                let c = unit(&node.metrics[i]);
                let inside = if stick_left { target <= c } else { target < c };
                if inside {
                    break;
                }
                target -= c;
                before.add(node.metrics[i]);
                i += 1;
            }
            let child = node.children[i];
            if node.leaves {
                return (child, before);
            }
            node = &self.nodes[child as usize];
        }
    }

    /// The leaf holding the place `chars` characters from the start and the
    /// character position where it starts, consulting the cursor cache.
    fn find_chars(&self, chars: usize, stick_left: bool) -> (u32, usize) {
        if let Some(Cursor { leaf, start, .. }) = self.cursor {
            let len = self.leaves[leaf as usize].chars;
            let inside = if stick_left {
                chars > start && chars <= start + len
            } else {
                chars >= start && chars < start + len
            };
            if inside {
                return (leaf, start);
            }
        }
        let (leaf, before) = self.descend(chars, stick_left, |m| m.chars);
        (leaf, before.chars)
    }

    /// Where a local insert at character `chars` (`<= len`) goes: right
    /// after the visible character `chars - 1`, past any tombstones that
    /// follow it in the same leaf, so the new text lands just before the
    /// next visible character. Sets the cursor cache.
    pub(crate) fn insert_point(&mut self, chars: usize) -> Pos {
        let (leaf, start) = if chars == 0 {
            (0, 0)
        } else {
            self.find_chars(chars, true)
        };
        let runs = &self.leaves[leaf as usize].runs;
        let want = chars - start;
        // Start the scan at the cached run when the place is at or after it.
        let (mut i, mut acc) = match self.cursor {
            Some(c) if c.leaf == leaf && c.run_chars <= want && c.run <= runs.len() => {
                (c.run, c.run_chars)
            }
            _ => (0, 0),
        };
        self.cursor = Some(Cursor {
            leaf,
            start,
            run: i,
            run_chars: acc,
        });
        let mut offset = 0;
        if want > 0 {
            while i < runs.len() {
                let v = runs[i].visible() as usize;
                if acc + v >= want {
                    offset = (want - acc) as u32;
                    break;
                }
                acc += v;
                i += 1;
            }
            if offset == runs[i].len() {
                i += 1;
                offset = 0;
            }
        }
        while i < runs.len() && offset == 0 && runs[i].deleted() {
            i += 1;
        }
        Pos {
            leaf,
            run: i,
            offset,
            chars: want,
        }
    }

    /// The items just before and just after `pos` ([`NONE`] at the ends of
    /// the document).
    pub(crate) fn neighbors(&self, pos: Pos) -> (u32, u32) {
        let leaf = &self.leaves[pos.leaf as usize];
        let left = if pos.offset > 0 {
            leaf.runs[pos.run].lv + pos.offset - 1
        } else if pos.run > 0 {
            leaf.runs[pos.run - 1].end() - 1
        } else {
            self.last_item_before(pos.leaf)
        };
        let right = match leaf.runs.get(pos.run) {
            Some(r) => r.lv + pos.offset,
            None => self.first_item_after(pos.leaf),
        };
        (left, right)
    }

    /// The last item of the leaves before `leaf`, or [`NONE`].
    fn last_item_before(&self, leaf: u32) -> u32 {
        let mut at = self.leaves[leaf as usize].prev;
        while at != NONE {
            let l = &self.leaves[at as usize];
            if let Some(r) = l.runs.last() {
                return r.end() - 1;
            }
            at = l.prev;
        }
        NONE
    }

    /// The first item of the leaves after `leaf`, or [`NONE`].
    fn first_item_after(&self, leaf: u32) -> u32 {
        let mut at = self.leaves[leaf as usize].next;
        while at != NONE {
            let l = &self.leaves[at as usize];
            if let Some(r) = l.runs.first() {
                return r.lv;
            }
            at = l.next;
        }
        NONE
    }

    /// The place at the very start of the document.
    pub(crate) fn start(&self) -> Pos {
        Pos {
            leaf: 0,
            run: 0,
            offset: 0,
            chars: 0,
        }
    }

    /// Where item `lv` is, or `None` if the tree has no such item.
    ///
    /// The index names the leaf the item was created in; splits since may
    /// have moved it into a leaf further right (see the module docs), so
    /// the search walks the leaf chain from there.
    pub(crate) fn locate(&self, lv: u32) -> Option<Pos> {
        self.locate_hops(lv).map(|(pos, _)| pos)
    }

    /// As [`Tree::locate`], also counting the leaves walked past.
    fn locate_hops(&self, lv: u32) -> Option<(Pos, u32)> {
        let (_, &first) = self.index.range(..=lv).next_back()?;
        let mut leaf = first;
        let mut hops = 0;
        while leaf != NONE {
            let mut chars = 0;
            for (i, r) in self.leaves[leaf as usize].runs.iter().enumerate() {
                if r.contains(lv) {
                    let offset = lv - r.lv;
                    if !r.deleted() {
                        chars += offset as usize;
                    }
                    let pos = Pos {
                        leaf,
                        run: i,
                        offset,
                        chars,
                    };
                    return Some((pos, hops));
                }
                chars += r.visible() as usize;
            }
            leaf = self.leaves[leaf as usize].next;
            hops += 1;
        }
        None
    }

    /// As [`Tree::locate`], and when the walk was long, points the index
    /// straight at the leaf found for the item's whole run, so the next
    /// lookup of it (or its neighbours) walks no chain. A walk of one leaf
    /// is cheaper than the index update, so short walks are left alone.
    pub(crate) fn locate_fresh(&mut self, lv: u32) -> Option<Pos> {
        let (pos, hops) = self.locate_hops(lv)?;
        if hops > 1 {
            let run = self.leaves[pos.leaf as usize].runs[pos.run];
            self.index_move(run.lv, run.end(), pos.leaf);
        }
        Some(pos)
    }

    /// The run under `pos`, if `pos` is not at the end of its leaf.
    pub(crate) fn run_at(&self, pos: Pos) -> Option<Run> {
        self.leaves[pos.leaf as usize].runs.get(pos.run).copied()
    }

    /// The place `n` items after `pos`, which must stay inside the run
    /// under `pos` or reach its end (then the place is the start of the next
    /// run of the same leaf, or the end of the leaf).
    pub(crate) fn advance(&self, pos: Pos, n: u32) -> Pos {
        let run = self.leaves[pos.leaf as usize].runs[pos.run];
        let offset = pos.offset + n;
        let chars = pos.chars + if run.deleted() { 0 } else { n as usize };
        if offset < run.len() {
            Pos {
                offset,
                chars,
                ..pos
            }
        } else {
            Pos {
                run: pos.run + 1,
                offset: 0,
                chars,
                ..pos
            }
        }
    }

    /// The same place with an item after it: `pos` itself, or the start of
    /// the next non-empty leaf when `pos` is at the end of its leaf. `None`
    /// at the end of the document.
    pub(crate) fn normalize(&self, pos: Pos) -> Option<Pos> {
        let leaf = &self.leaves[pos.leaf as usize];
        if pos.run < leaf.runs.len() {
            return Some(pos);
        }
        let mut at = leaf.next;
        while at != NONE {
            if !self.leaves[at as usize].runs.is_empty() {
                return Some(Pos {
                    leaf: at,
                    run: 0,
                    offset: 0,
                    chars: 0,
                });
            }
            at = self.leaves[at as usize].next;
        }
        None
    }

    /// The place just after the item at `pos`.
    pub(crate) fn after(&self, pos: Pos) -> Pos {
        self.advance(pos, 1)
    }

    /// Document order of two places (or items, by their places).
    pub(crate) fn cmp(&self, a: Pos, b: Pos) -> Ordering {
        if a.leaf != b.leaf {
            return self.path(a.leaf).cmp(&self.path(b.leaf));
        }
        (a.run, a.offset).cmp(&(b.run, b.offset))
    }

    /// The slots from the root down to `leaf`, for ordering leaves.
    fn path(&self, leaf: u32) -> Vec<u8> {
        let mut path = Vec::with_capacity(8);
        let l = &self.leaves[leaf as usize];
        let (mut slot, mut parent) = (l.slot, l.parent);
        while parent != NONE {
            path.push(slot);
            let node = &self.nodes[parent as usize];
            (slot, parent) = (node.slot, node.parent);
        }
        path.reverse();
        path
    }

    /// Inserts `run` (new local versions, never seen before) at `pos`, with
    /// `text` as its content when visible (`""` for a deleted run).
    ///
    /// The run joins its left neighbour when their local versions continue
    /// (the common case of typing), so a burst of typing stays one run.
    pub(crate) fn insert(&mut self, pos: Pos, run: Run, text: &str) {
        let leaf_id = pos.leaf;
        if self.cursor.is_some_and(|c| c.leaf != leaf_id) {
            // An insert before the cached leaf would move its start.
            self.cursor = None;
        }
        let leaf = &mut self.leaves[leaf_id as usize];
        let old = Metrics::of(leaf);
        let mut at = pos.run;
        if pos.offset > 0 {
            let (l, r) = leaf.runs[at].split(pos.offset);
            leaf.runs[at] = l;
            leaf.runs.insert(at + 1, r);
            at += 1;
        }
        let (cached, cached_chars) = if at > 0 && leaf.runs[at - 1].joins(run) {
            let prev = leaf.runs[at - 1];
            leaf.runs[at - 1] = prev.with_len(prev.len() + run.len());
            (at - 1, pos.chars - prev.visible() as usize)
        } else {
            leaf.runs.insert(at, run);
            (at, pos.chars)
        };
        if let Some(c) = &mut self.cursor {
            c.run = cached;
            c.run_chars = cached_chars;
        }
        if !text.is_empty() {
            let byte = leaf.byte_of(pos.chars);
            leaf.text.insert_str(byte, text);
            leaf.chars += run.len() as usize;
            leaf.utf16 += utf16_len(text);
        }
        self.index_append(run.lv, leaf_id);
        self.propagate(leaf_id, old);
        self.split_if_needed(leaf_id);
    }

    /// Deletes `len` visible characters starting at character `chars`,
    /// calling `deleted(lv, n)` for each deleted stretch of items in
    /// document order. The caller checked the range.
    pub(crate) fn delete_chars(
        &mut self,
        chars: usize,
        mut len: usize,
        mut deleted: impl FnMut(u32, u32),
    ) {
        let (mut leaf, start) = self.find_chars(chars, false);
        let hint = match self.cursor {
            Some(c) if c.leaf == leaf => (c.run, c.run_chars),
            _ => (0, 0),
        };
        let mut from = chars - start;
        let mut first = true;
        while len > 0 && leaf != NONE {
            let l = &self.leaves[leaf as usize];
            let here = len.min(l.chars - from);
            if here > 0 {
                let (mut i, mut offset) = if first {
                    visible_index_from(&l.runs, from, hint)
                } else {
                    visible_index_from(&l.runs, from, (0, 0))
                };
                let mut left = here;
                while left > 0 {
                    let r = self.leaves[leaf as usize].runs[i];
                    if r.deleted() {
                        i += 1;
                        continue;
                    }
                    let take = (r.len() - offset).min(left as u32);
                    deleted(r.lv + offset, take);
                    // Killed characters stop being visible, so `from`
                    // characters still come before the next one.
                    let dead = self.kill(leaf, i, offset, take, from);
                    if first {
                        // Backspacing deletes the character before next:
                        // cache the run before the tombstone.
                        let runs = &self.leaves[leaf as usize].runs;
                        let (run, run_chars) = match dead.checked_sub(1) {
                            Some(p) if (runs[p].visible() as usize) <= from => {
                                (p, from - runs[p].visible() as usize)
                            }
                            _ => (dead, from),
                        };
                        self.cursor = Some(Cursor {
                            leaf,
                            start,
                            run,
                            run_chars,
                        });
                        first = false;
                    }
                    i = dead + 1;
                    offset = 0;
                    left -= take as usize;
                }
                len -= here;
            }
            let next = self.leaves[leaf as usize].next;
            self.split_if_needed(leaf);
            leaf = next;
            from = 0;
        }
    }

    /// Marks the items `lv .. lv + n` deleted wherever they are, calling
    /// `deleted(lv, n)` for each stretch that was visible. Items already
    /// deleted stay so. Returns `false` (changing nothing further) at the
    /// first item the tree does not hold.
    pub(crate) fn delete_items(
        &mut self,
        mut lv: u32,
        n: u32,
        mut deleted: impl FnMut(u32, u32),
    ) -> bool {
        let end = lv + n;
        self.cursor = None;
        while lv < end {
            let Some(pos) = self.locate_fresh(lv) else {
                return false;
            };
            let r = self.leaves[pos.leaf as usize].runs[pos.run];
            let take = (r.len() - pos.offset).min(end - lv);
            if !r.deleted() {
                deleted(lv, take);
                self.kill(pos.leaf, pos.run, pos.offset, take, pos.chars);
                self.split_if_needed(pos.leaf);
            }
            lv += take;
        }
        true
    }

    /// Turns items `offset .. offset + take` of visible run `i` of `leaf`
    /// into a tombstone, where `chars` visible characters of the leaf come
    /// before them. Joins the tombstone with tombstone neighbours whose local
    /// versions continue it. Returns the tombstone's run index.
    fn kill(&mut self, leaf_id: u32, i: usize, offset: u32, take: u32, chars: usize) -> usize {
        let leaf = &mut self.leaves[leaf_id as usize];
        let old = Metrics::of(leaf);
        let b0 = leaf.byte_of(chars);
        let b1 = if leaf.text.len() == leaf.chars {
            b0 + take as usize
        } else {
            b0 + leaf.text[b0..]
                .char_indices()
                .nth(take as usize)
                .map_or(leaf.text.len() - b0, |(b, _)| b)
        };
        leaf.utf16 -= utf16_len(&leaf.text[b0..b1]);
        leaf.chars -= take as usize;
        leaf.text.drain(b0..b1);
        if leaf.text.capacity() > 2 * leaf.text.len() + 256 {
            // Deleting mostly empties leaves of a document that once held
            // far more text: give the memory back.
            leaf.text.shrink_to(leaf.text.len() + 64);
        }

        let r = leaf.runs[i];
        let mut at = i;
        let dead = Run::new(r.lv + offset, take, true);
        if offset > 0 {
            leaf.runs[at] = r.with_len(offset);
            at += 1;
            leaf.runs.insert(at, dead);
        } else {
            leaf.runs[at] = dead;
        }
        let rest = r.len() - offset - take;
        if rest > 0 {
            leaf.runs
                .insert(at + 1, Run::new(r.lv + offset + take, rest, false));
        }
        if at > 0 && leaf.runs[at - 1].joins(leaf.runs[at]) {
            let prev = leaf.runs[at - 1];
            leaf.runs[at - 1] = prev.with_len(prev.len() + take);
            leaf.runs.remove(at);
            at -= 1;
        }
        if at + 1 < leaf.runs.len() && leaf.runs[at].joins(leaf.runs[at + 1]) {
            let here = leaf.runs[at];
            leaf.runs[at] = here.with_len(here.len() + leaf.runs[at + 1].len());
            leaf.runs.remove(at + 1);
        }
        self.propagate(leaf_id, old);
        at
    }

    /// Calls `visit` for each stretch of items `lv .. lv + n` in local
    /// version order: `Ok(text)` for visible items, `Err(count)` for
    /// deleted ones. Returns `false` if the tree lacks some item.
    pub(crate) fn read(
        &self,
        mut lv: u32,
        n: u32,
        mut visit: impl FnMut(Result<&str, u32>),
    ) -> bool {
        let end = lv + n;
        while lv < end {
            let Some(pos) = self.locate(lv) else {
                return false;
            };
            let leaf = &self.leaves[pos.leaf as usize];
            // Consecutive local versions are usually consecutive runs of the
            // same leaf: follow them without another index lookup.
            let mut i = pos.run;
            let mut offset = pos.offset;
            let mut chars = pos.chars;
            while lv < end && i < leaf.runs.len() && leaf.runs[i].contains(lv) {
                let r = leaf.runs[i];
                let take = (r.len() - offset).min(end - lv);
                if r.deleted() {
                    visit(Err(take));
                } else {
                    let b0 = leaf.byte_of(chars);
                    let b1 = leaf.byte_of(chars + take as usize);
                    visit(Ok(&leaf.text[b0..b1]));
                    chars += r.len() as usize - offset as usize;
                }
                lv += take;
                i += 1;
                offset = 0;
                if i < leaf.runs.len() && leaf.runs[i].lv != lv {
                    break;
                }
            }
        }
        true
    }

    /// Converts a position in `from` units to the matching character
    /// position, or `Err(())` when it is past the end or inside a
    /// character's encoding.
    pub(crate) fn unit_to_chars(
        &self,
        target: usize,
        unit: fn(&Metrics) -> usize,
        width: fn(char) -> usize,
    ) -> Result<usize, ()> {
        if target > unit(&self.total) {
            return Err(());
        }
        let (leaf, before) = self.descend(target, true, unit);
        let mut at = unit(&before);
        let mut chars = before.chars;
        for c in self.leaves[leaf as usize].text.chars() {
            if at >= target {
                break;
            }
            at += width(c);
            chars += 1;
        }
        if at == target { Ok(chars) } else { Err(()) }
    }

    /// Converts a character position (`<= len`) to `unit`s.
    pub(crate) fn chars_to_unit(
        &self,
        chars: usize,
        unit: fn(&Metrics) -> usize,
        width: fn(char) -> usize,
    ) -> usize {
        let (leaf, before) = self.descend(chars, true, |m| m.chars);
        let take = chars - before.chars;
        unit(&before)
            + self.leaves[leaf as usize]
                .text
                .chars()
                .take(take)
                .map(width)
                .sum::<usize>()
    }

    /// Records that the new local versions from `lv` on live in `leaf`.
    fn index_append(&mut self, lv: u32, leaf: u32) {
        match self.index.last_key_value() {
            Some((&k, &l)) if l == leaf && k <= lv => {}
            _ => {
                self.index.insert(lv, leaf);
            }
        }
    }

    /// Re-points the local versions `start .. end` (already in the index)
    /// to `leaf`, keeping ranges that share a leaf joined.
    fn index_move(&mut self, start: u32, end: u32, leaf: u32) {
        let tail = self.index.range(..=end).next_back().map(|(_, &l)| l);
        while let Some((&k, _)) = self.index.range(start..=end).next() {
            self.index.remove(&k);
        }
        if let Some(t) = tail {
            if t != leaf {
                self.index.insert(end, t);
            }
        }
        let joins_prev = self.index.range(..start).next_back().map(|(_, &l)| l) == Some(leaf);
        if !joins_prev {
            self.index.insert(start, leaf);
        }
    }

    /// Pushes a change of `leaf`'s metrics (from `old`) up to the root.
    fn propagate(&mut self, leaf: u32, old: Metrics) {
        let new = Metrics::of(&self.leaves[leaf as usize]);
        if new == old {
            return;
        }
        self.total.adjust(new, old);
        let l = &self.leaves[leaf as usize];
        let (mut slot, mut parent) = (l.slot, l.parent);
        while parent != NONE {
            let node = &mut self.nodes[parent as usize];
            node.metrics[slot as usize].adjust(new, old);
            (slot, parent) = (node.slot, node.parent);
        }
    }

    /// Splits `leaf` (and the halves, recursively) while it is overfull.
    fn split_if_needed(&mut self, leaf: u32) {
        if !self.leaves[leaf as usize].overfull() {
            return;
        }
        let right = self.split_leaf(leaf);
        self.split_if_needed(leaf);
        self.split_if_needed(right);
    }

    /// Moves the second half of `leaf_id` (by runs, or by bytes for a leaf
    /// with few, long runs) into a new leaf after it. Returns the new leaf.
    fn split_leaf(&mut self, leaf_id: u32) -> u32 {
        if let Some(c) = &mut self.cursor {
            if c.leaf == leaf_id {
                // Run indices past the split move to the new leaf.
                c.run = 0;
                c.run_chars = 0;
            }
        }
        let new_id = self.leaves.len() as u32;
        let leaf = &mut self.leaves[leaf_id as usize];
        let (mid, chars) = split_point(leaf);
        let byte = leaf.byte_of(chars);
        let runs: Vec<Run> = leaf.runs.drain(mid..).collect();
        leaf.runs.shrink_to(MAX_RUNS / 2 + 8);
        let text = leaf.text.split_off(byte);
        leaf.text.shrink_to(leaf.text.len() + 64);
        let right = Leaf {
            chars: char_len(&text),
            utf16: utf16_len(&text),
            runs,
            text,
            parent: leaf.parent,
            slot: 0,
            prev: leaf_id,
            next: leaf.next,
        };
        leaf.chars -= right.chars;
        leaf.utf16 -= right.utf16;
        let next = leaf.next;
        leaf.next = new_id;
        if next != NONE {
            self.leaves[next as usize].prev = new_id;
        }
        let (left_m, right_m) = (
            Metrics::of(&self.leaves[leaf_id as usize]),
            Metrics::of(&right),
        );
        // The moved runs keep their index entries (pointing here); lookups
        // walk on to the new leaf, and `locate_fresh` re-points them.
        self.leaves.push(right);
        let parent = self.leaves[leaf_id as usize].parent;
        if parent == NONE {
            self.new_root(leaf_id, new_id, left_m, right_m, true);
        } else {
            let slot = self.leaves[leaf_id as usize].slot as usize;
            self.nodes[parent as usize].metrics[slot] = left_m;
            self.insert_child(parent, slot + 1, new_id, right_m);
        }
        new_id
    }

    /// Makes a new root above `left` and `right`.
    fn new_root(&mut self, left: u32, right: u32, lm: Metrics, rm: Metrics, leaves: bool) {
        let id = self.nodes.len() as u32;
        let mut node = Node {
            len: 2,
            children: [NONE; FANOUT + 1],
            metrics: [Metrics::default(); FANOUT + 1],
            parent: NONE,
            slot: 0,
            leaves,
        };
        node.children[0] = left;
        node.children[1] = right;
        node.metrics[0] = lm;
        node.metrics[1] = rm;
        self.nodes.push(node);
        self.set_parent(left, leaves, id, 0);
        self.set_parent(right, leaves, id, 1);
        self.root = id;
    }

    /// Records that `child` is child number `slot` of `parent`.
    fn set_parent(&mut self, child: u32, is_leaf: bool, parent: u32, slot: usize) {
        let slot = slot as u8;
        if is_leaf {
            let l = &mut self.leaves[child as usize];
            (l.parent, l.slot) = (parent, slot);
        } else {
            let n = &mut self.nodes[child as usize];
            (n.parent, n.slot) = (parent, slot);
        }
    }

    /// Inserts `child` at `slot` of `node`, splitting the node if it
    /// overflows.
    fn insert_child(&mut self, node_id: u32, slot: usize, child: u32, m: Metrics) {
        let node = &mut self.nodes[node_id as usize];
        let len = node.len;
        node.children.copy_within(slot..len, slot + 1);
        node.metrics.copy_within(slot..len, slot + 1);
        node.children[slot] = child;
        node.metrics[slot] = m;
        node.len += 1;
        let (leaves, len) = (node.leaves, node.len);
        for k in slot..len {
            let c = self.nodes[node_id as usize].children[k];
            self.set_parent(c, leaves, node_id, k);
        }
        if self.nodes[node_id as usize].len > FANOUT {
            self.split_node(node_id);
        }
    }

    /// Moves the second half of an overflowing node into a new sibling.
    fn split_node(&mut self, node_id: u32) {
        let new_id = self.nodes.len() as u32;
        let node = &mut self.nodes[node_id as usize];
        let half = node.len / 2;
        let mut right = Node {
            len: node.len - half,
            children: [NONE; FANOUT + 1],
            metrics: [Metrics::default(); FANOUT + 1],
            parent: node.parent,
            slot: 0,
            leaves: node.leaves,
        };
        right.children[..right.len].copy_from_slice(&node.children[half..node.len]);
        right.metrics[..right.len].copy_from_slice(&node.metrics[half..node.len]);
        node.len = half;
        let (lm, rm) = (node.sum(0..half), right.sum(0..right.len));
        let (parent, leaves) = (node.parent, node.leaves);
        let moved: Vec<u32> = right.children[..right.len].to_vec();
        self.nodes.push(right);
        for (k, c) in moved.into_iter().enumerate() {
            self.set_parent(c, leaves, new_id, k);
        }
        if parent == NONE {
            self.new_root(node_id, new_id, lm, rm, false);
        } else {
            let slot = self.nodes[node_id as usize].slot as usize;
            self.nodes[parent as usize].metrics[slot] = lm;
            self.insert_child(parent, slot + 1, new_id, rm);
        }
    }

    /// Checks every invariant of the tree; panics with a description of
    /// the first broken one. For tests.
    pub(crate) fn assert_invariants(&self) {
        let mut total = Metrics::default();
        let mut prev = NONE;
        let mut at = 0;
        let mut seen = 0;
        while at != NONE {
            let leaf = &self.leaves[at as usize];
            assert_eq!(leaf.prev, prev, "leaf chain");
            let vis: usize = leaf.runs.iter().map(|r| r.visible() as usize).sum();
            assert_eq!(vis, leaf.chars, "leaf chars");
            assert_eq!(char_len(&leaf.text), leaf.chars, "leaf text");
            assert_eq!(utf16_len(&leaf.text), leaf.utf16, "leaf utf16");
            assert!(leaf.runs.len() <= MAX_RUNS, "leaf runs");
            assert!(
                leaf.runs.windows(2).all(|w| !w[0].joins(w[1])),
                "unjoined runs {:?}",
                leaf.runs
            );
            for r in &leaf.runs {
                for lv in [r.lv, r.end() - 1] {
                    let p = self.locate(lv).expect("indexed");
                    assert_eq!(p.leaf, at, "index of {lv}");
                    let run = self.leaves[p.leaf as usize].runs[p.run];
                    assert!(run.contains(lv), "located the wrong run for {lv}");
                }
            }
            total.add(Metrics::of(leaf));
            prev = at;
            at = leaf.next;
            seen += 1;
        }
        assert_eq!(seen, self.leaves.len(), "every leaf chained");
        assert_eq!(total, self.total, "total metrics");
        for (i, node) in self.nodes.iter().enumerate() {
            for s in 0..node.len {
                let c = node.children[s];
                let (m, parent) = if node.leaves {
                    let l = &self.leaves[c as usize];
                    (Metrics::of(l), l.parent)
                } else {
                    let n = &self.nodes[c as usize];
                    (n.sum(0..n.len), n.parent)
                };
                let slot = if node.leaves {
                    self.leaves[c as usize].slot
                } else {
                    self.nodes[c as usize].slot
                };
                assert_eq!(m, node.metrics[s], "node metrics");
                assert_eq!(parent as usize, i, "parent pointer");
                assert_eq!(slot as usize, s, "slot");
            }
        }
    }
}

/// The run holding visible character `chars` of `runs` (skipping
/// tombstones) and the offset of that character in it, scanning from the
/// hint `(run, visible characters before it)` when it is not past `chars`.
fn visible_index_from(runs: &[Run], chars: usize, hint: (usize, usize)) -> (usize, u32) {
    let (start, mut acc) = if hint.1 <= chars && hint.0 <= runs.len() {
        hint
    } else {
        (0, 0)
    };
    for (i, r) in runs.iter().enumerate().skip(start) {
        let v = r.visible() as usize;
        if chars < acc + v {
            return (i, (chars - acc) as u32);
        }
        acc += v;
    }
    (runs.len(), 0)
}

/// Where to split an overfull leaf: a run index, after splitting one run in
/// two if the leaf is over its byte budget with few runs. Returns the index
/// and the visible characters before it.
fn split_point(leaf: &mut Leaf) -> (usize, usize) {
    if leaf.runs.len() > MAX_RUNS {
        let mid = leaf.runs.len() / 2;
        let chars = leaf.runs[..mid].iter().map(|r| r.visible() as usize).sum();
        return (mid, chars);
    }
    // Over the byte budget: cut at the character in the middle of the text.
    let half = leaf.chars / 2;
    let (i, offset) = visible_index_from(&leaf.runs, half, (0, 0));
    if offset > 0 {
        let (l, r) = leaf.runs[i].split(offset);
        leaf.runs[i] = l;
        leaf.runs.insert(i + 1, r);
        (i + 1, half)
    } else {
        (i, half)
    }
}
