//! The pipeline called directly (no gRPC): one test per stage and per rule.

mod support;

use omicos_proto::{Decision, ExecuteApproval, ExecuteServerMessage, execute_server_message::Msg};
use omicos_tool_runner::config::{HookHandler, HookMatcher, HooksConfig};
use omicos_tool_runner::pipeline::CallerRules;
use omicos_tool_runner::pipeline::normalize::Stage;
use omicos_tool_runner::pipeline::permission::Legacy;
use omicos_tool_runner::record::{ApprovalDecision, ApprovalSource, HookResult};
use omicos_tool_runner::{
    CallIo, CallOutcome, CallRequest, Config, Pipeline, Registry, ToolCallInfo,
};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::TestKit;
use tokio::sync::mpsc;

struct Fixture {
    dir: tempfile::TempDir,
    pipeline: Pipeline,
    /// The test provider, whose call counts prove what did not run.
    kit: Arc<TestKit>,
}

fn config(dir: &Path) -> Config {
    Config {
        workspace: dir.join("ws"),
        approval_timeout: Duration::from_secs(1),
        ..Config::default()
    }
}

fn fixture_with(f: impl FnOnce(&mut Config, &Path)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    f(&mut cfg, dir.path());
    let mut providers = omicos_tool_runner::builtin_providers(&cfg);
    let kit = Arc::new(TestKit::new());
    providers.push(kit.clone());
    let pipeline = Pipeline::new(
        &cfg,
        Arc::new(Registry::new(Duration::from_secs(30))),
        providers,
    )
    .unwrap();
    Fixture { dir, pipeline, kit }
}

fn fixture() -> Fixture {
    fixture_with(|_, _| {})
}

fn req(tool: &str, args: &str, mode: &str) -> CallRequest {
    CallRequest {
        call_id: format!("call_{tool}"),
        tool_name: tool.into(),
        arguments: args.into(),
        session_id: "s1".into(),
        agent_id: "tester".into(),
        permission_mode: wire_mode(mode),
        ..Default::default()
    }
}

async fn run(p: &Pipeline, r: CallRequest) -> CallOutcome {
    p.execute(r, CallIo::detached()).await
}

fn ok(o: &CallOutcome) -> &str {
    assert_eq!(
        o.result.status().as_str(),
        "done",
        "expected done, got error: {}",
        o.result.result
    );
    &o.result.result
}

fn err(o: &CallOutcome) -> &str {
    assert_eq!(
        o.result.status().as_str(),
        "error",
        "expected an error, got: {}",
        o.result.result
    );
    &o.result.result
}

/// Runs a call whose approval is answered by `answer` (None: never answered).
async fn with_approval(
    p: &Pipeline,
    r: CallRequest,
    answer: Option<(String, Decision)>,
) -> (CallOutcome, Vec<ExecuteServerMessage>) {
    let (ev_tx, mut ev_rx) = mpsc::channel(64);
    let (ap_tx, ap_rx) = mpsc::channel(8);
    let io = CallIo {
        events: Some(ev_tx),
        approvals: Some(ap_rx),
        cancel: Default::default(),
    };
    let p2 = p.clone();
    let task = tokio::spawn(async move { p2.execute(r, io).await });
    let mut seen = Vec::new();
    while let Some(m) = ev_rx.recv().await {
        let is_approval = matches!(m.msg, Some(Msg::ApprovalRequired(_)));
        seen.push(m);
        if is_approval && let Some((call_id, d)) = &answer {
            ap_tx
                .send(ExecuteApproval {
                    call_id: call_id.clone(),
                    decision: *d as i32,
                    rule: String::new(),
                })
                .await
                .unwrap();
        }
    }
    (task.await.unwrap(), seen)
}

fn approvals_asked(msgs: &[ExecuteServerMessage]) -> usize {
    msgs.iter()
        .filter(|m| matches!(m.msg, Some(Msg::ApprovalRequired(_))))
        .count()
}

// ---------- 1. resolve ----------

#[tokio::test]
async fn resolve_aliases_deprecated_unknown_and_call_agent() {
    let f = fixture();
    let o = run(&f.pipeline, req("python", "{}", "full")).await;
    assert_eq!(ok(&o), "py ran");
    assert_eq!(o.result.tool_name, "py");
    assert_eq!(o.record.requested_name, "python");
    assert_eq!(
        ok(&run(&f.pipeline, req("old_py", "{}", "full")).await),
        "py ran"
    );

    let o = run(&f.pipeline, req("file_manager__raed", "{}", "full")).await;
    let m = err(&o);
    assert!(
        m.contains("unknown tool `file_manager__raed`") && m.contains("file_manager__read"),
        "{m}"
    );
    assert_eq!(o.record.error_stage.map(Stage::as_str), Some("resolve"));

    let m = run(&f.pipeline, req("call_agent", r#"{"agent":"x"}"#, "full"))
        .await
        .result
        .result;
    assert!(
        m.contains("should have been intercepted by the orchestrator"),
        "{m}"
    );

    // Toolsets restrict what resolves.
    let mut r = req("shell", r#"{"command":"true"}"#, "full");
    r.toolsets = vec!["file_manager".into()];
    let m = run(&f.pipeline, r).await.result.result;
    assert!(m.contains("not available to this agent"), "{m}");
}

#[tokio::test]
async fn list_tools_filters_by_toolset_and_mode() {
    let f = fixture();
    let (tools, unknown) = f
        .pipeline
        .list_tools(
            &["file_manager".into(), "nope".into()],
            wire_mode("read_only"),
            Legacy::default(),
            &CallerRules::default(),
        )
        .unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "file_manager__list",
            "file_manager__read",
            "file_manager__glob",
            "file_manager__grep"
        ]
    );
    assert_eq!(unknown, ["nope"]);
    let (tools, _) = f
        .pipeline
        .list_tools(
            &[],
            wire_mode("auto"),
            Legacy::default(),
            &CallerRules::default(),
        )
        .unwrap();
    assert!(tools.iter().any(|t| t.name == "shell") && tools.iter().any(|t| t.name == "py"));
    // Deprecated names never appear as tools.
    assert!(!tools.iter().any(|t| t.name == "old_py"));
    let (tools, _) = f
        .pipeline
        .list_tools(
            &[],
            wire_mode("full"),
            Legacy {
                allow_shell: Some(false),
                allow_file_write: None,
            },
            &CallerRules::default(),
        )
        .unwrap();
    assert!(!tools.iter().any(|t| t.name == "shell"));
    let e = f
        .pipeline
        .list_tools(
            &[],
            wire_mode("sideways"),
            Legacy::default(),
            &CallerRules::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("unknown permission mode"), "{e}");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

// ---------- 2. parse (+ repair) and 3. validate ----------

#[tokio::test]
async fn parse_repairs_and_says_so() {
    let f = fixture();
    let o = run(
        &f.pipeline,
        req(
            "echo",
            r#"{"packages":"[\"numpy\"]","n":"3","flag":"false"}"#,
            "full",
        ),
    )
    .await;
    let text = ok(&o).to_owned();
    let v: Value = serde_json::from_str(text.split("\n\n[note").next().unwrap()).unwrap();
    assert_eq!(v["args"], json!({"packages":["numpy"],"n":3,"flag":false}));
    assert!(
        text.contains("[note: the arguments were repaired:") && text.contains("/packages"),
        "{text}"
    );
    assert_eq!(
        o.record.arguments,
        r#"{"packages":"[\"numpy\"]","n":"3","flag":"false"}"#
    );
    assert_eq!(
        o.record.arguments_run,
        Some(json!({"packages":["numpy"],"n":3,"flag":false}))
    );
    assert_eq!(o.record.repairs.len(), 3);
}

#[tokio::test]
async fn parse_and_validate_errors_quote_the_path() {
    let f = fixture();
    let m = run(
        &f.pipeline,
        req("echo", r#"{"packages": [1, "b"]}"#, "full"),
    )
    .await
    .result
    .result;
    assert!(
        m.contains("/packages/0: expected string, got integer"),
        "{m}"
    );
    let m = run(
        &f.pipeline,
        req("echo", r#"{"packages": ["a"], "extra": 1}"#, "full"),
    )
    .await
    .result
    .result;
    assert!(
        m.contains("invalid arguments for `echo`") && m.contains("extra"),
        "{m}"
    );
    let o = run(&f.pipeline, req("echo", r#"{"n": 1,"#, "full")).await;
    assert!(err(&o).contains("not valid JSON"));
    assert_eq!(o.record.error_stage.map(Stage::as_str), Some("parse"));
    let m = run(&f.pipeline, req("echo", r#"{"n":"three"}"#, "full"))
        .await
        .result
        .result;
    assert!(m.contains("/n: expected integer, got string"), "{m}");
}

#[tokio::test]
async fn validate_input_refuses_paths_out_of_the_workspace() {
    let f = fixture();
    let ws = f.pipeline.workspace().to_path_buf();
    let outside = f.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("escape")).unwrap();
    for path in ["../../etc/passwd", "escape/secret.txt", "/etc/passwd"] {
        let o = run(
            &f.pipeline,
            req(
                "file_manager__read",
                &json!({"path": path}).to_string(),
                "read_only",
            ),
        )
        .await;
        assert!(
            err(&o).contains("outside the workspace"),
            "{path}: {}",
            o.result.result
        );
        assert_eq!(o.record.error_stage.map(Stage::as_str), Some("validate"));
    }
    let o = run(
        &f.pipeline,
        req(
            "file_manager__write",
            &json!({"path": "escape/x", "content": "x"}).to_string(),
            "full",
        ),
    )
    .await;
    assert!(err(&o).contains("outside the workspace"));
    assert!(!outside.join("x").exists());
}

// ---------- 4. permission ----------

#[tokio::test]
async fn every_mode_times_every_risk_through_the_pipeline() {
    let f = fixture();
    for (tool, risk_is_read) in [
        ("noop", true),
        ("writer", false),
        ("py", false),
        ("sh", false),
    ] {
        // read_only: only Read runs.
        let o = run(&f.pipeline, req(tool, "{}", "read-only")).await;
        if risk_is_read {
            ok(&o);
        } else {
            assert!(
                err(&o).contains("read_only allows only read tools"),
                "{tool}"
            );
            assert_eq!(f.kit.calls_of(tool), 0, "{tool} ran under read_only");
        }
        // auto: Read runs; the others ask (answered with allow once here).
        let (o, msgs) = with_approval(
            &f.pipeline,
            req(tool, "{}", "auto"),
            Some((format!("call_{tool}"), Decision::AllowOnce)),
        )
        .await;
        ok(&o);
        assert_eq!(
            approvals_asked(&msgs),
            if risk_is_read { 0 } else { 1 },
            "{tool}"
        );
        // full: everything runs, nobody is asked.
        let (o, msgs) = with_approval(&f.pipeline, req(tool, "{}", "full_access"), None).await;
        ok(&o);
        assert_eq!(approvals_asked(&msgs), 0);
    }
    let m = run(&f.pipeline, req("noop", "{}", "yolo"))
        .await
        .result
        .result;
    assert!(m.contains("unknown permission mode `99`"), "{m}");
    // noop ran in read_only, auto and full, not under the unknown mode.
    assert_eq!(f.kit.calls_of("noop"), 3);
}

#[tokio::test]
async fn missing_mode_defaults_to_read_only() {
    let f = fixture();
    ok(&run(&f.pipeline, req("noop", "{}", "")).await);
    let o = run(&f.pipeline, req("sh", "{}", "")).await;
    assert!(err(&o).contains("read_only"));
    assert_eq!(o.record.permission_mode, "read_only");
}

#[tokio::test]
async fn approval_allow_once_session_deny_timeout_and_foreign_answers() {
    let f = fixture();
    // Allow once.
    let (o, msgs) = with_approval(
        &f.pipeline,
        req("writer", "{}", "auto"),
        Some(("call_writer".into(), Decision::AllowOnce)),
    )
    .await;
    assert_eq!(ok(&o), "writer ran");
    assert_eq!(o.result.approval, Decision::AllowOnce as i32);
    let Some(Msg::ApprovalRequired(a)) = &msgs[0].msg else {
        panic!("no approval request")
    };
    assert_eq!(
        (a.tool_name.as_str(), a.reason.as_str()),
        ("writer", "permission_mode=auto")
    );
    assert_eq!(a.risk, omicos_proto::Risk::FileWrite as i32);

    // Allow for the session: reported, and the next call (with the session's list) is not asked.
    let (o, _) = with_approval(
        &f.pipeline,
        req("sh", "{}", "auto"),
        Some(("call_sh".into(), Decision::AllowSession)),
    )
    .await;
    ok(&o);
    assert_eq!(o.result.approval, Decision::AllowSession as i32);
    let mut again = req("sh", "{}", "auto");
    again.session_allowed_tools = vec!["sh".into()];
    let (o, msgs) = with_approval(&f.pipeline, again, None).await;
    ok(&o);
    assert_eq!(approvals_asked(&msgs), 0);
    assert_eq!(
        o.record.approval.as_ref().unwrap().source,
        ApprovalSource::Session
    );

    // Deny.
    let (o, _) = with_approval(
        &f.pipeline,
        req("py", "{}", "auto"),
        Some(("call_py".into(), Decision::Deny)),
    )
    .await;
    assert_eq!(err(&o), "denied by user");
    assert_eq!(o.result.approval, Decision::Deny as i32);
    assert_eq!(f.kit.calls_of("py"), 0, "a denied call ran");

    // No answer within the timeout (1 s here) counts as denied.
    let started = Instant::now();
    let (o, _) = with_approval(&f.pipeline, req("py", "{}", "auto"), None).await;
    assert!(
        err(&o).contains("no approval within 1s"),
        "{}",
        o.result.result
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1) && started.elapsed() < Duration::from_secs(3)
    );
    assert_eq!(
        o.record.approval.as_ref().unwrap().source,
        ApprovalSource::Timeout
    );

    // An answer for another call (another session's) is refused: the call still times out.
    let (o, _) = with_approval(
        &f.pipeline,
        req("py", "{}", "auto"),
        Some(("call_of_another_session".into(), Decision::AllowOnce)),
    )
    .await;
    assert!(
        err(&o).contains("no approval within"),
        "{}",
        o.result.result
    );
    // Denied, timed out, answered for another call: py never ran.
    assert_eq!(f.kit.calls_of("py"), 0, "a refused call ran");

    // always_ask asks even in full mode, and even when the session allowed it.
    let mut plan = req("plan", "{}", "full");
    plan.session_allowed_tools = vec!["plan".into()];
    let (o, msgs) = with_approval(
        &f.pipeline,
        plan,
        Some(("call_plan".into(), Decision::AllowOnce)),
    )
    .await;
    ok(&o);
    assert_eq!(approvals_asked(&msgs), 1);

    // Nobody to ask: denied with a clear message.
    let m = run(&f.pipeline, req("writer", "{}", "auto"))
        .await
        .result
        .result;
    assert!(m.contains("no client is connected"), "{m}");
    // writer ran once (allowed once above), not when nobody could be asked.
    assert_eq!(f.kit.calls_of("writer"), 1);
}

#[tokio::test]
async fn legacy_fields_win_over_the_mode() {
    let f = fixture();
    let mut r = req("shell", r#"{"command":"echo hi"}"#, "full");
    r.legacy = Legacy {
        allow_shell: Some(false),
        allow_file_write: None,
    };
    assert!(
        run(&f.pipeline, r)
            .await
            .result
            .result
            .contains("allow_shell=false")
    );
    let mut r = req(
        "file_manager__write",
        r#"{"path":"a.txt","content":"A"}"#,
        "read_only",
    );
    r.legacy = Legacy {
        allow_shell: None,
        allow_file_write: Some(true),
    };
    ok(&run(&f.pipeline, r).await);
    assert_eq!(
        std::fs::read_to_string(f.pipeline.workspace().join("a.txt")).unwrap(),
        "A"
    );
}

// ---------- 5. hooks ----------

fn script(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

fn hook(matcher: &str, command: String, timeout: Option<u64>) -> Vec<HookMatcher> {
    vec![HookMatcher {
        matcher: matcher.into(),
        hooks: vec![HookHandler {
            timeout: timeout.map(Duration::from_secs),
            ..HookHandler::command(command)
        }],
    }]
}

fn pre_hook(body: &'static str, matcher: &'static str) -> Fixture {
    fixture_with(move |cfg, dir| {
        cfg.hooks = HooksConfig {
            pre_tool_use: hook(matcher, script(dir, "pre.sh", body), Some(5)),
            ..Default::default()
        };
    })
}

#[tokio::test]
async fn pre_tool_use_gets_the_contract_json_and_can_allow() {
    let f = pre_hook(
        r#"cat > "$CLAUDE_PROJECT_DIR/../stdin.json"
echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow","permissionDecisionReason":"trusted"}}'"#,
        "wri.*",
    );
    // auto would ask; the hook allows, so nobody is asked.
    let (o, msgs) = with_approval(&f.pipeline, req("writer", r#"{"a":1}"#, "auto"), None).await;
    ok(&o);
    assert_eq!(approvals_asked(&msgs), 0);
    assert_eq!(o.record.hooks[0].outcome, HookResult::Allow);
    let input: Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.path().join("stdin.json")).unwrap())
            .unwrap();
    assert_eq!(input["hook_event_name"], "PreToolUse");
    assert_eq!(input["tool_name"], "writer");
    assert_eq!(input["tool_input"], json!({"a":1}));
    assert_eq!(input["tool_use_id"], "call_writer");
    assert_eq!(input["session_id"], "s1");
    assert_eq!(input["permission_mode"], "auto");
    assert_eq!(input["cwd"], f.pipeline.workspace().display().to_string());
    assert!(input.get("transcript_path").is_some());
    // The matcher is anchored: `noop` does not run the hook.
    let o = run(&f.pipeline, req("noop", "{}", "auto")).await;
    assert!(o.record.hooks.is_empty());
}

#[tokio::test]
async fn pre_tool_use_deny_and_exit_2_block() {
    let f = pre_hook(
        r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"not on fridays"}}'"#,
        "noop",
    );
    let o = run(&f.pipeline, req("noop", "{}", "full")).await;
    assert_eq!(err(&o), "blocked by PreToolUse hook: not on fridays");
    assert_eq!(o.record.error_stage.map(Stage::as_str), Some("hook"));
    assert_eq!(f.kit.calls_of("noop"), 0, "a blocked call ran");

    let f = pre_hook("echo 'rm -rf is not allowed' >&2; exit 2", "*");
    let o = run(&f.pipeline, req("noop", "{}", "full")).await;
    assert_eq!(err(&o), "blocked by PreToolUse hook: rm -rf is not allowed");
    assert_eq!(o.record.hooks[0].exit_code, Some(2));
    assert_eq!(f.kit.calls_of("noop"), 0, "a blocked call ran");
}

#[tokio::test]
async fn pre_tool_use_ask_forces_an_approval_even_in_full() {
    let f = pre_hook(
        r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"ask","permissionDecisionReason":"double-check"}}'"#,
        "",
    );
    let (o, msgs) = with_approval(
        &f.pipeline,
        req("noop", "{}", "full"),
        Some(("call_noop".into(), Decision::AllowOnce)),
    )
    .await;
    ok(&o);
    let Some(Msg::ApprovalRequired(a)) = &msgs[0].msg else {
        panic!("not asked")
    };
    assert_eq!(a.reason, "hook: double-check");
}

#[tokio::test]
async fn pre_tool_use_updated_input_is_validated_and_used() {
    let f = pre_hook(
        r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","updatedInput":{"packages":["safe"]},"additionalContext":"input was sanitized"}}'"#,
        "echo",
    );
    let o = run(&f.pipeline, req("echo", r#"{"packages":["evil"]}"#, "full")).await;
    let text = ok(&o);
    assert!(
        text.contains(r#""packages":["safe"]"#) && text.contains(r#""user_modified":true"#),
        "{text}"
    );
    assert!(text.contains("[hook context] input was sanitized"));
    assert_eq!(o.record.arguments_run, Some(json!({"packages":["safe"]})));
    assert!(o.record.user_modified);

    let f = pre_hook(
        r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","updatedInput":{"packages":[1]}}}'"#,
        "echo",
    );
    let m = run(&f.pipeline, req("echo", r#"{"packages":["x"]}"#, "full"))
        .await
        .result
        .result;
    assert!(
        m.contains("rewrote the input into something invalid") && m.contains("/packages/0"),
        "{m}"
    );
}

#[tokio::test]
async fn pre_tool_use_timeout_fails_closed_unless_configured() {
    let body = "sleep 10";
    let f = fixture_with(|cfg, dir| {
        cfg.hooks = HooksConfig {
            pre_tool_use: hook("", script(dir, "slow.sh", body), Some(1)),
            ..Default::default()
        };
    });
    let started = Instant::now();
    let o = run(&f.pipeline, req("noop", "{}", "full")).await;
    assert!(
        err(&o).contains("timed out after 1s"),
        "{}",
        o.result.result
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(o.record.hooks[0].outcome, HookResult::Timeout);

    let f = fixture_with(|cfg, dir| {
        cfg.pre_tool_use_timeout_blocks = false;
        cfg.hooks = HooksConfig {
            pre_tool_use: hook("", script(dir, "slow.sh", body), Some(1)),
            ..Default::default()
        };
    });
    ok(&run(&f.pipeline, req("noop", "{}", "full")).await);
}

#[tokio::test]
async fn bad_json_and_other_exit_codes_are_non_blocking() {
    let f = pre_hook("echo '{\"hookSpecificOutput\": {'", "");
    let o = run(&f.pipeline, req("noop", "{}", "full")).await;
    assert_eq!(ok(&o), "ok");
    assert_eq!(o.record.hooks[0].outcome, HookResult::Error);
    assert!(o.record.hooks[0].message.contains("not a JSON object"));

    let f = pre_hook("echo oops >&2; exit 1", "");
    let o = run(&f.pipeline, req("noop", "{}", "full")).await;
    assert_eq!(ok(&o), "ok");
    assert!(
        o.record.hooks[0].message.contains("code 1") && o.record.hooks[0].message.contains("oops")
    );
}

#[tokio::test]
async fn post_tool_use_replaces_blocks_and_adds_context() {
    let f = fixture_with(|cfg, dir| {
        cfg.hooks = HooksConfig {
            post_tool_use: hook(
                "noop",
                script(
                    dir,
                    "post.sh",
                    r#"echo '{"hookSpecificOutput":{"hookEventName":"PostToolUse","updatedMCPToolOutput":"redacted","additionalContext":"checked"}}'"#,
                ),
                None,
            ),
            ..Default::default()
        };
        let block = script(
            dir,
            "block.sh",
            r#"cat > "$CLAUDE_PROJECT_DIR/../post_stdin.json"; echo '{"decision":"block","reason":"output leaks a key"}'"#,
        );
        cfg.hooks.post_tool_use.extend(hook("echo", block, None));
        cfg.hooks.post_tool_use_failure = hook(
            "boom",
            script(
                dir,
                "fail.sh",
                r#"echo '{"hookSpecificOutput":{"hookEventName":"PostToolUseFailure","additionalContext":"known flaky tool"}}'"#,
            ),
            None,
        );
    });
    assert_eq!(
        ok(&run(&f.pipeline, req("noop", "{}", "full")).await),
        "redacted\n\n[hook context] checked"
    );
    let o = run(&f.pipeline, req("echo", "{}", "full")).await;
    assert_eq!(err(&o), "blocked by PostToolUse hook: output leaks a key");
    let input: Value = serde_json::from_str(
        &std::fs::read_to_string(f.dir.path().join("post_stdin.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(input["hook_event_name"], "PostToolUse");
    assert_eq!(input["tool_response"]["instance"], "testkit");
    let m = run(&f.pipeline, req("boom", "{}", "full"))
        .await
        .result
        .result;
    assert!(
        m.contains("panic") && m.contains("[hook context] known flaky tool"),
        "{m}"
    );
}

#[tokio::test]
async fn permission_request_hook_answers_for_the_user() {
    let f = fixture_with(|cfg, dir| {
        cfg.hooks = HooksConfig {
            permission_request: hook(
                "writer",
                script(
                    dir,
                    "allow.sh",
                    r#"echo '{"hookSpecificOutput":{"hookEventName":"PermissionRequest","decision":{"behavior":"allow"}}}'"#,
                ),
                None,
            ),
            ..Default::default()
        };
        cfg.hooks.permission_request.extend(hook("py", script(dir, "deny.sh", r#"echo '{"hookSpecificOutput":{"hookEventName":"PermissionRequest","decision":{"behavior":"deny","message":"no python here"}}}'"#), None));
    });
    let (o, msgs) = with_approval(&f.pipeline, req("writer", "{}", "auto"), None).await;
    ok(&o);
    assert_eq!(approvals_asked(&msgs), 0);
    assert_eq!(
        o.record.approval.as_ref().unwrap().source,
        ApprovalSource::Hook
    );
    let (o, msgs) = with_approval(&f.pipeline, req("py", "{}", "auto"), None).await;
    assert_eq!(err(&o), "denied by PermissionRequest hook: no python here");
    assert_eq!(approvals_asked(&msgs), 0);
    assert_eq!(f.kit.calls_of("py"), 0, "a denied call ran");
    assert_eq!(f.kit.calls_of("writer"), 1);
}

// ---------- 6. dispatch ----------

#[tokio::test]
async fn a_panicking_provider_gives_an_error_and_the_pipeline_goes_on() {
    let f = fixture();
    let m = run(&f.pipeline, req("boom", "{}", "full"))
        .await
        .result
        .result;
    assert!(m.contains("crashed (panic)"), "{m}");
    ok(&run(&f.pipeline, req("noop", "{}", "full")).await);
}

#[tokio::test]
async fn cancel_mid_call_kills_the_shell() {
    let f = fixture();
    // A heartbeat in the workspace: `$$` in the box is the box's own pid.
    let beat = f.pipeline.workspace().join("beat");
    let r = req(
        "shell",
        &json!({"command": "while :; do date +%s%N > beat; sleep 0.05; done"}).to_string(),
        "full",
    );
    let (ev_tx, mut ev_rx) = mpsc::channel(64);
    let io = CallIo {
        events: Some(ev_tx),
        approvals: None,
        cancel: Default::default(),
    };
    let cancel = io.cancel.clone();
    let p = f.pipeline.clone();
    let started = Instant::now();
    let task = tokio::spawn(async move { p.execute(r, io).await });
    while !beat.exists() || std::fs::read_to_string(&beat).unwrap().trim().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    let o = task.await.unwrap();
    assert_eq!(err(&o), "cancelled");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The shell's processes are gone: the heartbeat stops changing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = std::fs::read_to_string(&beat).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::read_to_string(&beat).unwrap(),
        before,
        "the shell is still alive"
    );
    while ev_rx.try_recv().is_ok() {}
}

#[tokio::test]
async fn output_streams_while_the_tool_runs() {
    let f = fixture();
    let (ev_tx, mut ev_rx) = mpsc::channel(64);
    let io = CallIo {
        events: Some(ev_tx),
        approvals: None,
        cancel: Default::default(),
    };
    let r = req(
        "shell",
        &json!({"command": "echo one; sleep 0.3; echo two"}).to_string(),
        "full",
    );
    let o = f.pipeline.execute(r, io).await;
    ok(&o);
    let mut chunks = String::new();
    while let Ok(m) = ev_rx.try_recv() {
        if let Some(Msg::Output(c)) = m.msg {
            chunks.push_str(&c.text);
        }
    }
    assert_eq!(chunks, "one\ntwo\n");
}

// ---------- 7. shape ----------

#[tokio::test]
async fn a_200_kb_result_is_spooled_byte_exact() {
    let f = fixture();
    let o = run(&f.pipeline, req("big", "{}", "full")).await;
    let preview = ok(&o).to_owned();
    let big = support::big_text();
    let rel = o.result.spool_path.clone();
    assert!(
        rel.starts_with(".omicos/tool_outputs/") && rel.ends_with("__call_big.txt"),
        "{rel}"
    );
    assert_eq!(
        std::fs::read(f.pipeline.workspace().join(&rel)).unwrap(),
        big.as_bytes()
    );
    let head: String = big.chars().take(2000).collect();
    let tail: String = big.chars().skip(big.chars().count() - 500).collect();
    assert!(preview.starts_with(&head));
    assert!(preview.contains(&tail));
    assert!(
        preview.contains(&format!("spooled to {rel}")) && preview.contains("file_manager__read")
    );
    assert_eq!(o.record.spool_path.as_deref(), Some(rel.as_str()));
    assert_eq!(o.record.result_bytes, big.len());
    // The model can page through it with file_manager__read.
    let page = run(
        &f.pipeline,
        req(
            "file_manager__read",
            &json!({"path": rel, "offset": 2, "limit": 1}).to_string(),
            "read_only",
        ),
    )
    .await;
    assert!(
        ok(&page).starts_with("row 000001 µ✓ data\n"),
        "{}",
        page.result.result
    );
}

#[tokio::test]
async fn a_long_error_is_bounded_too() {
    let f = fixture_with(|c, _| c.shell_timeout = Duration::from_secs(1));
    let o = run(
        &f.pipeline,
        req(
            "shell",
            &json!({"command": "seq 1 20000; sleep 5"}).to_string(),
            "full",
        ),
    )
    .await;
    let m = err(&o);
    assert!(
        m.starts_with("the command timed out after 1s"),
        "{}",
        &m[..100]
    );
    assert!(
        m.len() < 4000 && m.contains("spooled to .omicos/tool_outputs/"),
        "{} bytes",
        m.len()
    );
    let full = std::fs::read_to_string(f.pipeline.workspace().join(&o.result.spool_path)).unwrap();
    assert!(full.contains("\n19999\n20000\n"));
}

// ---------- 8. normalize + record ----------

#[tokio::test]
async fn the_record_holds_the_whole_call() {
    let f = fixture();
    let (o, _) = with_approval(
        &f.pipeline,
        req("writer", r#"{"x":"1"}"#, "auto"),
        Some(("call_writer".into(), Decision::AllowSession)),
    )
    .await;
    let record_json = o.clone().into_result().record_json;
    let rec: ToolCallInfo = serde_json::from_str(&record_json).unwrap();
    assert_eq!(rec, o.record);
    assert_eq!(
        (rec.id.as_str(), rec.name.as_str(), rec.status.as_str()),
        ("call_writer", "writer", "done")
    );
    assert_eq!(rec.arguments, r#"{"x":"1"}"#);
    assert_eq!(rec.arguments_run, Some(json!({"x":"1"})));
    assert_eq!(rec.result, "writer ran");
    assert_eq!(rec.risk, "file_write");
    assert_eq!(rec.provider, "testkit");
    let a = rec.approval.unwrap();
    assert_eq!(
        (a.asked, a.decision, a.source),
        (true, ApprovalDecision::AllowSession, ApprovalSource::Client)
    );
    // The names on the wire are the ones trajectory readers know.
    let raw: Value = serde_json::from_str(&record_json).unwrap();
    assert_eq!(raw["approval"]["decision"], "allow_session");
    assert_eq!(raw["approval"]["source"], "client");
    assert_eq!(raw["error_stage"], Value::Null);
}

/// A mode's wire value from its text; an unknown spelling becomes a value no build knows.
fn wire_mode(text: &str) -> i32 {
    omicos_proto::PermissionMode::parse(text).map_or(99, |m| m as i32)
}

// ---------- large arguments stay out of the record ----------

#[tokio::test]
async fn large_arguments_are_spooled_and_the_record_keeps_their_head() {
    let f = fixture();
    let content = "é".repeat(20_000); // 40 000 bytes, over the 16 KiB threshold
    let args = json!({"path": "big.txt", "content": content}).to_string();
    let o = run(&f.pipeline, req("file_manager__write", &args, "full")).await;
    ok(&o);
    assert_eq!(
        std::fs::read_to_string(f.pipeline.workspace().join("big.txt")).unwrap(),
        content
    );
    let rec = &o.record;
    let spool = rec.arguments_spool.as_ref().expect("spooled");
    let raw_path = spool.raw_path.as_deref().unwrap();
    assert!(
        raw_path.starts_with(".omicos/tool_outputs/") && raw_path.ends_with(".arguments.txt"),
        "{raw_path}"
    );
    assert_eq!(
        std::fs::read_to_string(f.pipeline.workspace().join(raw_path)).unwrap(),
        args,
        "the spooled copy is byte-exact"
    );
    assert_eq!(spool.raw_bytes, args.len());
    assert!(spool.run_is_raw && spool.run_path.is_none());
    assert_eq!(rec.arguments_run, None);
    let head: String = args.chars().take(2000).collect();
    assert!(rec.arguments.starts_with(&head));
    assert!(rec.arguments.contains(raw_path), "{}", rec.arguments);
    let json = o.clone().into_result().record_json;
    assert!(json.len() < 8 * 1024, "record of {} bytes", json.len());
    let back: ToolCallInfo = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, rec);

    // Just under the threshold the arguments stay inline, as before.
    let small = json!({"path": "small.txt", "content": "x".repeat(1000)}).to_string();
    let o = run(&f.pipeline, req("file_manager__write", &small, "full")).await;
    ok(&o);
    assert_eq!(o.record.arguments, small);
    assert!(o.record.arguments_spool.is_none());
    assert!(o.record.arguments_run.is_some());
}

#[tokio::test]
async fn large_arguments_a_hook_rewrote_are_spooled_as_run() {
    let f = pre_hook(
        r#"big=$(head -c 30000 /dev/zero | tr '\0' s); echo "{\"hookSpecificOutput\":{\"hookEventName\":\"PreToolUse\",\"updatedInput\":{\"packages\":[\"$big\"]}}}""#,
        "echo",
    );
    let o = run(&f.pipeline, req("echo", r#"{"packages":["x"]}"#, "full")).await;
    ok(&o);
    assert!(o.record.user_modified);
    assert_eq!(
        o.record.arguments, r#"{"packages":["x"]}"#,
        "small raw arguments stay inline"
    );
    let spool = o
        .record
        .arguments_spool
        .as_ref()
        .expect("the rewritten input is spooled");
    assert!(spool.raw_path.is_none() && !spool.run_is_raw);
    let run_path = spool.run_path.as_deref().unwrap();
    let as_run: Value = serde_json::from_str(
        &std::fs::read_to_string(f.pipeline.workspace().join(run_path)).unwrap(),
    )
    .unwrap();
    assert_eq!(as_run, json!({"packages": ["s".repeat(30_000)]}));
    assert_eq!(o.record.arguments_run, None);
}
