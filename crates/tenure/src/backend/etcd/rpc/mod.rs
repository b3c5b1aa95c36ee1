//! The part of etcd's v3 gRPC API that tenure speaks, written out by hand.
//!
//! Why not the `etcd-client` crate: its build script compiles etcd's `.proto`
//! files and so needs `protoc` on every machine that builds tenure. Here the
//! messages are `prost` structs with etcd's field numbers, only the fields
//! tenure reads or sends (protobuf skips the others when decoding), and the
//! calls go through `tonic`'s generic client. Keeping it current means
//! nothing: etcd keeps its v3 wire format stable, and a field tenure starts to
//! use is one more line here, with the number from etcd's `rpc.proto`
//! (`api/etcdserverpb/rpc.proto`, `api/mvccpb/kv.proto`).
//!
//! The surface mirrors the calls `super` makes: [`Client`] with `get`, `txn`,
//! `lease_*` and `watch`, and the [`Txn`]/[`TxnOp`]/[`Compare`] builders.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use tonic_prost::ProstCodec;

#[cfg(feature = "tls")]
pub(super) use tonic::transport::{Certificate, ClientTlsConfig as TlsOptions};

/// etcd's messages (package `etcdserverpb`, and `mvccpb`'s two).
pub(super) mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(int64, tag = "3")]
        pub revision: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
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
    pub struct Event {
        /// 0 put, 1 delete.
        #[prost(int32, tag = "1")]
        pub r#type: i32,
        #[prost(message, optional, tag = "2")]
        pub kv: Option<KeyValue>,
        /// The key as it was before the event, if the watch asked for it.
        #[prost(message, optional, tag = "3")]
        pub prev_kv: Option<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub limit: i64,
        /// 0 none, 1 ascending, 2 descending.
        #[prost(int32, tag = "5")]
        pub sort_order: i32,
        /// 0 key, 1 version, 2 create revision, 3 mod revision, 4 value.
        #[prost(int32, tag = "6")]
        pub sort_target: i32,
        #[prost(bool, tag = "8")]
        pub keys_only: bool,
        #[prost(int64, tag = "13")]
        pub max_create_revision: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")]
        pub kvs: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub lease: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub deleted: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RequestOp {
        #[prost(oneof = "Request", tags = "1, 2, 3, 4")]
        pub request: Option<Request>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Request {
        #[prost(message, tag = "1")]
        Range(RangeRequest),
        #[prost(message, tag = "2")]
        Put(PutRequest),
        #[prost(message, tag = "3")]
        DeleteRange(DeleteRangeRequest),
        #[prost(message, tag = "4")]
        Txn(TxnRequest),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseOp {
        #[prost(oneof = "Response", tags = "1, 2, 3, 4")]
        pub response: Option<Response>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        #[prost(message, tag = "1")]
        Range(RangeResponse),
        #[prost(message, tag = "2")]
        Put(PutResponse),
        #[prost(message, tag = "3")]
        DeleteRange(DeleteRangeResponse),
        #[prost(message, tag = "4")]
        Txn(TxnResponse),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Compare {
        /// 0 equal, 1 greater, 2 less, 3 not equal.
        #[prost(int32, tag = "1")]
        pub result: i32,
        /// 0 version, 1 create revision, 2 mod revision, 3 value, 4 lease.
        #[prost(int32, tag = "2")]
        pub target: i32,
        #[prost(bytes = "vec", tag = "3")]
        pub key: Vec<u8>,
        #[prost(oneof = "CompareTarget", tags = "4, 5, 6, 7, 8")]
        pub target_union: Option<CompareTarget>,
        /// Compares every key in `[key, range_end)` (etcd ≥ 3.3).
        #[prost(bytes = "vec", tag = "64")]
        pub range_end: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum CompareTarget {
        #[prost(int64, tag = "4")]
        Version(i64),
        #[prost(int64, tag = "5")]
        CreateRevision(i64),
        #[prost(int64, tag = "6")]
        ModRevision(i64),
        #[prost(bytes = "vec", tag = "7")]
        Value(Vec<u8>),
        #[prost(int64, tag = "8")]
        Lease(i64),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnRequest {
        #[prost(message, repeated, tag = "1")]
        pub compare: Vec<Compare>,
        #[prost(message, repeated, tag = "2")]
        pub success: Vec<RequestOp>,
        #[prost(message, repeated, tag = "3")]
        pub failure: Vec<RequestOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(bool, tag = "2")]
        pub succeeded: bool,
        #[prost(message, repeated, tag = "3")]
        pub responses: Vec<ResponseOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchRequest {
        #[prost(oneof = "WatchRequestUnion", tags = "1")]
        pub request_union: Option<WatchRequestUnion>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum WatchRequestUnion {
        #[prost(message, tag = "1")]
        Create(WatchCreateRequest),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchCreateRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub start_revision: i64,
        #[prost(bool, tag = "6")]
        pub prev_kv: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub watch_id: i64,
        #[prost(bool, tag = "3")]
        pub created: bool,
        #[prost(bool, tag = "4")]
        pub canceled: bool,
        #[prost(int64, tag = "5")]
        pub compact_revision: i64,
        #[prost(message, repeated, tag = "11")]
        pub events: Vec<Event>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantRequest {
        #[prost(int64, tag = "1")]
        pub ttl: i64,
        #[prost(int64, tag = "2")]
        pub id: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub id: i64,
        #[prost(int64, tag = "3")]
        pub ttl: i64,
        #[prost(string, tag = "4")]
        pub error: String,
    }

    /// Also the keep-alive and time-to-live requests (`ID = 1`; time to
    /// live's `keys = 2` stays false).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseIdRequest {
        #[prost(int64, tag = "1")]
        pub id: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseRevokeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }

    /// Also the time-to-live response (`grantedTTL = 4` unread).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseTtlResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub id: i64,
        #[prost(int64, tag = "3")]
        pub ttl: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AuthenticateRequest {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub password: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AuthenticateResponse {
        #[prost(string, tag = "2")]
        pub token: String,
    }
}

pub(super) use pb::{KeyValue, LeaseTtlResponse as LeaseKeepAliveResponse};

/// A failed call: a gRPC status, or a stream that ended.
#[derive(Debug)]
pub(super) enum Error {
    Status(Status),
    Transport(String),
    Stream(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Status(s) => write!(f, "{}: {}", s.code(), s.message()),
            Error::Transport(e) | Error::Stream(e) => f.write_str(e),
        }
    }
}

impl From<Status> for Error {
    fn from(s: Status) -> Self {
        Error::Status(s)
    }
}

type CallResult<T> = std::result::Result<T, Error>;

/// How to connect: timeouts, HTTP/2 keep-alive, the user, TLS.
#[derive(Default)]
pub(super) struct ConnectOptions {
    connect_timeout: Option<Duration>,
    keep_alive: Option<(Duration, Duration)>,
    user: Option<(String, String)>,
    #[cfg(feature = "tls")]
    tls: Option<TlsOptions>,
}

impl ConnectOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }
    pub fn with_user(mut self, name: String, password: String) -> Self {
        self.user = Some((name, password));
        self
    }
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// A connection to an etcd cluster (clones share it).
#[derive(Clone)]
pub(super) struct Client {
    channel: Channel,
    /// The user, kept to authenticate again when the token expires.
    user: Option<Arc<(String, String)>>,
    token: Arc<std::sync::RwLock<Option<MetadataValue<Ascii>>>>,
    /// One renewal of the token at a time (each is a bcrypt check and a
    /// raft round on the server).
    renewing: Arc<tokio::sync::Mutex<()>>,
}

impl Client {
    /// Connects to `endpoints` (`host:port`, or a URL), balancing over them,
    /// and authenticates when a user is given.
    pub async fn connect(
        endpoints: Vec<String>,
        options: Option<ConnectOptions>,
    ) -> CallResult<Self> {
        let options = options.unwrap_or_default();
        let mut list = Vec::with_capacity(endpoints.len());
        for e in &endpoints {
            let uri = if e.contains("://") {
                e.clone()
            } else {
                #[cfg(feature = "tls")]
                let scheme = if options.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                #[cfg(not(feature = "tls"))]
                let scheme = "http";
                format!("{scheme}://{e}")
            };
            let mut endpoint = Endpoint::from_shared(uri)
                .map_err(|err| Error::Transport(format!("endpoint {e}: {err}")))?;
            if let Some(t) = options.connect_timeout {
                endpoint = endpoint.connect_timeout(t);
            }
            if let Some((interval, timeout)) = options.keep_alive {
                endpoint = endpoint
                    .http2_keep_alive_interval(interval)
                    .keep_alive_timeout(timeout)
                    .keep_alive_while_idle(true);
            }
            #[cfg(feature = "tls")]
            if let Some(tls) = &options.tls {
                endpoint = endpoint
                    .tls_config(tls.clone())
                    .map_err(|err| Error::Transport(format!("TLS for {e}: {err}")))?;
            }
            list.push(endpoint);
        }
        let channel = match list.len() {
            0 => return Err(Error::Transport("no endpoint".into())),
            // One server: connect now, so a refusal shows at once (the
            // channel reconnects by itself later).
            1 => list[0]
                .connect()
                .await
                .map_err(|e| Error::Transport(transport_text(&e)))?,
            _ => Channel::balance_list(list.into_iter()),
        };
        let client = Client {
            channel,
            user: options.user.map(Arc::new),
            token: Arc::default(),
            renewing: Arc::default(),
        };
        client.authenticate().await?;
        Ok(client)
    }

    /// Gets a token for the user (nothing to do without one).
    async fn authenticate(&self) -> CallResult<()> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        let request = pb::AuthenticateRequest {
            name: user.0.clone(),
            password: user.1.clone(),
        };
        let resp: pb::AuthenticateResponse = self
            .unary_once("/etcdserverpb.Auth/Authenticate", request, false)
            .await?;
        let token = MetadataValue::try_from(resp.token.as_str()).map_err(|_| {
            Error::Status(Status::internal(
                "etcd sent an auth token that is not ASCII",
            ))
        })?;
        if let Ok(mut slot) = self.token.write() {
            *slot = Some(token);
        }
        Ok(())
    }

    /// A new token after a refusal, unless another call got one meanwhile.
    async fn renew_token(&self) -> CallResult<()> {
        let before = self.token.read().ok().and_then(|t| t.clone());
        let _one = self.renewing.lock().await;
        let now = self.token.read().ok().and_then(|t| t.clone());
        if now != before {
            return Ok(());
        }
        self.authenticate().await
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Ok(slot) = self.token.read() {
            if let Some(token) = slot.as_ref() {
                request.metadata_mut().insert("token", token.clone());
            }
        }
        request
    }

    async fn unary_once<Q, R>(
        &self,
        path: &'static str,
        message: Q,
        with_token: bool,
    ) -> CallResult<R>
    where
        Q: prost::Message + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = Grpc::new(self.channel.clone());
        grpc.ready()
            .await
            .map_err(|e| Error::Status(Status::unavailable(e.to_string())))?;
        let request = if with_token {
            self.request(message)
        } else {
            tonic::Request::new(message)
        };
        let resp = grpc
            .unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::<Q, R>::default(),
            )
            .await?;
        Ok(resp.into_inner())
    }

    /// A unary call; an expired token is renewed once and the call retried.
    async fn unary<Q, R>(&self, path: &'static str, message: Q) -> CallResult<R>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        match self.unary_once(path, message.clone(), true).await {
            Err(Error::Status(s)) if self.user.is_some() && token_expired(&s) => {
                self.renew_token().await?;
                self.unary_once(path, message, true).await
            }
            other => other,
        }
    }

    async fn streaming<Q, R>(
        &self,
        path: &'static str,
        first: Q,
    ) -> CallResult<(mpsc::Sender<Q>, Streaming<R>)>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (sender, receiver) = mpsc::channel::<Q>(16);
            // etcd answers a stream's headers with its first message: the
            // first request goes before the call.
            sender
                .send(first.clone())
                .await
                .map_err(|e| Error::Stream(e.to_string()))?;
            let outbound = futures_util::stream::unfold(receiver, |mut r| async move {
                r.recv().await.map(|m| (m, r))
            });
            let mut grpc = Grpc::new(self.channel.clone());
            grpc.ready()
                .await
                .map_err(|e| Error::Status(Status::unavailable(e.to_string())))?;
            let result = grpc
                .streaming(
                    self.request(outbound),
                    PathAndQuery::from_static(path),
                    ProstCodec::<Q, R>::default(),
                )
                .await;
            match result {
                Ok(resp) => return Ok((sender, resp.into_inner())),
                Err(s) if attempts == 1 && self.user.is_some() && token_expired(&s) => {
                    self.renew_token().await?;
                }
                Err(s) => return Err(s.into()),
            }
        }
    }

    /// Reads `key` (a range with `options`).
    pub async fn get(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> CallResult<RangeResponse> {
        let request = options.unwrap_or_default().into_request(key.into());
        self.unary("/etcdserverpb.KV/Range", request).await
    }

    pub async fn txn(&mut self, txn: Txn) -> CallResult<TxnResponse> {
        self.unary("/etcdserverpb.KV/Txn", txn.0).await
    }

    pub async fn lease_grant(
        &mut self,
        ttl: i64,
        _options: Option<()>,
    ) -> CallResult<LeaseGrantResponse> {
        let request = pb::LeaseGrantRequest { ttl, id: 0 };
        let inner: pb::LeaseGrantResponse = self
            .unary("/etcdserverpb.Lease/LeaseGrant", request)
            .await?;
        if !inner.error.is_empty() {
            return Err(Error::Status(Status::new(Code::Unknown, inner.error)));
        }
        Ok(LeaseGrantResponse(inner))
    }

    pub async fn lease_revoke(&mut self, id: i64) -> CallResult<()> {
        let _: pb::LeaseRevokeResponse = self
            .unary("/etcdserverpb.Lease/LeaseRevoke", pb::LeaseIdRequest { id })
            .await?;
        Ok(())
    }

    pub async fn lease_time_to_live(
        &mut self,
        id: i64,
        _options: Option<()>,
    ) -> CallResult<LeaseTimeToLiveResponse> {
        let inner: pb::LeaseTtlResponse = self
            .unary(
                "/etcdserverpb.Lease/LeaseTimeToLive",
                pb::LeaseIdRequest { id },
            )
            .await?;
        Ok(LeaseTimeToLiveResponse(inner))
    }

    /// Opens a keep-alive stream for lease `id`; its first answer is read
    /// here (a lease already gone is an error).
    pub async fn lease_keep_alive(
        &mut self,
        id: i64,
    ) -> CallResult<(LeaseKeeper, LeaseKeepAliveStream)> {
        let (sender, stream) = self
            .streaming(
                "/etcdserverpb.Lease/LeaseKeepAlive",
                pb::LeaseIdRequest { id },
            )
            .await?;
        let mut stream = LeaseKeepAliveStream(stream);
        match stream.message().await? {
            Some(first) if first.ttl > 0 => Ok((LeaseKeeper { id, sender }, stream)),
            Some(_) => Err(Error::Stream("lease not found".into())),
            None => Err(Error::Stream("the keep-alive stream ended at once".into())),
        }
    }

    /// Opens a watch stream with one watch on `key`.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> CallResult<WatchStream> {
        let first = options.unwrap_or_default().into_request(key.into());
        let (sender, stream) = self.streaming("/etcdserverpb.Watch/Watch", first).await?;
        Ok(WatchStream { sender, stream })
    }
}

/// Whether etcd refused a call for a token to renew: expired or unknown,
/// or issued before a change of users or roles (as Go's client renews on).
fn token_expired(s: &Status) -> bool {
    s.message().contains("invalid auth token")
        || s.message().contains("revision of auth store is old")
}

/// A transport error with its causes (tonic's own text is only "transport
/// error").
fn transport_text(e: &tonic::transport::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The end of the range of keys that start with `prefix`.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// How a range is read.
#[derive(Clone, Default)]
pub(super) struct GetOptions {
    prefix: bool,
    range_end: Option<Vec<u8>>,
    limit: i64,
    sort: Option<(SortTarget, SortOrder)>,
    keys_only: bool,
    max_create_revision: i64,
}

#[derive(Clone, Copy)]
pub(super) enum SortTarget {
    Create,
}

#[derive(Clone, Copy)]
pub(super) enum SortOrder {
    Ascend,
    Descend,
}

impl GetOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.range_end = Some(end.into());
        self
    }
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
    pub fn with_sort(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.sort = Some((target, order));
        self
    }
    pub fn with_keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
    pub fn with_max_create_revision(mut self, revision: i64) -> Self {
        self.max_create_revision = revision;
        self
    }

    fn into_request(self, key: Vec<u8>) -> pb::RangeRequest {
        let range_end = match (self.range_end, self.prefix) {
            (Some(end), _) => end,
            (None, true) => prefix_end(&key),
            (None, false) => Vec::new(),
        };
        let (sort_target, sort_order) = match self.sort {
            None => (0, 0),
            Some((SortTarget::Create, order)) => (
                2,
                match order {
                    SortOrder::Ascend => 1,
                    SortOrder::Descend => 2,
                },
            ),
        };
        pb::RangeRequest {
            key,
            range_end,
            limit: self.limit,
            sort_order,
            sort_target,
            keys_only: self.keys_only,
            max_create_revision: self.max_create_revision,
        }
    }
}

/// How a key is written.
#[derive(Clone, Default)]
pub(super) struct PutOptions {
    lease: i64,
}

impl PutOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_lease(mut self, lease: i64) -> Self {
        self.lease = lease;
        self
    }
}

/// How a range is deleted.
#[derive(Clone, Default)]
pub(super) struct DeleteOptions {
    prefix: bool,
}

impl DeleteOptions {
    #[allow(dead_code)]
    pub fn new() -> Self {
        Self::default()
    }
    #[allow(dead_code)]
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
}

/// How a watch starts.
#[derive(Clone, Default)]
pub(super) struct WatchOptions {
    prefix: bool,
    start_revision: i64,
    prev_kv: bool,
}

impl WatchOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }
    /// Each event also carries the key as it was before it.
    pub fn with_prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }

    fn into_request(self, key: Vec<u8>) -> pb::WatchRequest {
        let range_end = if self.prefix {
            prefix_end(&key)
        } else {
            Vec::new()
        };
        pb::WatchRequest {
            request_union: Some(pb::WatchRequestUnion::Create(pb::WatchCreateRequest {
                key,
                range_end,
                start_revision: self.start_revision,
                prev_kv: self.prev_kv,
            })),
        }
    }
}

/// What a comparison checks.
#[derive(Clone, Copy)]
pub(super) enum CompareOp {
    Equal,
    Greater,
    Less,
}

impl CompareOp {
    fn code(self) -> i32 {
        match self {
            CompareOp::Equal => 0,
            CompareOp::Greater => 1,
            CompareOp::Less => 2,
        }
    }
}

/// One comparison of a transaction.
#[derive(Clone)]
pub(super) struct Compare(pb::Compare);

impl Compare {
    fn new(key: Vec<u8>, op: CompareOp, target: i32, value: pb::CompareTarget) -> Self {
        Compare(pb::Compare {
            result: op.code(),
            target,
            key,
            target_union: Some(value),
            range_end: Vec::new(),
        })
    }
    /// Compares every key from this one up to `end` (exclusive).
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.0.range_end = end.into();
        self
    }
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        Self::new(
            key.into(),
            op,
            1,
            pb::CompareTarget::CreateRevision(revision),
        )
    }
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Self {
        Self::new(key.into(), op, 2, pb::CompareTarget::ModRevision(revision))
    }
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Self {
        Self::new(key.into(), op, 3, pb::CompareTarget::Value(value.into()))
    }
}

/// One operation of a transaction.
#[derive(Clone)]
pub(super) struct TxnOp(pb::RequestOp);

impl TxnOp {
    fn of(request: pb::Request) -> Self {
        TxnOp(pb::RequestOp {
            request: Some(request),
        })
    }
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Self {
        Self::of(pb::Request::Range(
            options.unwrap_or_default().into_request(key.into()),
        ))
    }
    pub fn put(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Self {
        Self::of(pb::Request::Put(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            lease: options.unwrap_or_default().lease,
        }))
    }
    pub fn delete(key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> Self {
        let key = key.into();
        let range_end = if options.unwrap_or_default().prefix {
            prefix_end(&key)
        } else {
            Vec::new()
        };
        Self::of(pb::Request::DeleteRange(pb::DeleteRangeRequest {
            key,
            range_end,
        }))
    }
    pub fn txn(txn: Txn) -> Self {
        Self::of(pb::Request::Txn(txn.0))
    }
}

/// A transaction: `when` every compare holds, `and_then`, else `or_else`.
#[derive(Clone, Default)]
pub(super) struct Txn(pb::TxnRequest);

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compares: Vec<Compare>) -> Self {
        self.0.compare = compares.into_iter().map(|c| c.0).collect();
        self
    }
    pub fn and_then(mut self, ops: Vec<TxnOp>) -> Self {
        self.0.success = ops.into_iter().map(|o| o.0).collect();
        self
    }
    pub fn or_else(mut self, ops: Vec<TxnOp>) -> Self {
        self.0.failure = ops.into_iter().map(|o| o.0).collect();
        self
    }
}

/// The store's revision when it answered.
#[derive(Clone, Copy)]
pub(super) struct Header(i64);

impl Header {
    pub fn revision(&self) -> i64 {
        self.0
    }
}

fn header(h: &Option<pb::ResponseHeader>) -> Option<Header> {
    h.as_ref().map(|h| Header(h.revision))
}

impl KeyValue {
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    pub fn value(&self) -> &[u8] {
        &self.value
    }
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }
    pub fn lease(&self) -> i64 {
        self.lease
    }
}

/// A range read's answer.
pub(super) type RangeResponse = pb::RangeResponse;

/// A transaction's answer, each operation's in order.
pub(super) type TxnResponse = pb::TxnResponse;

/// One operation's answer in a transaction, borrowed from it (a read's keys
/// are not copied to be looked at).
pub(super) enum TxnOpResponse<'a> {
    Get(&'a RangeResponse),
    Put,
    Delete,
    Txn(&'a TxnResponse),
}

impl RangeResponse {
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
}

impl TxnResponse {
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }
    pub fn header(&self) -> Option<Header> {
        header(&self.header)
    }
    pub fn op_responses(&self) -> Vec<TxnOpResponse<'_>> {
        self.responses
            .iter()
            .filter_map(|r| r.response.as_ref())
            .map(|r| match r {
                pb::Response::Range(g) => TxnOpResponse::Get(g),
                pb::Response::Put(_) => TxnOpResponse::Put,
                pb::Response::DeleteRange(_) => TxnOpResponse::Delete,
                pb::Response::Txn(t) => TxnOpResponse::Txn(t),
            })
            .collect()
    }
}

pub(super) struct LeaseGrantResponse(pb::LeaseGrantResponse);

impl LeaseGrantResponse {
    pub fn id(&self) -> i64 {
        self.0.id
    }
    #[allow(dead_code)]
    pub fn ttl(&self) -> i64 {
        self.0.ttl
    }
}

pub(super) struct LeaseTimeToLiveResponse(pb::LeaseTtlResponse);

impl LeaseTimeToLiveResponse {
    /// Seconds left; -1 when the lease is gone.
    pub fn ttl(&self) -> i64 {
        self.0.ttl
    }
}

impl LeaseKeepAliveResponse {
    pub fn ttl(&self) -> i64 {
        self.ttl
    }
}

/// Sends keep-alives on a lease's stream.
pub(super) struct LeaseKeeper {
    id: i64,
    sender: mpsc::Sender<pb::LeaseIdRequest>,
}

impl LeaseKeeper {
    pub async fn keep_alive(&mut self) -> CallResult<()> {
        self.sender
            .send(pb::LeaseIdRequest { id: self.id })
            .await
            .map_err(|_| Error::Stream("the keep-alive stream is closed".into()))
    }
}

/// A lease's keep-alive answers.
pub(super) struct LeaseKeepAliveStream(Streaming<LeaseKeepAliveResponse>);

impl LeaseKeepAliveStream {
    pub async fn message(&mut self) -> CallResult<Option<LeaseKeepAliveResponse>> {
        Ok(self.0.message().await?)
    }
}

/// A watch stream; more watches can be added to it.
pub(super) struct WatchStream {
    sender: mpsc::Sender<pb::WatchRequest>,
    stream: Streaming<pb::WatchResponse>,
}

impl WatchStream {
    /// Adds a watch on `key` to this stream.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> CallResult<()> {
        let request = options.unwrap_or_default().into_request(key.into());
        self.sender
            .send(request)
            .await
            .map_err(|_| Error::Stream("the watch stream is closed".into()))
    }

    pub async fn message(&mut self) -> CallResult<Option<WatchResponse>> {
        Ok(self.stream.message().await?.map(WatchResponse))
    }
}

/// One answer on a watch stream.
pub(super) struct WatchResponse(pb::WatchResponse);

/// Put or delete.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum EventType {
    Put,
    Delete,
}

impl WatchResponse {
    pub fn canceled(&self) -> bool {
        self.0.canceled
    }
    pub fn events(&self) -> &[pb::Event] {
        &self.0.events
    }
}

impl pb::Event {
    pub fn event_type(&self) -> EventType {
        if self.r#type == 1 {
            EventType::Delete
        } else {
            EventType::Put
        }
    }
    pub fn kv(&self) -> Option<&KeyValue> {
        self.kv.as_ref()
    }
    pub fn prev_kv(&self) -> Option<&KeyValue> {
        self.prev_kv.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn prefix_ends_are_the_next_key() {
        assert_eq!(prefix_end(b"a/b"), b"a/c".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn a_txn_encodes_with_etcds_field_numbers() {
        // Compare{result=EQUAL(0, omitted), target=CREATE(1), key="k",
        // create_revision=0}; success [Range{key="k"}].
        let txn = Txn::new()
            .when(vec![Compare::create_revision("k", CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::get("k", None)]);
        let bytes = txn.0.encode_to_vec();
        assert_eq!(
            bytes,
            vec![
                0x0a, 0x07, 0x10, 0x01, 0x1a, 0x01, b'k', 0x28, 0x00, // compare
                0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, b'k', // success
            ]
        );
    }

    #[test]
    fn a_delete_event_decodes() {
        let event = pb::Event {
            r#type: 1,
            kv: Some(KeyValue {
                key: b"k".to_vec(),
                ..KeyValue::default()
            }),
            prev_kv: Some(KeyValue {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..KeyValue::default()
            }),
        };
        let resp = pb::WatchResponse {
            events: vec![event],
            ..Default::default()
        };
        let back = pb::WatchResponse::decode(resp.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(back.events[0].event_type(), EventType::Delete);
        assert_eq!(back.events[0].kv().map(|kv| kv.key()), Some(&b"k"[..]));
        assert_eq!(
            back.events[0].prev_kv().map(|kv| kv.value()),
            Some(&b"v"[..])
        );
    }
}
