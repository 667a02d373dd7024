//! Who inserted and deleted what: the replica table, the insert log and the
//! delete log, all run-length encoded.
//!
//! Every character ever inserted gets a *local version* (`lv`): a `u32`
//! handed out in the order this replica integrated the characters, so local
//! versions are replica-specific while ids (a replica and its counter, a
//! [`Dot`](crate::causal::Dot)) are global. Because a character is only
//! integrated after its origins, **local-version order is a causal order**.
//!
//! The insert log is sorted by `lv` and covers every local version exactly
//! once; an entry stands for a burst of typing: characters with consecutive
//! counters from one replica, where each one's left origin is the one before
//! and all share the first one's right origin. An entry's length is implicit
//! (up to the next entry's `lv`), which keeps an entry at 20 bytes: 16 for
//! its replica, counter (32 bits: no replica gets past [`MAX_COUNTER`]
//! events in one text) and origins, and its first `lv` in a column of its
//! own, so that finding the entry of a local version searches 4-byte
//! values, a few cache lines, instead of whole entries.
//!
//! ```text
//!   insert log                       ids            origins of the first item
//!   lv 0..5   "hello"  replica 1     r1.1 ..= r1.5  (start, end)
//!   lv 5..11  " world" replica 2     r2.1 ..= r2.6  (r1.5, end)
//!   delete log: replica 1, r1.6 ..= r1.7 deleted lv 6..8 backwards
//! ```
//!
//! Deletes consume counters too (one per deleted character), so a version
//! vector counts both kinds of event. The delete log joins consecutive
//! deletes of one replica whose targets continue each other in either
//! direction (forward delete, or backspace), as diamond-types does.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::{MAX_COUNTER, NONE, reserve_lean};
use crate::causal::ReplicaId;

/// One burst of inserted characters (see the module docs); its first
/// local version is in [`History::lvs`]. 16 bytes: counters are kept in
/// 32 bits (see [`MAX_COUNTER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InsertEntry {
    /// Counter of the first character; the others follow one by one.
    counter: u32,
    /// Index of the inserting replica in [`History::agents`].
    pub(crate) agent: u32,
    /// Left origin of the first character, or [`NONE`](super::NONE) (document start).
    pub(crate) origin_left: u32,
    /// Right origin of every character, or [`NONE`](super::NONE) (document end).
    pub(crate) origin_right: u32,
}

const _: () = assert!(std::mem::size_of::<InsertEntry>() == 16);

impl InsertEntry {
    /// Counter of the first character.
    pub(crate) fn counter(&self) -> u64 {
        u64::from(self.counter)
    }
}

/// The top bit of [`DeleteEntry::packed`]: targets were deleted from the
/// highest local version down.
const REVERSED: u32 = 1 << 31;

/// Consecutive delete events of one replica whose targets are consecutive
/// local versions (12 bytes; the replica is the [`Agent`] that holds it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeleteEntry {
    /// Counter of the first delete event.
    counter: u32,
    /// Lowest local version deleted.
    pub(crate) target: u32,
    /// Number of events, with [`REVERSED`] or-ed in when event `k` deleted
    /// `target + len - 1 - k` rather than `target + k`.
    packed: u32,
}

impl DeleteEntry {
    /// Counter of the first delete event.
    pub(crate) fn counter(&self) -> u64 {
        u64::from(self.counter)
    }

    /// Number of delete events (and of targets).
    pub(crate) fn len(&self) -> u32 {
        self.packed & !REVERSED
    }

    /// Whether the events deleted their targets from the top down.
    pub(crate) fn reversed(&self) -> bool {
        self.packed & REVERSED != 0
    }
}

/// One replica as this document knows it.
#[derive(Clone, Debug)]
pub(crate) struct Agent {
    /// Its id.
    pub(crate) id: ReplicaId,
    /// How many of its events (inserted or deleted characters) this
    /// document holds: exactly counters `1 ..= known`.
    pub(crate) known: u64,
    /// How many of its first insert entries are entries `0 .. first`: the
    /// first replica's, made while it was the only one (their list would
    /// be `0 .. first`, so it is not kept).
    first: u32,
    /// Its other insert entries, by counter (indices into
    /// [`History::inserts`]), made while the document had other replicas.
    /// Both parts are read through [`History::entries_of`].
    inserts: Vec<u32>,
    /// Its delete entries, by counter.
    pub(crate) deletes: Vec<DeleteEntry>,
}

/// One replica's insert entries, by counter, as indices into
/// [`History::inserts`] (see [`History::entries_of`]): entries
/// `0 .. prefix`, then those listed in `rest`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entries<'a> {
    prefix: usize,
    rest: &'a [u32],
}

impl Entries<'_> {
    /// How many entries.
    pub(crate) fn len(&self) -> usize {
        self.prefix + self.rest.len()
    }

    /// The `i`th entry's index (`i < len()`).
    pub(crate) fn at(&self, i: usize) -> usize {
        match i.checked_sub(self.prefix) {
            None => i,
            Some(j) => self.rest[j] as usize,
        }
    }

    /// The `i`th entry's index, if there is one.
    pub(crate) fn get(&self, i: usize) -> Option<usize> {
        (i < self.len()).then(|| self.at(i))
    }

    /// The first position in `range` (within `0 .. len()`) whose entry
    /// does not satisfy `pred`, which must hold for the entries before
    /// some position and fail after it, by bisection.
    pub(crate) fn partition_point(
        &self,
        range: Range<usize>,
        mut pred: impl FnMut(usize) -> bool,
    ) -> usize {
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(self.at(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The entries' indices in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).map(|i| self.at(i))
    }
}

/// What a global id names here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// An inserted character, with its local version.
    Insert(u32),
    /// A delete event.
    Delete,
    /// An event this document has not seen.
    Unknown,
}

/// Local versions per slot of [`History::slots`], as a shift.
const SLOT: u32 = 8;

/// The longest range [`History::first_within_depth`] reads character by
/// character (past it, one entry search per entry piece costs less).
const SHORT_RANGE: u32 = 16;

/// Characters per insert entry whose depths [`History::depth`] keeps one
/// by one: past `DEPTHS_PER_ENTRY` times the entries, a depth is computed
/// from its entry's, so the table stays bounded by the entries (a decoded
/// run of deleted characters claims any length for a few bytes).
const DEPTHS_PER_ENTRY: usize = 16;

/// The replica table and both logs.
#[derive(Clone, Debug, Default)]
pub(crate) struct History {
    /// Every replica that made an event here, in order of first appearance.
    pub(crate) agents: Vec<Agent>,
    /// Index of each replica in `agents`.
    by_id: BTreeMap<ReplicaId, u32>,
    /// Insert entries, sorted by `lv`, covering `0 .. items` without gaps.
    pub(crate) inserts: Vec<InsertEntry>,
    /// For every 256th local version (`k << SLOT`), the index of the insert
    /// entry holding it: [`History::entry_of`] searches only the entries
    /// between two neighbouring slots. Append-only, like the entries.
    slots: Vec<u32>,
    /// The first local version of each insert entry, beside `inserts`:
    /// [`History::entry_of`] searches these alone, four bytes apart.
    pub(crate) lvs: Vec<u32>,
    /// Number of characters ever inserted: the next local version.
    pub(crate) items: u32,
    /// Jumps of `2^level` links along chains (see
    /// [`History::chain_jump`]) from a character, by its local version and
    /// the level, once found.
    chain_jumps: HashMap<(u32, u8), u32>,
    /// The end of the chain (see [`History::chain_end`]) of entries' first
    /// characters that link to another, by local version, once found.
    chain_ends: HashMap<u32, u32>,
    /// The depth (see [`History::depth`]) of each of the first
    /// `depths.len()` characters, by local version, filled in on demand:
    /// only a merge of concurrent edits asks, so a document edited in one
    /// place holds none. At most [`DEPTHS_PER_ENTRY`] per insert entry.
    depths: Vec<u32>,
    /// The depth of the first character of each of the first
    /// `entry_depths.len()` insert entries, for characters past `depths`'
    /// bound.
    entry_depths: Vec<u32>,
}

impl History {
    /// How many events of each replica are here, for every replica with
    /// at least one, in ascending replica order (what equality and the
    /// encoding compare and write).
    pub(crate) fn known_versions(&self) -> Vec<(ReplicaId, u64)> {
        let mut known: Vec<(ReplicaId, u64)> = self
            .agents
            .iter()
            .filter(|a| a.known > 0)
            .map(|a| (a.id, a.known))
            .collect();
        known.sort_unstable();
        known
    }

    /// The agent index of `id`, if it made any event here.
    pub(crate) fn agent(&self, id: ReplicaId) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    /// The agent index of `id`, adding it if new.
    pub(crate) fn intern(&mut self, id: ReplicaId) -> u32 {
        if let Some(a) = self.agent(id) {
            return a;
        }
        let a = self.agents.len() as u32;
        if a == 1 {
            // The first replica's entries so far stay implicit.
            self.agents[0].first = self.inserts.len() as u32;
        }
        self.agents.push(Agent {
            id,
            known: 0,
            first: 0,
            inserts: Vec::new(),
            deletes: Vec::new(),
        });
        self.by_id.insert(id, a);
        a
    }

    /// How many events of `id` are known (its version vector entry).
    pub(crate) fn known(&self, id: ReplicaId) -> u64 {
        self.agent(id).map_or(0, |a| self.agents[a as usize].known)
    }

    /// The insert entries of agent `a`, by counter.
    pub(crate) fn entries_of(&self, a: usize) -> Entries<'_> {
        if self.agents.len() == 1 {
            Entries {
                prefix: self.inserts.len(),
                rest: &[],
            }
        } else {
            let agent = &self.agents[a];
            Entries {
                prefix: agent.first as usize,
                rest: &agent.inserts,
            }
        }
    }

    /// Number of characters in insert entry `i`.
    pub(crate) fn entry_len(&self, i: usize) -> u32 {
        let end = self.lvs.get(i + 1).copied().unwrap_or(self.items);
        end - self.lvs[i]
    }

    /// Index of the insert entry holding local version `lv` (`< items`).
    pub(crate) fn entry_of(&self, lv: u32) -> usize {
        // Local typing asks about the newest entry most of the time.
        let last = self.inserts.len() - 1;
        if self.lvs[last] <= lv {
            return last;
        }
        let k = (lv >> SLOT) as usize;
        let a = self.slots[k] as usize;
        let b = self.slots.get(k + 1).map_or(last, |&h| h as usize);
        if b - a > 64 {
            return self.entry_among_many(lv, k, a, b);
        }
        a + self.lvs[a..=b].partition_point(|&x| x <= lv) - 1
    }

    /// [`History::entry_of`] where slot `k` holds many short entries
    /// (concurrent or scattered typing), the one holding `lv` among
    /// entries `a ..= b`: a guess at where `lv` falls as if they were
    /// even, then a gallop from the guess to bracket it, a few probes
    /// instead of a search over the slot's entries (each a likely cache
    /// miss). Entry `a` starts at or before `lv`.
    #[inline(never)]
    fn entry_among_many(&self, lv: u32, k: usize, mut a: usize, mut b: usize) -> usize {
        let into = u64::from(lv - ((k as u32) << SLOT));
        let guess = a + ((into * (b - a) as u64) >> SLOT) as usize;
        let mut step = 1;
        if self.lvs[guess] <= lv {
            a = guess;
            while a + step <= b && self.lvs[a + step] <= lv {
                a += step;
                step *= 2;
            }
            b = b.min(a + step - 1);
        } else {
            b = guess - 1;
            loop {
                let probe = b.saturating_sub(step - 1).max(a);
                if self.lvs[probe] <= lv {
                    a = probe;
                    break;
                }
                b = probe - 1;
                step *= 2;
            }
        }
        a + self.lvs[a..=b].partition_point(|&x| x <= lv) - 1
    }

    /// The replica and counter of the character with local version `lv`.
    pub(crate) fn id_of(&self, lv: u32) -> (ReplicaId, u64) {
        let i = self.entry_of(lv);
        let e = self.inserts[i];
        (
            self.agents[e.agent as usize].id,
            e.counter() + u64::from(lv - self.lvs[i]),
        )
    }

    /// The depth of character `lv` in the tree its left origins make (a
    /// character is a child of its left origin; the document start is the
    /// root, at depth 0).
    ///
    /// Every integration places a character right after its left origin
    /// or after whole subtrees of that origin's other children, never
    /// inside one, so the document is a pre-order walk of this tree: the
    /// characters that follow `x` and are deeper than it are exactly its
    /// descendants, up to the first that is not deeper. Integration skips
    /// a concurrent sibling's descendants that way.
    #[inline]
    pub(crate) fn depth(&mut self, lv: u32) -> u32 {
        match self.depths.get(lv as usize) {
            Some(&d) => d,
            None => self.depth_to_find(lv),
        }
    }

    /// [`History::depth`] of a character not in `depths` yet: filled in up
    /// to it when within their bound, else its entry's depth plus its
    /// offset there (the characters of an entry each name the one before
    /// as left origin).
    #[inline(never)]
    fn depth_to_find(&mut self, lv: u32) -> u32 {
        if self.tabled(lv) {
            self.fill_depths(lv);
            return self.depths[lv as usize];
        }
        let e = self.entry_of(lv);
        while self.entry_depths.len() <= e {
            let i = self.entry_depths.len();
            let d = depth_below(self.inserts[i].origin_left, self.lvs[i], |left| match self
                .depths
                .get(left as usize)
            {
                Some(&d) => d,
                None => {
                    let o = self.entry_of(left);
                    self.entry_depths[o].saturating_add(left - self.lvs[o])
                }
            });
            self.entry_depths.push(d);
        }
        self.entry_depths[e].saturating_add(lv - self.lvs[e])
    }

    /// Whether `depths` may hold character `lv` (see
    /// [`DEPTHS_PER_ENTRY`]).
    fn tabled(&self, lv: u32) -> bool {
        (lv as usize) < self.inserts.len().saturating_mul(DEPTHS_PER_ENTRY)
    }

    /// Computes the depths of the characters up to `lv` (see
    /// [`History::depth`]), in local-version order: a character's left
    /// origin is an earlier one (the one before, inside an entry), so one
    /// pass computes them. Out of line: most calls find the depth already
    /// there, and inline only that check.
    #[inline(never)]
    fn fill_depths(&mut self, lv: u32) {
        let from = self.depths.len() as u32;
        self.depths.reserve((lv - from) as usize + 1);
        let mut e = self.entry_of(from);
        for at in from..=lv {
            if self.lvs.get(e + 1) == Some(&at) {
                e += 1;
            }
            let left = if at == self.lvs[e] {
                self.inserts[e].origin_left
            } else {
                at - 1
            };
            let d = depth_below(left, at, |left| self.depths[left as usize]);
            self.depths.push(d);
        }
    }

    /// The offset in `lv .. lv + n` of its first character at depth `d`
    /// or less, if any. Depth grows along an entry, so in a long range
    /// only the first character of each entry's piece of it can be the
    /// one; a short one is read character by character, with no search
    /// for its entries.
    #[inline]
    pub(crate) fn first_within_depth(&mut self, lv: u32, n: u32, d: u32) -> Option<u32> {
        let end = lv + n;
        if n <= SHORT_RANGE && self.tabled(end - 1) {
            self.depth(end - 1);
            let depths = &self.depths[lv as usize..end as usize];
            return depths.iter().position(|&x| x <= d).map(|k| k as u32);
        }
        let mut at = lv;
        let mut e = self.entry_of(lv);
        while at < end {
            if self.depth(at) <= d {
                return Some(at - lv);
            }
            at = self.lvs[e] + self.entry_len(e);
            e += 1;
        }
        None
    }

    /// The left and right origins of the character `lv`.
    pub(crate) fn origins_of(&self, lv: u32) -> (u32, u32) {
        self.origins_in(self.entry_of(lv), lv)
    }

    /// The left and right origins of the character `lv` of insert entry
    /// `e`.
    pub(crate) fn origins_in(&self, e: usize, lv: u32) -> (u32, u32) {
        let entry = self.inserts[e];
        let left = if lv == self.lvs[e] {
            entry.origin_left
        } else {
            lv - 1
        };
        (left, entry.origin_right)
    }

    /// The next character of `lv`'s chain: its right origin, if that has
    /// the same left origin. Typing backward makes a chain (each keystroke
    /// has the one before as its right origin, and all share their left
    /// origin), and so do concurrent inserts at one place seen in turn.
    fn chain_next(&self, lv: u32) -> Option<u32> {
        let (left, right) = self.origins_of(lv);
        (right != NONE && self.origins_of(right).0 == left).then_some(right)
    }

    /// The last character of the chain from `lv` (`lv` itself when it
    /// links to nothing). Origins never change, so neither does a chain's
    /// end (chains only grow at their start, by new characters that name
    /// an old one as their right origin): each end found is kept for the
    /// entries' first characters on the way, so every link is walked once
    /// in the document's life. A character inside an entry links only to
    /// an entry's first character, so ends kept for those suffice.
    pub(crate) fn chain_end(&mut self, lv: u32) -> u32 {
        let mut walked = Vec::new();
        let mut at = lv;
        let end = loop {
            let first = self.lvs[self.entry_of(at)] == at;
            if first {
                if let Some(&end) = self.chain_ends.get(&at) {
                    break end;
                }
            }
            match self.chain_next(at) {
                None => break at,
                Some(next) => {
                    if first {
                        walked.push(at);
                    }
                    at = next;
                }
            }
        };
        for first in walked {
            self.chain_ends.insert(first, end);
        }
        end
    }

    /// The character `2^level` links along the chain from `lv`, or
    /// [`NONE`] past the chain's end (binary lifting: the scan that places
    /// a remote insert finds the last link of a chain before a given place
    /// in O(log n) jumps). Origins never change, so neither do chains
    /// (they only grow at their start, by new characters naming an old one
    /// as their right origin), and every jump of two or more links, once
    /// found, is kept.
    pub(crate) fn chain_jump(&mut self, lv: u32, level: u8) -> u32 {
        if level == 0 {
            return self.chain_next(lv).unwrap_or(NONE);
        }
        if let Some(&to) = self.chain_jumps.get(&(lv, level)) {
            return to;
        }
        let half = self.chain_jump(lv, level - 1);
        let to = if half == NONE {
            NONE
        } else {
            self.chain_jump(half, level - 1)
        };
        self.chain_jumps.insert((lv, level), to);
        to
    }

    /// What the event `counter` of `id` is here.
    pub(crate) fn lookup(&self, id: ReplicaId, counter: u64) -> Lookup {
        let Some(a) = self.agent(id) else {
            return Lookup::Unknown;
        };
        let agent = &self.agents[a as usize];
        if counter == 0 || counter > agent.known {
            return Lookup::Unknown;
        }
        // Remote ops mostly name recent characters of their replica: try
        // its newest entries in growing steps back, then bisect the
        // bracket found (or everything older).
        let entries = self.entries_of(a as usize);
        let n = entries.len();
        let counter_of = |i: usize| self.inserts[entries.at(i)].counter();
        let (mut lo, mut hi, mut step) = (0, n, 1);
        while step <= n.min(16) {
            let probe = n - step;
            if counter_of(probe) <= counter {
                lo = probe;
                break;
            }
            hi = probe;
            step *= 2;
        }
        let i = entries.partition_point(lo..hi, |e| self.inserts[e].counter() <= counter);
        if i > 0 {
            let e = entries.at(i - 1);
            let offset = counter - self.inserts[e].counter();
            if offset < u64::from(self.entry_len(e)) {
                return Lookup::Insert(self.lvs[e] + offset as u32);
            }
        }
        Lookup::Delete
    }

    /// Records `len` characters inserted by `agent` from `counter` (which
    /// must be the agent's next), with the first character's origins, and
    /// returns the local version of the first one. Extends the last entry
    /// when the characters continue it.
    #[inline]
    pub(crate) fn push_insert(
        &mut self,
        agent: u32,
        counter: u64,
        len: u32,
        origin_left: u32,
        origin_right: u32,
    ) -> u32 {
        let lv = self.items;
        let extends = self.inserts.last().is_some_and(|last| {
            let last_len = u64::from(lv - self.lvs[self.lvs.len() - 1]);
            last.agent == agent
                && last.counter() + last_len == counter
                && origin_left == lv - 1
                && origin_right == last.origin_right
        });
        if !extends {
            self.push_insert_entry(InsertEntry {
                counter: narrow(counter),
                agent,
                origin_left,
                origin_right,
            });
        }
        self.items += len;
        if ((self.slots.len() as u64) << SLOT) < u64::from(self.items) {
            self.extend_slots();
        }
        self.agents[agent as usize].known = counter + u64::from(len) - 1;
        lv
    }

    /// Starts a new insert entry at local version `items`. Out of line,
    /// as is [`History::extend_slots`], so that typing on, which extends
    /// the last entry, saves and restores no registers for them.
    #[inline(never)]
    fn push_insert_entry(&mut self, entry: InsertEntry) {
        if self.agents.len() > 1 {
            self.agents[entry.agent as usize]
                .inserts
                .push(self.inserts.len() as u32);
        }
        reserve_lean(&mut self.inserts, 1, 16);
        reserve_lean(&mut self.lvs, 1, 16);
        self.lvs.push(self.items);
        self.inserts.push(entry);
    }

    /// Points the slots up to local version `items` at the last entry.
    #[inline(never)]
    fn extend_slots(&mut self) {
        let entry = self.inserts.len() as u32 - 1;
        while ((self.slots.len() as u64) << SLOT) < u64::from(self.items) {
            self.slots.push(entry);
        }
    }

    /// Records `len` delete events of `agent` from `counter` (its next),
    /// deleting local versions `target .. target + len`, from the top down
    /// when `reversed`. Joins the agent's previous delete entry when the
    /// events and targets continue it.
    pub(crate) fn push_delete(
        &mut self,
        agent: u32,
        counter: u64,
        target: u32,
        len: u32,
        reversed: bool,
    ) {
        let reversed = reversed && len > 1;
        let agent = &mut self.agents[agent as usize];
        agent.known = counter + u64::from(len) - 1;
        if let Some(e) = agent.deletes.last_mut() {
            if e.counter() + u64::from(e.len()) == counter {
                let forward = (e.len() == 1 || !e.reversed()) && !reversed;
                let backward = (e.len() == 1 || e.reversed()) && (len == 1 || reversed);
                if forward && target == e.target + e.len() {
                    e.packed = e.len() + len;
                    return;
                }
                if backward && target + len == e.target {
                    e.packed = (e.len() + len) | REVERSED;
                    e.target = target;
                    return;
                }
            }
        }
        reserve_lean(&mut agent.deletes, 1, 16);
        agent.deletes.push(DeleteEntry {
            counter: narrow(counter),
            target,
            packed: len | if reversed { REVERSED } else { 0 },
        });
    }

    /// Calls `visit` for each insert entry piece covering the local
    /// versions `lv .. lv + n`, in order, as `(entry index, first lv,
    /// count)`. `hint` is an entry index to try first (deletions tend to
    /// hit the entry the previous one hit); it is left at the last entry
    /// visited.
    pub(crate) fn pieces(
        &self,
        hint: &mut usize,
        mut lv: u32,
        n: u32,
        mut visit: impl FnMut(usize, u32, u32),
    ) {
        let end = lv + n;
        let hinted = self
            .lvs
            .get(*hint)
            .is_some_and(|&first| first <= lv && lv < first + self.entry_len(*hint));
        let mut i = if hinted { *hint } else { self.entry_of(lv) };
        while lv < end {
            let entry_end = self.lvs[i] + self.entry_len(i);
            let take = entry_end.min(end) - lv;
            visit(i, lv, take);
            *hint = i;
            lv += take;
            i += 1;
        }
    }
}

/// The depth (see [`History::depth`]) of character `at`, whose left
/// origin is `left`, given `origin_depth` to find that origin's. A left
/// origin at or after its character only comes from crafted bytes; any
/// depth keeps integration moving forward.
#[inline]
fn depth_below(left: u32, at: u32, origin_depth: impl FnOnce(u32) -> u32) -> u32 {
    if left == NONE || left >= at {
        1
    } else {
        origin_depth(left).saturating_add(1)
    }
}

/// `counter` in the 32 bits the logs keep it in. Every way into a
/// document (local edits, [`TextOp::check`](super::op::TextOp::check),
/// decoding) refuses counters past [`MAX_COUNTER`] before they get here.
fn narrow(counter: u64) -> u32 {
    debug_assert!(counter <= MAX_COUNTER);
    u32::try_from(counter).expect("counters past MAX_COUNTER are refused at the door")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Depths are kept one by one only up to a bound set by the insert
    /// entries: a run of a billion characters claimed by a few bytes keeps
    /// its depths by entry, and each still comes out right (every
    /// character of an entry names the one before as left origin).
    #[test]
    fn depths_of_a_long_entry_stay_bounded() {
        let mut h = History::default();
        let a = h.intern(ReplicaId::new(1));
        let long = 1u32 << 30;
        let first = h.push_insert(a, 1, long, NONE, NONE);
        let last = first + long - 1;
        let after = h.push_insert(a, u64::from(long) + 7, 3, first + 5, NONE);
        assert_eq!(h.depth(last), long);
        assert_eq!(h.depth(first + 3), 4);
        assert_eq!(h.depth(after + 2), 6 + 3);
        assert!(h.depths.len() <= 2 * DEPTHS_PER_ENTRY);
    }

    /// `entry_of` finds every character's entry wherever slots hold few or
    /// many entries: short entries of two replicas in turn (up to 256 in
    /// a slot, searched from an interpolated guess), then long ones.
    #[test]
    fn entry_of_finds_every_characters_entry() {
        let mut h = History::default();
        let agents = [h.intern(ReplicaId::new(1)), h.intern(ReplicaId::new(2))];
        let mut counters = [1u64, 1];
        let mut x = 5u64;
        for i in 0..3_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let len = if i < 2_000 {
                1 + (x >> 62) as u32 % 3
            } else {
                1 + (x >> 40) as u32 % 700
            };
            let a = i % 2;
            h.push_insert(agents[a], counters[a], len, NONE, NONE);
            counters[a] += u64::from(len);
        }
        let mut e = 0;
        for lv in 0..h.items {
            while e + 1 < h.lvs.len() && h.lvs[e + 1] <= lv {
                e += 1;
            }
            assert_eq!(h.entry_of(lv), e, "lv {lv}");
        }
    }

    /// Typing extends one entry; a jump starts another; lookups find both.
    #[test]
    fn insert_entries_join_and_lookup() {
        let mut h = History::default();
        let a = h.intern(ReplicaId::new(1));
        assert_eq!(h.push_insert(a, 1, 3, NONE, NONE), 0);
        assert_eq!(h.push_insert(a, 4, 2, 2, NONE), 3);
        assert_eq!(h.inserts.len(), 1);
        assert_eq!(h.push_insert(a, 6, 1, 0, 1), 5);
        assert_eq!(h.inserts.len(), 2);
        assert_eq!(h.lookup(ReplicaId::new(1), 5), Lookup::Insert(4));
        assert_eq!(h.lookup(ReplicaId::new(1), 6), Lookup::Insert(5));
        assert_eq!(h.lookup(ReplicaId::new(1), 7), Lookup::Unknown);
        assert_eq!(h.origins_of(4), (3, NONE));
        assert_eq!(h.origins_of(5), (0, 1));
        assert_eq!(h.id_of(5), (ReplicaId::new(1), 6));
    }

    /// Typing backward links each keystroke to the one before (its right
    /// origin, with the same left origin); jumps along the chain land where
    /// counting links says, and stop at its end.
    #[test]
    fn backward_typing_makes_one_chain() {
        let mut h = History::default();
        let a = h.intern(ReplicaId::new(1));
        h.push_insert(a, 1, 2, NONE, NONE); // "xy", lv 0..2
        // Typing "cba" backward between x and y: c, then b before c, then a.
        h.push_insert(a, 3, 1, 0, 1); // c: lv 2
        h.push_insert(a, 4, 1, 0, 2); // b: lv 3
        h.push_insert(a, 5, 1, 0, 3); // a: lv 4
        // c's right origin is y, whose left origin (inside the first entry)
        // is x too: the chain is a, b, c, y, and y links to nothing (its
        // right origin is the end); nor does x.
        assert_eq!(h.chain_jump(4, 0), 3);
        assert_eq!(h.chain_jump(4, 1), 2);
        assert_eq!(h.chain_jump(3, 1), 1);
        assert_eq!(h.chain_jump(4, 2), NONE);
        assert_eq!(h.chain_jump(1, 0), NONE);
        assert_eq!(h.chain_jump(0, 0), NONE);
        // Typing elsewhere (after y) links to nothing.
        h.push_insert(a, 6, 1, 1, NONE); // z: lv 5
        assert_eq!(h.chain_jump(5, 0), NONE);
    }

    /// Backspaces join into one reversed entry, forward deletes into one
    /// forward entry.
    #[test]
    fn delete_entries_join_both_ways() {
        let mut h = History::default();
        let a = h.intern(ReplicaId::new(1));
        h.push_insert(a, 1, 10, NONE, NONE);
        h.push_delete(a, 11, 9, 1, false);
        h.push_delete(a, 12, 8, 1, false);
        h.push_delete(a, 13, 7, 1, false);
        let deletes = &h.agents[0].deletes;
        assert_eq!(deletes.len(), 1);
        assert!(deletes[0].reversed());
        assert_eq!((deletes[0].target, deletes[0].len()), (7, 3));
        h.push_delete(a, 14, 0, 2, false);
        h.push_delete(a, 16, 2, 1, false);
        let deletes = &h.agents[0].deletes;
        assert_eq!(deletes.len(), 2);
        assert_eq!((deletes[1].target, deletes[1].len()), (0, 3));
        assert_eq!(h.lookup(ReplicaId::new(1), 12), Lookup::Delete);
        assert_eq!(h.agents[0].known, 16);
    }
}
