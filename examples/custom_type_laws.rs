//! Running calm's law harness on your own type.
//!
//! A "high-water mark" keeps, per sensor, the highest reading seen. Its
//! merge must be commutative, associative, idempotent and monotone for
//! replicas to converge; the harness checks all of it, plus convergence of
//! five replicas under reordered, duplicated and dropped messages.
//!
//! Run with `cargo run --example custom_type_laws`.

use std::collections::BTreeMap;

use calm::Merge;
use calm::causal::ReplicaId;
use calm::testing::{Config, RandomOps, chaos, laws};
use proptest::prelude::*;

/// Per sensor, the highest reading seen.
#[derive(Clone, Debug, Default, PartialEq)]
struct HighWater(BTreeMap<u8, u32>);

impl Merge for HighWater {
    fn merge(&mut self, other: &Self) {
        for (&sensor, &reading) in &other.0 {
            let e = self.0.entry(sensor).or_insert(reading);
            *e = (*e).max(reading);
        }
    }
}

impl RandomOps for HighWater {
    /// A reading: `(sensor, value)`.
    type Op = (u8, u32);

    fn op_strategy() -> BoxedStrategy<(u8, u32)> {
        (0..4u8, any::<u32>()).boxed()
    }

    fn apply(&mut self, _replica: ReplicaId, &(sensor, value): &(u8, u32)) {
        let e = self.0.entry(sensor).or_insert(value);
        *e = (*e).max(value);
    }
}

fn main() {
    let cfg = Config::default();
    laws::check_laws::<HighWater>(&cfg).expect("merge laws");
    chaos::check_convergence::<HighWater>(&cfg).expect("convergence");
    println!(
        "HighWater passed the merge laws and {}-replica convergence ({} cases each)",
        cfg.replicas, cfg.cases
    );
}
