//! What comes back is bounded (issue 39): a session whose model sent a
//! 70 MiB tool argument stays readable by GetSession and Attach, and an
//! invalid permission rule of 200,000 characters does not come back whole.

use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions};
use omicos_proto::{AttachRequest, ChatRequest, GetSessionRequest, PermissionRules, chat_event};
use tonic::Code;

#[tokio::test]
async fn a_huge_invalid_rule_is_refused_with_a_bounded_message() {
    let llm = FakeLlm::start(vec![]).await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let rule = format!("shell({}", "x".repeat(200_000));
    let e = match stack
        .chat(ChatRequest {
            message: "hi".into(),
            permissions: Some(PermissionRules {
                allow: vec![rule],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
    {
        Err(e) => e,
        Ok(mut h) => panic!("accepted: {:?}", h.until_done().await),
    };
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().len() < 5_000, "{} bytes", e.message().len());
    assert!(e.message().contains("permissions"), "{}", e.message());
    assert!(llm.requests().is_empty());
}

/// The case: above the 64 MiB message limit, streamed in about
/// 4,096 deltas. (It took minutes while the assembler parsed the whole
/// argument at every delta; about 12 s in a debug build now.)
#[tokio::test]
async fn a_session_with_a_70_mib_argument_stays_readable() {
    huge_argument(70 << 20).await;
}

/// The same mechanism at 256 KiB: every event and message read keeps a head.
#[tokio::test]
async fn a_session_with_a_256_kib_argument_is_read_back_bounded() {
    huge_argument(256 << 10).await;
}

async fn huge_argument(bytes: usize) {
    let huge = format!(
        "{{\"path\":\"big.txt\",\"content\":\"{}\"}}",
        "a".repeat(bytes)
    );
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![("c_big".into(), "file_manager__write".into(), huge)],
        ),
        Reply::Text("done".into()),
        Reply::Text("done".into()),
    ])
    .await;
    let stack = Stack::start(llm.clone(), StackOptions::default()).await;
    let events = stack
        .chat(ChatRequest {
            message: "write it".into(),
            permission_mode: "full".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .until_done()
        .await;
    let sid = events[0].session_id.clone();
    let started = omicos_e2e::stack::started_calls(&events)
        .into_iter()
        .next()
        .expect("the call was announced")
        .arguments;
    assert!(started.len() < 1 << 20, "{} bytes inline", started.len());
    assert!(started.contains("not shown"), "{}", &started[..200]);

    let mut c = stack.client().await;
    let s = c
        .get_session(GetSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .expect("GetSession reads the session")
        .into_inner();
    assert!(!s.messages_json.is_empty());
    let total: usize = s.messages_json.iter().map(String::len).sum();
    assert!(total < 1 << 20, "{total} bytes");
    let mut stream = c
        .attach(AttachRequest {
            session_id: sid,
            since_seq: 0,
        })
        .await
        .expect("Attach")
        .into_inner();
    let mut n = 0;
    while let Some(ev) = stream.message().await.expect("every event arrives") {
        n += 1;
        if matches!(ev.kind, Some(chat_event::Kind::TurnDone(_))) {
            break;
        }
    }
    assert!(n >= 3, "{n} events");
}
