//! Every CRDT decoder of calm: the first byte picks the type, the rest are
//! the bytes to decode (header included).
#![no_main]

use calm::causal::{CausalContext, VersionVector};
use calm::{GCounter, GSet, LwwRegister, MvRegister, OrMap, OrSet, PnCounter, TwoPhaseSet};
use calm_fuzz::{canonical, split};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((which, bytes)) = split(data) else { return };
    match which % 12 {
        0 => canonical::<GCounter>(bytes),
        1 => canonical::<PnCounter>(bytes),
        2 => canonical::<GSet<String>>(bytes),
        3 => canonical::<TwoPhaseSet<u64>>(bytes),
        4 => canonical::<OrSet<String>>(bytes),
        5 => canonical::<LwwRegister<String>>(bytes),
        6 => canonical::<MvRegister<u64>>(bytes),
        7 => canonical::<OrMap<String, PnCounter>>(bytes),
        8 => canonical::<OrMap<u8, OrMap<u8, OrSet<u8>>>>(bytes),
        9 => canonical::<VersionVector>(bytes),
        10 => canonical::<CausalContext>(bytes),
        _ => canonical::<calm::occ::Versioned<String>>(bytes),
    }
});
