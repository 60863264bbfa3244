//! What comes back is bounded (issue 39): a session whose model sent a
//! 70 MiB tool argument stays readable by GetSession and Attach, and an
//! invalid permission rule of 200,000 characters does not come back whole.
//! A value cut from an event or a session read is named in its
//! `cut_values`, and ReadValue gives the session's owner, and no one else,
//! the whole value, byte for byte what the model sent, in bounded chunks;
//! on SQLite and on PostgreSQL (SKIPPED without it; a failure under
//! CI=true, see omicos-testdb).

use omicos_e2e::stack::{Client, client_with};
use omicos_e2e::{FakeLlm, Reply, Stack, StackOptions, api_key};
use omicos_orchestrator::error::ERROR_KIND_METADATA;
use omicos_proto::{
    AttachRequest, ChatEvent, ChatRequest, EventValue, GetSessionRequest, MessageValue,
    PermissionRules, ReadValueRequest, ValueRef, chat_event, value_ref,
};
use std::time::Duration;
use tonic::Code;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const MALLORY: &str = "mallory-key-0123456789abcdef";

/// The place ReadValue reads, with `session` as the session.
fn read_req(session: &str, at: value_ref::At) -> ReadValueRequest {
    ReadValueRequest {
        session_id: session.into(),
        value: Some(ValueRef {
            at: Some(at),
            size_bytes: 0,
        }),
        offset: 0,
    }
}

/// The whole value a reference names, as ReadValue streams it: every chunk
/// at most 1 MiB, the first with the size, which the bytes match.
async fn read_value(c: &mut Client, req: ReadValueRequest) -> Result<Vec<u8>, tonic::Status> {
    let mut s = c.read_value(req).await?.into_inner();
    let (mut out, mut size, mut chunks) = (Vec::new(), None, 0);
    while let Some(ch) = s.message().await? {
        assert!(
            ch.data.len() <= 1 << 20,
            "a chunk of {} bytes",
            ch.data.len()
        );
        match size {
            None => size = Some(ch.size_bytes),
            Some(_) => assert_eq!(ch.size_bytes, 0, "the size comes first, once"),
        }
        chunks += 1;
        out.extend_from_slice(&ch.data);
    }
    let size = size.expect("at least one chunk");
    assert_eq!(out.len() as u64, size, "{chunks} chunks");
    assert!(chunks as u64 <= size.div_ceil(1 << 20).max(1));
    Ok(out)
}

/// (code, error kind) of a refusal.
fn refusal(s: tonic::Status) -> (Code, String) {
    let kind = s
        .metadata()
        .get(ERROR_KIND_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (s.code(), kind)
}

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
/// argument at every delta; about 12 s in a debug build now.) ReadValue
/// brings it back whole, in 1 MiB chunks.
#[tokio::test]
async fn a_session_with_a_70_mib_argument_stays_readable() {
    huge_argument(70 << 20, String::new()).await;
}

/// The same mechanism at 256 KiB: every event and message read keeps a
/// head, and names where the whole value is.
#[tokio::test]
async fn a_session_with_a_256_kib_argument_is_read_back_bounded() {
    huge_argument(256 << 10, String::new()).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn a_session_with_a_256_kib_argument_is_read_back_whole_on_postgres() {
    let Some(db) = omicos_testdb::postgres("bounded_on_postgres", "bnd").await else {
        return;
    };
    huge_argument(256 << 10, db.url.clone()).await;
}

/// An argument of `bytes` bytes, with multi-byte UTF-8 around a chunk's
/// end, so that the bytes read back must be the very bytes sent.
fn huge_of(bytes: usize) -> String {
    // The argument's 29 first bytes and these put `é` across the first
    // chunk's end when it is longer than a chunk.
    format!(
        "{{\"path\":\"big.txt\",\"content\":\"{}é日😀{}\"}}",
        "a".repeat(bytes.min(1 << 20) - 30),
        "b".repeat(bytes.saturating_sub(1 << 20))
    )
}

async fn huge_argument(bytes: usize, store_url: String) {
    let huge = huge_of(bytes);
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![("c_big".into(), "file_manager__write".into(), huge.clone())],
        ),
        Reply::Text("done".into()),
        Reply::Text("done".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            store_url,
            ..Default::default()
        },
    )
    .await;
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
    assert!(
        started.contains("ReadValue with event_seq"),
        "{}",
        &started[started.len() - 300..]
    );
    // The event names the cut value; following it gives the model's bytes.
    let mut c = stack.client().await;
    let ev = events
        .iter()
        .find(|e| matches!(e.kind, Some(chat_event::Kind::ToolCallStarted(_))))
        .unwrap();
    assert_eq!(
        ev.cut_values,
        [ValueRef {
            at: Some(value_ref::At::Event(EventValue {
                event_seq: ev.event_seq,
                field: "tool_call_started.arguments".into(),
            })),
            size_bytes: huge.len() as u64,
        }]
    );
    let whole = read_value(
        &mut c,
        ReadValueRequest {
            session_id: sid.clone(),
            value: Some(ev.cut_values[0].clone()),
            offset: 0,
        },
    )
    .await
    .expect("the owner reads the event's value");
    assert!(
        whole == huge.as_bytes(),
        "{} bytes back of {}",
        whole.len(),
        huge.len()
    );
    // Events that cut nothing name nothing.
    assert!(
        events
            .iter()
            .filter(|e| e.event_seq != ev.event_seq)
            .all(|e| e.cut_values.is_empty())
    );

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
    // GetSession names the cut argument in the assistant's message.
    let pointer = "/tool_calls/0/function/arguments";
    let in_history: Vec<&ValueRef> = s
        .cut_values
        .iter()
        .filter(|r| matches!(&r.at, Some(value_ref::At::Message(m)) if m.pointer == pointer))
        .collect();
    assert_eq!(in_history.len(), 1, "{:?}", s.cut_values);
    let Some(value_ref::At::Message(m)) = &in_history[0].at else {
        unreachable!()
    };
    let msg: serde_json::Value = serde_json::from_str(&s.messages_json[m.index as usize]).unwrap();
    assert_eq!(msg["role"], "assistant");
    assert!(
        msg.pointer(pointer)
            .and_then(|v| v.as_str())
            .is_some_and(|a| a.contains("not shown") && a.contains(pointer))
    );
    assert_eq!(in_history[0].size_bytes, huge.len() as u64);
    let whole = read_value(
        &mut c,
        ReadValueRequest {
            session_id: sid.clone(),
            value: Some(in_history[0].clone()),
            offset: 0,
        },
    )
    .await
    .expect("the owner reads the message's value");
    assert!(
        whole == huge.as_bytes(),
        "{} bytes back of {}",
        whole.len(),
        huge.len()
    );
    let mut stream = c
        .attach(AttachRequest {
            session_id: sid,
            since_seq: 0,
        })
        .await
        .expect("Attach")
        .into_inner();
    let mut n = 0;
    let mut refs = vec![];
    while let Some(ev) = stream.message().await.expect("every event arrives") {
        n += 1;
        refs.extend(ev.cut_values);
        if matches!(ev.kind, Some(chat_event::Kind::TurnDone(_))) {
            break;
        }
    }
    assert!(n >= 3, "{n} events");
    // Attach's replay names the same value as the live stream did.
    assert_eq!(refs, ev.cut_values);
}

/// alice's session as she reads it: its history (with its references) and
/// its log, without heartbeats and times.
async fn snapshot(url: &str, sid: &str) -> (Vec<String>, Vec<ValueRef>, Vec<ChatEvent>) {
    let mut c = client_with(url, ALICE).await;
    let s = c
        .get_session(GetSessionRequest {
            session_id: sid.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut stream = c
        .attach(AttachRequest {
            session_id: sid.into(),
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut log = vec![];
    while let Ok(Ok(Some(mut ev))) =
        tokio::time::timeout(Duration::from_secs(3), stream.message()).await
    {
        if matches!(ev.kind, Some(chat_event::Kind::Heartbeat(_))) {
            continue;
        }
        ev.timestamp_ms = 0;
        log.push(ev);
    }
    (s.messages_json, s.cut_values, log)
}

/// Another principal (the same tenant or another) following alice's
/// references is answered exactly as for a session that does not exist,
/// and nothing changes; a reference to nothing gets a clear, bounded error.
#[tokio::test]
async fn only_the_owner_follows_a_reference_and_bad_ones_are_refused_clearly() {
    let huge = huge_of(256 << 10);
    let llm = FakeLlm::start(vec![
        Reply::Tools(
            String::new(),
            vec![("c_big".into(), "file_manager__write".into(), huge.clone())],
        ),
        Reply::Text("done".into()),
    ])
    .await;
    let stack = Stack::start(
        llm.clone(),
        StackOptions {
            tweak: Some(Box::new(|c| {
                c.auth.api_keys = vec![
                    api_key(ALICE, "alice", "acme", "full"),
                    api_key(BOB, "bob", "acme", "full"),
                    api_key(MALLORY, "mallory", "evil", "full"),
                ];
            })),
            ..Default::default()
        },
    )
    .await;
    let url = stack.orchestrator.clone();
    let mut h = omicos_e2e::stack::ChatHandle::open(
        client_with(&url, ALICE).await,
        ChatRequest {
            message: "write it".into(),
            permission_mode: "full".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let events = h.until_done().await;
    let sid = events[0].session_id.clone();
    let before = snapshot(&url, &sid).await;
    let event_ref = events
        .iter()
        .find_map(|e| e.cut_values.first().cloned())
        .expect("the argument was cut");
    let message_ref = before.1.first().cloned().expect("the history names it");
    let mut alice = client_with(&url, ALICE).await;
    let whole = |r: &ValueRef| ReadValueRequest {
        session_id: sid.clone(),
        value: Some(r.clone()),
        offset: 0,
    };
    for r in [&event_ref, &message_ref] {
        let got = read_value(&mut alice, whole(r)).await.unwrap();
        assert!(got == huge.as_bytes());
    }
    // A read that broke off resumes at its offset: exactly the rest, the
    // first chunk still saying the whole size; at the end, nothing.
    for offset in [1, 100_000, huge.len() - 3, huge.len()] {
        let mut s = alice
            .read_value(ReadValueRequest {
                offset: offset as u64,
                ..whole(&event_ref)
            })
            .await
            .unwrap()
            .into_inner();
        let (mut rest, mut size) = (Vec::new(), None);
        while let Some(ch) = s.message().await.unwrap() {
            size.get_or_insert(ch.size_bytes);
            rest.extend_from_slice(&ch.data);
        }
        assert_eq!(size, Some(huge.len() as u64), "offset {offset}");
        assert!(rest == huge.as_bytes()[offset..], "offset {offset}");
    }

    // What a session that does not exist answers: the reference answer.
    let mut bob = client_with(&url, BOB).await;
    let missing = |r: &ValueRef| ReadValueRequest {
        session_id: "no-such-session".into(),
        value: Some(r.clone()),
        offset: 0,
    };
    let expected = (Code::NotFound, "session_not_found".to_owned());
    assert_eq!(
        refusal(read_value(&mut bob, missing(&event_ref)).await.unwrap_err()),
        expected
    );
    for (who, token) in [
        ("bob (same tenant)", BOB),
        ("mallory (other tenant)", MALLORY),
    ] {
        let mut c = client_with(&url, token).await;
        for r in [&event_ref, &message_ref] {
            let e = read_value(&mut c, whole(r)).await.unwrap_err();
            let missing_e = read_value(&mut c, missing(r)).await.unwrap_err();
            assert_eq!(refusal(e.clone()), expected, "{who}: {e:?}");
            assert_eq!(
                e.message().replace(&sid, "ID"),
                missing_e.message().replace("no-such-session", "ID"),
                "{who}: the same words as for a missing session"
            );
        }
    }
    // Nothing changed, and no model call was made.
    assert_eq!(snapshot(&url, &sid).await, before);
    assert_eq!(llm.requests().len(), 2);

    // References to nothing: clear, bounded, never a panic.
    let long = "x".repeat(200_000);
    let ev = |seq: u64, field: &str| {
        read_req(
            &sid,
            value_ref::At::Event(EventValue {
                event_seq: seq,
                field: field.into(),
            }),
        )
    };
    let msg = |index: u32, pointer: &str| {
        read_req(
            &sid,
            value_ref::At::Message(MessageValue {
                index,
                pointer: pointer.into(),
            }),
        )
    };
    let seq = match &event_ref.at {
        Some(value_ref::At::Event(e)) => e.event_seq,
        _ => unreachable!(),
    };
    let cases: Vec<(ReadValueRequest, Code, &str, &str)> = vec![
        (
            ReadValueRequest {
                session_id: sid.clone(),
                value: None,
                offset: 0,
            },
            Code::InvalidArgument,
            "invalid_argument",
            "names no value",
        ),
        (
            ev(seq, "arguments"),
            Code::InvalidArgument,
            "invalid_argument",
            "no event carries a field `arguments`",
        ),
        (
            ev(seq, &long),
            Code::InvalidArgument,
            "invalid_argument",
            "no event carries",
        ),
        (
            ev(0, "text_delta.text"),
            Code::NotFound,
            "value_not_found",
            "has no event 0",
        ),
        (
            ev(999_999, "tool_call_started.arguments"),
            Code::NotFound,
            "value_not_found",
            "has no event 999999",
        ),
        (
            ev(u64::MAX, "tool_call_started.arguments"),
            Code::NotFound,
            "value_not_found",
            "has no event",
        ),
        (
            ev(seq, "text_delta.text"),
            Code::NotFound,
            "value_not_found",
            "has no text_delta.text",
        ),
        (
            msg(9_999, "/content"),
            Code::NotFound,
            "value_not_found",
            "no message 9999",
        ),
        (
            msg(0, "content"),
            Code::InvalidArgument,
            "invalid_argument",
            "is not a JSON pointer",
        ),
        (
            msg(0, "/no/such/path"),
            Code::NotFound,
            "value_not_found",
            "has no string at `/no/such/path`",
        ),
        (
            msg(0, ""),
            Code::NotFound,
            "value_not_found",
            "has no string at",
        ),
        (
            msg(0, &format!("/{long}")),
            Code::NotFound,
            "value_not_found",
            "has no string at",
        ),
        (
            ReadValueRequest {
                offset: huge.len() as u64 + 1,
                ..ev(seq, "tool_call_started.arguments")
            },
            Code::OutOfRange,
            "offset_past_end",
            "is past the end of the value",
        ),
        (
            ReadValueRequest {
                offset: u64::MAX,
                ..ev(seq, "tool_call_started.arguments")
            },
            Code::OutOfRange,
            "offset_past_end",
            "is past the end of the value",
        ),
    ];
    for (req, code, kind, says) in cases {
        let what = format!("{:?}", req.value)
            .chars()
            .take(200)
            .collect::<String>();
        let e = read_value(&mut alice, req).await.unwrap_err();
        assert_eq!(refusal(e.clone()), (code, kind.to_owned()), "{what}: {e:?}");
        assert!(e.message().contains(says), "{what}: {}", e.message());
        assert!(
            e.message().len() < 1_000,
            "{what}: {} bytes",
            e.message().len()
        );
    }
    // A small value is read whole too (no cut needed): the user's message.
    let got = read_value(&mut alice, msg(0, "/content")).await.unwrap();
    assert_eq!(String::from_utf8(got).unwrap(), "write it");
    assert_eq!(snapshot(&url, &sid).await, before);
}
