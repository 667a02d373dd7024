//! [`TextError`]: what a text edit or op can be refused for.

/// Why a [`Text`](super::Text) refused an edit, a conversion or an op.
///
/// A refused call changes nothing: the document is exactly as before. None
/// of these is retryable as is: the position, range or op itself is wrong
/// (a stale position after a remote edit, an op from a buggy or hostile
/// peer), so the caller recomputes it from the current text or drops it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// An insert position or a position to convert is past the end.
    #[error("position {pos} is past the end of the text ({len} long)")]
    PositionOutOfBounds {
        /// The position asked for, in the unit of the method called.
        pos: usize,
        /// The length of the text in that unit.
        len: usize,
    },
    /// A range to delete ends past the end of the text, or starts after it
    /// ends.
    #[error("range {start}..{end} is not inside the text ({len} characters)")]
    RangeOutOfBounds {
        /// Start of the range, in characters.
        start: usize,
        /// End of the range, in characters.
        end: usize,
        /// The length of the text in characters.
        len: usize,
    },
    /// A UTF-8 or UTF-16 offset falls inside the encoding of one character
    /// (in the middle of a multi-byte sequence or a surrogate pair).
    #[error("offset {offset} is inside a character")]
    NotCharBoundary {
        /// The offset asked for, in the unit of the method called.
        offset: usize,
    },
    /// The document would hold more than
    /// [`MAX_CHARS`](super::MAX_CHARS) inserted characters, counting
    /// deleted ones. Start a new document.
    #[error("a text holds at most {max} inserted characters")]
    TooLarge {
        /// The limit.
        max: u64,
    },
    /// This replica's edit would take it past
    /// [`MAX_COUNTER`](super::MAX_COUNTER) events in this text, which its
    /// own edits never do: ops from a peer that used its replica id got it
    /// there. Edit under a new replica id. The text is unchanged.
    #[error("this replica has used the {max} event counters a text allows")]
    CountersExhausted {
        /// The limit.
        max: u64,
    },
    /// An op breaks the rules every op obeys (wrong lengths, an origin or
    /// target that is not an earlier insertion, ...): it came from a buggy
    /// or hostile peer. Drop it.
    #[error("invalid op: {what}")]
    InvalidOp {
        /// Which rule it broke.
        what: &'static str,
    },
}
