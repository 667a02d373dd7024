//! [`Text`]: the document type, its local edits and its readers.

use std::fmt;
use std::ops::Range;
use std::sync::OnceLock;

use super::error::TextError;
use super::history::History;
use super::leaf::{Run, char_len};
use super::op::{Content, Insertion, OpKind, Targets, TextOp, push_targets};
use super::pending::Pending;
use super::tree::{Metrics, Tree};
use super::{MAX_CHARS, MAX_COUNTER, NONE};
use crate::causal::{Dot, ReplicaId};

/// A collaborative plain-text document: a sequence CRDT of characters.
///
/// Every replica holds a `Text`, edits it locally with [`insert`] and
/// [`delete`] (or [`replace`], which builds no op), and shares the edits
/// in one of three ways, freely mixed:
///
/// - **ops**: each `insert` and `delete` returns a [`TextOp`] for the
///   others to [`apply`](Text::apply) (op-based sync, for live
///   collaboration), and [`ops_since`](Text::ops_since) gives them for
///   any stretch of the history;
/// - **deltas**: a peer sends its [`version_vector`] and gets back
///   [`delta`], everything it lacks, to [`merge`] (catching up);
/// - **states**: [`merge`] a whole other `Text` (state-based sync).
///
/// # Units
///
/// Positions and lengths are in **characters**: Unicode scalar values, what
/// `str::chars` yields. `"é"` is one character (two UTF-8 bytes), `"😀"` is
/// one (four bytes, two UTF-16 units), `"e\u{301}"` (e and a combining
/// accent) is two. Editors that count UTF-16 units (JavaScript, Java, VS
/// Code, LSP) or bytes convert with [`utf16_to_chars`](Text::utf16_to_chars)
/// and [`utf8_to_chars`](Text::utf8_to_chars) and back, in O(log n).
///
/// # Contract
///
/// Merge is commutative, associative and idempotent, and ops may arrive in
/// any order, twice, or late: every replica that has seen the same edits
/// holds the same text. Concurrent insertions at one place never
/// interleave their characters (see the [module docs](super) for the rule).
/// Each replica must have its own [`ReplicaId`]: two live replicas editing
/// under one id produce clashing ids and diverge. Use [`fork`](Text::fork)
/// to start a new replica from an existing document.
///
/// `Text` is `Send + Sync` and has no internal locks (a document made
/// without a replica id draws one once, through a `OnceLock`). Its serde
/// form is its [`codec`](crate::codec) bytes, checked the same way on the
/// way in.
///
/// # Performance
///
/// Local edits cost O(log n), usually O(1) near the last edit (a cursor
/// cache); memory is about the visible text plus a few bytes per run of
/// consecutive typing, never an object per character. See the
/// [module docs](super) for the structures and measured figures.
///
/// # Examples
///
/// Two replicas diverge and converge:
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::text::Text;
/// use calm::{DeltaMerge, Merge};
///
/// let mut alice = Text::new(ReplicaId::new(1));
/// alice.insert(0, "Hello world")?;
/// let mut bob = alice.fork(ReplicaId::new(2));
///
/// alice.insert(5, ",")?;              // "Hello, world"
/// bob.delete(6..11)?;                 // "Hello "
/// bob.insert(6, "there")?;            // "Hello there"
///
/// alice.merge(&bob.delta(&alice.version_vector()));
/// bob.merge(&alice);
/// assert_eq!(alice, bob);
/// assert_eq!(alice.to_string(), "Hello, there");
/// # Ok::<(), calm::Error>(())
/// ```
///
/// [`insert`]: Text::insert
/// [`delete`]: Text::delete
/// [`replace`]: Text::replace
/// [`version_vector`]: crate::DeltaMerge::version_vector
/// [`delta`]: crate::DeltaMerge::delta
/// [`merge`]: crate::Merge::merge
#[derive(Clone)]
pub struct Text {
    /// The replica local edits are made as. Not part of the state: two
    /// replicas with the same edits are equal whatever their ids. Drawn
    /// at random when first needed by a document made without one (a
    /// decoded document that is only merged never needs one, and drawing
    /// one from the OS costs more than decoding a short text).
    pub(crate) replica: OnceLock<ReplicaId>,
    /// Every item in document order, with the visible text.
    pub(crate) tree: Tree,
    /// Ids, origins and deletions of every item, by local version.
    pub(crate) history: History,
    /// Ops waiting for the events they build on.
    pub(crate) pending: Pending,
    /// The last right origin a local insert named, with its id: a burst
    /// of typing names the same one again and again, and looking an id up
    /// is a binary search of the insert log. Local versions never change
    /// their id, so this never goes stale.
    right_origin: (u32, Option<Dot>),
    /// `replica`'s index in `history.agents` once it made an event, to skip
    /// a map lookup per keystroke. Checked against the id on every use, so
    /// a fork or a replaced history cannot make it wrong.
    local: u32,
    /// The insert entry the last local deletion hit (see
    /// [`History::pieces`]).
    delete_hint: usize,
    /// The last remote insertion integrated: its left origin, its first
    /// local version and the item count just after it ([`NONE`]s before
    /// the first). A remote keystroke typed right before it, arriving
    /// next, goes there without a scan (see `Text::place`).
    pub(crate) placed: (u32, u32, u32),
}

impl Default for Text {
    /// An empty document with a random replica id ([`ReplicaId::random`],
    /// drawn when first needed).
    fn default() -> Self {
        Self::with_replica(OnceLock::new())
    }
}

impl Text {
    /// Creates an empty document edited as `replica`.
    pub fn new(replica: ReplicaId) -> Self {
        Self::with_replica(OnceLock::from(replica))
    }

    /// An empty document edited as `replica`, or as a random replica
    /// drawn when first needed if it holds none.
    pub(crate) fn with_replica(replica: OnceLock<ReplicaId>) -> Self {
        Self::from_parts(replica, Tree::default(), History::default())
    }

    /// A document of `tree` and `history` (which must agree), with no
    /// buffered ops, edited as `replica` (see [`Text::with_replica`]).
    pub(crate) fn from_parts(replica: OnceLock<ReplicaId>, tree: Tree, history: History) -> Self {
        Self {
            replica,
            tree,
            history,
            pending: Pending::default(),
            right_origin: (NONE, None),
            local: NONE,
            delete_hint: 0,
            placed: (NONE, NONE, NONE),
        }
    }

    /// A copy of this document, edited from now on as `replica`: how a new
    /// participant joins (the copy can also come from the codec).
    ///
    /// `replica` must differ from every other live replica's.
    pub fn fork(&self, replica: ReplicaId) -> Self {
        let mut copy = self.clone();
        copy.replica = OnceLock::from(replica);
        copy
    }

    /// The replica local edits are made as. A document made without one
    /// ([`Default`], or decoded from bytes) draws a random id
    /// ([`ReplicaId::random`]) the first time it needs one, and keeps it.
    pub fn replica(&self) -> ReplicaId {
        *self.replica.get_or_init(ReplicaId::random)
    }

    /// Number of characters (Unicode scalar values).
    pub fn len(&self) -> usize {
        self.tree.metrics().chars
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Length in UTF-8 bytes.
    pub fn len_utf8(&self) -> usize {
        self.tree.metrics().bytes
    }

    /// Length in UTF-16 code units.
    pub fn len_utf16(&self) -> usize {
        self.tree.metrics().utf16
    }

    /// Inserts `text` at character position `pos` (in Unicode scalar
    /// values, `0 ..= len()`), and returns the op for the other replicas.
    ///
    /// An empty `text` changes nothing and returns an empty op.
    ///
    /// # Errors
    ///
    /// [`TextError::PositionOutOfBounds`] if `pos > len()`;
    /// [`TextError::TooLarge`] if the document would pass
    /// [`MAX_CHARS`](super::MAX_CHARS) inserted characters;
    /// [`TextError::CountersExhausted`] if this replica would pass
    /// [`MAX_COUNTER`](super::MAX_COUNTER) events. The text is unchanged.
    ///
    /// # Performance
    ///
    /// O(log n), and O(1) plus the text copy when typing on where the last
    /// edit was.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::text::{Text, TextError};
    ///
    /// let mut t = Text::new(ReplicaId::new(1));
    /// t.insert(0, "ab")?;
    /// t.insert(1, "😀")?; // one character
    /// assert_eq!(t.to_string(), "a😀b");
    /// assert_eq!(t.insert(4, "x"), Err(TextError::PositionOutOfBounds { pos: 4, len: 3 }));
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn insert(&mut self, pos: usize, text: &str) -> Result<TextOp, TextError> {
        let len = self.len();
        if pos > len {
            return Err(TextError::PositionOutOfBounds { pos, len });
        }
        let n = char_len(text);
        let counter = self.next_counter(n)?;
        self.check_room(n)?;
        let (mut origin_left, mut origin_right) = (None, None);
        if n > 0 {
            let (left, right) = self.insert_at(pos, text, n, counter);
            origin_left = self.dot_of(left);
            if self.right_origin.0 != right {
                self.right_origin = (right, self.dot_of(right));
            }
            origin_right = self.right_origin.1;
        }
        // Built in one expression, where it is returned: a copy of a value
        // just written in small pieces stalls on reading them back.
        Ok(TextOp {
            id: Dot::new(self.replica(), counter),
            kind: OpKind::Insert(Insertion {
                origin_left,
                origin_right,
                len: n as u32,
                text: Content::from(text),
                hidden: Vec::new(),
            }),
        })
    }

    /// Deletes the characters in `range` (character positions, Unicode
    /// scalar values), and returns the op for the other replicas.
    ///
    /// An empty range changes nothing and returns an empty op.
    ///
    /// # Errors
    ///
    /// [`TextError::RangeOutOfBounds`] if the range ends past `len()` or
    /// starts after it ends; [`TextError::CountersExhausted`] if this
    /// replica would pass [`MAX_COUNTER`](super::MAX_COUNTER) events. The
    /// text is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::text::{Text, TextError};
    ///
    /// let mut t = Text::new(ReplicaId::new(1));
    /// t.insert(0, "héllo")?;
    /// t.delete(1..2)?;
    /// assert_eq!(t.to_string(), "hllo");
    /// assert!(matches!(t.delete(2..9), Err(TextError::RangeOutOfBounds { .. })));
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn delete(&mut self, range: Range<usize>) -> Result<TextOp, TextError> {
        self.check_range(&range)?;
        let counter = self.next_counter(range.len())?;
        let mut targets = Targets::default();
        self.delete_at(range, counter, Some(&mut targets));
        Ok(TextOp {
            id: Dot::new(self.replica(), counter),
            kind: OpKind::Delete(targets),
        })
    }

    /// Replaces the characters in `range` with `text` (a delete, then an
    /// insert at `range.start`) without building the ops for them: the
    /// local editing path for replicas that share edits as deltas or
    /// states, or later as [`ops_since`](Text::ops_since), rather than op
    /// by op. The document, its history and what peers later receive are
    /// exactly as after [`delete`](Text::delete) and then
    /// [`insert`](Text::insert); only the returned ops are skipped, with
    /// the id lookups that build them.
    ///
    /// # Errors
    ///
    /// [`TextError::RangeOutOfBounds`], [`TextError::TooLarge`] or
    /// [`TextError::CountersExhausted`], as `delete` and `insert` return
    /// them, checked for both before either is made: on an error the text
    /// is unchanged.
    ///
    /// # Performance
    ///
    /// As `delete` then `insert`, less building the ops and the id lookups
    /// they need: O(log n), and for the insert O(1) plus the text copy when
    /// typing on where the last edit was, as for `insert`.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::{ReplicaId, VersionVector};
    /// use calm::text::{Text, TextError};
    ///
    /// let mut a = Text::new(ReplicaId::new(1));
    /// a.replace(0..0, "hello world")?;
    /// a.replace(6..11, "there")?;
    /// assert_eq!(a.to_string(), "hello there");
    /// assert!(matches!(a.replace(6..99, "x"), Err(TextError::RangeOutOfBounds { .. })));
    ///
    /// // A peer catches up from the history, op by op.
    /// let mut b = Text::new(ReplicaId::new(2));
    /// for op in a.ops_since(&VersionVector::new()) {
    ///     b.apply(&op)?;
    /// }
    /// assert_eq!(b.to_string(), "hello there");
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn replace(&mut self, range: Range<usize>, text: &str) -> Result<(), TextError> {
        self.check_range(&range)?;
        let n = char_len(text);
        let counter = self.next_counter(range.len().saturating_add(n))?;
        self.check_room(n)?;
        let pos = range.start;
        let inserted = counter + range.len() as u64;
        // Most edits only type: no call for an empty deletion.
        if !range.is_empty() {
            self.delete_at(range, counter, None);
        }
        if n > 0 {
            self.insert_at(pos, text, n, inserted);
        }
        Ok(())
    }

    /// Refuses a range that starts after it ends or ends past `len()`.
    fn check_range(&self, range: &Range<usize>) -> Result<(), TextError> {
        let len = self.len();
        if range.start > range.end || range.end > len {
            return Err(TextError::RangeOutOfBounds {
                start: range.start,
                end: range.end,
                len,
            });
        }
        Ok(())
    }

    /// Refuses `n` more inserted characters past [`MAX_CHARS`].
    fn check_room(&self, n: usize) -> Result<(), TextError> {
        if u64::from(self.history.items) + n as u64 > MAX_CHARS {
            return Err(TextError::TooLarge { max: MAX_CHARS });
        }
        Ok(())
    }

    /// Inserts `text` (`n > 0` characters) at `pos` as this replica's
    /// events from `counter`, checked by the caller; returns the new
    /// text's neighbours (its origins), as local versions.
    #[inline]
    fn insert_at(&mut self, pos: usize, text: &str, n: usize, counter: u64) -> (u32, u32) {
        let agent = self.local_agent();
        let at = self.tree.insert_point(pos);
        let (left, right) = self.tree.neighbors(at);
        let lv = self
            .history
            .push_insert(agent, counter, n as u32, left, right);
        self.tree.insert(at, Run::new(lv, n as u32, false), text);
        (left, right)
    }

    /// Deletes the characters in `range` (checked by the caller) as this
    /// replica's events from `counter`, adding their ids to `targets` when
    /// an op is wanted.
    fn delete_at(&mut self, range: Range<usize>, counter: u64, mut targets: Option<&mut Targets>) {
        if range.is_empty() {
            return;
        }
        let agent = self.local_agent();
        let history = &mut self.history;
        let hint = &mut self.delete_hint;
        let mut c = counter;
        self.tree.delete_chars(range.start, range.len(), |lv, n| {
            history.push_delete(agent, c, lv, n, false);
            c += u64::from(n);
            if let Some(targets) = targets.as_deref_mut() {
                push_targets(history, hint, targets, lv, n, false);
            }
        });
    }

    /// The counter of this replica's next event, if `n` more events stay
    /// within [`MAX_COUNTER`].
    fn next_counter(&self, n: usize) -> Result<u64, TextError> {
        let known = match self.history.agents.get(self.local as usize) {
            Some(a) if a.id == self.replica() => a.known,
            _ => self.history.known(self.replica()),
        };
        if known.saturating_add(n as u64) > MAX_COUNTER {
            return Err(TextError::CountersExhausted { max: MAX_COUNTER });
        }
        Ok(known + 1)
    }

    /// This replica's agent index, adding it to the history if new.
    fn local_agent(&mut self) -> u32 {
        match self.history.agents.get(self.local as usize) {
            Some(a) if a.id == self.replica() => self.local,
            _ => {
                self.local = self.history.intern(self.replica());
                self.local
            }
        }
    }

    /// The id of the item `lv`, or `None` for [`NONE`].
    pub(crate) fn dot_of(&self, lv: u32) -> Option<Dot> {
        (lv != NONE).then(|| {
            let (r, c) = self.history.id_of(lv);
            Dot::new(r, c)
        })
    }

    /// The text, one chunk (a few hundred bytes to a few KiB) at a time, in
    /// order. Concatenated they are [`to_string`](ToString::to_string).
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::text::Text;
    ///
    /// let mut t = Text::new(ReplicaId::new(1));
    /// t.insert(0, "abc")?;
    /// assert_eq!(t.chunks().collect::<String>(), "abc");
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn chunks(&self) -> Chunks<'_> {
        Chunks {
            tree: &self.tree,
            at: 0,
        }
    }

    /// Converts a UTF-16 offset to a character position.
    ///
    /// # Errors
    ///
    /// [`TextError::PositionOutOfBounds`] past the end,
    /// [`TextError::NotCharBoundary`] between the two halves of a surrogate
    /// pair.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::text::Text;
    ///
    /// let mut t = Text::new(ReplicaId::new(1));
    /// t.insert(0, "a😀b")?;
    /// assert_eq!(t.utf16_to_chars(3)?, 2); // after the emoji
    /// assert_eq!(t.chars_to_utf16(2)?, 3);
    /// assert!(t.utf16_to_chars(2).is_err()); // inside it
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn utf16_to_chars(&self, utf16: usize) -> Result<usize, TextError> {
        self.unit_to_chars(utf16, |m| m.utf16, char::len_utf16)
    }

    /// Converts a character position (`0 ..= len()`) to a UTF-16 offset.
    ///
    /// # Errors
    ///
    /// [`TextError::PositionOutOfBounds`] if `chars > len()`.
    pub fn chars_to_utf16(&self, chars: usize) -> Result<usize, TextError> {
        self.chars_to_unit(chars, |m| m.utf16, char::len_utf16)
    }

    /// Converts a UTF-8 byte offset to a character position.
    ///
    /// # Errors
    ///
    /// [`TextError::PositionOutOfBounds`] past the end,
    /// [`TextError::NotCharBoundary`] inside a multi-byte character.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::text::Text;
    ///
    /// let mut t = Text::new(ReplicaId::new(1));
    /// t.insert(0, "日本")?;
    /// assert_eq!(t.utf8_to_chars(3)?, 1);
    /// assert_eq!(t.chars_to_utf8(2)?, 6);
    /// assert!(t.utf8_to_chars(4).is_err());
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn utf8_to_chars(&self, byte: usize) -> Result<usize, TextError> {
        self.unit_to_chars(byte, |m| m.bytes, char::len_utf8)
    }

    /// Converts a character position (`0 ..= len()`) to a UTF-8 byte
    /// offset.
    ///
    /// # Errors
    ///
    /// [`TextError::PositionOutOfBounds`] if `chars > len()`.
    pub fn chars_to_utf8(&self, chars: usize) -> Result<usize, TextError> {
        self.chars_to_unit(chars, |m| m.bytes, char::len_utf8)
    }

    fn unit_to_chars(
        &self,
        offset: usize,
        unit: fn(&Metrics) -> usize,
        width: fn(char) -> usize,
    ) -> Result<usize, TextError> {
        let len = unit(&self.tree.metrics());
        if offset > len {
            return Err(TextError::PositionOutOfBounds { pos: offset, len });
        }
        self.tree
            .unit_to_chars(offset, unit, width)
            .map_err(|()| TextError::NotCharBoundary { offset })
    }

    fn chars_to_unit(
        &self,
        chars: usize,
        unit: fn(&Metrics) -> usize,
        width: fn(char) -> usize,
    ) -> Result<usize, TextError> {
        let len = self.len();
        if chars > len {
            return Err(TextError::PositionOutOfBounds { pos: chars, len });
        }
        Ok(self.tree.chars_to_unit(chars, unit, width))
    }

    /// The items in document order as `(replica, first counter, count,
    /// deleted)`, joined across runs and leaves: the part of the state that
    /// equality compares besides the text and the version vector.
    fn id_runs(&self) -> Vec<(ReplicaId, u64, u32, bool)> {
        let mut out: Vec<(ReplicaId, u64, u32, bool)> = Vec::new();
        for leaf in self.tree.leaves() {
            for run in &leaf.runs {
                self.history.pieces(&mut 0, run.lv, run.len(), |e, lv, k| {
                    let entry = &self.history.inserts[e];
                    let id = self.history.agents[entry.agent as usize].id;
                    let c = entry.counter() + u64::from(lv - self.history.lvs[e]);
                    match out.last_mut() {
                        Some(last)
                            if last.0 == id
                                && last.1 + u64::from(last.2) == c
                                && last.3 == run.deleted() =>
                        {
                            last.2 += k;
                        }
                        _ => out.push((id, c, k, run.deleted())),
                    }
                });
            }
        }
        out
    }

    /// Checks every internal invariant, panicking with a description of the
    /// first one broken. Tests call it after each step; it costs O(n log n).
    ///
    /// # Panics
    ///
    /// If the document is corrupted, which would be a bug in calm.
    pub fn assert_invariants(&self) {
        self.tree.assert_invariants();
        let h = &self.history;
        assert!(
            h.lvs.len() == h.inserts.len() && h.lvs.windows(2).all(|w| w[0] < w[1]),
            "insert log order"
        );
        assert_eq!(h.lvs.first().copied().unwrap_or(0), 0, "insert log start");
        let items: u64 = self
            .tree
            .leaves()
            .flat_map(|l| l.runs.iter())
            .map(|r| u64::from(r.len()))
            .sum();
        assert_eq!(items, u64::from(h.items), "every item in the tree");
        for (a, agent) in h.agents.iter().enumerate() {
            let mut events: Vec<(u64, u64)> = h
                .entries_of(a)
                .iter()
                .map(|e| {
                    let c = h.inserts[e].counter();
                    (c, c + u64::from(h.entry_len(e)))
                })
                .chain(
                    agent
                        .deletes
                        .iter()
                        .map(|d| (d.counter(), d.counter() + u64::from(d.len()))),
                )
                .collect();
            events.sort_unstable();
            let mut next = 1;
            for (s, e) in events {
                assert_eq!(s, next, "events of {:?} not contiguous", agent.id);
                next = e;
            }
            assert_eq!(next - 1, agent.known, "known count of {:?}", agent.id);
        }
        for d in h.agents.iter().flat_map(|a| &a.deletes) {
            for lv in [d.target, d.target + d.len() - 1] {
                let pos = self.tree.locate(lv).expect("delete target in tree");
                let run = self.tree.run_at(pos).expect("run at target");
                assert!(run.deleted(), "deleted item {lv} is visible");
            }
        }
        self.pending.assert_invariants(|r| h.known(r));
    }
}

impl PartialEq for Text {
    /// Equal when both hold the same edits: same version vector, same items
    /// in the same order with the same deletions, same text, same buffered
    /// ops. The replica ids of the two copies do not matter.
    fn eq(&self, other: &Self) -> bool {
        self.tree.metrics() == other.tree.metrics()
            && self.history.known_versions() == other.history.known_versions()
            && self.pending == other.pending
            && self
                .chunks()
                .flat_map(str::chars)
                .eq(other.chunks().flat_map(str::chars))
            && self.id_runs() == other.id_runs()
    }
}

impl Eq for Text {}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.chunks() {
            f.write_str(chunk)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self
            .id_runs()
            .iter()
            .map(|(r, c, k, d)| format!("{}{:?}.{}+{}", if *d { "x" } else { "" }, r, c, k))
            .collect();
        let version: Vec<(ReplicaId, u64)> = self
            .history
            .agents
            .iter()
            .map(|a| (a.id, a.known))
            .collect();
        f.debug_struct("Text")
            .field("replica", &self.replica.get())
            .field("text", &self.to_string())
            .field("version", &version)
            .field("items", &items)
            .field("pending", &self.pending)
            .finish()
    }
}

/// The text of a [`Text`] in chunks, from [`Text::chunks`].
#[derive(Clone, Debug)]
pub struct Chunks<'a> {
    tree: &'a Tree,
    /// The next leaf to yield, or [`NONE`].
    at: u32,
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        while self.at != NONE {
            let leaf = self.tree.leaf(self.at);
            self.at = leaf.next;
            if !leaf.text.is_empty() {
                return Some(&leaf.text);
            }
        }
        None
    }
}
