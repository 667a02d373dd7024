//! The data of the store model: keys and their metadata, expectations,
//! transactions, leases and watch events.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::occ::Version;

/// The largest key any backend accepts, in bytes.
///
/// PostgreSQL's B-tree index entries must stay under about 2.7 KB, so calm
/// caps keys well below that on every backend for identical behaviour.
pub const MAX_KEY_LEN: usize = 1024;

/// The largest value any backend accepts, in bytes (1 MiB; etcd's default
/// request limit is 1.5 MiB).
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// Checks a key against the limits every backend shares.
///
/// # Errors
///
/// [`StoreError::InvalidKey`] for an empty or oversized key.
pub fn check_key(key: &[u8]) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::InvalidKey {
            len: 0,
            reason: "keys must not be empty",
        });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(StoreError::InvalidKey {
            len: key.len(),
            reason: "keys are at most MAX_KEY_LEN (1024) bytes",
        });
    }
    Ok(())
}

/// Checks a range or watch prefix: at most [`MAX_KEY_LEN`] bytes (no
/// key could match a longer one); empty selects every key.
///
/// # Errors
///
/// [`StoreError::InvalidKey`] for an oversized prefix.
pub fn check_prefix(prefix: &[u8]) -> Result<(), StoreError> {
    if prefix.len() > MAX_KEY_LEN {
        return Err(StoreError::InvalidKey {
            len: prefix.len(),
            reason: "prefixes are at most MAX_KEY_LEN (1024) bytes",
        });
    }
    Ok(())
}

/// The most compares, and the most operations in each branch, of one
/// [`Txn`] (etcd's default `--max-txn-ops`).
pub const MAX_TXN_OPS: usize = 128;

/// The most key and value bytes one [`Txn`] carries in all (compares and
/// both branches): one largest value and key with room to spare, under
/// etcd's default 1.5 MiB request limit on every backend.
pub const MAX_TXN_BYTES: usize = MAX_VALUE_LEN + (256 << 10);

/// Checks a value against the limits every backend shares.
///
/// # Errors
///
/// [`StoreError::ValueTooLarge`] for a value over [`MAX_VALUE_LEN`].
pub fn check_value(value: &[u8]) -> Result<(), StoreError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(StoreError::ValueTooLarge {
            len: value.len(),
            max: MAX_VALUE_LEN,
        });
    }
    Ok(())
}

/// The longest lease any backend grants (a day): beyond that, a lease no
/// longer means liveness, and the backends' own limits differ.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Checks a lease TTL against the limits every backend shares.
///
/// # Errors
///
/// [`StoreError::InvalidTtl`] for a zero TTL or one above
/// [`MAX_LEASE_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<(), StoreError> {
    if ttl.is_zero() {
        return Err(StoreError::InvalidTtl {
            reason: "a lease needs a positive time to live",
        });
    }
    if ttl > MAX_LEASE_TTL {
        return Err(StoreError::InvalidTtl {
            reason: "time to live above one day (MAX_LEASE_TTL)",
        });
    }
    Ok(())
}

/// Checks the lease a write attaches a key to: id 0 is never a lease
/// (etcd reads it as "no lease"), so it is refused as not found on every
/// backend.
///
/// # Errors
///
/// [`StoreError::LeaseNotFound`] for lease 0.
pub fn check_lease(lease: Option<LeaseId>) -> Result<(), StoreError> {
    match lease {
        Some(l) if l.get() == 0 => Err(StoreError::LeaseNotFound { lease: l }),
        _ => Ok(()),
    }
}

/// The first key after every key that starts with `prefix`, or `None`
/// when no key is (an empty prefix, or one of only `0xff` bytes): the
/// exclusive end of the key range a prefix selects.
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The identity of a lease granted by a store.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(i64);

impl LeaseId {
    /// Wraps a backend's lease number.
    pub const fn new(id: i64) -> Self {
        Self(id)
    }

    /// The number.
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease#{:x}", self.0)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// A key, its value and its history in the store.
///
/// A key's life starts at `create_revision` (the store revision of the
/// write that created it) and every write since moves `mod_revision` to the
/// new store revision and adds one to `writes`. Deleting and re-creating a
/// key starts a new life with a new `create_revision`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The store revision at which this life of the key began.
    pub create_revision: Version,
    /// The store revision of the latest write; what [`Expect::Version`]
    /// compares.
    pub mod_revision: Version,
    /// How many writes this life of the key has had (1 after creation).
    pub writes: u64,
    /// The lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

impl KeyValue {
    /// Builds a key-value record (for backends).
    pub fn new(
        key: Vec<u8>,
        value: Vec<u8>,
        create_revision: Version,
        mod_revision: Version,
        writes: u64,
        lease: Option<LeaseId>,
    ) -> Self {
        Self {
            key,
            value,
            create_revision,
            mod_revision,
            writes,
            lease,
        }
    }
}

impl fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("value", &String::from_utf8_lossy(&self.value))
            .field("create_revision", &self.create_revision)
            .field("mod_revision", &self.mod_revision)
            .field("writes", &self.writes)
            .field("lease", &self.lease)
            .finish()
    }
}

/// What a write expects of the key it writes, for compare-and-set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Expect {
    /// Write unconditionally.
    #[default]
    Any,
    /// Write only if the key does not exist (create).
    Absent,
    /// Write only if the key exists with this `mod_revision` (the version
    /// you read).
    Version(Version),
}

impl Expect {
    /// Whether a key in state `current` satisfies the expectation.
    pub fn holds(self, current: Option<&KeyValue>) -> bool {
        match (self, current) {
            (Expect::Any, _) => true,
            (Expect::Absent, None) => true,
            (Expect::Version(v), Some(kv)) => kv.mod_revision == v,
            _ => false,
        }
    }

    /// The same expectation as transaction compares.
    pub fn to_compares(self, key: &[u8]) -> Vec<Compare> {
        match self {
            Expect::Any => Vec::new(),
            Expect::Absent => vec![Compare::absent(key)],
            // A present key's mod_revision is at least 1, so version 0
            // never holds; saying "exists" too keeps a backend that reads
            // an absent key's mod_revision as 0 (etcd) from creating it.
            Expect::Version(v) if v == Version::ZERO => vec![
                Compare::exists(key),
                Compare::mod_revision(key, CompareOp::Equal, v),
            ],
            Expect::Version(v) => vec![Compare::mod_revision(key, CompareOp::Equal, v)],
        }
    }
}

/// Options of a single-key put.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to a put"]
pub struct PutOptions {
    /// The compare-and-set condition.
    pub expect: Expect,
    /// Attach the key to this lease: it is deleted when the lease ends.
    pub lease: Option<LeaseId>,
}

impl PutOptions {
    /// An unconditional put with no lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the condition.
    pub fn with_expect(mut self, expect: Expect) -> Self {
        self.expect = expect;
        self
    }

    /// Attaches the key to a lease.
    pub fn with_lease(mut self, lease: LeaseId) -> Self {
        self.lease = Some(lease);
        self
    }
}

/// The result of a conditional single-key write.
///
/// A conflict is an expected outcome of optimistic concurrency, not an
/// error: the write did nothing and `current` is what the key holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a write may have lost a compare-and-set; check the outcome"]
pub enum WriteOutcome {
    /// The write was applied (or, for a delete of an absent key, there was
    /// nothing to do).
    Committed {
        /// The store revision after the write (the key's new
        /// `mod_revision` for a put).
        revision: Version,
        /// The key before the write, if it existed.
        prev: Option<KeyValue>,
    },
    /// The expectation did not hold; nothing changed.
    Conflict {
        /// The key as it is now.
        current: Option<KeyValue>,
    },
}

impl WriteOutcome {
    /// The revision if the write was committed.
    pub fn committed(&self) -> Option<Version> {
        match self {
            WriteOutcome::Committed { revision, .. } => Some(*revision),
            WriteOutcome::Conflict { .. } => None,
        }
    }

    /// Whether the write lost its compare-and-set.
    pub fn is_conflict(&self) -> bool {
        matches!(self, WriteOutcome::Conflict { .. })
    }
}

/// Keys selected by a range read or a watch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeySpan {
    /// Exactly one key.
    Key(Vec<u8>),
    /// Every key starting with these bytes.
    Prefix(Vec<u8>),
}

impl KeySpan {
    /// Whether `key` is selected.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeySpan::Key(k) => k == key,
            KeySpan::Prefix(p) => key.starts_with(p),
        }
    }
}

/// The result of a range read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RangeResult {
    /// The keys found, in key order.
    pub kvs: Vec<KeyValue>,
    /// Whether more keys matched beyond the limit.
    pub more: bool,
    /// The store revision the read saw.
    pub revision: Version,
}

impl RangeResult {
    /// Builds a range result (for backends).
    pub fn new(kvs: Vec<KeyValue>, more: bool, revision: Version) -> Self {
        Self {
            kvs,
            more,
            revision,
        }
    }
}

/// How a compare relates the key's field to the given operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// Field equals the operand.
    Equal,
    /// Field differs from the operand.
    NotEqual,
    /// Field is less than the operand.
    Less,
    /// Field is greater than the operand.
    Greater,
}

impl CompareOp {
    /// Applies the operator to `field` and `operand`.
    pub fn test<T: Ord + ?Sized>(self, field: &T, operand: &T) -> bool {
        match self {
            CompareOp::Equal => field == operand,
            CompareOp::NotEqual => field != operand,
            CompareOp::Less => field < operand,
            CompareOp::Greater => field > operand,
        }
    }
}

/// Which field of a key a compare reads.
///
/// For an absent key, the revisions and the write count read as 0; a value
/// compare on an absent key is false whatever the operator.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CompareTarget {
    /// The revision that created the key (0 if absent).
    CreateRevision(Version),
    /// The revision of the latest write (0 if absent).
    ModRevision(Version),
    /// The number of writes in the key's current life (0 if absent).
    Writes(u64),
    /// The value, compared as bytes (lexicographically).
    Value(Vec<u8>),
}

/// One condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Compare {
    /// The key compared.
    pub key: Vec<u8>,
    /// The operator.
    pub op: CompareOp,
    /// The field and the operand.
    pub target: CompareTarget,
}

impl Compare {
    /// The key exists.
    pub fn exists(key: &[u8]) -> Self {
        Self::create_revision(key, CompareOp::Greater, Version::ZERO)
    }

    /// The key does not exist.
    pub fn absent(key: &[u8]) -> Self {
        Self::create_revision(key, CompareOp::Equal, Version::ZERO)
    }

    /// Compares the key's creation revision.
    pub fn create_revision(key: &[u8], op: CompareOp, rev: Version) -> Self {
        Self {
            key: key.to_vec(),
            op,
            target: CompareTarget::CreateRevision(rev),
        }
    }

    /// Compares the key's latest-write revision.
    pub fn mod_revision(key: &[u8], op: CompareOp, rev: Version) -> Self {
        Self {
            key: key.to_vec(),
            op,
            target: CompareTarget::ModRevision(rev),
        }
    }

    /// Compares the key's write count.
    pub fn writes(key: &[u8], op: CompareOp, n: u64) -> Self {
        Self {
            key: key.to_vec(),
            op,
            target: CompareTarget::Writes(n),
        }
    }

    /// Compares the key's value as bytes.
    pub fn value(key: &[u8], op: CompareOp, value: &[u8]) -> Self {
        Self {
            key: key.to_vec(),
            op,
            target: CompareTarget::Value(value.to_vec()),
        }
    }

    /// Evaluates the compare against the key's current state.
    pub fn holds(&self, current: Option<&KeyValue>) -> bool {
        let zero = Version::ZERO;
        match &self.target {
            CompareTarget::CreateRevision(v) => self
                .op
                .test(&current.map_or(zero, |kv| kv.create_revision), v),
            CompareTarget::ModRevision(v) => {
                self.op.test(&current.map_or(zero, |kv| kv.mod_revision), v)
            }
            CompareTarget::Writes(n) => self.op.test(&current.map_or(0, |kv| kv.writes), n),
            CompareTarget::Value(bytes) => {
                current.is_some_and(|kv| self.op.test(kv.value.as_slice(), bytes.as_slice()))
            }
        }
    }
}

/// One operation of a transaction branch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TxnOp {
    /// Write a key, optionally attached to a lease.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The lease to attach it to.
        lease: Option<LeaseId>,
    },
    /// Delete a key (nothing happens if it is absent).
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Read a key, seeing the writes earlier in the same branch.
    Get {
        /// The key.
        key: Vec<u8>,
    },
}

impl TxnOp {
    /// A put with no lease.
    pub fn put(key: &[u8], value: &[u8]) -> Self {
        TxnOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: None,
        }
    }

    /// A delete.
    pub fn delete(key: &[u8]) -> Self {
        TxnOp::Delete { key: key.to_vec() }
    }

    /// A read.
    pub fn get(key: &[u8]) -> Self {
        TxnOp::Get { key: key.to_vec() }
    }

    /// The key the operation touches.
    pub fn key(&self) -> &[u8] {
        match self {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } | TxnOp::Get { key } => key,
        }
    }
}

/// A transaction: if every compare holds, run `success`, else `failure`;
/// all or nothing, at one store revision.
///
/// # Examples
///
/// ```
/// use calm::store::{Compare, Txn, TxnOp};
///
/// // Move 10 from a to b only if neither changed since we read them.
/// let txn = Txn::new()
///     .when(Compare::value(b"a", calm::store::CompareOp::Equal, b"100"))
///     .then(TxnOp::put(b"a", b"90"))
///     .then(TxnOp::put(b"b", b"10"));
/// assert_eq!(txn.success.len(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Txn {
    /// The conditions, all of which must hold.
    pub compares: Vec<Compare>,
    /// Run when every compare holds.
    pub success: Vec<TxnOp>,
    /// Run otherwise.
    pub failure: Vec<TxnOp>,
}

impl Txn {
    /// An empty transaction (it succeeds and does nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a condition.
    pub fn when(mut self, c: Compare) -> Self {
        self.compares.push(c);
        self
    }

    /// Adds conditions.
    pub fn when_all(mut self, cs: impl IntoIterator<Item = Compare>) -> Self {
        self.compares.extend(cs);
        self
    }

    /// Adds an operation to the success branch.
    pub fn then(mut self, op: TxnOp) -> Self {
        self.success.push(op);
        self
    }

    /// Adds an operation to the failure branch.
    pub fn otherwise(mut self, op: TxnOp) -> Self {
        self.failure.push(op);
        self
    }

    /// Checks keys, values and the rule that a branch writes each key at
    /// most once (so "all writes at one revision" is well defined).
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidKey`], [`StoreError::ValueTooLarge`] or
    /// [`StoreError::InvalidTxn`].
    pub fn check(&self) -> Result<(), StoreError> {
        if self.compares.len() > MAX_TXN_OPS
            || self.success.len() > MAX_TXN_OPS
            || self.failure.len() > MAX_TXN_OPS
        {
            return Err(StoreError::InvalidTxn {
                reason: "more than MAX_TXN_OPS (128) compares or operations in a branch",
            });
        }
        let compared = self.compares.iter().map(|c| {
            c.key.len()
                + match &c.target {
                    CompareTarget::Value(v) => v.len(),
                    _ => 0,
                }
        });
        let written = self.success.iter().chain(&self.failure).map(|op| {
            op.key().len()
                + match op {
                    TxnOp::Put { value, .. } => value.len(),
                    _ => 0,
                }
        });
        if compared.chain(written).sum::<usize>() > MAX_TXN_BYTES {
            return Err(StoreError::InvalidTxn {
                reason: "more than MAX_TXN_BYTES of keys and values in one transaction",
            });
        }
        for c in &self.compares {
            check_key(&c.key)?;
        }
        for branch in [&self.success, &self.failure] {
            let mut written = std::collections::BTreeSet::new();
            for op in branch {
                check_key(op.key())?;
                if let TxnOp::Put { value, lease, .. } = op {
                    check_value(value)?;
                    check_lease(*lease)?;
                }
                if !matches!(op, TxnOp::Get { .. }) && !written.insert(op.key()) {
                    return Err(StoreError::InvalidTxn {
                        reason: "a branch writes the same key twice",
                    });
                }
            }
        }
        Ok(())
    }
}

/// What one transaction operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOpResult {
    /// A put: the key before it, if any.
    Put {
        /// The previous state of the key.
        prev: Option<KeyValue>,
    },
    /// A delete: the key it removed, if any.
    Delete {
        /// The deleted key, or `None` if it was absent.
        prev: Option<KeyValue>,
    },
    /// A read.
    Get {
        /// The key, if present.
        kv: Option<KeyValue>,
    },
}

/// The result of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxnOutcome {
    /// Whether every compare held (and so `success` ran).
    pub succeeded: bool,
    /// The store revision after the transaction (unchanged if it wrote
    /// nothing).
    pub revision: Version,
    /// One result per operation of the branch that ran.
    pub results: Vec<TxnOpResult>,
}

impl TxnOutcome {
    /// Builds an outcome (for backends).
    pub fn new(succeeded: bool, revision: Version, results: Vec<TxnOpResult>) -> Self {
        Self {
            succeeded,
            revision,
            results,
        }
    }
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseGrant {
    /// The lease.
    pub id: LeaseId,
    /// The time to live the store granted (backends may round up).
    pub ttl: Duration,
}

impl LeaseGrant {
    /// Builds a grant (for backends).
    pub fn new(id: LeaseId, ttl: Duration) -> Self {
        Self { id, ttl }
    }
}

/// Whether a watch event is a write or a deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The key was written.
    Put,
    /// The key was deleted (explicitly or by its lease ending).
    Delete,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchEvent {
    /// Write or deletion.
    pub kind: EventKind,
    /// For a put, the key as written. For a delete, the key with an empty
    /// value, `mod_revision` the revision of the deletion and the other
    /// fields zero.
    pub kv: KeyValue,
}

impl WatchEvent {
    /// Builds an event (for backends).
    pub fn new(kind: EventKind, kv: KeyValue) -> Self {
        Self { kind, kv }
    }

    /// A deletion of `key` at `revision`.
    pub fn deleted(key: Vec<u8>, revision: Version) -> Self {
        Self {
            kind: EventKind::Delete,
            kv: KeyValue::new(key, Vec::new(), Version::ZERO, revision, 0, None),
        }
    }

    /// The store revision of the change.
    pub fn revision(&self) -> Version {
        self.kv.mod_revision
    }
}
