//! The text decoders: whole documents (and deltas, which are documents)
//! and single ops. A decoded document must pass its own invariant check,
//! and stay editable: local edits, a concurrent edit from a fork, and
//! merges both ways must not panic and must keep the invariants.
#![no_main]

use calm::Merge;
use calm::causal::ReplicaId;
use calm::codec;
use calm::text::{Text, TextOp};
use calm_fuzz::split;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((which, bytes)) = split(data) else { return };
    if which % 2 == 0 {
        if let Ok(doc) = codec::from_bytes::<Text>(bytes) {
            doc.assert_invariants();
            let again = codec::to_bytes(&doc);
            let back = codec::from_bytes::<Text>(&again).expect("re-encoded document decodes");
            assert_eq!(back.to_string(), doc.to_string());
            let n = doc.len();
            let mut a = doc.fork(ReplicaId::new(u64::MAX - 1));
            let mut b = doc.fork(ReplicaId::new(u64::MAX));
            for (i, at) in [0, n / 2, n].into_iter().enumerate() {
                a.insert(at, "ab").expect("in range");
                b.insert(n - at, "cd").expect("in range");
                if n > 0 && i == 1 {
                    a.delete(at.saturating_sub(1)..at.max(1)).expect("in range");
                }
            }
            a.merge(&b);
            b.merge(&a);
            a.assert_invariants();
            b.assert_invariants();
        }
    } else if let Ok(op) = codec::from_bytes::<TextOp>(bytes) {
        let again = codec::to_bytes(&op);
        // Bytes of an older format version are rewritten in the current one.
        assert_eq!(again[1..], bytes[1..], "accepted op re-encodes differently");
    }
});
