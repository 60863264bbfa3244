//! `shell`: `bash -lc <command>` in the workspace, in the session's sandbox
//! box (workspace-write unless configured otherwise), with a timeout and an
//! output cap. When the command returns, times out or is cancelled,
//! everything it started is killed (the box's reaper for the call ends
//! double forks and `setsid` escapees too), so nothing outlives the call;
//! the box itself lives until the session ends or idles.

use async_trait::async_trait;
use omicos_proto::{Risk, ToolSpec};
use omicos_sandbox::{Command, Placement, Process, Sandbox, SandboxConfig, Stdio};
use omicos_toolkit::{CallCtx, Provider, ToolError, confine_tool_path, tool};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// How long a returned command's background children may keep writing to
/// its pipes before they are ended with it.
const PIPE_GRACE: Duration = Duration::from_millis(200);

/// The shell provider.
#[derive(Clone, Debug)]
pub struct Shell {
    /// Longest a command may run; a call may ask for less.
    pub max_timeout: Duration,
    /// Bytes of stdout+stderr kept.
    pub output_cap: usize,
    sandbox: ShellSandbox,
}

/// The sandbox commands run in, or why there is none (every call then fails with it).
#[derive(Clone, Debug)]
enum ShellSandbox {
    Ready(Arc<Sandbox>),
    Broken(String),
}

impl Shell {
    /// A shell with these limits, sandboxed with the default config (workspace-write).
    pub fn new(max_timeout: Duration, output_cap: usize) -> Self {
        Self {
            max_timeout,
            output_cap,
            sandbox: ShellSandbox::Broken(String::new()),
        }
        .with_sandbox(SandboxConfig::default())
    }

    /// The same shell under the `sandbox` config section.
    pub fn with_sandbox(mut self, config: SandboxConfig) -> Self {
        self.sandbox = match Sandbox::shared(config) {
            Ok(s) => {
                s.log_report();
                ShellSandbox::Ready(s)
            }
            Err(e) => ShellSandbox::Broken(format!("the shell sandbox is not usable: {e}")),
        };
        self
    }

    /// The sandbox, when it could be made.
    pub fn sandbox(&self) -> Option<&Arc<Sandbox>> {
        match &self.sandbox {
            ShellSandbox::Ready(s) => Some(s),
            ShellSandbox::Broken(_) => None,
        }
    }

    /// Keeps what fits under the cap; returns the bytes dropped.
    fn keep(&self, stream: &str, bytes: &[u8], out: &mut Vec<u8>, err: &mut Vec<u8>) -> usize {
        let room = self.output_cap.saturating_sub(out.len() + err.len());
        let keep = bytes.len().min(room);
        let buf = if stream == "stdout" { out } else { err };
        buf.extend_from_slice(&bytes[..keep]);
        bytes.len() - keep
    }
}

/// Reads a pipe to the end, in chunks, forwarding them.
async fn pump(
    mut r: impl AsyncRead + Unpin,
    stream: &'static str,
    tx: mpsc::Sender<(&'static str, Vec<u8>)>,
) {
    let mut buf = vec![0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send((stream, buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// What the box's bounds say about a call that failed: the memory bound's
/// OOM kill, in words the model can act on.
fn bound_note(child: &Process) -> Option<String> {
    if let Some(note) = child.hit_disk_bound() {
        return Some(note);
    }
    child.hit_memory_bound().map(|bytes| {
        format!(
            "a process of this command was killed because the session reached its memory bound ({} MiB, sandbox.session_limits.memory_bytes); use less memory or free some (end background jobs, delete big files in /tmp)",
            bytes >> 20
        )
    })
}

#[async_trait]
impl Provider for Shell {
    fn name(&self) -> &str {
        "shell"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "shell",
                "Run a bash command in the workspace (bash -lc). Returns exit_code, stdout and stderr. Long output is capped; the command is killed at the timeout.",
                json!({"type":"object","properties":{
                    "command":{"type":"string","minLength":1},
                    "timeout_secs":{"type":"integer","minimum":1,"description":"Seconds before the command is killed (capped by the deployment)."},
                    "workdir":{"type":"string","description":"Directory to run in, relative to the workspace."}
                },"required":["command"],"additionalProperties":false}),
            )
            .toolset("shell")
            .risk(Risk::Shell)
            .alias("bash")
            .build(),
        ]
    }

    async fn end_session(&self, tenant: &str, session: &str) -> u32 {
        self.sandbox()
            .map(|s| s.end_session(tenant, session) as u32)
            .unwrap_or(0)
    }

    fn validate_input(&self, _tool: &str, args: &Value, ctx: &CallCtx) -> Result<(), ToolError> {
        if let Some(w) = args.get("workdir").and_then(Value::as_str) {
            let p = confine_tool_path(&ctx.workspace, w)
                .map_err(|e| ToolError::invalid(e.to_string()))?;
            if !p.is_dir() {
                return Err(ToolError::invalid(format!(
                    "workdir `{w}` is not a directory"
                )));
            }
        }
        Ok(())
    }

    async fn call(&self, _tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let command = args
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let timeout = args
            .get("timeout_secs")
            .and_then(Value::as_u64)
            .map(Duration::from_secs)
            .unwrap_or(self.max_timeout)
            .min(self.max_timeout);
        let cwd = match args.get("workdir").and_then(Value::as_str) {
            Some(w) => confine_tool_path(&ctx.workspace, w)
                .map_err(|e| ToolError::invalid(e.to_string()))?,
            None => ctx.workspace.clone(),
        };
        let sandbox = match &self.sandbox {
            ShellSandbox::Ready(s) => s,
            ShellSandbox::Broken(why) => return Err(ToolError::failed(why.clone())),
        };
        let policy = sandbox.config().policy_for_agent(&ctx.agent_id);
        let place = Placement::new(&ctx.tenant, &ctx.session_id, &ctx.workspace, policy);
        let mut cmd = Command::new("bash");
        cmd.args(["-lc", command])
            .cwd(&cwd)
            .stdout(Stdio::Piped)
            .stderr(Stdio::Piped);
        let mut child = sandbox.spawn(&place, cmd).await.map_err(|e| {
            ToolError::failed(format!("cannot start bash in the {policy} sandbox: {e}"))
        })?;
        let (tx, mut rx) = mpsc::channel::<(&'static str, Vec<u8>)>(64);
        if let Some(o) = child.stdout.take() {
            tokio::spawn(pump(o, "stdout", tx.clone()));
        }
        if let Some(e) = child.stderr.take() {
            tokio::spawn(pump(e, "stderr", tx.clone()));
        }
        drop(tx);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut dropped = 0usize;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut status = None;
        let mut pipes_open = true;
        loop {
            tokio::select! {
                chunk = rx.recv(), if pipes_open => match chunk {
                    Some((stream, bytes)) => {
                        ctx.events.output(stream, String::from_utf8_lossy(&bytes).into_owned()).await;
                        dropped += self.keep(stream, &bytes, &mut out, &mut err);
                    }
                    None => pipes_open = false,
                },
                s = child.wait(), if status.is_none() => {
                    status = Some(s.map_err(|e| ToolError::failed(format!("waiting for bash failed: {e}")))?);
                    // Background children may keep the pipes open: give them a moment, then end them.
                    if pipes_open {
                        let grace = tokio::time::sleep(PIPE_GRACE);
                        tokio::pin!(grace);
                        loop {
                            tokio::select! {
                                c = rx.recv() => match c {
                                    Some((stream, bytes)) => {
                                        ctx.events.output(stream, String::from_utf8_lossy(&bytes).into_owned()).await;
                                        dropped += self.keep(stream, &bytes, &mut out, &mut err);
                                    }
                                    None => break,
                                },
                                _ = &mut grace => break,
                            }
                        }
                        pipes_open = false;
                    }
                }
                _ = &mut deadline => {
                    child.end().await;
                    let note = bound_note(&child).map(|n| format!(" ({n})")).unwrap_or_default();
                    return Err(ToolError::failed(format!(
                        "the command timed out after {}s and was killed{note}; output so far:\n{}{}",
                        timeout.as_secs(),
                        String::from_utf8_lossy(&out),
                        String::from_utf8_lossy(&err)
                    )));
                }
                _ = ctx.cancel.cancelled() => {
                    child.end().await;
                    return Err(ToolError::Cancelled);
                }
            }
            if status.is_some() && !pipes_open {
                break;
            }
        }
        // Nothing the command started outlives the call.
        child.end().await;
        let status = status.expect("loop ends after the child exits");
        let mut result = json!({
            "exit_code": status.code().unwrap_or(-1),
            "stdout": String::from_utf8_lossy(&out),
            "stderr": String::from_utf8_lossy(&err),
        });
        if status.code().is_none() {
            result["killed"] = json!(omicos_sandbox::describe_status(status));
        }
        if let Some(note) = bound_note(&child) {
            result["bound"] = json!(note);
        }
        if !child.warnings().is_empty() {
            result["sandbox_warning"] = json!(child.warnings().join("; "));
        }
        if dropped > 0 {
            result["truncated"] = json!(format!(
                "{dropped} bytes of output beyond the {}-byte cap were dropped",
                self.output_cap
            ));
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn shell() -> Shell {
        Shell::new(Duration::from_secs(20), 1000)
    }

    #[tokio::test]
    async fn runs_in_the_workspace_and_reports_exit_code() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().canonicalize().unwrap();
        let ctx = CallCtx::for_test(&ws, "s");
        let v = shell()
            .call("shell", json!({"command":"pwd; echo err >&2; exit 3"}), ctx)
            .await
            .unwrap();
        assert_eq!(v["exit_code"], 3);
        assert_eq!(
            v["stdout"].as_str().unwrap().trim(),
            ws.display().to_string()
        );
        assert_eq!(v["stderr"], "err\n");
    }

    #[tokio::test]
    async fn output_cap_and_timeout_kill_the_group() {
        let d = tempfile::tempdir().unwrap();
        let ctx = CallCtx::for_test(d.path(), "s");
        let v = shell()
            .call(
                "shell",
                json!({"command":"head -c 5000 /dev/zero | tr '\\0' x"}),
                ctx.clone(),
            )
            .await
            .unwrap();
        assert_eq!(v["stdout"].as_str().unwrap().len(), 1000);
        assert!(v["truncated"].as_str().unwrap().contains("4000 bytes"));
        let started = Instant::now();
        let marker = d.path().join("survivor");
        let cmd = format!("(sleep 3; touch {}) & sleep 30", marker.display());
        let e = shell()
            .call("shell", json!({"command": cmd, "timeout_secs": 1}), ctx)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("timed out after 1s"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert!(!marker.exists(), "a background child survived the timeout");
    }

    #[tokio::test]
    async fn commands_run_in_the_sandbox_and_agents_can_get_another_policy() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().canonicalize().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let tmp_root = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                use tokio::io::AsyncWriteExt;
                let _ = s.write_all(b"pong").await;
            }
        });
        let mut cfg = SandboxConfig {
            tmp_root: Some(tmp_root.path().canonicalize().unwrap()),
            ..SandboxConfig::default()
        };
        cfg.agent_policies
            .insert("reader".into(), omicos_sandbox::SandboxPolicy::ReadOnly);
        cfg.agent_policies
            .insert("fetcher".into(), omicos_sandbox::SandboxPolicy::Network);
        let sh = shell().with_sandbox(cfg);
        let script = format!(
            "echo in > in-$AGENT.txt; echo out > {}/x; cat < /dev/tcp/127.0.0.1/{port}; echo; echo \"$TMPDIR\"",
            outside.path().display()
        );
        let run = |agent: &'static str| {
            let mut ctx = CallCtx::for_test(&ws, "s1");
            ctx.agent_id = agent.into();
            let cmd = format!("AGENT={agent}; {script}");
            let sh = sh.clone();
            async move {
                sh.call("shell", json!({ "command": cmd }), ctx)
                    .await
                    .unwrap()
            }
        };
        // Default workspace-write: the workspace yes, outside and the network no.
        let v = run("test").await;
        let err = v["stderr"].as_str().unwrap();
        assert!(ws.join("in-test.txt").exists(), "{v}");
        // Outside the workspace is not in the box's view at all.
        assert!(!outside.path().join("x").exists(), "{v}");
        assert!(err.contains("No such file or directory"), "{v}");
        // The box's own loopback answers nothing of the host's.
        assert!(err.contains("Connection refused"), "{v}");
        assert!(!v["stdout"].as_str().unwrap().contains("pong"), "{v}");
        // TMPDIR is the box's private /tmp.
        assert!(v["stdout"].as_str().unwrap().ends_with("/tmp\n"), "{v}");
        // read-only for `reader`: not even the workspace.
        let v = run("reader").await;
        assert!(!ws.join("in-reader.txt").exists(), "{v}");
        // network for `fetcher`: the listener answers.
        let v = run("fetcher").await;
        assert!(ws.join("in-fetcher.txt").exists(), "{v}");
        assert!(v["stdout"].as_str().unwrap().starts_with("pong\n"), "{v}");
        assert!(!outside.path().join("x").exists(), "{v}");
    }

    #[tokio::test]
    async fn workdir_outside_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let ctx = CallCtx::for_test(d.path().canonicalize().unwrap(), "s");
        let e = shell()
            .validate_input("shell", &json!({"command":"ls","workdir":"../.."}), &ctx)
            .unwrap_err();
        assert!(e.to_string().contains("outside the workspace"));
    }
}
