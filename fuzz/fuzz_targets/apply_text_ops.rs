//! Remote text ops in arbitrary order: the input is a sequence of encoded
//! ops (each length-prefixed). They are applied to a document in the given
//! order; ops may be garbage, duplicated, out of causal order or refer to
//! missing dependencies. Nothing may panic and the document must stay
//! consistent after every op.
#![no_main]

use calm::causal::ReplicaId;
use calm::codec::{self, Decoder};
use calm::text::{Text, TextOp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut doc = Text::new(ReplicaId::new(1));
    let mut dec = Decoder::new(data);
    while dec.remaining() > 0 {
        let Ok(bytes) = dec.bytes() else { break };
        if let Ok(op) = codec::from_bytes::<TextOp>(bytes) {
            let before = doc.to_string();
            match doc.apply(&op) {
                Ok(_) => {}
                Err(_) => assert_eq!(doc.to_string(), before, "a refused op changed the document"),
            }
            doc.assert_invariants();
        }
    }
});
