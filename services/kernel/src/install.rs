//! kernel_install: `<kernel python> -m pip install` as a separate process,
//! with refusals, a timeout and an output cap.

use crate::output::CappedText;
use omicos_toolkit::{EventSink, ToolError};
use serde_json::{Value, json};
use std::{path::Path, time::Duration};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

/// A validated install request.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallRequest {
    /// Requirement specifiers (`name`, `name==1.2`, `name[extra]>=1`).
    pub packages: Vec<String>,
    /// Pass `--upgrade`.
    pub upgrade: bool,
    /// Pass `--index-url`.
    pub index_url: Option<String>,
}

/// Parses and checks kernel_install's arguments. Refuses -r/--requirement,
/// --target, anything that looks like an option, names with '/', and index
/// URLs that are not http(s).
pub fn parse_request(args: &Value) -> Result<InstallRequest, ToolError> {
    let packages = match &args["packages"] {
        Value::Array(a) => a
            .iter()
            .map(|p| {
                p.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ToolError::invalid("packages must be strings"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Value::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        _ => {
            return Err(ToolError::invalid(
                "packages is required: a list of package names",
            ));
        }
    };
    if packages.is_empty() {
        return Err(ToolError::invalid(
            "packages is empty: name at least one package",
        ));
    }
    for p in &packages {
        let t = p.trim();
        if t == "-r" || t.starts_with("--requirement") || t.starts_with("-r") {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: -r/--requirement files are not installed by kernel_install; name the packages"
            )));
        }
        if t.starts_with("--target") || t == "-t" {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: --target is not allowed; packages go into the kernel's environment"
            )));
        }
        if t.starts_with('-') {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: it looks like a pip option; only package names are accepted"
            )));
        }
        if t.contains('/') {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: names with '/' (paths, URLs) are not accepted; give a package name from the index"
            )));
        }
        if t.is_empty() || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ToolError::invalid(format!(
                "`{}` refused: a package name has no spaces or control characters",
                p.escape_debug()
            )));
        }
        if !t.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: a package name starts with a letter or digit"
            )));
        }
    }
    let upgrade = args["upgrade"].as_bool().unwrap_or(false);
    let index_url = match &args["index_url"] {
        Value::Null => None,
        Value::String(u) if u.is_empty() => None,
        Value::String(u) => {
            let lower = u.to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://"))
                || u.chars().any(char::is_whitespace)
            {
                return Err(ToolError::invalid(format!(
                    "index_url `{u}` refused: only http:// and https:// index URLs are accepted"
                )));
            }
            Some(u.clone())
        }
        _ => return Err(ToolError::invalid("index_url must be a string")),
    };
    Ok(InstallRequest {
        packages: packages.into_iter().map(|p| p.trim().to_owned()).collect(),
        upgrade,
        index_url,
    })
}

/// Runs pip. Output streams to `events`; the result keeps at most `cap` bytes of it.
pub async fn run(
    python: &Path,
    req: &InstallRequest,
    timeout: Duration,
    cap: usize,
    events: &EventSink,
    cancel: &CancellationToken,
    sandbox: &omicos_sandbox::Prepared,
) -> Result<Value, ToolError> {
    let mut cmd = tokio::process::Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
    ]);
    if req.upgrade {
        cmd.arg("--upgrade");
    }
    if let Some(u) = &req.index_url {
        cmd.arg("--index-url").arg(u);
    }
    cmd.args(&req.packages)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env("PYTHONUNBUFFERED", "1")
        .process_group(0)
        .kill_on_drop(true);
    sandbox.apply_to(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| ToolError::failed(format!("cannot run {} -m pip: {e}", python.display())))?;
    let pid = child.id().unwrap_or(0) as i32;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(&'static str, String)>(64);
    for (name, pipe) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ),
    ] {
        let Some(mut pipe) = pipe else { continue };
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0
                    || tx
                        .send((name, String::from_utf8_lossy(&buf[..n]).into_owned()))
                        .await
                        .is_err()
                {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut output = CappedText::with_cap(cap);
    let deadline = tokio::time::Instant::now() + timeout;
    let kill = |why: &str| {
        if pid > 0 {
            // SAFETY: a process group we created.
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
        tracing::info!(why, "pip stopped");
    };
    let status = loop {
        tokio::select! {
            chunk = rx.recv() => match chunk {
                Some((name, text)) => {
                    output.push(&text);
                    events.output(name, text).await;
                }
                None => break child.wait().await.map_err(|e| ToolError::failed(format!("pip could not be waited for: {e}")))?,
            },
            _ = tokio::time::sleep_until(deadline) => {
                kill("timeout");
                let _ = child.wait().await;
                return Err(ToolError::failed(format!(
                    "pip did not finish within {} s and was stopped; output so far:\n{}", timeout.as_secs(), output.text()
                )));
            }
            _ = cancel.cancelled() => {
                kill("cancelled");
                return Err(ToolError::Cancelled);
            }
        }
    };
    let text = output.text();
    if status.success() {
        Ok(json!({
            "installed": req.packages,
            "python": python.display().to_string(),
            "output": text,
            "note": "already-imported modules keep their old version until the kernel restarts; new packages can be imported now",
        }))
    } else {
        Err(ToolError::failed(format!(
            "pip install failed ({status}):\n{text}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals() {
        let bad = [
            json!({"packages": ["-r", "req.txt"]}),
            json!({"packages": ["--requirement=req.txt"]}),
            json!({"packages": ["six", "--target", "/tmp"]}),
            json!({"packages": ["--index-url=http://x"]}),
            json!({"packages": ["git+https://github.com/x/y"]}),
            json!({"packages": ["./local/pkg"]}),
            json!({"packages": []}),
            json!({"packages": ["six"], "index_url": "file:///tmp/idx"}),
            json!({"packages": ["six"], "index_url": "ftp://x"}),
        ];
        for b in bad {
            assert!(
                matches!(parse_request(&b), Err(ToolError::InvalidInput(_))),
                "{b}"
            );
        }
        let ok = parse_request(&json!({"packages": ["six==1.16.0", "requests[socks]>=2"], "upgrade": true, "index_url": "https://pypi.org/simple"})).unwrap();
        assert_eq!(ok.packages, vec!["six==1.16.0", "requests[socks]>=2"]);
        assert!(ok.upgrade);
        let msg = parse_request(&json!({"packages": ["-r", "x"]}))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("-r/--requirement"), "{msg}");
        let msg = parse_request(&json!({"packages": ["--target=/x"]}))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("--target"), "{msg}");
    }
}
