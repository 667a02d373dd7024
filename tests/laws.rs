//! Every calm CRDT through the whole law harness: the algebraic laws,
//! delta equivalence, convergence of five replicas under delivery chaos
//! (full states, deltas and `sync::Peer` messages), and the codec on
//! hostile input. Composite states (tuples, `Option`, derived structs) and
//! serde-bridged elements (`codec::Serde`) go through the same checks as
//! the built-in types.

use calm::codec::Serde;
use calm::occ::Versioned;
use calm::testing::{Config, chaos, laws};
use calm::{GCounter, GSet, LwwRegister, MvRegister, OrMap, OrSet, PnCounter, Text, TwoPhaseSet};

fn cfg() -> Config {
    Config::default()
}

/// The state-based checks every type passes, for type `$t`.
macro_rules! state_tests {
    ($t:ty) => {
        /// Commutative, associative, idempotent, monotone.
        #[test]
        fn algebraic_laws() {
            laws::check_laws::<$t>(&cfg()).unwrap_or_else(|v| panic!("{v}"));
        }

        /// Five replicas converge under reordering, duplication and drops.
        #[test]
        fn convergence_under_chaos() {
            chaos::check_convergence::<$t>(&cfg()).unwrap_or_else(|v| panic!("{v}"));
        }

        /// Round trips, truncations, bit flips, garbage, a length bomb.
        #[test]
        fn codec_on_hostile_input() {
            let stats = laws::check_codec::<$t>(&cfg()).unwrap_or_else(|v| panic!("{v}"));
            assert!(stats.hostile_inputs > u64::from(cfg().cases));
            eprintln!("{}: {stats:?}", stringify!($t));
        }
    };
}

/// The delta checks (and delta sync through `calm::sync`), for type `$t`.
macro_rules! delta_tests {
    ($t:ty) => {
        /// `a ⊔ b.delta(vv(a)) == a ⊔ b`, and deltas hold nothing extra.
        #[test]
        fn delta_equivalence() {
            laws::check_delta::<$t>(&cfg()).unwrap_or_else(|v| panic!("{v}"));
        }

        /// Five replicas gossiping stale deltas and states converge.
        #[test]
        fn delta_convergence_under_chaos() {
            chaos::check_delta_convergence::<$t>(&cfg()).unwrap_or_else(|v| panic!("{v}"));
        }

        /// Five replicas syncing through `sync::Peer`s, messages as
        /// bytes, converge.
        #[test]
        fn sync_convergence_under_chaos() {
            chaos::check_sync_convergence::<$t>(&cfg()).unwrap_or_else(|v| panic!("{v}"));
        }
    };
}

/// One test module per type with the state-based checks.
macro_rules! state_laws {
    ($($name:ident: $t:ty;)*) => {$(
        mod $name {
            use super::*;
            state_tests!($t);
        }
    )*};
}

/// One test module per causal type with the state-based and delta checks.
macro_rules! delta_laws {
    ($($name:ident: $t:ty;)*) => {$(
        mod $name {
            use super::*;
            state_tests!($t);
            delta_tests!($t);
        }
    )*};
}

state_laws! {
    g_set: GSet<u8>;
    two_phase_set: TwoPhaseSet<u8>;
    versioned: Versioned<u8>;
}

delta_laws! {
    g_counter: GCounter;
    pn_counter: PnCounter;
    or_set: OrSet<u8>;
    lww_register: LwwRegister<u8>;
    mv_register: MvRegister<u8>;
    or_map: OrMap<u8, PnCounter>;
    or_map_nested: OrMap<u8, OrMap<bool, OrSet<u8>>>;
    text: Text;
    pair: (OrSet<u8>, PnCounter);
    triple: (GCounter, LwwRegister<u8>, MvRegister<u8>);
    quadruple: (OrSet<u8>, PnCounter, LwwRegister<u8>, OrMap<u8, GCounter>);
    option: Option<OrSet<u8>>;
    option_of_pair: Option<(GCounter, OrSet<u8>)>;
    pair_of_options: (Option<PnCounter>, Option<Text>);
    derived_cart: crate::derive::Cart;
    derived_generic_tuple_struct: crate::derive::Tally<u8>;
    serde_element_set: OrSet<Serde<serde_element::Item>>;
    serde_element_register: LwwRegister<Serde<serde_element::Item>>;
    serde_element_map: OrMap<Serde<serde_element::Item>, MvRegister<Serde<serde_element::Item>>>;
}

/// An element type with serde impls and no `Codec` of its own, for the
/// serde bridge (`calm::codec::Serde`).
mod serde_element {
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    /// A user's element: a struct holding an enum, text and a list.
    #[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    pub struct Item {
        kind: Kind,
        name: String,
        sizes: Vec<u16>,
    }

    #[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    enum Kind {
        #[default]
        Plain,
        Boxed(u8),
        Labelled {
            label: Option<String>,
        },
    }

    impl Arbitrary for Item {
        type Parameters = ();
        type Strategy = BoxedStrategy<Item>;
        fn arbitrary_with((): ()) -> Self::Strategy {
            let kind = prop_oneof![
                Just(Kind::Plain),
                any::<u8>().prop_map(Kind::Boxed),
                proptest::option::of("[xy]{0,2}").prop_map(|label| Kind::Labelled { label }),
            ];
            (
                kind,
                "[ab]{0,2}",
                proptest::collection::vec(any::<u16>(), 0..3),
            )
                .prop_map(|(kind, name, sizes)| Item { kind, name, sizes })
                .boxed()
        }
    }
}
