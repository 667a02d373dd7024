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
//! lands in, not per character. Local editing never looks an item up by
//! local version, so the index is built (from the leaves, in one pass and
//! a sort) only when the first lookup needs it: a document that was only
//! edited here, or only loaded, does not hold one.
//!
//! A split moves the tail of a leaf into a new leaf right after it, so an
//! item is always in the leaf the index names or in a leaf a little further
//! along the leaf chain (the leaves split off it, which stay next to it).
//! Splits therefore leave the index alone (re-pointing every moved range
//! was the most expensive part of a split, and local editing never reads
//! the index); [`Tree::locate`] walks the chain from the indexed leaf, and
//! [`Tree::locate_fresh`], used by remote operations, re-points the run it
//! found when the walk passed more than one leaf, so walks stay short where
//! remote edits happen.
//!
//! # Cursor cache
//!
//! Editors type where they typed last. `cursor` remembers the leaf of the
//! last local edit, the character position where that leaf starts, and a
//! run of it with the characters before that run, so the next edit in the
//! same leaf skips the descent and starts its scan of the runs there
//! (typing on extends that very run; backspacing lands just before it). An
//! edit before the cached leaf would move its start, so every edit either
//! refreshes the cache or clears it; a split of the cached leaf resets the
//! run part.
//!
//! # Counts pushed up late
//!
//! An edit updates its leaf's counts and the document's total at once,
//! but its ancestors' counts only when another leaf changes, a search
//! descends from the root, or a leaf splits (`stale`): a burst of typing
//! in one leaf walks to the root once, not once per keystroke. The
//! searches of edits push the change up first; a conversion between
//! units, which cannot, corrects the counts on the stale leaf's way down
//! as it reads them.

use std::cmp::Ordering;
use std::sync::OnceLock;

use super::NONE;
use super::history::History;
use super::index::LeafIndex;
use super::leaf::{Leaf, Run, byte_at, utf16_len_of};

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
    pub(super) fn of(leaf: &Leaf) -> Self {
        Self {
            chars: leaf.chars,
            bytes: leaf.text.len(),
            utf16: leaf.utf16,
        }
    }

    /// `self + add - sub`; the result is never negative because `sub` was
    /// part of `self`.
    pub(super) fn adjust(&mut self, add: Self, sub: Self) {
        self.chars = self.chars + add.chars - sub.chars;
        self.bytes = self.bytes + add.bytes - sub.bytes;
        self.utf16 = self.utf16 + add.utf16 - sub.utf16;
    }

    pub(super) fn add(&mut self, other: Self) {
        self.adjust(other, Self::default());
    }
}

/// An internal node: children (all leaves or all nodes) and their metrics.
#[derive(Clone, Debug)]
pub(super) struct Node {
    /// Number of children in use.
    pub(super) len: usize,
    /// Arena indices of the children, in document order.
    pub(super) children: [u32; FANOUT + 1],
    /// `metrics[i]` sums everything below `children[i]`.
    pub(super) metrics: [Metrics; FANOUT + 1],
    /// The parent node, or [`NONE`] for the root.
    pub(super) parent: u32,
    /// This node's index among its parent's children.
    pub(super) slot: u8,
    /// Whether the children are leaves (else internal nodes).
    pub(super) leaves: bool,
}

impl Node {
    pub(super) fn sum(&self, range: std::ops::Range<usize>) -> Metrics {
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
    pub(super) leaves: Vec<Leaf>,
    /// Internal node arena.
    pub(super) nodes: Vec<Node>,
    /// The root: a node, or leaf 0 when `nodes` is empty.
    pub(super) root: u32,
    /// First local version of each range of local versions living in one
    /// leaf, mapped to that leaf. A range runs up to the next key. Built
    /// from the leaves by the first lookup of an item by local version
    /// (local editing makes none, so a document only edited here never
    /// holds one), and kept up to date from then on.
    pub(super) index: OnceLock<LeafIndex>,
    /// The metrics of the whole document.
    pub(super) total: Metrics,
    /// A leaf whose ancestors still count it with the metrics given: a
    /// change to a leaf reaches its ancestors only when another leaf
    /// changes, a search descends from the root, or a leaf splits (see
    /// [`Tree::flush`]), so a burst of typing in one leaf walks to the root
    /// once, not once per keystroke. `total` is always up to date.
    pub(super) stale: Option<(u32, Metrics)>,
    /// Where the last local edit was; cleared by any change that could
    /// move that leaf's start.
    pub(super) cursor: Option<Cursor>,
    /// The leaf [`Tree::locate_fresh`] found its last item in, or
    /// [`NONE`]. Leaves are never removed, so it is always a leaf; a hint,
    /// tried first.
    last_found: u32,
}

/// The way down to the stale leaf (see [`Tree::stale`](Tree)), for a
/// search that cannot flush it.
struct StalePath {
    /// Each ancestor and the slot below it on the way down, root first.
    path: Vec<(u32, usize)>,
    /// The leaf's metrics.
    new: Metrics,
    /// The metrics its ancestors count it with.
    old: Metrics,
}

/// The cursor cache (see the module docs): a leaf, where it starts, and a
/// run of it with the visible characters before that run, so a scan for
/// the next edit can start there instead of at the leaf's first run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cursor {
    /// The leaf of the last local edit.
    pub(super) leaf: u32,
    /// Visible characters before the leaf.
    pub(super) start: usize,
    /// A run index of the leaf (`<= runs.len()`).
    pub(super) run: usize,
    /// Visible characters of the leaf's runs before `run`.
    pub(super) run_chars: usize,
}

impl Default for Tree {
    fn default() -> Self {
        Self {
            leaves: vec![Leaf::root()],
            nodes: Vec::new(),
            root: 0,
            index: OnceLock::new(),
            total: Metrics::default(),
            stale: None,
            cursor: None,
            last_found: NONE,
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

    /// The leaf holding the place `target` units from the start, and how
    /// many units into that leaf the place is. With `stick_left`, a place
    /// on a boundary goes to the leaf on its left (the one holding unit
    /// `target - 1`); otherwise to the one holding unit `target`. `unit(m)`
    /// reads the count to descend by; `skipped` is shown the metrics of
    /// every subtree passed over on the left (the callers each sum the one
    /// count they need, or none).
    /// A stale leaf's counts (see [`Tree::stale`](Tree)) are corrected
    /// along its path; the searches of edits flush it first instead.
    ///
    /// Generic over `unit`, so the count it reads is inlined instead of
    /// called per child through a pointer (a random insert 6.7% faster),
    /// and out of line, so the callers' fast paths (typing where the
    /// cursor is) stay small (inlined, it cost the traces 2-3%).
    #[inline(never)]
    fn descend(
        &self,
        mut target: usize,
        stick_left: bool,
        unit: impl Fn(&Metrics) -> usize,
        mut skipped: impl FnMut(&Metrics),
    ) -> (u32, usize) {
        if self.nodes.is_empty() {
            return (0, target);
        }
        let stale = self.stale_path();
        let (mut node_id, mut depth) = (self.root, 0);
        loop {
            let node = &self.nodes[node_id as usize];
            // The child of this node above the stale leaf, with its change.
            let fix = stale.as_ref().and_then(|s| match s.path.get(depth) {
                Some(&(n, slot)) if n == node_id => Some((slot, s.new, s.old)),
                _ => None,
            });
            let metrics = |i: usize| {
                let mut m = node.metrics[i];
                if let Some((slot, new, old)) = fix {
                    if slot == i {
                        m.adjust(new, old);
                    }
                }
                m
            };
            let mut i = 0;
            while i + 1 < node.len {
                let m = metrics(i);
                let c = unit(&m);
                let inside = if stick_left { target <= c } else { target < c };
                if inside {
                    break;
                }
                target -= c;
                skipped(&m);
                i += 1;
            }
            let child = node.children[i];
            if node.leaves {
                return (child, target);
            }
            (node_id, depth) = (child, depth + 1);
        }
    }

    /// The stale leaf's way down from the root and its uncounted change.
    fn stale_path(&self) -> Option<StalePath> {
        let (leaf, old) = self.stale?;
        let l = &self.leaves[leaf as usize];
        let mut path = Vec::new();
        let (mut slot, mut parent) = (l.slot, l.parent);
        while parent != NONE {
            path.push((parent, slot as usize));
            let node = &self.nodes[parent as usize];
            (slot, parent) = (node.slot, node.parent);
        }
        path.reverse();
        Some(StalePath {
            path,
            new: Metrics::of(l),
            old,
        })
    }

    /// The leaf holding the place `chars` characters from the start and the
    /// character position where it starts, consulting the cursor cache.
    fn find_chars(&mut self, chars: usize, stick_left: bool) -> (u32, usize) {
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
        self.flush();
        let (leaf, into) = self.descend(chars, stick_left, |m| m.chars, |_| {});
        (leaf, chars - into)
    }

    /// Where a local insert at character `chars` (`<= len`) goes: right
    /// after the visible character `chars - 1` (or at the start), before
    /// any tombstones that follow it. The new text's left origin is then
    /// that visible character and its right origin the next item, deleted
    /// or not: the rule of diamond-types, Yjs and Fugue, so a history
    /// replayed from them orders text next to deletions as they do. Sets
    /// the cursor cache.
    pub(crate) fn insert_point(&mut self, chars: usize) -> Pos {
        let (leaf, start) = if chars == 0 {
            (0, 0)
        } else {
            self.find_chars(chars, true)
        };
        let l = &self.leaves[leaf as usize];
        let runs = &l.runs;
        let want = chars - start;
        // Start the scan at the cached run when the place is at or after it.
        let hinted = match self.cursor {
            Some(c) if c.leaf == leaf && c.run_chars <= want && c.run <= runs.len() => {
                Some((c.run, c.run_chars))
            }
            _ => None,
        };
        let (mut i, mut acc) = hinted.unwrap_or((0, 0));
        self.cursor = Some(Cursor {
            leaf,
            start,
            run: i,
            run_chars: acc,
        });
        let mut offset = 0;
        if want > 0 {
            if hinted.is_none() && want > l.chars / 2 {
                (i, acc) = reaching_from_end(runs, l.chars, want);
            }
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
        // A scan started from the cache at exactly `want` may sit past
        // tombstones that follow the visible character: step back over
        // them.
        while offset == 0 && i > 0 && runs[i - 1].deleted() {
            i -= 1;
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
        let (_, first) = self.index().last(..=lv)?;
        let mut leaf = first;
        let mut hops = 0;
        while leaf != NONE {
            if let Some(pos) = self.find_in(leaf, lv) {
                return Some((pos, hops));
            }
            leaf = self.leaves[leaf as usize].next;
            hops += 1;
        }
        None
    }

    /// The leaf of every item `0 .. items`, by local version ([`NONE`] for
    /// one the tree lacks), in one pass over the leaves: the index only
    /// names the leaf an item was created in, and local edits never
    /// re-point it, so reading the whole document through it would walk.
    pub(crate) fn leaf_table(&self, items: u32) -> Vec<u32> {
        let mut table = vec![NONE; items as usize];
        for (i, leaf) in self.leaves.iter().enumerate() {
            for r in &leaf.runs {
                if let Some(slots) = table.get_mut(r.lv as usize..r.end() as usize) {
                    slots.fill(i as u32);
                }
            }
        }
        table
    }

    /// Where item `lv` is, if it is in `leaf`.
    fn find_in(&self, leaf: u32, lv: u32) -> Option<Pos> {
        let runs = &self.leaves[leaf as usize].runs;
        // A tight search first (one wrapping compare per run, eight runs
        // at a time without a branch, which compiles to vector compares);
        // the characters before the hit are only summed once it is found.
        let holds = |r: &Run| lv.wrapping_sub(r.lv) < r.len();
        let mut i = 0;
        for chunk in runs.chunks_exact(8) {
            if chunk.iter().fold(false, |any, r| any | holds(r)) {
                break;
            }
            i += 8;
        }
        let i = i + runs[i..].iter().position(holds)?;
        let r = runs[i];
        let offset = lv - r.lv;
        let mut chars: usize = runs[..i].iter().map(|r| r.visible() as usize).sum();
        if !r.deleted() {
            chars += offset as usize;
        }
        Some(Pos {
            leaf,
            run: i,
            offset,
            chars,
        })
    }

    /// As [`Tree::locate`], trying the leaf of the previous call first
    /// (remote ops of one editing session name items near each other), and
    /// when the walk from the index was long, pointing the index straight
    /// at the leaf found for the item's whole run, so the next lookup of
    /// it (or its neighbours) walks no chain. A walk of one leaf is cheaper
    /// than the index update, so short walks are left alone.
    pub(crate) fn locate_fresh(&mut self, lv: u32) -> Option<Pos> {
        if self.last_found != NONE {
            if let Some(pos) = self.find_in(self.last_found, lv) {
                return Some(pos);
            }
        }
        let (pos, hops) = self.locate_hops(lv)?;
        if hops > 1 {
            let run = self.leaves[pos.leaf as usize].runs[pos.run];
            self.index_move(run.lv, run.end(), pos.leaf);
        }
        self.last_found = pos.leaf;
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
            // Every leaf sits at the same depth: climb from both at once
            // until they meet under one node, then their slots there decide.
            let la = &self.leaves[a.leaf as usize];
            let lb = &self.leaves[b.leaf as usize];
            let (mut sa, mut pa) = (la.slot, la.parent);
            let (mut sb, mut pb) = (lb.slot, lb.parent);
            while pa != pb {
                let (na, nb) = (&self.nodes[pa as usize], &self.nodes[pb as usize]);
                (sa, pa) = (na.slot, na.parent);
                (sb, pb) = (nb.slot, nb.parent);
            }
            return sa.cmp(&sb);
        }
        (a.run, a.offset).cmp(&(b.run, b.offset))
    }

    /// The place of the first item from `from` on whose depth (see
    /// [`History::depth`]) is `d` or less, or `Err` with the end of the
    /// document if there is none. Leaves whose floor is above `d` are
    /// passed at once; a leaf searched in full without a hit raises its
    /// floor to `d + 1`, so searching again at that depth passes it.
    pub(crate) fn next_within_depth(
        &mut self,
        from: Pos,
        d: u32,
        history: &mut History,
    ) -> Result<Pos, Pos> {
        let (mut leaf, mut run, mut offset, mut chars) =
            (from.leaf, from.run, from.offset, from.chars);
        loop {
            let l = &self.leaves[leaf as usize];
            let whole = run == 0 && offset == 0;
            if !(whole && l.floor > d) {
                while let Some(&r) = l.runs.get(run) {
                    if let Some(k) = history.first_within_depth(r.lv + offset, r.len() - offset, d)
                    {
                        let offset = offset + k;
                        let chars = chars + if r.deleted() { 0 } else { k as usize };
                        return Ok(Pos {
                            leaf,
                            run,
                            offset,
                            chars,
                        });
                    }
                    if !r.deleted() {
                        chars += (r.len() - offset) as usize;
                    }
                    run += 1;
                    offset = 0;
                }
                if whole {
                    self.leaves[leaf as usize].floor = d.saturating_add(1);
                }
            }
            let l = &self.leaves[leaf as usize];
            if l.next == NONE {
                return Err(Pos {
                    leaf,
                    run: l.runs.len(),
                    offset: 0,
                    chars: l.chars,
                });
            }
            (leaf, run, offset, chars) = (l.next, 0, 0, 0);
        }
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
        leaf.floor = 0;
        let at = pos.run;
        let (cached, cached_chars) = if pos.offset > 0 {
            // Inside a run: its head cannot join the new run, whose local
            // versions are past all of the run's.
            let (l, r) = leaf.runs[at].split(pos.offset);
            leaf.runs[at] = l;
            leaf.insert_runs(at + 1, [run, r]);
            (at + 1, pos.chars)
        } else if at > 0 && leaf.runs[at - 1].joins(run) {
            let prev = leaf.runs[at - 1];
            leaf.runs[at - 1] = prev.with_len(prev.len() + run.len());
            (at - 1, pos.chars - prev.visible() as usize)
        } else {
            leaf.insert_run(at, run);
            (at, pos.chars)
        };
        if let Some(c) = &mut self.cursor {
            c.run = cached;
            c.run_chars = cached_chars;
        }
        if !text.is_empty() {
            let byte = leaf.byte_of(pos.chars);
            leaf.insert_text(byte, text);
            leaf.mark.set((
                (pos.chars + run.len() as usize) as u32,
                (byte + text.len()) as u32,
            ));
            leaf.chars += run.len() as usize;
            leaf.utf16 += utf16_len_of(text, run.len() as usize);
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
                // The deleted characters are contiguous in the leaf's text:
                // cut them in one go, then turn their runs (which count
                // them still: `old.chars` visible) into tombstones.
                let old = Metrics::of(l);
                self.cut_text(leaf, from, here);
                let l = &self.leaves[leaf as usize];
                let (mut i, mut offset) = if first {
                    visible_index_from(&l.runs, old.chars, from, hint)
                } else {
                    visible_index_from(&l.runs, old.chars, from, (0, 0))
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
                    let dead = self.bury(leaf, i, offset, take);
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
                self.propagate(leaf, old);
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
    /// into a tombstone, text and all, where `chars` visible characters of
    /// the leaf come before them.
    fn kill(&mut self, leaf_id: u32, i: usize, offset: u32, take: u32, chars: usize) {
        let old = Metrics::of(&self.leaves[leaf_id as usize]);
        self.cut_text(leaf_id, chars, take as usize);
        self.bury(leaf_id, i, offset, take);
        self.propagate(leaf_id, old);
    }

    /// Removes `n` visible characters from `leaf`'s text, starting after
    /// its first `chars` visible characters; the caller marks their runs
    /// and propagates the metrics.
    fn cut_text(&mut self, leaf_id: u32, chars: usize, n: usize) {
        let leaf = &mut self.leaves[leaf_id as usize];
        let b0 = leaf.byte_of(chars);
        let b1 = if leaf.text.len() == leaf.chars {
            b0 + n
        } else {
            b0 + byte_at(&leaf.text[b0..], n)
        };
        leaf.utf16 -= utf16_len_of(&leaf.text[b0..b1], n);
        leaf.chars -= n;
        leaf.text.drain(b0..b1);
        leaf.mark.set((chars as u32, b0 as u32));
        if leaf.text.capacity() > 2 * leaf.text.len() + 256 {
            // Deleting mostly empties leaves of a document that once held
            // far more text: give the memory back.
            leaf.text.shrink_to(leaf.text.len() + 64);
        }
    }

    /// Marks items `offset .. offset + take` of visible run `i` of `leaf`
    /// deleted (the text is the caller's), joining the tombstone with
    /// tombstone neighbours whose local versions continue it. Returns the
    /// tombstone's run index.
    fn bury(&mut self, leaf_id: u32, i: usize, offset: u32, take: u32) -> usize {
        let leaf = &mut self.leaves[leaf_id as usize];
        let r = leaf.runs[i];
        let dead = Run::new(r.lv + offset, take, true);
        let rest = r.len() - offset - take;
        // What is left after them, when something is.
        let right = || Run::new(dead.end(), rest, false);
        match (offset > 0, rest > 0) {
            (false, false) => {
                leaf.runs[i] = dead;
                let mut at = i;
                if at > 0 && leaf.runs[at - 1].joins(dead) {
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
                at
            }
            // The head of the run dies: a tombstone before it that the
            // dead items continue (forward deletion) grows instead.
            (false, true) if i > 0 && leaf.runs[i - 1].joins(dead) => {
                let prev = leaf.runs[i - 1];
                leaf.runs[i - 1] = prev.with_len(prev.len() + take);
                leaf.runs[i] = right();
                i - 1
            }
            (false, true) => {
                leaf.runs[i] = dead;
                leaf.insert_run(i + 1, right());
                i
            }
            // The tail dies: a tombstone after it that continues the dead
            // items (backspacing) starts earlier instead.
            (true, false) if i + 1 < leaf.runs.len() && dead.joins(leaf.runs[i + 1]) => {
                let next = leaf.runs[i + 1];
                leaf.runs[i] = r.with_len(offset);
                leaf.runs[i + 1] = Run::new(dead.lv, take + next.len(), true);
                i + 1
            }
            (true, false) => {
                leaf.runs[i] = r.with_len(offset);
                leaf.insert_run(i + 1, dead);
                i + 1
            }
            // The middle dies: one insert of two runs.
            (true, true) => {
                leaf.runs[i] = r.with_len(offset);
                leaf.insert_runs(i + 1, [dead, right()]);
                i + 1
            }
        }
    }

    /// Calls `visit` for each stretch of items `lv .. lv + n` in local
    /// version order: `Ok(text)` for visible items, `Err(count)` for
    /// deleted ones. Returns `false` if the tree lacks some item.
    ///
    /// `table`, from [`Tree::leaf_table`], finds each item's leaf without
    /// the index (worth building when reading most of the document).
    pub(crate) fn read(
        &self,
        table: Option<&[u32]>,
        mut lv: u32,
        n: u32,
        mut visit: impl FnMut(Result<&str, u32>),
    ) -> bool {
        let end = lv + n;
        while lv < end {
            let found = match table {
                Some(t) => t
                    .get(lv as usize)
                    .filter(|&&leaf| leaf != NONE)
                    .and_then(|&leaf| self.find_in(leaf, lv)),
                None => self.locate(lv),
            };
            let Some(pos) = found else {
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
        let mut chars = 0;
        let (leaf, into) = self.descend(target, true, unit, |m| chars += m.chars);
        let mut at = target - into;
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
        let mut before = 0;
        let (leaf, take) = self.descend(chars, true, |m| m.chars, |m| before += unit(m));
        before
            + self.leaves[leaf as usize]
                .text
                .chars()
                .take(take)
                .map(width)
                .sum::<usize>()
    }
}

/// The first of `runs` (which hold `total` visible characters) whose
/// visible characters reach `k` (`1 <= k <= total`) and the visible
/// characters before it, counted back from the end: fewer steps than from
/// the start for a place in a leaf's second half.
fn reaching_from_end(runs: &[Run], total: usize, k: usize) -> (usize, usize) {
    let (mut j, mut through) = (runs.len(), total);
    while j > 1 {
        let v = runs[j - 1].visible() as usize;
        if through - v < k {
            break;
        }
        through -= v;
        j -= 1;
    }
    // The runs before `j` reach `k`, those before `j - 1` do not.
    (j - 1, through - runs[j - 1].visible() as usize)
}

/// The run holding visible character `chars` (`< total`) of `runs`, which
/// hold `total` visible characters (skipping tombstones), and the offset of
/// that character in it, scanning from the hint `(run, visible characters
/// before it)` when it is not past `chars`, else from the nearer end.
pub(super) fn visible_index_from(
    runs: &[Run],
    total: usize,
    chars: usize,
    hint: (usize, usize),
) -> (usize, u32) {
    let hinted = hint != (0, 0) && hint.1 <= chars && hint.0 <= runs.len();
    if !hinted && chars > total / 2 {
        let (i, before) = reaching_from_end(runs, total, chars + 1);
        return (i, (chars - before) as u32);
    }
    let (start, mut acc) = if hinted { hint } else { (0, 0) };
    for (i, r) in runs.iter().enumerate().skip(start) {
        let v = r.visible() as usize;
        if chars < acc + v {
            return (i, (chars - acc) as u32);
        }
        acc += v;
    }
    (runs.len(), 0)
}
