//! Keeping the run tree in shape: metrics pushed to the root after an
//! edit, overfull leaves and nodes split in two (up to a new root), the
//! local-version index kept pointing at the right leaves, and the full
//! invariant check the tests run.
//!
//! See the module docs of `tree.rs` for the shape these functions keep.

use std::cell::Cell;

use super::index::LeafIndex;
use super::leaf::{Leaf, MAX_BYTES, MAX_RUNS, Run, char_len, utf16_len, utf16_len_of};
use super::tree::{FANOUT, Metrics, Node, Tree, visible_index_from};
use super::{NONE, reserve_lean};

impl Tree {
    /// A tree of `runs`, in document order, whose visible runs hold the
    /// characters of `text` in turn (their lengths must sum to its
    /// character count; the runs must tile `0 .. items`): how a document
    /// is loaded without integrating anything. Leaves are filled to three
    /// quarters, so the first edits in them do not split them at once; a
    /// visible run longer than a leaf's byte budget is cut across leaves.
    /// The index is left to the first lookup that needs it.
    pub(crate) fn build(runs: &[Run], text: &str) -> Self {
        const FILL_RUNS: usize = MAX_RUNS * 3 / 4;
        const FILL_BYTES: usize = MAX_BYTES * 3 / 4;
        let mut tree = Tree::default();
        if runs.is_empty() {
            return tree;
        }
        tree.leaves.clear();
        // A leaf with room for what is left to place, up to its fill.
        let fresh = |runs_left: usize, bytes_left: usize| Leaf {
            runs: Vec::with_capacity(runs_left.min(FILL_RUNS) + 1),
            text: String::with_capacity(bytes_left.min(FILL_BYTES) + 4),
            ..Leaf::root()
        };
        let mut leaf = fresh(runs.len(), text.len());
        // The current leaf's text is `text[start..at]`, copied in once
        // when the leaf is done (runs are mostly a few characters).
        let (mut start, mut at) = (0, 0);
        // Checked once: in ASCII text a character is a byte.
        let ascii = text.is_ascii();
        let flush = |tree: &mut Tree, leaf: &mut Leaf, own: &str, next: Leaf| {
            let id = tree.leaves.len() as u32;
            let mut done = std::mem::replace(leaf, next);
            done.text.push_str(own);
            done.prev = if id == 0 { NONE } else { id - 1 };
            done.next = NONE;
            if id > 0 {
                tree.leaves[id as usize - 1].next = id;
            }
            done.utf16 = utf16_len_of(own, done.chars);
            tree.leaves.push(done);
        };
        for (i, &run) in runs.iter().enumerate() {
            let mut run = run;
            loop {
                if leaf.runs.len() >= FILL_RUNS || at - start >= FILL_BYTES {
                    let next = fresh(runs.len() - i, text.len() - at);
                    flush(&mut tree, &mut leaf, &text[start..at], next);
                    start = at;
                }
                if run.deleted() {
                    leaf.runs.push(run);
                    break;
                }
                let room = FILL_BYTES - (at - start);
                let (chars, bytes) = if ascii {
                    let n = (run.len() as usize).min(room);
                    (n, n)
                } else {
                    take_chars(&text[at..], run.len() as usize, room)
                };
                leaf.chars += chars;
                at += bytes;
                let chars = chars as u32;
                if chars == run.len() {
                    leaf.runs.push(run);
                    break;
                }
                let (head, tail) = run.split(chars);
                leaf.runs.push(head);
                run = tail;
                let next = fresh(runs.len() - i, text.len() - at);
                flush(&mut tree, &mut leaf, &text[start..at], next);
                start = at;
            }
        }
        if !leaf.runs.is_empty() {
            flush(&mut tree, &mut leaf, &text[start..at], Leaf::default());
        }
        // Internal nodes, level by level, children spread evenly.
        let mut level: Vec<(u32, Metrics)> = tree
            .leaves
            .iter()
            .enumerate()
            .map(|(id, l)| (id as u32, Metrics::of(l)))
            .collect();
        tree.total = level.iter().fold(Metrics::default(), |mut m, l| {
            m.add(l.1);
            m
        });
        let mut leaves = true;
        while level.len() > 1 {
            let size = level.len().div_ceil(level.len().div_ceil(FANOUT));
            let mut above = Vec::with_capacity(level.len().div_ceil(size));
            for group in level.chunks(size) {
                let id = tree.nodes.len() as u32;
                let mut node = Node {
                    len: group.len(),
                    children: [NONE; FANOUT + 1],
                    metrics: [Metrics::default(); FANOUT + 1],
                    parent: NONE,
                    slot: 0,
                    leaves,
                };
                for (slot, &(child, m)) in group.iter().enumerate() {
                    node.children[slot] = child;
                    node.metrics[slot] = m;
                }
                above.push((id, node.sum(0..group.len())));
                tree.nodes.push(node);
                for (slot, &(child, _)) in group.iter().enumerate() {
                    tree.set_parent(child, leaves, id, slot);
                }
            }
            level = above;
            leaves = false;
        }
        tree.root = level[0].0;
        tree
    }

    /// The index (see [`Tree::index`](Tree)), built from the leaves if no
    /// lookup has needed it yet.
    pub(super) fn index(&self) -> &LeafIndex {
        self.index.get_or_init(|| index_of(&self.leaves))
    }

    /// Records that the new local versions from `lv` on live in `leaf`
    /// (nothing to do while there is no index: building it will find them).
    pub(super) fn index_append(&mut self, lv: u32, leaf: u32) {
        let Some(index) = self.index.get_mut() else {
            return;
        };
        match index.last(..) {
            Some((k, l)) if l == leaf && k <= lv => {}
            _ => index.insert(lv, leaf),
        }
    }

    /// Re-points the local versions `start .. end` (already in the tree)
    /// to `leaf`, keeping ranges that share a leaf joined.
    pub(super) fn index_move(&mut self, start: u32, end: u32, leaf: u32) {
        self.index();
        let index = self.index.get_mut().expect("built by index()");
        let tail = index.last(..=end).map(|(_, l)| l);
        index.remove(start, end);
        if let Some(t) = tail {
            if t != leaf {
                index.insert(end, t);
            }
        }
        let joins_prev = index.last(..start).map(|(_, l)| l) == Some(leaf);
        if !joins_prev {
            index.insert(start, leaf);
        }
    }

    /// Records a change of `leaf`'s metrics (from `old`): in the total at
    /// once, and in its ancestors when the stale leaf is next flushed (see
    /// [`Tree::stale`](Tree)).
    pub(super) fn propagate(&mut self, leaf: u32, old: Metrics) {
        let new = Metrics::of(&self.leaves[leaf as usize]);
        if new == old {
            return;
        }
        self.total.adjust(new, old);
        match self.stale {
            // Its ancestors still count it as before the first change.
            Some((stale, _)) if stale == leaf => {}
            _ => {
                self.flush();
                self.stale = Some((leaf, old));
            }
        }
    }

    /// Pushes the stale leaf's change (see [`Tree::stale`](Tree)) up to
    /// the root.
    pub(super) fn flush(&mut self) {
        let Some((leaf, old)) = self.stale.take() else {
            return;
        };
        let new = Metrics::of(&self.leaves[leaf as usize]);
        let l = &self.leaves[leaf as usize];
        let (mut slot, mut parent) = (l.slot, l.parent);
        while parent != NONE {
            let node = &mut self.nodes[parent as usize];
            node.metrics[slot as usize].adjust(new, old);
            (slot, parent) = (node.slot, node.parent);
        }
    }

    /// Splits `leaf` (and the halves, recursively) while it is overfull.
    /// The check is inlined into every edit; the split, rare, is not.
    #[inline]
    pub(super) fn split_if_needed(&mut self, leaf: u32) {
        if self.leaves[leaf as usize].overfull() {
            self.split_overfull(leaf);
        }
    }

    /// [`Tree::split_if_needed`] for a leaf that is overfull.
    #[cold]
    #[inline(never)]
    fn split_overfull(&mut self, leaf: u32) {
        let right = self.split_leaf(leaf);
        self.split_if_needed(leaf);
        self.split_if_needed(right);
    }

    /// Moves the second half of `leaf_id` (by runs, or by bytes for a leaf
    /// with few, long runs) into a new leaf after it. Returns the new leaf.
    fn split_leaf(&mut self, leaf_id: u32) -> u32 {
        // Splits set the halves' counts from the leaves.
        self.flush();
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
        leaf.mark.set((chars as u32, byte as u32));
        leaf.text.shrink_to(leaf.text.len() + 64);
        let right_chars = leaf.chars - chars;
        let right = Leaf {
            chars: right_chars,
            utf16: utf16_len_of(&text, right_chars),
            runs,
            text,
            parent: leaf.parent,
            slot: 0,
            prev: leaf_id,
            next: leaf.next,
            mark: Cell::default(),
            floor: leaf.floor,
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
        reserve_lean(&mut self.leaves, 1, 4);
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
        reserve_lean(&mut self.nodes, 1, 2);
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
        reserve_lean(&mut self.nodes, 1, 2);
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
        // Where the cursor cache's leaf starts.
        let mut cursor_start = None;
        while at != NONE {
            let leaf = &self.leaves[at as usize];
            if self.cursor.is_some_and(|c| c.leaf == at) {
                cursor_start = Some(total.chars);
            }
            assert_eq!(leaf.prev, prev, "leaf chain");
            let vis: usize = leaf.runs.iter().map(|r| r.visible() as usize).sum();
            assert_eq!(vis, leaf.chars, "leaf chars");
            assert_eq!(char_len(&leaf.text), leaf.chars, "leaf text");
            assert_eq!(utf16_len(&leaf.text), leaf.utf16, "leaf utf16");
            let (mc, mb) = leaf.mark.get();
            let (mc, mb) = (mc as usize, mb as usize);
            assert_eq!(
                leaf.text
                    .char_indices()
                    .nth(mc)
                    .map_or(leaf.text.len(), |(b, _)| b),
                mb,
                "leaf mark"
            );
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
        if let Some(c) = self.cursor {
            assert_eq!(Some(c.start), cursor_start, "cursor start");
            let runs = &self.leaves[c.leaf as usize].runs;
            assert!(c.run <= runs.len(), "cursor run");
            let before: usize = runs[..c.run].iter().map(|r| r.visible() as usize).sum();
            assert_eq!(before, c.run_chars, "cursor run chars");
        }
        for (i, node) in self.nodes.iter().enumerate() {
            for s in 0..node.len {
                let c = node.children[s];
                let (m, parent) = if node.leaves {
                    let l = &self.leaves[c as usize];
                    match self.stale {
                        Some((stale, old)) if stale == c => (old, l.parent),
                        _ => (Metrics::of(l), l.parent),
                    }
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

/// The index of a tree with `leaves`: each run's first local version
/// mapped to its leaf, joining neighbours (in local-version order) that
/// share a leaf.
fn index_of(leaves: &[Leaf]) -> LeafIndex {
    let mut starts: Vec<(u32, u32)> = leaves
        .iter()
        .zip(0u32..)
        .flat_map(|(leaf, id)| leaf.runs.iter().map(move |r| (r.lv, id)))
        .collect();
    starts.sort_unstable_by_key(|&(lv, _)| lv);
    starts.dedup_by(|next, kept| next.1 == kept.1);
    LeafIndex::from_sorted(starts)
}

/// The first characters of `s`, at most `n` of them and at least one, in
/// at most `max_bytes` bytes unless a single character needs more: their
/// count and their length in bytes.
fn take_chars(s: &str, n: usize, max_bytes: usize) -> (usize, usize) {
    let ascii = n.min(max_bytes).min(s.len());
    if ascii > 0 && s.as_bytes()[..ascii].is_ascii() && (ascii == n || ascii == max_bytes) {
        return (ascii, ascii);
    }
    let mut taken = 0;
    let mut bytes = 0;
    for c in s.chars() {
        let w = c.len_utf8();
        if taken == n || (taken > 0 && bytes + w > max_bytes) {
            break;
        }
        taken += 1;
        bytes += w;
    }
    (taken, bytes)
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
    let (i, offset) = visible_index_from(&leaf.runs, leaf.chars, half, (0, 0));
    if offset > 0 {
        let (l, r) = leaf.runs[i].split(offset);
        leaf.runs[i] = l;
        leaf.insert_run(i + 1, r);
        (i + 1, half)
    } else {
        (i, half)
    }
}
