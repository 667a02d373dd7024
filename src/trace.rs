//! Log events through `tracing` when the `tracing` feature is on, and
//! nothing at all when it is off: call sites use these macros the same way
//! either way.
//!
//! What calm reports: a lease renewal that failed (warn), recovered (info)
//! or was given up on with its cause (error); a retry loop backing off
//! (debug) or giving up (warn); a watch reading again after a connection
//! failure (warn); the PostgreSQL listener reconnecting (info).

#[cfg(feature = "tracing")]
pub(crate) use tracing::{debug, error, info, warn};

/// Expands to nothing (the `tracing` feature is off).
#[cfg(not(feature = "tracing"))]
macro_rules! nothing {
    ($($t:tt)*) => {{}};
}

#[cfg(not(feature = "tracing"))]
pub(crate) use {nothing as debug, nothing as error, nothing as info, nothing as warn};
