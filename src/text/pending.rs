//! Ops waiting for the events they build on, kept per replica in counter
//! order until [`Text::apply`](super::Text::apply) can integrate them.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use super::op::TextOp;
use crate::causal::ReplicaId;

/// Ops waiting for the events they build on.
///
/// Per replica, sorted by counter, not overlapping each other or what the
/// document holds, and joined with their neighbours where they continue
/// each other, so that two replicas holding the same waiting edits hold the
/// same ops (equality and the encoding depend on it).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    /// The waiting ops of each replica; no queue is empty.
    pub(crate) by_replica: BTreeMap<ReplicaId, VecDeque<TextOp>>,
}

impl Pending {
    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_replica.is_empty()
    }

    /// Every waiting op, by replica then counter.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &TextOp> {
        self.by_replica.values().flatten()
    }

    /// Adds the events of `op` that are neither known (`known` events of its
    /// replica are) nor already waiting.
    pub(crate) fn push(&mut self, op: TextOp, known: u64) {
        let Some(op) = unseen(op, known) else {
            return;
        };
        let queue = self.by_replica.entry(op.replica()).or_default();
        match queue.back_mut() {
            None => queue.push_back(op),
            // Ops mostly arrive in counter order: append, joining if they
            // continue each other.
            Some(back) if back.end() <= op.id.counter() => {
                if !back.try_append(&op) {
                    queue.push_back(op);
                }
            }
            Some(_) => {
                let (c0, end) = (op.id.counter(), op.end());
                let mut pieces = Vec::new();
                let mut at = c0;
                for e in queue.iter() {
                    if e.end() <= at || e.id.counter() >= end {
                        continue;
                    }
                    if e.id.counter() > at {
                        pieces.push(op.slice((at - c0) as u32, (e.id.counter() - c0) as u32));
                    }
                    at = at.max(e.end());
                }
                if at < end {
                    pieces.push(op.slice((at - c0) as u32, (end - c0) as u32));
                }
                let mut all: Vec<TextOp> = queue.drain(..).chain(pieces).collect();
                all.sort_by_key(|o| o.id.counter());
                for o in all {
                    let joined = queue.back_mut().is_some_and(|back| back.try_append(&o));
                    if !joined {
                        queue.push_back(o);
                    }
                }
            }
        }
    }

    /// Checks the invariants in the type docs against `known`.
    pub(crate) fn assert_invariants(&self, known: impl Fn(ReplicaId) -> u64) {
        for (r, queue) in &self.by_replica {
            assert!(!queue.is_empty(), "empty pending queue");
            let mut at = known(*r) + 1;
            let mut prev: Option<&TextOp> = None;
            for op in queue {
                assert!(!op.is_empty() && op.id.counter() >= at, "pending overlap");
                if let Some(p) = prev {
                    assert!(!p.joins(op), "pending ops not joined");
                }
                at = op.end();
                prev = Some(op);
            }
        }
    }
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The part of `op` after the first `known` events of its replica, if any.
pub(crate) fn unseen(op: TextOp, known: u64) -> Option<TextOp> {
    // Counters are at least 1 and `end() - 1` is the last one, so none of
    // this overflows even for a hostile `known` of `u64::MAX`.
    if op.is_empty() || op.end() - 1 <= known {
        None
    } else if op.id.counter() <= known {
        let skip = (known - op.id.counter() + 1) as u32;
        Some(op.slice(skip, op.len32()))
    } else {
        Some(op)
    }
}
