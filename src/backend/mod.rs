//! Stores beyond one machine: the same [`Store`](crate::store::Store)
//! model on PostgreSQL (feature `postgres`) and etcd (feature `etcd`).
//!
//! Both pass the same conformance suite as
//! [`MemoryStore`](crate::store::MemoryStore)
//! ([`testing::conformance`](crate::testing)), so every recipe in
//! [`coord`](crate::coord) runs on them unchanged.
//!
//! `redis` (feature `redis`) is not a store: it holds efficiency locks,
//! deliberately without fencing tokens.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
