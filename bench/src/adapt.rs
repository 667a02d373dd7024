//! The adapters' cost: `crdts::Orswot` merged through calm's `Merge`
//! adapter against calm's own `OrSet`, and an automerge document merged
//! through `merge_into` on a store against a direct `AutoCommit::merge`.

use automerge::transaction::Transactable;
use automerge::{ActorId, AutoCommit, ROOT, ReadDoc};
use calm::adapt::automerge::Document;
use calm::store::{MemoryStore, StoreExt};
use calm::{Merge, OrSet};

use crate::crdt::{Orswot, calm_set, peer_set, replay, workload};
use crate::harness::{Row, Side, compare, now, time_row};

/// A document with `n` keys written by `actor`, forked from `base`.
fn edited(base: &AutoCommit, actor: u64, n: usize) -> AutoCommit {
    let mut d = base.clone();
    d.set_actor(ActorId::from(actor.to_be_bytes().to_vec()));
    for i in 0..n {
        d.put(ROOT, format!("a{actor}-{i}"), i as i64).expect("put");
    }
    d.commit();
    d
}

/// Runs the adapter comparisons.
pub fn run() -> Vec<Row> {
    let mut rows = Vec::new();
    let w = workload();
    let (_, calm) = replay(&w, calm_set, |a: &mut OrSet<u64>, b| a.merge(b));
    let (_, peer) = replay(&w, peer_set, |a: &mut Orswot, b| Merge::merge(a, b));
    rows.push(time_row(
        "OrSet vs Orswot, 10k elements, 8 replicas, 10% removes",
        "merge 8 replicas through Merge",
        "crdts::Orswot via calm's adapter",
        compare(
            Side::batched(
                || calm.clone(),
                |states: Vec<OrSet<u64>>| {
                    let mut acc = states[0].clone();
                    for s in &states[1..] {
                        acc.merge(s);
                    }
                    acc
                },
            ),
            Side::batched(
                || peer.clone(),
                |states: Vec<Orswot>| {
                    let mut acc = states[0].clone();
                    for s in &states[1..] {
                        Merge::merge(&mut acc, s);
                    }
                    acc
                },
            ),
        ),
    ));

    // automerge: a base document of 1,000 keys, then 8 writers add 20
    // keys each; everything is merged into one document.
    let mut base = AutoCommit::new();
    base.set_actor(ActorId::from(vec![0xff]));
    for i in 0..1000 {
        base.put(ROOT, format!("base-{i}"), i as i64).expect("put");
    }
    base.commit();
    let writers: Vec<AutoCommit> = (0..8).map(|a| edited(&base, a, 20)).collect();
    let docs: Vec<Document> = writers.iter().cloned().map(Document::from).collect();
    let expected = 1000 + 8 * 20;
    rows.push(time_row(
        "automerge, 1,000-key document, 8 writers × 20 keys",
        "fold the 8 writers in",
        "AutoCommit::merge, in memory",
        compare(
            Side::batched(
                || {
                    let store = MemoryStore::new();
                    now(store.merge_into(b"doc", &Document::from(base.clone()))).expect("seed");
                    (store, docs.clone())
                },
                |(store, docs): (MemoryStore, Vec<Document>)| {
                    for d in &docs {
                        now(store.merge_into(b"doc", d)).expect("merge_into");
                    }
                    let out: Document = now(store.read_merged(b"doc"))
                        .expect("read")
                        .expect("present");
                    assert_eq!(out.doc().keys(ROOT).count(), expected);
                    out
                },
            ),
            Side::batched(
                || (base.clone(), writers.clone()),
                |(mut acc, mut writers): (AutoCommit, Vec<AutoCommit>)| {
                    for w in &mut writers {
                        acc.merge(w).expect("merge");
                    }
                    assert_eq!(acc.keys(ROOT).count(), expected);
                    acc
                },
            ),
        ),
    ));
    rows
}
