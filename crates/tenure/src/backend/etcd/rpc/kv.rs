//! The KV service: range reads and transactions, their messages, and the
//! builders of a transaction ([`Txn`], [`TxnOp`], [`Compare`]) and of a read.

use super::{CallResult, Client, KeyValue};

/// The KV service's messages (and `mvccpb`'s `KeyValue`).
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
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub limit: i64,
        /// The revision to read at (0: the latest).
        #[prost(int64, tag = "4")]
        pub revision: i64,
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
}

impl Client {
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
}

/// The end of the range of keys that start with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
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
pub(crate) struct GetOptions {
    prefix: bool,
    range_end: Option<Vec<u8>>,
    limit: i64,
    sort: Option<(SortTarget, SortOrder)>,
    keys_only: bool,
    max_create_revision: i64,
    revision: i64,
}

#[derive(Clone, Copy)]
pub(crate) enum SortTarget {
    Create,
}

#[derive(Clone, Copy)]
pub(crate) enum SortOrder {
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
    /// Reads the keys as they were at `revision` (one snapshot over
    /// several reads).
    pub fn with_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
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
            revision: self.revision,
            sort_order,
            sort_target,
            keys_only: self.keys_only,
            max_create_revision: self.max_create_revision,
        }
    }
}

/// How a key is written.
#[derive(Clone, Default)]
pub(crate) struct PutOptions {
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
pub(crate) struct DeleteOptions {
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

/// What a comparison checks.
#[derive(Clone, Copy)]
pub(crate) enum CompareOp {
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
pub(crate) struct Compare(pb::Compare);

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
pub(crate) struct TxnOp(pb::RequestOp);

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
pub(crate) struct Txn(pb::TxnRequest);

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
pub(crate) struct Header(i64);

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
pub(crate) type RangeResponse = pb::RangeResponse;

/// A transaction's answer, each operation's in order.
pub(crate) type TxnResponse = pb::TxnResponse;

/// One operation's answer in a transaction, borrowed from it (a read's keys
/// are not copied to be looked at).
pub(crate) enum TxnOpResponse<'a> {
    Get(&'a RangeResponse),
    Put,
    Delete,
    Txn(&'a TxnResponse),
}

impl RangeResponse {
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
    pub fn header(&self) -> Option<Header> {
        header(&self.header)
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
}
