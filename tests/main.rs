//! calm's integration tests: one binary, modules mirroring `src/`.

mod backends;
mod codec;
mod common;
mod coord;
mod harness;
mod laws;
mod serde_input;
mod store;
