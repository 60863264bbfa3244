//! Skills: roots and their priority, whitelists, the prompt section, and the
//! skill provider's three tools, including path traversal attempts.

use omicos_catalog::{Catalog, CatalogConfig, SkillProvider, SkillSource, Tier};
use omicos_toolkit::{CallCtx, Provider, ToolError};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const TOPICS: [&str; 22] = [
    "pubmed-search",
    "biorxiv-monitor",
    "retraction-check",
    "source-comparison",
    "scanpy-qc",
    "deseq2-bulk",
    "volcano-plot",
    "gsea-enrichment",
    "cell-annotation",
    "batch-correction",
    "trajectory-inference",
    "spatial-neighbors",
    "survival-analysis",
    "power-calculation",
    "primer-design",
    "blast-lookup",
    "pdb-fetch",
    "uniprot-lookup",
    "figure-style",
    "methods-writer",
    "citation-format",
    "data-dictionary",
];

fn skill(root: &Path, id: &str, front: &str, body: &str) -> PathBuf {
    let dir = root.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SKILL.md"), format!("---\n{front}---\n\n{body}\n")).unwrap();
    dir
}

struct Setup {
    _tmp: tempfile::TempDir,
    ws: PathBuf,
    env_root: PathBuf,
    cache: PathBuf,
}

/// A catalog cache of 22 skills, one whose `name` differs from its directory.
fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let cache = tmp.path().join("cloud-skills/skills");
    for id in TOPICS {
        let name = if id == "pubmed-search" {
            "PubMed Search".to_string()
        } else {
            id.to_string()
        };
        skill(
            &cache,
            id,
            &format!(
                "name: {name}\ndescription: How to do {} well.\ncategory: test\nsummary: UI text for {id}\n",
                id.replace('-', " ")
            ),
            &format!("# {id}\n\nStep 1 of {id}.\nStep 2."),
        );
    }
    Setup {
        env_root: tmp.path().join("env-skills"),
        ws,
        cache,
        _tmp: tmp,
    }
}

fn config(s: &Setup, tier: Tier) -> CatalogConfig {
    let env = vec![(
        "OMICOS_SKILL_ROOTS".to_string(),
        s.env_root.display().to_string(),
    )];
    let mut c = CatalogConfig::from_env_and_workspace(&s.ws, &env).unwrap();
    c.tier = tier;
    c.skill_cache_dir = Some(s.cache.clone());
    c.agent_cache_dir = Some(s.ws.join("no-cache"));
    c
}

fn ctx(ws: &Path, agent: &str) -> CallCtx {
    let mut c = CallCtx::for_test(ws, "s1");
    c.agent_id = agent.into();
    c
}

#[test]
fn a_catalog_of_many_skills_with_roots_in_priority_order() {
    let s = setup();
    // The configured root overrides the cache for the same id.
    skill(
        &s.env_root,
        "volcano-plot",
        "name: volcano-plot\ndescription: Env root version.\n",
        "env body",
    );
    // Workspace skills are read only at lab and above.
    skill(
        &s.ws.join("skills"),
        "ws-private",
        "name: Lab Protocol\ndescription: Our lab's protocol.\n",
        "ws body",
    );
    skill(
        &s.ws.join(".omicos/skills"),
        "legacy-ws",
        "description: Legacy workspace skill.\n",
        "legacy body",
    );
    // Not skills: a hidden directory, a directory without SKILL.md, a broken file.
    skill(&s.cache, ".hidden", "name: hidden\n", "x");
    std::fs::create_dir_all(s.cache.join("empty-dir")).unwrap();
    let broken = skill(&s.cache, "broken-skill", "name: [unclosed\n", "x");

    let (cat, warnings) = Catalog::load(config(&s, Tier::Community));
    let skills = cat.skills();
    assert_eq!(
        skills.len(),
        TOPICS.len(),
        "{:?}",
        skills.iter().map(|s| &s.id).collect::<Vec<_>>()
    );
    let broken_file = broken.join("SKILL.md").display().to_string();
    // The unclosed sequence opens on line 2; the parser notices at line 3.
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(&format!("{broken_file}:3: skipped"))),
        "{warnings:#?}"
    );
    let volcano = skills.iter().find(|s| s.id == "volcano-plot").unwrap();
    assert_eq!(
        (volcano.source, volcano.body.as_str()),
        (SkillSource::Configured, "env body")
    );
    let pubmed = skills.iter().find(|s| s.id == "pubmed-search").unwrap();
    assert_eq!(pubmed.name, "PubMed Search");
    assert_eq!(pubmed.summary, "UI text for pubmed-search");
    assert!(!skills.iter().any(|s| s.source == SkillSource::Workspace));

    let (cat, _) = Catalog::load(config(&s, Tier::Lab));
    let skills = cat.skills();
    assert_eq!(skills.len(), TOPICS.len() + 2);
    let ws = skills.iter().find(|s| s.id == "ws-private").unwrap();
    assert_eq!(
        (ws.name.as_str(), ws.source),
        ("Lab Protocol", SkillSource::Workspace)
    );
    let legacy = skills.iter().find(|s| s.id == "legacy-ws").unwrap();
    assert_eq!(
        legacy.name, "legacy-ws",
        "a skill without a name is named by its directory"
    );
}

#[test]
fn whitelists_filter_and_workspace_skills_are_always_visible() {
    let s = setup();
    skill(
        &s.ws.join("skills"),
        "ws-private",
        "name: Lab Protocol\ndescription: Our lab's protocol.\n",
        "ws body",
    );
    let (cat, _) = Catalog::load(config(&s, Tier::Lab));
    let scout = cat.get("literature_scout").unwrap();
    let mut visible: Vec<String> = cat.skills_for(&scout).into_iter().map(|s| s.id).collect();
    visible.sort();
    assert_eq!(
        visible,
        [
            "biorxiv-monitor",
            "pubmed-search",
            "retraction-check",
            "source-comparison",
            "ws-private"
        ]
    );
    // `*` means all.
    let g = cat.get("generalist").unwrap();
    assert_eq!(cat.skills_for(&g).len(), TOPICS.len() + 1);

    // The prompt lists name and description of the visible skills only.
    let team = cat.resolve_team(&["literature_scout".into()], "").unwrap();
    let p = cat.system_prompt(&team);
    assert!(p.contains("## Available skills"));
    assert!(
        p.contains("- **PubMed Search**: How to do pubmed search well."),
        "{p}"
    );
    assert!(p.contains("- **Lab Protocol**: Our lab's protocol."));
    assert!(!p.contains("volcano-plot"));
    assert!(!p.contains("UI text for"), "summary is for UIs only");
    // `memory` is already in the scout's own list, so it is not added twice.
    assert_eq!(
        cat.runtime_toolsets(&scout, 1),
        [
            "file_manager",
            "web",
            "plan",
            "think",
            "task",
            "memory",
            "skill"
        ]
    );
}

async fn call(p: &SkillProvider, tool: &str, args: Value, c: &CallCtx) -> Result<Value, ToolError> {
    p.validate_input(tool, &args, c)?;
    p.call(tool, args, c.clone()).await
}

#[tokio::test]
async fn lookup_and_load_a_skill() {
    let s = setup();
    let dir = s.cache.join("deseq2-bulk");
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(dir.join("scripts/run.R"), "library(DESeq2)\n").unwrap();
    std::fs::write(dir.join(".secret"), "no").unwrap();
    let (cat, _) = Catalog::load(config(&s, Tier::Community));
    let p = SkillProvider::new(cat.clone());
    let anyone = ctx(&s.ws, "generalist");

    let r = call(&p, "skill_lookup", json!({"query": "pubmed"}), &anyone)
        .await
        .unwrap();
    assert_eq!(r["skills"][0]["name"], "PubMed Search");
    assert_eq!(r["skills"][0]["id"], "pubmed-search");
    let r = call(
        &p,
        "skill_lookup",
        json!({"query": "plot", "limit": 1}),
        &anyone,
    )
    .await
    .unwrap();
    assert_eq!(r["skills"].as_array().unwrap().len(), 1);
    assert_eq!(r["skills"][0]["id"], "volcano-plot");
    let r = call(
        &p,
        "skill_lookup",
        json!({"query": "zzzz-nothing"}),
        &anyone,
    )
    .await
    .unwrap();
    assert_eq!(r["total"], 0);

    // By name or by id: the body between the markers, and the other files.
    for key in ["PubMed Search", "pubmed-search", "pubmed search"] {
        let out = call(&p, "skill", json!({"name": key}), &anyone)
            .await
            .unwrap();
        let text = out.as_str().unwrap();
        let body = text
            .split("----- BEGIN SKILL -----\n")
            .nth(1)
            .unwrap()
            .split("\n----- END SKILL -----")
            .next()
            .unwrap();
        assert_eq!(body, "# pubmed-search\n\nStep 1 of pubmed-search.\nStep 2.");
    }
    let out = call(&p, "skill", json!({"name": "deseq2-bulk"}), &anyone)
        .await
        .unwrap();
    let text = out.as_str().unwrap();
    assert!(
        text.contains("- scripts/run.R")
            && !text.contains(".secret")
            && !text.contains("- SKILL.md"),
        "{text}"
    );

    let e = call(&p, "skill", json!({"name": "nope"}), &anyone)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no skill named `nope`"));
    // The whitelist applies to the calling agent.
    let scout = ctx(&s.ws, "literature_scout");
    assert!(
        call(&p, "skill", json!({"name": "pubmed-search"}), &scout)
            .await
            .is_ok()
    );
    let e = call(&p, "skill", json!({"name": "volcano-plot"}), &scout)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("available: "), "{e}");
    let r = call(&p, "skill_lookup", json!({"query": "plot"}), &scout)
        .await
        .unwrap();
    assert_eq!(r["total"], 0);

    // The provider follows reloads of the shared catalog.
    skill(&s.cache, "brand-new", "description: Added later.\n", "new");
    cat.refresh();
    assert!(
        call(&p, "skill", json!({"name": "brand-new"}), &anyone)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn skill_resource_serves_text_binary_and_large_files() {
    let s = setup();
    let dir = s.cache.join("figure-style");
    std::fs::create_dir_all(dir.join("assets/sub")).unwrap();
    std::fs::write(dir.join("assets/style.mplstyle"), "axes.grid: True\n").unwrap();
    let png = [0x89u8, b'P', b'N', b'G', 0, 1, 2, 0xff];
    std::fs::write(dir.join("assets/logo.png"), png).unwrap();
    std::fs::write(dir.join("big.txt"), "é".repeat(600_000)).unwrap(); // 1.2 MB, 2-byte chars
    std::os::unix::fs::symlink("assets/style.mplstyle", dir.join("inner-link")).unwrap();
    let (cat, _) = Catalog::load(config(&s, Tier::Community));
    let p = SkillProvider::new(cat);
    let c = ctx(&s.ws, "generalist");

    let r = call(
        &p,
        "skill_resource",
        json!({"name": "figure-style", "relpath": "assets/style.mplstyle"}),
        &c,
    )
    .await
    .unwrap();
    assert_eq!(
        (
            r["encoding"].as_str(),
            r["content"].as_str(),
            r["truncated"].as_bool()
        ),
        (Some("utf-8"), Some("axes.grid: True\n"), Some(false))
    );
    let r = call(
        &p,
        "skill_resource",
        json!({"name": "figure-style", "relpath": "assets/logo.png"}),
        &c,
    )
    .await
    .unwrap();
    assert_eq!(r["encoding"], "base64");
    use base64::Engine;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(r["content"].as_str().unwrap())
            .unwrap(),
        png
    );
    let r = call(
        &p,
        "skill_resource",
        json!({"name": "figure-style", "relpath": "big.txt"}),
        &c,
    )
    .await
    .unwrap();
    assert_eq!(r["truncated"], true);
    assert_eq!(
        r["encoding"], "utf-8",
        "a cut in the middle of a character is still text"
    );
    assert_eq!(r["content"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(r["size"], 1_200_000);
    // A symlink that stays inside the skill is fine.
    let r = call(
        &p,
        "skill_resource",
        json!({"name": "figure-style", "relpath": "inner-link"}),
        &c,
    )
    .await
    .unwrap();
    assert_eq!(r["content"], "axes.grid: True\n");
    let e = call(
        &p,
        "skill_resource",
        json!({"name": "figure-style", "relpath": "missing.txt"}),
        &c,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("has no file"));
    let e = call(
        &p,
        "skill_resource",
        json!({"name": "figure-style", "relpath": "assets"}),
        &c,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("directory"));
}

#[tokio::test]
async fn skill_resource_refuses_traversal() {
    let s = setup();
    let dir = s.cache.join("figure-style");
    let outside = s.ws.join("secret.txt");
    std::fs::write(&outside, "top secret").unwrap();
    std::fs::write(s.cache.join("sibling.txt"), "sibling").unwrap();
    std::fs::create_dir_all(dir.join(".git")).unwrap();
    std::fs::write(dir.join(".git/config"), "x").unwrap();
    std::fs::write(dir.join(".env"), "KEY=1").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("escape")).unwrap();
    std::os::unix::fs::symlink(s.ws.as_path(), dir.join("wsdir")).unwrap();
    std::os::unix::fs::symlink("../", dir.join("up")).unwrap();
    std::os::unix::fs::symlink(".env", dir.join("env-link")).unwrap();
    let (cat, _) = Catalog::load(config(&s, Tier::Community));
    let p = SkillProvider::new(cat);
    let c = ctx(&s.ws, "generalist");
    let attempts = [
        ("../sibling.txt", "`..`"),
        ("assets/../../sibling.txt", "`..`"),
        ("..", "`..`"),
        (outside.to_str().unwrap(), "absolute"),
        ("/etc/passwd", "absolute"),
        (".env", "hidden"),
        (".git/config", "hidden"),
        ("assets/.hidden/x", "hidden"),
        ("escape", "out of the skill directory"),
        ("wsdir/secret.txt", "out of the skill directory"),
        ("up/sibling.txt", "out of the skill directory"),
        ("env-link", "hidden"),
        ("", "empty"),
        ("a\u{0}b", "NUL"),
    ];
    for (rel, why) in attempts {
        let e = call(
            &p,
            "skill_resource",
            json!({"name": "figure-style", "relpath": rel}),
            &c,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ToolError::InvalidInput(_)), "{rel:?}: {e}");
        assert!(e.to_string().contains(why), "{rel:?}: {e}");
        assert!(!e.to_string().contains("top secret"));
    }
    // The provider checks on its own too, when a caller skips validate_input.
    let e = p
        .call(
            "skill_resource",
            json!({"name": "figure-style", "relpath": "../sibling.txt"}),
            c.clone(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ToolError::InvalidInput(_)));
}
