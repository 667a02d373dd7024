//! calm's CRDTs against the `crdts` crate: merge, delta merge and encoded
//! size on one workload.
//!
//! The workload: 8 replicas each insert 1,250 elements (10,000 in all),
//! sync fully, then each removes 10% of the elements at random and inserts
//! 125 new ones, offline. Then
//!
//! - **merge**: fold the 8 divergent states into one;
//! - **delta merge**: a replica still at the synced state catches up with
//!   the 7 others. calm computes `delta(vv)` at each sender and merges it;
//!   `crdts` has no delta sync, so it merges each full state;
//! - **size**: the converged state encoded (calm's codec, `crdts` with
//!   bincode), and the bytes shipped for the catch-up.
//!
//! Every run checks that calm and the peer end with the same contents.

use calm::causal::ReplicaId;
use calm::{DeltaMerge, Merge, OrMap, OrSet, PnCounter, codec};
use crdts::{CmRDT, CvRDT};

use crate::harness::{Figure, Row, Side, compare, time_row};
use crate::rng::Rng;

const REPLICAS: usize = 8;
const PER_REPLICA: u64 = 1_250;
const DIVERGE: u64 = 125;

pub(crate) type Orswot = crdts::Orswot<u64, u64>;
type CMap = crdts::Map<u64, crdts::PNCounter<u64>, u64>;

/// One element-level edit of the workload, replayed on both libraries.
#[derive(Clone, Copy)]
pub(crate) enum Edit {
    Insert(u64),
    Remove(u64),
}

/// The edits of each replica in the synced phase and the divergent phase.
pub(crate) struct Workload {
    initial: Vec<Vec<Edit>>,
    divergent: Vec<Vec<Edit>>,
}

pub(crate) fn workload() -> Workload {
    let mut rng = Rng::new(7);
    let initial = (0..REPLICAS as u64)
        .map(|r| {
            (0..PER_REPLICA)
                .map(|i| Edit::Insert(r * PER_REPLICA + i))
                .collect()
        })
        .collect();
    let total = REPLICAS as u64 * PER_REPLICA;
    let divergent = (0..REPLICAS as u64)
        .map(|r| {
            let mut edits = Vec::new();
            for i in 0..DIVERGE {
                edits.push(Edit::Remove(rng.below(total)));
                edits.push(Edit::Insert(total + r * DIVERGE + i));
            }
            edits
        })
        .collect();
    Workload { initial, divergent }
}

/// Replays the workload on any library: `apply` does one edit as replica
/// `r`, `merge` folds one state into another. Returns the synced state and
/// the 8 divergent states.
pub(crate) fn replay<S: Clone + Default>(
    w: &Workload,
    apply: impl Fn(&mut S, u64, Edit),
    merge: impl Fn(&mut S, &S),
) -> (S, Vec<S>) {
    let mut synced = S::default();
    for (r, edits) in w.initial.iter().enumerate() {
        let mut s = S::default();
        for &e in edits {
            apply(&mut s, r as u64, e);
        }
        merge(&mut synced, &s);
    }
    let divergent = w
        .divergent
        .iter()
        .enumerate()
        .map(|(r, edits)| {
            let mut s = synced.clone();
            for &e in edits {
                apply(&mut s, r as u64, e);
            }
            s
        })
        .collect();
    (synced, divergent)
}

pub(crate) fn calm_set(s: &mut OrSet<u64>, r: u64, e: Edit) {
    match e {
        Edit::Insert(x) => {
            s.insert(ReplicaId::new(r), x);
        }
        Edit::Remove(x) => {
            s.remove(&x);
        }
    }
}

pub(crate) fn peer_set(s: &mut Orswot, r: u64, e: Edit) {
    match e {
        Edit::Insert(x) => {
            let ctx = s.read_ctx().derive_add_ctx(r);
            s.apply(s.add(x, ctx));
        }
        Edit::Remove(x) => {
            let ctx = s.contains(&x).derive_rm_ctx();
            s.apply(s.rm(x, ctx));
        }
    }
}

fn calm_map(m: &mut OrMap<u64, PnCounter>, r: u64, e: Edit) {
    let id = ReplicaId::new(r);
    match e {
        Edit::Insert(k) => m.update(id, k, |c| c.increment(id, 1)),
        Edit::Remove(k) => {
            m.remove(&k);
        }
    }
}

fn peer_map(m: &mut CMap, r: u64, e: Edit) {
    match e {
        Edit::Insert(k) => {
            let ctx = m.read_ctx().derive_add_ctx(r);
            m.apply(m.update(k, ctx, |c, ctx| c.inc(ctx.dot.actor)));
        }
        Edit::Remove(k) => {
            let ctx = m.get(&k).derive_rm_ctx();
            m.apply(m.rm(k, ctx));
        }
    }
}

/// Measures one pair of types on the workload.
#[allow(clippy::too_many_arguments)]
fn pair<C, P>(
    rows: &mut Vec<Row>,
    name: &str,
    peer: &str,
    calm: (C, Vec<C>),
    theirs: (P, Vec<P>),
    same: impl Fn(&C, &P) -> bool,
    peer_bytes: impl Fn(&P) -> usize,
) where
    C: DeltaMerge + Clone + codec::Tagged + PartialEq + std::fmt::Debug,
    P: CvRDT + Clone + Default,
{
    let (c_synced, c_div) = calm;
    let (p_synced, p_div) = theirs;

    // The converged results must agree before anything is timed.
    let mut c_all = c_div[0].clone();
    for s in &c_div[1..] {
        c_all.merge(s);
    }
    let mut p_all = p_div[0].clone();
    for s in &p_div[1..] {
        p_all.merge(s.clone());
    }
    assert!(
        same(&c_all, &p_all),
        "{name}: calm and {peer} disagree after merging"
    );
    let mut c_caught_up = c_synced.clone();
    for s in &c_div[1..] {
        c_caught_up.merge(&s.delta(&c_synced.version_vector()));
    }
    let mut c_full = c_synced.clone();
    for s in &c_div[1..] {
        c_full.merge(s);
    }
    assert_eq!(
        c_caught_up, c_full,
        "{name}: delta catch-up differs from full merge"
    );

    let (ours, theirs_t) = compare(
        Side::batched(
            || (c_div[0].clone(), c_div[1..].to_vec()),
            |(mut acc, rest): (C, Vec<C>)| {
                for s in &rest {
                    acc.merge(s);
                }
                acc
            },
        ),
        Side::batched(
            || (p_div[0].clone(), p_div[1..].to_vec()),
            |(mut acc, rest): (P, Vec<P>)| {
                for s in rest {
                    acc.merge(s);
                }
                acc
            },
        ),
    );
    rows.push(time_row(
        name,
        "merge 8 divergent replicas",
        peer,
        (ours, theirs_t),
    ));

    let (ours, theirs_t) = compare(
        Side::batched(
            || (c_synced.clone(), c_div[1..].to_vec()),
            |(mut acc, senders): (C, Vec<C>)| {
                let vv = acc.version_vector();
                for s in &senders {
                    acc.merge(&s.delta(&vv));
                }
                acc
            },
        ),
        Side::batched(
            || (p_synced.clone(), p_div[1..].to_vec()),
            |(mut acc, senders): (P, Vec<P>)| {
                for s in senders {
                    acc.merge(s);
                }
                acc
            },
        ),
    );
    rows.push(time_row(
        name,
        "catch up with 7 replicas (calm: delta; peer: full state)",
        peer,
        (ours, theirs_t),
    ));

    rows.push(Row {
        workload: name.into(),
        metric: "encoded converged state".into(),
        peer: format!("{peer} + bincode"),
        ours: Figure::Bytes(codec::to_bytes(&c_all).len()),
        theirs: Figure::Bytes(peer_bytes(&p_all)),
    });
    let vv = c_synced.version_vector();
    let delta_bytes: usize = c_div[1..]
        .iter()
        .map(|s| codec::to_bytes(&s.delta(&vv)).len())
        .sum();
    let peer_state_bytes: usize = p_div[1..].iter().map(&peer_bytes).sum();
    rows.push(Row {
        workload: name.into(),
        metric: "bytes shipped to catch up with 7 replicas".into(),
        peer: format!("{peer} + bincode"),
        ours: Figure::Bytes(delta_bytes),
        theirs: Figure::Bytes(peer_state_bytes),
    });
}

fn bincode_len<T: serde::Serialize>(v: &T) -> usize {
    bincode::serialize(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

/// Runs every CRDT comparison and returns the rows.
pub fn run() -> Vec<Row> {
    let w = workload();
    let mut rows = Vec::new();

    pair(
        &mut rows,
        "OrSet<u64>, 10k elements, 8 replicas, 10% removes",
        "crdts::Orswot",
        replay(&w, calm_set, |a: &mut OrSet<u64>, b| a.merge(b)),
        replay(&w, peer_set, |a: &mut Orswot, b| CvRDT::merge(a, b.clone())),
        |c, p| {
            let mut theirs: Vec<u64> = p.read().val.into_iter().collect();
            theirs.sort_unstable();
            c.iter().copied().eq(theirs)
        },
        bincode_len,
    );

    pair(
        &mut rows,
        "OrMap<u64, PnCounter>, 10k keys, 8 replicas, 10% removes",
        "crdts::Map<_, PNCounter>",
        replay(&w, calm_map, |a: &mut OrMap<u64, PnCounter>, b| a.merge(b)),
        replay(&w, peer_map, |a: &mut CMap, b| CvRDT::merge(a, b.clone())),
        |c, p| {
            let keys: Vec<u64> = p.keys().map(|k| *k.val).collect();
            c.len() == keys.len() && keys.iter().all(|k| c.contains_key(k))
        },
        bincode_len,
    );

    // Counter: 10,000 increments over 8 replicas, 10% of them decrements.
    let counter_w = Workload {
        initial: (0..REPLICAS as u64)
            .map(|_| {
                (0..PER_REPLICA)
                    .map(|i| {
                        if i % 10 == 0 {
                            Edit::Remove(1)
                        } else {
                            Edit::Insert(1)
                        }
                    })
                    .collect()
            })
            .collect(),
        divergent: (0..REPLICAS)
            .map(|_| (0..DIVERGE).map(Edit::Insert).collect())
            .collect(),
    };
    pair(
        &mut rows,
        "PnCounter, 10k updates, 8 replicas, 10% decrements",
        "crdts::PNCounter",
        replay(
            &counter_w,
            |c: &mut PnCounter, r, e| match e {
                Edit::Insert(_) => c.increment(ReplicaId::new(r), 1),
                Edit::Remove(_) => c.decrement(ReplicaId::new(r), 1),
            },
            |a, b| a.merge(b),
        ),
        replay(
            &counter_w,
            |c: &mut crdts::PNCounter<u64>, r, e| match e {
                Edit::Insert(_) => c.apply(c.inc(r)),
                Edit::Remove(_) => c.apply(c.dec(r)),
            },
            |a: &mut crdts::PNCounter<u64>, b| CvRDT::merge(a, b.clone()),
        ),
        |c, p| p.read() == num_bigint::BigInt::from(c.value()),
        bincode_len,
    );
    rows
}
