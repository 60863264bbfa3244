use omicos_sandbox::{Command, Placement, Sandbox, SandboxConfig, SandboxPolicy, Stdio};
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn smoke() {
    let sb = Sandbox::new(SandboxConfig::default()).unwrap();
    eprintln!("{:#?}", sb.report());
    let ws = tempfile::tempdir().unwrap();
    let place = Placement::new("t", "s1", ws.path(), SandboxPolicy::WorkspaceWrite);
    let mut cmd = Command::new("bash");
    cmd.args(["-c", "id; pwd; echo hi > f; ls -la /; ls /tmp; cat /proc/self/status | grep -i cap; echo $$; env"]).stdout(Stdio::Piped).stderr(Stdio::Piped);
    let mut p = sb.spawn(&place, cmd).await.unwrap();
    let mut out = String::new();
    p.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    let mut err = String::new();
    p.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    let st = p.wait().await.unwrap();
    eprintln!("status {st:?}\nOUT:\n{out}\nERR:\n{err}");
    p.end().await;
    assert!(st.success());
}
