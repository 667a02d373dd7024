//! `Text`: real editing traces replayed exactly (sequential and
//! concurrent), non-interleaving of concurrent runs, a model check against a
//! `Vec<char>`, Unicode position conversions, bad input, and the codec.

use calm::causal::{ReplicaId, VersionVector};
use calm::codec::{self, DecodeError, Encoder};
use calm::testing::Config;
use calm::text::{Applied, MAX_COUNTER, Text, TextError, TextOp};
use calm::{DeltaMerge, Merge};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::common::alloc::bytes_allocated_by;
use crate::common::traces::{self, Patch};

fn r(n: u64) -> ReplicaId {
    ReplicaId::new(n)
}

/// Applies one trace patch locally, collecting the ops it produced.
fn apply_patch(doc: &mut Text, p: &Patch, ops: &mut Vec<TextOp>) {
    if p.del > 0 {
        ops.push(doc.delete(p.pos..p.pos + p.del).expect("delete in range"));
    }
    if !p.ins.is_empty() {
        ops.push(doc.insert(p.pos, &p.ins).expect("insert in range"));
    }
}

/// Replays one sequential trace and checks it three ways: the local
/// document, a second replica fed the ops, and a decode of the encoding.
fn replay_sequential(name: &str) {
    let path = traces::sequential()
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(&format!("{name}.json.gz")))
        .expect("trace exists");
    let trace = traces::load(&path);
    let mut doc = Text::new(r(1));
    let mut ops = Vec::new();
    for txn in &trace.txns {
        for p in &txn.patches {
            apply_patch(&mut doc, p, &mut ops);
        }
    }
    assert!(
        doc.to_string() == trace.end_content,
        "{} replayed wrong",
        trace.name
    );
    doc.assert_invariants();

    let mut remote = Text::new(r(2));
    for op in &ops {
        assert_eq!(remote.apply(op), Ok(Applied::Integrated));
    }
    assert!(
        remote == doc,
        "{}: ops replayed elsewhere differ",
        trace.name
    );

    let bytes = codec::to_bytes(&doc);
    let back: Text = codec::from_bytes(&bytes).expect("decodes");
    back.assert_invariants();
    assert!(back == doc, "{}: decode differs", trace.name);
    assert_eq!(
        codec::to_bytes(&back),
        bytes,
        "{}: encoding is canonical",
        trace.name
    );
}

/// `automerge-paper` replays to exactly its final text.
#[test]
fn trace_automerge_paper() {
    replay_sequential("sequential/automerge-paper");
}

/// `seph-blog1` (with non-ASCII text) replays to exactly its final text.
#[test]
fn trace_seph_blog1() {
    replay_sequential("sequential/seph-blog1");
}

/// The ASCII-only `seph-blog1` replays to exactly its final text.
#[test]
fn trace_seph_blog1_ascii() {
    replay_sequential("ascii_only/seph-blog1");
}

/// `friendsforever_flat` replays to exactly its final text.
#[test]
fn trace_friendsforever_flat() {
    replay_sequential("sequential/friendsforever_flat");
}

/// `sveltecomponent` replays to exactly its final text.
#[test]
fn trace_sveltecomponent() {
    replay_sequential("sequential/sveltecomponent");
}

/// The tests above cover every sequential trace in the folder.
#[test]
fn every_sequential_trace_is_tested() {
    assert_eq!(traces::sequential().len(), 5);
}

/// The concurrent trace, replayed as one replica per agent that receives
/// exactly the ops of a transaction's ancestors before making it, converges
/// on every replica to exactly `endContent`, by ops, by deltas and by
/// state merges.
#[test]
fn concurrent_trace_converges() {
    for path in traces::concurrent() {
        let trace = traces::load(&path);
        let n = trace.agents;
        let mut replicas: Vec<Text> = (0..n).map(|a| Text::new(r(a as u64 + 1))).collect();
        let mut delivered = vec![vec![false; trace.txns.len()]; n];
        let mut txn_ops: Vec<Vec<TextOp>> = Vec::with_capacity(trace.txns.len());
        for (i, txn) in trace.txns.iter().enumerate() {
            let a = txn.agent;
            let mut need = Vec::new();
            let mut stack = txn.parents.clone();
            while let Some(t) = stack.pop() {
                if !delivered[a][t] {
                    delivered[a][t] = true;
                    need.push(t);
                    stack.extend(&trace.txns[t].parents);
                }
            }
            need.sort_unstable();
            for t in need {
                for op in &txn_ops[t] {
                    replicas[a].apply(op).expect("valid op");
                }
            }
            let mut ops = Vec::new();
            for p in &txn.patches {
                apply_patch(&mut replicas[a], p, &mut ops);
            }
            delivered[a][i] = true;
            txn_ops.push(ops);
        }
        // Two more replicas catch up by deltas and by whole states.
        let mut by_delta = Text::new(r(100));
        let mut by_state = Text::new(r(101));
        for replica in &replicas {
            by_delta.merge(&replica.delta(&by_delta.version_vector()));
            by_state.merge(replica);
        }
        for a in 0..n {
            for (t, ops) in txn_ops.iter().enumerate() {
                if !delivered[a][t] {
                    for op in ops {
                        replicas[a].apply(op).expect("valid op");
                    }
                }
            }
        }
        replicas.push(by_delta);
        replicas.push(by_state);
        for (i, doc) in replicas.iter().enumerate() {
            doc.assert_invariants();
            assert!(
                doc.to_string() == trace.end_content,
                "replica {i} of {}",
                trace.name
            );
            assert_eq!(doc, &replicas[0]);
        }
        let back: Text = codec::from_bytes(&codec::to_bytes(&replicas[0])).expect("decodes");
        assert_eq!(back, replicas[0]);
    }
}

/// The number of property-test cases (`CALM_PROPTEST_CASES`).
fn cases() -> u32 {
    Config::default().cases
}

/// The `k`-th character of replica `i`'s run: unique per replica and
/// position, so runs can be found in the merged text.
fn run_char(i: usize, k: usize) -> char {
    char::from_u32(0x4E00 + (i * 32 + k) as u32).expect("CJK")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Two to five replicas each type a run at one position at the same
    /// time, forward or backward; after exchanging ops in a random order
    /// (so many arrive early and are buffered) every replica holds the same
    /// text, and each run is contiguous in it.
    #[test]
    fn concurrent_runs_never_interleave(
        base in "[a-c]{0,8}",
        at in any::<usize>(),
        runs in vec((1..7usize, any::<bool>()), 2..6),
        order in any::<u64>(),
    ) {
        let mut seed = Text::new(r(1000));
        seed.insert(0, &base).unwrap();
        let at = at % (base.chars().count() + 1);
        let mut replicas: Vec<Text> = (0..runs.len()).map(|i| seed.fork(r(i as u64 + 1))).collect();
        let mut ops = Vec::new();
        let mut expected = Vec::new();
        for (i, &(len, forward)) in runs.iter().enumerate() {
            let mut typed = String::new();
            for k in 0..len {
                let c = run_char(i, k).to_string();
                let pos = if forward { at + k } else { at };
                ops.push(replicas[i].insert(pos, &c).unwrap());
                if forward { typed.push_str(&c) } else { typed.insert_str(0, &c) }
            }
            expected.push(typed);
        }
        for (j, doc) in replicas.iter_mut().enumerate() {
            let mut mine: Vec<&TextOp> = ops.iter().collect();
            shuffle(&mut mine, order.wrapping_add(j as u64));
            for op in mine {
                doc.apply(op).unwrap();
            }
            doc.assert_invariants();
            prop_assert_eq!(doc.buffered_ops(), 0);
        }
        let text = replicas[0].to_string();
        for doc in &replicas {
            prop_assert_eq!(doc, &replicas[0]);
        }
        for run in &expected {
            prop_assert!(text.contains(run.as_str()), "run {:?} split in {:?}", run, text);
        }
        prop_assert_eq!(
            text.chars().count(),
            base.chars().count() + expected.iter().map(|s| s.chars().count()).sum::<usize>()
        );
    }

    /// Random local edits give exactly the text a `Vec<char>` model gives;
    /// a second replica fed the ops (one by one, in order) agrees, and
    /// invariants hold throughout.
    #[test]
    fn local_edits_match_a_model(edits in vec((any::<bool>(), any::<usize>(), "[a-z日é😀]{1,6}", 1..8usize), 0..150)) {
        let mut doc = Text::new(r(1));
        let mut model: Vec<char> = Vec::new();
        let mut remote = Text::new(r(2));
        for (i, (insert, at, s, n)) in edits.into_iter().enumerate() {
            let op = if insert || model.is_empty() {
                let at = at % (model.len() + 1);
                model.splice(at..at, s.chars());
                doc.insert(at, &s).unwrap()
            } else {
                let at = at % model.len();
                let end = (at + n).min(model.len());
                model.drain(at..end);
                doc.delete(at..end).unwrap()
            };
            prop_assert_eq!(remote.apply(&op).unwrap(), Applied::Integrated);
            prop_assert_eq!(doc.to_string(), model.iter().collect::<String>());
            prop_assert_eq!(doc.len(), model.len());
            if i % 16 == 0 {
                doc.assert_invariants();
            }
        }
        doc.assert_invariants();
        prop_assert_eq!(&remote, &doc);
    }

    /// Editing at a few places in turn over a document of many leaves
    /// matches a `Vec<char>` model, and the structure (the cursor cache
    /// with it) checks out after every edit; ops of a second replica
    /// arrive in between (the model is then read back from the merged
    /// text). Deletions across leaves (emptying some) included.
    #[test]
    fn edits_at_places_in_turn_match_a_model(
        seed in any::<u64>(),
        places in 1..12usize,
        edits in vec((any::<usize>(), 0..4usize, any::<bool>(), 0..12u8), 1..250),
    ) {
        let mut doc = Text::new(r(1));
        let mut other = Text::new(r(2));
        let mut s = seed | 1;
        let mut next = |n: usize| below(&mut s, n);
        // Scattered typing makes many runs, so many leaves.
        for k in 0..400 {
            let at = next(doc.len() + 1);
            doc.insert(at, &run_char(k % 7, k % 32).to_string()).unwrap();
        }
        other.merge(&doc);
        let mut model: Vec<char> = doc.to_string().chars().collect();
        let mut at: Vec<usize> = (0..places).map(|_| next(model.len() + 1)).collect();
        for (pick, n, delete, remote) in edits {
            let h = pick % places;
            let p = at[h].min(model.len());
            if delete && p > 0 {
                let n = if n == 3 { 1 + next(90) } else { n.max(1) };
                let from = p.saturating_sub(n);
                doc.delete(from..p).unwrap();
                model.drain(from..p);
                for q in &mut at {
                    *q = if *q >= p { *q - (p - from) } else { (*q).min(from) };
                }
                at[h] = from;
            } else {
                let typed: String = (0..=n).map(|k| run_char(h, k)).collect();
                doc.insert(p, &typed).unwrap();
                model.splice(p..p, typed.chars());
                for q in &mut at {
                    if *q > p {
                        *q += n + 1;
                    }
                }
                at[h] = p + n + 1;
            }
            prop_assert_eq!(doc.to_string(), model.iter().collect::<String>());
            doc.assert_invariants();
            if remote == 0 {
                let len = other.len();
                let op = if len > 0 && next(2) == 0 {
                    let from = next(len);
                    other.delete(from..(from + 3).min(len)).unwrap()
                } else {
                    other.insert(next(len + 1), "xy").unwrap()
                };
                doc.apply(&op).unwrap();
                doc.assert_invariants();
                model = doc.to_string().chars().collect();
            }
        }
        other.merge(&doc);
        doc.merge(&other);
        prop_assert_eq!(&doc, &other);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// `replace` is `delete` then `insert` without the ops: two replicas of
    /// one id, one editing with `replace`, the other with `delete` and
    /// `insert`, stay equal edit by edit and encode to the same bytes,
    /// and a peer fed the first one's `ops_since` gets its text. A replace
    /// out of range is refused with the text unchanged.
    #[test]
    fn replace_is_delete_then_insert(edits in vec((any::<usize>(), 0..6usize, "[a-z日é😀]{0,5}"), 0..120)) {
        let (mut a, mut b) = (Text::new(r(1)), Text::new(r(1)));
        for (at, n, s) in edits {
            let len = a.len();
            let at = at % (len + 1);
            let end = (at + n).min(len);
            let before = a.clone();
            prop_assert_eq!(
                a.replace(at..len + 1 + n, &s),
                Err(TextError::RangeOutOfBounds { start: at, end: len + 1 + n, len })
            );
            prop_assert_eq!(&a, &before);
            a.replace(at..end, &s).unwrap();
            b.delete(at..end).unwrap();
            b.insert(at, &s).unwrap();
            prop_assert_eq!(&a, &b);
        }
        a.assert_invariants();
        prop_assert_eq!(codec::to_bytes(&a), codec::to_bytes(&b));
        let mut peer = Text::new(r(2));
        for op in a.ops_since(&VersionVector::new()) {
            peer.apply(&op).unwrap();
        }
        prop_assert_eq!(peer.to_string(), a.to_string());
    }
}

/// The next number below `n` from the xorshift generator whose state is
/// `state` (never 0): seeded randomness with no extra crates.
fn below(state: &mut u64, n: usize) -> usize {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state % n as u64) as usize
}

/// A seeded Fisher–Yates shuffle.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut s = seed | 1;
    for i in (1..items.len()).rev() {
        items.swap(i, below(&mut s, i + 1));
    }
}

/// Thousands of random edits on one replica, enough to split leaves and
/// nodes many times, match the model; every few hundred steps the whole
/// structure is checked, and a fork made mid-way merges back.
#[test]
fn many_edits_match_a_model() {
    let mut doc = Text::new(r(1));
    let mut model: Vec<char> = Vec::new();
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rand = move |n: usize| below(&mut s, n);
    let alphabet: Vec<char> = "abcdefgh é日😀\u{301}".chars().collect();
    // Half the edits land near the previous one, as typing does (leaves
    // count bytes from where the last edit was).
    let mut cursor = 0usize;
    for step in 0..6000 {
        let near = |len: usize, rand: &mut dyn FnMut(usize) -> usize| {
            if rand(2) == 0 {
                (cursor + rand(7)).saturating_sub(3).min(len)
            } else {
                rand(len + 1)
            }
        };
        if model.is_empty() || rand(10) < 7 {
            let at = near(model.len(), &mut rand);
            cursor = at;
            let text: String = (0..1 + rand(12))
                .map(|_| alphabet[rand(alphabet.len())])
                .collect();
            model.splice(at..at, text.chars());
            doc.insert(at, &text).unwrap();
            cursor += text.chars().count();
        } else {
            let at = near(model.len() - 1, &mut rand);
            cursor = at;
            let end = (at + 1 + rand(20)).min(model.len());
            model.drain(at..end);
            doc.delete(at..end).unwrap();
        }
        if step % 100 == 0 {
            doc.assert_invariants();
            assert_eq!(doc.to_string(), model.iter().collect::<String>());
        }
    }
    doc.assert_invariants();
    assert_eq!(doc.to_string(), model.iter().collect::<String>());
    let mut other = Text::new(r(2));
    other.merge(&doc);
    assert_eq!(other, doc);
}

/// Emoji, CJK and combining marks: every character boundary converts to
/// UTF-8 and UTF-16 offsets and back exactly, and offsets inside a
/// character are refused.
#[test]
fn utf8_and_utf16_conversions_round_trip() {
    let piece = "a😀日本e\u{301}ü👩‍👩‍👧 x";
    let mut doc = Text::new(r(1));
    let mut model = String::new();
    for i in 0..300 {
        let at = if i % 3 == 0 { 0 } else { doc.len() };
        doc.insert(at, piece).unwrap();
        if i % 3 == 0 {
            model.insert_str(0, piece);
        } else {
            model.push_str(piece);
        }
    }
    assert_eq!(doc.to_string(), model);
    assert_eq!(doc.len_utf8(), model.len());
    assert_eq!(doc.len_utf16(), model.encode_utf16().count());
    let (mut b8, mut b16) = (0, 0);
    for (c, ch) in model.chars().chain(std::iter::once('\0')).enumerate() {
        assert_eq!(doc.chars_to_utf8(c), Ok(b8));
        assert_eq!(doc.chars_to_utf16(c), Ok(b16));
        assert_eq!(doc.utf8_to_chars(b8), Ok(c));
        assert_eq!(doc.utf16_to_chars(b16), Ok(c));
        if c == doc.len() {
            break;
        }
        for inside in 1..ch.len_utf8() {
            assert_eq!(
                doc.utf8_to_chars(b8 + inside),
                Err(TextError::NotCharBoundary {
                    offset: b8 + inside
                })
            );
        }
        if ch.len_utf16() == 2 {
            assert_eq!(
                doc.utf16_to_chars(b16 + 1),
                Err(TextError::NotCharBoundary { offset: b16 + 1 })
            );
        }
        b8 += ch.len_utf8();
        b16 += ch.len_utf16();
    }
    assert!(matches!(
        doc.utf16_to_chars(b16 + 1),
        Err(TextError::PositionOutOfBounds { .. })
    ));
    assert!(matches!(
        doc.chars_to_utf8(doc.len() + 1),
        Err(TextError::PositionOutOfBounds { .. })
    ));
}

/// Conversions right after edits anywhere in a document of many leaves
/// (an edit reaches the counts above its leaf only later) agree with the
/// text: at random character positions after every edit, the UTF-8 and
/// UTF-16 offsets and back.
#[test]
fn conversions_after_edits_in_the_middle_agree_with_the_text() {
    let pieces = ["a😀日", "e\u{301}ü", "👩‍👩‍👧 x", "plain ascii words ", "ß"];
    let mut doc = Text::new(r(1));
    let mut model: Vec<char> = Vec::new();
    let mut x = 11u64;
    let mut next = |m: usize| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as usize % m.max(1)
    };
    for step in 0..1_500 {
        let at = next(model.len() + 1);
        if step % 4 == 3 && !model.is_empty() {
            let n = 1 + next(model.len().min(8));
            let at = at.min(model.len() - n);
            doc.delete(at..at + n).unwrap();
            model.drain(at..at + n);
        } else {
            let piece = pieces[next(pieces.len())];
            doc.insert(at, piece).unwrap();
            model.splice(at..at, piece.chars());
        }
        for _ in 0..4 {
            let c = next(model.len() + 1);
            let b8: usize = model[..c].iter().map(|ch| ch.len_utf8()).sum();
            let b16: usize = model[..c].iter().map(|ch| ch.len_utf16()).sum();
            assert_eq!(doc.chars_to_utf8(c), Ok(b8), "step {step}");
            assert_eq!(doc.chars_to_utf16(c), Ok(b16), "step {step}");
            assert_eq!(doc.utf8_to_chars(b8), Ok(c), "step {step}");
            assert_eq!(doc.utf16_to_chars(b16), Ok(c), "step {step}");
        }
    }
    assert!(
        doc.len_utf8() > 8_000,
        "many leaves: {} bytes",
        doc.len_utf8()
    );
    assert_eq!(doc.to_string(), model.iter().collect::<String>());
    doc.assert_invariants();
}

/// Positions past the end and bad ranges are typed errors that change
/// nothing.
#[test]
fn bad_positions_change_nothing() {
    let mut doc = Text::new(r(1));
    doc.insert(0, "hello").unwrap();
    let before = doc.clone();
    assert_eq!(
        doc.insert(6, "x"),
        Err(TextError::PositionOutOfBounds { pos: 6, len: 5 })
    );
    assert_eq!(
        doc.delete(3..9),
        Err(TextError::RangeOutOfBounds {
            start: 3,
            end: 9,
            len: 5
        })
    );
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = doc.delete(4..2);
    assert!(matches!(backwards, Err(TextError::RangeOutOfBounds { .. })));
    assert_eq!(doc, before);
    assert_eq!(doc.version_vector(), before.version_vector());
    // Empty edits are fine and do nothing.
    assert!(doc.insert(5, "").unwrap().is_empty());
    assert!(doc.delete(2..2).unwrap().is_empty());
    assert_eq!(doc, before);
}

/// A remote op whose dependencies are missing is buffered, leaves the text
/// alone, and applies once they arrive; duplicates are ignored.
#[test]
fn early_ops_are_buffered() {
    let mut a = Text::new(r(1));
    let ops = [
        a.insert(0, "abc").unwrap(),
        a.delete(1..2).unwrap(),
        a.insert(2, "de").unwrap(),
    ];
    let mut b = Text::new(r(2));
    assert_eq!(b.apply(&ops[2]), Ok(Applied::Buffered));
    assert_eq!(b.apply(&ops[1]), Ok(Applied::Buffered));
    assert_eq!((b.to_string(), b.buffered_ops()), (String::new(), 2));
    assert_eq!(b.version_vector(), VersionVector::new());
    assert_eq!(b.apply(&ops[0]), Ok(Applied::Integrated));
    assert_eq!((b.to_string(), b.buffered_ops()), ("acde".to_owned(), 0));
    assert_eq!(b.apply(&ops[1]), Ok(Applied::AlreadyKnown));
    assert_eq!(b, a);
}

/// Replica 2's first event, inserting "x" between the characters of
/// replica 1 with the given counters (`None`: a document end), made from
/// hand-written bytes so that nothing checks its origins on the way.
fn insert_from_bytes(left: Option<u64>, right: Option<u64>) -> TextOp {
    let mut enc = Encoder::new();
    enc.byte(codec::FORMAT_VERSION);
    enc.byte(<TextOp as codec::Tagged>::TAG);
    enc.varint(2); // replica
    enc.varint(1); // counter
    enc.byte(0); // insert
    for origin in [left, right] {
        match origin {
            Some(counter) => {
                enc.byte(2); // another replica's id: r1
                enc.varint(1);
                enc.varint(counter);
            }
            None => enc.byte(0),
        }
    }
    enc.bytes(b"x");
    enc.length(0);
    codec::from_bytes(&enc.into_bytes()).expect("well formed")
}

/// An op that names a deletion where a character must be is refused with
/// a typed error and changes nothing.
#[test]
fn invalid_ops_are_refused() {
    let mut a = Text::new(r(1));
    a.insert(0, "ab").unwrap();
    a.delete(0..1).unwrap(); // event r1.3 is a deletion
    // Replica 2 "inserts" after r1.3, by hand-made bytes.
    let op = insert_from_bytes(Some(3), None);
    let before = a.clone();
    assert!(matches!(a.apply(&op), Err(TextError::InvalidOp { .. })));
    assert_eq!(a, before);
}

/// An insert whose right origin lies before its left origin (no replica
/// could send one) is refused and changes nothing; a document holding it
/// could not be written as its structures.
#[test]
fn origins_out_of_order_are_refused() {
    let mut a = Text::new(r(1));
    a.insert(0, "abc").unwrap();
    let mut b = a.fork(r(3));
    b.insert(1, "z").unwrap(); // something between a and c
    a.merge(&b);
    for (left, right) in [(3, 1), (3, 2), (2, 2)] {
        let op = insert_from_bytes(Some(left), Some(right));
        let before = a.clone();
        assert!(
            matches!(a.apply(&op), Err(TextError::InvalidOp { .. })),
            "origins r1.{left}, r1.{right}"
        );
        assert_eq!(a, before);
    }
    let back: Text = codec::from_bytes(&codec::to_bytes(&a)).expect("decodes");
    assert_eq!(back, a);
}

/// A character can arrive already deleted, in an insert op that carries it
/// hidden, before the delete event itself: such a document is written and
/// read back like any other.
#[test]
fn a_character_deleted_before_its_delete_arrives_round_trips() {
    let mut a = Text::new(r(1));
    a.insert(0, "abc").unwrap();
    a.delete(1..2).unwrap();
    let ops = a.ops_since(&VersionVector::new());
    let mut b = Text::new(r(2));
    let insert = ops.iter().find(|op| op.len() == 3).expect("the insert op");
    assert_eq!(b.apply(insert), Ok(Applied::Integrated));
    assert_eq!(b.to_string(), "ac");
    let back: Text = codec::from_bytes(&codec::to_bytes(&b)).expect("decodes");
    back.assert_invariants();
    assert_eq!(back, b);
    for op in &ops {
        b.apply(op).unwrap();
    }
    assert_eq!(b, a);
}

/// A decoded document edits as a random replica of its own, the same on
/// every edit, never the encoder's; a blank replica that merges it keeps
/// its own id.
#[test]
fn a_decoded_document_edits_as_a_new_replica() {
    let mut a = Text::new(r(1));
    a.insert(0, "abc").unwrap();
    let bytes = codec::to_bytes(&a);
    let mut b: Text = codec::from_bytes(&bytes).expect("decodes");
    let mut c: Text = codec::from_bytes(&bytes).expect("decodes");
    let op = b.insert(3, "d").unwrap();
    assert_eq!(op.replica(), b.replica());
    assert_eq!(b.insert(4, "e").unwrap().replica(), b.replica());
    assert_ne!(b.replica(), r(1));
    let other = c.insert(0, "x").unwrap();
    assert_ne!(other.replica(), b.replica());
    let mut blank = Text::new(r(9));
    blank.merge_owned(codec::from_bytes(&bytes).expect("decodes"));
    assert_eq!(blank.replica(), r(9));
    assert_eq!(blank.insert(0, "y").unwrap().replica(), r(9));
    a.apply(&op).unwrap();
    a.apply(&other).unwrap();
    c.apply(&op).unwrap();
    assert_eq!(a.to_string(), "xabcd");
    assert_eq!(a, c);
}

/// Ops round-trip through the codec; truncated ops are errors.
#[test]
fn ops_round_trip() {
    let mut a = Text::new(r(7));
    let mut ops = vec![a.insert(0, "héllo wörld 😀").unwrap()];
    ops.push(a.delete(2..5).unwrap());
    ops.push(a.insert(3, "日本").unwrap());
    ops.extend(a.ops_since(&VersionVector::new()));
    for op in &ops {
        let bytes = codec::to_bytes(op);
        assert_eq!(&codec::from_bytes::<TextOp>(&bytes).unwrap(), op);
        for cut in 0..bytes.len() {
            assert!(codec::from_bytes::<TextOp>(&bytes[..cut]).is_err());
        }
    }
}

/// A 2^60 length where a version 1 document's replica table, an op's
/// text or its hidden stretches should be allocates nothing like it.
#[test]
fn text_length_bomb_allocates_nothing() {
    for depth in 0..3 {
        let mut enc = Encoder::new();
        enc.byte(1); // the ops layout of format version 1
        enc.byte(<Text as codec::Tagged>::TAG);
        if depth == 0 {
            enc.varint(1 << 60);
        } else {
            enc.length(1); // one replica
            enc.varint(5);
            enc.varint(3); // three events
            enc.byte(0); // an insert
            enc.byte(0);
            enc.byte(0);
            if depth == 1 {
                enc.varint(1 << 60); // text length
            } else {
                enc.bytes(b"abc");
                enc.varint(1 << 60); // hidden stretches
            }
        }
        assert_length_bomb(&enc.into_bytes());
    }
}

/// A 2^60 length at any count of the current layout (replicas, runs,
/// insert entries, a replica's delete entries, each coded column, the
/// compressed text and its streams, buffered ops) allocates nothing like
/// it; with no bomb, the same bytes are "ac".
#[test]
fn document_length_bombs_allocate_nothing() {
    // A column or stream written plain: its length, then its bytes.
    let block = |enc: &mut Encoder, bytes: &[u8]| {
        enc.varint((bytes.len() as u64) << 1);
        enc.raw(bytes);
    };
    // In document order: "a" (lv 0), "b" (lv 1, deleted), "c" (lv 2),
    // typed as one entry with its origins as guessed, "b" deleted by
    // event 4 (see the version 2 test below for the numbers).
    let blocks: [&[u8]; 14] = [
        &[0, 0, 0], // run starts
        &[2, 3, 2], // run lengths and deleted flags
        &[],        // replica indexes (one replica)
        &[],        // their stretches' lengths
        &[0],       // counter gaps
        &[3 << 3],  // entry lengths and origin codes
        &[],        // origins in full
        &[2],       // delete targets
        &[1 << 1],  // delete lengths
        &[2],       // the text: one token of two literals
        b"ac",
        &[],
        &[],
        &[],
    ];
    for at in 0..=20 {
        let mut enc = Encoder::new();
        enc.byte(codec::FORMAT_VERSION);
        enc.byte(<Text as codec::Tagged>::TAG);
        // Each number or block in turn; the one at `at` is the bomb.
        let mut count = 0;
        let number = |enc: &mut Encoder, count: &mut usize, n: u64| {
            enc.varint(if *count == at { 1 << 60 } else { n });
            *count += 1;
        };
        number(&mut enc, &mut count, 1); // replicas
        enc.varint(5); // replica 5, four events
        enc.varint(4);
        enc.varint(3); // three characters ever inserted
        number(&mut enc, &mut count, 3); // runs
        number(&mut enc, &mut count, 1); // insert entries
        number(&mut enc, &mut count, 1); // replica 5's delete entries
        for (i, b) in blocks.iter().enumerate() {
            if i == 9 {
                number(&mut enc, &mut count, 2); // the text's length
            }
            if count == at {
                enc.varint(1 << 61);
                count += 1;
            } else {
                count += 1;
                block(&mut enc, b);
            }
        }
        number(&mut enc, &mut count, 0); // buffered ops
        let bytes = enc.into_bytes();
        let (result, allocated) = bytes_allocated_by(|| codec::from_bytes::<Text>(&bytes));
        if at == 20 {
            let doc = result.expect("well formed");
            assert_eq!(doc.to_string(), "ac");
            doc.assert_invariants();
            assert_eq!(codec::to_bytes(&doc), bytes, "canonical");
        } else {
            assert!(result.is_err(), "bomb at {at}: {result:?}");
            assert!(
                allocated < 4096,
                "bomb at {at}: allocated {allocated} bytes"
            );
        }
    }
}

/// Insert entries' replicas are written per stretch of entries of one
/// replica: replica 5 types "a", then "b" before it, and replica 6 then
/// types "c" at the end: two stretches, of two entries and one. Stretches
/// that should have been one, run past the entries, or name a replica out
/// of range are refused.
#[test]
fn replica_stretches_are_checked() {
    let document = |replicas: &[u8], stretches: &[u8]| {
        let block = |enc: &mut Encoder, bytes: &[u8]| {
            enc.varint((bytes.len() as u64) << 1);
            enc.raw(bytes);
        };
        let mut enc = Encoder::new();
        enc.byte(codec::FORMAT_VERSION);
        enc.byte(<Text as codec::Tagged>::TAG);
        enc.varint(2); // replica 5 with two events, 6 with one
        for (id, events) in [(5, 2), (6, 1)] {
            enc.varint(id);
            enc.varint(events);
        }
        enc.varint(3); // three characters
        enc.varint(3); // three runs: "b", "a", "c" (local versions 1, 0, 2)
        enc.varint(3); // three insert entries
        enc.varint(0); // no delete entries
        enc.varint(0);
        let columns: [&[u8]; 9] = [
            &[2, 3, 2], // run starts (zig-zag: +1, -2, +1)
            &[2, 2, 2], // run lengths
            replicas,
            stretches,
            &[0, 0, 0],                // counter gaps
            &[1 << 3, 1 << 3, 1 << 3], // lengths, origins as guessed
            &[],                       // origins in full
            &[],                       // delete targets
            &[],                       // delete lengths
        ];
        for c in columns {
            block(&mut enc, c);
        }
        enc.varint(3); // the text: one token of three literals
        for stream in [&[3][..], b"bac", &[], &[], &[]] {
            block(&mut enc, stream);
        }
        enc.varint(0); // buffered ops
        enc.into_bytes()
    };
    let bytes = document(&[0, 1], &[1, 0]);
    let doc: Text = codec::from_bytes(&bytes).expect("well formed");
    assert_eq!(doc.to_string(), "bac");
    doc.assert_invariants();
    assert_eq!(codec::to_bytes(&doc), bytes, "canonical");
    let mut a = Text::new(r(5));
    a.insert(0, "a").unwrap();
    a.insert(0, "b").unwrap();
    let mut b = a.fork(r(6));
    b.insert(2, "c").unwrap();
    a.merge(&b);
    assert_eq!(codec::to_bytes(&a), bytes, "what the encoder writes");
    for (replicas, stretches) in [
        (&[0, 0, 1][..], &[0, 0, 0][..]), // one stretch written as two
        (&[0, 1], &[1, 1]),               // a stretch past the entries
        (&[0], &[2]),                     // replica 6's entry given to 5
        (&[0, 2], &[1, 0]),               // no replica 2
        (&[0, 1], &[1]),                  // a stretch without its length
    ] {
        let result = codec::from_bytes::<Text>(&document(replicas, stretches));
        assert!(result.is_err(), "{replicas:?} {stretches:?}: {result:?}");
    }
}

/// As above, in the layout of format version 2 (each number in place,
/// the text's tokens uncoded).
#[test]
fn version_2_document_length_bombs_allocate_nothing() {
    for at in 0..=6 {
        let mut enc = Encoder::new();
        enc.byte(2);
        enc.byte(<Text as codec::Tagged>::TAG);
        let count = |enc: &mut Encoder, n: usize, section: usize| {
            if section == at {
                enc.varint(1 << 60);
                true
            } else {
                enc.length(n);
                false
            }
        };
        if count(&mut enc, 1, 0) {
            assert_length_bomb(&enc.into_bytes());
            continue;
        }
        enc.varint(5); // replica 5, four events
        enc.varint(4);
        enc.varint(3); // three characters ever inserted
        // In document order: "a" (lv 0), "b" (lv 1, deleted), "c" (lv 2).
        if !count(&mut enc, 3, 1) {
            for (lv, packed) in [(0, 1 << 1), (0, 1 << 1 | 1), (0, 1 << 1)] {
                enc.signed_varint(lv);
                enc.varint(packed);
            }
            // "abc" typed at the start: one entry, origins as guessed.
            if !count(&mut enc, 1, 2) {
                enc.varint(0); // counter gap (the replica index is implicit)
                enc.varint(3 << 3); // length 3, both origins guessed
                // Its "b" deleted by event 4.
                if !count(&mut enc, 1, 3) {
                    // Its counter (4) is implicit; its target (lv 1)
                    // ends one before where "abc" ended (lv 3).
                    enc.signed_varint(1);
                    enc.varint(1 << 1);
                    enc.varint(2); // the text: two bytes, compressed to
                    if !count(&mut enc, 3, 4) {
                        enc.raw(&[2, b'a', b'c']); // two literals
                        count(&mut enc, 0, 5);
                    }
                }
            }
        }
        if at == 6 {
            let doc: Text = codec::from_bytes(&enc.into_bytes()).expect("well formed");
            assert_eq!(doc.to_string(), "ac");
            doc.assert_invariants();
        } else {
            assert_length_bomb(&enc.into_bytes());
        }
    }
}

fn assert_length_bomb(bytes: &[u8]) {
    let (result, allocated) = bytes_allocated_by(|| codec::from_bytes::<Text>(bytes));
    assert!(
        matches!(result, Err(DecodeError::LengthOverflow { declared, .. }) if declared == 1 << 60),
        "{result:?}"
    );
    assert!(allocated < 4096, "allocated {allocated} bytes");
}

/// A hidden run that claims two billion characters in a few bytes is
/// refused without building anything of that size.
#[test]
fn huge_hidden_runs_are_refused() {
    let mut enc = Encoder::new();
    enc.byte(1); // the ops layout of format version 1
    enc.byte(<Text as codec::Tagged>::TAG);
    enc.length(1);
    enc.varint(5);
    enc.varint(u64::from(u32::MAX)); // events
    enc.byte(0);
    enc.byte(0);
    enc.byte(0);
    enc.bytes(b"");
    enc.length(1);
    enc.varint(0);
    enc.varint(u64::from(u32::MAX));
    let bytes = enc.into_bytes();
    let (result, allocated) = bytes_allocated_by(|| codec::from_bytes::<Text>(&bytes));
    assert!(result.is_err(), "{result:?}");
    assert!(allocated < 64 * 1024, "allocated {allocated} bytes");
}

/// Counters at the edge of `u64` (from a hostile peer's version vector or
/// op) are handled without overflow: an op past [`MAX_COUNTER`] is refused
/// as invalid, and one that ends there waits for the events before it.
#[test]
fn extreme_counters_do_not_overflow() {
    let mut a = Text::new(r(1));
    a.insert(0, "abc").unwrap();
    let huge: VersionVector = [(r(1), u64::MAX)].into_iter().collect();
    assert!(a.ops_since(&huge).is_empty());
    assert!(a.delta(&huge).to_string().is_empty());
    let op_bytes = |counter: u64| {
        let mut enc = Encoder::new();
        enc.byte(codec::FORMAT_VERSION);
        enc.byte(<TextOp as codec::Tagged>::TAG);
        enc.varint(9); // replica
        enc.varint(counter);
        enc.byte(0); // insert, no origins
        enc.byte(0);
        enc.byte(0);
        enc.bytes(b"xy");
        enc.length(0);
        enc.into_bytes()
    };
    for past in [MAX_COUNTER, u64::MAX - 2] {
        let refused = codec::from_bytes::<TextOp>(&op_bytes(past));
        assert!(
            matches!(refused, Err(DecodeError::Invalid { .. })),
            "{refused:?}"
        );
    }
    let op: TextOp = codec::from_bytes(&op_bytes(MAX_COUNTER - 1)).expect("well formed");
    assert_eq!(a.apply(&op), Ok(Applied::Buffered));
    assert_eq!(a.to_string(), "abc");
    let back: Text = codec::from_bytes(&codec::to_bytes(&a)).expect("decodes");
    assert_eq!(back, a);
}

/// A document whose text was mostly deleted in long stretches encodes to
/// far fewer bytes than it has characters; it loads (its delete entries
/// checked by sorting them, as a bitmap of its characters would outweigh
/// the input) and edits on, for a peer as for a fresh load.
#[test]
fn a_document_of_long_deleted_stretches_loads() {
    let mut t = Text::new(r(1));
    t.insert(0, &"a".repeat(100_000)).unwrap();
    t.insert(50_000, &"bc".repeat(20_000)).unwrap();
    t.delete(10..99_990).unwrap();
    t.delete(5..40_015).unwrap();
    let bytes = codec::to_bytes(&t);
    assert!(bytes.len() < 1_000, "{} bytes", bytes.len());
    let mut back: Text = codec::from_bytes(&bytes).expect("decodes");
    assert_eq!(back, t);
    assert_eq!(back.to_string(), "aaaaaaaaaa");
    assert_eq!(codec::to_bytes(&back), bytes);
    let op = back.insert(5, "x").unwrap();
    t.apply(&op).unwrap();
    assert_eq!(t.to_string(), "aaaaaxaaaaa");
}

/// A document that gives a replica more events than [`MAX_COUNTER`] is
/// refused at its replica list, before any of its counters is kept.
#[test]
fn a_document_past_max_counter_is_refused() {
    let mut t = Text::new(r(300));
    t.insert(0, "a").unwrap();
    let bytes = codec::to_bytes(&t);
    let field = |known: u64| {
        let mut enc = Encoder::new();
        enc.length(1);
        enc.varint(300);
        enc.varint(known);
        enc.into_bytes()
    };
    let (list, past) = (field(1), field(MAX_COUNTER + 1));
    let at = bytes
        .windows(list.len())
        .position(|w| w == list)
        .expect("the replica list");
    assert!(at < 8, "the replica list opens the document");
    let patched = [&bytes[..at], &past[..], &bytes[at + list.len()..]].concat();
    match codec::from_bytes::<Text>(&patched) {
        Err(DecodeError::Invalid { what, .. }) => assert!(what.contains("past the last counter")),
        other => panic!("{other:?}"),
    }
}

/// Decodes `bytes`, a document written in format `version`, checks it
/// reads `text` and is written back in today's version, stably, and that
/// cutting the old bytes anywhere is an error, never a panic; returns the
/// document and today's bytes.
fn old_document(bytes: &[u8], version: u8, text: &str) -> (Text, Vec<u8>) {
    assert_eq!(bytes[0], version);
    let doc: Text = codec::from_bytes(bytes).expect("an old document decodes");
    assert_eq!(doc.to_string(), text);
    doc.assert_invariants();
    let now = codec::to_bytes(&doc);
    assert_eq!(now[0], codec::FORMAT_VERSION);
    let back: Text = codec::from_bytes(&now).expect("and reads back");
    assert_eq!(back, doc);
    assert_eq!(codec::to_bytes(&back), now);
    for cut in 0..bytes.len() {
        assert!(codec::from_bytes::<Text>(&bytes[..cut]).is_err());
    }
    (doc, now)
}

/// A document written in format version 2 (runs, entries and tokens
/// uncoded; three replicas, deletions, a buffered op) decodes to the
/// text it had, and is written back in today's layout.
#[test]
fn a_document_in_format_version_2_keeps_its_text() {
    let text = include_str!("data/text_format_2.txt");
    let (doc, _) = old_document(include_bytes!("data/text_format_2.bin"), 2, text);
    assert_eq!(doc.buffered_ops(), 1);
}

/// A document written in format version 3, whose compressed text was
/// parsed probing every place (version 4's compressor probes stretches
/// without copies more and more sparsely), decodes to the text it had
/// under its own version's rule, and is written back in today's. The
/// same bytes labelled version 4 are refused: each version's text is
/// checked against its own rule, never reinterpreted.
#[test]
fn a_document_in_format_version_3_keeps_its_text() {
    let bytes = include_bytes!("data/text_format_3.bin");
    let (_, now) = old_document(bytes, 3, include_str!("data/text_format_3.txt"));
    assert_ne!(
        now[1..],
        bytes[1..],
        "today's compressor parses it otherwise"
    );
    let mut relabelled = bytes.to_vec();
    relabelled[0] = codec::FORMAT_VERSION;
    match codec::from_bytes::<Text>(&relabelled) {
        Err(DecodeError::Invalid { what, .. }) => assert!(what.contains("canonical"), "{what}"),
        other => panic!("{other:?}"),
    }
}

/// A document encoded before local inserts took the reference origins
/// (the visible character before, the next item after, deleted or not)
/// decodes to the text it had: ops carry their origins, and decoding
/// integrates them as they were sent, never re-deriving them from
/// positions. The same edits made today read ">A Xslow uickcatn fox".
#[test]
fn a_document_encoded_under_the_old_origin_rule_keeps_its_text() {
    let bytes = include_bytes!("data/text_before_reference_origins.bin");
    let text = include_str!("data/text_before_reference_origins.txt");
    let doc: Text = codec::from_bytes(bytes).expect("an old document decodes");
    assert_eq!(doc.to_string(), text);
    assert_eq!(doc.to_string(), ">A Xuickslow catn fox");
    doc.assert_invariants();
    let now = codec::to_bytes(&doc);
    assert_eq!(
        now[0],
        codec::FORMAT_VERSION,
        "it is written in today's layout"
    );
    let back: Text = codec::from_bytes(&now).expect("and reads back");
    assert_eq!(back, doc);
    assert_eq!(codec::to_bytes(&back), now);
}
