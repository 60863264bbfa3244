//! The workspace disk bound from inside a box: omicos's own state under
//! `.omicos/` (a session store grown past the bound, trajectories) does not
//! eat the session's budget, the box cannot write there to hide its bytes,
//! and boxed code writing past the bound is still stopped.

use omicos_sandbox::{
    Command, DiskMeasure, Mode, Placement, Sandbox, SandboxConfig, SandboxPolicy, Stdio,
};
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncReadExt;

const BOUND: u64 = 16 << 20;

fn ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
}

/// Runs `script` in `place`'s box: (exit code, stdout + stderr, the disk
/// bound's note if it stopped the call).
async fn run(
    sb: &Sandbox,
    place: &Placement,
    script: &str,
) -> (Option<i32>, String, Option<String>) {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", script])
        .stdout(Stdio::Piped)
        .stderr(Stdio::Piped);
    let mut p = sb.spawn(place, cmd).await.expect("spawn in the box");
    let (mut out, mut err) = (String::new(), String::new());
    let (mut o, mut e) = (p.stdout.take().unwrap(), p.stderr.take().unwrap());
    let read = async {
        let _ = tokio::join!(o.read_to_string(&mut out), e.read_to_string(&mut err));
    };
    if tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .is_err()
    {
        p.end().await;
        panic!("`{script}` did not finish within 60 s");
    }
    let st = p.wait().await.unwrap();
    let note = p.hit_disk_bound();
    p.end().await;
    (st.code(), format!("{out}{err}"), note)
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn omicos_state_does_not_count_and_boxed_writes_do() {
    let mut config = SandboxConfig::default();
    config.session_limits.workspace_bytes = Some(BOUND);
    let sb = Sandbox::new(config).unwrap();
    if sb.report().mode == Mode::NoNamespaces {
        // Boxes can reach `.omicos/` here: all of it counts.
        assert_eq!(sb.disk_measure(), DiskMeasure::Everything);
        assert!(
            !ci(),
            "no namespaces under CI=true: {:?}",
            sb.report().lines
        );
        eprintln!("SKIPPED: no namespaces here");
        return;
    }
    assert_eq!(sb.disk_measure(), DiskMeasure::WithoutOwnState);
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().canonicalize().unwrap().join("ws");
    let state = ws.join(".omicos");
    std::fs::create_dir_all(state.join("trajectories/s")).unwrap();
    // The session store grown past the bound on its own, with its WAL, and
    // a trajectory: real blocks, as SQLite and the orchestrator write them.
    let store = state.join("sessions.db");
    std::fs::write(&store, vec![1u8; (BOUND + (4 << 20)) as usize]).unwrap();
    std::fs::write(state.join("sessions.db-wal"), vec![2u8; 2 << 20]).unwrap();
    let trajectory = state.join("trajectories/s/trajectory.jsonl");
    std::fs::write(&trajectory, vec![b'{'; 1 << 20]).unwrap();
    assert!(
        omicos_sandbox::disk_usage(&ws) > BOUND,
        "the state alone is past the bound"
    );
    assert!(sb.disk_measure().usage(&ws) < 1 << 20);
    let place = Placement::new("acme", "s", &ws, SandboxPolicy::WorkspaceWrite);
    let script = |s: &str| s.replace("{ws}", &ws.display().to_string());

    // Under the bound by what the box writes: 4 MiB over ~2 s (the watchdog
    // measures every second), never stopped although the store is past it.
    let (code, out, note) = run(
        &sb,
        &place,
        &script("for i in 1 2 3 4; do head -c 1048576 /dev/zero > {ws}/small$i || exit 2; sleep 0.5; done; echo wrote"),
    )
    .await;
    assert_eq!(note, None, "stopped for omicos's own state: {out}");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("wrote"), "{out}");

    // The box cannot hide its bytes in an excluded path: `.omicos/` is not
    // in its view, so these writes fail and the state is unchanged.
    let store_size = size(&store);
    let trajectory_size = size(&trajectory);
    for attempt in [
        "head -c 1048576 /dev/zero >> {ws}/.omicos/sessions.db",
        "head -c 1048576 /dev/zero > {ws}/.omicos/sessions.db-wal",
        "head -c 1048576 /dev/zero > {ws}/.omicos/trajectories/s/trajectory.jsonl",
        "mkdir -p {ws}/.omicos/trajectories/x && head -c 1048576 /dev/zero > {ws}/.omicos/trajectories/x/f && test -s {ws}/.omicos/trajectories/x/f",
        "mkdir -p {ws}/.omicos/tenants/t && head -c 1048576 /dev/zero > {ws}/.omicos/tenants/t/f && test -s {ws}/.omicos/tenants/t/f",
    ] {
        let (code, out, _) = run(&sb, &place, &script(attempt)).await;
        assert_ne!(code, Some(0), "`{attempt}` worked: {out}");
    }
    assert_eq!(size(&store), store_size);
    assert_eq!(size(&trajectory), trajectory_size);
    assert!(!state.join("trajectories/x").exists());
    assert!(!state.join("tenants").exists());
    let wal = std::fs::read(state.join("sessions.db-wal")).unwrap();
    assert!(wal.len() == 2 << 20 && wal.iter().all(|b| *b == 2));

    // Writing past the bound is still stopped, by the box's own bytes.
    let (code, out, note) = run(
        &sb,
        &place,
        &script("for i in $(seq 100); do head -c 1048576 /dev/zero > {ws}/fill$i || exit 2; sleep 0.02; done; echo filled"),
    )
    .await;
    assert!(
        code != Some(0) && !out.contains("filled"),
        "100 MiB in a 16 MiB workspace: {code:?}"
    );
    let note = note.expect("the disk bound is named");
    assert!(note.contains("workspace_bytes"), "{note}");
    let written = std::fs::read_dir(&ws)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fill"))
        .count();
    assert!(
        (8..100).contains(&written),
        "{written} MiB written before the stop"
    );
    sb.end_session("acme", "s");
}
