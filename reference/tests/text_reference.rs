//! calm's `Text` against diamond-types, the reference implementation of
//! the ordering rule calm follows: random concurrent editing sessions of
//! 2–5 replicas (typing forward and backward, pasting, deleting, syncing
//! pairwise in random order), each edit made on both a calm replica and a
//! diamond-types replica of the same agent, must read the same text on
//! every replica after every sync, and the same everywhere at the end.
//!
//! `CALM_TEXT_SCENARIOS` sets how many sessions run (default 100,000;
//! about a second or two in release). A failure prints the seed and the
//! session's steps, so it replays with `CALM_TEXT_SEED`.

use calm::Merge;
use calm::causal::ReplicaId;
use calm::text::Text;
use diamond_types::list::ListCRDT;

#[allow(dead_code)]
#[path = "../../bench/src/rng.rs"]
mod rng;

use rng::Rng;

/// One replica, kept as both implementations.
struct Replica {
    calm: Text,
    reference: ListCRDT,
    /// This replica's agent in `reference`.
    agent: diamond_types::AgentId,
}

impl Replica {
    /// Replica `i` (agent name `i + 1`, zero-padded, replica id `i + 1`: the two
    /// implementations break ties between concurrent inserts by the same
    /// order).
    fn new(i: usize) -> Self {
        let mut reference = ListCRDT::new();
        // Zero-padded: diamond-types orders agents by name as strings.
        let agent = reference.get_or_create_agent_id(&format!("{:04}", i + 1));
        Self {
            calm: Text::new(ReplicaId::new(i as u64 + 1)),
            reference,
            agent,
        }
    }

    fn insert(&mut self, pos: usize, text: &str) {
        self.calm.insert(pos, text).expect("an in-bounds insert");
        self.reference.insert(self.agent, pos, text);
    }

    fn delete(&mut self, start: usize, end: usize) {
        self.calm.delete(start..end).expect("an in-bounds delete");
        self.reference
            .delete_without_content(self.agent, start..end);
    }

    /// Takes in everything `from` has.
    fn sync_from(&mut self, from: &Replica) {
        self.calm.merge(&from.calm);
        self.reference
            .oplog
            .add_missing_operations_from(&from.reference.oplog);
        let version = self.reference.oplog.local_version();
        self.reference.branch.merge(&self.reference.oplog, &version);
    }

    fn texts(&self) -> (String, String) {
        (
            self.calm.to_string(),
            self.reference.branch.content().to_string(),
        )
    }
}

/// Runs session `seed`; returns its steps, and the first difference found.
fn session(seed: u64) -> (Vec<String>, Option<String>) {
    let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed);
    let n = 2 + rng.below(4) as usize;
    let mut replicas: Vec<Replica> = (0..n).map(Replica::new).collect();
    let mut steps = Vec::new();
    let letters = ['a', 'b', 'c', 'x', 'y', 'é', '😀'];
    let letter = |rng: &mut Rng| letters[rng.below(letters.len() as u64) as usize];
    // Where each replica last typed backward, to carry on there (long
    // backward runs, interleaved with syncs, make long chains of siblings).
    let mut backward_at: Vec<Option<usize>> = vec![None; n];
    for _ in 0..4 + rng.below(24) {
        let r = rng.below(n as u64) as usize;
        let len = replicas[r].calm.len();
        match rng.below(100) {
            // Typing forward: each character after the previous one.
            0..=24 => {
                let pos = rng.below(len as u64 + 1) as usize;
                let count = 1 + rng.below(4) as usize;
                let typed: String = (0..count).map(|_| letter(&mut rng)).collect();
                for (i, c) in typed.chars().enumerate() {
                    replicas[r].insert(pos + i, &c.to_string());
                }
                steps.push(format!("{r}: type {typed:?} forward at {pos}"));
            }
            // Typing backward: each character before the previous one.
            25..=39 => {
                let pos = match backward_at[r] {
                    Some(at) if at <= len && rng.below(2) == 0 => at,
                    _ => rng.below(len as u64 + 1) as usize,
                };
                backward_at[r] = Some(pos);
                let count = 1 + rng.below(6) as usize;
                let typed: String = (0..count).map(|_| letter(&mut rng)).collect();
                for c in typed.chars() {
                    replicas[r].insert(pos, &c.to_string());
                }
                steps.push(format!("{r}: type {typed:?} backward at {pos}"));
            }
            // A paste: several characters in one insert.
            40..=49 => {
                let pos = rng.below(len as u64 + 1) as usize;
                let count = 1 + rng.below(5) as usize;
                let text: String = (0..count).map(|_| letter(&mut rng)).collect();
                replicas[r].insert(pos, &text);
                steps.push(format!("{r}: paste {text:?} at {pos}"));
            }
            // A deletion (often next to earlier ones).
            50..=72 if len > 0 => {
                let start = rng.below(len as u64) as usize;
                let end = start + 1 + rng.below((len - start).min(3) as u64) as usize;
                replicas[r].delete(start, end);
                steps.push(format!("{r}: delete {start}..{end}"));
            }
            // A one-way sync.
            _ => {
                let from = rng.below(n as u64) as usize;
                if from == r {
                    continue;
                }
                let (to, source) = pair(&mut replicas, r, from);
                to.sync_from(source);
                steps.push(format!("{r}: sync from {from}"));
                if let Some(diff) = differs(&replicas[r], r) {
                    return (steps, Some(diff));
                }
            }
        }
    }
    // Everyone catches up, in a random order.
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for _ in 0..2 {
        for &to in &order {
            for &from in &order {
                if from != to {
                    let (t, f) = pair(&mut replicas, to, from);
                    t.sync_from(f);
                }
            }
        }
    }
    steps.push(format!("all sync, order {order:?}"));
    for (i, r) in replicas.iter().enumerate() {
        if let Some(diff) = differs(r, i) {
            return (steps, Some(diff));
        }
    }
    let first = replicas[0].texts().0;
    if let Some(i) = replicas.iter().position(|r| r.texts().0 != first) {
        return (
            steps,
            Some(format!("calm replicas 0 and {i} diverge after a full sync")),
        );
    }
    (steps, None)
}

/// Mutable `to` and shared `from`, two distinct replicas.
fn pair(replicas: &mut [Replica], to: usize, from: usize) -> (&mut Replica, &Replica) {
    assert_ne!(to, from);
    if to < from {
        let (a, b) = replicas.split_at_mut(from);
        (&mut a[to], &b[0])
    } else {
        let (a, b) = replicas.split_at_mut(to);
        (&mut b[0], &a[from])
    }
}

fn differs(r: &Replica, i: usize) -> Option<String> {
    let (calm, reference) = r.texts();
    (calm != reference)
        .then(|| format!("replica {i}: calm reads {calm:?}, diamond-types {reference:?}"))
}

#[test]
fn text_orders_as_diamond_types() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds = match env("CALM_TEXT_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..env("CALM_TEXT_SCENARIOS").unwrap_or(100_000),
    };
    let (mut with_deletes, mut total) = (0u64, 0u64);
    for seed in seeds {
        let (steps, diff) = session(seed);
        if let Some(diff) = diff {
            panic!(
                "seed {seed} (CALM_TEXT_SEED={seed}): {diff}\nsteps:\n  {}",
                steps.join("\n  ")
            );
        }
        total += 1;
        with_deletes += u64::from(steps.iter().any(|s| s.contains("delete")));
    }
    // The sessions that matter most here delete text; most of them must.
    assert!(
        total < 100 || with_deletes * 2 > total,
        "only {with_deletes} of {total} sessions deleted anything"
    );
    eprintln!("{total} sessions identical to diamond-types, {with_deletes} with deletions");
}

/// The smallest case where the rule shows: text typed where deleted text
/// sits, concurrently with an insert at the same place. Both origins are
/// the same (the start, and the deleted `0`), so the lower replica's text
/// goes first.
#[test]
fn insert_next_to_deleted_text_follows_the_reference() {
    let mut r = vec![Replica::new(0), Replica::new(1)];
    r[0].insert(0, "0");
    let (to, from) = pair(&mut r, 1, 0);
    to.sync_from(from);
    r[0].delete(0, 1);
    r[0].insert(0, "CD");
    r[1].insert(0, "a");
    for (to, from) in [(0, 1), (1, 0)] {
        let (t, f) = pair(&mut r, to, from);
        t.sync_from(f);
    }
    for (i, replica) in r.iter().enumerate() {
        assert_eq!(differs(replica, i), None);
        assert_eq!(replica.texts().0, "CDa");
    }
}

/// Many users typing backward at one place (long chains of siblings), some
/// carrying on after syncing mid-run, then everyone merging everyone in a
/// random order: the texts equal diamond-types' for every seed.
#[test]
fn many_users_typing_backward_at_one_place_follow_the_reference() {
    for seed in 0..20u64 {
        let mut rng = Rng::new(seed ^ 0xbac4_a4d5);
        let n = 2 + rng.below(19) as usize;
        let mut r: Vec<Replica> = (0..n).map(Replica::new).collect();
        r[0].insert(0, "[]");
        for to in 1..n {
            let (t, f) = pair(&mut r, to, 0);
            t.sync_from(f);
        }
        for _ in 0..3 {
            for (i, replica) in r.iter_mut().enumerate() {
                for _ in 0..rng.below(40) {
                    let c = char::from(b'a' + (i % 26) as u8).to_string();
                    replica.insert(1, &c);
                }
            }
            // A few pairwise syncs mid-run.
            for _ in 0..rng.below(n as u64) {
                let (to, from) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
                if to != from {
                    let (t, f) = pair(&mut r, to, from);
                    t.sync_from(f);
                }
            }
        }
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for &to in &order {
            for &from in &order {
                if to != from {
                    let (t, f) = pair(&mut r, to, from);
                    t.sync_from(f);
                }
            }
        }
        for &to in &order {
            let from = order[0];
            if to != from {
                let (t, f) = pair(&mut r, to, from);
                t.sync_from(f);
            }
        }
        for (i, replica) in r.iter().enumerate() {
            assert_eq!(differs(replica, i), None, "seed {seed}, {n} users");
        }
        let first = r[0].texts().0;
        assert!(
            r.iter().all(|x| x.texts().0 == first),
            "seed {seed}: diverged"
        );
    }
}
