//! Codec properties that need the whole crate: allocation bounds on
//! hostile lengths, and type confusion.

use calm::causal::ReplicaId;
use calm::codec::{self, DecodeError, Encoder};
use calm::{GSet, OrMap, OrSet, PnCounter};

use crate::common::alloc::bytes_allocated_by;

/// A length prefix of 2^60 is refused without allocating anything like it,
/// at every level where a length appears.
#[test]
fn length_bomb_allocates_nothing() {
    for depth in 0..3 {
        let mut enc = Encoder::new();
        enc.byte(codec::FORMAT_VERSION);
        enc.byte(<OrSet<String> as codec::Tagged>::TAG);
        // An empty causal context, then (at depth 1+) one element whose
        // string length is the bomb, or (depth 0) the element count.
        enc.length(0);
        if depth == 0 {
            enc.varint(1 << 60);
        } else {
            enc.length(1);
            enc.varint(1 << 60);
        }
        let bytes = enc.into_bytes();
        let (result, allocated) = bytes_allocated_by(|| codec::from_bytes::<OrSet<String>>(&bytes));
        assert!(
            matches!(result, Err(DecodeError::LengthOverflow { declared, .. }) if declared == 1 << 60),
            "{result:?}"
        );
        assert!(allocated < 4096, "allocated {allocated} bytes");
    }
}

/// Bytes of one type are refused as another, and a future format version
/// is refused, each with its own error.
#[test]
fn headers_are_checked() {
    let mut set = GSet::new();
    set.insert(1u64);
    let bytes = codec::to_bytes(&set);
    assert!(matches!(
        codec::from_bytes::<PnCounter>(&bytes),
        Err(DecodeError::WrongType { .. })
    ));
    let mut future = bytes.clone();
    future[0] = codec::FORMAT_VERSION + 1;
    assert!(matches!(
        codec::from_bytes::<GSet<u64>>(&future),
        Err(DecodeError::UnsupportedVersion { .. })
    ));
    assert!(matches!(
        codec::from_bytes::<GSet<u64>>(&[]),
        Err(DecodeError::Truncated { .. })
    ));
}

/// Encodings are compact: a 1,000-element set of small integers from one
/// replica costs about three bytes per element.
#[test]
fn encodings_are_compact() {
    let r = ReplicaId::new(1);
    let set: OrSet<u32> = (0..1000).map(|i| (r, i)).collect();
    let len = codec::to_bytes(&set).len();
    assert!(len < 1000 * 6, "{len} bytes");
    let mut map: OrMap<u16, PnCounter> = OrMap::new();
    for k in 0..100 {
        map.update(r, k, |c| c.increment(r, 1));
    }
    let len = codec::to_bytes(&map).len();
    assert!(len < 100 * 12, "{len} bytes");
}

/// Fuzz regression (decode_text, crash-cff0bfe): a hidden-stretch offset
/// that overflowed while decoding a text document is an error, not a
/// panic.
#[test]
fn fuzz_text_hidden_offset_overflow() {
    let bytes = [
        1, 13, 0, 3, 239, 2, 255, 1, 0, 1, 4, 1, 12, 1, 1, 12, 255, 1, 255, 1, 0, 32, 126, 88, 32,
        254, 51, 128, 255, 255, 255, 255, 255, 255, 255, 255, 1, 1, 11, 59, 128, 55, 128, 0,
    ];
    assert!(codec::from_bytes::<calm::text::Text>(&bytes).is_err());
}

/// Fuzz regression (decode_text, crash-1bbdd62): a delete target whose
/// counter plus length overflows is refused while decoding.
#[test]
fn fuzz_text_delete_target_overflow() {
    let bytes = [
        1, 12, 1, 255, 255, 255, 255, 255, 255, 255, 255, 255, 1, 1, 1, 1, 36, 168, 2, 2, 2, 2, 2,
        33, 255, 255, 255, 255, 255, 255, 254, 255, 255, 255,
    ];
    assert!(codec::from_bytes::<calm::text::TextOp>(&bytes).is_err());
}
