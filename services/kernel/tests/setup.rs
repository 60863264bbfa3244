//! `setup_venv` (what `omicos kernel setup` runs) makes a venv whose kernel
//! starts, and `.kernel_choice` makes a workspace use it.

mod common;

use omicos_kernel::{KernelConfig, KernelProvider, setup_venv, write_kernel_choice};

#[tokio::test]
async fn setup_venv_then_kernel_choice_runs_a_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let python = tokio::task::spawn_blocking(move || setup_venv(&d))
        .await
        .unwrap()
        .expect("setup_venv (needs python3 on PATH and PyPI)");
    assert_eq!(python, dir.path().join(".venv/bin/python3"));
    let ws = tempfile::tempdir().unwrap();
    write_kernel_choice(ws.path(), &python).unwrap();
    // No configured interpreter and no environment: `.kernel_choice` decides.
    let cfg = KernelConfig {
        python: String::new(),
        pool_size: 0,
        ..Default::default()
    };
    let p = KernelProvider::new(cfg, ws.path().canonicalize().unwrap(), vec![]).unwrap();
    let r = common::run(&p, &ws, "v", "import sys\nsys.executable")
        .await
        .unwrap();
    assert!(
        common::value(&r).contains(&dir.path().join(".venv/bin/python").display().to_string()),
        "{r}"
    );
    p.close().await;
}
