//! Deterministic simulation of your own coordination code: several
//! processes, one store, virtual time, and seeded pauses, crashes and
//! clock skew, every run replayable from its seed.
//!
//! The failure the fencing token exists for is a pause at the wrong
//! moment: a lock holder stops (a GC pause, a descheduled VM) between
//! checking that it holds the lock and writing, its lease expires, another
//! process takes the lock and writes, and the first wakes and writes too.
//! Ordinary tests almost never hit that moment. [`simulate`] makes it
//! cheap to hunt for: it runs `processes` copies of your async code
//! against one [`MemoryStore`], each through its own
//! [`InstrumentedStore`], on a virtual clock, and at seeded random moments
//! freezes a process for a seeded random time (its store calls, lease
//! renewals and watch events held, as a frozen process's would be), kills
//! it (its future dropped at whatever await it was in) and starts it
//! again, with each incarnation's clock skewed a little. A minute of
//! virtual time takes milliseconds, so [`find_failure`] can try hundreds
//! of seeds in a test; a failing seed replays the same run, event for
//! event.
//!
//! # How it is built, and why not a simulator crate
//!
//! FoundationDB and TigerBeetle get determinism by owning the scheduler,
//! the clock and every source of I/O. In Rust the candidates were:
//! `madsim` (replaces tokio and std time wholesale, by a build flag and a
//! patched dependency tree: too invasive for a library's users to adopt
//! for one test), `turmoil` (simulates hosts and a network over tokio:
//! the right shape, but calm's stores are not network clients, and the
//! fault of interest is a process pause, which it does not model),
//! `shuttle` and `loom` (explore thread interleavings of synchronisation
//! primitives: the wrong level for async code that waits on leases).
//! What calm needs is smaller: everything already runs on tokio, and the
//! store is in process. So a run is a current-thread tokio runtime with
//! its clock paused (time advances only when every task waits, straight
//! to the next timer: deterministic and instant), a `LocalSet` that
//! polls tasks in a fixed order, the store's lease clock and each
//! process's clock read from that virtual time, calm's retry jitter
//! seeded from the run's seed, and the faults driven by the same seed.
//!
//! # What you must do for runs to replay
//!
//! - Use the [`Process`]'s store, and its [`clock`](Process::clock) for
//!   leases ([`lease_options`](Process::lease_options)); time through
//!   `tokio::time`, never `std::time::Instant` or the system clock.
//! - Take randomness from [`Process::random`], not from the OS.
//! - No real I/O, threads or blocking: everything inside the run is
//!   simulated, and something outside it would not be replayed.
//! - A loop must await something that takes time (a store call does:
//!   [`SimOptions::latency`]); one that spins on ready futures never lets
//!   virtual time move.
//!
//! # Examples
//!
//! A lock without a fence: each process takes the lock, writes its
//! token to `data`, and lets go. [`find_failure`] looks for a run where a
//! smaller token was written after a larger one (a holder that wrote after
//! its successor), and finds one; `tests/sim.rs` runs the same code with a
//! [`StoreFence`](crate::coord::StoreFence) and finds none.
//!
//! ```
//! use std::time::Duration;
//! use calm::coord::{Lease, Lock};
//! use calm::store::{KeySpan, PutOptions, Store};
//! use calm::testing::sim::{self, Process, SimOptions};
//!
//! async fn naive(p: Process) {
//!     let store = p.store();
//!     let lock = Lock::new(store.clone(), "lock/").unwrap();
//!     loop {
//!         let Ok(lease) = Lease::grant_with(store.clone(), p.lease_options(Duration::from_secs(2))).await else {
//!             continue;
//!         };
//!         if let Ok(guard) = lock.lock(&lease).await {
//!             let token = guard.token().get();
//!             // The pause lands here, or anywhere: the write is not fenced.
//!             let _ = store.put(b"data", &token.to_be_bytes(), PutOptions::new()).await;
//!             let _ = guard.unlock().await;
//!         }
//!     }
//! }
//!
//! let options = SimOptions::default();
//! let failure = sim::find_failure(0..200, &options, naive, |run| {
//!     // The tokens written to `data`, in commit order, never go down.
//!     let tokens: Vec<u64> = run
//!         .changes(KeySpan::Key(b"data".to_vec()))
//!         .iter()
//!         .map(|e| u64::from_be_bytes(e.kv.value.as_slice().try_into().unwrap()))
//!         .collect();
//!     match tokens.windows(2).find(|w| w[1] < w[0]) {
//!         Some(w) => Err(format!("token {} written after {}", w[1], w[0])),
//!         None => Ok(()),
//!     }
//! });
//! let failure = failure.expect("the unfenced lock lets a stale holder write");
//! // The seed replays the same run, and the same failure.
//! assert_eq!(sim::simulate(failure.seed, &options, naive).events(), failure.run.events());
//! ```

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::coord::LeaseOptions;
use crate::occ::Version;
use crate::store::{Clock, KeySpan, MemoryStore, MemoryStoreOptions, Store, Watch, WatchEvent};
use crate::testing::faults::InstrumentedStore;

/// What a run does to its processes. Chances are per process per
/// [`tick`](SimOptions::tick).
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to simulate"]
pub struct SimOptions {
    /// How many processes run your code.
    pub processes: usize,
    /// Virtual time the run lasts.
    pub duration: Duration,
    /// How often the fault schedule is rolled.
    pub tick: Duration,
    /// The chance a running process is frozen at a tick.
    pub pause_chance: f64,
    /// The longest freeze (each is uniform in `0..=max_pause`).
    pub max_pause: Duration,
    /// The chance a running process is killed at a tick.
    pub crash_chance: f64,
    /// How long a killed process stays down before it starts again.
    pub restart_after: Duration,
    /// How long every store call takes (virtual): time passes with each
    /// call, so a process that loops on the store still lets the others
    /// and the clock move.
    pub latency: Duration,
    /// The most a process incarnation's clock is ahead of the store's
    /// (each is uniform in `0..=max_skew`). A clock ahead makes a holder
    /// give up early, the safe side, so skew alone cannot break a
    /// correct recipe; it changes the interleavings found.
    pub max_skew: Duration,
}

impl Default for SimOptions {
    /// Three processes for 60 s of virtual time, ticks of 50 ms, a 2 %
    /// chance of a freeze of up to 6 s and a 0.2 % chance of a crash per
    /// tick, restarts after 1 s, 1 ms per store call, skew up to 50 ms.
    fn default() -> Self {
        Self {
            processes: 3,
            duration: Duration::from_secs(60),
            tick: Duration::from_millis(50),
            pause_chance: 0.02,
            max_pause: Duration::from_secs(6),
            crash_chance: 0.002,
            restart_after: Duration::from_secs(1),
            latency: Duration::from_millis(1),
            max_skew: Duration::from_millis(50),
        }
    }
}

impl SimOptions {
    /// Sets the number of processes (at least 1).
    pub fn with_processes(mut self, n: usize) -> Self {
        self.processes = n.max(1);
        self
    }

    /// Sets the virtual duration of a run.
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Sets the chance of a freeze per tick (clamped to 0..=1) and its
    /// longest length.
    pub fn with_pauses(mut self, chance: f64, max: Duration) -> Self {
        self.pause_chance = chance.clamp(0.0, 1.0);
        self.max_pause = max;
        self
    }

    /// Sets the chance of a crash per tick (clamped to 0..=1) and the
    /// downtime before the restart.
    pub fn with_crashes(mut self, chance: f64, restart_after: Duration) -> Self {
        self.crash_chance = chance.clamp(0.0, 1.0);
        self.restart_after = restart_after;
        self
    }
}

/// One thing the fault schedule did, at a virtual time since the start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimEvent {
    /// Process `process` started (incarnation 0) or restarted.
    Started {
        /// When.
        at: Duration,
        /// Which process.
        process: usize,
        /// Its incarnation: 0 first, one more per restart.
        incarnation: u32,
    },
    /// The process was frozen for `length`.
    Paused {
        /// When.
        at: Duration,
        /// Which process.
        process: usize,
        /// How long.
        length: Duration,
    },
    /// The process was killed.
    Crashed {
        /// When.
        at: Duration,
        /// Which process.
        process: usize,
    },
}

/// A seeded random source (splitmix64): the run's faults, and the
/// processes' own randomness through [`Process::random`].
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..1`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..=max`, to the microsecond.
    fn duration(&mut self, max: Duration) -> Duration {
        let micros = max.as_micros().min(u128::from(u64::MAX)) as u64;
        Duration::from_micros(self.next() % micros.saturating_add(1))
    }
}

/// The run's virtual clock, read from Tokio's paused time, with a fixed
/// skew per process incarnation.
#[derive(Debug, Clone)]
struct SimClock {
    epoch: tokio::time::Instant,
    skew: Duration,
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        self.epoch.elapsed() + self.skew
    }

    fn sleep_until(&self, deadline: Duration) -> crate::store::Sleep {
        let at = self.epoch + deadline.saturating_sub(self.skew);
        Box::pin(tokio::time::sleep_until(at))
    }
}

/// One simulated process, as its code sees it.
#[derive(Debug, Clone)]
pub struct Process {
    id: usize,
    incarnation: u32,
    store: InstrumentedStore<MemoryStore>,
    clock: SimClock,
    rng: Rc<RefCell<Rng>>,
}

impl Process {
    /// Which process this is (`0..processes`), the same across restarts.
    pub fn id(&self) -> usize {
        self.id
    }

    /// 0 for the first run of this process, one more per restart.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// The process's view of the shared store: frozen with the process.
    pub fn store(&self) -> InstrumentedStore<MemoryStore> {
        self.store.clone()
    }

    /// The process's clock (virtual, with this incarnation's skew).
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(self.clock.clone())
    }

    /// Lease options with `ttl` on the process's clock: use them for every
    /// lease, or its deadline would be judged by a clock the run does not
    /// control.
    pub fn lease_options(&self, ttl: Duration) -> LeaseOptions {
        LeaseOptions::new(ttl).with_clock(self.clock())
    }

    /// A random number from the run's seed.
    pub fn random(&self) -> u64 {
        self.rng.borrow_mut().next()
    }

    /// An await point where a freeze of this process takes effect even if
    /// the code does not call the store there (a pause between computing
    /// and acting).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn checkpoint(&self) {
        self.store.wait_while_paused().await;
    }
}

/// A finished run: its seed, the store as the run left it, and what the
/// fault schedule did.
#[derive(Debug)]
pub struct SimRun {
    seed: u64,
    store: MemoryStore,
    events: Vec<SimEvent>,
    runtime: tokio::runtime::Runtime,
}

impl SimRun {
    /// The seed that replays this run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The shared store as the run left it (its history kept for watches
    /// from revision 1).
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// What the fault schedule did, in order.
    pub fn events(&self) -> &[SimEvent] {
        &self.events
    }

    /// Runs `f` (a check reading the store) on the run's runtime, its time
    /// still virtual.
    pub fn block_on<T>(&self, f: impl Future<Output = T>) -> T {
        self.runtime.block_on(f)
    }

    /// Every change under `span` in the run, in commit order (from the
    /// store's history, which a run keeps whole).
    ///
    /// # Panics
    ///
    /// If the history was compacted (a run writing over a million
    /// changes).
    pub fn changes(&self, span: KeySpan) -> Vec<WatchEvent> {
        self.block_on(async {
            let mut watch = self
                .store
                .watch(span, Version::new(1))
                .await
                .expect("a run keeps its whole history");
            let mut changes = Vec::new();
            // A zero timeout still polls once: every event already kept.
            while let Ok(event) = tokio::time::timeout(Duration::ZERO, watch.next()).await {
                changes.push(event.expect("a run keeps its whole history"));
            }
            changes
        })
    }
}

/// A run where the check failed.
#[derive(Debug)]
#[non_exhaustive]
pub struct SimFailure {
    /// The seed that replays it.
    pub seed: u64,
    /// What the check said.
    pub message: String,
    /// The run.
    pub run: SimRun,
}

/// Runs `options.processes` copies of `process` for `options.duration` of
/// virtual time under the fault schedule drawn from `seed`, and returns
/// the run for checking. The same seed and code give the same run.
///
/// # Panics
///
/// If the runtime cannot be built, or a process panics (the panic is the
/// test's failure, with the seed in its message).
pub fn simulate<F, Fut>(seed: u64, options: &SimOptions, mut process: F) -> SimRun
where
    F: FnMut(Process) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    crate::occ::seed_jitter(seed);
    let local = tokio::task::LocalSet::new();
    let (store, events) = local.block_on(&runtime, async {
        let epoch = tokio::time::Instant::now();
        let world = SimClock {
            epoch,
            skew: Duration::ZERO,
        };
        let store = MemoryStore::with_options(
            MemoryStoreOptions::default()
                .with_clock(world)
                .with_history(1 << 20),
        );
        let rng = Rc::new(RefCell::new(Rng(seed)));
        let mut events = Vec::new();
        let mut start = |id: usize, incarnation: u32, events: &mut Vec<SimEvent>| {
            let skew = rng.borrow_mut().duration(options.max_skew);
            let view = InstrumentedStore::new(store.clone());
            view.set_latency(options.latency);
            let p = Process {
                id,
                incarnation,
                store: view,
                clock: SimClock { epoch, skew },
                rng: Rc::clone(&rng),
            };
            events.push(SimEvent::Started {
                at: epoch.elapsed(),
                process: id,
                incarnation,
            });
            let store = p.store.clone();
            let task = tokio::task::spawn_local(process(p));
            Slot {
                store,
                task,
                incarnation,
                resume_at: None,
                restart_at: None,
            }
        };
        let mut slots: Vec<Slot> = (0..options.processes.max(1))
            .map(|id| start(id, 0, &mut events))
            .collect();
        let mut f = Rng(seed ^ 0x5eed_fa17);
        while epoch.elapsed() < options.duration {
            tokio::time::sleep(options.tick).await;
            let now = epoch.elapsed();
            for (id, slot) in slots.iter_mut().enumerate() {
                if let Some(at) = slot.restart_at {
                    if now >= at {
                        let incarnation = slot.incarnation + 1;
                        *slot = start(id, incarnation, &mut events);
                    }
                    continue;
                }
                if slot.task.is_finished() {
                    // Timeout polls the finished task once before its
                    // zero deadline: its result, at once.
                    if let Ok(Err(e)) = tokio::time::timeout(Duration::ZERO, &mut slot.task).await
                        && e.is_panic()
                    {
                        panic!("simulated process {id} panicked (seed {seed}): {e}");
                    }
                    continue;
                }
                if let Some(at) = slot.resume_at {
                    if now >= at {
                        slot.store.resume();
                        slot.resume_at = None;
                    }
                    continue;
                }
                if f.unit() < options.crash_chance {
                    slot.task.abort();
                    slot.restart_at = Some(now + options.restart_after);
                    events.push(SimEvent::Crashed {
                        at: now,
                        process: id,
                    });
                } else if f.unit() < options.pause_chance {
                    let length = f.duration(options.max_pause);
                    slot.store.pause();
                    slot.resume_at = Some(now + length);
                    events.push(SimEvent::Paused {
                        at: now,
                        process: id,
                        length,
                    });
                }
            }
        }
        for slot in &slots {
            slot.task.abort();
            slot.store.resume();
        }
        (store, events)
    });
    SimRun {
        seed,
        store,
        events,
        runtime,
    }
}

/// A running process's task and fault state.
struct Slot {
    store: InstrumentedStore<MemoryStore>,
    task: tokio::task::JoinHandle<()>,
    incarnation: u32,
    resume_at: Option<Duration>,
    restart_at: Option<Duration>,
}

/// Runs [`simulate`] for each seed in `seeds` and `check`s each run;
/// returns the first run the check refuses, or `None` if every run
/// passed.
pub fn find_failure<F, Fut, C>(
    seeds: impl IntoIterator<Item = u64>,
    options: &SimOptions,
    mut process: F,
    mut check: C,
) -> Option<SimFailure>
where
    F: FnMut(Process) -> Fut,
    Fut: Future<Output = ()> + 'static,
    C: FnMut(&SimRun) -> Result<(), String>,
{
    for seed in seeds {
        let run = simulate(seed, options, &mut process);
        if let Err(message) = check(&run) {
            return Some(SimFailure { seed, message, run });
        }
    }
    None
}
