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

/// File name endings of archives pip installs from a local path.
const ARCHIVE_SUFFIXES: &[&str] = &[
    ".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar.lz",
    ".tlz", ".egg",
];

/// Parses and checks kernel_install's arguments. Refuses -r/--requirement,
/// --target, anything that looks like an option, names with '/' or '\\',
/// local archives (`x.whl`, `x.tar.gz`, ...), direct references (`@`, `:`),
/// and index URLs that are not http(s). The index URL's address is checked
/// by [`check_index`].
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
        if t.contains('\\') {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: names with '\\' (paths) are not accepted; give a package name from the index"
            )));
        }
        let lower = t.to_ascii_lowercase();
        if let Some(sfx) = ARCHIVE_SUFFIXES.iter().find(|s| lower.ends_with(*s)) {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: it names a local archive ({sfx}); give a package name from the index"
            )));
        }
        if t.contains('@') || t.contains(':') {
            return Err(ToolError::invalid(format!(
                "`{p}` refused: direct references (`name @ url`, `file:`, URLs) are not accepted; give a package name from the index"
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

/// Checks the index URL's address as web_fetch checks a URL (omicos-ssrf):
/// an IP literal in any spelling, and every address its name resolves to,
/// must be public unless `policy`'s allowlist names it. (pip resolves the
/// name again itself; the sandbox's network rules are the outer fence.)
pub async fn check_index(
    policy: &omicos_ssrf::Policy,
    lookup: &dyn omicos_ssrf::Lookup,
    index_url: &str,
) -> Result<(), ToolError> {
    let refused = |why: String| {
        ToolError::invalid(format!(
            "index_url `{index_url}` refused: {why}; kernel_install keeps to web_fetch's network rules (kernel.install_index_allow allows a mirror)"
        ))
    };
    let url = url::Url::parse(index_url).map_err(|e| refused(format!("not a URL ({e})")))?;
    policy.check_url(&url).map_err(|b| refused(b.to_string()))?;
    if let Some(url::Host::Domain(name)) = url.host()
        && !policy.host_allowed(name)
    {
        let addrs = lookup
            .lookup(name)
            .await
            .map_err(|e| refused(format!("its host does not resolve ({e})")))?;
        if addrs.is_empty() {
            return Err(refused(format!("{name} has no addresses")));
        }
        policy
            .check_addrs(name, &addrs)
            .map_err(|b| refused(b.to_string()))?;
    }
    Ok(())
}

/// Runs pip for the session: isolated (`python -I`: no PYTHONPATH, no
/// user site, not the working directory on `sys.path`; `pip --isolated`:
/// no user or environment configuration, no `PIP_*`; and the box's
/// environment is an allowlist), into the session's own package directory
/// `target` (as the box sees it), never into the shared interpreter. Output
/// streams to `events`; the result keeps at most `cap` bytes of it.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    python: &Path,
    target: &Path,
    req: &InstallRequest,
    timeout: Duration,
    cap: usize,
    events: &EventSink,
    cancel: &CancellationToken,
    sandbox: &crate::sandboxing::KernelSandbox,
    place: &omicos_sandbox::Placement,
) -> Result<Value, ToolError> {
    let mut cmd = omicos_sandbox::Command::new(
        crate::sandboxing::program_path(python)
            .display()
            .to_string(),
    );
    cmd.args([
        "-I",
        "-m",
        "pip",
        "install",
        "--isolated",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        "--no-warn-script-location",
        "--target",
    ])
    .arg(target.display().to_string());
    if req.upgrade {
        cmd.arg("--upgrade");
    }
    if let Some(u) = &req.index_url {
        cmd.arg("--index-url").arg(u.clone());
    }
    cmd.args(req.packages.iter().cloned())
        .stdout(omicos_sandbox::Stdio::Piped)
        .stderr(omicos_sandbox::Stdio::Piped)
        .env("PYTHONUNBUFFERED", "1")
        .cwd(&place.workspace);
    let mut child = sandbox
        .spawn(place, cmd)
        .await
        .map_err(|e| ToolError::failed(format!("cannot run {} -m pip: {e}", python.display())))?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(&'static str, String)>(64);
    for (name, pipe) in [
        ("stdout", child.stdout.take()),
        ("stderr", child.stderr.take()),
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
                child.end().await;
                tracing::info!("pip stopped: timeout");
                return Err(ToolError::failed(format!(
                    "pip did not finish within {} s and was stopped; output so far:\n{}", timeout.as_secs(), output.text()
                )));
            }
            _ = cancel.cancelled() => {
                child.end().await;
                tracing::info!("pip stopped: cancelled");
                return Err(ToolError::Cancelled);
            }
        }
    };
    // Whatever pip started (build backends) ends with it.
    child.end().await;
    let text = output.text();
    if status.success() {
        Ok(json!({
            "installed": req.packages,
            "python": python.display().to_string(),
            "target": target.display().to_string(),
            "output": text,
            "note": "installed for this session only; already-imported modules keep their old version until the kernel restarts; new packages can be imported now",
        }))
    } else {
        let bound = child
            .hit_memory_bound()
            .map(|b| {
                format!(
                    " (the session's memory bound of {} MiB was reached)",
                    b >> 20
                )
            })
            .unwrap_or_default();
        Err(ToolError::failed(format!(
            "pip install failed ({}){bound}:\n{text}",
            omicos_sandbox::describe_status(status)
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
        for local in [
            "x.whl", "X.TAR.GZ", "x.zip", "x.tgz", "x.egg", "a\\b", "x@y", "c:x",
        ] {
            assert!(
                parse_request(&json!({"packages": [local]})).is_err(),
                "{local}"
            );
        }
    }

    /// Answers every name with fixed addresses.
    struct Fixed(Vec<std::net::IpAddr>);

    impl omicos_ssrf::Lookup for Fixed {
        fn lookup(&self, _host: &str) -> omicos_ssrf::LookupFuture {
            let a = self.0.clone();
            Box::pin(async move { Ok(a) })
        }
    }

    #[tokio::test]
    async fn the_index_keeps_to_the_network_rules() {
        let open = omicos_ssrf::Policy::new(true, &[]).unwrap();
        let public = Fixed(vec!["151.101.0.223".parse().unwrap()]);
        let private = Fixed(vec!["10.1.2.3".parse().unwrap()]);
        let mixed = Fixed(vec![
            "151.101.0.223".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
        ]);
        check_index(&open, &public, "https://pypi.org/simple")
            .await
            .unwrap();
        for (lookup, url, want) in [
            (&public, "http://127.0.0.1/simple", "loopback"),
            (&public, "http://[fd00:ec2::254]/", "unique local"),
            (&public, "http://0x7f.1/simple", "loopback"),
            (&private, "https://mirror.corp.example/simple", "private"),
            (&mixed, "https://rebind.example/simple", "loopback"),
        ] {
            let e = check_index(&open, lookup, url)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("index_url"), "{url}: {e}");
        }
        // The allowlist lets a mirror in, by name or by network.
        let by_name = omicos_ssrf::Policy::new(true, &["mirror.corp.example".into()]).unwrap();
        check_index(&by_name, &private, "https://mirror.corp.example/simple")
            .await
            .unwrap();
        let by_net = omicos_ssrf::Policy::new(true, &["10.0.0.0/8".into()]).unwrap();
        check_index(&by_net, &private, "https://mirror.corp.example/simple")
            .await
            .unwrap();
        assert!(
            check_index(&by_net, &public, "http://127.0.0.1/simple")
                .await
                .is_err()
        );
    }
}
