//! The embedded store: etcd's model in process memory.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::types::{check_key, check_lease, check_prefix, check_ttl, check_value};
use super::{
    Clock, EventKind, Expect, History, KeySpan, KeyValue, LeaseGrant, LeaseId, PolledWatch,
    PutOptions, RangeResult, Store, StoreError, SystemClock, Txn, TxnOp, TxnOpResult, TxnOutcome,
    Watch, WatchEvent, WriteOutcome,
};
use crate::occ::Version;

/// Settings of a [`MemoryStore`].
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to MemoryStore::with_options"]
pub struct MemoryStoreOptions {
    /// How many watch events to keep for watches that start in the past.
    /// Older revisions are compacted: watching from them is an error.
    pub history: usize,
    /// The clock that judges lease expiry.
    pub clock: Arc<dyn Clock>,
}

impl Default for MemoryStoreOptions {
    /// 10,000 events of history, the system clock.
    fn default() -> Self {
        Self {
            history: 10_000,
            clock: Arc::new(SystemClock::new()),
        }
    }
}

impl MemoryStoreOptions {
    /// Sets the watch history length (at least 1).
    pub fn with_history(mut self, events: usize) -> Self {
        self.history = events.max(1);
        self
    }

    /// Sets the clock that judges lease expiry.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }
}

/// The embedded default [`Store`]: no server, everything in memory.
///
/// Clones share one store. Every operation takes a short internal lock
/// (never held across an `.await`) and completes in one step, so the
/// futures of everything but [`Watch::next`] finish at their first poll
/// and work under any executor, Tokio or not.
///
/// Leases are judged by the [`Clock`] from [`MemoryStoreOptions`] (the
/// system clock by default; a [`ManualClock`](super::ManualClock) in
/// tests). Expired leases are reaped at the start of every operation, and,
/// when a lease was granted inside a Tokio runtime, by a background task
/// that wakes at the next deadline so watchers see expiries promptly.
///
/// Watch history is bounded ([`MemoryStoreOptions::history`] events);
/// watching from an older revision, or reading too slowly, gives
/// [`StoreError::Compacted`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::store::{ManualClock, MemoryStore, MemoryStoreOptions, PutOptions, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::store::StoreError> {
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
/// let lease = store.grant(Duration::from_secs(10)).await?;
/// let _ = store.put(b"leader", b"me", PutOptions::new().with_lease(lease.id)).await?;
///
/// clock.advance(Duration::from_secs(11)); // nobody kept the lease alive
/// assert!(store.get(b"leader").await?.is_none());
/// assert!(store.keep_alive(lease.id).await.unwrap_err().is_lease_lost());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    /// The state shared by all clones (and by watches).
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    /// Everything mutable.
    state: Mutex<State>,
    /// Judges lease expiry.
    clock: Arc<dyn Clock>,
    /// Notified after every change of revision (wakes watchers).
    changed: Arc<Notify>,
    /// Notified when leases are granted or renewed, and when the store is
    /// dropped (wakes the reaper).
    leases_changed: Arc<Notify>,
    /// Whether the background reaper was started.
    reaper_started: AtomicBool,
    /// Events of history to keep.
    history_limit: usize,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Lets the reaper notice the store is gone and exit, and watches
        // end.
        self.leases_changed.notify_one();
        self.changed.notify_waiters();
    }
}

/// One key in its current life.
struct Entry {
    value: Vec<u8>,
    create_revision: u64,
    mod_revision: u64,
    writes: u64,
    lease: Option<LeaseId>,
}

/// One live lease.
struct LeaseState {
    /// The granted time to live.
    ttl: Duration,
    /// When it ends, by the store's clock.
    deadline: Duration,
    /// The keys attached to it.
    keys: BTreeSet<Vec<u8>>,
}

struct State {
    /// The live keys.
    kvs: BTreeMap<Vec<u8>, Entry>,
    /// The store revision: the revision of the latest write.
    revision: u64,
    /// Live leases.
    leases: HashMap<i64, LeaseState>,
    /// The next lease id to hand out.
    next_lease: i64,
    /// Recent events in revision order (several may share a revision).
    history: VecDeque<WatchEvent>,
    /// Every revision up to this one has been dropped from `history`.
    compacted: u64,
    /// No lease ends before this (a lower bound: renewals only move
    /// deadlines later, so it stays valid until the next scan).
    earliest_deadline: Duration,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave a half-applied write:
    // every write computes its effects first and applies them without
    // fallible steps, so the state is consistent and usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Entry {
    fn to_kv(&self, key: &[u8]) -> KeyValue {
        KeyValue::new(
            key.to_vec(),
            self.value.clone(),
            Version::new(self.create_revision),
            Version::new(self.mod_revision),
            self.writes,
            self.lease,
        )
    }
}

impl State {
    fn get(&self, key: &[u8]) -> Option<KeyValue> {
        self.kvs.get(key).map(|e| e.to_kv(key))
    }

    fn record(&mut self, event: WatchEvent, limit: usize) {
        self.history.push_back(event);
        while self.history.len() > limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = self.compacted.max(old.revision().get());
            }
        }
    }

    /// Writes `key` at revision `rev` (the caller has bumped the revision).
    fn apply_put(
        &mut self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        rev: u64,
        limit: usize,
    ) -> Option<KeyValue> {
        let prev = self.get(key);
        if let Some(old) = prev.as_ref().and_then(|kv| kv.lease) {
            if Some(old) != lease {
                if let Some(l) = self.leases.get_mut(&old.get()) {
                    l.keys.remove(key);
                }
            }
        }
        if let Some(l) = lease.and_then(|l| self.leases.get_mut(&l.get())) {
            l.keys.insert(key.to_vec());
        }
        let entry = match self.kvs.get_mut(key) {
            Some(e) => {
                e.value = value.to_vec();
                e.mod_revision = rev;
                e.writes += 1;
                e.lease = lease;
                e
            }
            None => self.kvs.entry(key.to_vec()).or_insert(Entry {
                value: value.to_vec(),
                create_revision: rev,
                mod_revision: rev,
                writes: 1,
                lease,
            }),
        };
        let kv = entry.to_kv(key);
        self.record(WatchEvent::new(EventKind::Put, kv), limit);
        prev
    }

    /// Deletes `key` at revision `rev` if present.
    fn apply_delete(&mut self, key: &[u8], rev: u64, limit: usize) -> Option<KeyValue> {
        let entry = self.kvs.remove(key)?;
        if let Some(l) = entry.lease.and_then(|l| self.leases.get_mut(&l.get())) {
            l.keys.remove(key);
        }
        self.record(WatchEvent::deleted(key.to_vec(), Version::new(rev)), limit);
        Some(entry.to_kv(key))
    }

    /// Ends a lease: deletes its keys, all at one new revision (if it has
    /// any). Returns whether the revision moved.
    fn end_lease(&mut self, id: i64, limit: usize) -> bool {
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        let live: Vec<Vec<u8>> = lease
            .keys
            .into_iter()
            .filter(|k| self.kvs.contains_key(k))
            .collect();
        if live.is_empty() {
            return false;
        }
        self.revision += 1;
        let rev = self.revision;
        for k in live {
            self.apply_delete(&k, rev, limit);
        }
        true
    }

    /// Ends every lease whose deadline has passed by `clock`, oldest
    /// deadline first. Reads the clock and scans only when a deadline may
    /// have passed, so stores without leases pay nothing.
    fn expire(&mut self, clock: &dyn Clock, limit: usize) -> bool {
        if self.leases.is_empty() {
            return false;
        }
        let now = clock.now();
        if now < self.earliest_deadline {
            return false;
        }
        let mut due: Vec<(Duration, i64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(&id, l)| (l.deadline, id))
            .collect();
        due.sort_unstable();
        let mut moved = false;
        for (_, id) in due {
            moved |= self.end_lease(id, limit);
        }
        self.earliest_deadline = self
            .leases
            .values()
            .map(|l| l.deadline)
            .min()
            .unwrap_or(Duration::MAX);
        moved
    }

    fn lease_alive(&self, lease: Option<LeaseId>) -> Result<(), StoreError> {
        match lease {
            Some(l) if !self.leases.contains_key(&l.get()) => {
                Err(StoreError::LeaseNotFound { lease: l })
            }
            _ => Ok(()),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_options(MemoryStoreOptions::default())
    }

    /// An empty store with the given options.
    pub fn with_options(options: MemoryStoreOptions) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    kvs: BTreeMap::new(),
                    revision: 0,
                    leases: HashMap::new(),
                    next_lease: 1,
                    history: VecDeque::new(),
                    compacted: 0,
                    earliest_deadline: Duration::MAX,
                }),
                clock: options.clock,
                changed: Arc::new(Notify::new()),
                leases_changed: Arc::new(Notify::new()),
                reaper_started: AtomicBool::new(false),
                history_limit: options.history.max(1),
            }),
        }
    }

    /// The clock that judges this store's leases.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.shared.clock
    }

    /// Runs `f` on the state after reaping expired leases; wakes watchers
    /// if the revision moved.
    fn with_state<R>(&self, f: impl FnOnce(&mut State, usize) -> R) -> R {
        let limit = self.shared.history_limit;
        let (out, moved) = {
            let mut st = lock(&self.shared.state);
            let before = st.revision;
            st.expire(&*self.shared.clock, limit);
            let out = f(&mut st, limit);
            (out, st.revision != before)
        };
        if moved {
            self.shared.changed.notify_waiters();
        }
        out
    }

    /// Starts the background reaper once, if a Tokio runtime is running.
    fn ensure_reaper(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.shared.reaper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        handle.spawn(reaper(
            Arc::downgrade(&self.shared),
            Arc::clone(&self.shared.leases_changed),
        ));
    }

    fn put_now(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        check_value(value)?;
        check_lease(options.lease)?;
        self.with_state(|st, limit| {
            st.lease_alive(options.lease)?;
            let current = st.get(key);
            if !options.expect.holds(current.as_ref()) {
                return Ok(WriteOutcome::Conflict { current });
            }
            st.revision += 1;
            let rev = st.revision;
            let prev = st.apply_put(key, value, options.lease, rev, limit);
            Ok(WriteOutcome::Committed {
                revision: Version::new(rev),
                prev,
            })
        })
    }

    fn delete_now(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        self.with_state(|st, limit| {
            let current = st.get(key);
            if !expect.holds(current.as_ref()) {
                return Ok(WriteOutcome::Conflict { current });
            }
            if current.is_none() {
                return Ok(WriteOutcome::Committed {
                    revision: Version::new(st.revision),
                    prev: None,
                });
            }
            st.revision += 1;
            let rev = st.revision;
            let prev = st.apply_delete(key, rev, limit);
            Ok(WriteOutcome::Committed {
                revision: Version::new(rev),
                prev,
            })
        })
    }

    fn txn_now(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        txn.check()?;
        self.with_state(|st, limit| {
            let succeeded = txn
                .compares
                .iter()
                .all(|c| c.holds(st.get(&c.key).as_ref()));
            let ops = if succeeded {
                &txn.success
            } else {
                &txn.failure
            };
            // Validate everything that can fail before changing anything,
            // so a rejected transaction leaves no trace.
            for op in ops {
                if let TxnOp::Put { lease, .. } = op {
                    st.lease_alive(*lease)?;
                }
            }
            let writes = ops.iter().any(|op| match op {
                TxnOp::Put { .. } => true,
                TxnOp::Delete { key } => st.kvs.contains_key(key.as_slice()),
                TxnOp::Get { .. } => false,
            });
            if writes {
                st.revision += 1;
            }
            let rev = st.revision;
            let results = ops
                .iter()
                .map(|op| match op {
                    TxnOp::Put { key, value, lease } => TxnOpResult::Put {
                        prev: st.apply_put(key, value, *lease, rev, limit),
                    },
                    TxnOp::Delete { key } => TxnOpResult::Delete {
                        prev: st.apply_delete(key, rev, limit),
                    },
                    TxnOp::Get { key } => TxnOpResult::Get { kv: st.get(key) },
                })
                .collect();
            Ok(TxnOutcome::new(succeeded, Version::new(rev), results))
        })
    }

    fn grant_now(&self, ttl: Duration) -> Result<LeaseGrant, StoreError> {
        check_ttl(ttl)?;
        let now = self.shared.clock.now();
        let Some(deadline) = now.checked_add(ttl) else {
            return Err(StoreError::InvalidTtl {
                reason: "time to live overflows the clock",
            });
        };
        let id = self.with_state(|st, _| {
            let id = st.next_lease;
            st.next_lease += 1;
            st.earliest_deadline = st.earliest_deadline.min(deadline);
            st.leases.insert(
                id,
                LeaseState {
                    ttl,
                    deadline,
                    keys: BTreeSet::new(),
                },
            );
            id
        });
        self.shared.leases_changed.notify_one();
        self.ensure_reaper();
        Ok(LeaseGrant::new(LeaseId::new(id), ttl))
    }

    fn keep_alive_now(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let now = self.shared.clock.now();
        let ttl = self.with_state(|st, _| {
            let l = st
                .leases
                .get_mut(&lease.get())
                .ok_or(StoreError::LeaseNotFound { lease })?;
            l.deadline = now.saturating_add(l.ttl);
            Ok::<_, StoreError>(l.ttl)
        })?;
        self.shared.leases_changed.notify_one();
        Ok(ttl)
    }

    fn revoke_now(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.with_state(|st, limit| {
            if !st.leases.contains_key(&lease.get()) {
                return Err(StoreError::LeaseNotFound { lease });
            }
            st.end_lease(lease.get(), limit);
            Ok(())
        })
    }

    fn time_to_live_now(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let now = self.shared.clock.now();
        self.with_state(|st, _| {
            st.leases
                .get(&lease.get())
                .map(|l| l.deadline.saturating_sub(now))
                .ok_or(StoreError::LeaseNotFound { lease })
        })
    }

    fn watch_now(&self, span: KeySpan, from: Version) -> Result<MemoryWatch, StoreError> {
        match &span {
            KeySpan::Key(k) => check_key(k)?,
            KeySpan::Prefix(p) => check_prefix(p)?,
        }
        let next = self.with_state(|st, _| {
            if from == Version::ZERO {
                return Ok::<u64, StoreError>(st.revision + 1);
            }
            check_compacted(st, from.get())?;
            Ok(from.get())
        })?;
        Ok(MemoryWatch {
            inner: PolledWatch::new(self, span, next),
        })
    }
}

fn check_compacted(st: &State, from: u64) -> Result<(), StoreError> {
    if from <= st.compacted {
        return Err(StoreError::Compacted {
            requested: Version::new(from),
            first_kept: Version::new(st.compacted + 1),
        });
    }
    Ok(())
}

/// Reaps expired leases as their deadlines pass, until the store is gone.
async fn reaper(store: Weak<Shared>, leases_changed: Arc<Notify>) {
    loop {
        let wake = leases_changed.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let sleep = {
            let Some(shared) = store.upgrade() else {
                return;
            };
            let limit = shared.history_limit;
            let (moved, next) = {
                let mut st = lock(&shared.state);
                let moved = st.expire(&*shared.clock, limit);
                (moved, st.leases.values().map(|l| l.deadline).min())
            };
            if moved {
                shared.changed.notify_waiters();
            }
            next.map(|d| shared.clock.sleep_until(d))
            // `shared` is dropped here: the reaper never keeps the store
            // alive while it waits.
        };
        match sleep {
            Some(sleep) => {
                tokio::select! {
                    () = sleep => {}
                    () = &mut wake => {}
                }
            }
            None => wake.await,
        }
    }
}

impl Store for MemoryStore {
    type Watch = MemoryWatch;

    async fn revision(&self) -> Result<Version, StoreError> {
        Ok(self.with_state(|st, _| Version::new(st.revision)))
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        Ok(self.with_state(|st, _| st.get(key)))
    }

    async fn range(&self, prefix: &[u8], limit: Option<usize>) -> Result<RangeResult, StoreError> {
        check_prefix(prefix)?;
        Ok(self.with_state(|st, _| {
            let limit = limit.unwrap_or(usize::MAX);
            let mut kvs = Vec::new();
            let mut more = false;
            let matching = st
                .kvs
                .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix));
            for (k, e) in matching {
                if kvs.len() == limit {
                    more = true;
                    break;
                }
                kvs.push(e.to_kv(k));
            }
            RangeResult::new(kvs, more, Version::new(st.revision))
        }))
    }

    async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<WriteOutcome, StoreError> {
        self.put_now(key, value, options)
    }

    async fn delete(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        self.delete_now(key, expect)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        self.txn_now(txn)
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant, StoreError> {
        self.grant_now(ttl)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.keep_alive_now(lease)
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.revoke_now(lease)
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.time_to_live_now(lease)
    }

    async fn compact(&self, revision: Version) -> Result<(), StoreError> {
        self.with_state(|st, _| {
            let upto = revision.get().min(st.revision);
            while st
                .history
                .front()
                .is_some_and(|e| e.revision().get() <= upto)
            {
                st.history.pop_front();
            }
            st.compacted = st.compacted.max(upto);
        });
        Ok(())
    }

    async fn watch(&self, span: KeySpan, from: Version) -> Result<MemoryWatch, StoreError> {
        self.watch_now(span, from)
    }
}

/// A watch on a [`MemoryStore`].
///
/// It reads the store's bounded history from the next revision it has not
/// delivered; there is no per-watch buffer to overflow. A watch that falls
/// so far behind that its next revision was dropped from the history ends
/// with [`StoreError::Compacted`].
pub struct MemoryWatch {
    inner: PolledWatch<MemoryStore>,
}

impl std::fmt::Debug for MemoryWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWatch").finish_non_exhaustive()
    }
}

impl History for MemoryStore {
    type Weak = Weak<Shared>;

    fn downgrade(&self) -> Weak<Shared> {
        Arc::downgrade(&self.shared)
    }

    fn upgrade(weak: &Weak<Shared>) -> Option<Self> {
        weak.upgrade().map(|shared| Self { shared })
    }

    fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.shared.changed)
    }

    async fn read(
        &self,
        span: &KeySpan,
        next: &mut u64,
        out: &mut VecDeque<WatchEvent>,
    ) -> Result<(), StoreError> {
        let shared = &self.shared;
        let mut st = lock(&shared.state);
        if st.expire(&*shared.clock, shared.history_limit) {
            // Wake other watchers too; we hold the lock, so they wait
            // until we are done reading.
            shared.changed.notify_waiters();
        }
        if *next > st.revision {
            return Ok(());
        }
        check_compacted(&st, *next)?;
        let start = st.history.partition_point(|e| e.revision().get() < *next);
        out.extend(
            st.history
                .range(start..)
                .filter(|e| span.contains(&e.kv.key))
                .cloned(),
        );
        *next = st.revision + 1;
        Ok(())
    }
}

impl Watch for MemoryWatch {
    async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        self.inner.next().await
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.shared.state);
        f.debug_struct("MemoryStore")
            .field("revision", &st.revision)
            .field("keys", &st.kvs.len())
            .field("leases", &st.leases.len())
            .finish()
    }
}
