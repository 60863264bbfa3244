//! Which Python runs the kernels, and how a project venv with ipykernel is made.
//!
//! Resolution, first that exists: `kernel.python` (`OMICOS_KERNEL_PYTHON`);
//! `<workspace>/.omicos/.kernel_choice`; `$OMICOS_ENV_DIR/.venv/bin/python3`;
//! `$VIRTUAL_ENV/bin/python3`; `$CONDA_PREFIX/bin/python3`; `python3` on PATH.

use std::path::{Path, PathBuf};

/// The chosen interpreter and the rule that chose it (for messages).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Interpreter {
    /// Path (or bare command name for the PATH fallback).
    pub python: PathBuf,
    /// Which rule chose it, e.g. `OMICOS_KERNEL_PYTHON`.
    pub source: String,
}

fn env_get<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter()
        .find(|(k, v)| k == key && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

/// Resolves the interpreter for `workspace`. `configured` is `kernel.python`.
pub fn resolve(configured: &str, workspace: &Path, env: &[(String, String)]) -> Interpreter {
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
    pick(PathBuf::from("python3"), "python3 on PATH")
}

/// The advice every "no ipykernel" message ends with.
pub const SETUP_HINT: &str = "create a project venv with ipykernel: run `omicos kernel setup`, or \
`python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` (see services/kernel/README.md), \
then point OMICOS_KERNEL_PYTHON at .venv/bin/python3";

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
        assert_eq!(
            resolve("", tempfile::tempdir().unwrap().path(), &[]).python,
            PathBuf::from("python3")
        );
    }
}
