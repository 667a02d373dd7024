//! The algebraic laws, delta equivalence and the codec checks, each written
//! once for every type.

use std::cell::Cell;

use proptest::collection::vec;
use proptest::prelude::*;

use super::{Config, LawViolation, RandomOps, run};
use crate::causal::ReplicaId;
use crate::codec::{self, Encoder, Tagged};
use crate::merge::{DeltaMerge, Merge};

/// One step of a random history.
#[derive(Clone, Debug)]
pub enum Step<Op> {
    /// Replica `replica` makes a local update.
    Update {
        /// Index of the replica.
        replica: usize,
        /// The update.
        op: Op,
    },
    /// Replica `into` merges replica `from`'s current state.
    Merge {
        /// Index of the sending replica.
        from: usize,
        /// Index of the receiving replica.
        into: usize,
    },
}

/// The id the harness gives replica number `i`.
pub fn replica_id(i: usize) -> ReplicaId {
    ReplicaId::new(i as u64 + 1)
}

/// Random histories over `replicas` replicas: mostly updates, some merges.
pub fn history<T: RandomOps>(
    replicas: usize,
    max_steps: usize,
) -> impl Strategy<Value = Vec<Step<T::Op>>> {
    let step = prop_oneof![
        3 => (0..replicas, T::op_strategy()).prop_map(|(replica, op)| Step::Update { replica, op }),
        1 => (0..replicas, 0..replicas).prop_map(|(from, into)| Step::Merge { from, into }),
    ];
    vec(step, 0..max_steps)
}

/// A failed check: the law and what happened.
pub(crate) type Failure = (&'static str, String);

/// `x ≤ y` in the lattice order: `x ⊔ y == y`.
pub(crate) fn leq<T: Merge + Clone + PartialEq>(x: &T, y: &T) -> bool {
    &x.merged(y) == y
}

/// Checks that `after` is at least `before` (nothing was lost).
pub(crate) fn check_inflation<T: Merge + Clone + PartialEq + std::fmt::Debug>(
    before: &T,
    after: &T,
    what: &str,
) -> Result<(), Failure> {
    if leq(before, after) {
        Ok(())
    } else {
        Err((
            "monotone",
            format!("{what} lost an update\nbefore: {before:#?}\nafter: {after:#?}"),
        ))
    }
}

/// Plays a history and returns the replicas' final states, checking after
/// every step that the state only moved up.
pub fn play<T: RandomOps>(
    replicas: usize,
    steps: &[Step<T::Op>],
) -> Result<Vec<T>, (&'static str, String)> {
    let mut states = vec![T::default(); replicas];
    for step in steps {
        match step {
            Step::Update { replica, op } => {
                let before = states[*replica].clone();
                states[*replica].apply(replica_id(*replica), op);
                check_inflation(&before, &states[*replica], &format!("update {op:?}"))?;
            }
            Step::Merge { from, into } => {
                let before = states[*into].clone();
                let other = states[*from].clone();
                states[*into].merge(&other);
                check_inflation(&before, &states[*into], "merge")?;
                check_inflation(&other, &states[*into], "merge")?;
            }
        }
    }
    Ok(states)
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(
    law: &'static str,
    left: &T,
    right: &T,
    what: &str,
) -> Result<(), Failure> {
    if left == right {
        Ok(())
    } else {
        Err((law, format!("{what}\nleft: {left:#?}\nright: {right:#?}")))
    }
}

/// Checks that merge is commutative, associative, idempotent and
/// monotone on states reached by random histories of three replicas (so
/// the states share history, as real replicas do).
///
/// # Errors
///
/// The first [`LawViolation`] found, shrunk.
pub fn check_laws<T: RandomOps>(cfg: &Config) -> Result<(), LawViolation> {
    run(cfg, history::<T>(3, cfg.max_steps), |steps| {
        let s = play::<T>(3, &steps)?;
        let (a, b, c) = (&s[0], &s[1], &s[2]);
        expect_eq("commutative", &a.merged(b), &b.merged(a), "a ⊔ b != b ⊔ a")?;
        expect_eq(
            "associative",
            &a.merged(b).merged(c),
            &a.merged(&b.merged(c)),
            "(a ⊔ b) ⊔ c != a ⊔ (b ⊔ c)",
        )?;
        expect_eq("idempotent", &a.merged(a), a, "a ⊔ a != a")?;
        let ab = a.merged(b);
        expect_eq("idempotent", &ab.merged(b), &ab, "(a ⊔ b) ⊔ b != a ⊔ b")?;
        check_inflation(a, &ab, "a ⊔ b")?;
        check_inflation(b, &ab, "a ⊔ b")?;
        Ok(())
    })
}

/// Checks delta sync: for every pair of replicas `x`, `y` from random
/// histories, `x ⊔ y.delta(vv(x)) == x ⊔ y`, a delta against an empty
/// vector is as good as the state, and a delta holds nothing `y` lacks
/// (`delta ≤ y`).
///
/// # Errors
///
/// The first [`LawViolation`] found, shrunk.
pub fn check_delta<T: RandomOps + DeltaMerge>(cfg: &Config) -> Result<(), LawViolation> {
    run(cfg, history::<T>(3, cfg.max_steps), |steps| {
        let s = play::<T>(3, &steps)?;
        for x in &s {
            for y in &s {
                let full = x.merged(y);
                let delta = y.delta(&x.version_vector());
                expect_eq(
                    "delta equivalence",
                    &x.merged(&delta),
                    &full,
                    &format!("x ⊔ y.delta(vv(x)) != x ⊔ y\ndelta: {delta:#?}"),
                )?;
                let mut owned = x.clone();
                owned.merge_owned(delta.clone());
                expect_eq(
                    "merge by value",
                    &owned,
                    &full,
                    "x.merge_owned(y.delta(vv(x))) != x ⊔ y",
                )?;
                if !leq(&delta, y) {
                    return Err((
                        "delta ≤ source",
                        format!(
                            "a delta holds more than its source\ndelta: {delta:#?}\nsource: {y:#?}"
                        ),
                    ));
                }
                expect_eq(
                    "delta equivalence",
                    &x.merged(&y.delta(&T::Summary::default())),
                    &full,
                    "x ⊔ y.delta(∅) != x ⊔ y",
                )?;
            }
        }
        Ok(())
    })
}

/// What [`check_codec`] fed the decoder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodecStats {
    /// Hostile inputs decoded (truncations, bit flips, random bytes).
    pub hostile_inputs: u64,
    /// Of those, how many decoded to a value (which was then checked to be
    /// canonical and mergeable).
    pub accepted: u64,
}

/// Checks the codec: every reachable state round-trips; every strict
/// prefix of an encoding is an error; bit-flipped and random inputs decode
/// to an error or to a value whose own encoding is exactly those bytes
/// (encodings are canonical; bytes of an older format version need only
/// decode again to the same value once re-encoded in the current one) and
/// which merges without panicking; a length prefix of 2^60 is refused.
///
/// # Errors
///
/// The first [`LawViolation`] found, shrunk. A panic anywhere is reported
/// as the law `"no panic"`.
pub fn check_codec<T: RandomOps + Tagged>(cfg: &Config) -> Result<CodecStats, LawViolation> {
    codec_checks::<T>(cfg, true)
}

/// As [`check_codec`], for encodings that are not canonical (serde formats
/// of hash maps, say): instead of "accepted bytes re-encode to themselves",
/// it requires that an accepted value re-encodes to bytes that decode to
/// an equal value.
///
/// # Errors
///
/// The first [`LawViolation`] found, shrunk.
pub fn check_codec_stable<T: RandomOps + Tagged>(cfg: &Config) -> Result<CodecStats, LawViolation> {
    codec_checks::<T>(cfg, false)
}

fn codec_checks<T: RandomOps + Tagged>(
    cfg: &Config,
    canonical: bool,
) -> Result<CodecStats, LawViolation> {
    let stats = Cell::new(CodecStats::default());
    let inputs = (
        history::<T>(3, cfg.max_steps),
        vec((any::<usize>(), 0..8u32), 0..48),
        vec(vec(any::<u8>(), 0..96), 0..8),
    );
    run(cfg, inputs, |(steps, flips, garbage)| {
        let states = play::<T>(3, &steps)?;
        let mut local = stats.get();
        let mut truncations = 0;
        let mut hostile = |bytes: &[u8], original: &T| -> Result<(), Failure> {
            local.hostile_inputs += 1;
            if let Ok(v) = codec::from_bytes::<T>(bytes) {
                local.accepted += 1;
                let again = codec::to_bytes(&v);
                // Bytes of an older format version are rewritten in the
                // current one: those need only survive re-encoding.
                let current = bytes.first() == Some(&codec::FORMAT_VERSION);
                if canonical && current && again != bytes {
                    return Err((
                        "canonical encoding",
                        format!(
                            "accepted bytes re-encode differently\nin:  {bytes:?}\nout: {again:?}"
                        ),
                    ));
                }
                if !(canonical && current)
                    && codec::from_bytes::<T>(&again).ok().as_ref() != Some(&v)
                {
                    return Err((
                        "stable encoding",
                        format!("an accepted value does not survive re-encoding\nin: {bytes:?}"),
                    ));
                }
                let _ = v.merged(original);
                let _ = original.merged(&v);
            }
            Ok(())
        };
        for s in &states {
            let bytes = codec::to_bytes(s);
            match codec::from_bytes::<T>(&bytes) {
                Ok(back) => expect_eq("codec round trip", &back, s, "decode(encode(s)) != s")?,
                Err(e) => return Err(("codec round trip", format!("{e} decoding {s:#?}"))),
            }
            for cut in 0..bytes.len() {
                if codec::from_bytes::<T>(&bytes[..cut]).is_ok() {
                    return Err((
                        "truncation is an error",
                        format!("a {cut}-byte prefix of {bytes:?} decoded"),
                    ));
                }
                truncations += 1;
            }
            for &(pos, bit) in &flips {
                let mut flipped = bytes.clone();
                let i = pos % flipped.len();
                flipped[i] ^= 1 << bit;
                hostile(&flipped, s)?;
            }
            for g in &garbage {
                let mut with_header = bytes[..2].to_vec();
                with_header.extend_from_slice(g);
                hostile(&with_header, s)?;
                hostile(g, s)?;
            }
        }
        let mut bomb = Encoder::new();
        bomb.byte(codec::FORMAT_VERSION);
        bomb.byte(T::TAG);
        bomb.varint(1 << 60);
        if codec::from_bytes::<T>(&bomb.into_bytes()).is_ok() {
            return Err(("length bomb", "a 2^60 length prefix decoded".to_owned()));
        }
        local.hostile_inputs += truncations;
        stats.set(local);
        Ok(())
    })?;
    Ok(stats.get())
}
