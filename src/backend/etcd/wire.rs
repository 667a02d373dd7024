//! etcd's v3 gRPC API, the part calm speaks, declared by hand.
//!
//! The messages below are the fields of etcd's `rpc.proto` and `kv.proto`
//! (package `etcdserverpb` and `mvccpb`, API 3.4 and later) that calm sends
//! or reads, with etcd's field numbers. Declaring them with `prost`'s derive
//! instead of generating them from the `.proto` files means building calm
//! needs no `protoc`: the wire format is fixed by the field numbers, and
//! fields calm does not declare are skipped when decoding. Calls go through
//! `tonic`'s generic client, with the method paths etcd serves.
//!
//! Nothing here is public; [`super::EtcdStore`] turns these into the
//! [`Store`](crate::store::Store) model's types.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};
use tonic_prost::ProstCodec;

/// The largest response calm decodes (a range over many large values).
/// etcd's own request limit is 1.5 MiB; a response is bounded by what the
/// store holds, and this bound keeps a broken peer from making calm
/// allocate without limit.
const MAX_RESPONSE_BYTES: usize = 256 << 20;

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbResponseHeader {
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbKeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    #[prost(int64, tag = "4")]
    pub revision: i64,
    #[prost(bool, tag = "9")]
    pub count_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<PbResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<PbKeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbPutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
    #[prost(bool, tag = "4")]
    pub prev_kv: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbPutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<PbResponseHeader>,
    #[prost(message, optional, tag = "2")]
    pub prev_kv: Option<PbKeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbDeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bool, tag = "3")]
    pub prev_kv: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbDeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<PbResponseHeader>,
    #[prost(message, repeated, tag = "3")]
    pub prev_kvs: Vec<PbKeyValue>,
}

/// One operation of a transaction (etcd's `RequestOp`; calm never nests
/// transactions, so the nested-transaction arm is not declared).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbRequestOp {
    #[prost(oneof = "PbRequest", tags = "1, 2, 3")]
    pub request: Option<PbRequest>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum PbRequest {
    #[prost(message, tag = "1")]
    Range(PbRangeRequest),
    #[prost(message, tag = "2")]
    Put(PbPutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(PbDeleteRangeRequest),
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbResponseOp {
    #[prost(oneof = "PbResponse", tags = "1, 2, 3")]
    pub response: Option<PbResponse>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum PbResponse {
    #[prost(message, tag = "1")]
    Range(PbRangeResponse),
    #[prost(message, tag = "2")]
    Put(PbPutResponse),
    #[prost(message, tag = "3")]
    DeleteRange(PbDeleteRangeResponse),
}

/// etcd's `Compare.CompareResult`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub(super) enum PbCompareResult {
    Equal = 0,
    Greater = 1,
    Less = 2,
    NotEqual = 3,
}

/// etcd's `Compare.CompareTarget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub(super) enum PbCompareTarget {
    Version = 0,
    Create = 1,
    Mod = 2,
    Value = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbCompare {
    #[prost(enumeration = "PbCompareResult", tag = "1")]
    pub result: i32,
    #[prost(enumeration = "PbCompareTarget", tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "PbTargetUnion", tags = "4, 5, 6, 7")]
    pub target_union: Option<PbTargetUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum PbTargetUnion {
    #[prost(int64, tag = "4")]
    Version(i64),
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(bytes = "vec", tag = "7")]
    Value(Vec<u8>),
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbTxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<PbCompare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<PbRequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<PbRequestOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbTxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<PbResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<PbResponseOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbCompactionRequest {
    #[prost(int64, tag = "1")]
    pub revision: i64,
    #[prost(bool, tag = "2")]
    pub physical: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbCompactionResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<PbResponseHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbLeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbLeaseGrantResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

/// The request of `LeaseRevoke`, `LeaseKeepAlive` and `LeaseTimeToLive`
/// (each carries only the lease id as field 1 where calm is concerned).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbLeaseIdRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbLeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<PbResponseHeader>,
}

/// The response of `LeaseKeepAlive` and `LeaseTimeToLive` (the time left
/// is field 3 in both).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbLeaseTtlResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbWatchRequest {
    #[prost(oneof = "PbWatchRequestUnion", tags = "1")]
    pub request_union: Option<PbWatchRequestUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(super) enum PbWatchRequestUnion {
    #[prost(message, tag = "1")]
    Create(PbWatchCreateRequest),
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbWatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
}

/// etcd's `mvccpb.Event.EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub(super) enum PbEventType {
    Put = 0,
    Delete = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbEvent {
    #[prost(enumeration = "PbEventType", tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<PbKeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbWatchResponse {
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<PbEvent>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbAuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbAuthenticateResponse {
    #[prost(string, tag = "2")]
    pub token: String,
}

/// A user name and password for etcd's authentication.
#[derive(Clone)]
pub(super) struct Credentials {
    pub name: String,
    pub password: String,
}

/// The gRPC client: a channel to the cluster's endpoints and, when etcd's
/// authentication is on, the token every request carries.
#[derive(Clone)]
pub(super) struct Rpc {
    channel: Channel,
    credentials: Option<Credentials>,
    /// The current auth token. A `std` lock: it is only read or replaced,
    /// never held across an await.
    token: Arc<RwLock<Option<MetadataValue<tonic::metadata::Ascii>>>>,
}

/// What went wrong with one call: the gRPC status, and whether the request
/// is known not to have reached the server (so a write was not applied).
pub(super) struct CallError {
    pub status: Status,
    pub never_sent: bool,
}

impl Rpc {
    pub(super) fn new(channel: Channel, credentials: Option<Credentials>) -> Self {
        Self {
            channel,
            credentials,
            token: Arc::new(RwLock::new(None)),
        }
    }

    /// Asks etcd for a token with the configured credentials.
    pub(super) async fn authenticate(&self) -> Result<(), CallError> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let request = PbAuthenticateRequest {
            name: credentials.name.clone(),
            password: credentials.password.clone(),
        };
        let response: PbAuthenticateResponse = self
            .call_once("/etcdserverpb.Auth/Authenticate", request, false)
            .await?;
        let token = MetadataValue::try_from(response.token).map_err(|_| CallError {
            status: Status::internal("etcd returned an auth token that is not ASCII"),
            never_sent: false,
        })?;
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
        Ok(())
    }

    /// A client on the channel once it can take a request (a failure here
    /// sent nothing).
    async fn ready(&self) -> Result<tonic::client::Grpc<Channel>, CallError> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        grpc.ready().await.map_err(|e| CallError {
            status: Status::unavailable(e.to_string()),
            never_sent: true,
        })?;
        Ok(grpc)
    }

    fn request<M>(&self, message: M, with_token: bool) -> Request<M> {
        let mut request = Request::new(message);
        if with_token {
            let token = self.token.read().unwrap_or_else(|p| p.into_inner());
            if let Some(t) = token.as_ref() {
                request.metadata_mut().insert("token", t.clone());
            }
        }
        request
    }

    async fn call_once<M1, M2>(
        &self,
        path: &'static str,
        message: M1,
        with_token: bool,
    ) -> Result<M2, CallError>
    where
        M1: prost::Message + Send + Sync + 'static,
        M2: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = self.ready().await?;
        grpc.unary(
            self.request(message, with_token),
            PathAndQuery::from_static(path),
            ProstCodec::default(),
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(CallError::from_status)
    }

    /// One unary call; when the token has expired, authenticates again
    /// and repeats the call once (an expired token is refused before
    /// anything is applied).
    pub(super) async fn unary<M1, M2>(
        &self,
        path: &'static str,
        message: M1,
    ) -> Result<M2, CallError>
    where
        M1: prost::Message + Clone + Send + Sync + 'static,
        M2: prost::Message + Default + Send + Sync + 'static,
    {
        match self.call_once(path, message.clone(), true).await {
            Err(e) if self.credentials.is_some() && e.status.code() == Code::Unauthenticated => {
                self.authenticate().await?;
                self.call_once(path, message, true).await
            }
            other => other,
        }
    }

    /// Opens a bidirectional stream fed by `requests`.
    pub(super) async fn stream<S, M1, M2>(
        &self,
        path: &'static str,
        requests: S,
    ) -> Result<Streaming<M2>, CallError>
    where
        S: tokio_stream::Stream<Item = M1> + Send + 'static,
        M1: prost::Message + Send + Sync + 'static,
        M2: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = self.ready().await?;
        grpc.streaming(
            self.request(requests, true),
            PathAndQuery::from_static(path),
            ProstCodec::default(),
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(CallError::from_status)
    }
}

impl CallError {
    /// Classifies a status: a failure to connect means nothing was sent.
    pub(super) fn from_status(status: Status) -> Self {
        let mut never_sent = false;
        let mut source = std::error::Error::source(&status);
        while let Some(e) = source {
            if e.is::<tonic::ConnectError>() {
                never_sent = true;
            }
            source = e.source();
        }
        Self { status, never_sent }
    }
}

/// How long a request may take, applied to every call (so a frozen server
/// gives an error, not a hang).
pub(super) fn endpoint(
    url: &str,
    connect_timeout: Duration,
    request_timeout: Duration,
    keep_alive: Duration,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    Ok(tonic::transport::Endpoint::from_shared(url.to_string())?
        .connect_timeout(connect_timeout)
        .timeout(request_timeout)
        // HTTP/2 pings find a dead connection between requests, so a
        // watch or keep-alive on a vanished server fails instead of
        // waiting forever.
        .http2_keep_alive_interval(keep_alive)
        .keep_alive_timeout(keep_alive)
        .keep_alive_while_idle(true))
}
