//! Side-by-side benchmarks of calm against its peers.
fn main() {}
