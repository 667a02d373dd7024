//! Concurrent editing scenarios for `Text` against diamond-types: the
//! B1–B3 family of dmonad's crdt-benchmarks, each at `n` and `4n`
//! characters so growth shows.
//!
//! Every scenario is a set of users editing from the same empty document
//! without seeing each other: B1 one user (no concurrency: appending,
//! prepending, random inserts, random inserts and deletes), B2 two users
//! doing the same concurrently, B3 twenty and √n users typing backward
//! (each keystroke at the start, all at one place), and √n users at
//! random places (inserts, or inserts and deletes).
//! The main timed step is **merge**: a replica with nothing receives every
//! user's history as that library's update bytes, one user after another,
//! and integrates it. Both libraries' merged texts are checked equal
//! before anything is timed (they follow the same ordering rule). The
//! users' **local edits** are timed too, as the traces' local replay is:
//! each user's edits replayed on a fresh copy of its starting document
//! (calm's `replace`, diamond-types' `insert` and
//! `delete_without_content`).

use calm::causal::{ReplicaId, VersionVector};
use calm::text::Text;
use calm::{DeltaMerge, Merge, codec};
use diamond_types::list::ListCRDT;
use diamond_types::list::encoding::{ENCODE_FULL, ENCODE_PATCH};

use crate::harness::{Figure, Row, Side, compare_rounds, compare_uneven, format_ratio};
use crate::rng::Rng;

/// Rounds of a side whose merge takes [`QUICK`] or more (a round of the
/// largest scenario takes seconds).
const ROUNDS: usize = 3;

/// Rounds of a side that merges in less than [`QUICK`]: a median of many
/// short rounds, alternating with the other side's, because this
/// machine's speed moves by a third within seconds.
const QUICK_ROUNDS: usize = 15;

/// A merge this fast gets [`QUICK_ROUNDS`].
const QUICK: std::time::Duration = std::time::Duration::from_millis(20);

/// Where a user's edits go.
#[derive(Clone, Copy)]
enum Shape {
    /// Each character after the last.
    Append,
    /// Each character at the start (typing backward).
    Prepend,
    /// Each character at a random place.
    RandomInsert,
    /// A random insert, or (one time in three) a random one-character
    /// delete.
    RandomEdit,
}

/// A scenario: `users` users, each making its share of `n` edits.
struct Scenario {
    name: &'static str,
    /// How many users, given `n`.
    users: fn(usize) -> usize,
    shape: Shape,
    /// Whether the users start from a shared document, where one more
    /// user typed `n / 4` characters backward at the start (so they carry
    /// on a backward run that all of them have seen).
    shared: bool,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "B1.1 append, 1 user",
        users: |_| 1,
        shape: Shape::Append,
        shared: false,
    },
    Scenario {
        name: "B1.3 prepend, 1 user",
        users: |_| 1,
        shape: Shape::Prepend,
        shared: false,
    },
    Scenario {
        name: "B1.4 random inserts, 1 user",
        users: |_| 1,
        shape: Shape::RandomInsert,
        shared: false,
    },
    Scenario {
        name: "B1.7 random inserts and deletes, 1 user",
        users: |_| 1,
        shape: Shape::RandomEdit,
        shared: false,
    },
    Scenario {
        name: "B2 append, 2 users",
        users: |_| 2,
        shape: Shape::Append,
        shared: false,
    },
    Scenario {
        name: "B2 prepend, 2 users",
        users: |_| 2,
        shape: Shape::Prepend,
        shared: false,
    },
    Scenario {
        name: "B2 random inserts, 2 users",
        users: |_| 2,
        shape: Shape::RandomInsert,
        shared: false,
    },
    Scenario {
        name: "B2 random inserts and deletes, 2 users",
        users: |_| 2,
        shape: Shape::RandomEdit,
        shared: false,
    },
    Scenario {
        name: "B2 prepend after a sync, 2 users",
        users: |_| 2,
        shape: Shape::Prepend,
        shared: true,
    },
    Scenario {
        name: "B3 prepend, 20 users",
        users: |_| 20,
        shape: Shape::Prepend,
        shared: false,
    },
    Scenario {
        name: "B3 prepend, √n users",
        users: |n| (n as f64).sqrt() as usize,
        shape: Shape::Prepend,
        shared: false,
    },
    Scenario {
        name: "B3 random inserts, √n users",
        users: |n| (n as f64).sqrt() as usize,
        shape: Shape::RandomInsert,
        shared: false,
    },
    Scenario {
        name: "B3 random inserts and deletes, √n users",
        users: |n| (n as f64).sqrt() as usize,
        shape: Shape::RandomEdit,
        shared: false,
    },
];

/// The smaller size; every scenario also runs at four times it.
const N: usize = 1_000;

/// The metric of every scenario's merge time.
const METRIC: &str = "merge (scenario)";

/// The metric of every scenario's encoded size (the merged document).
const SIZE_METRIC: &str = "encoded size (scenario)";

/// The metric of every scenario's local edits.
const LOCAL_METRIC: &str = "local edits (scenario)";

/// Whether `row` is a scenario's (not a trace's).
pub fn is_scenario(row: &Row) -> bool {
    [METRIC, SIZE_METRIC, LOCAL_METRIC].contains(&row.metric.as_str())
}

/// The scenarios' merge times at `n` and `4n` for calm and diamond-types,
/// with each side's growth (time at `4n` over time at `n`: 4 is linear,
/// 16 quadratic), and the merged document's encoded size at `4n`, as a
/// Markdown table; then the users' local edits at `n` and `4n`, as a
/// second table.
pub fn growth_table(rows: &[Row]) -> String {
    let mut md = format!(
        "Concurrent scenarios (merge, n = {N} and {}): growth is the time at 4n over the time at n (4 is linear, 16 quadratic); size is the merged document encoded.\n\n\
         | scenario | calm, n | calm, 4n | calm growth | diamond-types, n | diamond-types, 4n | diamond-types growth | calm / diamond-types at 4n | size at 4n, calm / diamond-types |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        4 * N
    );
    let find = |name: &str, metric: &str, n: usize| {
        rows.iter()
            .find(|r| r.metric == metric && r.workload == format!("{name}, n = {n}"))
    };
    for s in SCENARIOS {
        let find = |metric: &str, n: usize| find(s.name, metric, n);
        let (Some(small), Some(large)) = (find(METRIC, N), find(METRIC, 4 * N)) else {
            continue;
        };
        let size = find(SIZE_METRIC, 4 * N).map_or(String::new(), |r| {
            format!("{} ({} / {})", format_ratio(r.ratio()), r.ours, r.theirs)
        });
        let growth = |a: Figure, b: Figure| format!("{:.1}", b.value() / a.value());
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.name,
            small.ours,
            large.ours,
            growth(small.ours, large.ours),
            small.theirs,
            large.theirs,
            growth(small.theirs, large.theirs),
            format_ratio(large.ratio()),
            size,
        ));
    }
    md.push_str(&format!(
        "\nLocal edits in the same scenarios (every user's edits replayed on a fresh copy of its starting document, as the traces' local replay: calm's `replace` against diamond-types' `insert` and `delete_without_content`), n = {N} and {}:\n\n\
         | scenario | calm, n | diamond-types, n | calm / diamond-types at n | calm, 4n | diamond-types, 4n | calm / diamond-types at 4n |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        4 * N
    ));
    for s in SCENARIOS {
        let (Some(small), Some(large)) = (
            find(s.name, LOCAL_METRIC, N),
            find(s.name, LOCAL_METRIC, 4 * N),
        ) else {
            continue;
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            s.name,
            small.ours,
            small.theirs,
            format_ratio(small.ratio()),
            large.ours,
            large.theirs,
            format_ratio(large.ratio()),
        ));
    }
    md
}

/// One edit of a user: a one-character insert at a place, or (`None`)
/// the deletion of the character there.
type Edit = (usize, Option<char>);

/// One user's document in both libraries, and the edits that made it.
struct User {
    calm: Text,
    reference: ListCRDT,
    /// The user's edits in order.
    edits: Vec<Edit>,
}

/// The history every user of a scenario with a shared start begins from:
/// calm's document and diamond-types' patch of the same edits.
type Base<'a> = (&'a Text, &'a [u8]);

/// User `u`'s starting document in both libraries (diamond-types' with
/// the user's agent): empty, or a copy of `base`.
fn start(u: usize, base: Option<Base<'_>>) -> (Text, (ListCRDT, u32)) {
    let replica = ReplicaId::new(u as u64 + 1);
    let mut reference = ListCRDT::new();
    let calm = match base {
        Some((doc, patch)) => {
            reference.merge_data_and_ff(patch).expect("merges");
            doc.fork(replica)
        }
        None => Text::new(replica),
    };
    let agent = reference.get_or_create_agent_id(&format!("{:04}", u + 1));
    (calm, (reference, agent))
}

/// Builds user `u`'s document: `edits` edits of `shape`, drawn from `rng`,
/// on top of `base` when given.
fn user(u: usize, base: Option<Base<'_>>, edits: usize, shape: Shape, rng: &mut Rng) -> User {
    let (calm, reference) = start(u, base);
    let mut len = calm.len();
    let mut made = Vec::with_capacity(edits);
    for _ in 0..edits {
        if matches!(shape, Shape::RandomEdit) && len > 0 && rng.below(3) == 0 {
            made.push((rng.below(len as u64) as usize, None));
            len -= 1;
            continue;
        }
        let at = match shape {
            Shape::Append => len,
            Shape::Prepend => 0,
            Shape::RandomInsert | Shape::RandomEdit => rng.below(len as u64 + 1) as usize,
        };
        made.push((at, Some(char::from(b'a' + rng.below(26) as u8))));
        len += 1;
    }
    User {
        calm: calm_edits(calm, &made),
        reference: reference_edits(reference, &made),
        edits: made,
    }
}

/// Each user's edits replayed by `replay` on its fresh document.
fn each_user<D, O>(fresh: Vec<D>, users: &[User], replay: fn(D, &[Edit]) -> O) -> Vec<O> {
    fresh
        .into_iter()
        .zip(users)
        .map(|(doc, u)| replay(doc, &u.edits))
        .collect()
}

/// Replays `edits` on `doc`, calm's local editing path.
fn calm_edits(mut doc: Text, edits: &[Edit]) -> Text {
    for &(at, c) in edits {
        match c {
            Some(c) => doc.replace(at..at, c.encode_utf8(&mut [0; 4])),
            None => doc.replace(at..at + 1, ""),
        }
        .expect("in range");
    }
    doc
}

/// Replays `edits` on `doc` as `agent`, diamond-types' local editing path.
fn reference_edits((mut doc, agent): (ListCRDT, u32), edits: &[Edit]) -> ListCRDT {
    for &(at, c) in edits {
        match c {
            Some(c) => doc.insert(agent, at, c.encode_utf8(&mut [0; 4])),
            None => doc.delete_without_content(agent, at..at + 1),
        };
    }
    doc
}

/// A fresh calm replica merging every history in turn.
fn calm_merge(histories: &[Vec<u8>]) -> Text {
    let mut doc = Text::new(ReplicaId::new(u64::MAX));
    for h in histories {
        let delta: Text = codec::from_bytes(h).expect("decodes");
        doc.merge_owned(delta);
    }
    doc
}

/// A fresh diamond-types replica merging every history in turn.
fn reference_merge(histories: &[Vec<u8>]) -> ListCRDT {
    let mut doc = ListCRDT::new();
    for h in histories {
        doc.merge_data_and_ff(h).expect("merges");
    }
    doc
}

/// Every scenario at `N` and `4 N` (or those whose name contains
/// `filter`), calm's merge against diamond-types'.
pub fn run(filter: Option<&str>) -> Vec<Row> {
    let mut rows = Vec::new();
    for s in SCENARIOS {
        if filter.is_some_and(|f| !s.name.contains(f)) {
            continue;
        }
        for n in [N, 4 * N] {
            let users = (s.users)(n);
            let mut rng = Rng::new(n as u64 ^ 0x00b1_b2b3);
            let base = s
                .shared
                .then(|| user(users, None, n / 4, Shape::Prepend, &mut rng));
            let base_patch = base
                .as_ref()
                .map(|b| b.reference.oplog.encode(ENCODE_PATCH));
            let base = base.as_ref().zip(base_patch.as_deref());
            let base = base.map(|(b, patch)| (&b.calm, patch));
            let docs: Vec<User> = (0..users)
                .map(|u| user(u, base, n / users, s.shape, &mut rng))
                .collect();
            let ours: Vec<Vec<u8>> = docs
                .iter()
                .map(|d| codec::to_bytes(&d.calm.delta(&VersionVector::new())))
                .collect();
            let theirs: Vec<Vec<u8>> = docs
                .iter()
                .map(|d| d.reference.oplog.encode(ENCODE_PATCH))
                .collect();
            let started = std::time::Instant::now();
            let a = calm_merge(&ours);
            let ours_took = started.elapsed();
            let started = std::time::Instant::now();
            let b = reference_merge(&theirs);
            let theirs_took = started.elapsed();
            assert_eq!(
                a.to_string(),
                b.branch.content().to_string(),
                "{}: calm and diamond-types merged to different texts",
                s.name
            );
            eprintln!("{}, n = {n}: {users} users", s.name);
            rows.push(Row {
                workload: format!("{}, n = {n}", s.name),
                metric: SIZE_METRIC.to_owned(),
                peer: "diamond-types".to_owned(),
                ours: Figure::Bytes(codec::to_bytes(&a).len()),
                theirs: Figure::Bytes(b.oplog.encode(ENCODE_FULL).len()),
            });
            let rounds = |took| if took < QUICK { QUICK_ROUNDS } else { ROUNDS };
            let (a, b) = compare_uneven(
                Side::batched(|| (), |()| calm_merge(&ours)),
                Side::batched(|| (), |()| reference_merge(&theirs)),
                [rounds(ours_took), rounds(theirs_took)],
            );
            rows.push(Row {
                workload: format!("{}, n = {n}", s.name),
                metric: METRIC.to_owned(),
                peer: "diamond-types".to_owned(),
                ours: Figure::Time(a),
                theirs: Figure::Time(b),
            });
            let (a, b) = compare_rounds(
                Side::batched(
                    || (0..users).map(|u| start(u, base).0).collect::<Vec<_>>(),
                    |fresh| each_user(fresh, &docs, calm_edits),
                ),
                Side::batched(
                    || (0..users).map(|u| start(u, base).1).collect::<Vec<_>>(),
                    |fresh| each_user(fresh, &docs, reference_edits),
                ),
                QUICK_ROUNDS,
            );
            rows.push(Row {
                workload: format!("{}, n = {n}", s.name),
                metric: LOCAL_METRIC.to_owned(),
                peer: "diamond-types".to_owned(),
                ours: Figure::Time(a),
                theirs: Figure::Time(b),
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of `scenario` at size `n`, timed `ours` and `theirs`.
    fn row(scenario: &str, metric: &str, n: usize, ours: f64, theirs: f64) -> Row {
        Row {
            workload: format!("{scenario}, n = {n}"),
            metric: metric.to_owned(),
            peer: "diamond-types".to_owned(),
            ours: Figure::Time(ours),
            theirs: Figure::Time(theirs),
        }
    }

    /// The table pairs each scenario's two sizes and divides them; trace
    /// rows are not scenarios.
    #[test]
    fn growth_is_the_larger_time_over_the_smaller() {
        let row = |n, ours, theirs| row("B2 prepend, 2 users", METRIC, n, ours, theirs);
        let size = Row {
            metric: SIZE_METRIC.to_owned(),
            ours: Figure::Bytes(100),
            theirs: Figure::Bytes(400),
            ..row(4 * N, 0.0, 0.0)
        };
        let rows = vec![row(N, 1e-3, 1e-2), row(4 * N, 4e-3, 16e-2), size];
        let table = growth_table(&rows);
        let line = table
            .lines()
            .find(|l| l.starts_with("| B2 prepend, 2 users |"))
            .expect("a line for the scenario");
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells[4], "4.0");
        assert_eq!(cells[7], "16.0");
        assert!(cells[9].starts_with("0.25 ("), "{}", cells[9]);
        let scenario_lines = table.lines().filter(|l| l.starts_with("| B")).count();
        assert_eq!(scenario_lines, 1, "only scenarios with both sizes");
        assert!(is_scenario(&rows[0]) && is_scenario(&rows[2]));
    }

    /// The local-edits table gives each scenario's ratio at both sizes.
    #[test]
    fn local_edits_have_their_own_table() {
        let row =
            |n, ours, theirs| row("B1.4 random inserts, 1 user", LOCAL_METRIC, n, ours, theirs);
        let rows = vec![row(N, 3e-3, 2e-3), row(4 * N, 1e-2, 2e-2)];
        assert!(rows.iter().all(is_scenario));
        let table = growth_table(&rows);
        let lines: Vec<&str> = table.lines().filter(|l| l.starts_with("| B")).collect();
        assert_eq!(lines.len(), 1, "no merge rows, so one local-edits line");
        let cells: Vec<&str> = lines[0].split('|').map(str::trim).collect();
        assert_eq!(cells[4], "1.50");
        assert_eq!(cells[7], "0.50");
    }
}
