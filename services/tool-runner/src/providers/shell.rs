//! `shell`: `bash -lc <command>` in the workspace, in its own process group,
//! with a timeout and an output cap; the whole group is killed on timeout or
//! cancel, so nothing it started outlives the call.

use async_trait::async_trait;
use omicos_proto::{Risk, ToolSpec};
use omicos_toolkit::{CallCtx, Provider, ToolError, confine_path, tool};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// The shell provider.
#[derive(Clone, Debug)]
pub struct Shell {
    /// Longest a command may run; a call may ask for less.
    pub max_timeout: Duration,
    /// Bytes of stdout+stderr kept.
    pub output_cap: usize,
}

impl Shell {
    /// A shell with these limits.
    pub fn new(max_timeout: Duration, output_cap: usize) -> Self {
        Self {
            max_timeout,
            output_cap,
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

fn killpg(pid: Option<u32>) {
    if let Some(pid) = pid {
        // SAFETY: killpg only sends a signal; the group is the one we created for this child.
        unsafe {
            libc::killpg(pid as i32, libc::SIGKILL);
        }
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

    fn validate_input(&self, _tool: &str, args: &Value, ctx: &CallCtx) -> Result<(), ToolError> {
        if let Some(w) = args.get("workdir").and_then(Value::as_str) {
            let p =
                confine_path(&ctx.workspace, w).map_err(|e| ToolError::invalid(e.to_string()))?;
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
            Some(w) => {
                confine_path(&ctx.workspace, w).map_err(|e| ToolError::invalid(e.to_string()))?
            }
            None => ctx.workspace.clone(),
        };
        let mut child = tokio::process::Command::new("bash")
            .arg("-lc")
            .arg(command)
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ToolError::failed(format!("cannot start bash: {e}")))?;
        let pid = child.id();
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
                    // Background children may keep the pipes open: give them a moment, then end the group.
                    if pipes_open {
                        let grace = tokio::time::sleep(Duration::from_millis(200));
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
                                _ = &mut grace => { killpg(pid); break; }
                            }
                        }
                        pipes_open = false;
                    }
                }
                _ = &mut deadline => {
                    killpg(pid);
                    let _ = child.wait().await;
                    return Err(ToolError::failed(format!(
                        "the command timed out after {}s and was killed; output so far:\n{}{}",
                        timeout.as_secs(),
                        String::from_utf8_lossy(&out),
                        String::from_utf8_lossy(&err)
                    )));
                }
                _ = ctx.cancel.cancelled() => {
                    killpg(pid);
                    let _ = child.wait().await;
                    return Err(ToolError::Cancelled);
                }
            }
            if status.is_some() && !pipes_open {
                break;
            }
        }
        let status = status.expect("loop ends after the child exits");
        let mut result = json!({
            "exit_code": status.code().unwrap_or(-1),
            "stdout": String::from_utf8_lossy(&out),
            "stderr": String::from_utf8_lossy(&err),
        });
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
    async fn workdir_outside_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let ctx = CallCtx::for_test(d.path().canonicalize().unwrap(), "s");
        let e = shell()
            .validate_input("shell", &json!({"command":"ls","workdir":"../.."}), &ctx)
            .unwrap_err();
        assert!(e.to_string().contains("outside the workspace"));
    }
}
