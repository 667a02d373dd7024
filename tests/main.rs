//! calm's integration tests: one binary, modules mirroring `src/`.

mod adapt;
mod backends;
mod codec;
mod common;
mod coord;
mod coord_idempotent;
mod coord_leader;
mod coord_ownership;
mod derive;
mod errors;
#[cfg(feature = "etcd")]
mod etcd_cluster;
#[cfg(any(feature = "postgres", feature = "etcd"))]
mod faults;
mod fuzz_seeds;
mod harness;
mod laws;
mod partition;
mod partition_log;
#[cfg(feature = "postgres")]
mod pg_fence;
#[cfg(feature = "redis")]
mod redis;
mod serde_input;
#[cfg(any(feature = "postgres", feature = "etcd"))]
mod server_faults;
mod sim;
mod store;
mod sync;
mod text;
