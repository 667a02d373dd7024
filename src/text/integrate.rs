//! Remote edits: placing a remote insertion (the ordering rule), applying
//! ops, buffering ops that arrive early, and merge and delta sync on top.

use super::document::Text;
use super::error::TextError;
use super::history::{DeleteEntry, Lookup};
use super::leaf::{Run, byte_at, char_len};
use super::op::{Content, Insertion, OpKind, Targets, TextOp, push_targets};
use super::pending::unseen;
use super::tree::Pos;
use super::{MAX_CHARS, NONE};
use crate::causal::{Dot, ReplicaId, VersionVector};
use crate::merge::{DeltaMerge, Merge};

/// What [`Text::apply`] did with an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// The op (or its part not seen before) is now in the document, and so
    /// is every buffered op it unblocked.
    Integrated,
    /// The op builds on events this replica has not seen yet (an earlier op
    /// of the same replica, or the characters it names). It is kept and
    /// applied as soon as they arrive; nothing to do.
    Buffered,
    /// Every event of the op was already here (a duplicate, or an empty op).
    AlreadyKnown,
}

impl Text {
    /// Applies an op made by another replica (or this one, which is a
    /// no-op), and any buffered ops it unblocks.
    ///
    /// Ops may come in any order and any number of times: an op whose
    /// earlier events have not arrived is buffered ([`Applied::Buffered`])
    /// and applied when they do; an op already seen is ignored
    /// ([`Applied::AlreadyKnown`]).
    ///
    /// # Errors
    ///
    /// [`TextError::InvalidOp`] if the op breaks the rules ops obey (an
    /// origin that is a deletion, lengths that do not add up), and
    /// [`TextError::TooLarge`] past [`MAX_CHARS`]. The document is
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::text::{Applied, Text};
    ///
    /// let mut a = Text::new(ReplicaId::new(1));
    /// let first = a.insert(0, "hi")?;
    /// let second = a.insert(2, "!")?;
    ///
    /// let mut b = Text::new(ReplicaId::new(2));
    /// assert_eq!(b.apply(&second)?, Applied::Buffered); // too early
    /// assert_eq!(b.to_string(), "");
    /// assert_eq!(b.apply(&first)?, Applied::Integrated); // unblocks `second`
    /// assert_eq!(b.to_string(), "hi!");
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn apply(&mut self, op: &TextOp) -> Result<Applied, TextError> {
        op.check().map_err(|what| TextError::InvalidOp { what })?;
        let known = self.history.known(op.replica());
        let Some(op) = unseen(op.clone(), known) else {
            return Ok(Applied::AlreadyKnown);
        };
        if op.id.counter() - 1 == known && self.try_integrate(&op)? {
            self.drain();
            return Ok(Applied::Integrated);
        }
        self.pending.push(op, known);
        Ok(Applied::Buffered)
    }

    /// Number of buffered ops waiting for events they build on.
    pub fn buffered_ops(&self) -> usize {
        self.pending.iter().count()
    }

    /// Every op of this document a replica at version `since` lacks, per
    /// replica in counter order, followed by the buffered ops: what to send
    /// a peer that syncs by ops. Applying them all (in this order or any
    /// other) brings the peer up to date.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::{ReplicaId, VersionVector};
    /// use calm::text::Text;
    ///
    /// let mut a = Text::new(ReplicaId::new(1));
    /// a.insert(0, "abc")?;
    /// a.delete(0..1)?;
    /// let mut b = Text::new(ReplicaId::new(2));
    /// for op in a.ops_since(&VersionVector::new()) {
    ///     b.apply(&op)?;
    /// }
    /// assert_eq!(b.to_string(), "bc");
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn ops_since(&self, since: &VersionVector) -> Vec<TextOp> {
        let mut out = self.ops_after(|r| since.get(r));
        out.extend(self.pending.iter().cloned());
        out
    }

    /// The events each replica made after the first `since(replica)`, as
    /// maximal ops, per replica in counter order.
    pub(crate) fn ops_after(&self, since: impl Fn(ReplicaId) -> u64) -> Vec<TextOp> {
        let h = &self.history;
        let mut out: Vec<TextOp> = Vec::new();
        // Reading most of the document: find items through a table of
        // their leaves rather than the index.
        let unsent: u64 = h
            .agents
            .iter()
            .map(|a| a.known - since(a.id).min(a.known))
            .sum();
        let table = (unsent >= u64::from(h.items) / 4).then(|| self.tree.leaf_table(h.items));
        let mut agents: Vec<usize> = (0..h.agents.len()).collect();
        agents.sort_by_key(|&a| h.agents[a].id);
        for a in agents {
            let agent = &h.agents[a];
            let from = since(agent.id);
            if agent.known <= from {
                continue;
            }
            let first = out.len();
            let entries = h.entries_of(a);
            let ins_end = |e: usize| h.inserts[e].counter() + u64::from(h.entry_len(e));
            let del_end = |d: &DeleteEntry| d.counter() + u64::from(d.len());
            let mut i = entries.partition_point(0..entries.len(), |e| ins_end(e) - 1 <= from);
            let mut d = agent.deletes.partition_point(|e| del_end(e) - 1 <= from);
            loop {
                let ic = entries.get(i).map(|e| h.inserts[e].counter());
                let dc = agent.deletes.get(d).map(|e| e.counter());
                let op = match (ic, dc) {
                    (None, None) => break,
                    (Some(c), dc) if dc.is_none_or(|dc| c < dc) => {
                        let e = entries.at(i);
                        i += 1;
                        let skip = from.saturating_sub(c - 1);
                        self.insert_op(table.as_deref(), e, skip as u32)
                    }
                    _ => {
                        let e = agent.deletes[d];
                        d += 1;
                        let skip = from.saturating_sub(e.counter() - 1);
                        self.delete_op(agent.id, e, skip as u32)
                    }
                };
                let joined = out.len() > first && out.last_mut().is_some_and(|l| l.try_append(&op));
                if !joined {
                    out.push(op);
                }
            }
        }
        out
    }

    /// Insert entry `e` minus its first `skip` characters, as an op
    /// (`table` as for [`Tree::read`](super::tree::Tree::read)).
    fn insert_op(&self, table: Option<&[u32]>, e: usize, skip: u32) -> TextOp {
        let h = &self.history;
        let entry = h.inserts[e];
        let lv = h.lvs[e] + skip;
        let len = h.entry_len(e) - skip;
        let left = if skip > 0 { lv - 1 } else { entry.origin_left };
        let mut ins = Insertion {
            origin_left: self.dot_of(left),
            origin_right: self.dot_of(entry.origin_right),
            len,
            text: Content::default(),
            hidden: Vec::new(),
        };
        let mut at = 0;
        self.tree.read(table, lv, len, |piece| match piece {
            Ok(s) => {
                ins.text.push_str(s);
                at += char_len(s) as u32;
            }
            Err(n) => {
                match ins.hidden.last_mut() {
                    Some(h) if h.0 + h.1 == at => h.1 += n,
                    _ => ins.hidden.push((at, n)),
                }
                at += n;
            }
        });
        TextOp {
            id: Dot::new(
                h.agents[entry.agent as usize].id,
                entry.counter() + u64::from(skip),
            ),
            kind: OpKind::Insert(ins),
        }
    }

    /// Delete entry `d` of `replica` minus its first `skip` events, as an
    /// op.
    fn delete_op(&self, replica: ReplicaId, d: DeleteEntry, skip: u32) -> TextOp {
        let n = d.len() - skip;
        let lv = if d.reversed() {
            d.target
        } else {
            d.target + skip
        };
        let mut targets = Targets::default();
        push_targets(&self.history, &mut 0, &mut targets, lv, n, d.reversed());
        TextOp {
            id: Dot::new(replica, d.counter() + u64::from(skip)),
            kind: OpKind::Delete(targets),
        }
    }

    /// Integrates `op`, whose first event is its replica's next, if every
    /// event it builds on is here. Returns `Ok(false)`, changing nothing,
    /// if some is missing.
    pub(crate) fn try_integrate(&mut self, op: &TextOp) -> Result<bool, TextError> {
        match &op.kind {
            OpKind::Insert(ins) => {
                let (Some(left), Some(right)) = (
                    self.resolve(ins.origin_left)?,
                    self.resolve(ins.origin_right)?,
                ) else {
                    return Ok(false);
                };
                if u64::from(self.history.items) + u64::from(ins.len) > MAX_CHARS {
                    return Err(TextError::TooLarge { max: MAX_CHARS });
                }
                let left_pos = self.pos_of(left);
                let place = self.place(left, left_pos, right, op.replica())?;
                let agent = self.history.intern(op.replica());
                let lv = self
                    .history
                    .push_insert(agent, op.id.counter(), ins.len, left, right);
                self.insert_content(place, lv, ins);
                self.placed = (left, lv, self.history.items);
            }
            OpKind::Delete(targets) => {
                let mut pieces = Vec::new();
                for t in targets {
                    let start = pieces.len();
                    let mut c = t.start.counter();
                    let end = c + u64::from(t.len);
                    while c < end {
                        let lv = match self.history.lookup(t.start.replica(), c) {
                            Lookup::Insert(lv) => lv,
                            Lookup::Delete => {
                                return Err(TextError::InvalidOp {
                                    what: "delete target is a deletion",
                                });
                            }
                            Lookup::Unknown => return Ok(false),
                        };
                        let e = self.history.entry_of(lv);
                        let entry_end = self.history.lvs[e] + self.history.entry_len(e);
                        let take = (u64::from(entry_end - lv)).min(end - c) as u32;
                        pieces.push((lv, take, t.reversed));
                        c += u64::from(take);
                    }
                    if t.reversed {
                        pieces[start..].reverse();
                    }
                }
                let agent = self.history.intern(op.replica());
                let mut counter = op.id.counter();
                for (lv, n, reversed) in pieces {
                    self.tree.delete_items(lv, n, |_, _| {});
                    self.history.push_delete(agent, counter, lv, n, reversed);
                    counter += u64::from(n);
                }
            }
        }
        Ok(true)
    }

    /// The local version of an origin: `Ok(Some(NONE))` for a document
    /// end, `Ok(None)` if it has not arrived.
    fn resolve(&self, origin: Option<Dot>) -> Result<Option<u32>, TextError> {
        let Some(d) = origin else {
            return Ok(Some(NONE));
        };
        match self.history.lookup(d.replica(), d.counter()) {
            Lookup::Insert(lv) => Ok(Some(lv)),
            Lookup::Delete => Err(TextError::InvalidOp {
                what: "insert origin is a deletion",
            }),
            Lookup::Unknown => Ok(None),
        }
    }

    /// Inserts the characters of `ins` as new items `lv ..` at `place`:
    /// visible stretches with their text, hidden ones as tombstones.
    fn insert_content(&mut self, place: Pos, lv: u32, ins: &Insertion) {
        let mut at = place;
        let mut offset = 0;
        let mut text: &str = &ins.text;
        let mut hidden = ins.hidden.iter().peekable();
        while offset < ins.len {
            let (n, deleted) = match hidden.peek() {
                Some(&&(o, l)) if o == offset => {
                    hidden.next();
                    (l, true)
                }
                Some(&&(o, _)) => (o - offset, false),
                None => (ins.len - offset, false),
            };
            let content = if deleted {
                ""
            } else {
                let bytes = byte_at(text, n as usize);
                let (head, tail) = text.split_at(bytes);
                text = tail;
                head
            };
            if offset > 0 {
                // The tree may have split since: find the place again, just
                // after the previous stretch.
                if let Some(p) = self.tree.locate(lv + offset - 1) {
                    at = self.tree.after(p);
                }
            }
            self.tree
                .insert(at, Run::new(lv + offset, n, deleted), content);
            offset += n;
        }
    }

    /// Where a new item with origins `left` and `right` goes, made by
    /// `replica`: the ordering rule of the module docs.
    ///
    /// Scan the items after `left`. An item whose left origin lies before
    /// `left` ends the scan (it belongs to an earlier subtree). An item with
    /// the same left origin is a sibling: its right origin decides
    /// (FugueMax/YjsMod): one further left means we may still go after it
    /// ("scanning"), the same one is a true conflict broken by replica id,
    /// one further right means we go after it. Items whose left origin is
    /// inside the scanned stretch are descendants of something scanned and
    /// are skipped.
    ///
    /// A sibling whose right origin is further left than ours starts a
    /// chain of siblings (see
    /// [`History::chain_jump`](super::history::History::chain_jump)): every
    /// item from it up to its right origin is skipped while scanning
    /// (origins nest: nothing between an item and its right origin has a
    /// left origin before the item's), and so is the next sibling of the
    /// chain, as long as it lies before `right`. So the scan jumps straight
    /// to the chain's last link before `right`, found in O(log n) jumps.
    /// This keeps concurrent backward typing at one place near-linear: each
    /// keystroke of one replica skips the other's whole run (or the part
    /// of it before its own right origin) instead of walking it.
    ///
    /// `left_pos` is where `left` is (`None` for the document start).
    /// Where `right` is only matters once an item between the two is
    /// met, so it is only looked up then: when nothing was inserted
    /// between them concurrently (every op of a linear history), the
    /// first item after `left` is `right` and the scan is over.
    ///
    /// An item `y` integrated right after another, `x`, with `x`'s left
    /// origin and `x` itself as right origin (backward typing) goes right
    /// before `x`, found without a scan: `y`'s scan would pass exactly
    /// the items `x`'s passed before its place, with `y` deciding as `x`
    /// did at each, or stopping scanning where `x` scanned on (a right
    /// origin before `x` lies before `x`'s right origin; one between them
    /// is after `x`), and since no item names `x` yet, nothing breaks the
    /// scan before `x`, where `x` had nothing scanned to go back to. So
    /// concurrent backward typing costs one scan per replica, not one
    /// per keystroke. `Text::placed` remembers `x` while no item has been
    /// inserted since.
    ///
    /// # Errors
    ///
    /// [`TextError::InvalidOp`] when `right` is not after `left` (no
    /// replica could have sent such origins; checked once something lies
    /// between `left` and the place, so a linear history pays nothing).
    fn place(
        &mut self,
        left: u32,
        left_pos: Option<Pos>,
        right: u32,
        replica: ReplicaId,
    ) -> Result<Pos, TextError> {
        use std::cmp::Ordering::*;
        if self.placed == (left, right, self.history.items) {
            if let Some(p) = self.pos_of(right) {
                return Ok(p);
            }
        }
        let mut right_pos: Option<Option<Pos>> = None;
        let mut cur = left_pos.map_or(self.tree.start(), |p| self.tree.after(p));
        let mut dest = cur;
        let mut scanning = false;
        // The last item passed whose left origin is `left` (a concurrent
        // sibling), once one is.
        let mut sibling = NONE;
        let mut checked = left == NONE || right == NONE;
        let misplaced = TextError::InvalidOp {
            what: "right origin not after the left origin",
        };
        loop {
            let Some(p) = self.tree.normalize(cur) else {
                if !checked {
                    return Err(misplaced);
                }
                if !scanning {
                    dest = cur;
                }
                break;
            };
            if !scanning {
                dest = p;
            }
            let run = self.tree.run_at(p).unwrap_or_else(|| Run::new(0, 1, true));
            let other = run.lv + p.offset;
            if other == right {
                break;
            }
            if !checked {
                checked = true;
                let right_pos = *right_pos.get_or_insert_with(|| self.pos_of(right));
                let after = match (left_pos, right_pos) {
                    (Some(l), Some(r)) => self.tree.cmp(l, r) == Less,
                    _ => false,
                };
                if !after {
                    return Err(misplaced);
                }
            }
            let e = self.history.entry_of(other);
            let (oleft, oright) = self.history.origins_in(e, other);
            match self.order(oleft, left, left_pos, true) {
                Less => break,
                Equal => {
                    sibling = other;
                    let right_pos = *right_pos.get_or_insert_with(|| self.pos_of(right));
                    match self.order(oright, right, right_pos, false) {
                        Less => {
                            scanning = true;
                            let last = self.last_link_before(other, right, right_pos);
                            if last != other {
                                // Origins nest, so the link lies ahead in
                                // any document integration built; one
                                // decoded from crafted bytes may break
                                // that, and the scan must still only move
                                // forward.
                                if let Some(q) = self.tree.locate_fresh(last) {
                                    if self.tree.cmp(q, p) == Greater {
                                        cur = q;
                                        continue;
                                    }
                                }
                            }
                        }
                        Equal => {
                            if replica < self.history.id_of(other).0 {
                                break;
                            }
                            scanning = false;
                        }
                        Greater => scanning = false,
                    }
                }
                Greater if sibling != NONE => {
                    // In the subtree of the last sibling passed: none of
                    // its descendants changes the outcome, and they run up
                    // to the first item no deeper than it (the document is
                    // a pre-order walk of the left-origin tree), so go
                    // there in one search instead of item by item (the
                    // first search computes the depth of every earlier
                    // character, 4 bytes each, kept; a depth is then one
                    // read).
                    let depth = self.history.depth(sibling);
                    let from = self.tree.after(p);
                    let (Ok(to) | Err(to)) =
                        self.tree.next_within_depth(from, depth, &mut self.history);
                    cur = to;
                    // Never past `right` (only crafted origins put it there).
                    if right != NONE {
                        if let Some(r) = *right_pos.get_or_insert_with(|| self.pos_of(right)) {
                            if self.tree.cmp(r, p) == Greater && self.tree.cmp(r, to) == Less {
                                cur = r;
                            }
                        }
                    }
                    continue;
                }
                // Only crafted origins pass an item in no sibling's
                // subtree: step past it.
                Greater => {}
            }
            // The rest of this run, up to the end of `other`'s insert entry,
            // are `other`'s descendants typed after it: skip them at once,
            // stopping just before `right` if it is among them.
            let entry_end = self.history.lvs[e] + self.history.entry_len(e);
            let mut step = (run.len() - p.offset).min(entry_end - other);
            if right != NONE && right > other && right - other < step {
                step = right - other;
            }
            cur = self.tree.advance(p, step);
        }
        Ok(dest)
    }

    /// The last character of the chain from `from` (see
    /// [`History::chain_jump`](super::history::History::chain_jump)) that
    /// lies before `right` (at `right_pos`; [`NONE`] is the document end):
    /// jumps of growing powers of two while they stay before it, then of
    /// shrinking ones, O(log n) jumps in all.
    fn last_link_before(&mut self, from: u32, right: u32, right_pos: Option<Pos>) -> u32 {
        let before = |text: &mut Self, lv: u32| {
            lv != NONE
                && (right == NONE
                    || match (text.tree.locate_fresh(lv), right_pos) {
                        (Some(a), Some(b)) => text.tree.cmp(a, b) == std::cmp::Ordering::Less,
                        _ => false,
                    })
        };
        // Most often the whole chain lies before `right`: its end, kept,
        // answers at once.
        let end = self.history.chain_end(from);
        if end == from || before(self, end) {
            return end;
        }
        let mut level = 0u8;
        while level < 32 {
            let to = self.history.chain_jump(from, level);
            if !before(self, to) {
                break;
            }
            level += 1;
        }
        let mut at = from;
        while level > 0 {
            level -= 1;
            let to = self.history.chain_jump(at, level);
            if before(self, to) {
                at = to;
            }
        }
        at
    }

    /// Where item `lv` is (`None` for [`NONE`], a document end).
    fn pos_of(&mut self, lv: u32) -> Option<Pos> {
        (lv != NONE).then(|| self.tree.locate_fresh(lv)).flatten()
    }

    /// Document order of item `lv` against `reference` (at
    /// `reference_pos`), where [`NONE`] is the document start when
    /// `none_first` and its end otherwise.
    fn order(
        &mut self,
        lv: u32,
        reference: u32,
        reference_pos: Option<Pos>,
        none_first: bool,
    ) -> std::cmp::Ordering {
        use std::cmp::Ordering::*;
        let none = if none_first { Less } else { Greater };
        match (lv == NONE, reference == NONE) {
            _ if lv == reference => Equal,
            (true, _) => none,
            (false, true) => none.reverse(),
            (false, false) => match (self.tree.locate_fresh(lv), reference_pos) {
                (Some(a), Some(b)) => self.tree.cmp(a, b),
                _ => Equal,
            },
        }
    }

    /// Applies buffered ops until none can be, round-robin over replicas:
    /// each replica's queue is applied from its head for as long as the
    /// head's dependencies are here.
    pub(crate) fn drain(&mut self) {
        loop {
            let mut progress = false;
            let replicas: Vec<ReplicaId> = self.pending.by_replica.keys().copied().collect();
            for r in replicas {
                loop {
                    let known = self.history.known(r);
                    let Some(queue) = self.pending.by_replica.get_mut(&r) else {
                        break;
                    };
                    let Some(head) = queue.pop_front() else {
                        self.pending.by_replica.remove(&r);
                        break;
                    };
                    let Some(head) = unseen(head, known) else {
                        continue;
                    };
                    if head.id.counter() - 1 != known {
                        queue.push_front(head);
                        break;
                    }
                    match self.try_integrate(&head) {
                        Ok(true) => progress = true,
                        Ok(false) => {
                            if let Some(queue) = self.pending.by_replica.get_mut(&r) {
                                queue.push_front(head);
                            }
                            break;
                        }
                        // An op that can never apply (it names a deletion as
                        // an origin, or overflows) is dropped.
                        Err(_) => progress = true,
                    }
                }
            }
            if !progress {
                break;
            }
        }
        self.pending.by_replica.retain(|_, q| !q.is_empty());
    }

    /// Whether the document holds no event and no buffered op.
    fn is_blank(&self) -> bool {
        self.history.agents.iter().all(|a| a.known == 0) && self.pending.is_empty()
    }

    /// Becomes `other` (this replica blank), keeping its own replica id.
    fn adopt(&mut self, other: Self) {
        let replica = std::mem::take(&mut self.replica);
        *self = other;
        self.replica = replica;
        // A delta is all buffered ops: apply what now can be.
        self.drain();
    }

    /// Sets the replica local edits are made as (for the test harness,
    /// which edits one state as several replicas in turn).
    #[cfg(feature = "testing")]
    pub(crate) fn set_replica(&mut self, replica: ReplicaId) {
        self.replica = replica.into();
    }
}

impl Merge for Text {
    /// Adds every edit of `other` this document lacks (and `other`'s
    /// buffered ops), integrating them as ops in causal order.
    fn merge(&mut self, other: &Self) {
        if self.is_blank() {
            self.adopt(other.clone());
            return;
        }
        let ops = other.ops_after(|r| self.history.known(r));
        for op in ops.into_iter().chain(other.pending.iter().cloned()) {
            let known = self.history.known(op.replica());
            self.pending.push(op, known);
        }
        self.drain();
    }

    /// [`merge`](Merge::merge), moving `other` in when this replica is
    /// blank instead of copying it.
    fn merge_owned(&mut self, other: Self) {
        if self.is_blank() {
            self.adopt(other);
        } else {
            self.merge(&other);
        }
    }
}

impl DeltaMerge for Text {
    type Summary = VersionVector;

    fn version_vector(&self) -> VersionVector {
        self.history
            .agents
            .iter()
            .map(|a| (a.id, a.known))
            .collect()
    }

    /// The edits a replica at `since` lacks, as a document that holds only
    /// buffered ops (they name characters the delta itself does not hold);
    /// for a replica that has none of this document's events, the whole
    /// document (it holds every character its ops name, so it encodes and
    /// loads without buffering, and merging it into a blank replica is a
    /// copy).
    fn delta(&self, since: &VersionVector) -> Self {
        if self.history.agents.iter().all(|a| since.get(a.id) == 0) {
            return self.clone();
        }
        let mut delta = Text::with_replica(self.replica.clone());
        for op in self.ops_since(since) {
            delta.pending.push(op, 0);
        }
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::MAX_COUNTER;

    /// Documents merged from random concurrent edits of 2 to 5 replicas
    /// are pre-order walks of their left-origin trees (what skipping a
    /// concurrent sibling's descendants by depth rests on), and
    /// `next_within_depth` finds the item a scan item by item finds.
    #[test]
    fn documents_are_preorder_walks_of_left_origins() {
        let mut x = 7u64;
        let mut next = move |n: usize| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) % n as u64) as usize
        };
        for _ in 0..40 {
            let k = 2 + next(4);
            let mut replicas: Vec<Text> = (1..=k as u64)
                .map(|i| Text::new(ReplicaId::new(i)))
                .collect();
            for _ in 0..80 {
                let r = next(k);
                let len = replicas[r].len();
                match next(10) {
                    0 => {
                        let other = replicas[next(k)].clone();
                        replicas[r].merge(&other);
                    }
                    1 | 2 if len > 0 => {
                        let a = next(len);
                        let b = (a + 1 + next(3)).min(len);
                        replicas[r].delete(a..b).unwrap();
                    }
                    _ => {
                        let text = ["a", "bc", "def"][next(3)];
                        replicas[r].insert(next(len + 1), text).unwrap();
                    }
                }
            }
            let mut doc = replicas[0].clone();
            for r in &replicas[1..] {
                doc.merge(r);
            }
            let items: Vec<u32> = doc
                .tree
                .leaves()
                .flat_map(|l| l.runs.iter().flat_map(|r| r.lv..r.end()))
                .collect();
            let depths: Vec<u32> = items.iter().map(|&lv| doc.history.depth(lv)).collect();
            let (mut before, mut before_depth) = (NONE, 0);
            for (&lv, &depth) in items.iter().zip(&depths) {
                let (left, _) = doc.history.origins_of(lv);
                let parent = if left == NONE {
                    0
                } else {
                    doc.history.depth(left)
                };
                assert_eq!(depth, parent + 1);
                assert!(depth <= before_depth + 1);
                assert_eq!(depth == before_depth + 1, left == before);
                (before, before_depth) = (lv, depth);
            }
            let deepest = depths.iter().copied().max().unwrap_or(0) as usize;
            for _ in 0..60 {
                let i = next(items.len());
                let d = next(deepest + 2) as u32;
                let from = doc.tree.locate(items[i]).unwrap();
                let want = (i..items.len()).find(|&j| depths[j] <= d);
                match doc.tree.next_within_depth(from, d, &mut doc.history) {
                    Ok(p) => assert_eq!(Some(p), want.map(|j| doc.tree.locate(items[j]).unwrap())),
                    Err(_) => assert_eq!(want, None),
                }
            }
        }
    }

    /// Counters up to [`MAX_COUNTER`] are kept exactly in the 32-bit logs,
    /// and an edit that would pass it is refused with the text unchanged.
    #[test]
    fn counters_reach_max_counter_exactly() {
        let mut t = Text::new(ReplicaId::new(1));
        t.insert(0, "xy").unwrap();
        // No replica gets near the limit in a test's time: start there.
        let peer = ReplicaId::new(2);
        let a = t.history.intern(peer);
        t.history.agents[a as usize].known = MAX_COUNTER - 2;
        let op = TextOp {
            id: Dot::new(peer, MAX_COUNTER - 1),
            kind: OpKind::Insert(Insertion {
                origin_left: None,
                origin_right: None,
                len: 2,
                text: Content::from("ab"),
                hidden: Vec::new(),
            }),
        };
        t.apply(&op).unwrap();
        assert_eq!(t.history.known(peer), MAX_COUNTER);
        let first = t.history.lvs[t.history.lvs.len() - 1];
        assert_eq!(t.dot_of(first + 1), Some(Dot::new(peer, MAX_COUNTER)));

        let me = t.history.agent(ReplicaId::new(1)).unwrap();
        t.history.agents[me as usize].known = MAX_COUNTER - 1;
        let before = t.clone();
        let exhausted = Err(TextError::CountersExhausted { max: MAX_COUNTER });
        assert_eq!(t.insert(0, "cd"), exhausted);
        // One event is left: a delete or an insert alone would fit, both
        // in one replace do not, and neither is made.
        assert_eq!(t.replace(0..1, "c"), exhausted.clone().map(|_: TextOp| ()));
        assert_eq!(t, before);
        let op = t.insert(0, "c").unwrap();
        assert_eq!(op.id, Dot::new(ReplicaId::new(1), MAX_COUNTER));
        assert_eq!(t.dot_of(t.history.items - 1), Some(op.id));
        assert_eq!(t.delete(0..1), exhausted);
        assert_eq!(t.replace(0..0, "d"), exhausted.map(|_: TextOp| ()));
        assert_eq!(t.to_string(), "cxyab");
    }
}
