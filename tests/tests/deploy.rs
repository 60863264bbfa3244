//! The deployment files in `deploy/` checked against the services themselves:
//! every container's environment is loaded by that binary's real config type
//! (so a renamed or misspelt `OMICOS_*` variable fails here, not silently in a
//! cluster), and the manifests hold what a replicated deployment needs —
//! probes, resources, disruption budgets, providers registering through the
//! runner Service, orchestrators balancing over every runner pod. The schemas
//! themselves are checked by `scripts/deploy-check.sh` (kubernetes-validate).

use omicos_servicekit::config::{ServiceConfig, Value, load_config_value, unknown_env};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn repo_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn s<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .filter(|k| !k.is_empty())
        .try_fold(v, |v, k| match k.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(k),
        })
}

fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    s(v, path).and_then(Value::as_str).unwrap_or("")
}

/// Loads `env` with the binary's own config type: it must load and validate,
/// and every `OMICOS_*` variable must be one the binary reads.
fn check_binary(bin: &str, what: &str, env: &[(String, String)]) {
    fn check<T: ServiceConfig>(what: &str, env: &[(String, String)]) {
        if let Err(e) = load_config_value::<T>(None, env, "") {
            panic!("{what}: its environment does not load: {e}");
        }
        let unknown = unknown_env::<T>(env);
        assert!(
            unknown.is_empty(),
            "{what}: variables the service does not read: {unknown:?}"
        );
    }
    match bin {
        "omicos-orchestrator" => check::<omicos_orchestrator::config::Config>(what, env),
        "omicos-tool-runner" => check::<omicos_tool_runner::config::Config>(what, env),
        "omicos-kernel" => check::<omicos_kernel::config::Config>(what, env),
        "omicos-web" => check::<omicos_web::config::Config>(what, env),
        "omicos-memory" => check::<omicos_memory::config::Config>(what, env),
        "omicos-image-gen" => check::<omicos_image_gen::config::Config>(what, env),
        other => panic!("{what}: runs {other}, which is not an omicos service binary"),
    }
}

fn get<'a>(env: &'a [(String, String)], name: &str) -> &'a str {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// `http://host:port` → (host, port).
fn host_port(url: &str) -> (String, u16) {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or_else(|| panic!("{url}: not an http(s) URL"));
    let (host, port) = rest
        .trim_end_matches('/')
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{url}: no port"));
    (host.to_owned(), port.parse().unwrap_or_else(|_| panic!("{url}: bad port")))
}

// ------------------------------------------------------------------ Kubernetes

struct K8s {
    docs: Vec<Value>,
}

impl K8s {
    fn load() -> Self {
        let text = repo_file("deploy/k8s/omicos.yaml");
        let docs = serde_yaml::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).expect("deploy/k8s/omicos.yaml is YAML"))
            .filter(|v| !v.is_null())
            .collect();
        Self { docs }
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.docs.iter().filter(move |d| text(d, "kind") == kind)
    }

    fn named<'a>(&'a self, kind: &'a str, name: &str) -> Option<&'a Value> {
        self.of_kind(kind).find(|d| text(d, "metadata.name") == name)
    }

    fn workloads(&self) -> impl Iterator<Item = &Value> {
        self.docs
            .iter()
            .filter(|d| matches!(text(d, "kind"), "Deployment" | "StatefulSet"))
    }

    /// The workload whose container runs `bin`.
    fn running(&self, bin: &str) -> &Value {
        self.workloads()
            .find(|w| text(w, "spec.template.spec.containers.0.command.0") == bin)
            .unwrap_or_else(|| panic!("no workload runs {bin}"))
    }

    fn selects(selector: &Value, labels: &Value) -> bool {
        selector.as_mapping().is_some_and(|m| {
            !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
    }

    /// A container's environment as the kubelet builds it: secrets looked up
    /// in this file's Secret, downward-API fields given sample values, and
    /// `$(VAR)` expanded from the variables listed before it.
    fn env(&self, what: &str, container: &Value) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for e in s(container, "env").and_then(Value::as_sequence).into_iter().flatten() {
            let name = text(e, "name").to_owned();
            let raw = if let Some(v) = s(e, "value") {
                v.as_str().unwrap_or_else(|| panic!("{what}: {name} is not a string")).to_owned()
            } else if let Some(r) = s(e, "valueFrom.secretKeyRef") {
                let secret = self
                    .named("Secret", text(r, "name"))
                    .unwrap_or_else(|| panic!("{what}: {name} names a Secret the file does not define"));
                text(secret, &format!("stringData.{}", text(r, "key"))).to_owned()
            } else if let Some(f) = s(e, "valueFrom.fieldRef") {
                match text(f, "fieldPath") {
                    "metadata.name" => "omicos-pod-0".to_owned(),
                    "status.podIP" => "10.1.2.3".to_owned(),
                    p => panic!("{what}: {name} reads field {p}"),
                }
            } else {
                panic!("{what}: {name} has no value");
            };
            assert!(!raw.is_empty(), "{what}: {name} is empty");
            let mut v = raw.clone();
            for (k, val) in &out {
                v = v.replace(&format!("$({k})"), val);
            }
            assert!(!v.contains("$("), "{what}: {name}={raw} refers to a variable not defined before it");
            out.push((name, v));
        }
        out
    }
}

#[test]
fn k8s_every_container_environment_loads_in_its_service() {
    let k = K8s::load();
    let mut bins = Vec::new();
    for w in k.workloads() {
        let name = text(w, "metadata.name");
        for c in s(w, "spec.template.spec.containers").and_then(Value::as_sequence).unwrap() {
            let bin = text(c, "command.0");
            let what = format!("{name}/{}", text(c, "name"));
            check_binary(bin, &what, &k.env(&what, c));
            bins.push(bin.to_owned());
        }
    }
    for bin in ["omicos-orchestrator", "omicos-tool-runner", "omicos-kernel", "omicos-web", "omicos-memory"] {
        assert!(bins.iter().any(|b| b == bin), "no workload runs {bin}");
    }
}

#[test]
fn k8s_workloads_have_probes_resources_and_disruption_budgets() {
    let k = K8s::load();
    for w in k.workloads() {
        let name = text(w, "metadata.name");
        let labels = s(w, "spec.template.metadata.labels").unwrap();
        for c in s(w, "spec.template.spec.containers").and_then(Value::as_sequence).unwrap() {
            let ports: Vec<u64> = s(c, "ports")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(|p| s(p, "containerPort").and_then(Value::as_u64))
                .collect();
            let listen = k.env(name, c).iter().find(|(k, _)| k == "OMICOS_LISTEN").map(|(_, v)| v.clone());
            let listen_port: u64 = listen
                .as_deref()
                .and_then(|l| l.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or_else(|| panic!("{name}: no OMICOS_LISTEN with a port"));
            assert!(ports.contains(&listen_port), "{name}: listens on {listen_port}, exposes {ports:?}");
            for probe in ["readinessProbe", "livenessProbe"] {
                let port = s(c, &format!("{probe}.grpc.port")).and_then(Value::as_u64);
                assert_eq!(port, Some(listen_port), "{name}: {probe} must be a grpc probe on {listen_port}");
            }
            for r in ["requests.cpu", "requests.memory", "limits.cpu", "limits.memory"] {
                assert!(s(c, &format!("resources.{r}")).is_some(), "{name}: no resources.{r}");
            }
        }
        let pdb = k
            .of_kind("PodDisruptionBudget")
            .find(|p| K8s::selects(s(p, "spec.selector.matchLabels").unwrap(), labels));
        assert!(pdb.is_some(), "{name}: no PodDisruptionBudget selects its pods");
    }
    for svc in k.of_kind("Service") {
        let name = text(svc, "metadata.name");
        let sel = s(svc, "spec.selector").unwrap_or_else(|| panic!("service {name}: no selector"));
        let w = k
            .workloads()
            .find(|w| K8s::selects(sel, s(w, "spec.template.metadata.labels").unwrap()))
            .unwrap_or_else(|| panic!("service {name} selects no workload"));
        let target = s(svc, "spec.ports.0.targetPort").and_then(Value::as_u64).unwrap();
        let exposed = s(w, "spec.template.spec.containers.0.ports.0.containerPort").and_then(Value::as_u64);
        assert_eq!(exposed, Some(target), "service {name}: targetPort is not the pods' port");
    }
}

#[test]
fn k8s_is_replicated_and_providers_register_through_the_runner_service() {
    let k = K8s::load();
    let runner = k.running("omicos-tool-runner");
    let runner_labels = s(runner, "spec.template.metadata.labels").unwrap();
    let runner_service = |host: &str, port: u16, headless: bool| {
        let svc = k.named("Service", host).unwrap_or_else(|| panic!("{host}: no such Service"));
        assert!(
            K8s::selects(s(svc, "spec.selector").unwrap(), runner_labels),
            "Service {host} does not select the tool-runner pods"
        );
        assert_eq!(s(svc, "spec.ports.0.port").and_then(Value::as_u64), Some(u64::from(port)));
        assert_eq!(text(svc, "spec.clusterIP") == "None", headless, "Service {host}: headless must be {headless}");
    };
    let orch = k.running("omicos-orchestrator");
    assert!(s(orch, "spec.replicas").and_then(Value::as_u64) >= Some(2), "one orchestrator is not a replica set");
    let orch_env = k.env("orchestrator", s(orch, "spec.template.spec.containers.0").unwrap());
    // HTTP/2 pins a connection to one pod behind a ClusterIP: the orchestrators
    // resolve every runner pod through a headless Service and balance.
    let (host, port) = host_port(get(&orch_env, "OMICOS_TOOL_RUNNER"));
    runner_service(&host, port, true);
    assert!(get(&orch_env, "OMICOS_STORE_URL").starts_with("postgres://"), "orchestrators must share PostgreSQL");

    let runner_env = k.env("tool-runner", s(runner, "spec.template.spec.containers.0").unwrap());
    assert!(
        get(&runner_env, "OMICOS_REGISTRY_STORE_URL").starts_with("postgres://"),
        "runner replicas must share the registry through PostgreSQL, or a provider is known to one replica only"
    );
    let hpa = k.of_kind("HorizontalPodAutoscaler").find(|h| {
        text(h, "spec.scaleTargetRef.name") == text(runner, "metadata.name")
    });
    let hpa = hpa.expect("the tool-runner Deployment has no HorizontalPodAutoscaler");
    assert!(s(hpa, "spec.minReplicas").and_then(Value::as_u64) >= Some(2));

    for bin in ["omicos-kernel", "omicos-web", "omicos-memory"] {
        let w = k.running(bin);
        let c = s(w, "spec.template.spec.containers.0").unwrap();
        let env = k.env(bin, c);
        let (host, port) = host_port(get(&env, "OMICOS_REGISTRY"));
        runner_service(&host, port, false);
        let (adv_host, adv_port) = host_port(get(&env, "OMICOS_ADVERTISE"));
        assert_eq!(
            s(c, "ports.0.containerPort").and_then(Value::as_u64),
            Some(u64::from(adv_port)),
            "{bin}: advertises a port it does not expose"
        );
        if text(w, "kind") == "StatefulSet" {
            // <pod>.<governing headless service>: the stable per-pod name.
            let governing = text(w, "spec.serviceName");
            let svc = k.named("Service", governing).unwrap_or_else(|| panic!("{bin}: no Service {governing}"));
            assert_eq!(text(svc, "spec.clusterIP"), "None", "{bin}: {governing} must be headless");
            assert!(adv_host.ends_with(&format!(".{governing}")), "{bin}: advertises {adv_host}");
            assert!(s(w, "spec.replicas").and_then(Value::as_u64) >= Some(2), "{bin}: one kernel instance");
        } else {
            assert_eq!(adv_host, "10.1.2.3", "{bin}: a Deployment's pod advertises its own IP");
        }
    }
    let mem = k.env("memory", s(k.running("omicos-memory"), "spec.template.spec.containers.0").unwrap());
    assert!(
        get(&mem, "OMICOS_MEMORY_STORE_URL").starts_with("postgres://"),
        "replicated memory providers must share PostgreSQL"
    );
}

// --------------------------------------------------------------------- compose

fn compose() -> BTreeMap<String, Value> {
    let mut v: Value = serde_yaml::from_str(&repo_file("deploy/compose.yaml")).expect("compose.yaml is YAML");
    v.apply_merge().expect("compose.yaml merge keys");
    let services = s(&v, "services").and_then(Value::as_mapping).expect("compose.yaml: services");
    services
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.clone()))
        .collect()
}

/// A compose service's environment, `${VAR:-default}` taken at its default.
fn compose_env(svc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in s(svc, "environment").and_then(Value::as_mapping).into_iter().flatten() {
        let raw = match v {
            Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other).unwrap().trim().to_owned(),
        };
        let expanded = omicos_servicekit::config::expand_vars(&raw, &[]);
        out.push((k.as_str().unwrap().to_owned(), expanded));
    }
    out
}

#[test]
fn compose_is_as_complete_as_the_cluster_manifests() {
    let services = compose();
    let k = K8s::load();
    let mut count: BTreeMap<String, u64> = BTreeMap::new();
    for (name, svc) in &services {
        let Some(bin) = s(svc, "command.0").and_then(Value::as_str) else {
            continue;
        };
        let env = compose_env(svc);
        check_binary(bin, &format!("compose {name}"), &env);
        let replicas = s(svc, "deploy.replicas").and_then(Value::as_u64).unwrap_or(1);
        *count.entry(bin.to_owned()).or_default() += replicas;
        let listen_port = get(&env, "OMICOS_LISTEN").rsplit_once(':').map(|(_, p)| p.to_owned()).unwrap();
        let health = s(svc, "healthcheck.test")
            .and_then(Value::as_sequence)
            .map(|t| t.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        assert!(
            health.contains("omicos health") && health.ends_with(&format!(":{listen_port}")),
            "compose {name}: no healthcheck asking its own port {listen_port} (has `{health}`)"
        );
        let registry = get(&env, "OMICOS_REGISTRY");
        if !registry.is_empty() {
            let (host, _) = host_port(registry);
            assert_eq!(
                s(&services[&host], "command.0").and_then(Value::as_str),
                Some("omicos-tool-runner"),
                "compose {name}: registers with {host}, not the tool-runners"
            );
            let (adv_host, _) = host_port(get(&env, "OMICOS_ADVERTISE"));
            assert_eq!(&adv_host, name, "compose {name}: advertises another service's name");
        }
        if bin == "omicos-tool-runner" {
            assert!(get(&env, "OMICOS_REGISTRY_STORE_URL").starts_with("postgres://"), "compose {name}: the registry is not shared");
        }
        if bin == "omicos-orchestrator" {
            assert!(get(&env, "OMICOS_STORE_URL").starts_with("postgres://"));
            let (host, _) = host_port(get(&env, "OMICOS_TOOL_RUNNER"));
            assert_eq!(s(&services[&host], "command.0").and_then(Value::as_str), Some("omicos-tool-runner"));
        }
    }
    for w in k.workloads() {
        let bin = text(w, "spec.template.spec.containers.0.command.0");
        let k8s_replicas = s(w, "spec.replicas").and_then(Value::as_u64).unwrap_or(1);
        // The roles whose replicas the cluster tests exercise run twice on one
        // machine too; stateless providers once.
        let replicated = matches!(bin, "omicos-orchestrator" | "omicos-tool-runner" | "omicos-kernel");
        let want = if replicated { k8s_replicas.min(2) } else { 1 };
        assert!(
            count.get(bin).copied().unwrap_or(0) >= want,
            "compose runs {:?} of {bin}; the cluster manifests run {k8s_replicas}",
            count.get(bin)
        );
    }
    assert!(services.contains_key("postgres"), "compose has no PostgreSQL for the shared state");
}
