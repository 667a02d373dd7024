//! A public law harness: property tests that check any [`Merge`] type,
//! calm's own and yours.
//!
//! Describe how to make random updates to your type ([`RandomOps`]) and
//! the harness generates random histories (replicas updating and merging
//! each other), then checks:
//!
//! - [`laws::check_laws`]: merge is commutative, associative and
//!   idempotent, and monotone (every local update and every merge only moves
//!   a state up; no update either side had is lost);
//! - [`laws::check_delta`]: `a ⊔ b.delta(vv(a)) == a ⊔ b`, and a delta
//!   never holds more than its source;
//! - [`chaos::check_convergence`]: at least five replicas update and gossip
//!   states or deltas through a network that reorders, duplicates and drops
//!   (and later retries) messages; after a final exchange every replica
//!   equals the join of every state ever produced;
//! - [`laws::check_codec`]: encodings round-trip, and every truncation, bit
//!   flip and random byte string decodes to `Ok` or a
//!   [`DecodeError`](crate::codec::DecodeError), never a panic.
//!
//! Failures come back as a [`LawViolation`] naming the law and a shrunk
//! counterexample, so the harness itself can be tested (a deliberately
//! broken merge must be caught; calm's own tests do exactly that).
//!
//! # Depth
//!
//! Each check runs [`Config::cases`] random cases: by default 64 (seconds
//! for all of calm's types), or the value of the `CALM_PROPTEST_CASES`
//! environment variable. `CALM_PROPTEST_CASES=2000` is the deep setting
//! used for long runs; at it, the codec check feeds each type well over
//! 100,000 hostile inputs.
//!
//! # Examples
//!
//! Checking a user-defined type (a max-register) against every law:
//!
//! ```
//! use calm::Merge;
//! use calm::causal::ReplicaId;
//! use calm::testing::{laws, Config, RandomOps};
//! use proptest::prelude::*;
//!
//! #[derive(Clone, Debug, Default, PartialEq)]
//! struct Max(u32);
//!
//! impl Merge for Max {
//!     fn merge(&mut self, other: &Self) {
//!         self.0 = self.0.max(other.0);
//!     }
//! }
//!
//! impl RandomOps for Max {
//!     type Op = u32;
//!     fn op_strategy() -> BoxedStrategy<u32> {
//!         any::<u32>().boxed()
//!     }
//!     fn apply(&mut self, _replica: ReplicaId, op: &u32) {
//!         self.0 = self.0.max(*op);
//!     }
//! }
//!
//! laws::check_laws::<Max>(&Config::default()).unwrap();
//! ```

use std::fmt;

use proptest::strategy::BoxedStrategy;

use crate::causal::ReplicaId;
use crate::merge::Merge;

pub mod chaos;
pub mod conformance;
pub mod faults;
mod impls;
pub mod laws;
pub mod linearizability;
pub mod servers;
pub mod sim;

pub use impls::{MapOp, SetOp, TextEdit};

/// How to make random local updates to a type, so the harness can build
/// random histories of it.
pub trait RandomOps: Merge + Clone + PartialEq + fmt::Debug + Default {
    /// One local update, as data (so proptest can shrink it).
    type Op: Clone + fmt::Debug;

    /// A strategy for random updates.
    fn op_strategy() -> BoxedStrategy<Self::Op>;

    /// Applies `op` as a local update made by `replica`.
    fn apply(&mut self, replica: ReplicaId, op: &Self::Op);
}

/// Settings shared by the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a configuration does nothing until passed to a check"]
pub struct Config {
    /// Random cases per check.
    pub cases: u32,
    /// Replicas in each convergence run (at least 5 by default).
    pub replicas: usize,
    /// Upper bound on the steps (updates, sends, deliveries) of one random
    /// history.
    pub max_steps: usize,
}

impl Default for Config {
    /// 64 cases, or `CALM_PROPTEST_CASES` if set; 5 replicas; histories
    /// of up to 120 steps.
    fn default() -> Self {
        let cases = std::env::var("CALM_PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        Self {
            cases,
            replicas: 5,
            max_steps: 120,
        }
    }
}

impl Config {
    /// Sets the number of cases.
    pub fn with_cases(mut self, cases: u32) -> Self {
        self.cases = cases;
        self
    }

    /// Sets the number of replicas in convergence runs.
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(2);
        self
    }

    /// The proptest configuration for these settings (no persistence file:
    /// the harness reports its counterexamples itself).
    pub(crate) fn proptest(&self) -> proptest::test_runner::Config {
        proptest::test_runner::Config {
            cases: self.cases,
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        }
    }
}

/// A law that failed, with the shrunk counterexample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("law `{law}` violated: {message}\nminimal failing input: {input}")]
#[non_exhaustive]
pub struct LawViolation {
    /// Which law failed (`"commutative"`, `"delta equivalence"`, ...).
    pub law: &'static str,
    /// What went wrong, with the states involved.
    pub message: String,
    /// The minimal failing input proptest found, as `Debug` text.
    pub input: String,
}

/// Runs `test` on inputs from `strategy`, turning a failure into a
/// [`LawViolation`]. `test` returns `Err((law, message))` to fail.
pub(crate) fn run<S: proptest::strategy::Strategy>(
    cfg: &Config,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), (&'static str, String)>,
) -> Result<(), LawViolation>
where
    S::Value: fmt::Debug,
{
    use proptest::test_runner::{TestCaseError, TestError, TestRunner};
    let failed = std::cell::RefCell::new(None);
    let mut runner = TestRunner::new(cfg.proptest());
    let result = runner.run(&strategy, |input| {
        // Panics are caught here rather than by proptest so they are
        // reported as a violated law ("no panic") like any other failure.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(input)));
        let (law, message) = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(failure)) => failure,
            Err(payload) => ("no panic", panic_message(payload.as_ref())),
        };
        // The last failing case proptest tries is the minimal one it
        // reports, so the last law recorded is that case's.
        *failed.borrow_mut() = Some(law);
        Err(TestCaseError::fail(message))
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(reason, input)) => Err(LawViolation {
            law: failed.borrow().unwrap_or("harness"),
            message: reason.to_string(),
            input: format!("{input:#?}"),
        }),
        Err(TestError::Abort(reason)) => Err(LawViolation {
            law: "harness",
            message: format!("proptest aborted: {reason}"),
            input: String::new(),
        }),
    }
}

/// The text of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_owned()
    }
}
