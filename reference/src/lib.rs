//! calm's `Text` checked against diamond-types, the reference
//! implementation of the ordering rule it follows. The check is this
//! crate's test, `tests/text_reference.rs` (`cargo test -p calm-reference
//! --release`); the library is empty. It is a crate of its own so that it
//! builds with calm and diamond-types only, not with the bench crate's
//! other peers and clients.
