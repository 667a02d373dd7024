use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use super::wire::{
    CallError, Credentials, PbCompactionRequest, PbCompactionResponse, PbCompare, PbCompareResult,
    PbCompareTarget, PbDeleteRangeRequest, PbDeleteRangeResponse, PbEventType, PbKeyValue,
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseIdRequest, PbLeaseRevokeResponse,
    PbLeaseTtlResponse, PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse, PbRequest,
    PbRequestOp, PbResponse, PbResponseHeader, PbTargetUnion, PbTxnRequest, PbTxnResponse,
    PbWatchCreateRequest, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse, Rpc, endpoint,
};
use crate::occ::Version;
use crate::store::{
    BoxError, Compare, CompareOp, CompareTarget, EventKind, Expect, KeySpan, KeyValue, LeaseGrant,
    LeaseId, PutOptions, RangeResult, Store, StoreError, Txn, TxnOp, TxnOpResult, TxnOutcome,
    Watch, WatchEvent, WriteOutcome, check_key, check_lease, check_prefix, check_ttl, check_value,
    prefix_end,
};

/// How an [`EtcdStore`] connects: timeouts and credentials.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::backend::etcd::EtcdOptions;
///
/// let options = EtcdOptions::new()
///     .with_request_timeout(Duration::from_secs(2))
///     .with_user("app", "secret");
/// assert_eq!(options.request_timeout(), Duration::from_secs(2));
/// ```
#[derive(Clone)]
#[must_use = "options do nothing until passed to EtcdStore::connect_with"]
pub struct EtcdOptions {
    connect_timeout: Duration,
    request_timeout: Duration,
    keep_alive_interval: Duration,
    credentials: Option<Credentials>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_secs(5),
            credentials: None,
        }
    }
}

impl EtcdOptions {
    /// The defaults: 3 s to connect, 5 s per request, an HTTP/2 ping every
    /// 5 s, no authentication.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long opening a connection to one endpoint may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may take before it fails (a read with
    /// [`StoreError::Unavailable`], a write with
    /// [`StoreError::Indeterminate`]), so a frozen server gives an error,
    /// not a hang. Keep it below the TTL of the leases you hold, or a
    /// renewal stuck on a frozen member outlives the lease.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How often an idle connection is pinged (and how long the answer
    /// may take), so a watch on a vanished server fails instead of
    /// waiting forever.
    pub fn with_keep_alive_interval(mut self, interval: Duration) -> Self {
        self.keep_alive_interval = interval;
        self
    }

    /// Authenticates as `user` (etcd's `Authenticate`); the token is
    /// renewed when etcd says it expired.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            name: user.into(),
            password: password.into(),
        });
        self
    }

    /// The request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("keep_alive_interval", &self.keep_alive_interval)
            .field("user", &self.credentials.as_ref().map(|c| c.name.as_str()))
            .finish()
    }
}

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
    rpc: Rpc,
    /// Dropped with the last handle: its receivers (the watches) then see
    /// the store closed.
    open: Arc<tokio::sync::watch::Sender<()>>,
}

/// Whether a failed request was a write (whose effect is then unknown).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// Maps a failed call to a store error.
///
/// A request that never left (no connection) is `Unavailable` whatever it
/// was. A write whose connection broke or timed out after it was sent, or
/// that etcd reports as timed out in raft, may have been applied:
/// `Indeterminate`. etcd's refusals before proposing (no leader, too many
/// requests) applied nothing: `Unavailable`.
fn store_error(e: CallError, kind: Kind) -> StoreError {
    let message = e.status.message();
    if message.contains("lease not found") {
        // The id is not in the message; callers that know it re-map.
        return StoreError::LeaseNotFound {
            lease: LeaseId::new(0),
        };
    }
    let refused = [
        "etcdserver: no leader",
        "etcdserver: too many requests",
        "etcdserver: not capable",
    ]
    .iter()
    .any(|m| message.contains(m));
    let connection = matches!(
        e.status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    );
    let source: BoxError = Box::new(EtcdError(e.status));
    if e.never_sent || (connection && refused) {
        return StoreError::Unavailable { source };
    }
    match (connection, kind) {
        (true, Kind::Write) => StoreError::Indeterminate { source },
        (true, Kind::Read) => StoreError::Unavailable { source },
        (false, _) => StoreError::Backend { source },
    }
}

/// A gRPC status from etcd, shown as its code and message, with the root
/// of its cause chain as its source: tonic's and hyper's links in between
/// repeat one another ("transport error", "tcp connect error" twice).
#[derive(Debug)]
struct EtcdError(tonic::Status);

impl EtcdError {
    /// The innermost cause of the status (an I/O error, typically).
    fn root(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let mut root = std::error::Error::source(&self.0)?;
        while let Some(next) = root.source() {
            root = next;
        }
        Some(root)
    }
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let message = self.0.message();
        let repeated = self.root().is_some_and(|r| r.to_string().contains(message));
        if message.is_empty() || repeated {
            write!(f, "etcd: {:?}", self.0.code())
        } else {
            write!(f, "etcd: {message} ({:?})", self.0.code())
        }
    }
}

impl std::error::Error for EtcdError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.root()
    }
}

fn with_lease(e: StoreError, lease: LeaseId) -> StoreError {
    match e {
        StoreError::LeaseNotFound { .. } => StoreError::LeaseNotFound { lease },
        other => other,
    }
}

fn kv(k: PbKeyValue) -> KeyValue {
    KeyValue::new(
        k.key,
        k.value,
        Version::from_i64(k.create_revision),
        Version::from_i64(k.mod_revision),
        u64::try_from(k.version).unwrap_or(0),
        (k.lease != 0).then(|| LeaseId::new(k.lease)),
    )
}

fn header_revision(h: Option<&PbResponseHeader>) -> Version {
    Version::from_i64(h.map_or(0, |h| h.revision))
}

/// The key and range end that select a prefix (the empty prefix is every
/// key: from `\0` to the end of the key space).
fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        (vec![0], vec![0])
    } else {
        // etcd's range end "\0" means "to the end of the key space".
        (
            prefix.to_vec(),
            prefix_end(prefix).unwrap_or_else(|| vec![0]),
        )
    }
}

fn compare(c: &Compare) -> PbCompare {
    let result = match c.op {
        CompareOp::Equal => PbCompareResult::Equal,
        CompareOp::NotEqual => PbCompareResult::NotEqual,
        CompareOp::Less => PbCompareResult::Less,
        CompareOp::Greater => PbCompareResult::Greater,
    };
    let (target, union) = match &c.target {
        CompareTarget::CreateRevision(v) => (
            PbCompareTarget::Create,
            PbTargetUnion::CreateRevision(v.to_i64()),
        ),
        CompareTarget::ModRevision(v) => {
            (PbCompareTarget::Mod, PbTargetUnion::ModRevision(v.to_i64()))
        }
        CompareTarget::Writes(n) => (
            PbCompareTarget::Version,
            PbTargetUnion::Version(i64::try_from(*n).unwrap_or(i64::MAX)),
        ),
        CompareTarget::Value(v) => (PbCompareTarget::Value, PbTargetUnion::Value(v.clone())),
    };
    PbCompare {
        result: result as i32,
        target: target as i32,
        key: c.key.clone(),
        target_union: Some(union),
    }
}

fn get_op(key: &[u8]) -> PbRequestOp {
    PbRequestOp {
        request: Some(PbRequest::Range(PbRangeRequest {
            key: key.to_vec(),
            ..PbRangeRequest::default()
        })),
    }
}

fn txn_op(o: &TxnOp) -> PbRequestOp {
    let request = match o {
        TxnOp::Put { key, value, lease } => PbRequest::Put(PbPutRequest {
            key: key.clone(),
            value: value.clone(),
            lease: lease.map_or(0, LeaseId::get),
            prev_kv: true,
        }),
        TxnOp::Delete { key } => PbRequest::DeleteRange(PbDeleteRangeRequest {
            key: key.clone(),
            prev_kv: true,
        }),
        TxnOp::Get { key } => return get_op(key),
    };
    PbRequestOp {
        request: Some(request),
    }
}

/// Turns one etcd op response into ours.
fn op_result(r: PbResponse) -> TxnOpResult {
    match r {
        PbResponse::Put(p) => TxnOpResult::Put {
            prev: p.prev_kv.map(kv),
        },
        PbResponse::DeleteRange(d) => TxnOpResult::Delete {
            prev: d.prev_kvs.into_iter().next().map(kv),
        },
        PbResponse::Range(g) => TxnOpResult::Get {
            kv: g.kvs.into_iter().next().map(kv),
        },
    }
}

fn op_results(r: Vec<super::wire::PbResponseOp>) -> Vec<TxnOpResult> {
    r.into_iter()
        .filter_map(|o| o.response)
        .map(op_result)
        .collect()
}

impl EtcdStore {
    /// Connects to the given endpoints with [`EtcdOptions::default`].
    ///
    /// # Errors
    ///
    /// As [`connect_with`](EtcdStore::connect_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it leaves nothing behind.
    pub async fn connect<E: AsRef<str>>(endpoints: &[E]) -> Result<Self, StoreError> {
        Self::connect_with(endpoints, EtcdOptions::default()).await
    }

    /// Connects to the given endpoints (`http://host:port`; requests are
    /// spread over them), authenticates if the options say so, and checks
    /// that the cluster answers.
    ///
    /// For TLS, build a [`tonic::transport::Channel`] with your
    /// certificates and use [`from_channel`](EtcdStore::from_channel).
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidEndpoint`] for an endpoint that is not a URL,
    /// [`StoreError::Unavailable`] if no endpoint answers within the
    /// timeouts, [`StoreError::Backend`] if etcd refuses the credentials.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it leaves nothing behind.
    pub async fn connect_with<E: AsRef<str>>(
        endpoints: &[E],
        options: EtcdOptions,
    ) -> Result<Self, StoreError> {
        let mut list = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let url = e.as_ref();
            let built = endpoint(
                url,
                options.connect_timeout,
                options.request_timeout,
                options.keep_alive_interval,
            )
            .map_err(|source| StoreError::InvalidEndpoint {
                endpoint: url.to_string(),
                source: Box::new(source),
            })?;
            list.push(built);
        }
        let channel = match list.len() {
            0 => {
                return Err(StoreError::InvalidEndpoint {
                    endpoint: String::new(),
                    source: "no endpoints given".into(),
                });
            }
            1 => list.remove(0).connect_lazy(),
            _ => Channel::balance_list(list.into_iter()),
        };
        Self::from_channel(channel, options).await
    }

    /// Uses a channel you built (TLS, a custom resolver, interceptors),
    /// authenticating if the options say so, and checks that the cluster
    /// answers. The options' timeouts other than the request timeout are
    /// the channel's own business.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] if the cluster does not answer within
    /// the request timeout, [`StoreError::Backend`] if etcd refuses the
    /// credentials.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it leaves nothing behind.
    pub async fn from_channel(channel: Channel, options: EtcdOptions) -> Result<Self, StoreError> {
        let store = Self {
            rpc: Rpc::new(channel, options.credentials.clone()),
            open: Arc::new(tokio::sync::watch::Sender::new(())),
        };
        let check = async {
            store
                .rpc
                .authenticate()
                .await
                .map_err(|e| store_error(e, Kind::Read))?;
            store.revision().await
        };
        match tokio::time::timeout(options.request_timeout, check).await {
            Ok(Ok(_)) => Ok(store),
            Ok(Err(StoreError::Indeterminate { source })) => {
                Err(StoreError::Unavailable { source })
            }
            Ok(Err(e)) => Err(e),
            Err(elapsed) => Err(StoreError::Unavailable {
                source: Box::new(elapsed),
            }),
        }
    }

    async fn range_request(&self, request: PbRangeRequest) -> Result<PbRangeResponse, StoreError> {
        self.rpc
            .unary("/etcdserverpb.KV/Range", request)
            .await
            .map_err(|e| store_error(e, Kind::Read))
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
                .range_request(PbRangeRequest {
                    key: vec![0],
                    revision: Version::new(mid).to_i64(),
                    count_only: true,
                    ..PbRangeRequest::default()
                })
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
    async fn raw_txn(&self, txn: PbTxnRequest) -> Result<PbTxnResponse, StoreError> {
        self.rpc
            .unary("/etcdserverpb.KV/Txn", txn)
            .await
            .map_err(|e| store_error(e, Kind::Write))
    }

    /// A single-key write under compares: the write if they hold, a read
    /// of the key if not.
    async fn conditional(
        &self,
        key: &[u8],
        expect: Expect,
        write: PbRequestOp,
    ) -> Result<WriteOutcome, StoreError> {
        let txn = PbTxnRequest {
            compare: expect.to_compares(key).iter().map(compare).collect(),
            success: vec![write],
            failure: vec![get_op(key)],
        };
        let r = self.raw_txn(txn).await?;
        let revision = header_revision(r.header.as_ref());
        let result = op_results(r.responses).into_iter().next();
        Ok(match (r.succeeded, result) {
            (true, Some(TxnOpResult::Put { prev } | TxnOpResult::Delete { prev })) => {
                WriteOutcome::Committed { revision, prev }
            }
            (true, _) => WriteOutcome::Committed {
                revision,
                prev: None,
            },
            (false, Some(TxnOpResult::Get { kv })) => WriteOutcome::Conflict { current: kv },
            (false, _) => WriteOutcome::Conflict { current: None },
        })
    }
}

impl Store for EtcdStore {
    type Watch = EtcdWatch;

    async fn revision(&self) -> Result<Version, StoreError> {
        // A count-only read of one key returns the header.
        let r = self
            .range_request(PbRangeRequest {
                key: vec![0],
                count_only: true,
                ..PbRangeRequest::default()
            })
            .await?;
        Ok(header_revision(r.header.as_ref()))
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        check_key(key)?;
        let r = self
            .range_request(PbRangeRequest {
                key: key.to_vec(),
                ..PbRangeRequest::default()
            })
            .await?;
        Ok(r.kvs.into_iter().next().map(kv))
    }

    async fn range(&self, prefix: &[u8], limit: Option<usize>) -> Result<RangeResult, StoreError> {
        check_prefix(prefix)?;
        let (key, range_end) = prefix_range(prefix);
        let r = self
            .range_request(PbRangeRequest {
                key,
                range_end,
                // etcd treats 0 as "no limit".
                limit: limit.map_or(0, |l| i64::try_from(l.max(1)).unwrap_or(i64::MAX)),
                ..PbRangeRequest::default()
            })
            .await?;
        let revision = header_revision(r.header.as_ref());
        let mut more = r.more;
        let mut kvs: Vec<KeyValue> = r.kvs.into_iter().map(kv).collect();
        if limit == Some(0) {
            more = !kvs.is_empty();
            kvs.clear();
        }
        Ok(RangeResult::new(kvs, more, revision))
    }

    async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        check_value(value)?;
        check_lease(options.lease)?;
        let request = PbPutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: options.lease.map_or(0, LeaseId::get),
            prev_kv: true,
        };
        let map = |e| match options.lease {
            Some(l) => with_lease(e, l),
            None => e,
        };
        if options.expect == Expect::Any {
            // Nothing to compare: a plain put, etcd's cheapest write.
            let r: PbPutResponse = self
                .rpc
                .unary("/etcdserverpb.KV/Put", request)
                .await
                .map_err(|e| map(store_error(e, Kind::Write)))?;
            return Ok(WriteOutcome::Committed {
                revision: header_revision(r.header.as_ref()),
                prev: r.prev_kv.map(kv),
            });
        }
        let write = PbRequestOp {
            request: Some(PbRequest::Put(request)),
        };
        self.conditional(key, options.expect, write)
            .await
            .map_err(map)
    }

    async fn delete(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        check_key(key)?;
        if expect == Expect::Any {
            let r: PbDeleteRangeResponse = self
                .rpc
                .unary(
                    "/etcdserverpb.KV/DeleteRange",
                    PbDeleteRangeRequest {
                        key: key.to_vec(),
                        prev_kv: true,
                    },
                )
                .await
                .map_err(|e| store_error(e, Kind::Write))?;
            return Ok(WriteOutcome::Committed {
                revision: header_revision(r.header.as_ref()),
                prev: r.prev_kvs.into_iter().next().map(kv),
            });
        }
        self.conditional(key, expect, txn_op(&TxnOp::delete(key)))
            .await
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
        let pb = PbTxnRequest {
            compare: txn.compares.iter().map(compare).collect(),
            success: txn.success.iter().map(txn_op).collect(),
            failure: txn.failure.iter().map(txn_op).collect(),
        };
        let r = self.raw_txn(pb).await.map_err(|e| match lease {
            Some(l) => with_lease(e, l),
            None => e,
        })?;
        Ok(TxnOutcome::new(
            r.succeeded,
            header_revision(r.header.as_ref()),
            op_results(r.responses),
        ))
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant, StoreError> {
        check_ttl(ttl)?;
        // etcd counts whole seconds: round up, never down.
        let secs = i64::try_from(ttl.as_nanos().div_ceil(1_000_000_000)).map_err(|_| {
            StoreError::InvalidTtl {
                reason: "time to live too large",
            }
        })?;
        let r: PbLeaseGrantResponse = self
            .rpc
            .unary(
                "/etcdserverpb.Lease/LeaseGrant",
                PbLeaseGrantRequest { ttl: secs },
            )
            .await
            .map_err(|e| store_error(e, Kind::Write))?;
        if !r.error.is_empty() {
            return Err(StoreError::Backend {
                source: format!("etcd refused the lease: {}", r.error).into(),
            });
        }
        Ok(LeaseGrant::new(
            LeaseId::new(r.id),
            Duration::from_secs(r.ttl.unsigned_abs()),
        ))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let map = |e| with_lease(store_error(e, Kind::Read), lease);
        let request = tokio_stream::once(PbLeaseIdRequest { id: lease.get() });
        let mut stream: Streaming<PbLeaseTtlResponse> = self
            .rpc
            .stream("/etcdserverpb.Lease/LeaseKeepAlive", request)
            .await
            .map_err(map)?;
        match stream
            .message()
            .await
            .map_err(|s| map(CallError::from_status(s)))?
        {
            Some(r) if r.ttl > 0 => Ok(Duration::from_secs(r.ttl.unsigned_abs())),
            // etcd answers a keep-alive of a dead lease with TTL 0.
            _ => Err(StoreError::LeaseNotFound { lease }),
        }
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.rpc
            .unary::<_, PbLeaseRevokeResponse>(
                "/etcdserverpb.Lease/LeaseRevoke",
                PbLeaseIdRequest { id: lease.get() },
            )
            .await
            .map(|_| ())
            .map_err(|e| with_lease(store_error(e, Kind::Write), lease))
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let r: PbLeaseTtlResponse = self
            .rpc
            .unary(
                "/etcdserverpb.Lease/LeaseTimeToLive",
                PbLeaseIdRequest { id: lease.get() },
            )
            .await
            .map_err(|e| with_lease(store_error(e, Kind::Read), lease))?;
        if r.ttl < 0 {
            return Err(StoreError::LeaseNotFound { lease });
        }
        Ok(Duration::from_secs(r.ttl.unsigned_abs()))
    }

    async fn compact(&self, revision: Version) -> Result<(), StoreError> {
        // calm drops revisions up to `revision` inclusive; etcd's
        // compaction at R keeps R and drops what is below it. etcd cannot
        // compact past its current revision, so compacting at the current
        // revision keeps that one revision readable on etcd.
        let current = self.revision().await?;
        let upto = revision.next().min(current);
        if upto == Version::ZERO {
            return Ok(());
        }
        let request = PbCompactionRequest {
            revision: upto.to_i64(),
            physical: true,
        };
        match self
            .rpc
            .unary::<_, PbCompactionResponse>("/etcdserverpb.KV/Compact", request)
            .await
        {
            Ok(_) => Ok(()),
            // Compacting again at or below the last compaction is a no-op.
            Err(e)
                if e.status
                    .message()
                    .contains("required revision has been compacted") =>
            {
                Ok(())
            }
            Err(e) => Err(store_error(e, Kind::Write)),
        }
    }

    async fn watch(&self, span: KeySpan, from: Version) -> Result<EtcdWatch, StoreError> {
        let (key, range_end) = match &span {
            KeySpan::Key(k) => {
                check_key(k)?;
                (k.clone(), Vec::new())
            }
            KeySpan::Prefix(p) => {
                check_prefix(p)?;
                prefix_range(p)
            }
        };
        if from != Version::ZERO {
            // etcd confirms a watch on a compacted revision before it
            // cancels it; a read at that revision fails at once instead.
            let probe = self
                .rpc
                .unary::<_, PbRangeResponse>(
                    "/etcdserverpb.KV/Range",
                    PbRangeRequest {
                        key: key.clone(),
                        revision: from.to_i64(),
                        count_only: true,
                        ..PbRangeRequest::default()
                    },
                )
                .await;
            if let Err(e) = probe {
                let message = e.status.message();
                if message.contains("required revision has been compacted") {
                    let first_kept = self.first_kept().await.unwrap_or(from);
                    return Err(StoreError::Compacted {
                        requested: from,
                        first_kept,
                    });
                }
                if !message.contains("future revision") {
                    return Err(store_error(e, Kind::Read));
                }
            }
        }
        // The request side stays open for as long as the watch lives:
        // etcd ends a watch whose client closed its half of the stream.
        let (requests, receiver) = mpsc::unbounded_channel();
        let create = PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::Create(PbWatchCreateRequest {
                key,
                range_end,
                start_revision: from.to_i64(),
            })),
        };
        // The receiver is alive (it is moved into the stream just below).
        let _ = requests.send(create);
        let mut stream = self
            .rpc
            .stream(
                "/etcdserverpb.Watch/Watch",
                UnboundedReceiverStream::new(receiver),
            )
            .await
            .map_err(|e| store_error(e, Kind::Read))?;
        let mut watch = EtcdWatch {
            stream: None,
            open: self.open.subscribe(),
            _requests: requests,
            ready: VecDeque::new(),
            from,
        };
        // The first response confirms the watch, or says it was refused
        // because its start revision is compacted.
        match stream
            .message()
            .await
            .map_err(|s| store_error(CallError::from_status(s), Kind::Read))?
        {
            Some(r) => watch.absorb(r)?,
            None => return Err(StoreError::Closed),
        }
        watch.stream = Some(stream);
        Ok(watch)
    }
}

/// A watch on an [`EtcdStore`].
pub struct EtcdWatch {
    /// `None` only while being created.
    stream: Option<Streaming<PbWatchResponse>>,
    /// Ends (an error) when every handle of the store is dropped.
    open: tokio::sync::watch::Receiver<()>,
    /// The request half of the gRPC stream, kept open for the watch's
    /// life.
    _requests: mpsc::UnboundedSender<PbWatchRequest>,
    /// Events received and not yet returned, in revision order.
    ready: VecDeque<WatchEvent>,
    /// The next revision this watch returns (for compaction errors).
    from: Version,
}

impl std::fmt::Debug for EtcdWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdWatch")
            .field("buffered", &self.ready.len())
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

impl EtcdWatch {
    /// Takes a response's events, or its cancellation as an error.
    fn absorb(&mut self, r: PbWatchResponse) -> Result<(), StoreError> {
        if r.canceled {
            if r.compact_revision > 0 {
                return Err(StoreError::Compacted {
                    requested: self.from,
                    first_kept: Version::from_i64(r.compact_revision),
                });
            }
            return Err(StoreError::Backend {
                source: format!("watch canceled by etcd: {}", r.cancel_reason).into(),
            });
        }
        for e in r.events {
            let Some(k) = e.kv else { continue };
            let event = if e.r#type == PbEventType::Delete as i32 {
                WatchEvent::deleted(k.key, Version::from_i64(k.mod_revision))
            } else {
                WatchEvent::new(EventKind::Put, kv(k))
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
            let message = tokio::select! {
                message = stream.message() => message,
                // The store is gone: the watch ends with it.
                Err(_) = self.open.changed() => return Err(StoreError::Closed),
            };
            match message.map_err(|s| store_error(CallError::from_status(s), Kind::Read))? {
                Some(r) => self.absorb(r)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefix's range end increments its last byte below 0xff; a prefix
    /// of only 0xff bytes reaches the end of the key space.
    #[test]
    fn prefix_ranges() {
        assert_eq!(prefix_range(b"ab"), (b"ab".to_vec(), b"ac".to_vec()));
        assert_eq!(prefix_range(&[b'a', 0xff]).1, b"b".to_vec());
        assert_eq!(prefix_range(&[0xff, 0xff]).1, vec![0]);
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
    }

    /// The messages calm declares encode with etcd's field numbers.
    #[test]
    fn put_request_wire_bytes() {
        use prost::Message;
        let bytes = PbPutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            lease: 1,
            prev_kv: true,
        }
        .encode_to_vec();
        // field 1 (bytes) "k", field 2 (bytes) "v", field 3 (varint) 1,
        // field 4 (varint) 1.
        assert_eq!(bytes, vec![0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 1, 0x20, 1]);
    }
}
