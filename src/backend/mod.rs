//! Stores beyond one machine: the same [`Store`](crate::store::Store)
//! model on PostgreSQL (feature `postgres`) and etcd (feature `etcd`).
//!
//! Both pass the same conformance suite as
//! [`MemoryStore`](crate::store::MemoryStore)
//! ([`testing::conformance`](crate::testing)), so every recipe in
//! [`coord`](crate::coord) runs on them unchanged.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "postgres")]
pub mod postgres;
