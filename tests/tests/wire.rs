//! Bad and large input on the wire: the orchestrator decodes requests up to
//! the shared message limit, and answers a message that does not decode with
//! INVALID_ARGUMENT.

use bytes::{Buf, BufMut};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_proto::{
    ChatClientMessage, ChatEvent, ListAgentToolsRequest, MAX_MESSAGE_BYTES, chat_event,
};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// A codec that sends and receives the bytes as given, so a test can put on
/// the wire what no generated client would encode.
#[derive(Clone, Copy, Default)]
struct Raw;

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

async fn raw_client(url: &str) -> tonic::client::Grpc<omicos_auth::AuthedChannel> {
    let ch = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut g = tonic::client::Grpc::new(
        omicos_auth::Credentials::bearer(omicos_e2e::TEST_TOKEN)
            .unwrap()
            .channel(ch),
    );
    g.ready().await.expect("ready");
    g
}

/// A length-delimited protobuf field (wire type 2).
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    assert!(bytes.len() < 128, "one-byte length");
    let mut v = vec![(number << 3) | 2, bytes.len() as u8];
    v.extend_from_slice(bytes);
    v
}

/// A ChatClientMessage { request: ChatRequest { message, permission_mode: "full", permissions: None } }, by hand.
fn chat_request_bytes(message: &[u8]) -> Vec<u8> {
    let mut request = field(2, message);
    request.extend(field(5, b"full"));
    field(1, &request)
}

#[tokio::test]
async fn invalid_utf8_in_a_chat_request_is_invalid_argument() {
    let llm = FakeLlm::start(vec![Reply::Text("hello".into())]).await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let chat = PathAndQuery::from_static("/omicos.v1.Orchestrator/Chat");

    // The hand encoding is right: with valid UTF-8 the same bytes run a turn.
    let good = chat_request_bytes(b"hi");
    let decoded = ChatClientMessage::decode(good.as_slice()).expect("valid bytes decode");
    assert!(
        matches!(
            decoded.msg,
            Some(omicos_proto::chat_client_message::Msg::Request(ref r)) if r.message == "hi"
        ),
        "{decoded:?}"
    );
    let mut g = raw_client(&stack.orchestrator).await;
    let mut stream = g
        .streaming(
            tonic::Request::new(tokio_stream::iter(vec![good])),
            chat.clone(),
            Raw,
        )
        .await
        .expect("a valid request is served")
        .into_inner();
    let mut done = false;
    while let Some(bytes) = stream.message().await.unwrap() {
        let ev = ChatEvent::decode(bytes.as_slice()).unwrap();
        if matches!(ev.kind, Some(chat_event::Kind::TurnDone(_))) {
            done = true;
            break;
        }
    }
    assert!(done, "the valid request ran to turn_done");

    // 0xFF 0xFE is not UTF-8: the message does not decode, and that is the caller's fault.
    let bad = chat_request_bytes(&[0xff, 0xfe]);
    assert!(ChatClientMessage::decode(bad.as_slice()).is_err());
    let mut g = raw_client(&stack.orchestrator).await;
    let status = match g
        .streaming(
            tonic::Request::new(tokio_stream::iter(vec![bad])),
            chat,
            Raw,
        )
        .await
    {
        Err(s) => s,
        Ok(r) => r
            .into_inner()
            .message()
            .await
            .expect_err("no event for a request that does not decode"),
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("UTF-8"), "{status:?}");
    assert_eq!(
        llm.requests().len(),
        1,
        "only the valid request reached the model"
    );

    // A unary RPC answers the same.
    let mut g = raw_client(&stack.orchestrator).await;
    let status = g
        .unary(
            tonic::Request::new(field(1, &[b'a', 0xc3, 0x28])),
            PathAndQuery::from_static("/omicos.v1.Orchestrator/ListAgentTools"),
            Raw,
        )
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // Still serving.
    stack
        .client()
        .await
        .list_agents(omicos_proto::ListAgentsRequest {})
        .await
        .unwrap();
}

#[tokio::test]
async fn requests_past_the_old_16_mib_limit_decode() {
    let stack = Stack::start(FakeLlm::start(vec![]).await, StackOptions::default()).await;
    let size = (16 << 20) + (1 << 20);
    assert!(size < MAX_MESSAGE_BYTES);
    // A 17 MiB agent id: an unknown agent, so a placeholder that lists tools.
    let r = stack
        .client()
        .await
        .list_agent_tools(ListAgentToolsRequest {
            agent: "a".repeat(size),
            permission_mode: "read_only".into(),
            format: "openai".into(),
        })
        .await
        .expect("decoded at the shared limit, not refused at 16 MiB")
        .into_inner();
    assert!(
        r.tools.iter().any(|t| t.name == "file_manager__read"),
        "{:?}",
        r.tools
    );
}
