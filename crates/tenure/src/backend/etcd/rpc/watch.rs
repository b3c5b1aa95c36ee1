//! The Watch service: a stream of watches, each on a key or a prefix, and
//! its events (`mvccpb`'s `Event`).

use tokio::sync::mpsc;
use tonic::Streaming;

use super::kv::prefix_end;
use super::{CallResult, Client, Error, KeyValue};

/// The Watch service's messages (and `mvccpb`'s `Event`).
pub(super) mod pb {
    use super::super::kv::pb::{KeyValue, ResponseHeader};

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
}

impl Client {
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

/// How a watch starts.
#[derive(Clone, Default)]
pub(crate) struct WatchOptions {
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

/// A watch stream; more watches can be added to it.
pub(crate) struct WatchStream {
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
pub(crate) struct WatchResponse(pb::WatchResponse);

/// Put or delete.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum EventType {
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
