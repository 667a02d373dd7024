//! The crate-level error, for code that mixes calm's areas and wants one
//! `?`-able type.

use crate::codec::DecodeError;
use crate::counter::CounterOverflow;
use crate::text::TextError;

/// Any error calm returns.
///
/// Each area has its own precise error type; this enum wraps them so an
/// application can use `?` across areas and still `match` on the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bytes could not be decoded (see [`DecodeError`]).
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A counter slot would overflow (see [`CounterOverflow`]).
    #[error(transparent)]
    CounterOverflow(#[from] CounterOverflow),
    /// A text edit, conversion or op was refused (see [`TextError`]).
    #[error(transparent)]
    Text(#[from] TextError),
}
