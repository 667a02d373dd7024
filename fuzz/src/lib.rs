//! Shared checks of the fuzz targets.

use calm::Merge;
use calm::codec::{self, Tagged};

/// For targets that reach a dependency calm guards with `catch_unwind`
/// (automerge, which panics on some corrupt documents): libfuzzer-sys's
/// panic hook aborts at the panic, before calm can catch it, so this hook
/// only prints. A panic that calm does not catch still ends the run:
/// libfuzzer-sys aborts on any unwind that reaches the target's boundary.
pub fn abort_only_on_uncaught_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::panic::set_hook(Box::new(|info| eprintln!("{info}"))));
}

/// Decodes `data` as a `T`. Decoding must never panic; a value that decodes
/// must re-encode to exactly the same bytes (calm's encodings are
/// canonical; bytes of an older format version must decode again to the
/// same value once rewritten in the current one) and must merge with itself and with the default state without
/// panicking, and merging must be idempotent.
pub fn canonical<T: Tagged + Merge + Clone + PartialEq + Default + std::fmt::Debug>(data: &[u8]) {
    let Ok(v) = codec::from_bytes::<T>(data) else {
        return;
    };
    if data.first() == Some(&codec::FORMAT_VERSION) {
        assert_eq!(codec::to_bytes(&v), data, "accepted bytes re-encode differently");
    } else {
        // An older format version, rewritten in the current one.
        let again = codec::from_bytes::<T>(&codec::to_bytes(&v)).expect("re-encoded value decodes");
        assert_eq!(again, v, "an accepted value does not survive re-encoding");
    }
    let mut twice = v.clone();
    twice.merge(&v);
    assert_eq!(twice, v, "merge is not idempotent on a decoded value");
    let mut with_default = T::default();
    with_default.merge(&v);
    let mut other = v.clone();
    other.merge(&T::default());
}

/// As [`canonical`] for encodings that are not canonical (serde formats):
/// an accepted value must survive re-encoding.
pub fn stable<T: Tagged + Merge + Clone + PartialEq + Default + std::fmt::Debug>(data: &[u8]) {
    let Ok(v) = codec::from_bytes::<T>(data) else {
        return;
    };
    let again = codec::from_bytes::<T>(&codec::to_bytes(&v)).expect("re-encoded value decodes");
    assert_eq!(again, v, "value changed across re-encoding");
    let mut m = v.clone();
    m.merge(&T::default());
}

/// Splits fuzz input into a selector byte and the rest.
pub fn split(data: &[u8]) -> Option<(u8, &[u8])> {
    data.split_first().map(|(s, rest)| (*s, rest))
}
