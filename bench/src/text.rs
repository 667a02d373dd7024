//! calm's `Text` against the Rust text CRDTs (diamond-types, cola, yrs,
//! loro, automerge) and two ropes (jumprope, ropey) on the editing traces
//! in `tests/data/traces`.
//!
//! For every sequential trace:
//!
//! - **local replay**: apply every patch to a fresh document through the
//!   library's local editing API (calm: `Text::replace`, which records the
//!   edit in the history peers sync from but builds no op, as
//!   diamond-types' `insert` and `delete_without_content` build none; yrs:
//!   one transaction per patch; loro and automerge: their auto-committing
//!   APIs; the ropes: plain text, no CRDT metadata, which is the limit);
//!   against diamond-types also calm's `delete` and `insert`, each
//!   returning the op a live peer is sent (**local replay, each edit
//!   returning its op**);
//! - **merge**: a replica with nothing catches up with the replayed
//!   replica's whole history, received as that library's update bytes
//!   (calm: a delta against an empty version vector, decoded and merged
//!   by value with `merge_owned`; cola: its in-memory insertion and
//!   deletion ops, which carry no text);
//! - **encode**, **load** and **encoded size** of the whole document;
//! - **peak heap** during the replay and **kept heap** after it, from a
//!   counting global allocator; against diamond-types also the kept heap
//!   once the replayed document has integrated one insert from another
//!   replica (calm builds its index from local versions to leaves, which
//!   only remote ops use, at the first one).
//!
//! Then the concurrent trace (`concurrent.rs`): a fresh replica merging
//! two users' concurrent history, calm against diamond-types.
//!
//! Each side's final text is checked against the trace's `endContent`
//! (cola keeps no text, so its length is checked) before anything is
//! timed. Times are medians of 5 alternating rounds (see `harness.rs`).

use std::io::Read;
use std::path::Path;

use calm::causal::{ReplicaId, VersionVector};
use calm::text::Text;
use calm::{DeltaMerge, Merge, codec};

use crate::alloc::measure;
use crate::harness::{Figure, Row, Side, compare_rounds};

/// Rounds per side for every timing.
const ROUNDS: usize = 5;

/// One patch, with positions in characters and in UTF-8 bytes (for yrs).
pub struct Patch {
    pos: usize,
    del: usize,
    ins: String,
    ins_chars: usize,
    pos8: usize,
    del8: usize,
}

/// A sequential trace, ready to replay.
pub struct Trace {
    pub(crate) name: String,
    pub(crate) patches: Vec<Patch>,
    pub(crate) end: String,
}

/// The filter that replays every trace with its ASCII letters as CJK
/// characters (three bytes each in UTF-8): text that is not ASCII.
const CJK: &str = "cjk";

/// The filter that runs the synthetic traces (`synthetic.rs`) instead,
/// against diamond-types and jumprope.
const SYNTHETIC: &str = "synthetic";

/// `s` with each ASCII letter mapped to a CJK character.
fn letters_as_cjk(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphabetic() {
                char::from_u32(0x4E00 + c as u32).unwrap_or(c)
            } else {
                c
            }
        })
        .collect()
}

/// Reads every sequential trace (and converts positions to bytes by
/// replaying on a rope, untimed); with the filter [`CJK`], every trace
/// with its letters as CJK characters.
fn traces(filter: Option<&str>) -> Vec<Trace> {
    let cjk = filter == Some(CJK);
    let filter = filter.filter(|_| !cjk);
    let text = |s: &str| if cjk { letters_as_cjk(s) } else { s.to_owned() };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/traces");
    let mut files = Vec::new();
    for sub in ["sequential", "sequential/ascii_only"] {
        for e in std::fs::read_dir(dir.join(sub)).expect("trace folder") {
            let p = e.expect("entry").path();
            if p.to_string_lossy().ends_with(".json.gz") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let name = path
                .strip_prefix(&dir)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace("sequential/", "")
                .replace(".json.gz", "")
                + if cjk { " (letters as CJK)" } else { "" };
            if filter.is_some_and(|f| !name.contains(f)) {
                return None;
            }
            let v = read_trace(&path);
            let edits = v["txns"]
                .as_array()
                .expect("txns")
                .iter()
                .flat_map(|txn| txn["patches"].as_array().expect("patches"))
                .map(|p| {
                    let pos = p[0].as_u64().expect("pos") as usize;
                    let del = p[1].as_u64().expect("del") as usize;
                    (pos, del, text(p[2].as_str().expect("ins")))
                });
            let trace = Trace::new(name, edits);
            let end = text(v["endContent"].as_str().expect("endContent"));
            assert_eq!(trace.end, end, "{}: trace does not replay", trace.name);
            Some(trace)
        })
        .collect()
}

impl Trace {
    /// The trace of `edits` (position and deletion length in characters,
    /// inserted text) from an empty document; replays them on a rope,
    /// untimed, for their byte positions and the final text.
    pub(crate) fn new(
        name: String,
        edits: impl IntoIterator<Item = (usize, usize, String)>,
    ) -> Self {
        let mut rope = ropey::Rope::new();
        let mut patches = Vec::new();
        for (pos, del, ins) in edits {
            let pos8 = rope.char_to_byte(pos);
            let del8 = rope.char_to_byte(pos + del) - pos8;
            rope.remove(pos..pos + del);
            rope.insert(pos, &ins);
            patches.push(Patch {
                pos,
                del,
                ins_chars: ins.chars().count(),
                ins,
                pos8,
                del8,
            });
        }
        let end = rope.to_string();
        Self { name, patches, end }
    }
}

/// The JSON of the gzip-compressed trace at `path`.
pub(crate) fn read_trace(path: &Path) -> serde_json::Value {
    let gz = std::fs::read(path).expect("trace");
    let mut json = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut json)
        .expect("gzip");
    serde_json::from_str(&json).expect("json")
}

/// A library under test.
trait Subject {
    /// Its name in the tables.
    const NAME: &'static str;
    /// A replica.
    type Doc;
    /// Replays a trace through the local editing API.
    fn replay(t: &Trace) -> Self::Doc;
    /// Checks the document reads the trace's final text.
    fn check(doc: &Self::Doc, t: &Trace);
}

/// A CRDT: it can also encode, load, and catch up with a remote history.
trait Crdt: Subject {
    /// What a replica with nothing receives to catch up.
    type History;
    /// The whole document as bytes.
    fn encode(doc: &Self::Doc) -> Vec<u8>;
    /// A document from [`Crdt::encode`]'s bytes.
    fn load(bytes: &[u8]) -> Self::Doc;
    /// The remote's whole history, as sent to a replica with nothing.
    fn history(doc: &Self::Doc, t: &Trace) -> Self::History;
    /// A fresh replica catching up with `history`.
    fn merge(history: &Self::History) -> Self::Doc;
}

/// A CRDT whose replicas can take one edit from another.
trait Remote: Crdt {
    /// A second replica holding all of `doc` inserts one character in its
    /// middle, and `doc` integrates that insert.
    fn remote_insert(doc: &mut Self::Doc);
    /// The document's length in characters.
    fn chars(doc: &Self::Doc) -> usize;
}

struct Calm;

impl Subject for Calm {
    const NAME: &'static str = "calm";
    type Doc = Text;
    fn replay(t: &Trace) -> Text {
        let mut doc = Text::new(ReplicaId::new(1));
        for p in &t.patches {
            doc.replace(p.pos..p.pos + p.del, &p.ins).expect("in range");
        }
        doc
    }
    fn check(doc: &Text, t: &Trace) {
        assert!(doc.to_string() == t.end, "calm: {} replayed wrong", t.name);
    }
}

impl Calm {
    /// [`Subject::replay`] through `delete` and `insert`, each returning
    /// the op a live peer would be sent (dropped here).
    fn replay_with_ops(t: &Trace) -> Text {
        let mut doc = Text::new(ReplicaId::new(1));
        for p in &t.patches {
            if p.del > 0 {
                let _ = doc.delete(p.pos..p.pos + p.del).expect("in range");
            }
            if !p.ins.is_empty() {
                let _ = doc.insert(p.pos, &p.ins).expect("in range");
            }
        }
        doc
    }
}

impl Crdt for Calm {
    type History = Vec<u8>;
    fn encode(doc: &Text) -> Vec<u8> {
        codec::to_bytes(doc)
    }
    fn load(bytes: &[u8]) -> Text {
        codec::from_bytes(bytes).expect("decodes")
    }
    fn history(doc: &Text, _: &Trace) -> Vec<u8> {
        codec::to_bytes(&doc.delta(&VersionVector::new()))
    }
    fn merge(history: &Vec<u8>) -> Text {
        let delta: Text = codec::from_bytes(history).expect("decodes");
        let mut doc = Text::new(ReplicaId::new(2));
        doc.merge_owned(delta);
        doc
    }
}

impl Remote for Calm {
    fn remote_insert(doc: &mut Text) {
        let mut other = doc.fork(ReplicaId::new(2));
        let op = other.insert(doc.len() / 2, "x").expect("in range");
        doc.apply(&op).expect("applies");
    }
    fn chars(doc: &Text) -> usize {
        doc.len()
    }
}

struct DiamondTypes;

impl Subject for DiamondTypes {
    const NAME: &'static str = "diamond-types";
    type Doc = diamond_types::list::ListCRDT;
    fn replay(t: &Trace) -> Self::Doc {
        let mut doc = diamond_types::list::ListCRDT::new();
        let agent = doc.get_or_create_agent_id("a");
        for p in &t.patches {
            if p.del > 0 {
                doc.delete_without_content(agent, p.pos..p.pos + p.del);
            }
            if !p.ins.is_empty() {
                doc.insert(agent, p.pos, &p.ins);
            }
        }
        doc
    }
    fn check(doc: &Self::Doc, t: &Trace) {
        assert!(
            doc.branch.content().to_string() == t.end,
            "diamond-types: {}",
            t.name
        );
    }
}

impl Crdt for DiamondTypes {
    type History = Vec<u8>;
    fn encode(doc: &Self::Doc) -> Vec<u8> {
        doc.oplog.encode(diamond_types::list::encoding::ENCODE_FULL)
    }
    fn load(bytes: &[u8]) -> Self::Doc {
        diamond_types::list::ListCRDT::load_from(bytes).expect("loads")
    }
    fn history(doc: &Self::Doc, _: &Trace) -> Vec<u8> {
        doc.oplog
            .encode(diamond_types::list::encoding::ENCODE_PATCH)
    }
    fn merge(history: &Vec<u8>) -> Self::Doc {
        let mut doc = diamond_types::list::ListCRDT::new();
        doc.merge_data_and_ff(history).expect("merges");
        doc
    }
}

impl Remote for DiamondTypes {
    fn remote_insert(doc: &mut Self::Doc) {
        let mut other = Self::load(&Self::encode(doc));
        let agent = other.get_or_create_agent_id("b");
        let from = other.oplog.local_version();
        other.insert(agent, other.branch.len() / 2, "x");
        let patch = other
            .oplog
            .encode_from(diamond_types::list::encoding::ENCODE_PATCH, &from);
        doc.merge_data_and_ff(&patch).expect("merges");
    }
    fn chars(doc: &Self::Doc) -> usize {
        doc.branch.len()
    }
}

struct Cola;

/// A cola op, recorded during a replay for the merge test.
#[derive(Clone)]
enum ColaOp {
    Insert(cola::Insertion),
    Delete(cola::Deletion),
}

impl Cola {
    /// Replays `t`, recording the ops a peer would integrate.
    fn replay_ops(t: &Trace, mut ops: Option<&mut Vec<ColaOp>>) -> cola::Replica {
        let mut doc = cola::Replica::new(1, 0);
        for p in &t.patches {
            if p.del > 0 {
                let d = doc.deleted(p.pos..p.pos + p.del);
                if let Some(ops) = ops.as_deref_mut() {
                    ops.push(ColaOp::Delete(d));
                }
            }
            if p.ins_chars > 0 {
                let i = doc.inserted(p.pos, p.ins_chars);
                if let Some(ops) = ops.as_deref_mut() {
                    ops.push(ColaOp::Insert(i));
                }
            }
        }
        doc
    }
}

impl Subject for Cola {
    const NAME: &'static str = "cola (no text)";
    type Doc = cola::Replica;
    fn replay(t: &Trace) -> cola::Replica {
        Self::replay_ops(t, None)
    }
    fn check(doc: &cola::Replica, t: &Trace) {
        assert_eq!(doc.len(), t.end.chars().count(), "cola: {}", t.name);
    }
}

impl Crdt for Cola {
    type History = Vec<ColaOp>;
    fn encode(doc: &cola::Replica) -> Vec<u8> {
        bincode::serialize(&doc.encode()).expect("encodes")
    }
    fn load(bytes: &[u8]) -> cola::Replica {
        let encoded: cola::EncodedReplica = bincode::deserialize(bytes).expect("bincode");
        cola::Replica::decode(2, &encoded).expect("decodes")
    }
    fn history(_: &cola::Replica, t: &Trace) -> Vec<ColaOp> {
        let mut ops = Vec::new();
        Self::replay_ops(t, Some(&mut ops));
        ops
    }
    fn merge(history: &Vec<ColaOp>) -> cola::Replica {
        // cola peers start as forks of the replica that created the (empty)
        // document, not as new documents of their own.
        let mut doc = cola::Replica::new(1, 0).fork(2);
        for op in history {
            match op {
                ColaOp::Insert(i) => {
                    let _ = doc.integrate_insertion(i);
                }
                ColaOp::Delete(d) => {
                    let _ = doc.integrate_deletion(d);
                }
            }
        }
        doc
    }
}

struct Yrs;

impl Subject for Yrs {
    const NAME: &'static str = "yrs";
    type Doc = (yrs::Doc, yrs::TextRef);
    fn replay(t: &Trace) -> Self::Doc {
        use yrs::{Text as _, Transact};
        let doc = yrs::Doc::new();
        let text = doc.get_or_insert_text("text");
        for p in &t.patches {
            let mut txn = doc.transact_mut();
            if p.del8 > 0 {
                text.remove_range(&mut txn, p.pos8 as u32, p.del8 as u32);
            }
            if !p.ins.is_empty() {
                text.insert(&mut txn, p.pos8 as u32, &p.ins);
            }
        }
        (doc, text)
    }
    fn check(doc: &Self::Doc, t: &Trace) {
        use yrs::{GetString, Transact};
        let txn = doc.0.transact();
        assert!(doc.1.get_string(&txn) == t.end, "yrs: {}", t.name);
    }
}

impl Crdt for Yrs {
    type History = Vec<u8>;
    fn encode(doc: &Self::Doc) -> Vec<u8> {
        use yrs::{ReadTxn, StateVector, Transact};
        doc.0
            .transact()
            .encode_state_as_update_v1(&StateVector::default())
    }
    fn load(bytes: &[u8]) -> Self::Doc {
        use yrs::updates::decoder::Decode;
        use yrs::{Transact, Update};
        let doc = yrs::Doc::new();
        let text = doc.get_or_insert_text("text");
        doc.transact_mut()
            .apply_update(Update::decode_v1(bytes).expect("decodes"))
            .expect("applies");
        (doc, text)
    }
    fn history(doc: &Self::Doc, _: &Trace) -> Vec<u8> {
        Self::encode(doc)
    }
    fn merge(history: &Vec<u8>) -> Self::Doc {
        Self::load(history)
    }
}

struct Loro;

impl Subject for Loro {
    const NAME: &'static str = "loro";
    type Doc = loro::LoroDoc;
    fn replay(t: &Trace) -> loro::LoroDoc {
        let doc = loro::LoroDoc::new();
        let text = doc.get_text("text");
        for p in &t.patches {
            if p.del > 0 {
                text.delete(p.pos, p.del).expect("in range");
            }
            if !p.ins.is_empty() {
                text.insert(p.pos, &p.ins).expect("in range");
            }
        }
        doc.commit();
        doc
    }
    fn check(doc: &loro::LoroDoc, t: &Trace) {
        assert!(
            doc.get_text("text").to_string() == t.end,
            "loro: {}",
            t.name
        );
    }
}

impl Crdt for Loro {
    type History = Vec<u8>;
    fn encode(doc: &loro::LoroDoc) -> Vec<u8> {
        doc.export(loro::ExportMode::Snapshot).expect("exports")
    }
    fn load(bytes: &[u8]) -> loro::LoroDoc {
        loro::LoroDoc::from_snapshot(bytes).expect("loads")
    }
    fn history(doc: &loro::LoroDoc, _: &Trace) -> Vec<u8> {
        doc.export(loro::ExportMode::all_updates())
            .expect("exports")
    }
    fn merge(history: &Vec<u8>) -> loro::LoroDoc {
        let doc = loro::LoroDoc::new();
        doc.import(history).expect("imports");
        doc
    }
}

struct Automerge;

impl Subject for Automerge {
    const NAME: &'static str = "automerge";
    type Doc = (automerge::AutoCommit, automerge::ObjId);
    fn replay(t: &Trace) -> Self::Doc {
        use automerge::transaction::Transactable;
        let mut doc =
            automerge::AutoCommit::new_with_encoding(automerge::TextEncoding::UnicodeCodePoint);
        let text = doc
            .put_object(automerge::ROOT, "text", automerge::ObjType::Text)
            .expect("text object");
        for p in &t.patches {
            doc.splice_text(&text, p.pos, p.del as isize, &p.ins)
                .expect("in range");
        }
        doc.commit();
        (doc, text)
    }
    fn check(doc: &Self::Doc, t: &Trace) {
        use automerge::ReadDoc;
        assert!(
            doc.0.text(&doc.1).expect("text") == t.end,
            "automerge: {}",
            t.name
        );
    }
}

impl Crdt for Automerge {
    type History = Vec<u8>;
    fn encode(doc: &Self::Doc) -> Vec<u8> {
        doc.0.clone().save()
    }
    fn load(bytes: &[u8]) -> Self::Doc {
        use automerge::ReadDoc;
        let doc = automerge::AutoCommit::load(bytes).expect("loads");
        let (_, text) = doc
            .get(automerge::ROOT, "text")
            .expect("reads")
            .expect("has text");
        (doc, text)
    }
    fn history(doc: &Self::Doc, _: &Trace) -> Vec<u8> {
        Self::encode(doc)
    }
    fn merge(history: &Vec<u8>) -> Self::Doc {
        use automerge::ReadDoc;
        let mut doc =
            automerge::AutoCommit::new_with_encoding(automerge::TextEncoding::UnicodeCodePoint);
        doc.load_incremental(history).expect("merges");
        let (_, text) = doc
            .get(automerge::ROOT, "text")
            .expect("reads")
            .expect("has text");
        (doc, text)
    }
}

struct JumpRope;

impl Subject for JumpRope {
    const NAME: &'static str = "jumprope (no CRDT)";
    type Doc = jumprope::JumpRope;
    fn replay(t: &Trace) -> jumprope::JumpRope {
        let mut rope = jumprope::JumpRope::new();
        for p in &t.patches {
            if p.del > 0 {
                rope.remove(p.pos..p.pos + p.del);
            }
            if !p.ins.is_empty() {
                rope.insert(p.pos, &p.ins);
            }
        }
        rope
    }
    fn check(doc: &jumprope::JumpRope, t: &Trace) {
        assert!(doc.to_string() == t.end, "jumprope: {}", t.name);
    }
}

struct Ropey;

impl Subject for Ropey {
    const NAME: &'static str = "ropey (no CRDT)";
    type Doc = ropey::Rope;
    fn replay(t: &Trace) -> ropey::Rope {
        let mut rope = ropey::Rope::new();
        for p in &t.patches {
            if p.del > 0 {
                rope.remove(p.pos..p.pos + p.del);
            }
            if !p.ins.is_empty() {
                rope.insert(p.pos, &p.ins);
            }
        }
        rope
    }
    fn check(doc: &ropey::Rope, t: &Trace) {
        assert!(*doc == t.end.as_str(), "ropey: {}", t.name);
    }
}

/// Times calm's and a peer's replay side by side, checks both results, and
/// measures both sides' heap.
fn replay_rows<P: Subject>(t: &Trace, rows: &mut Vec<Row>) {
    let (ours, our_heap) = measure(|| Calm::replay(t));
    Calm::check(&ours, t);
    let (theirs, their_heap) = measure(|| P::replay(t));
    P::check(&theirs, t);
    drop((ours, theirs));
    let (a, b) = compare_rounds(
        Side::batched(|| (), |()| Calm::replay(t)),
        Side::batched(|| (), |()| P::replay(t)),
        ROUNDS,
    );
    let row = |metric: &str, ours, theirs| Row {
        workload: t.name.clone(),
        metric: metric.to_owned(),
        peer: P::NAME.to_owned(),
        ours,
        theirs,
    };
    rows.push(row("local replay", Figure::Time(a), Figure::Time(b)));
    rows.push(row(
        "peak heap (replay)",
        Figure::Bytes(our_heap.peak),
        Figure::Bytes(their_heap.peak),
    ));
    rows.push(row(
        "kept heap (replay)",
        Figure::Bytes(our_heap.retained),
        Figure::Bytes(their_heap.retained),
    ));
}

/// calm's replay building every edit's op (`insert` and `delete`)
/// against `P`'s local replay.
fn replay_with_ops_row<P: Subject>(t: &Trace, rows: &mut Vec<Row>) {
    Calm::check(&Calm::replay_with_ops(t), t);
    let (a, b) = compare_rounds(
        Side::batched(|| (), |()| Calm::replay_with_ops(t)),
        Side::batched(|| (), |()| P::replay(t)),
        ROUNDS,
    );
    rows.push(Row {
        workload: t.name.clone(),
        metric: "local replay, each edit returning its op".to_owned(),
        peer: P::NAME.to_owned(),
        ours: Figure::Time(a),
        theirs: Figure::Time(b),
    });
}

/// Kept heap after a replay and one remote insert, calm against `P`.
fn remote_rows<P: Remote>(t: &Trace, rows: &mut Vec<Row>) {
    let chars = t.end.chars().count() + 1;
    let (ours, our_heap) = measure(|| {
        let mut doc = Calm::replay(t);
        Calm::remote_insert(&mut doc);
        doc
    });
    assert_eq!(Calm::chars(&ours), chars, "calm: {}", t.name);
    let (theirs, their_heap) = measure(|| {
        let mut doc = P::replay(t);
        P::remote_insert(&mut doc);
        doc
    });
    assert_eq!(P::chars(&theirs), chars, "{}: {}", P::NAME, t.name);
    rows.push(Row {
        workload: t.name.clone(),
        metric: "kept heap (replay, then a remote op)".to_owned(),
        peer: P::NAME.to_owned(),
        ours: Figure::Bytes(our_heap.retained),
        theirs: Figure::Bytes(their_heap.retained),
    });
}

/// Merge, encode, load and size of calm against a CRDT peer.
fn crdt_rows<P: Crdt>(t: &Trace, rows: &mut Vec<Row>) {
    let (ours, theirs) = (Calm::replay(t), P::replay(t));
    let (our_hist, their_hist) = (Calm::history(&ours, t), P::history(&theirs, t));
    Calm::check(&Calm::merge(&our_hist), t);
    P::check(&P::merge(&their_hist), t);
    let (our_bytes, their_bytes) = (Calm::encode(&ours), P::encode(&theirs));
    Calm::check(&Calm::load(&our_bytes), t);
    P::check(&P::load(&their_bytes), t);
    let row = |metric: &str, ours, theirs| Row {
        workload: t.name.clone(),
        metric: metric.to_owned(),
        peer: P::NAME.to_owned(),
        ours,
        theirs,
    };
    let (a, b) = compare_rounds(
        Side::batched(|| (), |()| Calm::merge(&our_hist)),
        Side::batched(|| (), |()| P::merge(&their_hist)),
        ROUNDS,
    );
    rows.push(row(
        "merge remote history",
        Figure::Time(a),
        Figure::Time(b),
    ));
    let (a, b) = compare_rounds(
        Side::batched(|| (), |()| Calm::encode(&ours)),
        Side::batched(|| (), |()| P::encode(&theirs)),
        ROUNDS,
    );
    rows.push(row("encode", Figure::Time(a), Figure::Time(b)));
    let (a, b) = compare_rounds(
        Side::batched(|| (), |()| Calm::load(&our_bytes)),
        Side::batched(|| (), |()| P::load(&their_bytes)),
        ROUNDS,
    );
    rows.push(row("load", Figure::Time(a), Figure::Time(b)));
    rows.push(row(
        "encoded size",
        Figure::Bytes(our_bytes.len()),
        Figure::Bytes(their_bytes.len()),
    ));
}

/// Every row for every trace, then the concurrent trace and every
/// concurrent scenario (or those whose name contains `filter`).
pub fn run(filter: Option<&str>) -> Vec<Row> {
    let mut rows = Vec::new();
    if filter == Some(SYNTHETIC) {
        for t in crate::synthetic::traces() {
            eprintln!("{}: {} patches", t.name, t.patches.len());
            replay_rows::<DiamondTypes>(&t, &mut rows);
            replay_with_ops_row::<DiamondTypes>(&t, &mut rows);
            crdt_rows::<DiamondTypes>(&t, &mut rows);
            replay_rows::<JumpRope>(&t, &mut rows);
        }
        return rows;
    }
    for t in traces(filter) {
        eprintln!("{}: {} patches", t.name, t.patches.len());
        replay_rows::<DiamondTypes>(&t, &mut rows);
        replay_with_ops_row::<DiamondTypes>(&t, &mut rows);
        crdt_rows::<DiamondTypes>(&t, &mut rows);
        remote_rows::<DiamondTypes>(&t, &mut rows);
        replay_rows::<Cola>(&t, &mut rows);
        crdt_rows::<Cola>(&t, &mut rows);
        replay_rows::<Loro>(&t, &mut rows);
        crdt_rows::<Loro>(&t, &mut rows);
        replay_rows::<Yrs>(&t, &mut rows);
        crdt_rows::<Yrs>(&t, &mut rows);
        replay_rows::<Automerge>(&t, &mut rows);
        crdt_rows::<Automerge>(&t, &mut rows);
        replay_rows::<JumpRope>(&t, &mut rows);
        replay_rows::<Ropey>(&t, &mut rows);
    }
    rows.extend(crate::concurrent::run(filter));
    rows.extend(crate::scenarios::run(filter));
    rows
}
