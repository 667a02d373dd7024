//! Values as stores hold them: what `merge_into` and `read_merged` decode
//! (calm's codec, including the adapters' routes for `crdts` types and
//! automerge documents).
#![no_main]

use calm_fuzz::{abort_only_on_uncaught_panics, canonical, split, stable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    abort_only_on_uncaught_panics();
    let Some((which, bytes)) = split(data) else { return };
    match which % 6 {
        0 => canonical::<calm::occ::Versioned<u64>>(bytes),
        1 => stable::<crdts::Orswot<u8, u64>>(bytes),
        2 => stable::<crdts::GCounter<u64>>(bytes),
        3 => stable::<crdts::MVReg<u8, u64>>(bytes),
        4 => stable::<crdts::Map<u8, crdts::MVReg<u8, u64>, u64>>(bytes),
        _ => {
            if let Ok(doc) = calm::codec::from_bytes::<calm::adapt::automerge::Document>(bytes) {
                let _ = calm::codec::to_bytes(&doc);
            }
        }
    }
});
