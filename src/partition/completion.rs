//! The caller's side of one accepted piece of work, and the panic guard
//! around the work's side.

use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::SerialError;

/// What one piece of work sends to its [`Completion`].
pub(crate) type Outcome<T> = Result<T, SerialError>;

/// The output of one accepted piece of work, to await.
///
/// Returned by [`SerialExecutor::submit`](super::SerialExecutor::submit)
/// and its siblings once the work is accepted. It resolves when the work
/// has run: to its output, to [`SerialError::Panicked`] if it panicked,
/// or to [`SerialError::Abandoned`] if the runtime shut down first.
///
/// Awaiting it is optional. Like a [`tokio::task::JoinHandle`], dropping
/// it does **not** cancel the work: accepted work always runs, in its
/// key's order, and its output is then dropped.
///
/// # Cancel safety
///
/// Cancel safe: dropping the `Completion` (or a future awaiting it) before
/// it resolves loses only the output. The work itself still runs in its
/// place in its key's queue, and nothing about the key's order changes.
///
/// # Examples
///
/// ```
/// use calm::partition::SerialExecutor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::partition::SerialError> {
/// let writer = SerialExecutor::new();
/// let done = writer.submit("order-7", async { 6 * 7 }).await?;
/// assert_eq!(done.await?, 42);
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a Completion loses the output (the work still runs)"]
pub struct Completion<T> {
    state: State<T>,
}

enum State<T> {
    /// Receives the outcome once; closed unsent if the work is dropped.
    Waiting(oneshot::Receiver<Outcome<T>>),
    /// The work already ran (`None` once the outcome was taken).
    Ready(Option<Outcome<T>>),
}

// The outcome is only ever moved out, never pinned in place.
impl<T> Unpin for Completion<T> {}

impl<T> Completion<T> {
    pub(crate) fn new(rx: oneshot::Receiver<Outcome<T>>) -> Self {
        Self {
            state: State::Waiting(rx),
        }
    }

    /// The completion of work that has already run.
    pub(crate) fn ready(outcome: Outcome<T>) -> Self {
        Self {
            state: State::Ready(Some(outcome)),
        }
    }
}

impl<T> Future for Completion<T> {
    type Output = Result<T, SerialError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            // The sender is dropped unsent only when the work itself is
            // dropped without finishing: the draining task was cancelled.
            State::Waiting(rx) => Pin::new(rx)
                .poll(cx)
                .map(|received| received.unwrap_or(Err(SerialError::Abandoned))),
            // Polled again after it resolved: a misuse that std futures
            // may panic on; this one stays pending instead.
            State::Ready(outcome) => outcome.take().map_or(Poll::Pending, Poll::Ready),
        }
    }
}

impl<T> fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").finish_non_exhaustive()
    }
}

/// Polls a future, turning a panic inside any poll into an `Err` with
/// the payload.
///
/// The inner future is `Unpin` (a `Pin<&mut F>` or a box), so no pin
/// projection (and no `unsafe`) is needed. After a panic the inner future
/// is never polled again: the wrapper reports the panic once and the
/// caller drops it.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // AssertUnwindSafe: after a panic the work's future is dropped, not
        // polled again, so no broken invariant inside it is ever observed.
        // State the work shares with the outside world is the work's
        // business, as with a panic in a spawned task.
        match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.0).poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}
