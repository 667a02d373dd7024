//! serde input is checked like codec input: states that break an invariant
//! are refused with an error, not stored.

use calm::causal::{CausalContext, ReplicaId};
use calm::{MvRegister, OrSet, TwoPhaseSet};

/// A set whose live dot is outside its context is refused.
#[test]
fn or_set_with_unseen_dot_is_refused() {
    let json = r#"{"entries":{"7":[{"replica":1,"counter":1}]},"ctx":{}}"#;
    let err = serde_json::from_str::<OrSet<String>>(json).unwrap_err();
    assert!(
        err.to_string().contains("outside the causal context"),
        "{err}"
    );
}

/// Unnormalised context ranges and zero counters are refused.
#[test]
fn bad_contexts_are_refused() {
    assert!(serde_json::from_str::<CausalContext>(r#"{"1":[[1,2],[3,4]]}"#).is_err());
    assert!(serde_json::from_str::<CausalContext>(r#"{"1":[[0,2]]}"#).is_err());
    assert!(serde_json::from_str::<CausalContext>(r#"{"1":[[5,2]]}"#).is_err());
    assert!(serde_json::from_str::<CausalContext>(r#"{"1":[[1,2],[4,4]]}"#).is_ok());
    let json = r#"{"values":[[{"replica":1,"counter":0},5]],"ctx":{}}"#;
    assert!(serde_json::from_str::<MvRegister<u8>>(json).is_err());
}

/// JSON round trips keep every state exactly.
#[test]
fn json_round_trips() {
    let r = ReplicaId::new(3);
    let mut s = OrSet::new();
    s.insert(r, "a".to_string());
    s.insert(r, "b".to_string());
    s.remove(&"a".to_string());
    let back: OrSet<String> = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    let mut t = TwoPhaseSet::new();
    t.insert(1u8);
    t.remove(&1);
    let json = serde_json::to_string(&t).unwrap();
    assert_eq!(serde_json::from_str::<TwoPhaseSet<u8>>(&json).unwrap(), t);
    assert!(serde_json::from_str::<TwoPhaseSet<u8>>(r#"{"live":[1],"removed":[1]}"#).is_err());
}

/// Text documents and ops travel through serde as their checked codec
/// bytes: round trips keep them, and corrupted input is refused.
#[test]
fn text_serde_goes_through_the_codec() {
    let mut doc = calm::Text::new(ReplicaId::new(1));
    let op = doc.insert(0, "héllo 😀").unwrap();
    doc.delete(1..3).unwrap();
    let json = serde_json::to_string(&doc).unwrap();
    assert_eq!(serde_json::from_str::<calm::Text>(&json).unwrap(), doc);
    let op_json = serde_json::to_string(&op).unwrap();
    assert_eq!(serde_json::from_str::<calm::TextOp>(&op_json).unwrap(), op);
    assert!(serde_json::from_str::<calm::Text>("[1,12,1,1]").is_err());
    assert!(serde_json::from_str::<calm::TextOp>(&json).is_err());
}
