//! The crate-level error, for code that mixes calm's areas and wants one
//! `?`-able type.

use crate::codec::DecodeError;
use crate::coord::CoordError;
use crate::counter::CounterOverflow;
use crate::occ::RetryExhausted;
use crate::partition::SerialError;
use crate::store::StoreError;
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
    /// A store operation failed (see [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A coordination recipe failed or refused (see [`CoordError`]; a
    /// fenced write is [`CoordError::Fenced`]).
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// An in-process optimistic update ran out of attempts (see
    /// [`RetryExhausted`]).
    #[error(transparent)]
    Retry(#[from] RetryExhausted),
    /// Work submitted to a single writer was refused or failed (see
    /// [`SerialError`]).
    #[error(transparent)]
    Serial(#[from] SerialError),
}

/// Writes `e` and every cause under it, `: `-separated: for reports that
/// show a whole chain at once (a loss's `Display`), not for error links.
pub(crate) fn write_chain(
    f: &mut std::fmt::Formatter<'_>,
    e: &(dyn std::error::Error + 'static),
) -> std::fmt::Result {
    write!(f, "{e}")?;
    let mut next = e.source();
    while let Some(cause) = next {
        write!(f, ": {cause}")?;
        next = cause.source();
    }
    Ok(())
}
