//! Values as stores hold them: what `merge_into` and `read_merged` decode
//! (calm's codec, including the adapter routes for `crdts` types; automerge
//! documents have their own target, `decode_automerge`).
#![no_main]

use calm_fuzz::{canonical, split, stable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((which, bytes)) = split(data) else { return };
    match which % 5 {
        0 => canonical::<calm::occ::Versioned<u64>>(bytes),
        1 => stable::<crdts::Orswot<u8, u64>>(bytes),
        2 => stable::<crdts::GCounter<u64>>(bytes),
        3 => stable::<crdts::MVReg<u8, u64>>(bytes),
        _ => stable::<crdts::Map<u8, crdts::MVReg<u8, u64>, u64>>(bytes),
    }
});
