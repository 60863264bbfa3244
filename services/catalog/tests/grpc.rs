//! The providers served over gRPC with `serve_provider` and called through
//! `RemoteProvider`: the same wire a separately deployed provider uses.

use omicos_catalog::{Catalog, CatalogConfig, PlanProvider, SkillProvider, TaskProvider, Tier};
use omicos_servicekit::Shutdown;
use omicos_toolkit::{
    CallCtx, Provider, ProviderHosting, Risk, remote::RemoteProvider, serve_provider,
};
use serde_json::json;
use std::{path::Path, sync::Arc, time::Duration};

async fn serve<P: Provider>(
    p: P,
    ws: &Path,
) -> (
    RemoteProvider,
    Shutdown,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = Shutdown::new(Duration::from_secs(1));
    let hosting = ProviderHosting {
        registry: None,
        advertise: None,
        workspace: ws.to_path_buf(),
        ttl_seconds: 0,
    };
    let server = tokio::spawn(serve_provider(
        Arc::new(p),
        listener,
        hosting,
        shutdown.clone(),
    ));
    let remote = RemoteProvider::connect(&format!("http://{addr}"))
        .await
        .unwrap();
    (remote, shutdown, server)
}

#[tokio::test]
async fn skill_task_and_plan_over_grpc() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let skills = tmp.path().join("skills");
    std::fs::create_dir_all(skills.join("pubmed-search/templates")).unwrap();
    std::fs::write(
        skills.join("pubmed-search/SKILL.md"),
        "---\nname: PubMed Search\ndescription: Search PubMed.\n---\nUse esearch, then efetch.\n",
    )
    .unwrap();
    std::fs::write(
        skills.join("pubmed-search/templates/query.txt"),
        "(term)[MeSH]",
    )
    .unwrap();
    std::fs::create_dir_all(skills.join("volcano-plot")).unwrap();
    std::fs::write(
        skills.join("volcano-plot/SKILL.md"),
        "---\ndescription: Plot.\n---\nPlot it.\n",
    )
    .unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let mut cfg = CatalogConfig::new(&ws, Tier::Community);
    cfg.agent_cache_dir = None;
    cfg.skill_cache_dir = Some(skills);
    let (cat, _) = Catalog::load(cfg);

    let (skill, s1, h1) = serve(SkillProvider::new(cat), &ws).await;
    assert_eq!(skill.name(), "skill");
    let names: Vec<String> = skill.tools().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["skill_lookup", "skill", "skill_resource"]);
    let mut ctx = CallCtx::for_test(&ws, "grpc-1");
    ctx.agent_id = "literature_scout".into();
    let text = skill
        .call("skill", json!({"name": "PubMed Search"}), ctx.clone())
        .await
        .unwrap();
    assert!(
        text.as_str()
            .unwrap()
            .contains("----- BEGIN SKILL -----\nUse esearch, then efetch.\n----- END SKILL -----")
    );
    let r = skill
        .call(
            "skill_resource",
            json!({"name": "pubmed-search", "relpath": "templates/query.txt"}),
            ctx.clone(),
        )
        .await
        .unwrap();
    assert_eq!(r["content"], "(term)[MeSH]");
    let e = skill
        .call(
            "skill_resource",
            json!({"name": "pubmed-search", "relpath": "../volcano-plot/SKILL.md"}),
            ctx.clone(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("`..` is not allowed"), "{e}");
    // The calling agent travels in the call context: the scout's whitelist applies.
    let e = skill
        .call("skill", json!({"name": "volcano-plot"}), ctx.clone())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no skill named"), "{e}");

    let (plan, s2, h2) = serve(PlanProvider, &ws).await;
    let spec = &plan.tools()[0];
    assert!(spec.always_ask, "the approval flag must survive the wire");
    assert_eq!(
        (spec.risk, spec.toolset.as_str()),
        (Risk::FileWrite as i32, "plan")
    );
    plan.call("plan", json!({"plan": "1. search\n2. read"}), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join(".omicos/plans/grpc-1.md")).unwrap(),
        "1. search\n2. read\n"
    );

    let (task, s3, h3) = serve(TaskProvider, &ws).await;
    task.call("task__create", json!({"title": "search"}), ctx.clone())
        .await
        .unwrap();
    let r = task
        .call(
            "task__update",
            json!({"id": 1, "status": "in_progress"}),
            ctx.clone(),
        )
        .await
        .unwrap();
    assert_eq!(r["counts"]["in_progress"], 1);

    for (s, h) in [(s1, h1), (s2, h2), (s3, h3)] {
        s.trigger();
        tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
