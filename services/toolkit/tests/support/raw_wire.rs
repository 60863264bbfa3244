//! Puts on the wire what no generated client would encode: a gRPC codec that
//! sends and receives the bytes as given, and a hand encoder for protobuf
//! fields. Shared by the services' wire tests (included with `#[path]`).
#![allow(dead_code)]

use bytes::{Buf, BufMut};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// A codec of raw message bytes.
#[derive(Clone, Copy, Default)]
pub struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// A raw client of the service at `url`.
pub async fn client(url: &str) -> tonic::client::Grpc<Channel> {
    let ch = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.expect("ready");
    g
}

/// A length-delimited protobuf field (wire type 2) with a short body.
pub fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    assert!(number < 16 && bytes.len() < 128, "one-byte tag and length");
    let mut v = vec![(number << 3) | 2, bytes.len() as u8];
    v.extend_from_slice(bytes);
    v
}

/// Not UTF-8: a lone continuation byte after a lead byte that wants one more.
pub const NOT_UTF8: &[u8] = &[b'a', 0xc3, 0x28, 0xff];

/// Calls the unary `path` with `body`; returns the status it failed with.
pub async fn unary_status(url: &str, path: &'static str, body: Vec<u8>) -> Status {
    let mut g = client(url).await;
    match g
        .unary(
            tonic::Request::new(body),
            PathAndQuery::from_static(path),
            Raw,
        )
        .await
    {
        Ok(r) => panic!(
            "{path} answered {:?} to a message that does not decode",
            r.into_inner()
        ),
        Err(s) => s,
    }
}

/// Opens the streaming `path` with `first` as its only message and returns
/// the status the call ended with (on the response, or on its first message).
pub async fn stream_status(url: &str, path: &'static str, first: Vec<u8>) -> Status {
    let mut g = client(url).await;
    match g
        .streaming(
            tonic::Request::new(tokio_stream::iter(vec![first])),
            PathAndQuery::from_static(path),
            Raw,
        )
        .await
    {
        Err(s) => s,
        Ok(r) => match r.into_inner().message().await {
            Err(s) => s,
            Ok(m) => panic!("{path} answered {m:?} to a message that does not decode"),
        },
    }
}

/// Opens the server-streaming `path` with `body` and returns the status the call ended with.
pub async fn server_stream_status(url: &str, path: &'static str, body: Vec<u8>) -> Status {
    let mut g = client(url).await;
    match g
        .server_streaming(
            tonic::Request::new(body),
            PathAndQuery::from_static(path),
            Raw,
        )
        .await
    {
        Err(s) => s,
        Ok(r) => match r.into_inner().message().await {
            Err(s) => s,
            Ok(m) => panic!("{path} answered {m:?} to a message that does not decode"),
        },
    }
}
