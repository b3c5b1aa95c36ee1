//! The Lease service: grant, revoke, time to live, and the keep-alive
//! stream that renews one lease.

use tokio::sync::mpsc;
use tonic::{Code, Status, Streaming};

use super::{CallResult, Client, Error};

/// The Lease service's messages.
pub(super) mod pb {
    use super::super::kv::pb::ResponseHeader;

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
}

use pb::LeaseTtlResponse as LeaseKeepAliveResponse;

impl Client {
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
}

pub(crate) struct LeaseGrantResponse(pb::LeaseGrantResponse);

impl LeaseGrantResponse {
    pub fn id(&self) -> i64 {
        self.0.id
    }
    #[allow(dead_code)]
    pub fn ttl(&self) -> i64 {
        self.0.ttl
    }
}

pub(crate) struct LeaseTimeToLiveResponse(pb::LeaseTtlResponse);

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
pub(crate) struct LeaseKeeper {
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
pub(crate) struct LeaseKeepAliveStream(Streaming<LeaseKeepAliveResponse>);

impl LeaseKeepAliveStream {
    pub async fn message(&mut self) -> CallResult<Option<LeaseKeepAliveResponse>> {
        Ok(self.0.message().await?)
    }
}
