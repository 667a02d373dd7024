//! The tree's index from local versions to leaves (see `tree.rs`): an
//! ordered map from the first local version of each range to a leaf, kept
//! with leaf numbers in 16 bits while the tree has at most 65,536 leaves,
//! which is every document up to tens of megabytes. A B-tree node of the
//! map then takes 80 bytes instead of 104 (eleven keys and values, and a
//! parent link), so the index, which holds an entry for each place where
//! concurrent or scattered typing left neighbouring local versions in
//! different leaves, takes about a quarter less memory; it is widened to
//! 32 bits, once, by the insert of a larger leaf number.

use std::collections::BTreeMap;
use std::ops::RangeBounds;

/// The map; see the module docs.
#[derive(Clone, Debug)]
pub(super) enum LeafIndex {
    /// Every leaf number fits in 16 bits.
    Narrow(BTreeMap<u32, u16>),
    /// Some leaf number does not.
    Wide(BTreeMap<u32, u32>),
}

/// The last entry of `map` in `range`, as `(first local version, leaf)`.
fn last_in<V: Copy + Into<u32>>(
    map: &BTreeMap<u32, V>,
    range: impl RangeBounds<u32>,
) -> Option<(u32, u32)> {
    map.range(range).next_back().map(|(&k, &v)| (k, v.into()))
}

/// Removes every entry of `map` whose key is in `start ..= end`.
fn remove_in<V>(map: &mut BTreeMap<u32, V>, start: u32, end: u32) {
    while let Some(&k) = map.range(start..=end).next().map(|(k, _)| k) {
        map.remove(&k);
    }
}

impl LeafIndex {
    /// The map of `entries` (sorted by key, keys distinct).
    pub(super) fn from_sorted(entries: Vec<(u32, u32)>) -> Self {
        if entries.iter().all(|&(_, leaf)| leaf <= u32::from(u16::MAX)) {
            Self::Narrow(entries.into_iter().map(|(k, l)| (k, l as u16)).collect())
        } else {
            Self::Wide(entries.into_iter().collect())
        }
    }

    /// The entry with the greatest key in `range`.
    pub(super) fn last(&self, range: impl RangeBounds<u32>) -> Option<(u32, u32)> {
        match self {
            Self::Narrow(map) => last_in(map, range),
            Self::Wide(map) => last_in(map, range),
        }
    }

    /// Maps `lv` to `leaf`, widening the map first if `leaf` needs it.
    pub(super) fn insert(&mut self, lv: u32, leaf: u32) {
        if let Self::Narrow(map) = self {
            if let Ok(narrow) = u16::try_from(leaf) {
                map.insert(lv, narrow);
                return;
            }
            let wide = std::mem::take(map).into_iter();
            *self = Self::Wide(wide.map(|(k, l)| (k, u32::from(l))).collect());
        }
        if let Self::Wide(map) = self {
            map.insert(lv, leaf);
        }
    }

    /// Removes the entries whose keys are in `start ..= end`.
    pub(super) fn remove(&mut self, start: u32, end: u32) {
        match self {
            Self::Narrow(map) => remove_in(map, start, end),
            Self::Wide(map) => remove_in(map, start, end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The narrow map answers as a plain map does, and widens, keeping
    /// every entry, at the first leaf past 16 bits.
    #[test]
    fn narrow_until_a_leaf_needs_more_bits() {
        let mut index = LeafIndex::from_sorted(vec![(0, 3), (10, 7), (20, 3)]);
        let mut plain: BTreeMap<u32, u32> = [(0, 3), (10, 7), (20, 3)].into();
        let check = |index: &LeafIndex, plain: &BTreeMap<u32, u32>| {
            for lv in 0..80 {
                let expected = plain.range(..=lv).next_back().map(|(&k, &v)| (k, v));
                assert_eq!(index.last(..=lv), expected, "lv {lv}");
            }
        };
        check(&index, &plain);
        index.remove(5, 20);
        plain.retain(|&k, _| !(5..=20).contains(&k));
        index.insert(30, 65_535);
        plain.insert(30, 65_535);
        assert!(matches!(index, LeafIndex::Narrow(_)));
        check(&index, &plain);
        index.insert(40, 65_536);
        plain.insert(40, 65_536);
        assert!(matches!(index, LeafIndex::Wide(_)));
        check(&index, &plain);
        assert!(matches!(
            LeafIndex::from_sorted(vec![(0, 1), (9, 70_000)]),
            LeafIndex::Wide(_)
        ));
    }
}
