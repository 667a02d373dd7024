//! The harness can fail: deliberately broken merges are reported with the
//! right law.

use calm::Merge;
use calm::causal::ReplicaId;
use calm::testing::{Config, RandomOps, chaos, laws};
use proptest::prelude::*;

/// "Merge" that keeps the other side's value: not commutative.
#[derive(Clone, Debug, Default, PartialEq)]
struct TakeTheirs(u8);

impl Merge for TakeTheirs {
    fn merge(&mut self, other: &Self) {
        self.0 = other.0;
    }
}

impl RandomOps for TakeTheirs {
    type Op = u8;
    fn op_strategy() -> BoxedStrategy<u8> {
        any::<u8>().boxed()
    }
    fn apply(&mut self, _: ReplicaId, op: &u8) {
        self.0 = self.0.max(*op);
    }
}

/// A counter whose merge adds instead of taking the maximum: commutative
/// and associative, but not idempotent, so duplicated messages inflate it.
#[derive(Clone, Debug, Default, PartialEq)]
struct Summing(u64);

impl Merge for Summing {
    fn merge(&mut self, other: &Self) {
        self.0 += other.0;
    }
}

impl RandomOps for Summing {
    type Op = u8;
    fn op_strategy() -> BoxedStrategy<u8> {
        (1..10u8).boxed()
    }
    fn apply(&mut self, _: ReplicaId, op: &u8) {
        self.0 += u64::from(*op);
    }
}

/// A non-commutative merge is reported as such.
#[test]
fn non_commutative_merge_is_caught() {
    let v = laws::check_laws::<TakeTheirs>(&Config::default()).unwrap_err();
    assert_eq!(v.law, "commutative", "{v}");
}

/// A non-idempotent merge is caught by the laws and by the chaos run.
#[test]
fn non_idempotent_merge_is_caught() {
    let v = laws::check_laws::<Summing>(&Config::default()).unwrap_err();
    // The order check `x ⊔ y == y` itself relies on idempotence, so the
    // failure may surface as either law.
    assert!(["idempotent", "monotone"].contains(&v.law), "{v}");
    assert!(chaos::check_convergence::<Summing>(&Config::default()).is_err());
}

/// A panic inside a merge is reported as the law "no panic", not a crash.
#[test]
fn panics_are_reported() {
    #[derive(Clone, Debug, Default, PartialEq)]
    struct Panicky(u8);
    impl Merge for Panicky {
        fn merge(&mut self, other: &Self) {
            assert!(other.0 < 200, "boom");
            self.0 = self.0.max(other.0);
        }
    }
    impl RandomOps for Panicky {
        type Op = u8;
        fn op_strategy() -> BoxedStrategy<u8> {
            any::<u8>().boxed()
        }
        fn apply(&mut self, _: ReplicaId, op: &u8) {
            self.0 = self.0.max(*op);
        }
    }
    let v = laws::check_laws::<Panicky>(&Config::default().with_cases(256)).unwrap_err();
    assert_eq!(v.law, "no panic", "{v}");
}
