//! The concurrent editing trace in `tests/data/traces/concurrent`: two
//! users editing one document, each transaction made on the versions the
//! trace names as its parents.
//!
//! Both libraries build the same history from it: calm as one replica
//! per user that receives exactly a transaction's ancestors before making
//! it (`Text::insert` and `Text::delete`, whose ops the other replica
//! applies), diamond-types as ops added at each transaction's parents
//! (`add_insert_at`, `add_delete_at`). A fresh replica then merges the
//! whole history, received as update bytes (calm: a delta against an
//! empty version vector, decoded and merged by value with `merge_owned`;
//! diamond-types: its patch encoding, with `merge_data_and_ff`), and both
//! merged texts are checked against the trace's `endContent` before
//! anything is timed. The merged document's encoded size is the second
//! row.

use std::path::Path;

use calm::causal::{ReplicaId, VersionVector};
use calm::text::{Text, TextOp};
use calm::{DeltaMerge, Merge, codec};
use diamond_types::list::encoding::{ENCODE_FULL, ENCODE_PATCH};
use diamond_types::list::{ListCRDT, OpLog};
use serde_json::Value;

use crate::harness::{Figure, Row, Side, compare_rounds, format_ratio};

/// The metric of the merge time.
const METRIC: &str = "merge (concurrent trace)";

/// The metric of the merged document's encoded size.
const SIZE_METRIC: &str = "encoded size (concurrent trace)";

/// Rounds per side.
const ROUNDS: usize = 5;

/// Whether `row` is the concurrent trace's (kept out of the per-trace
/// summary, which is over the sequential traces).
pub fn is_concurrent(row: &Row) -> bool {
    row.metric == METRIC || row.metric == SIZE_METRIC
}

/// The concurrent trace's merge time and size, calm against
/// diamond-types, as a Markdown table (empty without its rows).
pub fn table(rows: &[Row]) -> String {
    let find = |metric: &str| rows.iter().find(|r| r.metric == metric);
    let (Some(merge), Some(size)) = (find(METRIC), find(SIZE_METRIC)) else {
        return String::new();
    };
    format!(
        "The concurrent trace, merged by a fresh replica from the whole history as update bytes (see `bench/src/concurrent.rs`):\n\n\
         | trace | merge, calm | merge, diamond-types | calm / diamond-types | size, calm / diamond-types |\n\
         | --- | ---: | ---: | ---: | ---: |\n\
         | {} | {} | {} | {} | {} ({} / {}) |\n",
        merge.workload,
        merge.ours,
        merge.theirs,
        format_ratio(merge.ratio()),
        format_ratio(size.ratio()),
        size.ours,
        size.theirs,
    )
}

/// One edit of a transaction.
struct Patch {
    pos: usize,
    del: usize,
    ins: String,
}

/// One transaction: its user, the transactions it was made on, and its
/// edits.
struct Txn {
    agent: usize,
    parents: Vec<usize>,
    patches: Vec<Patch>,
}

/// Reads the trace at `path`: its transactions and final text.
fn load(path: &Path) -> (Vec<Txn>, String) {
    let v = crate::text::read_trace(path);
    let number = |x: &Value| x.as_u64().expect("a number") as usize;
    let txns = v["txns"]
        .as_array()
        .expect("txns")
        .iter()
        .map(|t| Txn {
            agent: number(&t["agent"]),
            parents: t["parents"]
                .as_array()
                .expect("parents")
                .iter()
                .map(number)
                .collect(),
            patches: t["patches"]
                .as_array()
                .expect("patches")
                .iter()
                .map(|p| Patch {
                    pos: number(&p[0]),
                    del: number(&p[1]),
                    ins: p[2].as_str().expect("ins").to_owned(),
                })
                .collect(),
        })
        .collect();
    let end = v["endContent"].as_str().expect("endContent").to_owned();
    (txns, end)
}

/// The whole history as calm builds it: one replica per user, each
/// receiving a transaction's ancestors (and nothing else) before making
/// it; returns every replica merged into one.
fn calm_history(txns: &[Txn]) -> Text {
    let users = txns.iter().map(|t| t.agent + 1).max().unwrap_or(0);
    let mut replicas: Vec<Text> = (0..users)
        .map(|a| Text::new(ReplicaId::new(a as u64 + 1)))
        .collect();
    let mut delivered = vec![vec![false; txns.len()]; users];
    let mut ops: Vec<Vec<TextOp>> = Vec::with_capacity(txns.len());
    for (i, txn) in txns.iter().enumerate() {
        let (a, seen) = (txn.agent, &mut delivered[txn.agent]);
        let mut need = Vec::new();
        let mut stack = txn.parents.clone();
        while let Some(t) = stack.pop() {
            if !seen[t] {
                seen[t] = true;
                need.push(t);
                stack.extend(&txns[t].parents);
            }
        }
        need.sort_unstable();
        for t in need {
            for op in &ops[t] {
                replicas[a].apply(op).expect("an op of an ancestor applies");
            }
        }
        let mut made = Vec::new();
        for p in &txn.patches {
            if p.del > 0 {
                made.push(replicas[a].delete(p.pos..p.pos + p.del).expect("in range"));
            }
            if !p.ins.is_empty() {
                made.push(replicas[a].insert(p.pos, &p.ins).expect("in range"));
            }
        }
        seen[i] = true;
        ops.push(made);
    }
    let mut all = Text::new(ReplicaId::new(u64::MAX));
    for r in &replicas {
        all.merge(r);
    }
    all
}

/// The whole history as diamond-types builds it: each edit added at the
/// version it was made on.
fn reference_history(txns: &[Txn]) -> OpLog {
    let mut oplog = OpLog::new();
    let users = txns.iter().map(|t| t.agent + 1).max().unwrap_or(0);
    let agents: Vec<_> = (0..users)
        .map(|a| oplog.get_or_create_agent_id(&format!("user {a}")))
        .collect();
    // Each transaction's version once made: its last op, or its parents'
    // versions if it made none.
    let mut versions: Vec<Vec<usize>> = Vec::with_capacity(txns.len());
    for txn in txns {
        let mut at: Vec<usize> = txn
            .parents
            .iter()
            .flat_map(|&t| versions[t].iter().copied())
            .collect();
        at.sort_unstable();
        at.dedup();
        for p in &txn.patches {
            if p.del > 0 {
                at = vec![oplog.add_delete_at(agents[txn.agent], &at, p.pos..p.pos + p.del)];
            }
            if !p.ins.is_empty() {
                at = vec![oplog.add_insert_at(agents[txn.agent], &at, p.pos, &p.ins)];
            }
        }
        versions.push(at);
    }
    oplog
}

/// A fresh calm replica merging `history`.
fn calm_merge(history: &[u8]) -> Text {
    let delta: Text = codec::from_bytes(history).expect("decodes");
    let mut doc = Text::new(ReplicaId::new(u64::MAX - 1));
    doc.merge_owned(delta);
    doc
}

/// A fresh diamond-types replica merging `history`.
fn reference_merge(history: &[u8]) -> ListCRDT {
    let mut doc = ListCRDT::new();
    doc.merge_data_and_ff(history).expect("merges");
    doc
}

/// The concurrent trace's rows (none if `filter` is given and its name
/// does not contain it).
pub fn run(filter: Option<&str>) -> Vec<Row> {
    let name = "friendsforever (concurrent, 2 users)";
    if filter.is_some_and(|f| !name.contains(f)) {
        return Vec::new();
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/traces/concurrent/friendsforever.json.gz");
    let (txns, end) = load(&path);
    eprintln!("{name}: {} transactions", txns.len());
    let ours = codec::to_bytes(&calm_history(&txns).delta(&VersionVector::new()));
    let theirs = reference_history(&txns).encode(ENCODE_PATCH);
    let (a, b) = (calm_merge(&ours), reference_merge(&theirs));
    assert!(a.to_string() == end, "calm merged {name} wrong");
    assert!(
        b.branch.content().to_string() == end,
        "diamond-types merged {name} wrong"
    );
    let row = |metric: &str, ours, theirs| Row {
        workload: name.to_owned(),
        metric: metric.to_owned(),
        peer: "diamond-types".to_owned(),
        ours,
        theirs,
    };
    let mut rows = vec![row(
        SIZE_METRIC,
        Figure::Bytes(codec::to_bytes(&a).len()),
        Figure::Bytes(b.oplog.encode(ENCODE_FULL).len()),
    )];
    let (a, b) = compare_rounds(
        Side::batched(|| (), |()| calm_merge(&ours)),
        Side::batched(|| (), |()| reference_merge(&theirs)),
        ROUNDS,
    );
    rows.push(row(METRIC, Figure::Time(a), Figure::Time(b)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table divides calm's figures by diamond-types', and needs both
    /// rows; the rows are told apart from the sequential traces'.
    #[test]
    fn the_table_shows_both_ratios() {
        let row = |metric: &str, ours, theirs| Row {
            workload: "t".to_owned(),
            metric: metric.to_owned(),
            peer: "diamond-types".to_owned(),
            ours,
            theirs,
        };
        let merge = row(METRIC, Figure::Time(1e-3), Figure::Time(4e-3));
        let size = row(SIZE_METRIC, Figure::Bytes(50), Figure::Bytes(100));
        assert!(table(std::slice::from_ref(&merge)).is_empty());
        let t = table(&[size.clone(), merge.clone()]);
        let line = t.lines().last().expect("a row");
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells[4], "0.25", "{line}");
        assert!(cells[5].starts_with("0.50 ("), "{line}");
        assert!(is_concurrent(&merge) && is_concurrent(&size));
        assert!(!is_concurrent(&row(
            "load",
            Figure::Bytes(1),
            Figure::Bytes(1)
        )));
    }
}
