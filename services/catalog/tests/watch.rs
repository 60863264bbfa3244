//! The catalog reloads by itself when its files change.

use omicos_catalog::{Catalog, CatalogConfig, Tier};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Waits up to 10 s for `cond`: file events arrive asynchronously.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn file_changes_reload_the_catalog() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let skills = tmp.path().join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    let mut cfg = CatalogConfig::new(&ws, Tier::Lab);
    cfg.agent_cache_dir = Some(tmp.path().join("agents-cache"));
    cfg.skill_cache_dir = Some(skills.clone());
    cfg.watch_debounce = Duration::from_millis(100);
    let (cat, _) = Catalog::load(cfg);
    let reports = Arc::new(Mutex::new(Vec::new()));
    let seen = reports.clone();
    let watcher = cat
        .watch_with(move |r| seen.lock().unwrap().push(r.clone()))
        .unwrap();

    // `.omicos/agents` does not exist yet: creating it and a file in it is noticed.
    let legacy = ws.join(".omicos/agents");
    std::fs::create_dir_all(&legacy).unwrap();
    std::fs::write(
        legacy.join("late.md"),
        "---\nid: late\n---\nfirst version\n",
    )
    .unwrap();
    eventually("the new agent", || {
        cat.get("late").is_some_and(|a| a.prompt == "first version")
    });

    // Edits are picked up (the directory is now watched directly).
    std::fs::write(
        legacy.join("late.md"),
        "---\nid: late\n---\nsecond version\n",
    )
    .unwrap();
    eventually("the edited agent", || {
        cat.get("late")
            .is_some_and(|a| a.prompt == "second version")
    });

    // Workspace agents (tier lab) override it once they appear.
    std::fs::create_dir_all(ws.join("agents")).unwrap();
    std::fs::write(
        ws.join("agents/late.md"),
        "---\nid: late\n---\nworkspace version\n",
    )
    .unwrap();
    eventually("the workspace override", || {
        cat.get("late")
            .is_some_and(|a| a.prompt == "workspace version")
    });

    // Skills: a SKILL.md one level down in a watched root.
    std::fs::create_dir_all(skills.join("new-skill")).unwrap();
    std::fs::write(
        skills.join("new-skill/SKILL.md"),
        "---\ndescription: fresh\n---\nbody\n",
    )
    .unwrap();
    eventually("the new skill", || {
        cat.skills().iter().any(|s| s.id == "new-skill")
    });

    // Removal.
    std::fs::remove_file(ws.join("agents/late.md")).unwrap();
    std::fs::remove_file(legacy.join("late.md")).unwrap();
    eventually("the removal", || cat.get("late").is_none());

    // A burst of writes is debounced into few reloads, not one per write.
    let before = watcher.reloads();
    for i in 0..30 {
        std::fs::write(
            legacy.join(format!("burst{i}.md")),
            format!("---\nid: burst{i}\n---\nx\n"),
        )
        .unwrap();
    }
    eventually("the burst", || cat.get("burst29").is_some());
    std::thread::sleep(Duration::from_millis(300));
    let burst_reloads = watcher.reloads() - before;
    assert!(
        (1..=10).contains(&burst_reloads), // about 30 without debouncing
        "{burst_reloads} reloads for one burst"
    );
    assert!(!reports.lock().unwrap().is_empty());

    // Unrelated files in a watched ancestor do not reload.
    let before = watcher.reloads();
    std::fs::write(ws.join("notes.txt"), "unrelated").unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(watcher.reloads(), before);

    // After the handle is dropped, nothing reloads.
    drop(watcher);
    std::fs::write(legacy.join("after.md"), "---\nid: after\n---\nx\n").unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert!(cat.get("after").is_none());
}
