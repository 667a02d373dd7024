//! Collaborative plain text: [`Text`], a sequence CRDT that never
//! interleaves concurrent typing.
//!
//! Several people edit one document at once, each on their own replica,
//! offline or online. Each edit is made locally at once and sent as a
//! [`TextOp`] (or batched into a delta, or as the whole state); every
//! replica that has received the same edits shows the same text, whatever
//! the order, delays or repeats of delivery.
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::text::Text;
//! use calm::Merge;
//!
//! let mut alice = Text::new(ReplicaId::new(1));
//! alice.insert(0, "ab")?;
//! let mut bob = alice.fork(ReplicaId::new(2));
//!
//! // Both type between `a` and `b` at the same time.
//! let x = alice.insert(1, "xy")?;
//! let one = bob.insert(1, "12")?;
//! alice.apply(&one)?;
//! bob.apply(&x)?;
//!
//! // Each run stays in one piece; the order is the same everywhere.
//! assert_eq!(alice.to_string(), "axy12b");
//! assert_eq!(alice, bob);
//! # Ok::<(), calm::Error>(())
//! ```
//!
//! # The model
//!
//! Every character ever inserted is an *item* with a global id (its
//! replica and a counter, a [`Dot`](crate::causal::Dot)) and two
//! *origins*, fixed when it was typed: on the left the visible character
//! before the cursor (or the start), on the right the item right after
//! that one, deleted or not (or the end). Text typed where deleted text
//! sits therefore goes before the tombstones, as in diamond-types, Yjs and
//! Fugue, and a history made by any of them orders the same here (checked
//! against diamond-types by the `calm-reference` crate's test). Deleting a character marks its item deleted (a tombstone) but
//! keeps it, so later edits that name it still find their place. Positions
//! given to [`Text::insert`] and [`Text::delete`] are character positions
//! (Unicode scalar values) in the visible text; see [`Text`] for UTF-8 and
//! UTF-16 conversions.
//!
//! # The ordering rule: FugueMax, as YjsMod
//!
//! When two replicas insert at the same place concurrently, both items have
//! the same origins and something must choose their order. Older sequence
//! CRDTs (RGA, Logoot, Treedoc) can *interleave* the characters of two
//! concurrent runs of typing ("hello" and "world" merging as "hweolrllod"),
//! or do so when typing backwards. calm uses the rule of Weidner and
//! Kleppmann's FugueMax ("The Art of the Fugue: Minimizing Interleaving in
//! Collaborative Text Editing", 2023), written as Joseph Gentle's YjsMod
//! integration (a small change to Yjs's rule, used by diamond-types), which
//! the Fugue paper shows orders items the same way. It is *maximally
//! non-interleaving*: concurrent runs typed forward or backward at one place
//! each stay contiguous.
//!
//! Why this one: it needs only the two origins per item, which run-length
//! encode perfectly for ordinary typing (a burst of typing shares one right
//! origin, and each left origin is the previous character), so the rule
//! costs nothing extra in memory; conflicts are resolved by a scan that only
//! runs when concurrent inserts actually meet at one place; and it is the
//! rule diamond-types and Yjs users already know, with a proof of its
//! non-interleaving behind it.
//!
//! The rule, as [`Text::apply`] places a new item `n` with origins `L` and
//! `R`: scan the items after `L`. For each item `o`:
//!
//! | `o`'s left origin | `o`'s right origin | then |
//! | --- | --- | --- |
//! | before `L` | any | stop: insert `n` at the scan's mark |
//! | `L` (a sibling) | before `R` | scan on; keep the mark before `o` |
//! | `L` | `R` (true conflict) | lower replica id first: stop if `n`'s is lower, else move the mark past `o` |
//! | `L` | after `R` | move the mark past `o` |
//! | after `L` (inside the scan) | any | `o` descends from a scanned item: skip it |
//!
//! and stop at `R` at the latest.
//!
//! ## Worked example
//!
//! Alice (replica 1) typed `ab`; then, concurrently, Alice types `xy` and
//! Bob (replica 2) types `12` between `a` and `b`:
//!
//! ```text
//!  item  id    left origin  right origin
//!  a     r1.1  (start)      (end)
//!  b     r1.2  a            (end)
//!  x     r1.3  a            b
//!  y     r1.4  x            b         \ one run: r1.3..=r1.4,
//!  1     r2.1  a            b           stored as one entry
//!  2     r2.2  1            b
//! ```
//!
//! As a tree (each item hangs under its left origin, siblings in rule
//! order), the text is the depth-first walk:
//!
//! ```text
//!  start ── a ─┬─ x ── y      (r1 < r2: Alice's run first)
//!              ├─ 1 ── 2
//!              └─ b
//! ```
//!
//! Bob integrating `x`: after `a` comes `1`: same left origin `a`, same
//! right origin `b`, and `r1 < r2`, so stop: `a x 1 2 b`. Then `y` (left
//! origin `x`) goes right after `x`: `a x y 1 2 b`. Alice integrating `1`:
//! after `a` comes `x`, a true conflict that `1` loses (`r2 > r1`), so the
//! mark moves past `x`; `y` descends from `x` and is skipped; `b` is the
//! right origin: stop, `a x y 1 b`, then `2` after `1`. Both read `axy12b`.
//!
//! Typing *backwards* (each character typed before the previous one, the
//! cursor staying put) gives items whose right origin is the previous
//! character. Alice types `c`, `b`, `a` and Bob `3`, `2`, `1`, all between
//! `[` and `]`:
//!
//! ```text
//!  item  left origin  right origin      item  left origin  right origin
//!  c     [            ]                 3     [            ]
//!  b     [            c                 2     [            3
//!  a     [            b                 1     [            2
//! ```
//!
//! Alice integrating `3` scans `a` and `b` (siblings whose right origins
//! lie before `]`: keep scanning, mark stays), then `c`, a true conflict
//! `3` loses, so the mark moves past `c`: `[abc3]`. `2` scans `a`, `b`
//! (right origins before `3`: scanning) and `c` (right origin `]`, after
//! `3`: the mark moves past it), then meets `3`, its right origin:
//! `[abc23]`, and `1` likewise: `[abc123]`. Both runs stay whole.
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::text::Text;
//!
//! let mut alice = Text::new(ReplicaId::new(1));
//! alice.insert(0, "[]")?;
//! let mut bob = alice.fork(ReplicaId::new(2));
//! let mut ops = Vec::new();
//! for c in ["c", "b", "a"] {
//!     ops.push(alice.insert(1, c)?);
//! }
//! for c in ["3", "2", "1"] {
//!     ops.push(bob.insert(1, c)?);
//! }
//! for op in &ops {
//!     alice.apply(op)?;
//!     bob.apply(op)?;
//! }
//! assert_eq!(alice.to_string(), "[abc123]");
//! assert_eq!(alice, bob);
//! # Ok::<(), calm::Error>(())
//! ```
//!
//! Scanning `a` and `b` one by one for each of Bob's keystrokes would make
//! merging two runs of n characters typed backward at one place quadratic
//! (diamond-types is, there). But `a`, `b`, `c` form a *chain*: each names
//! the next as its right origin and all share their left origin, and
//! everything from a chain link up to its right origin is skipped while
//! scanning. So the scan jumps straight to the chain's last link before
//! its own right origin: the chain's end (found once, then kept), or,
//! when the right origin lies inside the chain (the users synced mid-run),
//! the link reached by binary lifting (jumps of 2^k links, kept). Two users
//! typing n characters backward at one place merge in O(n log n).
//!
//! Two more shortcuts keep other shapes near-linear:
//!
//! - A keystroke typed right before the remote insertion integrated just
//!   before it (same left origin, that insertion as right origin: backward
//!   typing) goes right before it without a scan: its scan would pass the
//!   same items and reach it with nothing scanned to go back to. u users
//!   typing backward at one place, each history merged in turn, cost one
//!   scan per user, not one per keystroke.
//! - Characters form a tree (each a child of its left origin), and the
//!   document is a pre-order walk of it, since an item is only ever placed
//!   right after its left origin or after whole subtrees of that origin's
//!   other children. So a concurrent sibling's descendants are the items
//!   after it that are deeper than it, up to the first that is not: the
//!   scan passes them in one search over the leaves
//!   (each keeps a lower bound of its items' depths) instead of item by
//!   item. The depths are computed on that first search and kept (4 bytes
//!   per character), so a search reads a short run's depths directly,
//!   with no search for the entries its characters belong to.
//!
//! The bench's concurrent scenarios (the B1–B3 family of dmonad's
//! crdt-benchmarks, at n and 4n) show the growth beside diamond-types.
//!
//! # Sync
//!
//! - **Ops**: [`Text::insert`] and [`Text::delete`] return a [`TextOp`];
//!   [`Text::apply`] integrates one, buffers it if it arrived before what
//!   it builds on ([`Applied::Buffered`]), ignores a repeat.
//! - **Deltas** ([`DeltaMerge`](crate::DeltaMerge)): send your version
//!   vector, get back the ops you lack, [`merge`](crate::Merge::merge) them.
//! - **States** ([`Merge`](crate::Merge)): merge a whole other replica.
//! - **Bytes**: [`codec`](crate::codec) encodes ops, deltas and documents;
//!   decoding checks everything and answers garbage with a
//!   [`DecodeError`](crate::codec::DecodeError). A document is written as
//!   its own structures and loaded without integrating anything, so the
//!   decoder checks every rule they rely on, but not that concurrent
//!   insertions sit in the order the rule would give them (that takes
//!   integrating them): take whole documents from peers you trust to run
//!   calm, and ops or deltas, which are always integrated, from others.
//!
//! # Inside
//!
//! No object per character. The document is a B-tree of *runs*
//! (consecutive items with consecutive local numbers, all visible or all
//! deleted, 8 bytes each) whose leaves also hold the visible text, indexed
//! by character count (and UTF-8 and UTF-16 length) for positions, with an
//! index from item numbers to leaves for remote ops and a cursor cache for
//! the last local edit. Ids and origins live in a separate run-length
//! encoded log. The files, each with a long comment on its structure:
//! `leaf.rs` (runs and leaves), `tree.rs` (the B-tree, index and cursor),
//! `index.rs` (the index's map, in 16-bit leaf numbers while they fit),
//! `balance.rs` (splits, metrics and index upkeep),
//! `history.rs` (ids, origins and deletions), `integrate.rs` (the rule,
//! buffering, merge), `encoding.rs` (ops as bytes, and documents of
//! format version 1), `snapshot.rs` (documents as bytes), `columns.rs`
//! (their numbers in Huffman-coded columns).
//!
//! # Performance
//!
//! Measured side by side by `cargo run -p calm-bench --release -- text` on
//! the five editing traces in `tests/data/traces` (2-core VM, one run; the
//! tables and plots are in `BENCHMARKS.md`, regenerated by the bench
//! crate's `report` command):
//!
//! - local editing with [`Text::replace`] (the history peers sync from,
//!   no op built) costs 0.74–0.92× what diamond-types costs
//!   (`automerge-paper`, 260k patches, in about 12 ms); with
//!   [`Text::insert`] and [`Text::delete`] returning each edit's op,
//!   0.89–1.22×; about 8× (loro) to over 100× (yrs, automerge) faster
//!   than the other CRDTs; 1.4–1.9× a plain rope (jumprope). Text that is
//!   not ASCII costs more where edits jump about (a leaf counts characters
//!   to byte offsets, 32 bytes at a time, from the nearest of its ends
//!   and where its last edit was): with letters as CJK characters
//!   (`-- text cjk`), 0.74–0.94×, the code-editing `sveltecomponent`
//!   closest;
//! - a replica keeps 0.29–0.44× the heap of diamond-types (0.31–0.49×
//!   once a remote op has built the index from local versions to leaves)
//!   and 0.14–0.32× that of cola, loro and yrs;
//! - loading a document is a linear scan that integrates nothing
//!   (`snapshot.rs`): 0.83–0.96× diamond-types, faster than cola, loro,
//!   yrs and automerge; a blank replica merging a whole history by value
//!   ([`Merge::merge_owned`](crate::Merge::merge_owned)) loads it and
//!   moves it in (0.78–0.98×; 1.09–1.17× for a short history of appended
//!   random letters, which diamond-types copies as they are); encoding
//!   costs 1.02–1.23×;
//! - the encoding is 0.69–0.91× diamond-types' size, smaller than yrs',
//!   loro's, cola's and automerge's.

mod balance;
mod columns;
mod document;
mod encoding;
mod error;
mod history;
mod index;
mod integrate;
mod leaf;
mod op;
mod pending;
mod snapshot;
mod tree;

pub use document::{Chunks, Text};
pub use error::TextError;
pub use integrate::Applied;
pub use op::TextOp;

/// The most characters a [`Text`] can ever hold, counting deleted ones
/// (2^31 - 1). Local versions and run lengths fit in 31 bits, which keeps
/// a run at 8 bytes.
pub const MAX_CHARS: u64 = (1 << 31) - 1;

/// The highest event counter of a replica in one [`Text`] (2^32 - 1):
/// each inserted character and each deleted one takes a counter, and a
/// replica inserts at most [`MAX_CHARS`] characters and deletes each at
/// most once, so no replica gets there by its own edits. An op past it is
/// invalid, and the logs keep counters in 32 bits.
pub const MAX_COUNTER: u64 = u32::MAX as u64;

/// [`MAX_CHARS`] as the local-version type.
pub(crate) const MAX_ITEMS: u32 = MAX_CHARS as u32;

/// Makes room for `extra` more elements in `v`: when it lacks room it
/// grows by `extra` and an eighth of its length (at least `min_step`)
/// rather than doubling. A document keeps its leaves and logs for its
/// whole life, and the slack doubling leaves (a quarter of the memory on
/// average, up to a half) costs more than the few more copies (a growing
/// log is copied about eight times its final size in all; the local
/// replays of the shared traces took the same time within 2% as with a
/// quarter, and kept 2-5% less memory).
pub(crate) fn reserve_lean<T>(v: &mut Vec<T>, extra: usize, min_step: usize) {
    if v.capacity() - v.len() < extra {
        v.reserve_exact(extra + (v.len() / 8).max(min_step));
    }
}

/// "No item": the document start as a left origin, its end as a right
/// origin, the end of a leaf chain or the parent of the root.
pub(crate) const NONE: u32 = u32::MAX;
