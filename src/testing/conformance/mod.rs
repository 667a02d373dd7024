//! One conformance suite for every [`Store`] backend.
//!
//! The suite is the store model written as tests: every operation and
//! `Expect` case, transaction atomicity, revision monotonicity, lease
//! expiry, watch ordering, `merge_into` under concurrent writers, invalid
//! input, and a linearizability check of concurrent histories. calm runs it
//! on [`MemoryStore`] in every `cargo test`, and on PostgreSQL and etcd
//! servers when those backends are built; a store of your own can run it
//! too, by implementing [`Fixture`].
//!
//! Each check is a public async function taking a [`Case`] (a store, a key
//! prefix no other case uses, and a way to move the store's time), so a
//! test binary can give each its own `#[test]`; [`run_all`] runs them in
//! order.
//!
//! # Examples
//!
//! ```
//! use calm::testing::conformance::{self, MemoryFixture};
//!
//! # #[tokio::main]
//! # async fn main() {
//! conformance::run_all(&MemoryFixture::default()).await.unwrap();
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::occ::Version;
use crate::store::{
    ManualClock, MemoryStore, MemoryStoreOptions, Store, StoreError, Watch, WriteOutcome,
};

/// How a case moves the store's time forward.
#[derive(Clone, Debug)]
pub enum TimeControl {
    /// The store runs on this manual clock: advancing is instant.
    Manual(ManualClock),
    /// The store runs on real time (a server): advancing sleeps.
    Real,
}

impl TimeControl {
    /// Moves the store's time forward by at least `by`.
    pub async fn advance(&self, by: Duration) {
        match self {
            TimeControl::Manual(c) => {
                c.advance(by);
                // Let the store's reaper and watchers run.
                tokio::task::yield_now().await;
            }
            TimeControl::Real => tokio::time::sleep(by).await,
        }
    }
}

/// One run of one check: a store, a private key prefix, and its time.
#[derive(Clone, Debug)]
pub struct Case<S> {
    /// The store under test.
    pub store: S,
    /// A prefix no other case uses; every key of the case starts with it.
    pub prefix: Vec<u8>,
    /// How to move the store's time.
    pub time: TimeControl,
    /// The shortest lease TTL the store honours exactly (etcd rounds
    /// TTLs up to whole seconds, with a minimum).
    pub ttl: Duration,
    /// A multiplier for workload sizes: 1 for an in-memory store, less
    /// work per unit for a remote one is chosen by the fixture.
    pub ops_per_client: usize,
}

impl<S> Case<S> {
    /// The case's key for `name`.
    pub fn key(&self, name: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(name.as_bytes());
        k
    }
}

/// Makes fresh cases for a backend.
pub trait Fixture: Send + Sync {
    /// The store under test.
    type Store: Store + Clone + 'static;

    /// A case with a fresh store or a fresh key prefix.
    fn case(&self) -> impl Future<Output = Case<Self::Store>> + Send;
}

/// The fixture for [`MemoryStore`]: a fresh store on a [`ManualClock`] per
/// case.
#[derive(Debug, Clone, Default)]
pub struct MemoryFixture;

impl Fixture for MemoryFixture {
    type Store = MemoryStore;

    async fn case(&self) -> Case<MemoryStore> {
        let clock = ManualClock::new();
        Case {
            store: MemoryStore::with_options(
                MemoryStoreOptions::default().with_clock(clock.clone()),
            ),
            prefix: b"conformance/".to_vec(),
            time: TimeControl::Manual(clock),
            ttl: Duration::from_secs(10),
            ops_per_client: 1000,
        }
    }
}

/// A check that failed.
#[derive(Debug, thiserror::Error)]
#[error("conformance check `{check}` failed: {message}")]
#[non_exhaustive]
pub struct ConformanceFailure {
    /// Which check.
    pub check: &'static str,
    /// What went wrong.
    pub message: String,
}

/// The result of one check.
pub type CheckResult = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

// After `ensure!`, which the checks use.
mod concurrent;
mod history;
mod kv;
mod lease;
mod watch;

pub use concurrent::{merge_into_concurrent, typed_update_contention};
pub use history::{check_history, linearizable, record_history};
pub use kv::{
    dropped_conditional_write, expect_cases, invalid_input, put_get_metadata, range_prefix_limit,
    revision_monotonic, txn_atomicity,
};
pub use lease::{lease_expiry, lease_revoke};
pub use watch::{watch_compacted, watch_ends_with_its_store, watch_from_revision};

/// Turns a store error into a check failure.
pub(super) fn store<T>(r: Result<T, StoreError>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: unexpected error: {e}"))
}

pub(super) fn committed(o: WriteOutcome, what: &str) -> Result<Version, String> {
    match o {
        WriteOutcome::Committed { revision, .. } => Ok(revision),
        WriteOutcome::Conflict { current } => {
            Err(format!("{what}: unexpected conflict, key is {current:?}"))
        }
    }
}

/// A check's future.
pub type BoxCheck<'a> = Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>>;

/// A check, as a function pointer.
pub type CheckFn<S> = for<'a> fn(&'a Case<S>) -> BoxCheck<'a>;

/// Every check, by name, in the order [`run_all`] runs them.
pub fn checks<S: Store + Clone + 'static>() -> Vec<(&'static str, CheckFn<S>)> {
    vec![
        ("put_get_metadata", |c| Box::pin(put_get_metadata(c))),
        ("expect_cases", |c| Box::pin(expect_cases(c))),
        ("revision_monotonic", |c| Box::pin(revision_monotonic(c))),
        ("range_prefix_limit", |c| Box::pin(range_prefix_limit(c))),
        ("txn_atomicity", |c| Box::pin(txn_atomicity(c))),
        ("invalid_input", |c| Box::pin(invalid_input(c))),
        ("lease_expiry", |c| Box::pin(lease_expiry(c))),
        ("lease_revoke", |c| Box::pin(lease_revoke(c))),
        ("watch_from_revision", |c| Box::pin(watch_from_revision(c))),
        ("watch_compacted", |c| Box::pin(watch_compacted(c))),
        ("merge_into_concurrent", |c| {
            Box::pin(merge_into_concurrent(c))
        }),
        ("typed_update_contention", |c| {
            Box::pin(typed_update_contention(c))
        }),
        ("dropped_conditional_write", |c| {
            Box::pin(dropped_conditional_write(c))
        }),
        ("linearizable", |c| Box::pin(linearizable(c))),
    ]
}

/// Runs every check on fresh cases from `fixture`, stopping at the first
/// failure.
///
/// # Errors
///
/// The first [`ConformanceFailure`].
pub async fn run_all<F: Fixture>(fixture: &F) -> Result<(), ConformanceFailure> {
    for (check, f) in checks::<F::Store>() {
        let case = fixture.case().await;
        f(&case)
            .await
            .map_err(|message| ConformanceFailure { check, message })?;
    }
    Ok(())
}

/// The next watch event, or a failure if none comes within 10 seconds.
pub(super) async fn next_event<W: Watch>(w: &mut W) -> Result<crate::store::WatchEvent, String> {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .map_err(|_| "watch stalled: no event within 10 s".to_string())?
        .map_err(|e| format!("watch: {e}"))
}
