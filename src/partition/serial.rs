//! The in-process single writer: one queue and one draining task per busy
//! key, none per idle key.
//!
//! # How it works
//!
//! A map from each *busy* key to its [`Partition`] (the work accepted for
//! it and not yet started, in submission order, and a semaphore counting
//! the free places in that queue) is split into [`SHARDS`] shards by the
//! key's hash, each behind its own std mutex, so threads working on
//! different keys rarely meet on a lock. A shard's lock is held only to
//! push, pop, insert or remove (never across user code and never across
//! an `.await`); everything below about "the lock" is the key's shard's.
//!
//! The first submission for an idle key inserts its partition and spawns
//! one **drain task** for it. The drain task pops one piece of work at a
//! time and runs it to completion before popping the next; that is the
//! whole ordering and exclusivity argument. When it finds the queue empty
//! it removes the partition, under the same lock a submission takes to
//! push, so a submission either lands in a queue whose task will still
//! pop it, or finds no partition and starts a new one.
//!
//! Work for an idle key that its caller waits for skips the task: a
//! synchronous closure ([`submit_fn`](SerialExecutor::submit_fn),
//! [`try_submit_fn`](SerialExecutor::try_submit_fn)) or a future given to
//! [`run`](SerialExecutor::run). The submission *claims* the key (inserts
//! its partition with an empty queue), runs the work itself, at once on
//! its own thread or inside `run`'s future (nothing for the key can be
//! running or queued before it), then pops what queued meanwhile and
//! spawns a drain task for it, or removes the partition. Work on mostly
//! idle keys then costs two short lock holds instead of a task and a
//! channel. A closure whose key is held by another closure running inline,
//! with nothing queued behind it, waits a moment (a bounded spin, as a
//! contended `std::sync::Mutex` does) and claims the key when it frees,
//! rather than queue and make the key's next owner a drain task; it
//! queues if the key stays held. Each submission hashes its key once: the
//! hash picks the shard and is the key's hash in the shard's map. If
//! `run`'s future is dropped while its work is unfinished, the rest of the
//! work is handed to a drain task, first in the queue.
//!
//! `run` on a busy key queues its work with a way back to its caller:
//! when the work reaches the front, whoever pops it (the drain task, or
//! the caller running the work before it inline) hands the key and the
//! work to the waiting caller, which runs it inline as above, woken as a
//! lock's next waiter would be, instead of by a task spawned at the back
//! of the runtime's queue. If that caller has stopped waiting, the work
//! runs where it was popped, in its place.
//!
//! ```text
//! submit(a, w1)  map: {}              -> insert a: [w1], spawn drain(a)
//! submit(a, w2)  map: {a: [w1]}       -> push:     a: [w1, w2]
//! drain(a)       pop w1, run w1       -> a: [w2]
//! drain(a)       pop w2, run w2       -> a: []
//! drain(a)       queue empty          -> remove a, task ends; map: {}
//! ```
//!
//! Invariant: a key has a partition in the map exactly while its drain
//! task is alive (spawned and not finished) or work for it runs inline
//! (a closure, or inside `run`'s future, including one whose turn was
//! handed to it and that has not yet resumed), and every piece of work in a
//! partition's queue will be run or, if the runtime cancels the task,
//! dropped with its [`Completion`] resolving to
//! [`SerialError::Abandoned`].

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

use super::completion::{CatchUnwind, Outcome};
use super::{Completion, Rejected, SerialError};

/// Accepted work, ready to run: it runs the user's work, catches its
/// panic, and sends the outcome to the [`Completion`].
type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A queued piece of work.
struct Job {
    /// The work.
    task: Task,
    /// For [`SerialExecutor::run`] on a busy key: its caller, waiting to
    /// run the work itself when its turn comes.
    caller: Option<oneshot::Sender<Task>>,
}

impl Job {
    /// A job nobody waits to run.
    fn of(task: Task) -> Self {
        Self { task, caller: None }
    }

    /// Hands the job and its key's turn to its waiting caller (`None`),
    /// or returns the work to run here (no caller, or one that stopped
    /// waiting).
    fn dispatch(self) -> Option<Task> {
        match self.caller {
            Some(caller) => caller.send(self.task).err(),
            None => Some(self.task),
        }
    }
}

/// How many pieces of work a drain task runs back to back before it
/// yields to the runtime. Synchronous work never returns `Pending`, so
/// without this a busy key would hold its worker thread (and, on a
/// current-thread runtime, every other key) for as long as its queue
/// stays non-empty. 32 keeps the yield's cost small per piece of work
/// while bounding how long other tasks wait.
const RUNS_PER_YIELD: u32 = 32;

/// How many times a closure waits for its key's inline closure to end
/// (spinning 2, 4, ... 64 times) before it queues instead: about as long
/// as a contended `std::sync::Mutex` spins before it sleeps.
const BRIEF_WAITS: u32 = 6;

/// How many shards the busy keys are split into: enough that a few
/// threads on distinct keys seldom share a lock, few enough that an
/// executor stays a few kilobytes.
const SHARDS: usize = 32;

/// Settings of a [`SerialExecutor`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to SerialExecutor::with_options"]
pub struct SerialOptions {
    /// How many pieces of work may wait for one key, not yet started
    /// (default 1,024); the piece that is running no longer counts. A
    /// submission beyond it waits for room (`submit*`) or is refused with
    /// [`SerialError::Full`] (`try_submit*`). Memory is bounded per busy
    /// key; across keys it is `busy keys × (capacity + 1)` pieces of work,
    /// so the caller bounds how many distinct keys it keeps busy.
    pub queue_capacity: usize,
}

impl Default for SerialOptions {
    fn default() -> Self {
        Self {
            queue_capacity: 1024,
        }
    }
}

impl SerialOptions {
    /// Sets [`queue_capacity`](Self::queue_capacity).
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is 0 (no work could ever wait, and a key with
    /// work running could accept nothing), or larger than
    /// [`Semaphore::MAX_PERMITS`].
    #[track_caller]
    pub fn with_queue_capacity(mut self, capacity: usize) -> Self {
        if capacity == 0 || capacity > Semaphore::MAX_PERMITS {
            bad_capacity(capacity);
        }
        self.queue_capacity = capacity;
        self
    }
}

#[cold]
#[track_caller]
fn bad_capacity(capacity: usize) -> ! {
    panic!(
        "queue capacity must be between 1 and {}, got {capacity}",
        Semaphore::MAX_PERMITS
    )
}

/// Runs the work for each key one piece at a time, in submission order,
/// and the work for different keys concurrently: a single writer per key,
/// in process.
///
/// Route every write for an entity (an account, a document, a session)
/// through `submit(entity_id, work)`, and the work for one entity never
/// overlaps and runs in the order it was submitted, so it can
/// read-modify-write the entity's state with no lock of its own. Keys
/// that have nothing queued cost nothing: no task, no map entry.
///
/// The contract:
///
/// - **Order**: work for one key runs in the order its submissions were
///   *accepted* (a `submit*` that returned before another began is
///   earlier). Work for different keys has no order.
/// - **Exclusivity**: a piece of work starts only after the previous one
///   for its key has finished (returned, or panicked). Async work may
///   await anything; the key waits for it.
/// - **Concurrency**: each busy key is drained by its own task on the
///   Tokio runtime of the call that made it busy, so different keys run in
///   parallel on a multi-thread runtime.
/// - **Back-pressure**: at most
///   [`queue_capacity`](SerialOptions::queue_capacity) pieces of work wait
///   per key; [`submit`](Self::submit) then waits for room and
///   [`try_submit`](Self::try_submit) refuses with
///   [`SerialError::Full`], handing the work back.
/// - **Panics**: a panic in one piece of work resolves its [`Completion`]
///   to [`SerialError::Panicked`]; the key goes on with the next piece.
/// - **Shutdown**: [`shutdown`](Self::shutdown) refuses new work with
///   [`SerialError::Closed`] and returns once every accepted piece has
///   run. Accepted work is never dropped, except by the runtime shutting
///   down under it ([`SerialError::Abandoned`]).
///
/// What callers must never do: await, from inside a key's work, the
/// [`Completion`] of later work for the **same** key (or `submit` to it
/// while its queue is full). The later work cannot start until the
/// current one ends, so that is a deadlock, as with any single consumer.
/// Submitting to *other* keys from inside work is fine.
///
/// Synchronous work ([`submit_fn`](Self::submit_fn)) runs on a runtime
/// worker thread, so it should be short; put blocking calls in
/// [`tokio::task::spawn_blocking`] inside async work instead.
///
/// Cloning is cheap and shares the executor. Dropping every clone does
/// not cancel accepted work: it still runs.
///
/// # Examples
///
/// Read, await, write back, per account, without a lock: two writes to
/// one account never interleave, and they apply in submission order.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
/// use calm::partition::SerialExecutor;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::partition::SerialError> {
/// let balances = Arc::new([AtomicI64::new(0), AtomicI64::new(0)]);
/// let writer = SerialExecutor::new();
///
/// let mut done = Vec::new();
/// for (account, amount) in [(0, 5), (1, 7), (0, -2)] {
///     let balances = balances.clone();
///     done.push(writer.submit(account, async move {
///         let before = balances[account].load(Relaxed);
///         tokio::task::yield_now().await; // I/O here would not break it
///         balances[account].store(before + amount, Relaxed);
///         before + amount
///     }).await?);
/// }
/// let mut after = Vec::new();
/// for d in done {
///     after.push(d.await?);
/// }
/// assert_eq!(after, [5, 7, 3]);
///
/// writer.shutdown().await;
/// assert_eq!(writer.active_keys(), 0);
/// # Ok(())
/// # }
/// ```
pub struct SerialExecutor<K> {
    /// The state every clone and every drain task shares.
    shared: Arc<Shared<K>>,
}

/// What the executor's clones and drain tasks share.
struct Shared<K> {
    /// The busy keys, by shard of their hash.
    shards: Box<[Shard<K>]>,
    /// Hashes each key once per submission (SipHash with a random key:
    /// keys chosen to collide cannot degrade a shard's map).
    hasher: RandomState,
    /// How many [`SerialExecutor::idle`] calls are waiting. Only while
    /// some are does a shard that empties wake them, so busy keys are
    /// counted by nothing but their shards' maps: no counter shared by
    /// every submission.
    idlers: AtomicUsize,
    /// Set by `close` before it closes each shard.
    closed: AtomicBool,
    /// Woken (all waiters) when a shard's last busy key leaves while
    /// [`SerialExecutor::idle`] (or [`SerialExecutor::shutdown`]) waits.
    emptied: Notify,
    /// The per-key queue capacity, at least 1.
    capacity: usize,
}

/// One shard's lock, alone on its cache lines (two shards sharing a line
/// would make threads on unrelated keys contend).
#[repr(align(128))]
struct Shard<K>(Mutex<State<K>>);

/// The bookkeeping behind one shard's lock.
struct State<K> {
    /// One partition per busy key of the shard. A key is here exactly
    /// while its drain task is alive.
    partitions: HashMap<Keyed<K>, Partition, BuildHasherDefault<Hashed>>,
    /// Set once by `close`; no partition is created or pushed to after.
    closed: bool,
}

/// One busy key: the work waiting for it and the room left.
struct Partition {
    /// Accepted work not yet started, oldest first. The drain task pops
    /// the front; submissions push the back.
    queue: VecDeque<Job>,
    /// Made the first time the queue is full, so submitters can wait for a
    /// place (until then a place is free while `queue.len() < capacity`).
    /// It holds `capacity - queue.len()` permits, each a free place in
    /// `queue`, minus the permits granted to waiting submitters not yet
    /// pushed. A push consumes (forgets) one; a pop adds one back. Closed
    /// when the executor closes or the partition is torn down, which wakes
    /// waiting submitters to look again.
    room: Option<Arc<Semaphore>>,
    /// Whether the work running is a synchronous closure, inline on its
    /// caller's thread: the key is free again within the closure's run,
    /// so a closure submitted meanwhile waits a moment for it (as a
    /// spinning lock would) rather than queue for a drain task.
    brief: bool,
}

impl Partition {
    /// A partition whose queue holds `first` (or nothing), its running
    /// work a synchronous closure if `brief`.
    fn new(first: Option<Job>, brief: bool) -> Self {
        Self {
            queue: first.into_iter().collect(),
            room: None,
            brief,
        }
    }

    /// Takes a place in the queue for one push (the place `held`, if it
    /// is one of this partition's), or hands back the semaphore to wait
    /// on for one.
    fn take_place(&mut self, held: Option<Held>, capacity: usize) -> Result<(), Arc<Semaphore>> {
        let room = match &mut self.room {
            None if self.queue.len() < capacity => return Ok(()),
            Some(room) => room,
            // Full for the first time: no place is free.
            none => none.insert(Arc::new(Semaphore::new(0))),
        };
        let place = match held {
            // A permit from a partition since torn down is stale: dropping
            // it returns it to that dead semaphore.
            Some(held) if Arc::ptr_eq(&held.room, room) => Some(held.permit),
            _ => room.clone().try_acquire_owned().ok(),
        };
        match place {
            // The place now belongs to the queued job; the drain task adds
            // it back when it pops the job.
            Some(place) => {
                place.forget();
                Ok(())
            }
            None => Err(room.clone()),
        }
    }

    /// Pops the oldest job, freeing its place; the job runs next.
    fn pop(&mut self) -> Option<Job> {
        let job = self.queue.pop_front()?;
        self.brief = false;
        if let Some(room) = &self.room {
            room.add_permits(1);
        }
        Some(job)
    }

    /// Wakes the submitters waiting for a place, for good.
    fn close(&self) {
        if let Some(room) = &self.room {
            room.close();
        }
    }
}

/// Why a key could not be claimed.
enum Unclaimed {
    /// A synchronous closure runs for it inline and nothing is queued: it
    /// is free again in a moment.
    Briefly,
    /// Busy otherwise, closed, or no runtime here.
    Otherwise,
}

/// Why a submission was not pushed.
enum Refusal<W> {
    /// The key's queue is full; wait for a permit from `room` and retry.
    Full(W, Arc<Semaphore>),
    /// Refused for good: closed, or no runtime.
    Refused(SerialError, W),
}

/// A permit to push one piece of work, granted by a partition's `room`.
struct Held {
    /// The semaphore it came from, to check it is still the key's.
    room: Arc<Semaphore>,
    /// The place.
    permit: OwnedSemaphorePermit,
}

/// Work that can be turned into a [`Job`] once accepted, or handed back.
trait Work: Send + 'static {
    /// The user's own future or closure.
    type Inner;
    /// The job to queue, once accepted.
    fn into_job(self) -> Job;
    /// The user's work, to hand back when refused.
    fn into_inner(self) -> Self::Inner;
}

/// An async piece of work and where its outcome goes.
struct AsyncWork<F: Future> {
    work: F,
    tx: oneshot::Sender<Outcome<F::Output>>,
    /// Its caller, if it waits to run the work itself at its turn.
    caller: Option<oneshot::Sender<Task>>,
}

impl<F> Work for AsyncWork<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Inner = F;

    fn into_job(self) -> Job {
        let AsyncWork { work, tx, caller } = self;
        let task = Box::pin(async move {
            let work = std::pin::pin!(work);
            let outcome = CatchUnwind(work)
                .await
                .map_err(|payload| SerialError::panicked(payload.as_ref()));
            // The caller may have dropped its Completion: then the output
            // is dropped here, which is what dropping it means.
            let _ = tx.send(outcome);
        });
        Job { task, caller }
    }

    fn into_inner(self) -> F {
        self.work
    }
}

/// A synchronous piece of work and where its outcome goes.
struct FnWork<G, T> {
    work: G,
    tx: oneshot::Sender<Outcome<T>>,
}

impl<G, T> Work for FnWork<G, T>
where
    G: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    type Inner = G;

    fn into_job(self) -> Job {
        let FnWork { work, tx } = self;
        Job::of(Box::pin(async move {
            let _ = tx.send(call(work));
        }))
    }

    fn into_inner(self) -> G {
        self.work
    }
}

/// Calls a synchronous piece of work, its panic caught as its outcome.
fn call<G: FnOnce() -> T, T>(work: G) -> Outcome<T> {
    // AssertUnwindSafe: the closure is consumed by the call, so nothing of
    // it can be observed after a panic.
    catch_unwind(AssertUnwindSafe(work)).map_err(|payload| SerialError::panicked(payload.as_ref()))
}

impl<K> SerialExecutor<K>
where
    K: Eq + Hash + Clone + Send + 'static,
{
    /// An executor with default options (1,024 pieces of work may wait
    /// per key).
    pub fn new() -> Self {
        Self::with_options(SerialOptions::default())
    }

    /// An executor with these options.
    pub fn with_options(options: SerialOptions) -> Self {
        Self {
            shared: Arc::new(Shared {
                shards: (0..SHARDS)
                    .map(|_| {
                        Shard(Mutex::new(State {
                            partitions: HashMap::default(),
                            closed: false,
                        }))
                    })
                    .collect(),
                hasher: RandomState::new(),
                idlers: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
                emptied: Notify::new(),
                // `with_queue_capacity` refuses these, but the field is
                // public: clamp rather than panic here.
                capacity: options.queue_capacity.clamp(1, Semaphore::MAX_PERMITS),
            }),
        }
    }

    /// Submits async work for `key`, waiting for room in the key's queue
    /// if it is full; returns once the work is accepted.
    ///
    /// The work runs after every piece accepted before it for `key` has
    /// finished, and before any accepted after it. Await the returned
    /// [`Completion`] for its output, or drop it: the work runs either
    /// way.
    ///
    /// # Errors
    ///
    /// The work is handed back, never run, inside [`Rejected`] with
    /// [`SerialError::Closed`] if the executor is (or becomes, while this
    /// waits for room) closed, or [`SerialError::NoRuntime`] if `key` was
    /// idle and no Tokio runtime is running on this thread.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the work is accepted in the same step that completes
    /// this future, so if the future is dropped before it returns, nothing
    /// was queued and the work is dropped unrun. What is lost is only its
    /// place among the submitters waiting for room (they are served
    /// first come, first served).
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::partition::SerialExecutor;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::partition::SerialError> {
    /// let writer = SerialExecutor::new();
    /// let first = writer.submit(1_u64, async { "first" }).await?;
    /// let second = writer.submit(1_u64, async { "second" }).await?;
    /// assert_eq!((first.await?, second.await?), ("first", "second"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn submit<F>(&self, key: K, work: F) -> Result<Completion<F::Output>, Rejected<F>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        match self
            .push_waiting(
                self.shared.keyed(key),
                AsyncWork {
                    work,
                    tx,
                    caller: None,
                },
            )
            .await
        {
            Ok(()) => Ok(Completion::new(rx)),
            Err((error, work)) => Err(Rejected::new(error, work.into_inner())),
        }
    }

    /// Submits async work for `key` if its queue has room, without
    /// waiting.
    ///
    /// The same as [`submit`](Self::submit) otherwise.
    ///
    /// # Errors
    ///
    /// The work is handed back, never run, inside [`Rejected`] with
    /// [`SerialError::Full`] if [`queue_capacity`](SerialOptions::queue_capacity)
    /// pieces of work already wait for `key`, [`SerialError::Closed`] if
    /// the executor is closed, or [`SerialError::NoRuntime`] if `key` was
    /// idle and no Tokio runtime is running on this thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::partition::{SerialExecutor, SerialOptions};
    /// use tokio::sync::oneshot;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::partition::SerialError> {
    /// let writer = SerialExecutor::with_options(SerialOptions::default().with_queue_capacity(1));
    /// let (open, gate) = oneshot::channel::<()>();
    /// let running = writer.try_submit("k", async move { gate.await.ok(); })?;
    /// tokio::task::yield_now().await; // it starts (leaving the queue) and blocks
    /// let waiting = writer.try_submit("k", async { 2 })?; // the one place
    ///
    /// let refused = writer.try_submit("k", async { 3 }).unwrap_err();
    /// assert!(refused.error().is_full());
    /// let work = refused.into_work(); // handed back, never run
    ///
    /// open.send(()).ok();
    /// running.await?;
    /// assert_eq!(waiting.await?, 2);
    /// assert_eq!(work.await, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_submit<F>(&self, key: K, work: F) -> Result<Completion<F::Output>, Rejected<F>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        match self.push(
            &self.shared.keyed(key),
            AsyncWork {
                work,
                tx,
                caller: None,
            },
            None,
        ) {
            Ok(()) => Ok(Completion::new(rx)),
            Err(Refusal::Full(work, _)) => Err(Rejected::new(
                SerialError::Full {
                    capacity: self.shared.capacity,
                },
                work.into_inner(),
            )),
            Err(Refusal::Refused(error, work)) => Err(Rejected::new(error, work.into_inner())),
        }
    }

    /// Submits a synchronous closure for `key`, waiting for room in the
    /// key's queue if it is full; returns once the closure is accepted.
    ///
    /// The closure runs in `key`'s order, as with [`submit`](Self::submit):
    /// if the key is idle, at once on this thread, before this returns
    /// (the returned [`Completion`] is then ready); otherwise on the key's
    /// drain task, on a runtime worker. A key held only by another closure
    /// running on another thread, with nothing queued, is waited for a
    /// moment (a bounded spin) before this gives up on running inline. The
    /// closure should be short and must not block.
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit): [`SerialError::Closed`] or
    /// [`SerialError::NoRuntime`], with the closure handed back unrun.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`submit`](Self::submit): if dropped before it
    /// returns, the closure was not queued and is dropped uncalled.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use calm::partition::SerialExecutor;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::partition::SerialError> {
    /// let writer = SerialExecutor::new();
    /// let hits = Arc::new(AtomicU64::new(0));
    /// let h = hits.clone();
    /// let done = writer.submit_fn("page", move || h.fetch_add(1, Ordering::Relaxed) + 1).await?;
    /// assert_eq!(done.await?, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn submit_fn<G, T>(&self, key: K, work: G) -> Result<Completion<T>, Rejected<G>>
    where
        G: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let key = self.shared.keyed(key);
        let work = match self.run_if_idle(&key, work) {
            Ok(done) => return Ok(done),
            Err(work) => work,
        };
        let (tx, rx) = oneshot::channel();
        match self.push_waiting(key, FnWork { work, tx }).await {
            Ok(()) => Ok(Completion::new(rx)),
            Err((error, work)) => Err(Rejected::new(error, work.into_inner())),
        }
    }

    /// Submits a synchronous closure for `key` if its queue has room,
    /// without waiting for room. Like [`submit_fn`](Self::submit_fn), it
    /// runs the closure at once, on this thread, if the key is idle (or
    /// frees within a brief spin).
    ///
    /// # Errors
    ///
    /// As [`try_submit`](Self::try_submit): [`SerialError::Full`],
    /// [`SerialError::Closed`] or [`SerialError::NoRuntime`], with the
    /// closure handed back uncalled.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::partition::{SerialError, SerialExecutor};
    ///
    /// // Outside a runtime nothing can drain a new key: refused, not lost.
    /// let writer = SerialExecutor::new();
    /// let refused = writer.try_submit_fn("k", || 1).unwrap_err();
    /// assert_eq!(refused.error(), &SerialError::NoRuntime);
    /// assert_eq!((refused.into_work())(), 1);
    /// ```
    pub fn try_submit_fn<G, T>(&self, key: K, work: G) -> Result<Completion<T>, Rejected<G>>
    where
        G: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let key = self.shared.keyed(key);
        let work = match self.run_if_idle(&key, work) {
            Ok(done) => return Ok(done),
            Err(work) => work,
        };
        let (tx, rx) = oneshot::channel();
        match self.push(&key, FnWork { work, tx }, None) {
            Ok(()) => Ok(Completion::new(rx)),
            Err(Refusal::Full(work, _)) => Err(Rejected::new(
                SerialError::Full {
                    capacity: self.shared.capacity,
                },
                work.into_inner(),
            )),
            Err(Refusal::Refused(error, work)) => Err(Rejected::new(error, work.into_inner())),
        }
    }

    /// Runs async work for `key` in the key's order and returns its
    /// output: [`submit`](Self::submit) and await the [`Completion`] in
    /// one call, and cheaper when the key is idle.
    ///
    /// If `key` is idle, the work runs inside this future, on the caller's
    /// task, as it would under a `tokio::sync::Mutex` per key: no task is
    /// spawned and no channel carries the output. Work submitted for the
    /// key meanwhile queues behind it and is handed to a drain task when
    /// it ends. If `key` is busy, the work queues as with
    /// [`submit`](Self::submit) (waiting for room if the queue is full),
    /// and when its turn comes the key and the work are handed back to
    /// this future, which runs it inline as above: the caller is woken as
    /// a lock's next waiter would be, not by a task spawned behind
    /// everything else runnable. Order, exclusivity and panics are as for
    /// `submit`.
    ///
    /// # Errors
    ///
    /// [`SerialError::Closed`] or [`SerialError::NoRuntime`] if the work
    /// was refused (it is dropped unrun; [`submit`](Self::submit) hands
    /// refused work back), [`SerialError::Panicked`] if it panicked (the
    /// key goes on with its next piece), [`SerialError::Abandoned`] if the
    /// runtime shut down before it ran.
    ///
    /// # Cancel safety
    ///
    /// Accepted work is never cut short: if this future is dropped after
    /// the work was accepted (for an idle key, on the first poll, where
    /// it also starts), the work still runs to its end in its place in
    /// the key's order, on a task of its own, and its output is dropped.
    /// Dropped before that, the work is dropped unrun. Work running inline
    /// (on an idle key, or on a busy one once its turn has come) advances
    /// only while this future is polled: hold the future without polling
    /// it and the key waits, as it would for a held lock guard.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
    /// use calm::partition::SerialExecutor;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::partition::SerialError> {
    /// let balance = Arc::new(AtomicI64::new(100));
    /// let writer = SerialExecutor::new();
    /// let b = balance.clone();
    /// let after = writer.run("account-1", async move {
    ///     let before = b.load(Relaxed);
    ///     tokio::task::yield_now().await; // I/O here would not break it
    ///     b.store(before - 30, Relaxed);
    ///     before - 30
    /// }).await?;
    /// assert_eq!(after, 70);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run<F>(&self, key: K, work: F) -> Result<F::Output, SerialError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let key = self.shared.keyed(key);
        if let Ok(runtime) = self.claim(&key, false) {
            return Inline {
                shared: &self.shared,
                key,
                runtime,
                work: Some(Box::pin(work)),
            }
            .await;
        }
        let Some(runtime) = Spawner::here() else {
            // No runtime here to hand a drain task to afterwards: the work
            // queues for the key's drain task (or is refused).
            return match self.submit(key.key, work).await {
                Ok(done) => done.await,
                Err(refused) => Err(refused.into_parts().0),
            };
        };
        // Busy: queue the work, then wait for the key's turn to be handed
        // here with it, and run it inline.
        let (tx, rx) = oneshot::channel();
        let (caller, turn) = oneshot::channel();
        let queued = AsyncWork {
            work,
            tx,
            caller: Some(caller),
        };
        if let Err((error, _)) = self.push_waiting(key.clone(), queued).await {
            return Err(error);
        }
        let waiting = Turn(Some(Waiting {
            turn,
            shared: &self.shared,
            key,
            runtime,
        }));
        if let Some(inline) = waiting.await {
            // The task catches the work's panic and sends the outcome to
            // `rx`; an error here is only from dropping the finished work.
            inline.await?;
        }
        Completion::new(rx).await
    }

    /// Stops accepting work: every later submission, and every one waiting
    /// for room, is refused with [`SerialError::Closed`]. Work already
    /// accepted still runs. Idempotent.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::partition::SerialExecutor;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let writer = SerialExecutor::new();
    /// let accepted = writer.submit("k", async { 1 }).await.unwrap();
    /// writer.close();
    /// assert!(writer.submit("k", async { 2 }).await.unwrap_err().error().is_closed());
    /// assert_eq!(accepted.await, Ok(1)); // accepted work still ran
    /// # }
    /// ```
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        for shard in &self.shared.shards {
            let mut state = lock(&shard.0);
            state.closed = true;
            for partition in state.partitions.values() {
                // Wakes submitters waiting for room; they look again and
                // see `closed`.
                partition.close();
            }
        }
    }

    /// Closes the executor and waits until every accepted piece of work
    /// has run.
    ///
    /// After it returns, [`active_keys`](Self::active_keys) is 0 and every
    /// [`Completion`] handed out has its outcome. Work that submits to
    /// this executor while it drains is refused ([`SerialError::Closed`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. The executor is closed on the first poll; dropping the
    /// future after that only stops the waiting: the accepted work goes on
    /// running in the background, and the executor stays closed. Dropped
    /// before its first poll, it did nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use calm::partition::SerialExecutor;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::partition::SerialError> {
    /// let writer = SerialExecutor::new();
    /// let ran = Arc::new(AtomicU64::new(0));
    /// for key in 0..10_u32 {
    ///     let ran = ran.clone();
    ///     // The Completions are dropped: the work runs anyway.
    ///     drop(writer.submit(key % 3, async move { ran.fetch_add(1, Ordering::Relaxed); }).await?);
    /// }
    /// writer.shutdown().await;
    /// assert_eq!(ran.load(Ordering::Relaxed), 10);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.close();
        self.idle().await;
    }

    /// Waits until no key has work queued or running.
    ///
    /// While submissions keep arriving this may never return; close the
    /// executor first ([`shutdown`](Self::shutdown)) for a wait that ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes; dropping it changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::partition::SerialExecutor;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::partition::SerialError> {
    /// let writer = SerialExecutor::new();
    /// for key in 0..100_u32 {
    ///     drop(writer.submit(key, async move { key * 2 }).await?);
    /// }
    /// assert_eq!(writer.active_keys(), 100);
    /// writer.idle().await;
    /// assert_eq!(writer.active_keys(), 0); // drained keys leave nothing behind
    /// # Ok(())
    /// # }
    /// ```
    pub async fn idle(&self) {
        // Counted before any shard is looked at: a shard that empties after
        // the look below sees the count under the shard's lock, which the
        // look took too, and wakes this waiter.
        let _waiting = Idler::new(&self.shared.idlers);
        loop {
            let emptied = self.shared.emptied.notified();
            let mut emptied = std::pin::pin!(emptied);
            // Registered before the check, so an emptying between the
            // check and the await still wakes this waiter.
            emptied.as_mut().enable();
            if self.shared.busy() == 0 {
                return;
            }
            emptied.await;
        }
    }

    /// The number of keys with work queued or running (each has one drain
    /// task and one map entry; idle keys have neither).
    ///
    /// It counts shard by shard, each under its lock, so while keys keep
    /// changing it is a snapshot of no single instant.
    pub fn active_keys(&self) -> usize {
        self.shared.busy()
    }

    /// Whether [`close`](Self::close) or [`shutdown`](Self::shutdown) was
    /// called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// The per-key queue capacity.
    pub fn queue_capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Runs a closure for an idle `key` at once, on this thread: its
    /// partition is inserted first (empty), so submissions made meanwhile
    /// queue behind it, and afterwards whatever queued is handed to a
    /// drain task, or the partition removed. Hands the closure back if the
    /// key is busy, the executor closed or no runtime runs here (the
    /// caller's usual path then queues or refuses it).
    fn run_if_idle<G, T>(&self, key: &Keyed<K>, work: G) -> Result<Completion<T>, G>
    where
        G: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut waits = 0;
        let runtime = loop {
            match self.claim(key, true) {
                Ok(runtime) => break runtime,
                // The key's closure ends in a moment, and nothing queued
                // behind it to keep the order of: wait for it, a little
                // longer each time, before queueing for a drain task.
                Err(Unclaimed::Briefly) if waits < BRIEF_WAITS => {
                    waits += 1;
                    for _ in 0..1 << waits {
                        std::hint::spin_loop();
                    }
                }
                Err(_) => return Err(work),
            }
        };
        // `call` catches the closure's panic, so nothing unwinds between
        // the claim above and the hand-off below.
        let outcome = call(work);
        hand_off(&self.shared, key, &runtime, None);
        Ok(Completion::ready(outcome))
    }

    /// Makes an idle `key` busy for work its caller runs itself: inserts
    /// the key's partition with an empty queue (running work holds no
    /// place in it, as a popped job), so submissions made meanwhile queue
    /// behind that work. The caller must [`hand_off`] when the work ends.
    /// `brief` if that work is a synchronous closure. Refused if the key
    /// is busy, the executor closed, or no runtime runs here to drain what
    /// queues meanwhile.
    fn claim(&self, key: &Keyed<K>, brief: bool) -> Result<Spawner, Unclaimed> {
        let runtime = Spawner::here().ok_or(Unclaimed::Otherwise)?;
        let mut state = self.shared.lock(key.hash);
        if state.closed {
            return Err(Unclaimed::Otherwise);
        }
        match state.partitions.entry(key.clone()) {
            Entry::Vacant(idle) => {
                idle.insert(Partition::new(None, brief));
                Ok(runtime)
            }
            Entry::Occupied(busy) if busy.get().brief && busy.get().queue.is_empty() => {
                Err(Unclaimed::Briefly)
            }
            Entry::Occupied(_) => Err(Unclaimed::Otherwise),
        }
    }

    /// Pushes `work`, waiting for a place while the key's queue is full.
    async fn push_waiting<W: Work>(
        &self,
        key: Keyed<K>,
        mut work: W,
    ) -> Result<(), (SerialError, W)> {
        let mut held = None;
        loop {
            match self.push(&key, work, held.take()) {
                Ok(()) => return Ok(()),
                Err(Refusal::Refused(error, back)) => return Err((error, back)),
                Err(Refusal::Full(back, room)) => {
                    work = back;
                    // A closed semaphore (executor closed, or partition torn
                    // down) ends the wait; the next `push` says which.
                    if let Ok(permit) = room.clone().acquire_owned().await {
                        held = Some(Held { room, permit });
                    }
                }
            }
        }
    }

    /// Pushes `work` to `key`'s queue if there is a place (or `held` is a
    /// place in the key's current queue), starting a drain task if the key
    /// was idle.
    fn push<W: Work>(&self, key: &Keyed<K>, work: W, held: Option<Held>) -> Result<(), Refusal<W>> {
        let mut state = self.shared.lock(key.hash);
        if state.closed {
            return Err(Refusal::Refused(SerialError::Closed, work));
        }
        let spawn = match state.partitions.entry(key.clone()) {
            Entry::Occupied(mut busy) => {
                let partition = busy.get_mut();
                if let Err(room) = partition.take_place(held, self.shared.capacity) {
                    return Err(Refusal::Full(work, room));
                }
                partition.queue.push_back(work.into_job());
                None
            }
            Entry::Vacant(idle) => {
                let Ok(runtime) = Handle::try_current() else {
                    return Err(Refusal::Refused(SerialError::NoRuntime, work));
                };
                let drain = Drain {
                    shared: self.shared.clone(),
                    key: idle.key().clone(),
                    armed: true,
                };
                // The first job takes one of `capacity` places.
                idle.insert(Partition::new(Some(work.into_job()), false));
                Some((runtime, drain))
            }
        };
        drop(state);
        if let Some((runtime, drain)) = spawn {
            // Spawned after the lock is released. If the runtime is shutting
            // down it drops the future unpolled, and `Drain`'s drop tears
            // the partition down.
            runtime.spawn(drain.run(None));
        }
        Ok(())
    }
}

/// A key with its hash, computed once per submission: the hash picks the
/// key's shard and, through [`Hashed`], its place in the shard's map, so a
/// submission hashes its key once however many times it looks it up.
#[derive(Clone)]
struct Keyed<K> {
    key: K,
    hash: u64,
}

impl<K: PartialEq> PartialEq for Keyed<K> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl<K: Eq> Eq for Keyed<K> {}

impl<K> Hash for Keyed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The hasher of a shard's map: a [`Keyed`] key's hash, as it is (already
/// SipHash of the key).
#[derive(Default)]
struct Hashed(u64);

impl Hasher for Hashed {
    fn write(&mut self, bytes: &[u8]) {
        // Only `Keyed::hash` feeds this hasher, through `write_u64`.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl<K: Hash> Shared<K> {
    /// `key` with its hash.
    fn keyed(&self, key: K) -> Keyed<K> {
        let hash = self.hasher.hash_one(&key);
        Keyed { key, hash }
    }
}

impl<K> Shared<K> {
    /// The lock of the shard of a key of this hash.
    fn lock(&self, hash: u64) -> MutexGuard<'_, State<K>> {
        // The high bits: the shard's map places keys by the low ones.
        let shard = usize::try_from(hash >> 32).unwrap_or(0) % self.shards.len();
        lock(&self.shards[shard].0)
    }

    /// After a partition was removed from `state` (its shard, still
    /// locked): whether to wake [`SerialExecutor::idle`]'s waiters, because
    /// the shard is now empty and some wait.
    fn emptied(&self, state: &State<K>) -> bool {
        state.partitions.is_empty() && self.idlers.load(Ordering::SeqCst) > 0
    }
}

impl<K> Shared<K> {
    /// Busy keys, shard by shard.
    fn busy(&self) -> usize {
        self.shards
            .iter()
            .map(|s| lock(&s.0).partitions.len())
            .sum()
    }
}

/// Counts one waiting [`SerialExecutor::idle`] call while it lives.
struct Idler<'a>(&'a AtomicUsize);

impl<'a> Idler<'a> {
    fn new(idlers: &'a AtomicUsize) -> Self {
        idlers.fetch_add(1, Ordering::SeqCst);
        Self(idlers)
    }
}

impl Drop for Idler<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<K: Eq + Hash> Shared<K> {
    /// Pops `key`'s next job, or, if its queue is empty, removes its
    /// partition (the caller was its drain).
    fn next_job(&self, key: &Keyed<K>) -> Option<Job> {
        let mut state = self.lock(key.hash);
        let next = state.partitions.get_mut(key).and_then(Partition::pop);
        if next.is_some() {
            return next;
        }
        // Empty: leave, atomically with the check, so a submission either
        // saw this partition (and its job was popped above) or sees none
        // and starts a new drain task.
        let removed = state.partitions.remove(key);
        let emptied = removed.is_some() && self.emptied(&state);
        drop(state);
        drop(removed);
        if emptied {
            self.emptied.notify_waiters();
        }
        None
    }
}

/// Ends work run by the caller that [claimed](SerialExecutor::claim)
/// `key`: starts a drain task with `first` (the rest of that work), or
/// hands the key to the next job's waiting caller, or starts a drain task
/// with the next job, or else removes the key's partition.
fn hand_off<K>(shared: &Arc<Shared<K>>, key: &Keyed<K>, runtime: &Spawner, first: Option<Task>)
where
    K: Eq + Hash + Clone + Send + 'static,
{
    let next = match first {
        Some(task) => task,
        None => match shared.next_job(key).map(Job::dispatch) {
            Some(Some(task)) => task,
            // Empty (the partition is gone), or handed to its caller with
            // the key.
            None | Some(None) => return,
        },
    };
    let drain = Drain {
        shared: shared.clone(),
        key: key.clone(),
        armed: true,
    };
    runtime.spawn(drain, next);
}

/// Where a drain task goes when work run inline ends with work queued
/// behind it: the runtime running that work's caller.
enum Spawner {
    /// The runtime polling the current task, looked up only when a drain
    /// task is needed. Holding a runtime handle instead would clone it
    /// for every piece of work: a write to its reference count, one
    /// counter every worker thread shares (on 8 threads, commands that
    /// await ran up to 15% slower for it).
    Task,
    /// The runtime of a caller outside any task (in `block_on`), held.
    Held(Handle),
}

impl Spawner {
    /// Where a drain task started here would go; `None` outside a Tokio
    /// runtime.
    fn here() -> Option<Self> {
        if tokio::task::try_id().is_some() {
            return Some(Spawner::Task);
        }
        Handle::try_current().ok().map(Spawner::Held)
    }

    /// Spawns `drain`, starting with `first`. If the runtime is shutting
    /// down it drops the task unpolled, and `Drain`'s drop tears the
    /// partition down (the queued work resolves to
    /// [`SerialError::Abandoned`]); the same happens at once if a task
    /// claimed the key inside a runtime and ends its work outside any
    /// (its future moved off the runtime, or a `LocalSet` polled without
    /// one).
    fn spawn<K>(&self, drain: Drain<K>, first: Task)
    where
        K: Eq + Hash + Clone + Send + 'static,
    {
        match self {
            Spawner::Held(runtime) => drop(runtime.spawn(drain.run(Some(first)))),
            Spawner::Task => match Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(drain.run(Some(first)))),
                Err(_) => {
                    drop(first);
                    drop(drain);
                }
            },
        }
    }
}

/// Async work for a key claimed by [`SerialExecutor::run`], run inside the
/// caller's future while the key's partition is held for it.
///
/// Generic over the work (`dyn` only for work handed over at its turn),
/// so each poll of work on an idle key is a static call.
struct Inline<'a, K, F>
where
    K: Eq + Hash + Clone + Send + 'static,
    F: Future + Send + ?Sized + 'static,
    F::Output: Send + 'static,
{
    /// The executor's state (borrowed, as `run`'s future borrows the
    /// executor: no reference count shared by every call to bump).
    shared: &'a Arc<Shared<K>>,
    /// The claimed key.
    key: Keyed<K>,
    /// Where the drain task goes, if one is needed afterwards.
    runtime: Spawner,
    /// The work, until it has finished or been handed to a drain task.
    work: Option<Pin<Box<F>>>,
}

// The work is boxed; nothing else is ever pinned in place.
impl<K, F> Unpin for Inline<'_, K, F>
where
    K: Eq + Hash + Clone + Send + 'static,
    F: Future + Send + ?Sized + 'static,
    F::Output: Send + 'static,
{
}

impl<K, F> Future for Inline<'_, K, F>
where
    K: Eq + Hash + Clone + Send + 'static,
    F: Future + Send + ?Sized + 'static,
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, SerialError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // Polled again after it resolved: a misuse; stay pending.
        let Some(work) = &mut this.work else {
            return Poll::Pending;
        };
        let outcome = match Pin::new(&mut CatchUnwind(work)).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(output)) => Ok(output),
            Poll::Ready(Err(payload)) => Err(SerialError::panicked(payload.as_ref())),
        };
        // A panic dropping the finished work must not skip the hand-off.
        let finished = this.work.take();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(finished)));
        hand_off(this.shared, &this.key, &this.runtime, None);
        Poll::Ready(outcome)
    }
}

impl<K, F> Drop for Inline<'_, K, F>
where
    K: Eq + Hash + Clone + Send + 'static,
    F: Future + Send + ?Sized + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        // The caller stopped waiting mid-run: the rest of the work runs on
        // a drain task, ahead of whatever queued behind it.
        if let Some(work) = self.work.take() {
            let rest: Task = Box::pin(async move {
                let _ = CatchUnwind(work).await;
            });
            hand_off(self.shared, &self.key, &self.runtime, Some(rest));
        }
    }
}

/// [`SerialExecutor::run`]'s wait for its key's turn, its work queued:
/// resolves to the work to run inline, the key now held for it, or to
/// `None` if the work was dropped unrun (its runtime shut down).
struct Turn<'a, K: Eq + Hash + Clone + Send + 'static>(Option<Waiting<'a, K>>);

/// What [`Turn`] holds until it resolves.
struct Waiting<'a, K> {
    /// Where the work comes back, with the key, at its turn.
    turn: oneshot::Receiver<Task>,
    /// The executor's state.
    shared: &'a Arc<Shared<K>>,
    /// The key waited for.
    key: Keyed<K>,
    /// Where a drain task goes, if one is needed afterwards.
    runtime: Spawner,
}

// Nothing in it is pinned in place (the receiver is polled through its
// own `Unpin`).
impl<K: Eq + Hash + Clone + Send + 'static> Unpin for Turn<'_, K> {}

impl<'a, K: Eq + Hash + Clone + Send + 'static> Future for Turn<'a, K> {
    type Output = Option<Inline<'a, K, dyn Future<Output = ()> + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(waiting) = &mut this.0 else {
            return Poll::Ready(None);
        };
        let handed = match Pin::new(&mut waiting.turn).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(handed) => handed.ok(),
        };
        let Some(Waiting {
            shared,
            key,
            runtime,
            ..
        }) = this.0.take()
        else {
            return Poll::Ready(None);
        };
        Poll::Ready(handed.map(|task| Inline {
            shared,
            key,
            runtime,
            work: Some(task),
        }))
    }
}

impl<K: Eq + Hash + Clone + Send + 'static> Drop for Turn<'_, K> {
    fn drop(&mut self) {
        // The caller stopped waiting. Closing first settles the race with
        // a hand-over: one that came before is received here, one after
        // fails and runs the work where it was popped.
        if let Some(mut waiting) = self.0.take() {
            waiting.turn.close();
            if let Ok(task) = waiting.turn.try_recv() {
                hand_off(waiting.shared, &waiting.key, &waiting.runtime, Some(task));
            }
        }
    }
}

fn lock<K>(shard: &Mutex<State<K>>) -> MutexGuard<'_, State<K>> {
    // No user code runs under this lock except the key's `Hash` and `Eq`;
    // if one of those panicked, the map is still consistent (HashMap
    // operations are panic safe), so poisoning is ignored.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The drain task of one busy key; tears the partition down if the task
/// is dropped before it finishes (runtime shutdown).
struct Drain<K: Eq + Hash> {
    /// The executor's state.
    shared: Arc<Shared<K>>,
    /// The key it drains; its partition exists while `armed`.
    key: Keyed<K>,
    /// Whether the partition still has to be removed by `drop`.
    armed: bool,
}

impl<K: Eq + Hash> Drain<K> {
    /// Runs `first` (work already popped), then the key's work one piece
    /// at a time until its queue is empty, then removes its partition; or
    /// ends early, handing the key to a piece's waiting caller.
    async fn run(mut self, first: Option<Task>) {
        let mut since_yield = 0;
        let mut next = first;
        loop {
            let job = match next.take() {
                Some(task) => task,
                None => match self.next_job() {
                    None => return,
                    Some(job) => match job.dispatch() {
                        Some(task) => task,
                        None => {
                            // The caller holds the key now.
                            self.armed = false;
                            return;
                        }
                    },
                },
            };
            // Panics in the work are caught inside the job and reported to
            // its Completion; this outer guard only catches one from
            // dropping the work's state after it finished, which must not
            // take the rest of the key's queue down with it.
            let _ = CatchUnwind(job).await;
            since_yield += 1;
            if since_yield == RUNS_PER_YIELD {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
    }

    /// Pops the key's next job, or, if its queue is empty, removes its
    /// partition and disarms.
    fn next_job(&mut self) -> Option<Job> {
        let next = self.shared.next_job(&self.key);
        if next.is_none() {
            self.armed = false;
        }
        next
    }
}

impl<K: Eq + Hash> Drop for Drain<K> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The task was cancelled (its runtime shut down) with work left:
        // remove the partition so later submissions start afresh, and drop
        // its jobs (outside the lock: dropping runs the work's destructors)
        // so their Completions resolve to `Abandoned`.
        let mut state = self.shared.lock(self.key.hash);
        let removed = state.partitions.remove(&self.key);
        let emptied = removed.is_some() && self.shared.emptied(&state);
        drop(state);
        if let Some(partition) = removed {
            // Wakes submitters waiting for room in it; they retry.
            partition.close();
            drop(partition);
        }
        if emptied {
            self.shared.emptied.notify_waiters();
        }
    }
}

impl<K> Clone for SerialExecutor<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K> Default for SerialExecutor<K>
where
    K: Eq + Hash + Clone + Send + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for SerialExecutor<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SerialExecutor")
            .field("active_keys", &self.shared.busy())
            .field("closed", &self.shared.closed.load(Ordering::Acquire))
            .field("queue_capacity", &self.shared.capacity)
            .finish()
    }
}
