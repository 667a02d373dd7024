//! The [`Store`](crate::store::Store) model on etcd, whose native model it
//! is.
//!
//! Every call maps to one etcd request: revisions are etcd's revisions,
//! `Expect` and transaction compares are etcd `Compare`s, leases are etcd
//! leases (their expiry judged by the etcd leader's clock), and watches are
//! etcd watches, with etcd's compaction error mapped to
//! [`StoreError::Compacted`](crate::store::StoreError::Compacted).
//!
//! calm speaks etcd's gRPC API through `tonic` with the few messages it
//! needs declared in Rust (`wire.rs`), so building it needs no `protoc`
//! and pulls in no gRPC server. For TLS, build a
//! [`tonic::transport::Channel`] with your certificates (enable one of
//! tonic's `tls-*` features in your own `Cargo.toml`) and pass it to
//! [`EtcdStore::from_channel`].
//!
//! # Differences from the other backends
//!
//! - DIFFERENCE: etcd grants TTLs in whole seconds with a minimum of about
//!   two seconds (its election timeout);
//!   [`Store::grant`](crate::store::Store::grant) rounds up and reports the
//!   TTL actually granted.
//! - DIFFERENCE: a write whose connection fails after it was sent may or
//!   may not have been applied by the cluster; such failures are reported
//!   as [`StoreError::Indeterminate`](crate::store::StoreError::Indeterminate)
//!   (a conditional rewrite settles it: see
//!   [`Store::put`](crate::store::Store::put)). A request that never reached a server is
//!   [`StoreError::Unavailable`](crate::store::StoreError::Unavailable).

mod store;
mod wire;

pub use store::{EtcdOptions, EtcdStore, EtcdWatch};
