use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Dot, ReplicaId, VersionVector};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::Merge;

/// An exact set of dots, compacted into ranges per replica.
///
/// Where a [`VersionVector`] can only say "everything up to `n`", a causal
/// context can hold gaps: `{r1: 1..=5, 8..=9}`. Contiguous dots collapse into
/// one range, so a context that has seen everything costs one range per
/// replica no matter how many events there were, and the removed elements
/// of an [`OrSet`](crate::OrSet) cost nothing beyond the ranges that already
/// describe what was seen.
///
/// A causal context is a grow-only set of dots; [`Merge`] is set union.
///
/// # Examples
///
/// ```
/// use calm::causal::{CausalContext, Dot, ReplicaId};
///
/// let r = ReplicaId::new(1);
/// let mut ctx = CausalContext::new();
/// for c in [1, 2, 3, 5] {
///     ctx.insert(Dot::new(r, c));
/// }
/// assert!(ctx.contains(Dot::new(r, 2)));
/// assert!(!ctx.contains(Dot::new(r, 4)));
/// assert_eq!(ctx.version_vector().get(r), 3); // the gap at 4 stops it
/// assert_eq!(ctx.ranges(r).collect::<Vec<_>>(), vec![(1, 3), (5, 5)]);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "ContextRepr", into = "ContextRepr")]
pub struct CausalContext {
    /// Per replica, the dots seen as inclusive `(start, end)` counter
    /// ranges: sorted, `start >= 1`, `start <= end`, and separated by at
    /// least one missing counter (adjacent ranges are always joined). A
    /// replica with no dots has no entry, so equal sets compare equal.
    ranges: BTreeMap<ReplicaId, Vec<(u64, u64)>>,
}

impl CausalContext {
    /// Creates an empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `dot` is in the set.
    pub fn contains(&self, dot: Dot) -> bool {
        self.ranges
            .get(&dot.replica())
            .is_some_and(|rs| range_index(rs, dot.counter()).is_ok())
    }

    /// Adds `dot` to the set, joining it with neighbouring ranges.
    pub fn insert(&mut self, dot: Dot) {
        let rs = self.ranges.entry(dot.replica()).or_default();
        let c = dot.counter();
        let Err(idx) = range_index(rs, c) else {
            return; // already present
        };
        let joins_prev = idx > 0 && rs[idx - 1].1.checked_add(1) == Some(c);
        let joins_next = idx < rs.len() && c.checked_add(1) == Some(rs[idx].0);
        match (joins_prev, joins_next) {
            (true, true) => {
                rs[idx - 1].1 = rs[idx].1;
                rs.remove(idx);
            }
            (true, false) => rs[idx - 1].1 = c,
            (false, true) => rs[idx].0 = c,
            (false, false) => rs.insert(idx, (c, c)),
        }
    }

    /// The next dot `replica` should use: one past the highest it has made.
    ///
    /// # Panics
    ///
    /// If `replica` has already used counter `u64::MAX`.
    #[track_caller]
    pub fn next_dot(&self, replica: ReplicaId) -> Dot {
        let max = self.max_counter(replica);
        match max.checked_add(1) {
            Some(next) => Dot::new(replica, next),
            None => exhausted(),
        }
    }

    /// The highest counter of `replica` in the set (0 if none).
    pub fn max_counter(&self, replica: ReplicaId) -> u64 {
        self.ranges
            .get(&replica)
            .and_then(|rs| rs.last())
            .map_or(0, |r| r.1)
    }

    /// The contiguous prefix of the set: for each replica, the end of the
    /// range that starts at 1.
    ///
    /// This is what a replica tells a peer it has seen; a delta computed
    /// against it is safe to merge because every dot it names is in `self`.
    pub fn version_vector(&self) -> VersionVector {
        self.ranges
            .iter()
            .filter_map(|(&r, rs)| match rs.first() {
                Some(&(1, end)) => Some((r, end)),
                _ => None,
            })
            .collect()
    }

    /// The dots of `replica` as inclusive `(start, end)` ranges, in order.
    pub fn ranges(&self, replica: ReplicaId) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.get(&replica).into_iter().flatten().copied()
    }

    /// The replicas with at least one dot in the set.
    pub fn replicas(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.ranges.keys().copied()
    }

    /// How many ranges the set is stored as (a measure of its size).
    pub fn range_count(&self) -> usize {
        self.ranges.values().map(Vec::len).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Builds the set of the given dots in `O(n log n)`, whatever their
    /// order.
    pub fn from_dots(dots: impl IntoIterator<Item = Dot>) -> Self {
        let mut per_replica: BTreeMap<ReplicaId, Vec<u64>> = BTreeMap::new();
        for d in dots {
            per_replica
                .entry(d.replica())
                .or_default()
                .push(d.counter());
        }
        let ranges = per_replica
            .into_iter()
            .map(|(r, mut cs)| {
                cs.sort_unstable();
                let mut rs: Vec<(u64, u64)> = Vec::new();
                for c in cs {
                    match rs.last_mut() {
                        Some(last) if c <= last.1.saturating_add(1) => last.1 = last.1.max(c),
                        _ => rs.push((c, c)),
                    }
                }
                (r, rs)
            })
            .collect();
        Self { ranges }
    }

    /// The dots of `self` that are not in `other`.
    pub fn difference(&self, other: &Self) -> Self {
        let mut ranges = BTreeMap::new();
        for (r, rs) in &self.ranges {
            let out = match other.ranges.get(r) {
                Some(minus) => subtract_ranges(rs, minus),
                None => rs.clone(),
            };
            if !out.is_empty() {
                ranges.insert(*r, out);
            }
        }
        Self { ranges }
    }

    /// The dots of `self` that are not summarised by `vv`.
    pub fn above(&self, vv: &VersionVector) -> Self {
        let prefix = Self::from(vv);
        self.difference(&prefix)
    }
}

impl From<&VersionVector> for CausalContext {
    /// The set of every dot the version vector includes.
    fn from(vv: &VersionVector) -> Self {
        Self {
            ranges: vv.iter().map(|(r, c)| (r, vec![(1, c)])).collect(),
        }
    }
}

#[cold]
#[track_caller]
fn exhausted() -> ! {
    panic!("a replica used every u64 dot counter")
}

/// Finds `c` in sorted disjoint ranges: `Ok(i)` if range `i` holds it,
/// `Err(i)` with the index where a range starting at `c` would go.
fn range_index(rs: &[(u64, u64)], c: u64) -> Result<usize, usize> {
    let idx = rs.partition_point(|&(start, _)| start <= c);
    if idx > 0 && rs[idx - 1].1 >= c {
        Ok(idx - 1)
    } else {
        Err(idx)
    }
}

/// Union of two normalised range lists, normalised.
fn union_ranges(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = if j >= b.len() || (i < a.len() && a[i].0 <= b[j].0) {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        match out.last_mut() {
            // Overlapping or adjacent: extend the last range.
            Some(last) if next.0 <= last.1.saturating_add(1) => last.1 = last.1.max(next.1),
            _ => out.push(next),
        }
    }
    out
}

/// `a` minus `b`, both normalised; the result is normalised.
fn subtract_ranges(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(start, end) in a {
        let mut cur = start;
        // Skip ranges of `b` that end before this one starts.
        while j < b.len() && b[j].1 < cur {
            j += 1;
        }
        let mut k = j;
        let mut done = false;
        while k < b.len() && b[k].0 <= end {
            if b[k].0 > cur {
                out.push((cur, b[k].0 - 1));
            }
            match b[k].1.checked_add(1) {
                Some(next) if next <= end => cur = next,
                _ => {
                    done = true;
                    break;
                }
            }
            k += 1;
        }
        if !done {
            out.push((cur, end));
        }
    }
    out
}

impl Merge for CausalContext {
    fn merge(&mut self, other: &Self) {
        for (r, theirs) in &other.ranges {
            match self.ranges.get_mut(r) {
                Some(ours) if ours != theirs => *ours = union_ranges(ours, theirs),
                Some(_) => {}
                None => {
                    self.ranges.insert(*r, theirs.clone());
                }
            }
        }
    }
}

impl std::fmt::Debug for CausalContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct Ranges<'a>(&'a [(u64, u64)]);
        impl std::fmt::Debug for Ranges<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_list()
                    .entries(self.0.iter().map(|(s, e)| s..=e))
                    .finish()
            }
        }
        f.debug_map()
            .entries(self.ranges.iter().map(|(r, rs)| (r, Ranges(rs))))
            .finish()
    }
}

/// Why a serialized causal context was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("causal context ranges must be sorted, disjoint, non-adjacent and start at 1 or later")]
struct UnnormalisedRanges;

/// The serde form of a [`CausalContext`], checked on the way in.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
struct ContextRepr(BTreeMap<ReplicaId, Vec<(u64, u64)>>);

impl TryFrom<ContextRepr> for CausalContext {
    type Error = UnnormalisedRanges;
    fn try_from(ContextRepr(mut ranges): ContextRepr) -> Result<Self, Self::Error> {
        ranges.retain(|_, rs| !rs.is_empty());
        for rs in ranges.values() {
            let mut prev_end: Option<u64> = None;
            for &(s, e) in rs {
                let ok_start = match prev_end {
                    None => s >= 1,
                    Some(p) => p.checked_add(1).is_some_and(|n| s > n),
                };
                if !ok_start || s > e {
                    return Err(UnnormalisedRanges);
                }
                prev_end = Some(e);
            }
        }
        Ok(Self { ranges })
    }
}

impl From<CausalContext> for ContextRepr {
    fn from(ctx: CausalContext) -> Self {
        Self(ctx.ranges)
    }
}

impl Codec for CausalContext {
    /// Per replica: the id, the range count, then each range as the gap
    /// after the previous range's end and its length minus one, so the
    /// common "1..=n" costs two or three bytes.
    fn encode(&self, enc: &mut Encoder) {
        enc.length(self.ranges.len());
        for (r, rs) in &self.ranges {
            r.encode(enc);
            enc.length(rs.len());
            let mut prev_end = 0;
            for &(s, e) in rs {
                enc.varint(s - prev_end - 1);
                enc.varint(e - s);
                prev_end = e;
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let mut ranges = BTreeMap::new();
        let mut failure = None;
        codec::decode_sorted_by_key(
            dec,
            |dec| {
                let r = ReplicaId::decode(dec)?;
                let n = dec.length()?;
                if n == 0 {
                    return Err(dec.invalid("replica with no ranges"));
                }
                let mut rs = Vec::with_capacity(n);
                let mut prev_end = 0u64;
                for i in 0..n {
                    let gap = dec.varint()?;
                    let len = dec.varint()?;
                    if i > 0 && gap == 0 {
                        failure.get_or_insert(dec.invalid("adjacent ranges not joined"));
                    }
                    let start = prev_end.checked_add(1).and_then(|s| s.checked_add(gap));
                    let end = start.and_then(|s| s.checked_add(len));
                    let (Some(start), Some(end)) = (start, end) else {
                        return Err(dec.invalid("dot counter overflows u64"));
                    };
                    rs.push((start, end));
                    prev_end = end;
                }
                Ok((r, rs))
            },
            |(r, _)| r,
            |(r, rs)| {
                ranges.insert(r, rs);
            },
        )?;
        match failure {
            Some(e) => Err(e),
            None => Ok(Self { ranges }),
        }
    }
}

impl Tagged for CausalContext {
    const TAG: u8 = codec::tags::CAUSAL_CONTEXT;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const R: ReplicaId = ReplicaId::new(1);

    fn ctx_of(counters: &BTreeSet<u64>) -> CausalContext {
        let mut ctx = CausalContext::new();
        for &c in counters {
            ctx.insert(Dot::new(R, c));
        }
        ctx
    }

    fn counters(ctx: &CausalContext) -> BTreeSet<u64> {
        ctx.ranges(R).flat_map(|(s, e)| s..=e).collect()
    }

    proptest! {
        /// Insert, union, difference and the version vector agree with a
        /// plain set of counters, and ranges stay normalised.
        #[test]
        fn matches_a_set_model(
            a in proptest::collection::btree_set(1u64..40, 0..30),
            b in proptest::collection::btree_set(1u64..40, 0..30),
        ) {
            let (ca, cb) = (ctx_of(&a), ctx_of(&b));
            prop_assert_eq!(counters(&ca), a.clone());
            prop_assert!(CausalContext::try_from(ContextRepr::from(ca.clone())).is_ok());

            let mut u = ca.clone();
            u.merge(&cb);
            prop_assert_eq!(counters(&u), a.union(&b).copied().collect::<BTreeSet<_>>());
            prop_assert!(CausalContext::try_from(ContextRepr::from(u.clone())).is_ok());
            prop_assert_eq!(u, ctx_of(&a.union(&b).copied().collect()));

            let d = ca.difference(&cb);
            prop_assert_eq!(counters(&d), a.difference(&b).copied().collect::<BTreeSet<_>>());
            prop_assert_eq!(d, ctx_of(&a.difference(&b).copied().collect()));

            let prefix = (1..).take_while(|c| a.contains(c)).count() as u64;
            prop_assert_eq!(ca.version_vector().get(R), prefix);

            let bytes = codec::to_bytes(&ca);
            prop_assert_eq!(codec::from_bytes::<CausalContext>(&bytes).unwrap(), ca);
        }
    }

    /// Ranges ending at `u64::MAX` are handled without overflow.
    #[test]
    fn extreme_counters() {
        let mut ctx = CausalContext::new();
        ctx.insert(Dot::new(R, u64::MAX));
        ctx.insert(Dot::new(R, u64::MAX - 1));
        assert_eq!(
            ctx.ranges(R).collect::<Vec<_>>(),
            vec![(u64::MAX - 1, u64::MAX)]
        );
        let d = ctx.difference(&ctx_of(&[u64::MAX].into()));
        assert_eq!(
            d.ranges(R).collect::<Vec<_>>(),
            vec![(u64::MAX - 1, u64::MAX - 1)]
        );
        let bytes = codec::to_bytes(&ctx);
        assert_eq!(codec::from_bytes::<CausalContext>(&bytes).unwrap(), ctx);
    }
}
