//! calm's integration tests: one binary, modules mirroring `src/`.

mod codec;
mod common;
mod coord_idempotent;
mod coord_ownership;
mod harness;
mod laws;
mod serde_input;
mod store;
