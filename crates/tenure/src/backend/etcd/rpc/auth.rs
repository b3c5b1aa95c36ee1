//! The Auth service: a user's token, got when connecting and renewed when
//! etcd refuses it.

use tonic::metadata::MetadataValue;
use tonic::Status;

use super::{CallResult, Client, Error};

/// The Auth service's messages.
pub(super) mod pb {
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

impl Client {
    /// Gets a token for the user (nothing to do without one).
    pub(super) async fn authenticate(&self) -> CallResult<()> {
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
    pub(super) async fn renew_token(&self) -> CallResult<()> {
        let before = self.token.read().ok().and_then(|t| t.clone());
        let _one = self.renewing.lock().await;
        let now = self.token.read().ok().and_then(|t| t.clone());
        if now != before {
            return Ok(());
        }
        self.authenticate().await
    }
}

/// Whether etcd refused a call for a token to renew: expired or unknown,
/// or issued before a change of users or roles (as Go's client renews on).
pub(super) fn token_expired(s: &Status) -> bool {
    s.message().contains("invalid auth token")
        || s.message().contains("revision of auth store is old")
}
