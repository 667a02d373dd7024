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
