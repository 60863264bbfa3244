//! Permission rules through the real pipeline: the runner serves Execute on
//! 127.0.0.1 with the deployment's rules in its config, and each call's
//! agent, request and session rules travel in ExecuteStart, as the
//! orchestrator sends them. Every row says what the gate did (ran without a
//! question, asked, refused) and which rule the record names.

use async_trait::async_trait;
use omicos_proto::{
    Decision, ExecuteApproval, ExecuteClientMessage, ExecuteStart, ListToolsRequest,
    PermissionMode, PermissionRules, Risk, ToolResult, ToolSpec, execute_client_message::Msg as In,
    execute_server_message::Msg as Out, tool_runner_client::ToolRunnerClient,
};
use omicos_servicekit::Shutdown;
use omicos_tool_runner::Config;
use omicos_toolkit::{CallCtx, Provider, ToolError, tool};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// A `web_fetch` that answers with the URL it was given, without a network:
/// the domain rules look at the call's `url`, never at a page.
struct FakeFetch;

#[async_trait]
impl Provider for FakeFetch {
    fn name(&self) -> &str {
        "fakefetch"
    }
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "web_fetch",
                "fetches a URL",
                json!({"type":"object","properties":{"url":{"type":"string"}},"required":["url"]}),
            )
            .risk(Risk::Read)
            .build(),
        ]
    }
    async fn call(&self, tool: &str, args: Value, _ctx: CallCtx) -> Result<Value, ToolError> {
        match tool {
            "web_fetch" => Ok(json!(format!(
                "fetched {}",
                args["url"].as_str().unwrap_or("")
            ))),
            other => Err(ToolError::UnknownTool(other.into())),
        }
    }
}

struct Runner {
    addr: String,
    _shutdown: Shutdown,
    _dir: tempfile::TempDir,
}

fn lists(allow: &[&str], ask: &[&str], deny: &[&str]) -> omicos_tool_runner::RuleLists {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    omicos_tool_runner::RuleLists {
        allow: v(allow),
        ask: v(ask),
        deny: v(deny),
    }
}

fn wire(allow: &[&str], ask: &[&str], deny: &[&str]) -> Option<PermissionRules> {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    Some(PermissionRules {
        allow: v(allow),
        ask: v(ask),
        deny: v(deny),
    })
}

/// The deployment of every test here.
fn deployment() -> omicos_tool_runner::RuleLists {
    lists(
        &[
            "shell(echo:*)",
            "file_manager__write(docs/**)",
            "web_fetch(domain:docs.rs)",
        ],
        &["shell(echo ask:*)", "web_fetch(domain:*.example.org)"],
        &[
            "shell(rm:*)",
            "file_manager__read(.env)",
            "file_manager__glob",
            "web_fetch(domain:evil.test)",
        ],
    )
}

async fn start_runner() -> Runner {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        workspace: dir.path().join("ws"),
        approval_timeout: Duration::from_secs(5),
        permissions: deployment(),
        ..Config::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new(Duration::from_secs(1));
    tokio::spawn(omicos_tool_runner::run(
        cfg,
        listener,
        shutdown.clone(),
        vec![Arc::new(FakeFetch) as Arc<dyn Provider>],
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ToolRunnerClient::connect(addr.clone()).await.is_err() {
        assert!(Instant::now() < deadline, "runner did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Runner {
        addr,
        _shutdown: shutdown,
        _dir: dir,
    }
}

fn start(tool: &str, args: Value, mode: PermissionMode) -> ExecuteStart {
    ExecuteStart {
        call_id: format!("call_{tool}"),
        tool_name: tool.into(),
        arguments: args.to_string(),
        session_id: "s".into(),
        agent_id: "tester".into(),
        permission_mode: mode as i32,
        ..Default::default()
    }
}

/// What one call did at the gate, as the client sees it.
struct Seen {
    asked: bool,
    result: ToolResult,
    record: Value,
}

impl Seen {
    /// `run`, `ask` or `refuse` from the stream alone (asked questions are
    /// denied, so a call that asked ends "denied by user").
    fn gate(&self) -> &'static str {
        if self.asked {
            "ask"
        } else if self.result.status == omicos_proto::ToolStatus::Error as i32
            && self.record["error_stage"] == "permission"
        {
            "refuse"
        } else {
            "run"
        }
    }
    fn done(&self) -> bool {
        self.result.status == omicos_proto::ToolStatus::Done as i32
    }
    fn rule(&self) -> (String, String, String) {
        let r = &self.record["permission"]["rule"];
        let s = |k: &str| r[k].as_str().unwrap_or("").to_owned();
        (s("behavior"), s("rule"), s("source"))
    }
}

impl Runner {
    /// Runs one call; an approval request is answered with `answer`.
    async fn run(&self, start: ExecuteStart, answer: (Decision, &str)) -> Seen {
        let (tx, rx) = mpsc::channel(8);
        tx.send(ExecuteClientMessage {
            msg: Some(In::Start(start)),
        })
        .await
        .unwrap();
        let mut client = ToolRunnerClient::<Channel>::connect(self.addr.clone())
            .await
            .unwrap();
        let mut resp = client
            .execute(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let mut asked = false;
        while let Some(m) = resp.message().await.unwrap() {
            match m.msg {
                Some(Out::ApprovalRequired(a)) => {
                    asked = true;
                    tx.send(ExecuteClientMessage {
                        msg: Some(In::Approval(ExecuteApproval {
                            call_id: a.call_id,
                            decision: answer.0 as i32,
                            rule: answer.1.into(),
                        })),
                    })
                    .await
                    .unwrap();
                }
                Some(Out::Result(result)) => {
                    let record = serde_json::from_str(&result.record_json).unwrap();
                    return Seen {
                        asked,
                        result,
                        record,
                    };
                }
                _ => {}
            }
        }
        panic!("no result");
    }

    async fn deny_asked(&self, start: ExecuteStart) -> Seen {
        self.run(start, (Decision::Deny, "")).await
    }
}

fn shell(cmd: &str, mode: PermissionMode) -> ExecuteStart {
    start("shell", json!({ "command": cmd }), mode)
}

const RO: PermissionMode = PermissionMode::ReadOnly;
const AUTO: PermissionMode = PermissionMode::Auto;
const FULL: PermissionMode = PermissionMode::Full;

#[tokio::test]
async fn precedence_table_through_execute() {
    let r = start_runner().await;
    let dep = "deployment";
    // (call, gate, rule that matched: (behavior, text, source); empty: none)
    let table: Vec<(ExecuteStart, &str, (&str, &str, &str))> = vec![
        // Deny beats every mode, full included, and every piece of a compound command.
        (
            shell("rm -rf x", FULL),
            "refuse",
            ("deny", "shell(rm:*)", dep),
        ),
        (
            shell("echo hi && rm x", FULL),
            "refuse",
            ("deny", "shell(rm:*)", dep),
        ),
        (
            shell("FOO=1 sudo rm x", AUTO),
            "refuse",
            ("deny", "shell(rm:*)", dep),
        ),
        // Ask beats allow, and asks where the mode would run.
        (
            shell("echo ask me", FULL),
            "ask",
            ("ask", "shell(echo ask:*)", dep),
        ),
        // Allow answers the question auto would ask...
        (
            shell("echo hi", AUTO),
            "run",
            ("allow", "shell(echo:*)", dep),
        ),
        // ...never for a compound command or a redirect (falls to the mode)...
        (shell("echo hi && ls", AUTO), "ask", ("", "", "")),
        (shell("echo hi > out.txt", AUTO), "ask", ("", "", "")),
        (shell("echo $(id)", AUTO), "ask", ("", "", "")),
        // ...and never above the mode's ceiling.
        (
            shell("echo hi", RO),
            "refuse",
            ("allow", "shell(echo:*)", dep),
        ),
        // No rule: the mode decides.
        (shell("ls", AUTO), "ask", ("", "", "")),
        (shell("ls", FULL), "run", ("", "", "")),
        (shell("ls", RO), "refuse", ("", "", "")),
        // Path forms, relative to the workspace.
        (
            start(
                "file_manager__write",
                json!({"path": "docs/a.md", "content": "a"}),
                AUTO,
            ),
            "run",
            ("allow", "file_manager__write(docs/**)", dep),
        ),
        (
            start(
                "file_manager__write",
                json!({"path": "./docs/../docs/b/c.md", "content": "a"}),
                AUTO,
            ),
            "run",
            ("allow", "file_manager__write(docs/**)", dep),
        ),
        (
            start(
                "file_manager__write",
                json!({"path": "src/a.rs", "content": "a"}),
                AUTO,
            ),
            "ask",
            ("", "", ""),
        ),
        (
            start(
                "file_manager__write",
                json!({"path": "docs/a.md", "content": "a"}),
                RO,
            ),
            "refuse",
            ("allow", "file_manager__write(docs/**)", dep),
        ),
        (
            start("file_manager__read", json!({"path": ".env"}), RO),
            "refuse",
            ("deny", "file_manager__read(.env)", dep),
        ),
        (
            start("file_manager__read", json!({"path": "deep/er/.env"}), FULL),
            "refuse",
            ("deny", "file_manager__read(.env)", dep),
        ),
        (
            start("file_manager__read", json!({"path": "docs/a.md"}), RO),
            "run",
            ("", "", ""),
        ),
        // Domain forms: the url's host exactly, or its subdomains.
        (
            start("web_fetch", json!({"url": "https://docs.rs/serde"}), RO),
            "run",
            ("allow", "web_fetch(domain:docs.rs)", dep),
        ),
        (
            start("web_fetch", json!({"url": "https://EVIL.test./x"}), FULL),
            "refuse",
            ("deny", "web_fetch(domain:evil.test)", dep),
        ),
        (
            start(
                "web_fetch",
                json!({"url": "https://api.example.org/"}),
                FULL,
            ),
            "ask",
            ("ask", "web_fetch(domain:*.example.org)", dep),
        ),
        (
            start(
                "web_fetch",
                json!({"url": "https://example.org.evil.test.com/"}),
                RO,
            ),
            "run",
            ("", "", ""),
        ),
    ];
    for (call, gate, (behavior, rule, source)) in table {
        let what = format!(
            "{} {} ({:?})",
            call.tool_name,
            call.arguments,
            call.permission_mode()
        );
        let seen = r.deny_asked(call).await;
        assert_eq!(seen.gate(), gate, "{what}: {}", seen.result.result);
        assert_eq!(
            seen.rule(),
            (behavior.into(), rule.into(), source.into()),
            "{what}: {}",
            seen.record["permission"]
        );
        // The record's gate is the stage's own decision.
        assert_eq!(seen.record["permission"]["gate"], gate, "{what}");
        if gate == "refuse" && behavior == "deny" {
            assert!(
                seen.result
                    .result
                    .contains(&format!("deny rule `{rule}` ({source})")),
                "{what}: {}",
                seen.result.result
            );
        }
    }
    // The write allowed by the rule really ran.
    let read = r
        .deny_asked(start(
            "file_manager__read",
            json!({"path": "docs/b/c.md"}),
            RO,
        ))
        .await;
    assert_eq!(read.result.result, "a");

    // A tool denied without a specifier is not offered at all.
    let tools = ToolRunnerClient::connect(r.addr.clone())
        .await
        .unwrap()
        .list_tools(ListToolsRequest {
            permission_mode: FULL as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tools;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert!(
        names.contains(&"shell") && names.contains(&"file_manager__read"),
        "{names:?}"
    );
    assert!(!names.contains(&"file_manager__glob"), "{names:?}");
}

#[tokio::test]
async fn list_tools_hides_what_the_agent_or_the_request_denies_outright() {
    let r = start_runner().await;
    let mut client = ToolRunnerClient::connect(r.addr.clone()).await.unwrap();
    let list =
        |agent: Option<PermissionRules>, request: Option<PermissionRules>| ListToolsRequest {
            permission_mode: FULL as i32,
            agent_rules: agent,
            request_rules: request,
            ..Default::default()
        };
    let names =
        |tools: Vec<ToolSpec>| -> Vec<String> { tools.into_iter().map(|t| t.name).collect() };
    let all = names(
        client
            .list_tools(list(None, None))
            .await
            .unwrap()
            .into_inner()
            .tools,
    );
    assert!(
        all.iter().any(|n| n == "shell") && all.iter().any(|n| n == "file_manager__write"),
        "{all:?}"
    );
    // The agent's frontmatter denies shell outright and file writes under docs/ only.
    let agent = wire(&[], &[], &["shell", "file_manager__write(docs/**)"]);
    let seen = names(
        client
            .list_tools(list(agent.clone(), None))
            .await
            .unwrap()
            .into_inner()
            .tools,
    );
    assert!(!seen.iter().any(|n| n == "shell"), "{seen:?}");
    assert!(
        seen.iter().any(|n| n == "file_manager__write"),
        "a rule with a specifier hides nothing: {seen:?}"
    );
    // The request adds its own deny; its allow rules hide nothing either.
    let request = wire(&["file_manager__read"], &[], &["web_fetch"]);
    let seen = names(
        client
            .list_tools(list(agent, request))
            .await
            .unwrap()
            .into_inner()
            .tools,
    );
    assert!(
        !seen.iter().any(|n| n == "shell" || n == "web_fetch"),
        "{seen:?}"
    );
    assert!(seen.iter().any(|n| n == "file_manager__write"), "{seen:?}");
    // A rule that does not parse is the caller's mistake, named.
    let e = client
        .list_tools(list(wire(&[], &[], &["shell("]), None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("the agent's permission rule `shell(`"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn the_request_only_narrows_and_the_agent_adds() {
    let r = start_runner().await;
    let with = |mut s: ExecuteStart, agent, request| {
        s.agent_rules = agent;
        s.request_rules = request;
        s
    };
    let req = wire(
        &["shell(echo one)", "shell(ls:*)"],
        &["shell(echo ask-me)"],
        &["shell(echo two:*)"],
    );
    let table: Vec<(ExecuteStart, &str, (&str, &str, &str))> = vec![
        // Allowed by the deployment and by the request's allow list.
        (
            with(shell("echo one", AUTO), None, req.clone()),
            "run",
            ("allow", "shell(echo:*)", "deployment"),
        ),
        // The deployment allows it, the request's allow list does not: the mode asks.
        (
            with(shell("echo three", AUTO), None, req.clone()),
            "ask",
            ("", "", ""),
        ),
        // The request alone allows nothing.
        (
            with(shell("ls", AUTO), None, req.clone()),
            "ask",
            ("", "", ""),
        ),
        // Its deny and ask rules are added, and beat the deployment's allow.
        (
            with(shell("echo two x", FULL), None, req.clone()),
            "refuse",
            ("deny", "shell(echo two:*)", "request"),
        ),
        (
            with(shell("echo ask-me", AUTO), None, req.clone()),
            "ask",
            ("ask", "shell(echo ask-me)", "request"),
        ),
        // An allow list that allows nothing the deployment does not: nothing is allowed.
        (
            with(
                shell("echo hi", AUTO),
                None,
                wire(&["shell(curl:*)"], &[], &[]),
            ),
            "ask",
            ("", "", ""),
        ),
        // The agent's frontmatter adds to the deployment...
        (
            with(
                shell("ls -la", AUTO),
                wire(&["shell(ls:*)"], &[], &[]),
                None,
            ),
            "run",
            ("allow", "shell(ls:*)", "agent"),
        ),
        // ...and the request narrows both.
        (
            with(
                shell("ls -la", AUTO),
                wire(&["shell(ls:*)"], &[], &[]),
                wire(&["shell(ls)"], &[], &[]),
            ),
            "ask",
            ("", "", ""),
        ),
        (
            with(
                shell("ls", AUTO),
                wire(&["shell(ls:*)"], &[], &[]),
                wire(&["shell(ls)"], &[], &[]),
            ),
            "run",
            ("allow", "shell(ls:*)", "agent"),
        ),
        // An agent cannot lift the deployment's deny.
        (
            with(shell("rm x", FULL), wire(&["shell(rm:*)"], &[], &[]), None),
            "refuse",
            ("deny", "shell(rm:*)", "deployment"),
        ),
    ];
    for (call, gate, (behavior, rule, source)) in table {
        let what = format!(
            "{} agent={:?} request={:?}",
            call.arguments, call.agent_rules, call.request_rules
        );
        let seen = r.deny_asked(call).await;
        assert_eq!(seen.gate(), gate, "{what}: {}", seen.result.result);
        assert_eq!(
            seen.rule(),
            (behavior.into(), rule.into(), source.into()),
            "{what}"
        );
    }
    // A rule that does not parse is a clear error the model reads, not a crash.
    let seen = r
        .deny_asked(with(
            shell("echo hi", AUTO),
            None,
            wire(&[], &[], &["shell("]),
        ))
        .await;
    assert_eq!(seen.gate(), "refuse");
    assert!(
        seen.result
            .result
            .contains("the request's permission rule `shell(`"),
        "{}",
        seen.result.result
    );
}

#[tokio::test]
async fn an_approval_answered_as_a_rule_is_checked_and_applies_to_later_calls() {
    let r = start_runner().await;
    // Answered with a rule that matches the call: kept.
    let seen = r
        .run(
            shell("printf a", AUTO),
            (Decision::AllowSession, "shell(printf *)"),
        )
        .await;
    assert!(seen.asked && seen.done(), "{}", seen.result.result);
    assert_eq!(seen.result.approval, Decision::AllowSession as i32);
    assert_eq!(seen.result.granted_rule, "shell(printf *)");
    assert_eq!(seen.record["approval"]["granted_rule"], "shell(printf *)");

    // Rules that would be wider than the question, or do not answer it:
    // the call runs once, nothing is kept for the session.
    for (rule, why) in [
        ("shell(ls:*)", "does not match the approved call"),
        ("sh*", "must name the approved tool `shell` exactly"),
        ("file_manager__write", "must name the approved tool"),
        ("shell(", "must end with `)`"),
    ] {
        let seen = r
            .run(shell("printf b", AUTO), (Decision::AllowSession, rule))
            .await;
        assert!(seen.asked && seen.done(), "{rule}: {}", seen.result.result);
        assert_eq!(seen.result.approval, Decision::AllowOnce as i32, "{rule}");
        assert_eq!(seen.result.granted_rule, "", "{rule}");
        let refused = seen.record["approval"]["rule_refused"]
            .as_str()
            .unwrap_or("");
        assert!(refused.contains(why), "{rule}: {refused}");
    }

    // Later calls of the session carry the grant: a matching call runs
    // without a question, others still ask, deny and ask rules still win,
    // and the request's narrowing does not take back what the user granted.
    let granted = |mut s: ExecuteStart| {
        s.session_rules = vec![
            "shell(printf *)".into(),
            "shell(echo ask *)".into(),
            "shell(rm *)".into(),
        ];
        s
    };
    let table: Vec<(ExecuteStart, &str, (&str, &str, &str))> = vec![
        (
            granted(shell("printf c", AUTO)),
            "run",
            ("allow", "shell(printf *)", "session"),
        ),
        (granted(shell("printf c; ls", AUTO)), "ask", ("", "", "")),
        (granted(shell("ls", AUTO)), "ask", ("", "", "")),
        (
            granted(shell("printf c", RO)),
            "refuse",
            ("allow", "shell(printf *)", "session"),
        ),
        (
            granted(shell("echo ask x", AUTO)),
            "ask",
            ("ask", "shell(echo ask:*)", "deployment"),
        ),
        (
            granted(shell("rm x", FULL)),
            "refuse",
            ("deny", "shell(rm:*)", "deployment"),
        ),
        (
            {
                let mut s = granted(shell("printf c", AUTO));
                s.request_rules = wire(&["shell(echo one)"], &[], &[]);
                s
            },
            "run",
            ("allow", "shell(printf *)", "session"),
        ),
    ];
    for (call, gate, (behavior, rule, source)) in table {
        let what = call.arguments.clone();
        let seen = r.deny_asked(call).await;
        assert_eq!(seen.gate(), gate, "{what}: {}", seen.result.result);
        assert_eq!(
            seen.rule(),
            (behavior.into(), rule.into(), source.into()),
            "{what}"
        );
    }
    // A whole-tool grant (allow for the session without a rule) is an allow
    // rule of the session too, and names itself.
    let mut s = shell("ls", AUTO);
    s.session_allowed_tools = vec!["shell".into()];
    let seen = r.deny_asked(s).await;
    assert_eq!(seen.gate(), "run");
    assert_eq!(
        seen.rule(),
        ("allow".into(), "shell".into(), "session".into())
    );
    assert_eq!(seen.record["approval"]["source"], "session");
}
