//! Which Python runs the kernels, and how a project venv with ipykernel is made.
//!
//! Resolution, first that exists: `kernel.python` (`OMICOS_KERNEL_PYTHON`);
//! `<workspace>/.omicos/.kernel_choice`; `$OMICOS_ENV_DIR/.venv/bin/python3`;
//! `$VIRTUAL_ENV/bin/python3`; `$CONDA_PREFIX/bin/python3`; then a project
//! venv whose python imports ipykernel, looked for the way uv and poetry look
//! for `.venv`: `<workspace>/.venv`, then `.venv` in the current directory and
//! each of its parents (so `omicos up` run anywhere in a checkout finds the
//! venv `scripts/bootstrap.sh` makes at its root); last, `python3` on PATH
//! ([`Interpreter::is_fallback`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// What the last rule picks: a bare `python3` from PATH.
pub const FALLBACK_SOURCE: &str = "python3 on PATH";

/// The chosen interpreter and the rule that chose it (for messages).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Interpreter {
    /// Path (or bare command name for the PATH fallback).
    pub python: PathBuf,
    /// Which rule chose it, e.g. `OMICOS_KERNEL_PYTHON`.
    pub source: String,
}

impl Interpreter {
    /// True when no rule matched and the kernels use `python3` from PATH,
    /// which often lacks ipykernel: worth saying at start.
    pub fn is_fallback(&self) -> bool {
        self.source == FALLBACK_SOURCE
    }
}

fn env_get<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter()
        .find(|(k, v)| k == key && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

/// Resolves the interpreter for `workspace`. `configured` is `kernel.python`.
/// Project venvs are looked for from the process's current directory.
pub fn resolve(configured: &str, workspace: &Path, env: &[(String, String)]) -> Interpreter {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    resolve_in(configured, workspace, env, &cwd)
}

/// [`resolve`] with the directory to look for project venvs from.
pub fn resolve_in(
    configured: &str,
    workspace: &Path,
    env: &[(String, String)],
    cwd: &Path,
) -> Interpreter {
    let pick = |p: PathBuf, source: &str| Interpreter {
        python: p,
        source: source.into(),
    };
    if !configured.is_empty() {
        return pick(
            PathBuf::from(configured),
            "kernel.python / OMICOS_KERNEL_PYTHON",
        );
    }
    if let Some(v) = env_get(env, "OMICOS_KERNEL_PYTHON") {
        return pick(PathBuf::from(v), "OMICOS_KERNEL_PYTHON");
    }
    let choice = workspace.join(".omicos/.kernel_choice");
    if let Ok(text) = std::fs::read_to_string(&choice) {
        let p = text.trim();
        if !p.is_empty() {
            let p = if Path::new(p).is_absolute() {
                PathBuf::from(p)
            } else {
                workspace.join(p)
            };
            if p.exists() {
                return pick(p, &choice.display().to_string());
            }
        }
    }
    for (var, suffix) in [
        ("OMICOS_ENV_DIR", ".venv/bin/python3"),
        ("VIRTUAL_ENV", "bin/python3"),
        ("CONDA_PREFIX", "bin/python3"),
    ] {
        if let Some(dir) = env_get(env, var) {
            let p = Path::new(dir).join(suffix);
            if p.exists() {
                return pick(p, var);
            }
        }
    }
    let project_dirs = std::iter::once(workspace).chain(cwd.ancestors());
    for dir in project_dirs {
        let venv = dir.join(".venv");
        let p = venv.join("bin/python3");
        if p.exists() && has_ipykernel(&p) {
            return pick(p, &venv.display().to_string());
        }
    }
    pick(PathBuf::from("python3"), FALLBACK_SOURCE)
}

/// Whether `python` imports ipykernel; asked once per interpreter per process,
/// since a kernel start resolves the interpreter each time.
pub fn has_ipykernel(python: &Path) -> bool {
    static SEEN: OnceLock<Mutex<HashMap<PathBuf, bool>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(ok) = seen.lock().ok().and_then(|m| m.get(python).copied()) {
        return ok;
    }
    let ok = std::process::Command::new(python)
        .args(["-c", "import ipykernel"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if let Ok(mut m) = seen.lock() {
        m.insert(python.to_owned(), ok);
    }
    ok
}

/// The advice every "no ipykernel" message ends with.
pub const SETUP_HINT: &str = "create a project venv with ipykernel: run `omicos kernel setup`, or \
`python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` (see services/kernel/README.md); \
a .venv in the workspace, or in the directory omicos starts from or a parent, is found by itself, \
elsewhere point OMICOS_KERNEL_PYTHON at .venv/bin/python3";

/// Why [`setup_venv`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A step could not run or failed.
    #[error("{step} failed: {detail}")]
    Step {
        /// The command that failed.
        step: String,
        /// Its output or error.
        detail: String,
    },
}

/// Creates `<dir>/.venv` with ipykernel (what `omicos kernel setup` runs) and
/// returns its interpreter. Uses `python3` from PATH as the base; an existing
/// venv is reused and ipykernel is installed or kept. Blocking: call it from
/// a blocking context (`spawn_blocking` in async code).
pub fn setup_venv(dir: &Path) -> Result<PathBuf, SetupError> {
    let venv = dir.join(".venv");
    let python = venv.join("bin/python3");
    let run = |cmd: &mut std::process::Command, step: String| -> Result<(), SetupError> {
        let out = cmd.output().map_err(|e| SetupError::Step {
            step: step.clone(),
            detail: e.to_string(),
        })?;
        if out.status.success() {
            Ok(())
        } else {
            let mut detail = String::from_utf8_lossy(&out.stderr).into_owned();
            if detail.len() > 4000 {
                detail = detail[detail.len() - 4000..].to_owned();
            }
            Err(SetupError::Step { step, detail })
        }
    };
    if !python.exists() {
        run(
            std::process::Command::new("python3")
                .arg("-m")
                .arg("venv")
                .arg(&venv),
            format!("python3 -m venv {}", venv.display()),
        )?;
    }
    run(
        std::process::Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "ipykernel>=6.29",
        ]),
        format!("{} -m pip install ipykernel", python.display()),
    )?;
    Ok(python)
}

/// Records `python` as the workspace's kernel choice (`.omicos/.kernel_choice`).
pub fn write_kernel_choice(workspace: &Path, python: &Path) -> std::io::Result<()> {
    let dir = workspace.join(".omicos");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join(".kernel_choice"),
        format!("{}\n", python.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_order() {
        let ws = tempfile::tempdir().unwrap();
        let env_dir = tempfile::tempdir().unwrap();
        let venv_py = env_dir.path().join(".venv/bin/python3");
        std::fs::create_dir_all(venv_py.parent().unwrap()).unwrap();
        std::fs::write(&venv_py, "").unwrap();
        let env = vec![
            (
                "OMICOS_ENV_DIR".to_string(),
                env_dir.path().display().to_string(),
            ),
            ("VIRTUAL_ENV".to_string(), "/nonexistent".to_string()),
        ];
        assert_eq!(
            resolve("/x/py", ws.path(), &env).python,
            PathBuf::from("/x/py")
        );
        assert_eq!(resolve("", ws.path(), &env).python, venv_py);
        assert_eq!(resolve("", ws.path(), &env).source, "OMICOS_ENV_DIR");
        write_kernel_choice(ws.path(), &venv_py).unwrap();
        let r = resolve("", ws.path(), &[]);
        assert_eq!(r.python, venv_py);
        assert!(r.source.ends_with(".kernel_choice"));
        let mut env2 = env.clone();
        env2.push(("OMICOS_KERNEL_PYTHON".into(), "/y/py".into()));
        assert_eq!(resolve("", ws.path(), &env2).python, PathBuf::from("/y/py"));
        let empty = tempfile::tempdir().unwrap();
        let r = resolve_in("", empty.path(), &[], empty.path());
        assert_eq!(r.python, PathBuf::from("python3"));
        assert!(r.is_fallback());
    }

    /// A fake interpreter: a shell script that exits 0 when asked to import
    /// ipykernel if `with_ipykernel`, else 1.
    fn fake_venv(dir: &Path, with_ipykernel: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let py = dir.join(".venv/bin/python3");
        std::fs::create_dir_all(py.parent().unwrap()).unwrap();
        let code = if with_ipykernel { 0 } else { 1 };
        std::fs::write(&py, format!("#!/bin/sh\nexit {code}\n")).unwrap();
        std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
        py
    }

    #[test]
    fn a_project_venv_with_ipykernel_is_found_from_the_workspace_then_the_current_directory_up() {
        let repo = tempfile::tempdir().unwrap();
        let nested = repo.path().join("a/b");
        std::fs::create_dir_all(&nested).unwrap();
        let ws = tempfile::tempdir().unwrap();
        let repo_py = fake_venv(repo.path(), true);
        // From a subdirectory of the checkout: the root's .venv.
        let r = resolve_in("", ws.path(), &[], &nested);
        assert_eq!(r.python, repo_py);
        assert_eq!(r.source, repo.path().join(".venv").display().to_string());
        assert!(!r.is_fallback());
        // The workspace's own venv comes first.
        let ws_py = fake_venv(ws.path(), true);
        assert_eq!(resolve_in("", ws.path(), &[], &nested).python, ws_py);
        // An activated venv is an explicit choice and wins over both.
        let active = tempfile::tempdir().unwrap();
        let active_py = active.path().join("bin/python3");
        std::fs::create_dir_all(active_py.parent().unwrap()).unwrap();
        std::fs::write(&active_py, "").unwrap();
        let env = vec![(
            "VIRTUAL_ENV".to_string(),
            active.path().display().to_string(),
        )];
        assert_eq!(resolve_in("", ws.path(), &env, &nested).python, active_py);
        // A .venv without ipykernel is passed over: python3 on PATH, said plainly.
        let bare = tempfile::tempdir().unwrap();
        fake_venv(bare.path(), false);
        let r = resolve_in("", bare.path(), &[], bare.path());
        assert!(r.is_fallback(), "{r:?}");
    }
}
