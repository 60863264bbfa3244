//! `omicos sandbox [--policy P] -- CMD` as a child process: the command's
//! exit code comes back, and the policy holds.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_omicos");

fn omicos(ws: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("sandbox")
        .args(args)
        .current_dir(ws)
        .output()
        .unwrap()
}

#[test]
fn omicos_sandbox_runs_a_command_under_a_policy() {
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let escaped = outside.path().join("x");
    let script = format!(
        "echo in > in.txt && cat in.txt; echo out > {}; exit 3",
        escaped.display()
    );
    let o = omicos(ws.path(), &["--", "bash", "-c", &script]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "in\n");
    // Outside the workspace is not in the box's view (or not writable in it).
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&escaped.display().to_string())
            && [
                "Permission denied",
                "No such file or directory",
                "Read-only file system"
            ]
            .iter()
            .any(|m| err.contains(m)),
        "{err}"
    );
    assert!(ws.path().join("in.txt").exists() && !escaped.exists());

    let o = omicos(ws.path(), &["--policy", "read-only", "--", "touch", "y"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(!ws.path().join("y").exists());

    let o = omicos(ws.path(), &["--policy", "nope", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown sandbox policy `nope`"));

    let o = omicos(ws.path(), &["--", "/no/such/program"]);
    assert_eq!(o.status.code(), Some(126), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot run /no/such/program"));
}
