//! Writes the seed corpus of the fuzz targets (`fuzz/seeds/`) from states
//! the law harness's operations produce. Run with
//! `CALM_WRITE_FUZZ_SEEDS=1 cargo test --all-features --test main fuzz_seeds -- --ignored`.

use std::path::Path;

use calm::causal::ReplicaId;
use calm::codec::{self, Encoder, Tagged};
use calm::text::Text;
use calm::{GCounter, GSet, LwwRegister, MvRegister, OrMap, OrSet, PnCounter, TwoPhaseSet};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn seed<T: Tagged>(target: &str, selector: u8, value: &T) {
    let mut bytes = vec![selector];
    bytes.extend(codec::to_bytes(value));
    write(target, &format!("seed-{selector:02}"), &bytes);
}

/// Writes one seed per decoder, and a text op stream.
#[test]
#[ignore = "writes files; run by hand to refresh the fuzz seeds"]
fn fuzz_seeds() {
    if std::env::var("CALM_WRITE_FUZZ_SEEDS").is_err() {
        return;
    }
    let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
    let mut g = GCounter::new();
    g.increment(a, 3);
    g.increment(b, 300);
    seed("decode_crdts", 0, &g);
    let mut pn = PnCounter::new();
    pn.increment(a, 5);
    pn.decrement(b, 2);
    seed("decode_crdts", 1, &pn);
    seed(
        "decode_crdts",
        2,
        &["x".to_string(), "yz".to_string()]
            .into_iter()
            .collect::<GSet<String>>(),
    );
    let mut tp = TwoPhaseSet::new();
    tp.insert(1u64);
    tp.insert(2);
    tp.remove(&1);
    seed("decode_crdts", 3, &tp);
    let mut or = OrSet::new();
    or.insert(a, "k".to_string());
    or.insert(b, "l".to_string());
    or.remove(&"k".to_string());
    seed("decode_crdts", 4, &or);
    let mut lww = LwwRegister::new(String::new());
    lww.set(a, "v".into());
    seed("decode_crdts", 5, &lww);
    let mut mv = MvRegister::new();
    mv.set(a, 7u64);
    let mut mv2 = MvRegister::new();
    mv2.set(b, 8u64);
    calm::Merge::merge(&mut mv, &mv2);
    seed("decode_crdts", 6, &mv);
    let mut m: OrMap<String, PnCounter> = OrMap::new();
    m.update(a, "c".into(), |c| c.increment(a, 2));
    seed("decode_crdts", 7, &m);
    seed("decode_crdts", 9, &or.context().version_vector());
    seed("decode_crdts", 10, or.context());
    seed(
        "decode_crdts",
        11,
        &calm::occ::Versioned::new(calm::occ::Version::new(4), "v".to_string()),
    );

    let mut doc = Text::new(a);
    let mut ops = Vec::new();
    ops.push(doc.insert(0, "hello wörld 😀").unwrap());
    ops.push(doc.delete(2..4).unwrap());
    let mut other = doc.fork(b);
    ops.push(other.insert(3, "日本").unwrap());
    seed("decode_text", 0, &doc);
    seed("decode_text", 1, &ops[0]);
    // Concurrent typing at one place and backspacing, merged: a document
    // with several replicas, tombstones and sibling insertions.
    let mut merged = doc.fork(ReplicaId::new(3));
    merged.insert(5, "xyz").unwrap();
    merged.delete(6..7).unwrap();
    calm::Merge::merge(&mut merged, &other);
    seed("decode_text", 2, &merged);
    // The same document in format version 1, which is still read.
    let old = include_bytes!("data/text_before_reference_origins.bin");
    write("decode_text", "seed-04", &[&[4u8][..], old].concat());
    let mut stream = Encoder::new();
    for op in ops.iter().rev() {
        stream.bytes(&codec::to_bytes(op));
    }
    write("apply_text_ops", "seed-reversed", &stream.into_bytes());

    seed(
        "decode_store_values",
        0,
        &calm::occ::Versioned::new(calm::occ::Version::new(9), 9u64),
    );

    #[cfg(feature = "automerge")]
    {
        use automerge::transaction::Transactable;
        let mut doc = calm::adapt::automerge::Document::new();
        let empty = doc.heads();
        doc.edit(|d| {
            d.put(automerge::ROOT, "key", "value").unwrap();
        });
        write("decode_automerge", "seed-doc", &codec::to_bytes(&doc));
        write(
            "decode_automerge",
            "seed-changes",
            &doc.changes_since(&empty),
        );
    }
}
