//! Why a submission was refused or a piece of work did not produce its
//! output.

use std::any::Any;
use std::fmt;

/// Why work given to a [`SerialExecutor`](super::SerialExecutor) was not
/// accepted, or did not produce its output.
///
/// The first three variants refuse a submission (they come back inside a
/// [`Rejected`], with the work); the last two fail an accepted piece of
/// work (they come out of its [`Completion`](super::Completion)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SerialError {
    /// A `try_submit*` call found the key's queue full: `capacity` pieces
    /// of work already wait for the key, not yet started. Nothing was
    /// accepted.
    /// Retry later, wait for room with `submit*`, or shed the load.
    #[error("the key's queue is full ({capacity} pieces of work already wait)")]
    Full {
        /// The per-key queue capacity
        /// ([`SerialOptions::queue_capacity`](super::SerialOptions::queue_capacity)).
        capacity: usize,
    },
    /// The executor was closed ([`close`](super::SerialExecutor::close) or
    /// [`shutdown`](super::SerialExecutor::shutdown)) before the work was
    /// accepted. Nothing was accepted; give up, or hand the work to
    /// another executor.
    #[error("the executor is closed and accepts no more work")]
    Closed,
    /// The first submission for an idle key was made outside a Tokio
    /// runtime, so no task could be spawned to run it. Nothing was
    /// accepted; submit from inside a runtime.
    #[error("no Tokio runtime: a key's queue is drained by a Tokio task")]
    NoRuntime,
    /// The work panicked while it ran. Its key is unaffected: the work
    /// submitted after it still runs, in order. Other keys never notice.
    /// Treat it like the panic it is (a bug in the work).
    #[error("the work panicked: {}", message.as_deref().unwrap_or("(the payload is not a string)"))]
    Panicked {
        /// The panic's message, when its payload was a string (as with
        /// `panic!` and failed assertions).
        message: Option<String>,
    },
    /// The work was accepted but dropped before it finished, because the
    /// Tokio runtime that ran its key shut down (the runtime was dropped
    /// with the work queued or running). The work may have partly run;
    /// everything queued behind it for the key was dropped the same way.
    #[error("the work was dropped unfinished: the runtime running its key shut down")]
    Abandoned,
}

impl SerialError {
    /// Whether the same submission may succeed later (only [`Full`](Self::Full)).
    pub fn is_retryable(&self) -> bool {
        matches!(self, SerialError::Full { .. })
    }

    /// Whether this is [`Full`](Self::Full).
    pub fn is_full(&self) -> bool {
        matches!(self, SerialError::Full { .. })
    }

    /// Whether this is [`Closed`](Self::Closed).
    pub fn is_closed(&self) -> bool {
        matches!(self, SerialError::Closed)
    }

    /// Whether this is [`Panicked`](Self::Panicked).
    pub fn is_panicked(&self) -> bool {
        matches!(self, SerialError::Panicked { .. })
    }

    /// The error for a caught panic with this payload.
    pub(crate) fn panicked(payload: &(dyn Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned());
        SerialError::Panicked { message }
    }
}

/// A refused submission: why, and the work itself, handed back unrun.
///
/// A refused submission was never accepted, so the executor neither ran
/// nor kept any part of it: [`into_work`](Self::into_work) returns the
/// very future or closure that was passed in, to retry, reroute or drop.
/// `?` turns it into a [`SerialError`] (dropping the work).
pub struct Rejected<W> {
    /// Why it was refused: [`Full`](SerialError::Full),
    /// [`Closed`](SerialError::Closed) or
    /// [`NoRuntime`](SerialError::NoRuntime).
    error: SerialError,
    /// The work, untouched.
    work: W,
}

impl<W> Rejected<W> {
    pub(crate) fn new(error: SerialError, work: W) -> Self {
        Self { error, work }
    }

    /// Why the submission was refused.
    pub fn error(&self) -> &SerialError {
        &self.error
    }

    /// The work, never run.
    pub fn into_work(self) -> W {
        self.work
    }

    /// The reason and the work.
    pub fn into_parts(self) -> (SerialError, W) {
        (self.error, self.work)
    }
}

impl<W> From<Rejected<W>> for SerialError {
    fn from(rejected: Rejected<W>) -> Self {
        rejected.error
    }
}

impl<W> fmt::Debug for Rejected<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The work is a future or closure, which is rarely `Debug`.
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<W> fmt::Display for Rejected<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<W> std::error::Error for Rejected<W> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Display texts are lowercase with no trailing period.
    #[test]
    fn display_is_lowercase() {
        let all = [
            SerialError::Full { capacity: 3 },
            SerialError::Closed,
            SerialError::NoRuntime,
            SerialError::Panicked { message: None },
            SerialError::Panicked {
                message: Some("boom".into()),
            },
            SerialError::Abandoned,
        ];
        for e in all {
            let text = e.to_string();
            assert!(text.starts_with(|c: char| c.is_lowercase()), "{text}");
            assert!(!text.ends_with('.'), "{text}");
        }
    }

    /// Panic payloads of both string kinds become the message.
    #[test]
    fn panic_messages() {
        let from_str: Box<dyn Any + Send> = Box::new("static");
        let from_string: Box<dyn Any + Send> = Box::new(String::from("owned"));
        let other: Box<dyn Any + Send> = Box::new(7_u8);
        let message = |p: &Box<dyn Any + Send>| match SerialError::panicked(p.as_ref()) {
            SerialError::Panicked { message } => message,
            _ => unreachable!(),
        };
        assert_eq!(message(&from_str).as_deref(), Some("static"));
        assert_eq!(message(&from_string).as_deref(), Some("owned"));
        assert_eq!(message(&other), None);
    }
}

/// Why a [`PartitionLog`](super::PartitionLog) call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// A partition count of 0 or over
    /// [`MAX_PARTITIONS`](super::MAX_PARTITIONS), or a partition number
    /// not below the log's count: a caller bug.
    #[error("partition {partitions} is out of range")]
    InvalidPartitions {
        /// The count or number given.
        partitions: u32,
    },
    /// An entity key or command id that is empty or too long: fix the
    /// input.
    #[error("invalid command: {reason}")]
    InvalidKey {
        /// What is wrong.
        reason: &'static str,
    },
    /// A key under the log's prefix that calm did not write (another
    /// program shares the prefix): the entry is left alone.
    #[error("the log entry {key:?} was not written by calm")]
    Corrupt {
        /// The entry's key.
        key: Vec<u8>,
    },
    /// The store or a coordination check failed (see [`CoordError`](crate::coord::CoordError):
    /// retryable store errors can be retried).
    #[error(transparent)]
    Coord(#[from] crate::coord::CoordError),
}

impl From<crate::store::StoreError> for LogError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Coord(e.into())
    }
}
