//! The kernels' sandbox: a kernel runs under `kernel.sandbox.policy`
//! (workspace-write by default) with its private socket directory writable
//! and its interpreter's directories readable; kernel_install leaves the
//! network sandbox for the install only, with the environment's prefix
//! writable so pip can install into it.

use omicos_sandbox::{Prepared, Roots, Sandbox, SandboxConfig, SandboxPolicy};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The directories an interpreter reads, found by asking it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterpreterRoots {
    /// Readable: prefixes, the executable's installation, `sys.path` entries.
    pub read: Vec<PathBuf>,
    /// `sys.prefix`: where pip installs (writable during kernel_install only).
    pub prefix: Option<PathBuf>,
}

/// What the interpreter says about itself (one JSON line).
const ASK: &str = "import json, sys; print(json.dumps({'prefix': sys.prefix, 'dirs': [sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, sys.executable] + sys.path}))";

/// `python` as a path: a bare name is looked up on PATH.
fn locate(python: &Path) -> Option<PathBuf> {
    if python.components().count() > 1 {
        return Some(python.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(python))
            .find(|p| p.is_file())
    })
}

/// Asks `python` which directories it needs. The installation around the
/// executable as named (a venv's, or pyenv's shims) and around its real
/// file are included, so shims and symlinked venvs work.
pub async fn interpreter_roots(python: &Path) -> InterpreterRoots {
    let mut read = Vec::new();
    if let Some(p) = locate(python) {
        read.extend(p.parent().and_then(Path::parent).map(Path::to_path_buf));
        if let Ok(real) = p.canonicalize() {
            read.extend(real.parent().and_then(Path::parent).map(Path::to_path_buf));
        }
    }
    let mut prefix = None;
    let out = tokio::process::Command::new(python)
        .args(["-c", ASK])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await;
    if let Ok(o) = out
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout)
    {
        prefix = v["prefix"].as_str().map(PathBuf::from);
        read.extend(prefix.clone());
        for d in v["dirs"].as_array().into_iter().flatten() {
            if let Some(d) = d.as_str().filter(|d| d.starts_with('/')) {
                read.push(PathBuf::from(d));
            }
        }
    }
    // Never the whole disk or a home directory, whatever sys.path says.
    let home = std::env::var_os("HOME").map(PathBuf::from);
    read.retain(|p| p != Path::new("/") && Some(p) != home.as_ref() && p.exists());
    read.sort();
    read.dedup();
    InterpreterRoots { read, prefix }
}

/// The sandbox every kernel of this instance runs in, or why there is none.
#[derive(Debug)]
pub struct KernelSandbox {
    sandbox: Result<Sandbox, String>,
    roots: Mutex<HashMap<PathBuf, InterpreterRoots>>,
}

/// A kernel or an install could not be sandboxed; the text is what the model reads.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SandboxRefused(pub String);

impl KernelSandbox {
    /// The sandbox for `config` (validated by [`crate::KernelConfig::validate`]).
    pub fn new(config: &SandboxConfig) -> Self {
        Self {
            sandbox: Sandbox::new(config.clone())
                .map_err(|e| format!("the kernel sandbox is not usable: {e}")),
            roots: Mutex::new(HashMap::new()),
        }
    }

    fn sandbox(&self) -> Result<&Sandbox, SandboxRefused> {
        self.sandbox.as_ref().map_err(|e| SandboxRefused(e.clone()))
    }

    /// The kernels' policy.
    pub fn policy(&self) -> SandboxPolicy {
        self.sandbox
            .as_ref()
            .map(|s| s.config().policy)
            .unwrap_or_default()
    }

    /// The interpreter's roots, asked once per interpreter.
    pub async fn roots(&self, python: &Path) -> InterpreterRoots {
        if let Some(r) = self.roots.lock().expect("roots lock").get(python) {
            return r.clone();
        }
        let r = interpreter_roots(python).await;
        self.roots
            .lock()
            .expect("roots lock")
            .insert(python.to_path_buf(), r.clone());
        r
    }

    /// A kernel in `workspace` whose sockets live in `dir` (`dir/tmp` is its TMPDIR).
    pub async fn for_kernel(
        &self,
        python: &Path,
        workspace: &Path,
        dir: &Path,
    ) -> Result<Prepared, SandboxRefused> {
        let sandbox = self.sandbox()?;
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp)
            .map_err(|e| SandboxRefused(format!("cannot create {}: {e}", tmp.display())))?;
        let roots = Roots::new(workspace)
            .tmp(tmp)
            .write([dir.to_path_buf()])
            .read(self.roots(python).await.read);
        sandbox
            .prepare(sandbox.config().policy, &roots)
            .map_err(|e| SandboxRefused(e.to_string()))
    }

    /// `pip install` for `session`: the kernels' policy with the network,
    /// and the environment's prefix writable.
    pub async fn for_install(
        &self,
        python: &Path,
        workspace: &Path,
        session: &str,
    ) -> Result<Prepared, SandboxRefused> {
        let sandbox = self.sandbox()?;
        let tmp = sandbox
            .session_tmp_dir(session)
            .map_err(|e| SandboxRefused(e.to_string()))?;
        let roots = self.roots(python).await;
        let roots = Roots::new(workspace)
            .tmp(tmp)
            .write(roots.prefix.clone())
            .read(roots.read);
        sandbox
            .prepare(sandbox.config().policy.with_network(), &roots)
            .map_err(|e| SandboxRefused(e.to_string()))
    }
}
