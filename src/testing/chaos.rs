//! Convergence under delivery chaos: replicas gossip through a network that
//! reorders, duplicates and drops messages.

use proptest::collection::vec;
use proptest::prelude::*;

use super::laws::{Failure, check_inflation, replica_id};
use super::{Config, LawViolation, RandomOps, run};
use crate::causal::VersionVector;
use crate::merge::{DeltaMerge, Merge};

/// What the network does with a message picked for delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Deliver it once.
    Deliver,
    /// Deliver it and keep a copy in flight (a duplicate, delivered later).
    Duplicate,
    /// Lose it for now: it goes to the back of the queue and is retried.
    Drop,
}

/// One event of a chaotic run.
#[derive(Clone, Debug)]
pub enum Event<Op> {
    /// A replica makes a local update.
    Update {
        /// Index of the replica.
        replica: usize,
        /// The update.
        op: Op,
    },
    /// A replica sends its state (or, in delta mode, a delta against what it
    /// last heard of the receiver's version vector) to another.
    Send {
        /// Index of the sender.
        from: usize,
        /// Index of the receiver.
        to: usize,
        /// Send the full state even in delta mode.
        full: bool,
    },
    /// The network picks an in-flight message (index modulo the queue
    /// length) and applies a fate to it.
    Deliver {
        /// Which message.
        pick: usize,
        /// What happens to it.
        fate: Fate,
    },
}

/// A message in flight; `S` is the sender's summary type.
struct Message<T, S> {
    to: usize,
    from: usize,
    payload: T,
    /// The sender's version vector when it sent, piggybacked so the receiver
    /// can compute deltas back to it.
    sender_vv: Option<S>,
}

fn events<T: RandomOps>(cfg: &Config) -> impl Strategy<Value = Vec<Event<T::Op>>> {
    let n = cfg.replicas;
    let fate = prop_oneof![
        6 => Just(Fate::Deliver),
        2 => Just(Fate::Duplicate),
        2 => Just(Fate::Drop),
    ];
    let event = prop_oneof![
        4 => (0..n, T::op_strategy()).prop_map(|(replica, op)| Event::Update { replica, op }),
        2 => (0..n, 0..n, any::<bool>()).prop_map(|(from, to, full)| Event::Send { from, to, full }),
        3 => (any::<usize>(), fate).prop_map(|(pick, fate)| Event::Deliver { pick, fate }),
    ];
    vec(event, 0..cfg.max_steps * 2)
}

/// How a run turns a state into a message, and how the final exchange
/// brings every replica up to date.
trait Gossip<T> {
    /// What a replica learns of another's version vector.
    type Summary: Merge + Clone + Default;
    /// The payload `from` sends; `known` is the receiver's version vector
    /// as `from` last heard it.
    fn payload(&self, from: &T, known: &Self::Summary, full: bool) -> T;
    /// `from`'s version vector, if this mode ships deltas.
    fn version_vector(&self, state: &T) -> Option<Self::Summary>;
}

struct FullStates;

impl<T: Clone> Gossip<T> for FullStates {
    type Summary = VersionVector;
    fn payload(&self, from: &T, _: &VersionVector, _: bool) -> T {
        from.clone()
    }
    fn version_vector(&self, _: &T) -> Option<VersionVector> {
        None
    }
}

struct Deltas;

impl<T: DeltaMerge + Clone> Gossip<T> for Deltas {
    type Summary = T::Summary;
    fn payload(&self, from: &T, known: &T::Summary, full: bool) -> T {
        if full {
            from.clone()
        } else {
            from.delta(known)
        }
    }
    fn version_vector(&self, state: &T) -> Option<T::Summary> {
        Some(state.version_vector())
    }
}

fn receive<T: RandomOps, S>(states: &mut [T], msg: &Message<T, S>) -> Result<(), Failure> {
    let before = states[msg.to].clone();
    states[msg.to].merge(&msg.payload);
    check_inflation(&before, &states[msg.to], "delivery")
}

/// Delivers `msg`, also recording the sender's piggybacked version vector.
fn deliver<T: RandomOps, S: Merge>(
    states: &mut [T],
    known: &mut [Vec<S>],
    msg: &Message<T, S>,
) -> Result<(), Failure> {
    if let Some(vv) = &msg.sender_vv {
        known[msg.to][msg.from].merge(vv);
    }
    receive(states, msg)
}

fn simulate<T: RandomOps, G: Gossip<T>>(
    n: usize,
    events: &[Event<T::Op>],
    gossip: &G,
) -> Result<(), Failure> {
    let mut states = vec![T::default(); n];
    // known[i][j]: replica j's version vector as replica i last heard it.
    let mut known = vec![vec![G::Summary::default(); n]; n];
    let mut in_flight: Vec<Message<T, G::Summary>> = Vec::new();
    // The join of every state a local update produced: where everyone must
    // end up.
    let mut everything = T::default();

    for event in events {
        match event {
            Event::Update { replica, op } => {
                let before = states[*replica].clone();
                states[*replica].apply(replica_id(*replica), op);
                check_inflation(&before, &states[*replica], &format!("update {op:?}"))?;
                everything.merge(&states[*replica]);
            }
            Event::Send { from, to, full } => {
                let payload = gossip.payload(&states[*from], &known[*from][*to], *full);
                in_flight.push(Message {
                    to: *to,
                    from: *from,
                    payload,
                    sender_vv: gossip.version_vector(&states[*from]),
                });
            }
            Event::Deliver { pick, fate } => {
                if in_flight.is_empty() {
                    continue;
                }
                let i = pick % in_flight.len();
                match fate {
                    Fate::Deliver => {
                        let msg = in_flight.remove(i);
                        deliver(&mut states, &mut known, &msg)?;
                    }
                    Fate::Duplicate => deliver(&mut states, &mut known, &in_flight[i])?,
                    Fate::Drop => {
                        let msg = in_flight.remove(i);
                        in_flight.push(msg);
                    }
                }
            }
        }
    }
    // Everything still in flight (dropped ones included) arrives late.
    for msg in std::mem::take(&mut in_flight) {
        deliver(&mut states, &mut known, &msg)?;
    }
    // A final exchange: each replica hears from every other, through
    // deltas against the receiver's real version vector in delta mode.
    for _round in 0..2 {
        for from in 0..n {
            for to in 0..n {
                if from != to {
                    let vv = gossip.version_vector(&states[to]).unwrap_or_default();
                    let payload = gossip.payload(&states[from], &vv, false);
                    let msg: Message<T, G::Summary> = Message {
                        to,
                        from,
                        payload,
                        sender_vv: None,
                    };
                    receive(&mut states, &msg)?;
                }
            }
        }
    }
    for (i, s) in states.iter().enumerate() {
        if s != &everything {
            return Err((
                "convergence",
                format!(
                    "replica {i} did not converge to the join of every update\n\
                     replica: {s:#?}\nexpected: {everything:#?}"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that [`Config::replicas`] replicas gossiping full states through
/// a chaotic network converge to the join of every update.
///
/// # Errors
///
/// The first [`LawViolation`] found, shrunk.
pub fn check_convergence<T: RandomOps>(cfg: &Config) -> Result<(), LawViolation> {
    let n = cfg.replicas;
    run(cfg, events::<T>(cfg), |evs| {
        simulate::<T, _>(n, &evs, &FullStates)
    })
}

/// As [`check_convergence`], with replicas sending deltas computed against
/// the version vector they last heard from the receiver (stale, late and
/// duplicated), mixed with some full states.
///
/// # Errors
///
/// The first [`LawViolation`] found, shrunk.
pub fn check_delta_convergence<T: RandomOps + DeltaMerge>(
    cfg: &Config,
) -> Result<(), LawViolation> {
    let n = cfg.replicas;
    run(cfg, events::<T>(cfg), |evs| {
        simulate::<T, _>(n, &evs, &Deltas)
    })
}
