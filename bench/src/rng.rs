//! A tiny deterministic random number generator (xorshift64*), so every
//! run of a benchmark sees the same workload.

/// xorshift64* with a fixed seed.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (zero is remapped).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Ranks `0..n` drawn with probability proportional to `1 / (rank + 1)^s`
/// (Zipf's law: rank 0 is the hottest), by a binary search of the
/// cumulative distribution, computed once.
pub struct Zipf {
    /// `cdf[r]`: the probability of a rank at most `r`; the last is 1.
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `n` ranks (`n > 0`) with exponent `s`.
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf: Vec<f64> = (1..=n)
            .scan(0.0, |sum, rank| {
                *sum += (rank as f64).powf(-s);
                Some(*sum)
            })
            .collect();
        let total = cdf[n - 1];
        for c in &mut cdf {
            *c /= total;
        }
        // Rounding must not leave a draw above the last bucket.
        cdf[n - 1] = 1.0;
        Self { cdf }
    }

    /// One rank.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        // 53 random bits: a uniform float in [0, 1).
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|&c| c <= u) as u64
    }
}
