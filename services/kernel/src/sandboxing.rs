//! The kernels' sandbox: each session's kernel runs in the session's box
//! (`kernel.sandbox.policy`, workspace-write by default, no network), with
//! its interpreter's directories read-only in the view, its connection file
//! and sockets in the box's private directory (only the box's uid enters
//! it), and the session's own package directory at [`BOX_PACKAGES`].
//! kernel_install runs pip in the session's network box, into that same
//! directory: one session's packages never reach another's kernel, and the
//! shared interpreter stays read-only.

use omicos_sandbox::{
    Command, Placement, Process, Sandbox, SandboxConfig, SandboxPolicy, SessionBox,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where a session's packages are in its boxes.
pub const BOX_PACKAGES: &str = "/session/site-packages";

/// The directories an interpreter reads, found by asking it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterpreterRoots {
    /// Readable: prefixes, the executable's installation, `sys.path` entries.
    pub read: Vec<PathBuf>,
    /// `sys.prefix`.
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

/// `python` as a box can run it: its directory resolved (no `..` or
/// symlinked directories whose other end the box does not see), its file
/// name kept (a venv's `python3` symlink is what makes it that venv's).
pub fn program_path(python: &Path) -> PathBuf {
    let located = locate(python).unwrap_or_else(|| python.to_path_buf());
    match (
        located.parent().and_then(|d| d.canonicalize().ok()),
        located.file_name(),
    ) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => located,
    }
}

/// Asks `python` which directories it needs. The installation around the
/// executable as named (a venv's, or pyenv's shims) and around its real
/// file are included, so shims and symlinked venvs work. Run isolated (`-I`,
/// no environment): nothing a session wrote is imported by the service.
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
        .args(["-I", "-c", ASK])
        .env_clear()
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
    sandbox: Result<Arc<Sandbox>, String>,
    roots: Mutex<HashMap<PathBuf, InterpreterRoots>>,
}

/// A kernel or an install could not be sandboxed; the text is what the model reads.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SandboxRefused(pub String);

/// The session a kernel serves: its tenant and id (a warm kernel has a
/// placeholder session until one adopts it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRef {
    /// The tenant (empty: the root tenant).
    pub tenant: String,
    /// The session.
    pub session: String,
}

impl KernelSandbox {
    /// The sandbox for `config` (validated by [`crate::KernelConfig::validate`]).
    pub fn new(config: &SandboxConfig) -> Self {
        Self {
            sandbox: Sandbox::new(config.clone())
                .map(|s| {
                    s.log_report();
                    Arc::new(s)
                })
                .map_err(|e| format!("the kernel sandbox is not usable: {e}")),
            roots: Mutex::new(HashMap::new()),
        }
    }

    /// The sandbox, or why it is not usable.
    pub fn sandbox(&self) -> Result<&Arc<Sandbox>, SandboxRefused> {
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

    /// The session's package directory on the host (made when missing):
    /// in the workspace's state directory, which boxes never see but here.
    pub fn packages_dir(workspace: &Path, session: &str) -> Result<PathBuf, SandboxRefused> {
        let name = crate::sessions::session_file_name(session)
            .map_err(|e| SandboxRefused(e.to_string()))?;
        let dir = workspace
            .join(".omicos/sessions")
            .join(name)
            .join("site-packages");
        std::fs::create_dir_all(&dir)
            .map_err(|e| SandboxRefused(format!("cannot create {}: {e}", dir.display())))?;
        Ok(dir)
    }

    /// Where the session's packages are for its processes: the box path,
    /// or the host path where boxes have no view of their own.
    fn packages_path(&self, host: &Path, policy: SandboxPolicy) -> PathBuf {
        let namespaces = self
            .sandbox
            .as_ref()
            .is_ok_and(|s| s.report().mode != omicos_sandbox::Mode::NoNamespaces);
        if namespaces && policy.is_confined() {
            PathBuf::from(BOX_PACKAGES)
        } else {
            host.to_path_buf()
        }
    }

    async fn placement(
        &self,
        python: &Path,
        workspace: &Path,
        who: &SessionRef,
        policy: SandboxPolicy,
    ) -> Result<(Placement, PathBuf), SandboxRefused> {
        let host = Self::packages_dir(workspace, &who.session)?;
        let inside = self.packages_path(&host, policy);
        let mut place = Placement::new(&who.tenant, &who.session, workspace, policy)
            .read(self.roots(python).await.read);
        if inside == host {
            place = place.write([host]);
        } else {
            place = place.bind(host, &inside, true);
        }
        Ok((place, inside))
    }

    /// A kernel's placement, its box (None under danger-full-access) and
    /// the packages path its PYTHONPATH names.
    pub async fn for_kernel(
        &self,
        python: &Path,
        workspace: &Path,
        who: &SessionRef,
    ) -> Result<(Placement, Option<Arc<SessionBox>>, PathBuf), SandboxRefused> {
        let sandbox = self.sandbox()?;
        let (place, packages) = self
            .placement(python, workspace, who, sandbox.config().policy)
            .await?;
        let sbox = sandbox
            .prepare_box(&place)
            .await
            .map_err(|e| SandboxRefused(e.to_string()))?;
        Ok((place, sbox, packages))
    }

    /// Starts `cmd` at `place`.
    pub async fn spawn(&self, place: &Placement, cmd: Command) -> Result<Process, SandboxRefused> {
        self.sandbox()?
            .spawn(place, cmd)
            .await
            .map_err(|e| SandboxRefused(e.to_string()))
    }

    /// `pip install` for the session: the kernels' policy with the network,
    /// into the session's package directory. Returns the placement and the
    /// directory as the install sees it.
    pub async fn for_install(
        &self,
        python: &Path,
        workspace: &Path,
        who: &SessionRef,
    ) -> Result<(Placement, PathBuf), SandboxRefused> {
        let policy = self.policy().with_network();
        self.placement(python, workspace, who, policy).await
    }

    /// Ends the session's boxes (its kernel and installs).
    pub fn end_session(&self, who: &SessionRef) -> usize {
        self.sandbox
            .as_ref()
            .map(|s| s.end_session(&who.tenant, &who.session))
            .unwrap_or(0)
    }

    /// A warm kernel's boxes now belong to `to`.
    pub fn adopt(&self, from: &SessionRef, to: &SessionRef) {
        if let Ok(s) = &self.sandbox {
            s.adopt((&from.tenant, &from.session), (&to.tenant, &to.session));
        }
    }
}
