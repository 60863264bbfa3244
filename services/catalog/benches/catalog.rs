//! What the catalog costs: a full (re)load against reading the same files raw,
//! and the per-turn work (team, prompt, toolsets) against the reload it avoids.
//!
//! `cargo bench -p omicos-catalog --bench catalog`

use omicos_catalog::{Catalog, CatalogConfig, SkillProvider, Tier};
use omicos_toolkit::{CallCtx, Provider};
use std::path::Path;
use std::time::{Duration, Instant};

const AGENTS: usize = 200;
const SKILLS: usize = 300;

fn median(mut f: impl FnMut(), runs: usize) -> Duration {
    let mut v: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[runs / 2]
}

fn raw_read(dirs: &[&Path]) -> usize {
    let mut bytes = 0;
    for d in dirs {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            let f = if p.is_dir() { p.join("SKILL.md") } else { p };
            bytes += std::fs::read_to_string(f).map(|s| s.len()).unwrap_or(0);
        }
    }
    bytes
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let agents = tmp.path().join("agents");
    let skills = tmp.path().join("skills");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&agents).unwrap();
    let prompt = "You are a specialist. Work step by step and report what you did.\n".repeat(40);
    for i in 0..AGENTS {
        std::fs::write(
            agents.join(format!("a{i:03}.md")),
            format!(
                "---\nid: a{i:03}\nname: Agent {i}\ntier: community\ncategory: c{}\ncategory_order: {i}\nsummary: s\nuse_when: u\nexample_prompts: [\"x\", \"y\"]\ntoolsets: [file_manager, web, think, task]\nskills: \"*\"\ndescription: Agent number {i}.\n---\n\n{prompt}",
                i % 7
            ),
        )
        .unwrap();
    }
    let body = "1. Do this.\n2. Then that.\n".repeat(60);
    for i in 0..SKILLS {
        let d = skills.join(format!("skill-{i:03}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("SKILL.md"),
            format!(
                "---\nname: Skill {i}\ndescription: Does task {i} well.\ncategory: k\n---\n{body}"
            ),
        )
        .unwrap();
    }
    std::fs::write(skills.join("skill-000/data.bin"), vec![7u8; 1 << 20]).unwrap();
    let mut cfg = CatalogConfig::new(&ws, Tier::Lab);
    cfg.agent_cache_dir = Some(agents.clone());
    cfg.skill_cache_dir = Some(skills.clone());
    let (cat, warnings) = Catalog::load(cfg);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        (cat.agents().len(), cat.skills().len()),
        (AGENTS + 4, SKILLS)
    );

    let raw = median(|| assert!(raw_read(&[&agents, &skills]) > 0), 21);
    let reload = median(|| assert_eq!(cat.refresh().agents, AGENTS + 4), 21);
    println!("files: {AGENTS} agents + {SKILLS} skills");
    println!(
        "raw read of the same files : {:>9.3} ms",
        raw.as_secs_f64() * 1e3
    );
    println!(
        "catalog refresh()          : {:>9.3} ms  ({:.2}x raw read)",
        reload.as_secs_f64() * 1e3,
        reload.as_secs_f64() / raw.as_secs_f64()
    );

    let mut prompt_len = 0;
    let turn = median(
        || {
            let team = cat.resolve_team(&[], "").unwrap();
            let p = cat.system_prompt(&team);
            let t = cat.runtime_toolsets(&team.active, team.len());
            prompt_len = p.len() + t.len();
        },
        201,
    );
    println!(
        "per turn (team of {} + prompt with {SKILLS} skills + toolsets): {:>7.1} µs  ({:.4}x a reload, prompt {} bytes)",
        AGENTS + 4,
        turn.as_secs_f64() * 1e6,
        turn.as_secs_f64() / reload.as_secs_f64(),
        prompt_len
    );
    let small = median(
        || {
            let team = cat
                .resolve_team(&["a001".into(), "a002".into()], "")
                .unwrap();
            prompt_len = cat.system_prompt(&team).len();
        },
        201,
    );
    println!(
        "per turn (team of 2)       : {:>9.1} µs",
        small.as_secs_f64() * 1e6
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let provider = SkillProvider::new(cat.clone());
    let ctx = CallCtx::for_test(&ws, "bench");
    let file = skills.join("skill-000/data.bin");
    let raw_1mb = median(
        || assert_eq!(std::fs::read(&file).unwrap().len(), 1 << 20),
        21,
    );
    let res_1mb = median(
        || {
            let v = rt
                .block_on(provider.call(
                    "skill_resource",
                    serde_json::json!({"name": "skill-000", "relpath": "data.bin"}),
                    ctx.clone(),
                ))
                .unwrap();
            assert_eq!(v["encoding"], "base64");
        },
        21,
    );
    println!(
        "1 MiB binary: std::fs::read {:>7.3} ms; skill_resource (checks + base64) {:>7.3} ms ({:.2}x)",
        raw_1mb.as_secs_f64() * 1e3,
        res_1mb.as_secs_f64() * 1e3,
        res_1mb.as_secs_f64() / raw_1mb.as_secs_f64()
    );
}
