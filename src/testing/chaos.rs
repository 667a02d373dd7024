//! Convergence under delivery chaos: replicas gossip through a network that
//! reorders, duplicates and drops messages.

use proptest::collection::vec;
use proptest::prelude::*;

use super::laws::{Failure, check_inflation, replica_id};
use super::{Config, LawViolation, RandomOps, run};
use crate::codec::Codec;
use crate::merge::{DeltaMerge, Merge};
use crate::sync::Peer;

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

/// A message in flight.
struct InFlight<M> {
    from: usize,
    to: usize,
    message: M,
}

/// How replicas talk in a run: what a send puts on the network, and what a
/// delivery does with it.
trait Gossip<T> {
    /// What travels.
    type Message;
    /// The message `from` sends `to` now (`full`: the whole state, even in
    /// a delta mode).
    fn send(&mut self, states: &[T], from: usize, to: usize, full: bool) -> Self::Message;
    /// Delivers a message from `from` into `states[to]`.
    fn deliver(
        &mut self,
        states: &mut [T],
        from: usize,
        to: usize,
        message: &Self::Message,
    ) -> Result<(), Failure>;
    /// The message of the final exchange, once the network is reliable.
    fn send_final(&mut self, states: &[T], from: usize, to: usize) -> Self::Message {
        self.send(states, from, to, false)
    }
}

/// Merges `payload` into `states[to]`, checking nothing was lost.
fn receive<T: RandomOps>(states: &mut [T], to: usize, payload: &T) -> Result<(), Failure> {
    let before = states[to].clone();
    states[to].merge(payload);
    check_inflation(&before, &states[to], "delivery")
}

/// Whole states.
struct FullStates;

impl<T: RandomOps> Gossip<T> for FullStates {
    type Message = T;
    fn send(&mut self, states: &[T], from: usize, _: usize, _: bool) -> T {
        states[from].clone()
    }
    fn deliver(&mut self, states: &mut [T], _: usize, to: usize, msg: &T) -> Result<(), Failure> {
        receive(states, to, msg)
    }
}

/// Deltas against the receiver's version vector as the sender last heard
/// it (piggybacked on every message), and in the final exchange against
/// the receiver's real one.
struct Deltas<S> {
    /// `known[i][j]`: replica `j`'s version vector as replica `i` last
    /// heard it.
    known: Vec<Vec<S>>,
}

impl<T: RandomOps + DeltaMerge> Gossip<T> for Deltas<T::Summary> {
    /// The payload and the sender's version vector.
    type Message = (T, T::Summary);
    fn send(&mut self, states: &[T], from: usize, to: usize, full: bool) -> Self::Message {
        let payload = if full {
            states[from].clone()
        } else {
            states[from].delta(&self.known[from][to])
        };
        (payload, states[from].version_vector())
    }
    fn deliver(
        &mut self,
        states: &mut [T],
        from: usize,
        to: usize,
        (payload, vv): &Self::Message,
    ) -> Result<(), Failure> {
        self.known[to][from].merge(vv);
        receive(states, to, payload)
    }
    fn send_final(&mut self, states: &[T], from: usize, to: usize) -> Self::Message {
        let vv = states[to].version_vector();
        (states[from].delta(&vv), vv)
    }
}

/// [`Peer`]s: every replica keeps one per other replica, and messages
/// travel as bytes through the codec.
struct SyncPeers<T: DeltaMerge> {
    /// `peers[i][j]`: what replica `i` knows of replica `j`.
    peers: Vec<Vec<Peer<T>>>,
}

impl<T: RandomOps + DeltaMerge + Codec> Gossip<T> for SyncPeers<T> {
    type Message = Vec<u8>;
    fn send(&mut self, states: &[T], from: usize, to: usize, full: bool) -> Vec<u8> {
        if full {
            Peer::new().encode_message(&states[from])
        } else {
            self.peers[from][to].encode_message(&states[from])
        }
    }
    fn deliver(
        &mut self,
        states: &mut [T],
        from: usize,
        to: usize,
        bytes: &Vec<u8>,
    ) -> Result<(), Failure> {
        let before = states[to].clone();
        self.peers[to][from]
            .receive_bytes(&mut states[to], bytes)
            .map_err(|e| ("sync message round trip", format!("{e} decoding {bytes:?}")))?;
        check_inflation(&before, &states[to], "delivery")
    }
}

fn simulate<T: RandomOps, G: Gossip<T>>(
    n: usize,
    events: &[Event<T::Op>],
    mut gossip: G,
) -> Result<(), Failure> {
    let mut states = vec![T::default(); n];
    let mut in_flight: Vec<InFlight<G::Message>> = Vec::new();
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
                let message = gossip.send(&states, *from, *to, *full);
                in_flight.push(InFlight {
                    from: *from,
                    to: *to,
                    message,
                });
            }
            Event::Deliver { pick, fate } => {
                if in_flight.is_empty() {
                    continue;
                }
                let i = pick % in_flight.len();
                match fate {
                    Fate::Deliver => {
                        let m = in_flight.remove(i);
                        gossip.deliver(&mut states, m.from, m.to, &m.message)?;
                    }
                    Fate::Duplicate => {
                        let m = &in_flight[i];
                        gossip.deliver(&mut states, m.from, m.to, &m.message)?;
                    }
                    Fate::Drop => {
                        let m = in_flight.remove(i);
                        in_flight.push(m);
                    }
                }
            }
        }
    }
    // Everything still in flight (dropped ones included) arrives late.
    for m in std::mem::take(&mut in_flight) {
        gossip.deliver(&mut states, m.from, m.to, &m.message)?;
    }
    // A final exchange: each replica hears from every other.
    for _round in 0..2 {
        for from in 0..n {
            for to in 0..n {
                if from != to {
                    let message = gossip.send_final(&states, from, to);
                    gossip.deliver(&mut states, from, to, &message)?;
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
        simulate::<T, _>(n, &evs, FullStates)
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
        let known = vec![vec![T::Summary::default(); n]; n];
        simulate::<T, _>(n, &evs, Deltas { known })
    })
}

/// As [`check_delta_convergence`], with every replica keeping a
/// [`Peer`] per other replica and the messages it makes travelling as
/// bytes; also checks that every message decodes.
///
/// # Errors
///
/// The first [`LawViolation`] found, shrunk.
pub fn check_sync_convergence<T: RandomOps + DeltaMerge + Codec>(
    cfg: &Config,
) -> Result<(), LawViolation> {
    let n = cfg.replicas;
    run(cfg, events::<T>(cfg), |evs| {
        let peers = vec![vec![Peer::new(); n]; n];
        simulate::<T, _>(n, &evs, SyncPeers { peers })
    })
}
