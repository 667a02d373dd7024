//! A linearizability checker for key-value histories, in the style of
//! Wing & Gong's search with Lowe's memoisation and Porcupine's per-key
//! partitioning.
//!
//! Clients record each operation with the instant they invoked it and the
//! instant it returned, and what it returned. The history is linearizable
//! if every operation can be placed at one point between its invocation
//! and its response so that, in that order, a sequential key-value store
//! would have returned exactly what the clients saw.
//!
//! Linearizability is *local*: a history is linearizable iff the
//! sub-history of each key is. The checker therefore splits by key and
//! searches each key's history alone: backtracking over which pending
//! operation to linearize next, and memoising (set of linearized
//! operations, model state) pairs already explored, which turns the search
//! from factorial into something that handles thousands of operations.
//!
//! The search is exponential in the worst case, so it has a deadline that
//! really holds: it checks the clock every few hundred steps and answers
//! [`Verdict::Unknown`] when time is up, never hangs.
//!
//! # The model
//!
//! Each key holds nothing, or a value (a `u64`, unique per write) with the
//! store revision it was written at. Revisions are global in the store, so
//! per key the model checks what it can: a write's revision is above the
//! key's current one, a compare-and-set succeeds exactly when the key's
//! revision is the expected one, a read sees the latest write.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use calm::testing::linearizability::{check, KvInput, KvOutput, Operation, Verdict};
//!
//! // Client 0 writes 7; client 1 starts reading before the write returns
//! // and sees it: fine, the write can take effect first.
//! let history = vec![
//!     Operation { client: 0, key: 1, call: 0, ret: 10, input: KvInput::Put(7), output: KvOutput::Written(1) },
//!     Operation { client: 1, key: 1, call: 5, ret: 8, input: KvInput::Get, output: KvOutput::Value(Some((7, 1))) },
//! ];
//! assert_eq!(check(&history, Duration::from_secs(1)), Verdict::Linearizable);
//!
//! // Now the read finished before the write was even invoked.
//! let bad = vec![
//!     Operation { client: 0, key: 1, call: 20, ret: 30, input: KvInput::Put(7), output: KvOutput::Written(1) },
//!     Operation { client: 1, key: 1, call: 5, ret: 8, input: KvInput::Get, output: KvOutput::Value(Some((7, 1))) },
//! ];
//! assert!(matches!(check(&bad, Duration::from_secs(1)), Verdict::Violation { .. }));
//! ```

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

/// What a client asked of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvInput {
    /// Read the key.
    Get,
    /// Write a value unconditionally.
    Put(u64),
    /// Write a value if the key's revision is the given one.
    CompareAndSet {
        /// The revision expected.
        expected: u64,
        /// The value to write.
        value: u64,
    },
    /// Write a value if the key is absent.
    Create(u64),
    /// Delete the key unconditionally.
    Delete,
}

/// What the store answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvOutput {
    /// A read's result: the value and its revision, or `None`.
    Value(Option<(u64, u64)>),
    /// A write committed at this revision.
    Written(u64),
    /// A conditional write lost its compare.
    Conflict,
    /// A delete's result: whether a key was there to delete.
    Deleted(bool),
    /// A write whose outcome the client never learned (its connection
    /// broke after sending it: the store said
    /// [`Indeterminate`](crate::store::StoreError::Indeterminate)). It may
    /// have taken effect at any instant after its call, or never; record
    /// it with `ret: u64::MAX`.
    Unknown,
}

/// One completed operation of a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The client (for reports only).
    pub client: usize,
    /// The key.
    pub key: u64,
    /// When it was invoked (any monotonic unit, e.g. nanoseconds).
    pub call: u64,
    /// When it returned; at least `call`.
    pub ret: u64,
    /// What was asked.
    pub input: KvInput,
    /// What came back.
    pub output: KvOutput,
}

/// The checker's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every key's history has a valid linearization.
    Linearizable,
    /// Some key's history has none.
    Violation {
        /// The key.
        key: u64,
        /// The operations on it, in invocation order.
        operations: Vec<Operation>,
    },
    /// The deadline passed before the search finished (no violation found
    /// so far).
    Unknown,
}

/// A key's revision in the sequential model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rev {
    /// Known exactly.
    Exactly(u64),
    /// Written by an operation whose answer was lost: only known to be
    /// above this.
    Above(u64),
}

impl Rev {
    /// The revision, or its lower bound.
    fn floor(self) -> u64 {
        match self {
            Rev::Exactly(r) | Rev::Above(r) => r,
        }
    }

    /// Whether the revision may be `r`.
    fn may_be(self, r: u64) -> bool {
        match self {
            Rev::Exactly(x) => x == r,
            Rev::Above(lo) => r > lo,
        }
    }
}

/// A key's state in the sequential model: `(value, revision)` or absent.
type State = Option<(u64, Rev)>;

/// Applies one operation to the sequential model: the next state, or
/// `None` if a sequential store could not have answered `output`. An
/// operation with an [`KvOutput::Unknown`] answer is given its successful
/// effect here (the search may also leave it out, which is its failure or
/// its never arriving).
fn step(state: State, input: KvInput, output: KvOutput) -> Option<State> {
    let floor = state.map_or(0, |(_, r)| r.floor());
    match (input, output) {
        (KvInput::Get, KvOutput::Value(v)) => match (state, v) {
            (None, None) => Some(None),
            (Some((x, rev)), Some((y, r))) if x == y && rev.may_be(r) => {
                Some(Some((x, Rev::Exactly(r))))
            }
            _ => None,
        },
        (KvInput::Put(v), KvOutput::Written(r)) => {
            (r > floor).then_some(Some((v, Rev::Exactly(r))))
        }
        (KvInput::Put(v), KvOutput::Unknown) => Some(Some((v, Rev::Above(floor)))),
        (KvInput::CompareAndSet { expected, value }, KvOutput::Written(r)) => state
            .is_some_and(|(_, rev)| rev.may_be(expected) && r > expected)
            .then_some(Some((value, Rev::Exactly(r)))),
        (KvInput::CompareAndSet { expected, value }, KvOutput::Unknown) => state
            .is_some_and(|(_, rev)| rev.may_be(expected))
            .then_some(Some((value, Rev::Above(expected)))),
        (KvInput::CompareAndSet { expected, .. }, KvOutput::Conflict) => match state {
            None | Some((_, Rev::Above(_))) => Some(state),
            Some((_, Rev::Exactly(r))) => (r != expected).then_some(state),
        },
        (KvInput::Create(v), KvOutput::Written(r)) => {
            (state.is_none() && r > 0).then_some(Some((v, Rev::Exactly(r))))
        }
        (KvInput::Create(v), KvOutput::Unknown) => {
            state.is_none().then_some(Some((v, Rev::Above(0))))
        }
        (KvInput::Create(_), KvOutput::Conflict) => state.is_some().then_some(state),
        (KvInput::Delete, KvOutput::Deleted(existed)) => {
            (existed == state.is_some()).then_some(None)
        }
        (KvInput::Delete, KvOutput::Unknown) => Some(None),
        _ => None,
    }
}

/// Checks a whole history, key by key, within `timeout`.
pub fn check(history: &[Operation], timeout: Duration) -> Verdict {
    let deadline = Instant::now() + timeout;
    let mut by_key: BTreeMap<u64, Vec<Operation>> = BTreeMap::new();
    for op in history {
        by_key.entry(op.key).or_default().push(*op);
    }
    let mut unknown = false;
    for (key, mut ops) in by_key {
        ops.sort_by_key(|o| (o.call, o.ret));
        match check_key(&ops, deadline) {
            Some(true) => {}
            Some(false) => {
                return Verdict::Violation {
                    key,
                    operations: ops,
                };
            }
            None => unknown = true,
        }
    }
    if unknown {
        Verdict::Unknown
    } else {
        Verdict::Linearizable
    }
}

/// One call or return event in the linked list the search walks.
#[derive(Clone, Copy)]
struct Event {
    /// The operation's index.
    op: usize,
    /// Whether this is the call (else the return).
    is_call: bool,
}

/// Searches one key's history. `Some(true)`: linearizable; `Some(false)`:
/// not; `None`: deadline passed.
fn check_key(ops: &[Operation], deadline: Instant) -> Option<bool> {
    let n = ops.len();
    // Events sorted by time; at equal times calls come first, which treats
    // touching operations as concurrent (the permissive reading).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, o) in ops.iter().enumerate() {
        events.push((o.call, false, i));
        events.push((o.ret.max(o.call), true, i));
    }
    events.sort_unstable_by_key(|&(t, is_ret, i)| (t, is_ret, i));
    // A doubly linked list over the events with a sentinel head at index
    // 0; event `k` of `events` is node `k + 1`. Linearizing an operation
    // unlinks its call and return nodes; backtracking relinks them.
    let len = events.len() + 1;
    let nodes: Vec<Event> = std::iter::once(Event {
        op: usize::MAX,
        is_call: false,
    })
    .chain(events.iter().map(|&(_, is_ret, op)| Event {
        op,
        is_call: !is_ret,
    }))
    .collect();
    let mut next: Vec<usize> = (1..=len).collect();
    let mut prev: Vec<usize> = (0..len).map(|i| i.wrapping_sub(1)).collect();
    next[len - 1] = usize::MAX;
    let mut ret_node = vec![0usize; n];
    for (k, &(_, is_ret, op)) in events.iter().enumerate() {
        if is_ret {
            ret_node[op] = k + 1;
        }
    }

    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        let (p, nx) = (prev[node], next[node]);
        next[p] = nx;
        if nx != usize::MAX {
            prev[nx] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        let (p, nx) = (prev[node], next[node]);
        next[p] = node;
        if nx != usize::MAX {
            prev[nx] = node;
        }
    };

    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state: State = None;
    let mut entry = next[0];
    let mut steps = 0u32;
    // Operations whose outcome is unknown need not be linearized: the
    // search is done when every other one is.
    let required = ops.iter().filter(|o| o.output != KvOutput::Unknown).count();
    let mut placed = 0usize;

    while next[0] != usize::MAX && placed < required {
        steps += 1;
        if steps % 256 == 0 && Instant::now() > deadline {
            return None;
        }
        if entry == usize::MAX {
            // Walked past the end without linearizing anything new.
            let Some((call, saved)) = stack.pop() else {
                return Some(false);
            };
            state = saved;
            let op = nodes[call].op;
            if ops[op].output != KvOutput::Unknown {
                placed -= 1;
            }
            linearized[op / 64] &= !(1 << (op % 64));
            relink(&mut next, &mut prev, ret_node[op]);
            relink(&mut next, &mut prev, call);
            entry = next[call];
            continue;
        }
        let ev = nodes[entry];
        if ev.is_call {
            let o = &ops[ev.op];
            if let Some(new_state) = step(state, o.input, o.output) {
                let mut lin = linearized.clone();
                lin[ev.op / 64] |= 1 << (ev.op % 64);
                if seen.insert((lin.clone(), new_state)) {
                    if o.output != KvOutput::Unknown {
                        placed += 1;
                    }
                    stack.push((entry, state));
                    state = new_state;
                    linearized = lin;
                    unlink(&mut next, &mut prev, ret_node[ev.op]);
                    unlink(&mut next, &mut prev, entry);
                    entry = next[0];
                    continue;
                }
            }
            entry = next[entry];
        } else {
            // A return whose call is still pending: every ordering tried
            // from here failed, so undo the last choice.
            let Some((call, saved)) = stack.pop() else {
                return Some(false);
            };
            state = saved;
            let op = nodes[call].op;
            if ops[op].output != KvOutput::Unknown {
                placed -= 1;
            }
            linearized[op / 64] &= !(1 << (op % 64));
            relink(&mut next, &mut prev, ret_node[op]);
            relink(&mut next, &mut prev, call);
            entry = next[call];
        }
    }
    Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: usize, call: u64, ret: u64, input: KvInput, output: KvOutput) -> Operation {
        Operation {
            client,
            key: 0,
            call,
            ret,
            input,
            output,
        }
    }

    const T: Duration = Duration::from_secs(5);

    /// A read that returns an older value after a newer write completed is
    /// rejected.
    #[test]
    fn stale_read_is_rejected() {
        let h = [
            op(0, 0, 1, KvInput::Put(1), KvOutput::Written(1)),
            op(0, 2, 3, KvInput::Put(2), KvOutput::Written(2)),
            op(1, 4, 5, KvInput::Get, KvOutput::Value(Some((1, 1)))),
        ];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
    }

    /// Two compare-and-sets from the same version cannot both win.
    #[test]
    fn lost_cas_is_rejected() {
        let h = [
            op(0, 0, 1, KvInput::Put(1), KvOutput::Written(1)),
            op(
                1,
                2,
                10,
                KvInput::CompareAndSet {
                    expected: 1,
                    value: 2,
                },
                KvOutput::Written(2),
            ),
            op(
                2,
                3,
                9,
                KvInput::CompareAndSet {
                    expected: 1,
                    value: 3,
                },
                KvOutput::Written(3),
            ),
        ];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
    }

    /// A value cannot be read before the write that makes it was invoked.
    #[test]
    fn read_from_the_future_is_rejected() {
        let h = [
            op(1, 0, 1, KvInput::Get, KvOutput::Value(Some((5, 1)))),
            op(0, 2, 3, KvInput::Put(5), KvOutput::Written(1)),
        ];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
    }

    /// A create that wins on a present key, and a delete that claims a
    /// missing key existed, are rejected.
    #[test]
    fn impossible_create_and_delete_are_rejected() {
        let h = [
            op(0, 0, 1, KvInput::Put(1), KvOutput::Written(1)),
            op(1, 2, 3, KvInput::Create(2), KvOutput::Written(2)),
        ];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
        let h = [op(0, 0, 1, KvInput::Delete, KvOutput::Deleted(true))];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
    }

    /// Overlapping operations may take effect in either order: both orders
    /// of a concurrent write and read are accepted.
    #[test]
    fn concurrency_is_allowed() {
        for seen in [None, Some((9, 1))] {
            let h = [
                op(0, 0, 10, KvInput::Put(9), KvOutput::Written(1)),
                op(1, 1, 9, KvInput::Get, KvOutput::Value(seen)),
            ];
            assert_eq!(check(&h, T), Verdict::Linearizable);
        }
    }

    /// On a search that explodes (40 concurrent reads that may take effect
    /// in any subset before an impossible one), a short deadline answers
    /// `Unknown` promptly instead of hanging.
    #[test]
    fn deadline_holds() {
        let mut h: Vec<Operation> = (0..40)
            .map(|i| op(i, 0, 1000, KvInput::Get, KvOutput::Value(None)))
            .collect();
        h.push(op(99, 0, 1000, KvInput::Get, KvOutput::Value(Some((5, 5)))));
        let start = Instant::now();
        let v = check(&h, Duration::from_millis(200));
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "took {:?}",
            start.elapsed()
        );
        assert_eq!(v, Verdict::Unknown);
    }

    /// A write whose answer was lost may have taken effect (a later read
    /// sees it) or not (a later read does not), but a read cannot see a
    /// value nobody wrote, nor a lost write take effect twice.
    #[test]
    fn unknown_outcomes() {
        let lost = op(0, 0, u64::MAX, KvInput::Put(7), KvOutput::Unknown);
        for seen in [None, Some((7, 4))] {
            let h = [lost, op(1, 5, 6, KvInput::Get, KvOutput::Value(seen))];
            assert_eq!(check(&h, T), Verdict::Linearizable, "{seen:?}");
        }
        let h = [
            lost,
            op(1, 5, 6, KvInput::Get, KvOutput::Value(Some((8, 4)))),
        ];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
        let h = [
            lost,
            op(1, 5, 6, KvInput::Get, KvOutput::Value(Some((7, 4)))),
            op(1, 7, 8, KvInput::Get, KvOutput::Value(None)),
        ];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
        // A lost compare-and-set and a successful one from the same
        // version: the lost one cannot have taken effect after the winner.
        let cas = |expected, value| KvInput::CompareAndSet { expected, value };
        let h = [
            op(0, 0, 1, KvInput::Put(1), KvOutput::Written(1)),
            op(1, 2, u64::MAX, cas(1, 2), KvOutput::Unknown),
            op(2, 3, 4, cas(1, 3), KvOutput::Written(5)),
            op(2, 6, 7, KvInput::Get, KvOutput::Value(Some((2, 6)))),
        ];
        assert!(matches!(check(&h, T), Verdict::Violation { .. }));
    }

    /// A sequential history of all operation kinds is accepted.
    #[test]
    fn sequential_history_is_accepted() {
        let h = [
            op(0, 0, 1, KvInput::Create(1), KvOutput::Written(3)),
            op(0, 2, 3, KvInput::Create(2), KvOutput::Conflict),
            op(
                0,
                4,
                5,
                KvInput::CompareAndSet {
                    expected: 3,
                    value: 4,
                },
                KvOutput::Written(7),
            ),
            op(
                0,
                6,
                7,
                KvInput::CompareAndSet {
                    expected: 3,
                    value: 5,
                },
                KvOutput::Conflict,
            ),
            op(0, 8, 9, KvInput::Get, KvOutput::Value(Some((4, 7)))),
            op(0, 10, 11, KvInput::Delete, KvOutput::Deleted(true)),
            op(0, 12, 13, KvInput::Delete, KvOutput::Deleted(false)),
            op(0, 14, 15, KvInput::Get, KvOutput::Value(None)),
        ];
        assert_eq!(check(&h, T), Verdict::Linearizable);
    }
}
