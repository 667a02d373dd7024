//! Helpers shared by the integration tests.

pub mod alloc;
pub mod traces;
pub mod world;
