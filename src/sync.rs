//! Delta sync with a peer, without hand-rolled version-vector bookkeeping.
//!
//! [`DeltaMerge`] gives the two halves of delta sync: a summary of what a
//! replica has seen ([`version_vector`](DeltaMerge::version_vector)) and
//! the part of a state a peer with a given summary lacks
//! ([`delta`](DeltaMerge::delta)). What is left to every user is the
//! bookkeeping between them: remember what each peer has, send it the
//! delta against that, learn more from what it sends back, and survive
//! messages that are lost, repeated or late. A [`Peer`] does that, one per
//! remote replica:
//!
//! - [`Peer::message`] is the next [`Message`] for the peer: the delta
//!   against what the peer is known to have, and this replica's own
//!   summary (so the peer learns what *we* have);
//! - [`Peer::receive`] merges a message from the peer into the local state
//!   and learns the peer's summary;
//! - [`Peer::encode_message`] and [`Peer::receive_bytes`] do the same
//!   through calm's [`codec`], with all its checks on untrusted bytes.
//!
//! # Contract
//!
//! - **Any delivery**: messages may be lost, duplicated or reordered. A
//!   delta is computed against a summary the peer really had (it only
//!   grows), so it is never too small; merging is idempotent, so a repeat
//!   or a late message changes nothing. A lost message is made up by the
//!   next one, which is computed against the same or newer knowledge.
//! - **Convergence**: once a message from each side arrives after the
//!   last update, both replicas hold the same state.
//! - **Never**: use one [`Peer`] for two remote replicas, or keep it
//!   across a peer that lost state (restored from an older copy): it would
//!   keep skipping what the peer no longer has. Call [`Peer::reset`]
//!   instead; the next message is then the full state.
//!
//! # Examples
//!
//! Two replicas of a pair of states, messages as bytes:
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::sync::Peer;
//! use calm::{OrSet, PnCounter};
//!
//! let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
//! type Cart = (OrSet<String>, PnCounter);
//! let (mut at_a, mut at_b) = (Cart::default(), Cart::default());
//! // Each replica keeps one Peer for the other.
//! let (mut b_seen_from_a, mut a_seen_from_b) = (Peer::new(), Peer::new());
//!
//! at_a.0.insert(a, "apples".to_string());
//! at_b.1.increment(b, 3);
//!
//! let to_b = b_seen_from_a.encode_message(&at_a);
//! a_seen_from_b.receive_bytes(&mut at_b, &to_b)?;
//! let to_a = a_seen_from_b.encode_message(&at_b);
//! b_seen_from_a.receive_bytes(&mut at_a, &to_a)?;
//! assert_eq!(at_a, at_b);
//!
//! // Now each knows what the other has: a small change sends a small delta.
//! at_a.1.decrement(a, 1);
//! let to_b = b_seen_from_a.message(&at_a);
//! assert!(to_b.delta().0.is_empty());
//! a_seen_from_b.receive(&mut at_b, &to_b);
//! assert_eq!(at_b.1.value(), 2);
//! # Ok::<(), calm::Error>(())
//! ```

use std::fmt;

use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::{DeltaMerge, Merge};

/// What this replica knows of one remote replica, for delta sync with it.
///
/// It holds one thing: the join of every summary the peer has sent. The
/// peer's own summary only grows, so this is never more than the peer
/// has, and a delta against it is complete: merging it gives the peer
/// everything this replica has. See the [module docs](self) for the
/// contract.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::sync::Peer;
/// use calm::{GCounter, Merge};
///
/// let mut mine = GCounter::new();
/// mine.increment(ReplicaId::new(1), 5);
/// let peer: Peer<GCounter> = Peer::new();
/// // Nothing known of the peer yet: the first message is the full state.
/// assert_eq!(peer.message(&mine).delta(), &mine);
/// ```
pub struct Peer<S: DeltaMerge> {
    /// The join of the summaries received from the peer: a lower bound of
    /// what it has seen, since its summary only grows.
    known: S::Summary,
}

impl<S: DeltaMerge> Peer<S> {
    /// Starts with nothing known of the peer.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::sync::Peer;
    /// use calm::OrSet;
    ///
    /// let peer: Peer<OrSet<u32>> = Peer::new();
    /// assert!(peer.known().is_empty());
    /// ```
    pub fn new() -> Self {
        Self {
            known: S::Summary::default(),
        }
    }

    /// What the peer is known to have seen.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::sync::Peer;
    /// use calm::OrSet;
    ///
    /// let r = ReplicaId::new(2);
    /// let mut theirs = OrSet::new();
    /// theirs.insert(r, "x");
    /// let mut mine = OrSet::new();
    /// let mut peer = Peer::new();
    /// peer.receive(&mut mine, &Peer::new().message(&theirs));
    /// assert_eq!(peer.known().get(r), 1);
    /// ```
    pub fn known(&self) -> &S::Summary {
        &self.known
    }

    /// The next message for the peer: the delta of `state` against what the
    /// peer is known to have, and `state`'s summary.
    ///
    /// Sending it any number of times is safe; so is not sending it (the
    /// next one includes what this one had).
    ///
    /// # Performance
    ///
    /// One `version_vector` and one `delta` of `state`: proportional to
    /// what the peer lacks for the dot-based types, plus the summary.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::sync::Peer;
    /// use calm::OrSet;
    ///
    /// let r = ReplicaId::new(1);
    /// let mut state = OrSet::new();
    /// state.insert(r, 1);
    /// let msg = Peer::new().message(&state);
    /// assert_eq!(msg.delta(), &state);
    /// assert_eq!(msg.summary().get(r), 1);
    /// ```
    pub fn message(&self, state: &S) -> Message<S> {
        Message {
            summary: state.version_vector(),
            delta: state.delta(&self.known),
        }
    }

    /// Merges a message from the peer into `state` and learns what the
    /// peer had when it sent it.
    ///
    /// Messages may arrive in any order and any number of times.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::sync::Peer;
    /// use calm::GCounter;
    ///
    /// let mut theirs = GCounter::new();
    /// theirs.increment(ReplicaId::new(2), 4);
    /// let msg = Peer::new().message(&theirs);
    ///
    /// let mut mine = GCounter::new();
    /// let mut peer = Peer::new();
    /// peer.receive(&mut mine, &msg);
    /// peer.receive(&mut mine, &msg); // a duplicate changes nothing
    /// assert_eq!(mine.value(), 4);
    /// ```
    pub fn receive(&mut self, state: &mut S, message: &Message<S>) {
        state.merge(&message.delta);
        self.known.merge(&message.summary);
    }

    /// Forgets what the peer has, so the next message is the full state.
    ///
    /// For a peer that lost state (restored from an older copy, or a new
    /// process under the same replica id's successor).
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::sync::Peer;
    /// use calm::GCounter;
    ///
    /// let mut state = GCounter::new();
    /// state.increment(ReplicaId::new(1), 1);
    /// let mut peer = Peer::new();
    /// peer.receive(&mut GCounter::new(), &Peer::new().message(&state));
    /// assert_eq!(peer.message(&state).delta(), &GCounter::new());
    /// peer.reset();
    /// assert_eq!(peer.message(&state).delta(), &state);
    /// ```
    pub fn reset(&mut self) {
        self.known = S::Summary::default();
    }
}

impl<S: DeltaMerge + Codec> Peer<S> {
    /// The next message for the peer, as bytes with calm's header (see
    /// [`message`](Peer::message)).
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::sync::{Message, Peer};
    /// use calm::{codec, OrSet};
    ///
    /// let mut state = OrSet::new();
    /// state.insert(ReplicaId::new(1), "x".to_string());
    /// let bytes = Peer::new().encode_message(&state);
    /// let msg: Message<OrSet<String>> = codec::from_bytes(&bytes)?;
    /// assert_eq!(msg.delta(), &state);
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn encode_message(&self, state: &S) -> Vec<u8> {
        codec::to_bytes(&self.message(state))
    }

    /// Decodes a message from the peer and [`receive`](Peer::receive)s it.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] if the bytes are not a well-formed message for
    /// `S`; then neither `state` nor what is known of the peer changed.
    /// Discard the bytes; the peer's next message makes up for them.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::sync::Peer;
    /// use calm::GCounter;
    ///
    /// let mut theirs = GCounter::new();
    /// theirs.increment(ReplicaId::new(2), 4);
    /// let bytes = Peer::new().encode_message(&theirs);
    ///
    /// let mut mine = GCounter::new();
    /// let mut peer = Peer::new();
    /// assert!(peer.receive_bytes(&mut mine, &bytes[..3]).is_err());
    /// peer.receive_bytes(&mut mine, &bytes)?;
    /// assert_eq!(mine, theirs);
    /// # Ok::<(), calm::Error>(())
    /// ```
    pub fn receive_bytes(&mut self, state: &mut S, bytes: &[u8]) -> Result<(), DecodeError> {
        let message = codec::from_bytes(bytes)?;
        self.receive(state, &message);
        Ok(())
    }
}

impl<S: DeltaMerge> Default for Peer<S> {
    /// As [`Peer::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<S: DeltaMerge> Clone for Peer<S> {
    fn clone(&self) -> Self {
        Self {
            known: self.known.clone(),
        }
    }
}

impl<S: DeltaMerge> fmt::Debug for Peer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer").field("known", &self.known).finish()
    }
}

/// One message of delta sync: what the sender thinks the receiver lacks,
/// and what the sender has.
///
/// Made by [`Peer::message`], applied by [`Peer::receive`]. Encoded with
/// calm's [`codec`] (its own type tag; the sender's summary, then the
/// delta), so the receiver checks it like any untrusted input.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::sync::{Message, Peer};
/// use calm::{codec, GCounter};
///
/// let mut state = GCounter::new();
/// state.increment(ReplicaId::new(1), 2);
/// let msg = Peer::new().message(&state);
/// let back: Message<GCounter> = codec::from_bytes(&codec::to_bytes(&msg))?;
/// assert_eq!(back, msg);
/// assert_eq!(back.into_delta(), state);
/// # Ok::<(), calm::Error>(())
/// ```
pub struct Message<S: DeltaMerge> {
    /// The sender's summary when it made the message.
    summary: S::Summary,
    /// The part of the sender's state the receiver lacked, as far as the
    /// sender knew; never more than the sender's state.
    delta: S,
}

impl<S: DeltaMerge> Message<S> {
    /// What the sender had seen when it made the message.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::sync::Peer;
    /// use calm::GCounter;
    ///
    /// let mut state = GCounter::new();
    /// state.increment(ReplicaId::new(1), 2);
    /// assert_eq!(Peer::new().message(&state).summary().get(ReplicaId::new(1)), 2);
    /// ```
    pub fn summary(&self) -> &S::Summary {
        &self.summary
    }

    /// The delta the message carries.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::sync::Peer;
    /// use calm::GCounter;
    ///
    /// let state = GCounter::new();
    /// assert_eq!(Peer::new().message(&state).delta(), &state);
    /// ```
    pub fn delta(&self) -> &S {
        &self.delta
    }

    /// Takes the delta out of the message.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::sync::Peer;
    /// use calm::GCounter;
    ///
    /// let state = GCounter::new();
    /// assert_eq!(Peer::new().message(&state).into_delta(), state);
    /// ```
    pub fn into_delta(self) -> S {
        self.delta
    }
}

impl<S: DeltaMerge + Clone> Clone for Message<S> {
    fn clone(&self) -> Self {
        Self {
            summary: self.summary.clone(),
            delta: self.delta.clone(),
        }
    }
}

impl<S: DeltaMerge + PartialEq> PartialEq for Message<S> {
    fn eq(&self, other: &Self) -> bool {
        self.summary == other.summary && self.delta == other.delta
    }
}

impl<S: DeltaMerge + fmt::Debug> fmt::Debug for Message<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("summary", &self.summary)
            .field("delta", &self.delta)
            .finish()
    }
}

impl<S: DeltaMerge + Codec> Codec for Message<S> {
    fn encode(&self, enc: &mut Encoder) {
        self.summary.encode(enc);
        self.delta.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            summary: S::Summary::decode(dec)?,
            delta: S::decode(dec)?,
        })
    }
}

impl<S: DeltaMerge + Codec> Tagged for Message<S> {
    const TAG: u8 = codec::tags::SYNC_MESSAGE;
}
