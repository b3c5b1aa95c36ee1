//! The channel to a cluster: how to connect (timeouts, HTTP/2 keep-alive,
//! the user, TLS), and the unary and streaming calls every service goes
//! through, with the user's token.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Status, Streaming};
use tonic_prost::ProstCodec;

use super::auth::token_expired;
#[cfg(feature = "tls")]
use super::TlsOptions;
use super::{CallResult, Error};

/// How to connect: timeouts, HTTP/2 keep-alive, the user, TLS.
#[derive(Default)]
pub(crate) struct ConnectOptions {
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
pub(crate) struct Client {
    pub(super) channel: Channel,
    /// The user, kept to authenticate again when the token expires.
    pub(super) user: Option<Arc<(String, String)>>,
    pub(super) token: Arc<std::sync::RwLock<Option<MetadataValue<Ascii>>>>,
    /// One renewal of the token at a time (each is a bcrypt check and a
    /// raft round on the server).
    pub(super) renewing: Arc<tokio::sync::Mutex<()>>,
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

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Ok(slot) = self.token.read() {
            if let Some(token) = slot.as_ref() {
                request.metadata_mut().insert("token", token.clone());
            }
        }
        request
    }

    pub(super) async fn unary_once<Q, R>(
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
    pub(super) async fn unary<Q, R>(&self, path: &'static str, message: Q) -> CallResult<R>
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

    pub(super) async fn streaming<Q, R>(
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
