//! Agent sources, precedence, tier gating, broken files, the team rules and
//! the system prompt, on real directories.

use omicos_catalog::{AgentSource, Catalog, CatalogConfig, TeamError, Tier, runtime_toolsets};
use std::path::{Path, PathBuf};

struct Dirs {
    _tmp: tempfile::TempDir,
    ws: PathBuf,
    cache: PathBuf,
    skills_cache: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let cache = tmp.path().join("cloud-agents");
    let skills_cache = tmp.path().join("cloud-skills");
    std::fs::create_dir_all(&ws).unwrap();
    Dirs {
        ws,
        cache,
        skills_cache,
        _tmp: tmp,
    }
}

fn config(d: &Dirs, tier: Tier) -> CatalogConfig {
    let mut c = CatalogConfig::new(&d.ws, tier);
    c.agent_cache_dir = Some(d.cache.clone());
    c.skill_cache_dir = Some(d.skills_cache.clone());
    c
}

fn agent(dir: &Path, id: &str, extra: &str, body: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(format!("{id}.md")),
        format!(
            "---\nid: {id}\nname: {id} name\ndescription: {id} does things\n{extra}---\n\n{body}\n"
        ),
    )
    .unwrap();
}

#[test]
fn precedence_across_the_four_sources_and_tier_gating() {
    let d = dirs();
    let wsa = d.ws.join("agents");
    let legacy = d.ws.join(".omicos/agents");
    // `generalist` is defined by all four sources, `shared` by three, and so on.
    agent(&wsa, "generalist", "", "workspace generalist");
    agent(&legacy, "generalist", "", "legacy generalist");
    agent(&d.cache, "generalist", "", "cache generalist");
    agent(&wsa, "shared", "", "workspace shared");
    agent(&legacy, "shared", "", "legacy shared");
    agent(&d.cache, "shared", "", "cache shared");
    agent(&d.cache, "cached_only", "", "cache only");
    agent(&wsa, "ws_only", "", "workspace only");
    agent(&d.cache, "premium", "tier: pro_cloud\n", "premium");

    // Below lab, `<workspace>/agents` is not read at all.
    let (cat, warnings) = Catalog::load(config(&d, Tier::Community));
    assert!(warnings.is_empty(), "{warnings:?}");
    let g = cat.get("generalist").unwrap();
    assert_eq!(
        (g.source, g.prompt.as_str()),
        (AgentSource::LegacyWorkspace, "legacy generalist")
    );
    assert_eq!(
        cat.get("shared").unwrap().source,
        AgentSource::LegacyWorkspace
    );
    assert_eq!(cat.get("cached_only").unwrap().source, AgentSource::Cache);
    assert!(cat.get("ws_only").is_none());
    let da = cat.get("data_analyst").unwrap();
    assert_eq!(da.source, AgentSource::Builtin);
    assert_eq!(da.origin, "builtin:data_analyst.md");
    // Above the tier: listed, locked, and cannot be made active.
    let p = cat.get("premium").unwrap();
    assert!(p.locked);
    assert!(cat.agents().iter().any(|a| a.id == "premium" && a.locked));
    assert_eq!(
        cat.resolve_team(&[], "premium").unwrap_err(),
        TeamError::Locked {
            id: "premium".into(),
            required: Tier::ProCloud,
            deployment: Tier::Community
        }
    );
    // ListAgents carries the flag and the source.
    let info = p.to_info();
    assert!(info.locked);
    assert_eq!(
        (info.source.as_str(), info.tier.as_str()),
        ("cache", "pro_cloud")
    );

    // At lab, the workspace wins over everything.
    let (cat, _) = Catalog::load(config(&d, Tier::Lab));
    let g = cat.get("generalist").unwrap();
    assert_eq!(
        (g.source, g.prompt.as_str()),
        (AgentSource::Workspace, "workspace generalist")
    );
    assert_eq!(cat.get("shared").unwrap().prompt, "workspace shared");
    assert_eq!(cat.get("ws_only").unwrap().source, AgentSource::Workspace);
    assert!(!cat.get("premium").unwrap().locked);
    assert_eq!(
        cat.resolve_team(&[], "premium").unwrap().active.id,
        "premium"
    );

    // Without the legacy directory, the cache wins over the built-in catalog.
    std::fs::remove_dir_all(&legacy).unwrap();
    let (cat, _) = Catalog::load(config(&d, Tier::Community));
    assert_eq!(cat.get("generalist").unwrap().prompt, "cache generalist");
    // Without the cache, the built-in one is there.
    let mut c = config(&d, Tier::Community);
    c.agent_cache_dir = None;
    let (cat, _) = Catalog::load(c.clone());
    assert_eq!(cat.get("generalist").unwrap().source, AgentSource::Builtin);
    assert!(
        cat.get("generalist")
            .unwrap()
            .prompt
            .contains("You are **Generalist**")
    );
    c.builtin_agents = false;
    let (cat, _) = Catalog::load(c);
    assert!(cat.agents().is_empty());
    // An empty catalog still gives a team: a placeholder.
    let t = cat.resolve_team(&[], "").unwrap();
    assert_eq!(t.active.source, AgentSource::Placeholder);
}

#[test]
fn broken_agent_files_are_skipped_with_file_and_line() {
    let d = dirs();
    let legacy = d.ws.join(".omicos/agents");
    agent(&legacy, "good", "", "fine");
    // Line 4 of the file holds the broken flow sequence.
    std::fs::write(
        legacy.join("broken.md"),
        "---\nid: broken\nname: Broken\ntoolsets: [web, \n---\nbody\n",
    )
    .unwrap();
    std::fs::write(legacy.join("noid.md"), "---\nname: Nameless\n---\nbody\n").unwrap();
    std::fs::write(legacy.join("plain.md"), "just markdown, no frontmatter\n").unwrap();
    std::fs::write(
        legacy.join("badtype.md"),
        "---\nid: badtype\ncategory_order: first\n---\nbody\n",
    )
    .unwrap();
    std::fs::write(
        legacy.join("typo.md"),
        "---\nid: typo\ntoolset: [web]\ntoolsets: [web, teleport]\n---\nbody\n",
    )
    .unwrap();
    std::fs::write(legacy.join("notes.txt"), "not an agent").unwrap();
    let (cat, warnings) = Catalog::load(config(&d, Tier::Community));
    let path = |f: &str| legacy.join(f).display().to_string();
    let has = |needle: &str| warnings.iter().any(|w| w.contains(needle));
    assert!(
        has(&format!("{}:4", path("broken.md"))) || has(&format!("{}:5", path("broken.md"))),
        "{warnings:#?}"
    );
    assert!(
        has(&format!(
            "{}:1: skipped: the frontmatter has no `id`",
            path("noid.md")
        )),
        "{warnings:#?}"
    );
    assert!(
        has(&format!(
            "{}:1: skipped: no YAML frontmatter",
            path("plain.md")
        )),
        "{warnings:#?}"
    );
    assert!(has(&format!("{}:3", path("badtype.md"))), "{warnings:#?}");
    // Loaded, with the unknown key and the unknown toolset reported once each.
    assert!(
        has(&format!("{}:3: unknown key `toolset`", path("typo.md"))),
        "{warnings:#?}"
    );
    assert_eq!(
        warnings
            .iter()
            .filter(|w| w.contains("unknown toolset `teleport`"))
            .count(),
        1,
        "{warnings:#?}"
    );
    assert_eq!(cat.get("typo").unwrap().toolsets, vec!["web"]);
    assert!(cat.get("good").is_some());
    assert!(cat.get("broken").is_none() && cat.get("badtype").is_none());
    assert_eq!(warnings.len(), 6, "{warnings:#?}");
    // The built-in catalog itself loads without a single warning.
    assert!(
        !warnings.iter().any(|w| w.contains("builtin:")),
        "{warnings:#?}"
    );
}

#[test]
fn the_seed_literature_scout_loads_as_written() {
    let d = dirs();
    let seed = include_str!("fixtures/literature_scout_seed.md");
    std::fs::create_dir_all(&d.cache).unwrap();
    std::fs::write(d.cache.join("literature_scout.md"), seed).unwrap();
    let (cat, warnings) = Catalog::load(config(&d, Tier::Community));
    assert!(warnings.is_empty(), "{warnings:#?}");
    let a = cat.get("literature_scout").unwrap();
    assert_eq!(a.source, AgentSource::Cache);
    assert_eq!(
        a.toolsets,
        ["file_manager", "web", "plan", "think", "task", "memory"]
    );
    for t in &a.toolsets {
        let tools = omicos_toolkit::toolsets::group(t)
            .unwrap_or_else(|| panic!("toolset {t} does not resolve"));
        assert!(!tools.is_empty());
    }
    assert_eq!(
        a.skills,
        [
            "pubmed-search",
            "biorxiv-monitor",
            "retraction-check",
            "source-comparison"
        ]
    );
    assert_eq!(
        (
            a.icon.as_str(),
            a.tier,
            a.category.as_str(),
            a.category_order
        ),
        ("🔍", Tier::Community, "literature", 2)
    );
    assert_eq!(a.example_prompts.len(), 2);
    assert!(a.prompt.starts_with("You are **Literature Scout**"));
    // The built-in literature_scout carries the seed's frontmatter unchanged.
    let mut c = config(&d, Tier::Community);
    c.agent_cache_dir = None;
    let (cat, _) = Catalog::load(c);
    let b = cat.get("literature_scout").unwrap();
    assert_eq!(b.source, AgentSource::Builtin);
    assert_eq!(
        (
            &b.name,
            &b.icon,
            b.tier,
            &b.category,
            b.category_order,
            &b.summary,
            &b.use_when,
            &b.example_prompts,
            &b.toolsets,
            &b.skills
        ),
        (
            &a.name,
            &a.icon,
            a.tier,
            &a.category,
            a.category_order,
            &a.summary,
            &a.use_when,
            &a.example_prompts,
            &a.toolsets,
            &a.skills
        )
    );
    // UI-only fields never enter a prompt.
    let team = cat
        .resolve_team(&["literature_scout".into(), "generalist".into()], "")
        .unwrap();
    let prompt = cat.system_prompt(&team);
    assert!(!prompt.contains(&b.summary) && !prompt.contains(&b.use_when));
    assert!(
        !b.example_prompts
            .iter()
            .any(|p| prompt.contains(p.as_str()))
    );
}

#[test]
fn builtin_catalog_order_and_toolsets() {
    let d = dirs();
    let (cat, warnings) = Catalog::load(config(&d, Tier::Community));
    assert!(warnings.is_empty(), "{warnings:#?}");
    let ids: Vec<String> = cat.agents().into_iter().map(|a| a.id).collect();
    assert_eq!(ids[0], "generalist", "{ids:?}");
    for want in ["data_analyst", "literature_scout", "coder"] {
        assert!(ids.iter().any(|i| i == want), "{ids:?}");
    }
    let g = cat.get("generalist").unwrap();
    assert_eq!(g.toolsets, ["file_manager", "think", "task", "plan"]);
    let da = cat.get("data_analyst").unwrap();
    assert!(
        da.toolsets.contains(&"integrated_notebook".to_string())
            && da.toolsets.contains(&"file_manager".to_string())
    );
    for a in cat.agents() {
        assert!(a.prompt.len() > 500, "{} has no real prompt", a.id);
        assert!(!a.description.is_empty(), "{} has no description", a.id);
    }
}

#[test]
fn team_rules() {
    let d = dirs();
    agent(&d.cache, "premium", "tier: enterprise\n", "premium");
    let (cat, _) = Catalog::load(config(&d, Tier::Community));
    let ids = |t: &omicos_catalog::Team| t.agents.iter().map(|a| a.id.clone()).collect::<Vec<_>>();

    // Non-empty members: exactly those, in order; the first is active.
    let t = cat
        .resolve_team(&["data_analyst".into(), "coder".into()], "")
        .unwrap();
    assert_eq!(ids(&t), ["data_analyst", "coder"]);
    assert_eq!(t.active.id, "data_analyst");
    let t = cat
        .resolve_team(
            &["data_analyst".into(), "coder".into(), "data_analyst".into()],
            "coder",
        )
        .unwrap();
    assert_eq!(
        (ids(&t), t.active.id.as_str()),
        (
            vec!["data_analyst".to_string(), "coder".to_string()],
            "coder"
        )
    );

    // Empty members: the whole catalog without locked agents; generalist first.
    let t = cat.resolve_team(&[], "").unwrap();
    assert_eq!(t.active.id, "generalist");
    let all: Vec<String> = cat
        .agents()
        .into_iter()
        .filter(|a| !a.locked)
        .map(|a| a.id)
        .collect();
    assert_eq!(ids(&t), all);
    assert!(!ids(&t).contains(&"premium".to_string()));

    // Unknown ids become placeholders, as members and as the active agent.
    let t = cat
        .resolve_team(&["gone_agent".into(), "coder".into()], "")
        .unwrap();
    assert_eq!(t.active.id, "gone_agent");
    assert_eq!(t.active.source, AgentSource::Placeholder);
    assert!(!t.active.prompt.is_empty());
    let t = cat.resolve_team(&["coder".into()], "deleted_one").unwrap();
    assert_eq!(t.active.id, "deleted_one");
    assert_eq!(ids(&t), ["deleted_one", "coder"]);
    // An active catalog agent outside the members joins the team.
    let t = cat.resolve_team(&["coder".into()], "data_analyst").unwrap();
    assert_eq!(ids(&t), ["data_analyst", "coder"]);

    // Locked: never active, left out as a member.
    assert!(matches!(
        cat.resolve_team(&["coder".into(), "premium".into()], "premium"),
        Err(TeamError::Locked { .. })
    ));
    let t = cat
        .resolve_team(&["premium".into(), "coder".into()], "")
        .unwrap();
    assert_eq!(
        (ids(&t), t.skipped_locked.clone()),
        (vec!["coder".to_string()], vec!["premium".to_string()])
    );
    let e = cat.resolve_team(&["premium".into()], "").unwrap_err();
    assert!(matches!(e, TeamError::AllLocked { .. }));
    assert!(e.to_string().contains("premium"));

    // The prompt: the active body, then its teammates (not itself).
    let t = cat
        .resolve_team(
            &["generalist".into(), "data_analyst".into(), "gone".into()],
            "",
        )
        .unwrap();
    let p = cat.system_prompt(&t);
    assert!(p.starts_with(&t.active.prompt));
    assert!(p.contains("## Available agents"));
    let da = cat.get("data_analyst").unwrap();
    assert!(
        p.contains(&format!(
            "- `data_analyst` ({}): {}",
            da.name, da.description
        )),
        "{p}"
    );
    assert!(p.contains("- `gone` (gone): A general assistant."), "{p}");
    assert!(!p.contains("- `generalist`"));
    // Alone: no teammates section.
    let solo = cat.resolve_team(&["coder".into()], "").unwrap();
    assert!(!cat.system_prompt(&solo).contains("Available agents"));
    // with_active switches for a delegation sub-turn.
    let sub = t.with_active("data_analyst").unwrap();
    assert_eq!(sub.active.id, "data_analyst");
    assert!(cat.system_prompt(&sub).contains("- `generalist`"));
    assert!(t.with_active("nobody").is_none());
    // list_agents: the team, for the model (no UI-only fields).
    let l = t.listing();
    assert_eq!(l["agents"].as_array().unwrap().len(), 3);
    assert_eq!(l["agents"][0]["id"], "generalist");
    assert_eq!(l["agents"][0]["active"], true);
    assert_eq!(l["agents"][1]["active"], false);
    assert!(l["agents"][0].get("summary").is_none());

    // Run-time toolsets: team with ≥2 agents, skill when skills exist, memory always.
    let g = cat.get("generalist").unwrap();
    assert_eq!(
        runtime_toolsets(&g, 1, false),
        ["file_manager", "think", "task", "plan", "memory"]
    );
    assert_eq!(
        runtime_toolsets(&g, 2, true),
        [
            "file_manager",
            "think",
            "task",
            "plan",
            "team",
            "skill",
            "memory"
        ]
    );
    let ls = cat.get("literature_scout").unwrap();
    assert_eq!(
        runtime_toolsets(&ls, 3, false),
        [
            "file_manager",
            "web",
            "plan",
            "think",
            "task",
            "memory",
            "team"
        ]
    );
    // No skills on disk here: the catalog method leaves `skill` out.
    assert_eq!(
        cat.runtime_toolsets(&g, 2),
        ["file_manager", "think", "task", "plan", "team", "memory"]
    );
}

#[test]
fn refresh_sees_changes_and_shared_clones_agree() {
    let d = dirs();
    let legacy = d.ws.join(".omicos/agents");
    let (cat, _) = Catalog::load(config(&d, Tier::Community));
    let other = cat.clone();
    let before = cat.snapshot();
    assert!(cat.get("fresh").is_none());
    agent(&legacy, "fresh", "", "new agent");
    let report = cat.refresh();
    assert_eq!(report.agents, before.agents.len() + 1);
    assert_eq!(other.get("fresh").unwrap().prompt, "new agent");
    // A snapshot taken before keeps its own view for the rest of a turn.
    assert!(!before.agents.iter().any(|a| a.id == "fresh"));
    // Readers on other threads during reloads always see a whole catalog.
    std::thread::scope(|s| {
        for _ in 0..4 {
            let c = cat.clone();
            s.spawn(move || {
                for _ in 0..200 {
                    assert!(c.get("generalist").is_some());
                }
            });
        }
        for _ in 0..20 {
            cat.refresh();
        }
    });
    let proto = report.to_proto();
    assert_eq!(proto.agents as usize, report.agents);
}
