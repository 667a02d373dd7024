//! calm's integration tests: one binary, modules mirroring `src/`.

mod codec;
mod common;
mod harness;
mod laws;
mod serde_input;
mod text;
