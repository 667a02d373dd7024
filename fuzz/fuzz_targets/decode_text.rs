//! The text decoders: whole documents (and deltas, which are documents)
//! and single ops. A decoded document must pass its own invariant check.
#![no_main]

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
        }
    } else if let Ok(op) = codec::from_bytes::<TextOp>(bytes) {
        assert_eq!(codec::to_bytes(&op), bytes, "accepted op re-encodes differently");
    }
});
