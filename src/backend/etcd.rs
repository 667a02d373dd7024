//! The [`Store`] model on etcd, whose native model it is.
//!
//! Every call maps to one etcd request: revisions are etcd's revisions,
//! `Expect` and transaction compares are etcd `Compare`s, leases are etcd
//! leases (their expiry judged by the etcd leader's clock), and watches are
//! etcd watches, with etcd's compaction error mapped to
//! [`StoreError::Compacted`].
//!
//! # Differences from the other backends
//!
//! - DIFFERENCE: etcd grants TTLs in whole seconds with a minimum of about
//!   two seconds (its election timeout); [`Store::grant`] rounds up and
//!   reports the TTL actually granted.
//! - DIFFERENCE: a write whose connection fails may or may not have been
//!   applied by the cluster; such failures are reported as
//!   [`StoreError::Indeterminate`] (re-read the key's version), reads as
//!   [`StoreError::Unavailable`].

use std::collections::VecDeque;
use std::time::Duration;

use etcd_client::{
    Client, CompactionOptions, Compare as PbCompare, CompareOp as PbCompareOp, ConnectOptions,
    DeleteOptions, EventType, GetOptions, PutOptions as PbPutOptions, Txn as PbTxn,
    TxnOp as PbTxnOp, TxnOpResponse, WatchOptions, WatchStream,
};

use crate::occ::Version;
use crate::store::{
    BoxError, Compare, CompareOp, CompareTarget, EventKind, Expect, KeySpan, KeyValue, LeaseGrant,
    LeaseId, PutOptions, RangeResult, Store, StoreError, Txn, TxnOp, TxnOpResult, TxnOutcome,
    Watch, WatchEvent, WriteOutcome, check_key, check_value,
};

/// A [`Store`] on an etcd cluster. Clones share the connection.
///
/// # Examples
///
/// ```no_run
/// use calm::backend::etcd::EtcdStore;
/// use calm::store::{PutOptions, Store};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), calm::store::StoreError> {
/// let store = EtcdStore::connect(&["http://127.0.0.1:2379"]).await?;
/// let _ = store.put(b"greeting", b"hello", PutOptions::new()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
}

/// Whether a failed request was a write (whose effect is then unknown).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// Maps an etcd client error to a store error.
fn etcd_error(e: etcd_client::Error, kind: Kind) -> StoreError {
    use tonic::Code;
    let message = e.to_string();
    if message.contains("requested lease not found") || message.contains("lease not found") {
        // The id is not in the message; callers that know it re-map.
        return StoreError::LeaseNotFound {
            lease: LeaseId::new(0),
        };
    }
    let connection = match &e {
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
            ) && !message.contains("etcdserver: ")
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    };
    let source: BoxError = Box::new(e);
    match (connection, kind) {
        (true, Kind::Write) => StoreError::Indeterminate { source },
        (true, Kind::Read) => StoreError::Unavailable { source },
        (false, _) => StoreError::Backend { source },
    }
}

fn with_lease(e: StoreError, lease: LeaseId) -> StoreError {
    match e {
        StoreError::LeaseNotFound { .. } => StoreError::LeaseNotFound { lease },
        other => other,
    }
}

fn version(v: i64) -> Version {
    Version::new(u64::try_from(v).unwrap_or(0))
}

fn rev(v: Version) -> i64 {
    i64::try_from(v.get()).unwrap_or(i64::MAX)
}

fn kv(k: &etcd_client::KeyValue) -> KeyValue {
    KeyValue::new(
        k.key().to_vec(),
        k.value().to_vec(),
        version(k.create_revision()),
        version(k.mod_revision()),
        u64::try_from(k.version()).unwrap_or(0),
        (k.lease() != 0).then(|| LeaseId::new(k.lease())),
    )
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> Version {
    version(h.map_or(0, etcd_client::ResponseHeader::revision))
}

fn op(op: CompareOp) -> PbCompareOp {
    match op {
        CompareOp::Equal => PbCompareOp::Equal,
        CompareOp::NotEqual => PbCompareOp::NotEqual,
        CompareOp::Less => PbCompareOp::Less,
        CompareOp::Greater => PbCompareOp::Greater,
    }
}

fn compare(c: &Compare) -> PbCompare {
    let key = c.key.clone();
    match &c.target {
        CompareTarget::CreateRevision(v) => PbCompare::create_revision(key, op(c.op), rev(*v)),
        CompareTarget::ModRevision(v) => PbCompare::mod_revision(key, op(c.op), rev(*v)),
        CompareTarget::Writes(n) => {
            PbCompare::version(key, op(c.op), i64::try_from(*n).unwrap_or(i64::MAX))
        }
        CompareTarget::Value(v) => PbCompare::value(key, op(c.op), v.clone()),
    }
}

fn txn_op(o: &TxnOp) -> PbTxnOp {
    match o {
        TxnOp::Put { key, value, lease } => {
            let mut opts = PbPutOptions::new().with_prev_key();
            if let Some(l) = lease {
                opts = opts.with_lease(l.get());
            }
            PbTxnOp::put(key.clone(), value.clone(), Some(opts))
        }
        TxnOp::Delete { key } => {
            PbTxnOp::delete(key.clone(), Some(DeleteOptions::new().with_prev_key()))
        }
        TxnOp::Get { key } => PbTxnOp::get(key.clone(), None),
    }
}

fn put_lease(options: &PutOptions) -> Option<LeaseId> {
    options.lease
}

impl EtcdStore {
    /// Connects to the given endpoints, with a 5-second request timeout
    /// (so a frozen server gives an error, not a hang).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] if no endpoint can be reached.
    pub async fn connect<E: AsRef<str>>(endpoints: &[E]) -> Result<Self, StoreError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5));
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| etcd_error(e, Kind::Read))?;
        Ok(Self { client })
    }

    /// The etcd client, for anything calm does not wrap.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The oldest revision still readable.
    async fn first_kept(&self) -> Result<Version, StoreError> {
        // etcd does not report its compaction point directly; the smallest
        // readable revision is found by probing the compaction error's
        // boundary with a binary search over readable revisions.
        let current = self.revision().await?;
        let (mut lo, mut hi) = (1u64, current.get().max(1));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let readable = self
                .client
                .clone()
                .get(
                    vec![0],
                    Some(
                        GetOptions::new()
                            .with_revision(rev(Version::new(mid)))
                            .with_count_only(),
                    ),
                )
                .await
                .is_ok();
            if readable {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(Version::new(lo))
    }

    /// Runs a transaction of etcd ops, mapping errors.
    async fn raw_txn(&self, txn: PbTxn) -> Result<etcd_client::TxnResponse, StoreError> {
        self.client
            .clone()
            .txn(txn)
            .await
            .map_err(|e| etcd_error(e, Kind::Write))
    }
}

/// Turns one etcd op response into ours.
fn op_result(r: &TxnOpResponse) -> TxnOpResult {
    match r {
        TxnOpResponse::Put(p) => TxnOpResult::Put {
            prev: p.prev_key().map(kv),
        },
        TxnOpResponse::Delete(d) => TxnOpResult::Delete {
            prev: d.prev_kvs().first().map(kv),
        },
        TxnOpResponse::Get(g) => TxnOpResult::Get {
            kv: g.kvs().first().map(kv),
        },
        // We never nest transactions.
        TxnOpResponse::Txn(_) => TxnOpResult::Get { kv: None },
    }
}

impl Store for EtcdStore {
    type Watch = EtcdWatch;

    async fn revision(&self) -> Result<Version, StoreError> {
        // A limit-1 count-only read of one key returns the header.
        let r = self
            .client
            .clone()
            .get(b"\0".to_vec(), Some(GetOptions::new().with_count_only()))
            .await
            .map_err(|e| etcd_error(e, Kind::Read))?;
        Ok(header_revision(r.header()))
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        let r = self
            .client
            .clone()
            .get(key.to_vec(), None)
            .await
            .map_err(|e| etcd_error(e, Kind::Read))?;
        Ok(r.kvs().first().map(kv))
    }

    async fn range(&self, prefix: &[u8], limit: Option<usize>) -> Result<RangeResult, StoreError> {
        let mut opts = if prefix.is_empty() {
            GetOptions::new().with_all_keys()
        } else {
            GetOptions::new().with_prefix()
        };
        if let Some(l) = limit {
            // etcd treats 0 as "no limit".
            opts = opts.with_limit(i64::try_from(l.max(1)).unwrap_or(i64::MAX));
        }
        let key = if prefix.is_empty() {
            vec![0]
        } else {
            prefix.to_vec()
        };
        let r = self
            .client
            .clone()
            .get(key, Some(opts))
            .await
            .map_err(|e| etcd_error(e, Kind::Read))?;
        let mut kvs: Vec<KeyValue> = r.kvs().iter().map(kv).collect();
        let mut more = r.more();
        if limit == Some(0) {
            more = !kvs.is_empty();
            kvs.clear();
        }
        Ok(RangeResult::new(kvs, more, header_revision(r.header())))
    }

    async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        check_value(value)?;
        let op = TxnOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: put_lease(&options),
        };
        let txn = PbTxn::new()
            .when(
                options
                    .expect
                    .to_compares(key)
                    .iter()
                    .map(compare)
                    .collect::<Vec<_>>(),
            )
            .and_then([txn_op(&op)])
            .or_else([PbTxnOp::get(key.to_vec(), None)]);
        let r = self.raw_txn(txn).await.map_err(|e| match options.lease {
            Some(l) => with_lease(e, l),
            None => e,
        })?;
        let results = r.op_responses();
        if r.succeeded() {
            let prev = match results.first().map(op_result) {
                Some(TxnOpResult::Put { prev }) => prev,
                _ => None,
            };
            Ok(WriteOutcome::Committed {
                revision: header_revision(r.header()),
                prev,
            })
        } else {
            let current = match results.first().map(op_result) {
                Some(TxnOpResult::Get { kv }) => kv,
                _ => None,
            };
            Ok(WriteOutcome::Conflict { current })
        }
    }

    async fn delete(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        let txn = PbTxn::new()
            .when(
                expect
                    .to_compares(key)
                    .iter()
                    .map(compare)
                    .collect::<Vec<_>>(),
            )
            .and_then([txn_op(&TxnOp::delete(key))])
            .or_else([PbTxnOp::get(key.to_vec(), None)]);
        let r = self.raw_txn(txn).await?;
        let result = r.op_responses().first().map(op_result);
        if r.succeeded() {
            let prev = match result {
                Some(TxnOpResult::Delete { prev }) => prev,
                _ => None,
            };
            Ok(WriteOutcome::Committed {
                revision: header_revision(r.header()),
                prev,
            })
        } else {
            let current = match result {
                Some(TxnOpResult::Get { kv }) => kv,
                _ => None,
            };
            Ok(WriteOutcome::Conflict { current })
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        txn.check()?;
        let lease = txn
            .success
            .iter()
            .chain(&txn.failure)
            .find_map(|o| match o {
                TxnOp::Put { lease, .. } => *lease,
                _ => None,
            });
        let pb = PbTxn::new()
            .when(txn.compares.iter().map(compare).collect::<Vec<_>>())
            .and_then(txn.success.iter().map(txn_op).collect::<Vec<_>>())
            .or_else(txn.failure.iter().map(txn_op).collect::<Vec<_>>());
        let r = self.raw_txn(pb).await.map_err(|e| match lease {
            Some(l) => with_lease(e, l),
            None => e,
        })?;
        let results = r.op_responses().iter().map(op_result).collect();
        Ok(TxnOutcome::new(
            r.succeeded(),
            header_revision(r.header()),
            results,
        ))
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant, StoreError> {
        if ttl.is_zero() {
            return Err(StoreError::InvalidTtl {
                reason: "a lease needs a positive time to live",
            });
        }
        // etcd counts whole seconds: round up, never down.
        let secs = i64::try_from(ttl.as_nanos().div_ceil(1_000_000_000)).map_err(|_| {
            StoreError::InvalidTtl {
                reason: "time to live too large",
            }
        })?;
        let r = self
            .client
            .clone()
            .lease_grant(secs, None)
            .await
            .map_err(|e| etcd_error(e, Kind::Write))?;
        Ok(LeaseGrant::new(
            LeaseId::new(r.id()),
            Duration::from_secs(r.ttl().unsigned_abs()),
        ))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let map = |e| with_lease(etcd_error(e, Kind::Read), lease);
        let (mut keeper, mut stream) = self
            .client
            .clone()
            .lease_keep_alive(lease.get())
            .await
            .map_err(map)?;
        keeper.keep_alive().await.map_err(map)?;
        match stream.message().await.map_err(map)? {
            Some(r) if r.ttl() > 0 => Ok(Duration::from_secs(r.ttl().unsigned_abs())),
            // etcd answers a keep-alive of a dead lease with TTL 0.
            _ => Err(StoreError::LeaseNotFound { lease }),
        }
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.client
            .clone()
            .lease_revoke(lease.get())
            .await
            .map(|_| ())
            .map_err(|e| with_lease(etcd_error(e, Kind::Write), lease))
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let r = self
            .client
            .clone()
            .lease_time_to_live(lease.get(), None)
            .await
            .map_err(|e| with_lease(etcd_error(e, Kind::Read), lease))?;
        if r.ttl() < 0 {
            return Err(StoreError::LeaseNotFound { lease });
        }
        Ok(Duration::from_secs(r.ttl().unsigned_abs()))
    }

    async fn compact(&self, revision: Version) -> Result<(), StoreError> {
        let current = self.revision().await?;
        let upto = revision.min(current);
        if upto == Version::ZERO {
            return Ok(());
        }
        match self
            .client
            .clone()
            .compact(rev(upto), Some(CompactionOptions::new().with_physical()))
            .await
        {
            Ok(_) => Ok(()),
            // Compacting again at or below the last compaction is a no-op.
            Err(e)
                if e.to_string()
                    .contains("required revision has been compacted") =>
            {
                Ok(())
            }
            Err(e) => Err(etcd_error(e, Kind::Write)),
        }
    }

    async fn watch(&self, span: KeySpan, from: Version) -> Result<EtcdWatch, StoreError> {
        let (key, mut opts) = match &span {
            KeySpan::Key(k) => {
                check_key(k)?;
                (k.clone(), WatchOptions::new())
            }
            KeySpan::Prefix(p) if p.is_empty() => (vec![0], WatchOptions::new().with_all_keys()),
            KeySpan::Prefix(p) => (p.clone(), WatchOptions::new().with_prefix()),
        };
        if from != Version::ZERO {
            // etcd confirms a watch on a compacted revision before it
            // cancels it; a read at that revision fails at once instead.
            let probe = self
                .client
                .clone()
                .get(
                    key.clone(),
                    Some(GetOptions::new().with_revision(rev(from)).with_count_only()),
                )
                .await;
            if let Err(e) = probe {
                let message = e.to_string();
                if message.contains("required revision has been compacted") {
                    let first_kept = self.first_kept().await.unwrap_or(from);
                    return Err(StoreError::Compacted {
                        requested: from,
                        first_kept,
                    });
                }
                if !message.contains("future revision") {
                    return Err(etcd_error(e, Kind::Read));
                }
            }
            opts = opts.with_start_revision(rev(from));
        }
        let mut stream = self
            .client
            .clone()
            .watch(key, Some(opts))
            .await
            .map_err(|e| etcd_error(e, Kind::Read))?;
        let mut watch = EtcdWatch {
            stream: None,
            ready: VecDeque::new(),
            from,
        };
        // The first response confirms the watch, or says it was refused
        // because its start revision is compacted.
        match stream
            .message()
            .await
            .map_err(|e| etcd_error(e, Kind::Read))?
        {
            Some(r) => watch.absorb(&r)?,
            None => return Err(StoreError::Closed),
        }
        watch.stream = Some(stream);
        Ok(watch)
    }
}

/// A watch on an [`EtcdStore`].
pub struct EtcdWatch {
    /// `None` only while being created.
    stream: Option<WatchStream>,
    ready: VecDeque<WatchEvent>,
    /// The start revision asked for (for compaction errors).
    from: Version,
}

impl EtcdWatch {
    /// Takes a response's events, or its cancellation as an error.
    fn absorb(&mut self, r: &etcd_client::WatchResponse) -> Result<(), StoreError> {
        if r.canceled() {
            if r.compact_revision() > 0 {
                return Err(StoreError::Compacted {
                    requested: self.from,
                    first_kept: version(r.compact_revision()),
                });
            }
            return Err(StoreError::Backend {
                source: format!("watch canceled by etcd: {}", r.cancel_reason()).into(),
            });
        }
        for e in r.events() {
            let Some(k) = e.kv() else { continue };
            let event = match e.event_type() {
                EventType::Put => WatchEvent::new(EventKind::Put, kv(k)),
                EventType::Delete => {
                    WatchEvent::deleted(k.key().to_vec(), version(k.mod_revision()))
                }
            };
            self.ready.push_back(event);
        }
        Ok(())
    }
}

impl Watch for EtcdWatch {
    async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                self.from = e.revision().next();
                return Ok(e);
            }
            let Some(stream) = self.stream.as_mut() else {
                return Err(StoreError::Closed);
            };
            match stream
                .message()
                .await
                .map_err(|e| etcd_error(e, Kind::Read))?
            {
                Some(r) => self.absorb(&r)?,
                None => {
                    return Err(StoreError::Unavailable {
                        source: "etcd closed the watch stream".into(),
                    });
                }
            }
        }
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").finish_non_exhaustive()
    }
}
