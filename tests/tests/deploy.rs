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
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
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
        let mut unknown = unknown_env::<T>(env);
        // Read by the provider hosting itself, outside the config type.
        unknown.retain(|k| !PROVIDER_PROCESS_ENV.contains(&k.as_str()));
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

/// The ports a container exposes (`ports[].containerPort`).
fn container_ports(c: &Value) -> Vec<u64> {
    s(c, "ports")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(|p| s(p, "containerPort").and_then(Value::as_u64))
        .collect()
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
    (
        host.to_owned(),
        port.parse().unwrap_or_else(|_| panic!("{url}: bad port")),
    )
}

// ------------------------------------------------------------------ Kubernetes

/// The documents of a multi-document YAML file of the repository.
fn yaml_docs(rel: &str) -> Vec<Value> {
    let text = repo_file(rel);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

struct K8s {
    docs: Vec<Value>,
}

impl K8s {
    fn load() -> Self {
        Self {
            docs: yaml_docs("deploy/k8s/omicos.yaml"),
        }
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.docs.iter().filter(move |d| text(d, "kind") == kind)
    }

    fn named<'a>(&'a self, kind: &'a str, name: &str) -> Option<&'a Value> {
        self.of_kind(kind)
            .find(|d| text(d, "metadata.name") == name)
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
        selector
            .as_mapping()
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }

    /// A container's environment as the kubelet builds it: secrets looked up
    /// in this file's Secret, downward-API fields given sample values, and
    /// `$(VAR)` expanded from the variables listed before it.
    fn env(&self, what: &str, container: &Value) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for e in s(container, "env")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let name = text(e, "name").to_owned();
            let raw = if let Some(v) = s(e, "value") {
                v.as_str()
                    .unwrap_or_else(|| panic!("{what}: {name} is not a string"))
                    .to_owned()
            } else if let Some(r) = s(e, "valueFrom.secretKeyRef") {
                let secret = self.named("Secret", text(r, "name")).unwrap_or_else(|| {
                    panic!("{what}: {name} names a Secret the file does not define")
                });
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
            assert!(
                !v.contains("$("),
                "{what}: {name}={raw} refers to a variable not defined before it"
            );
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
        for c in s(w, "spec.template.spec.containers")
            .and_then(Value::as_sequence)
            .unwrap()
        {
            let bin = text(c, "command.0");
            let what = format!("{name}/{}", text(c, "name"));
            check_binary(bin, &what, &k.env(&what, c));
            bins.push(bin.to_owned());
        }
    }
    for bin in [
        "omicos-orchestrator",
        "omicos-tool-runner",
        "omicos-kernel",
        "omicos-web",
        "omicos-memory",
    ] {
        assert!(bins.iter().any(|b| b == bin), "no workload runs {bin}");
    }
}

#[test]
fn k8s_workloads_have_probes_resources_and_disruption_budgets() {
    let k = K8s::load();
    for w in k.workloads() {
        let name = text(w, "metadata.name");
        let labels = s(w, "spec.template.metadata.labels").unwrap();
        for c in s(w, "spec.template.spec.containers")
            .and_then(Value::as_sequence)
            .unwrap()
        {
            let ports = container_ports(c);
            let listen = k
                .env(name, c)
                .iter()
                .find(|(k, _)| k == "OMICOS_LISTEN")
                .map(|(_, v)| v.clone());
            let listen_port: u64 = listen
                .as_deref()
                .and_then(|l| l.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or_else(|| panic!("{name}: no OMICOS_LISTEN with a port"));
            assert!(
                ports.contains(&listen_port),
                "{name}: listens on {listen_port}, exposes {ports:?}"
            );
            for probe in ["readinessProbe", "livenessProbe"] {
                let port = s(c, &format!("{probe}.grpc.port")).and_then(Value::as_u64);
                assert_eq!(
                    port,
                    Some(listen_port),
                    "{name}: {probe} must be a grpc probe on {listen_port}"
                );
            }
            for r in [
                "requests.cpu",
                "requests.memory",
                "limits.cpu",
                "limits.memory",
            ] {
                assert!(
                    s(c, &format!("resources.{r}")).is_some(),
                    "{name}: no resources.{r}"
                );
            }
        }
        let pdb = k
            .of_kind("PodDisruptionBudget")
            .find(|p| K8s::selects(s(p, "spec.selector.matchLabels").unwrap(), labels));
        assert!(
            pdb.is_some(),
            "{name}: no PodDisruptionBudget selects its pods"
        );
    }
    for svc in k.of_kind("Service") {
        let name = text(svc, "metadata.name");
        let sel = s(svc, "spec.selector").unwrap_or_else(|| panic!("service {name}: no selector"));
        let w = k
            .workloads()
            .find(|w| K8s::selects(sel, s(w, "spec.template.metadata.labels").unwrap()))
            .unwrap_or_else(|| panic!("service {name} selects no workload"));
        let target = s(svc, "spec.ports.0.targetPort")
            .and_then(Value::as_u64)
            .unwrap();
        let exposed = container_ports(s(w, "spec.template.spec.containers.0").unwrap());
        assert!(
            exposed.contains(&target),
            "service {name}: targetPort {target} is none of the pods' ports {exposed:?}"
        );
    }
}

#[test]
fn k8s_is_replicated_and_providers_register_through_the_runner_service() {
    let k = K8s::load();
    let runner = k.running("omicos-tool-runner");
    let runner_labels = s(runner, "spec.template.metadata.labels").unwrap();
    let runner_service = |host: &str, port: u16, headless: bool| {
        let svc = k
            .named("Service", host)
            .unwrap_or_else(|| panic!("{host}: no such Service"));
        assert!(
            K8s::selects(s(svc, "spec.selector").unwrap(), runner_labels),
            "Service {host} does not select the tool-runner pods"
        );
        assert_eq!(
            s(svc, "spec.ports.0.port").and_then(Value::as_u64),
            Some(u64::from(port))
        );
        assert_eq!(
            text(svc, "spec.clusterIP") == "None",
            headless,
            "Service {host}: headless must be {headless}"
        );
    };
    let orch = k.running("omicos-orchestrator");
    assert!(
        s(orch, "spec.replicas").and_then(Value::as_u64) >= Some(2),
        "one orchestrator is not a replica set"
    );
    let orch_env = k.env(
        "orchestrator",
        s(orch, "spec.template.spec.containers.0").unwrap(),
    );
    // HTTP/2 pins a connection to one pod behind a ClusterIP: the orchestrators
    // resolve every runner pod through a headless Service and balance.
    let (host, port) = host_port(get(&orch_env, "OMICOS_TOOL_RUNNER"));
    runner_service(&host, port, true);
    assert!(
        get(&orch_env, "OMICOS_STORE_URL").starts_with("postgres://"),
        "orchestrators must share PostgreSQL"
    );

    let runner_env = k.env(
        "tool-runner",
        s(runner, "spec.template.spec.containers.0").unwrap(),
    );
    assert!(
        get(&runner_env, "OMICOS_REGISTRY_STORE_URL").starts_with("postgres://"),
        "runner replicas must share the registry through PostgreSQL, or a provider is known to one replica only"
    );
    let hpa = k
        .of_kind("HorizontalPodAutoscaler")
        .find(|h| text(h, "spec.scaleTargetRef.name") == text(runner, "metadata.name"));
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
            let svc = k
                .named("Service", governing)
                .unwrap_or_else(|| panic!("{bin}: no Service {governing}"));
            assert_eq!(
                text(svc, "spec.clusterIP"),
                "None",
                "{bin}: {governing} must be headless"
            );
            assert!(
                adv_host.ends_with(&format!(".{governing}")),
                "{bin}: advertises {adv_host}"
            );
            assert!(
                s(w, "spec.replicas").and_then(Value::as_u64) >= Some(2),
                "{bin}: one kernel instance"
            );
        } else {
            assert_eq!(
                adv_host, "10.1.2.3",
                "{bin}: a Deployment's pod advertises its own IP"
            );
        }
    }
    let mem = k.env(
        "memory",
        s(
            k.running("omicos-memory"),
            "spec.template.spec.containers.0",
        )
        .unwrap(),
    );
    assert!(
        get(&mem, "OMICOS_MEMORY_STORE_URL").starts_with("postgres://"),
        "replicated memory providers must share PostgreSQL"
    );
}

// --------------------------------------------------------------------- compose

fn compose() -> BTreeMap<String, Value> {
    let mut v: Value =
        serde_yaml::from_str(&repo_file("deploy/compose.yaml")).expect("compose.yaml is YAML");
    v.apply_merge().expect("compose.yaml merge keys");
    let services = s(&v, "services")
        .and_then(Value::as_mapping)
        .expect("compose.yaml: services");
    services
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.clone()))
        .collect()
}

/// A compose service's environment, `${VAR:-default}` taken at its default.
fn compose_env(svc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in s(svc, "environment")
        .and_then(Value::as_mapping)
        .into_iter()
        .flatten()
    {
        let raw = match v {
            Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other).unwrap().trim().to_owned(),
        };
        // `${VAR:?why}`: compose refuses to start without VAR; here it is set.
        let required = regex_lite_required(&raw);
        let expanded = omicos_servicekit::config::expand_vars(&required, &compose_required());
        out.push((k.as_str().unwrap().to_owned(), expanded));
    }
    out
}

/// `${VAR:?message}` as `${VAR}` (expand_vars reads only `:-`).
fn regex_lite_required(raw: &str) -> String {
    let mut out = raw.to_owned();
    while let Some(i) = out.find(":?") {
        let Some(end) = out[i..].find('}') else { break };
        out.replace_range(i..i + end, "");
    }
    out
}

/// The values the required compose variables get here.
fn compose_required() -> Vec<(String, String)> {
    vec![
        ("OMICOS_SERVICE_SECRET".into(), COMPOSE_SECRET.into()),
        (
            "OMICOS_AUTH_API_KEYS".into(),
            format!(
                "[{{sha256: \"{}\", principal: me, tenant: default, max_mode: auto}}]",
                omicos_auth::sha256_hex("compose-key")
            ),
        ),
    ]
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
        let replicas = s(svc, "deploy.replicas")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        *count.entry(bin.to_owned()).or_default() += replicas;
        let listen_port = get(&env, "OMICOS_LISTEN")
            .rsplit_once(':')
            .map(|(_, p)| p.to_owned())
            .unwrap();
        let health = s(svc, "healthcheck.test")
            .and_then(Value::as_sequence)
            .map(|t| {
                t.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
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
            assert_eq!(
                &adv_host, name,
                "compose {name}: advertises another service's name"
            );
        }
        if bin == "omicos-tool-runner" {
            assert!(
                get(&env, "OMICOS_REGISTRY_STORE_URL").starts_with("postgres://"),
                "compose {name}: the registry is not shared"
            );
        }
        if bin == "omicos-orchestrator" {
            assert!(get(&env, "OMICOS_STORE_URL").starts_with("postgres://"));
            let (host, _) = host_port(get(&env, "OMICOS_TOOL_RUNNER"));
            assert_eq!(
                s(&services[&host], "command.0").and_then(Value::as_str),
                Some("omicos-tool-runner")
            );
        }
    }
    for w in k.workloads() {
        let bin = text(w, "spec.template.spec.containers.0.command.0");
        let k8s_replicas = s(w, "spec.replicas").and_then(Value::as_u64).unwrap_or(1);
        // The roles whose replicas the cluster tests exercise run twice on one
        // machine too; stateless providers once.
        let replicated = matches!(
            bin,
            "omicos-orchestrator" | "omicos-tool-runner" | "omicos-kernel"
        );
        let want = if replicated { k8s_replicas.min(2) } else { 1 };
        assert!(
            count.get(bin).copied().unwrap_or(0) >= want,
            "compose runs {:?} of {bin}; the cluster manifests run {k8s_replicas}",
            count.get(bin)
        );
    }
    assert!(
        services.contains_key("postgres"),
        "compose has no PostgreSQL for the shared state"
    );
}

// ------------------------------------------------------- secure as shipped

/// Variables a provider binary reads from the process environment outside
/// its config type (`omicos_toolkit::hosting::serve_provider` reads the
/// service secret itself).
const PROVIDER_PROCESS_ENV: [&str; 1] = ["OMICOS_SERVICE_SECRET"];

/// Every container takes the service secret from the Secret's
/// `service-secret` key, and the orchestrators take the clients' API keys
/// from it; the Secret holds both, and no key of it goes unused.
#[test]
fn k8s_every_container_takes_the_service_secret_and_clients_need_a_key() {
    let k = K8s::load();
    let secret = k.named("Secret", "omicos").expect("the Secret omicos");
    let mut used = std::collections::BTreeSet::new();
    for w in k.workloads() {
        let name = text(w, "metadata.name");
        for c in s(w, "spec.template.spec.containers")
            .and_then(Value::as_sequence)
            .unwrap()
        {
            let env = s(c, "env").and_then(Value::as_sequence).unwrap();
            let from_secret = |var: &str| {
                env.iter().find(|e| text(e, "name") == var).map(|e| {
                    (
                        text(e, "valueFrom.secretKeyRef.name").to_owned(),
                        text(e, "valueFrom.secretKeyRef.key").to_owned(),
                    )
                })
            };
            for e in env {
                if let Some(key) = s(e, "valueFrom.secretKeyRef.key").and_then(Value::as_str) {
                    used.insert(key.to_owned());
                }
            }
            assert_eq!(
                from_secret("OMICOS_SERVICE_SECRET"),
                Some(("omicos".to_owned(), "service-secret".to_owned())),
                "{name}: the service secret must come from the Secret"
            );
            if text(c, "command.0") == "omicos-orchestrator" {
                assert_eq!(
                    from_secret("OMICOS_AUTH_API_KEYS"),
                    Some(("omicos".to_owned(), "auth-api-keys".to_owned())),
                    "{name}: the clients' API keys must come from the Secret"
                );
                let env = k.env(name, c);
                let loaded = omicos_servicekit::config::load_config_value::<
                    omicos_orchestrator::config::Config,
                >(None, &env, "")
                .unwrap();
                assert!(loaded.auth.enabled, "{name}: client auth is off");
                assert!(
                    loaded
                        .auth
                        .api_keys
                        .iter()
                        .any(|key| key.sha256 == omicos_auth::sha256_hex(DOCUMENTED_KEY)),
                    "{name}: the key deploy/README.md documents is not configured"
                );
            }
        }
    }
    for key in s(secret, "stringData")
        .and_then(Value::as_mapping)
        .unwrap()
        .keys()
    {
        let key = key.as_str().unwrap();
        assert!(
            used.contains(key),
            "the Secret's {key} is referenced by no container"
        );
    }
}

/// Only orchestrators reach runners' ToolRunner port, only providers the
/// registry port the runners serve apart; only runners reach providers.
#[test]
fn k8s_network_policies_fence_runners_and_providers() {
    let k = K8s::load();
    let labels_of = |bin: &str| {
        s(k.running(bin), "spec.template.metadata.labels")
            .unwrap()
            .clone()
    };
    let port_of = |bin: &str| {
        s(
            k.running(bin),
            "spec.template.spec.containers.0.ports.0.containerPort",
        )
        .and_then(Value::as_u64)
        .unwrap()
    };
    // Who may reach `bin`'s `port`, by the binaries their pods run.
    let callers = |bin: &str, port: u64| -> std::collections::BTreeSet<String> {
        let labels = labels_of(bin);
        let policies: Vec<&Value> = k
            .of_kind("NetworkPolicy")
            .filter(|p| K8s::selects(s(p, "spec.podSelector.matchLabels").unwrap(), &labels))
            .collect();
        assert!(
            !policies.is_empty(),
            "{bin}: no NetworkPolicy selects its pods"
        );
        let mut out = std::collections::BTreeSet::new();
        for p in policies {
            assert!(
                s(p, "spec.policyTypes")
                    .and_then(Value::as_sequence)
                    .is_some_and(|t| t.iter().any(|x| x.as_str() == Some("Ingress"))),
                "{bin}: its policy does not govern ingress"
            );
            for rule in s(p, "spec.ingress").and_then(Value::as_sequence).unwrap() {
                let ports: Vec<u64> = s(rule, "ports")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                    .filter_map(|x| s(x, "port").and_then(Value::as_u64))
                    .collect();
                if !ports.is_empty() && !ports.contains(&port) {
                    continue;
                }
                let Some(from) = s(rule, "from").and_then(Value::as_sequence) else {
                    out.insert("anyone".to_owned());
                    continue;
                };
                for f in from {
                    let sel = s(f, "podSelector.matchLabels");
                    match sel.and_then(Value::as_mapping) {
                        Some(m) if !m.is_empty() => {
                            for w in k.workloads() {
                                if K8s::selects(
                                    sel.unwrap(),
                                    s(w, "spec.template.metadata.labels").unwrap(),
                                ) {
                                    out.insert(
                                        text(w, "spec.template.spec.containers.0.command.0")
                                            .to_owned(),
                                    );
                                }
                            }
                        }
                        _ => {
                            out.insert("anyone".to_owned());
                        }
                    }
                }
            }
        }
        out
    };
    let set = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
    let runner_env = k.env(
        "tool-runner",
        s(
            k.running("omicos-tool-runner"),
            "spec.template.spec.containers.0",
        )
        .unwrap(),
    );
    let registry_port: u64 = get(&runner_env, "OMICOS_REGISTRY_LISTEN")
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the runners serve the registry on a port of its own");
    let runner_port = port_of("omicos-tool-runner");
    assert_ne!(registry_port, runner_port);
    assert_eq!(
        callers("omicos-tool-runner", runner_port),
        set(&["omicos-orchestrator"]),
        "the runners' ToolRunner port"
    );
    assert_eq!(
        callers("omicos-tool-runner", registry_port),
        set(&["omicos-kernel", "omicos-web", "omicos-memory"]),
        "the runners' registry port"
    );
    for p in ["omicos-kernel", "omicos-web", "omicos-memory"] {
        assert_eq!(
            callers(p, port_of(p)),
            set(&["omicos-tool-runner"]),
            "{p}'s port"
        );
        // Providers are told the registry port, which is all they may reach.
        let env = k.env(
            p,
            s(k.running(p), "spec.template.spec.containers.0").unwrap(),
        );
        let (_, port) = host_port(get(&env, "OMICOS_REGISTRY"));
        assert_eq!(u64::from(port), registry_port, "{p} registers elsewhere");
    }
}

/// compose refuses to start without the service secret and the client keys,
/// and gives the secret to every part.
#[test]
fn compose_requires_the_service_secret_and_client_keys() {
    let text_of = repo_file("deploy/compose.yaml");
    assert!(
        text_of.contains("${OMICOS_SERVICE_SECRET:?"),
        "the secret is not required"
    );
    assert!(
        text_of.contains("${OMICOS_AUTH_API_KEYS:?"),
        "the keys are not required"
    );
    for (name, svc) in compose() {
        let Some(bin) = s(&svc, "command.0").and_then(Value::as_str) else {
            continue;
        };
        let env = compose_env(&svc);
        assert_eq!(
            get(&env, "OMICOS_SERVICE_SECRET"),
            COMPOSE_SECRET,
            "compose {name}: no service secret"
        );
        if bin == "omicos-orchestrator" {
            assert!(
                get(&env, "OMICOS_AUTH_API_KEYS").starts_with('['),
                "compose {name}: no client keys"
            );
        }
    }
}

/// The example key of the Secret, as deploy/README.md documents it.
const DOCUMENTED_KEY: &str = "CHANGE-ME-example-client-key";
/// What the required compose variables are set to here.
const COMPOSE_SECRET: &str = "compose-test-secret";

// ------------------------------------------------------- the mTLS variant

/// deploy/k8s-mtls rendered the way `kubectl apply -k deploy/k8s-mtls`
/// renders it: the documents of its `resources`, then each of its `patches`
/// (RFC 6902 operations, applied by the json-patch crate) on the one
/// document its target names. A key of kustomization.yaml this does not
/// render, a patch that targets no document (or several), and an operation
/// whose path does not exist or whose `test` fails all fail here, so a change
/// of ../k8s/omicos.yaml that silently breaks the overlay shows.
fn mtls() -> K8s {
    const DIR: &str = "deploy/k8s-mtls";
    let kust: Value = serde_yaml::from_str(&repo_file(&format!("{DIR}/kustomization.yaml")))
        .expect("kustomization.yaml is YAML");
    for key in kust
        .as_mapping()
        .expect("kustomization.yaml: a mapping")
        .keys()
    {
        let key = key.as_str().unwrap_or_default();
        assert!(
            matches!(key, "apiVersion" | "kind" | "resources" | "patches"),
            "kustomization.yaml: `{key}` is not rendered by this test (teach mtls() what it does)"
        );
    }
    let mut docs = vec![];
    for r in s(&kust, "resources")
        .and_then(Value::as_sequence)
        .expect("resources")
    {
        let r = r.as_str().expect("a resource is a path");
        docs.extend(yaml_docs(&format!("{DIR}/{r}")));
    }
    let patches = s(&kust, "patches")
        .and_then(Value::as_sequence)
        .expect("patches");
    assert!(!patches.is_empty(), "kustomization.yaml patches nothing");
    for (i, p) in patches.iter().enumerate() {
        let target = s(p, "target")
            .and_then(Value::as_mapping)
            .expect("a patch's target");
        for key in target.keys() {
            let key = key.as_str().unwrap_or_default();
            assert!(
                matches!(key, "kind" | "name"),
                "patch {i}: target.{key} is not rendered by this test"
            );
        }
        let (kind, name) = (text(p, "target.kind"), text(p, "target.name"));
        let what = format!("kustomization.yaml patch {i} ({kind} {name})");
        let ops: json_patch::Patch = serde_yaml::from_str(text(p, "patch"))
            .unwrap_or_else(|e| panic!("{what}: not a list of RFC 6902 operations: {e}"));
        assert!(!ops.is_empty(), "{what}: no operation");
        let hits: Vec<usize> = (0..docs.len())
            .filter(|&d| text(&docs[d], "kind") == kind && text(&docs[d], "metadata.name") == name)
            .collect();
        assert_eq!(
            hits.len(),
            1,
            "{what}: targets {} documents of the resources",
            hits.len()
        );
        let mut doc = serde_json::to_value(&docs[hits[0]]).unwrap();
        json_patch::patch(&mut doc, &ops)
            .unwrap_or_else(|e| panic!("{what} does not apply: {e} (operation {})", e.operation));
        docs[hits[0]] = serde_json::from_value(doc).unwrap();
    }
    K8s { docs }
}

/// Whether a TLS client (rustls, verifying as webpki does) accepts a
/// certificate naming `names` for the server name `host`; Err says why not.
fn certificate_covers(names: &[&str], host: &str) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
    let ca = omicos_e2e::pki::Ca::new("names check");
    let leaf = ca.leaf_for("names check", 1, names, &[]);
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    )
    .build()
    .unwrap();
    let server = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    verifier
        .verify_server_cert(
            &CertificateDer::from(leaf.der),
            &[],
            &server,
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A workload's part in the mTLS variant, as its rendered pod spec has it.
struct MtlsPart<'a> {
    name: String,
    bin: String,
    container: &'a Value,
    env: Vec<(String, String)>,
    /// The Certificate whose Secret the pod mounts, and where.
    cert: Option<(&'a Value, String)>,
}

impl MtlsPart<'_> {
    fn serves_tls(&self) -> bool {
        !get(&self.env, "OMICOS_TLS_CERT").is_empty()
    }
    fn mutual(&self) -> bool {
        !get(&self.env, "OMICOS_TLS_CLIENT_CA").is_empty()
    }
    fn dns_names(&self) -> Vec<&str> {
        self.cert
            .iter()
            .flat_map(|(c, _)| {
                s(c, "spec.dnsNames")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
            })
            .filter_map(Value::as_str)
            .collect()
    }
    fn uris(&self) -> Vec<&str> {
        self.cert
            .iter()
            .flat_map(|(c, _)| {
                s(c, "spec.uris")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
            })
            .filter_map(Value::as_str)
            .collect()
    }
}

fn mtls_parts(k: &K8s) -> Vec<MtlsPart<'_>> {
    let mut out = vec![];
    for w in k.workloads() {
        let name = text(w, "metadata.name").to_owned();
        let c = s(w, "spec.template.spec.containers.0").unwrap();
        let mut cert = None;
        for v in s(w, "spec.template.spec.volumes")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            let Some(secret) = s(v, "secret.secretName").and_then(Value::as_str) else {
                continue;
            };
            let certificate = k
                .of_kind("Certificate")
                .find(|c| text(c, "spec.secretName") == secret)
                .unwrap_or_else(|| {
                    panic!("k8s-mtls {name}: mounts the Secret {secret}, which no Certificate of certificates.yaml produces")
                });
            let mount = s(c, "volumeMounts")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .find(|m| text(m, "name") == text(v, "name"))
                .map(|m| text(m, "mountPath").to_owned())
                .unwrap_or_else(|| {
                    panic!("k8s-mtls {name}: the volume of {secret} is mounted nowhere")
                });
            assert!(cert.is_none(), "k8s-mtls {name}: mounts two certificates");
            cert = Some((certificate, mount));
        }
        out.push(MtlsPart {
            bin: text(c, "command.0").to_owned(),
            env: k.env(&name, c),
            container: c,
            name,
            cert,
        });
    }
    out
}

/// The rendered mTLS variant holds together: every container's environment
/// loads in its binary (a misspelt `OMICOS_TLS_*` fails), every certificate
/// a pod mounts comes from a Certificate of the one private CA, each TLS
/// setting names a file such a Secret holds, every `https://` address a part
/// is told to call is covered by the called part's certificate as a TLS
/// client verifies it (rustls, webpki's name rules), each caller presents the
/// role the called port asks for, no part calls a TLS port in plain, each
/// kind of part has a certificate of its own, and the TLS ports
/// are probed with `omicos health` over TLS (the kubelet's grpc probe speaks
/// plain HTTP/2).
#[test]
fn k8s_mtls_variant_renders_and_its_certificates_cover_every_call() {
    let k = mtls();
    // The CA: one Certificate with isCA, behind a CA Issuer.
    let cas: Vec<&Value> = k
        .of_kind("Certificate")
        .filter(|c| s(c, "spec.isCA").and_then(Value::as_bool) == Some(true))
        .collect();
    assert_eq!(cas.len(), 1, "certificates.yaml: one private CA");
    let ca_secret = text(cas[0], "spec.secretName");
    let ca_issuer = k
        .of_kind("Issuer")
        .find(|i| text(i, "spec.ca.secretName") == ca_secret)
        .map(|i| text(i, "metadata.name"))
        .expect("certificates.yaml: no Issuer signs with the CA");

    let parts = mtls_parts(&k);
    // The binaries read the TLS files as they load: a Secret's files here.
    let files = tempfile::tempdir().unwrap();
    let check_ca = omicos_e2e::pki::Ca::new("omicos-ca");
    check_ca.write(files.path(), "ca.crt");
    check_ca.part("check", 1).write(files.path(), "tls");
    let part = |name: &str| {
        parts
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("k8s-mtls: no workload {name}"))
    };
    for p in &parts {
        let what = format!("k8s-mtls {}", p.name);
        let on_disk: Vec<(String, String)> = p
            .env
            .iter()
            .map(|(k, v)| match &p.cert {
                Some((_, mount)) if v.starts_with(&format!("{mount}/")) => (
                    k.clone(),
                    files
                        .path()
                        .join(&v[mount.len() + 1..])
                        .display()
                        .to_string(),
                ),
                _ => (k.clone(), v.clone()),
            })
            .collect();
        check_binary(&p.bin, &what, &on_disk);
        let tls_vars: Vec<&(String, String)> =
            p.env.iter().filter(|(k, _)| k.contains("_TLS_")).collect();
        let Some((cert, mount)) = &p.cert else {
            panic!("{what}: the variant gives it no certificate (TLS settings: {tls_vars:?})");
        };
        assert_eq!(
            text(cert, "spec.issuerRef.name"),
            ca_issuer,
            "{what}: its certificate is not from the CA"
        );
        assert_eq!(text(cert, "spec.issuerRef.kind"), "Issuer", "{what}");
        assert_ne!(
            s(cert, "spec.isCA").and_then(Value::as_bool),
            Some(true),
            "{what} mounts the CA's key"
        );
        assert_eq!(p.uris().len(), 1, "{what}: its certificate names one role");
        let usages: Vec<&str> = s(cert, "spec.usages")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            usages.contains(&"client auth") && usages.contains(&"server auth"),
            "{what}: {usages:?}"
        );
        for (var, v) in &tls_vars {
            let file = v.strip_prefix(&format!("{mount}/")).unwrap_or_else(|| {
                panic!("{what}: {var}={v} is not in its certificate's mount {mount}")
            });
            let want = if var.ends_with("_CERT") {
                "tls.crt"
            } else if var.ends_with("_KEY") {
                "tls.key"
            } else {
                "ca.crt"
            };
            assert_eq!(
                file, want,
                "{what}: {var} (cert-manager's Secret holds tls.crt, tls.key, ca.crt)"
            );
        }
        // Every part the runners call, and the runners, take only callers
        // with a certificate of the CA (the orchestrators' own port serves
        // clients, who hold keys, not certificates).
        if p.bin != "omicos-orchestrator" {
            assert!(p.serves_tls() && p.mutual(), "{what}: serves no mutual TLS");
        }
        // A TLS port answers no plain probe.
        if p.serves_tls() {
            let (_, listen_port) = host_port(&format!("http://{}", get(&p.env, "OMICOS_LISTEN")));
            for probe in ["readinessProbe", "livenessProbe"] {
                assert!(
                    s(p.container, &format!("{probe}.grpc")).is_none(),
                    "{what}: a grpc {probe} speaks plain HTTP/2 to a TLS port"
                );
                let cmd: Vec<&str> = s(p.container, &format!("{probe}.exec.command"))
                    .and_then(Value::as_sequence)
                    .unwrap_or_else(|| panic!("{what}: no exec {probe}"))
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                let arg = |flag: &str| {
                    cmd.iter()
                        .position(|a| *a == flag)
                        .and_then(|i| cmd.get(i + 1))
                        .copied()
                        .unwrap_or_else(|| panic!("{what}: {probe} has no {flag}: {cmd:?}"))
                };
                assert_eq!(&cmd[..2], ["omicos", "health"], "{what}: {probe}");
                assert_eq!(arg("--ca"), format!("{mount}/ca.crt"));
                assert_eq!(arg("--cert"), format!("{mount}/tls.crt"));
                assert_eq!(arg("--key"), format!("{mount}/tls.key"));
                let (host, port) = host_port(cmd.last().unwrap());
                assert!(
                    cmd.last().unwrap().starts_with("https://"),
                    "{what}: {probe}: {cmd:?}"
                );
                assert_eq!(port, listen_port, "{what}: {probe} asks another port");
                certificate_covers(&p.dns_names(), &host)
                    .unwrap_or_else(|e| panic!("{what}: {probe} dials {host}: {e}"));
            }
        }
    }

    // Every address a part calls (the runner calls what a provider advertises).
    let runner = part("omicos-tool-runner");
    let mut plain_to_tls = std::collections::BTreeSet::new();
    for p in &parts {
        for (var, role) in [
            ("OMICOS_TOOL_RUNNER", "orchestrator"),
            ("OMICOS_REGISTRY", "provider"),
            ("OMICOS_ADVERTISE", "runner"),
        ] {
            let url = get(&p.env, var);
            if url.is_empty() {
                continue;
            }
            let what = format!("k8s-mtls {}: {var}={url}", p.name);
            let (host, port) = host_port(url);
            // <pod>.<governing service>[.…] and a pod IP are the pod itself.
            let callee = if host == "10.1.2.3" || host.starts_with("omicos-pod-0.") {
                p
            } else {
                let svc = k
                    .named("Service", &host)
                    .unwrap_or_else(|| panic!("{what}: names no Service"));
                let w = k
                    .workloads()
                    .find(|w| {
                        K8s::selects(
                            s(svc, "spec.selector").unwrap(),
                            s(w, "spec.template.metadata.labels").unwrap(),
                        )
                    })
                    .unwrap_or_else(|| panic!("{what}: its Service selects no workload"));
                part(text(w, "metadata.name"))
            };
            assert!(
                container_ports(callee.container).contains(&u64::from(port)),
                "{what}: {} exposes no port {port}",
                callee.name
            );
            let caller = if var == "OMICOS_ADVERTISE" { runner } else { p };
            if url.starts_with("http://") {
                if callee.serves_tls() {
                    plain_to_tls.insert(caller.name.clone());
                }
                continue;
            }
            assert!(callee.serves_tls(), "{what}: {} serves no TLS", callee.name);
            let (ca_var, cert_var) = if var == "OMICOS_TOOL_RUNNER" {
                ("OMICOS_RUNNER_TLS_CA", "OMICOS_RUNNER_TLS_CERT")
            } else {
                ("OMICOS_TLS_CA", "OMICOS_TLS_CERT")
            };
            assert!(
                !get(&caller.env, ca_var).is_empty(),
                "{what}: {} sets no {ca_var}",
                caller.name
            );
            certificate_covers(&callee.dns_names(), &host).unwrap_or_else(|e| {
                panic!(
                    "{what}: {}'s certificate ({:?}) does not cover {host}: {e}",
                    callee.name,
                    callee.dns_names()
                )
            });
            if callee.mutual() {
                assert!(
                    !get(&caller.env, cert_var).is_empty(),
                    "{what}: {} presents no certificate",
                    caller.name
                );
                let want = format!("spiffe://omicos/{role}");
                assert_eq!(
                    caller.uris(),
                    [want.as_str()],
                    "{what}: {}'s certificate role",
                    caller.name
                );
            }
        }
    }
    assert!(
        plain_to_tls.is_empty(),
        "k8s-mtls: parts that call a TLS port in plain: {plain_to_tls:?}"
    );
    // One certificate per kind of part: a pod of one kind cannot answer for
    // another (a web pod's key does not serve as a kernel).
    let mut by_secret: BTreeMap<&str, &str> = BTreeMap::new();
    for p in &parts {
        let (c, _) = p.cert.as_ref().unwrap();
        if let Some(other) = by_secret.insert(text(c, "spec.secretName"), &p.name) {
            panic!("k8s-mtls: {} and {other} mount one certificate", p.name);
        }
    }
}

mod run {
    //! The manifests' workloads as processes: each container's command with
    //! exactly the environment deploy/k8s/omicos.yaml gives it (the Secret's
    //! values, the image's ENV), with only what a cluster provides mapped to
    //! this machine: Service and pod names to 127.0.0.1 ports, the database
    //! to the test's PostgreSQL, /workspace to a temporary directory, and the
    //! model server (the manifest names none: the hosted default) to the fake LLM.
    //! SKIPPED without PostgreSQL (a failure under CI=true, see omicos-testdb).

    use super::*;
    use omicos_auth::{Credentials, ServiceRole};
    use omicos_e2e::stack::{ChatHandle, client_with};
    use omicos_e2e::{FakeLlm, Reply};
    use omicos_proto::{
        CallContext, CallToolRequest, ChatRequest, ExecuteClientMessage, ExecuteStart,
        ListProvidersRequest, ListSessionsRequest, ProviderInstance, RegisterRequest, chat_event,
        execute_client_message::Msg as In, registry_client::RegistryClient,
        tool_provider_client::ToolProviderClient, tool_runner_client::ToolRunnerClient,
    };
    use std::path::Path;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::process::{Child, Command};
    use tonic::Code;

    const WAIT: Duration = Duration::from_secs(60);

    fn python() -> String {
        std::env::var("OMICOS_KERNEL_PYTHON")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../.venv/bin/python3")
                    .display()
                    .to_string()
            })
    }

    /// The service binaries beside this crate's fake LLM (built first, as the
    /// cluster test does, unless scripts/test.sh built them).
    fn binary(name: &str) -> PathBuf {
        static BUILT: std::sync::Once = std::sync::Once::new();
        BUILT.call_once(|| {
            if std::env::var_os("OMICOS_TEST_BINS_BUILT").is_none() {
                let status = std::process::Command::new(env!("CARGO"))
                    .args(["build", "-q", "--workspace", "--bins", "--tests"])
                    .current_dir(env!("CARGO_MANIFEST_DIR"))
                    .status()
                    .expect("cargo runs");
                assert!(status.success(), "building the service binaries failed");
            }
        });
        let p = PathBuf::from(env!("CARGO_BIN_EXE_omicos-fake-llm")).with_file_name(name);
        assert!(p.exists(), "{} missing after the build", p.display());
        p
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// The image's ENV (deploy/Dockerfile), under the container's own.
    fn image_env() -> Vec<(String, String)> {
        let file = repo_file("deploy/Dockerfile");
        let line = file
            .lines()
            .find(|l| l.starts_with("ENV "))
            .expect("the Dockerfile sets ENV");
        line["ENV ".len()..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    struct Proc {
        child: Child,
    }

    impl Drop for Proc {
        fn drop(&mut self) {
            if let Some(pid) = self.child.id() {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }

    /// Starts `bin` with `env` only (a container's environment: nothing of
    /// this process's own leaks in but PATH and HOME); returns once it printed
    /// `listening on`.
    async fn spawn(what: &str, bin: &str, env: &[(String, String)], ws: &Path) -> Proc {
        let mut cmd = Command::new(binary(bin));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", ws)
            .env("RUST_LOG", "warn")
            .current_dir(ws)
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: {bin}: {e}"));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{what} printed no address within {WAIT:?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("{what} exited before it listened"));
        assert!(line.starts_with("listening on "), "{what}: `{line}`");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Proc { child }
    }

    /// The local stand-ins of the cluster's names.
    struct Local {
        /// (workload name, container port) → its 127.0.0.1 port.
        ports: BTreeMap<(String, u16), u16>,
        /// Service name → the workload it selects.
        services: BTreeMap<String, String>,
        db: String,
        ws: PathBuf,
        llm: String,
        /// A Secret's name → the directory standing for it where a pod mounts it.
        secrets: BTreeMap<String, PathBuf>,
    }

    impl Local {
        /// Every port of every workload on a free 127.0.0.1 port, every
        /// Service name to the workload it selects.
        fn new(
            k: &K8s,
            db: &str,
            ws: &Path,
            llm: &str,
            secrets: BTreeMap<String, PathBuf>,
        ) -> Self {
            let mut ports = BTreeMap::new();
            for w in k.workloads() {
                for port in container_ports(s(w, "spec.template.spec.containers.0").unwrap()) {
                    ports.insert(
                        (text(w, "metadata.name").to_owned(), port as u16),
                        free_port(),
                    );
                }
            }
            let mut services = BTreeMap::new();
            for svc in k.of_kind("Service") {
                assert_eq!(
                    s(svc, "spec.ports.0.port").and_then(Value::as_u64),
                    s(svc, "spec.ports.0.targetPort").and_then(Value::as_u64),
                    "a Service's port is its pods' port here"
                );
                let sel = s(svc, "spec.selector").unwrap();
                let w = k
                    .workloads()
                    .find(|w| K8s::selects(sel, s(w, "spec.template.metadata.labels").unwrap()))
                    .unwrap();
                services.insert(
                    text(svc, "metadata.name").to_owned(),
                    text(w, "metadata.name").to_owned(),
                );
            }
            Local {
                ports,
                services,
                db: db.to_owned(),
                ws: ws.to_path_buf(),
                llm: llm.to_owned(),
                secrets,
            }
        }

        fn url_host(&self, own: &str, url: &str) -> String {
            let (host, _) = host_port(url);
            // <pod>.<governing service> or a pod IP: the pod itself.
            let workload = if host == "10.1.2.3" || host.starts_with("omicos-pod-0.") {
                own.to_owned()
            } else {
                self.services
                    .get(&host)
                    .unwrap_or_else(|| panic!("{own}: {url} names no Service of the manifest"))
                    .clone()
            };
            let (_, port) = host_port(url);
            let scheme = if url.starts_with("https://") {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://127.0.0.1:{}", self.port(&workload, port))
        }

        /// Where a pod's Secret volumes are mounted → their local directories.
        fn mounts(&self, w: &Value) -> Vec<(String, PathBuf)> {
            let c = s(w, "spec.template.spec.containers.0").unwrap();
            let mut out = vec![];
            for v in s(w, "spec.template.spec.volumes")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
            {
                let Some(secret) = s(v, "secret.secretName").and_then(Value::as_str) else {
                    continue;
                };
                let dir = self
                    .secrets
                    .get(secret)
                    .unwrap_or_else(|| panic!("no local stand-in for the Secret {secret}"));
                for m in s(c, "volumeMounts")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                {
                    if text(m, "name") == text(v, "name") {
                        out.push((text(m, "mountPath").to_owned(), dir.clone()));
                    }
                }
            }
            out
        }

        /// A path inside a pod's mounted Secret, on this machine.
        fn mapped_path(mounts: &[(String, PathBuf)], v: &str) -> Option<String> {
            mounts.iter().find_map(|(m, dir)| {
                v.strip_prefix(&format!("{m}/"))
                    .map(|rest| dir.join(rest).display().to_string())
            })
        }

        /// The local port of `workload`'s container port `port`.
        fn port(&self, workload: &str, port: u16) -> u16 {
            *self
                .ports
                .get(&(workload.to_owned(), port))
                .unwrap_or_else(|| panic!("{workload} exposes no port {port}"))
        }

        fn url(&self, workload: &str, port: u16) -> String {
            format!("http://127.0.0.1:{}", self.port(workload, port))
        }

        /// A container's environment on this machine.
        fn env(&self, k: &K8s, workload: &str, c: &Value) -> Vec<(String, String)> {
            let w = k
                .workloads()
                .find(|w| text(w, "metadata.name") == workload)
                .unwrap();
            let mounts = self.mounts(w);
            let secret = k.named("Secret", "omicos").unwrap();
            let db_in_secret = text(secret, "stringData.postgres-url");
            let mut env: Vec<(String, String)> = image_env();
            for (name, v) in k.env(workload, c) {
                env.retain(|(k, _)| *k != name);
                env.push((name, v));
            }
            let mut out = Vec::new();
            for (name, v) in env {
                let v = match name.as_str() {
                    "OMICOS_METRICS_ADDR" => "127.0.0.1:0".into(),
                    // OMICOS_LISTEN, OMICOS_REGISTRY_LISTEN: a port the pod exposes.
                    _ if v.starts_with("0.0.0.0:") => {
                        let (_, port) = host_port(&format!("http://{v}"));
                        format!("127.0.0.1:{}", self.port(workload, port))
                    }
                    "OMICOS_WORKSPACE" => self.ws.display().to_string(),
                    "OMICOS_KERNEL_PYTHON" => python(),
                    "POD_NAME" | "POD_IP" => v,
                    _ if v == db_in_secret => self.db.clone(),
                    _ if v.starts_with("http://") || v.starts_with("https://") => {
                        self.url_host(workload, &v)
                    }
                    _ if Self::mapped_path(&mounts, &v).is_some() => {
                        Self::mapped_path(&mounts, &v).unwrap()
                    }
                    _ => v,
                };
                out.push((name, v));
            }
            if text(c, "command.0") == "omicos-orchestrator" {
                // The one thing the manifest leaves to the hosted default.
                out.push(("OMICOS_LLM_BASE_URL".into(), self.llm.clone()));
                out.push(("OMICOS_LLM_MODEL".into(), "fake-model".into()));
            }
            out
        }
    }

    async fn channel(url: &str, creds: Credentials) -> omicos_auth::AuthedChannel {
        let ch = tonic::transport::Channel::from_shared(url.to_owned())
            .unwrap()
            .connect()
            .await
            .unwrap();
        creds.channel(ch)
    }

    async fn providers(runner: &str, secret: &str) -> Vec<ProviderInstance> {
        let mut r = RegistryClient::new(
            channel(
                runner,
                Credentials::service(secret, ServiceRole::Operator).unwrap(),
            )
            .await,
        );
        r.list(ListProvidersRequest {})
            .await
            .unwrap()
            .into_inner()
            .instances
    }

    #[tokio::test]
    async fn the_manifests_run_refuse_strangers_and_serve_the_documented_key() {
        let Some(db) = omicos_testdb::postgres("deploy_run", "dep").await else {
            return;
        };
        let k = K8s::load();
        let ws = tempfile::tempdir().unwrap();
        let llm = FakeLlm::start(vec![Reply::Text("hello from the manifests".into())]).await;
        let local = Local::new(&k, &db.url, ws.path(), &llm.openai_url(), BTreeMap::new());
        let secret = text(
            k.named("Secret", "omicos").unwrap(),
            "stringData.service-secret",
        );
        // A workload's gRPC port (its first), and the runners' registry port.
        let url = |w: &str| {
            let port = k
                .workloads()
                .find(|x| text(x, "metadata.name") == w)
                .and_then(|x| s(x, "spec.template.spec.containers.0.ports.0.containerPort"))
                .and_then(Value::as_u64)
                .unwrap_or_else(|| panic!("{w}: no port"));
            local.url(w, port as u16)
        };
        let registry = {
            let runner = k.running("omicos-tool-runner");
            let env = k.env(
                "tool-runner",
                s(runner, "spec.template.spec.containers.0").unwrap(),
            );
            let (_, port) = host_port(&format!("http://{}", get(&env, "OMICOS_REGISTRY_LISTEN")));
            local.url(text(runner, "metadata.name"), port)
        };

        // The runner first (providers register with it), then providers, then
        // the orchestrator (ready once the runner answers).
        let mut procs = vec![];
        for bin in [
            "omicos-tool-runner",
            "omicos-memory",
            "omicos-web",
            "omicos-kernel",
            "omicos-orchestrator",
        ] {
            let w = k.running(bin);
            let name = text(w, "metadata.name");
            let c = s(w, "spec.template.spec.containers.0").unwrap();
            let env = local.env(&k, name, c);
            procs.push(spawn(name, bin, &env, ws.path()).await);
        }
        // Every provider registered, holding the secret.
        let deadline = Instant::now() + WAIT;
        loop {
            let got: std::collections::BTreeSet<String> = providers(&registry, secret)
                .await
                .into_iter()
                .map(|i| i.provider)
                .collect();
            if ["memory", "web", "kernel"].iter().all(|p| got.contains(*p)) {
                break;
            }
            assert!(Instant::now() < deadline, "providers registered: {got:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let before = providers(&registry, secret).await.len();

        // 1. ToolRunner/Execute without the secret: refused, and the shell
        //    it asked for never ran.
        let marker = ws.path().join("pwned-by-execute");
        let mut r =
            ToolRunnerClient::new(channel(&url("omicos-tool-runner"), Credentials::none()).await);
        let start = ExecuteClientMessage {
            msg: Some(In::Start(ExecuteStart {
                call_id: "c1".into(),
                tool_name: "shell".into(),
                arguments: serde_json::json!({"command": format!("touch {}", marker.display())})
                    .to_string(),
                session_id: "s1".into(),
                permission_mode: omicos_proto::PermissionMode::Full as i32,
                ..Default::default()
            })),
        };
        let e = r
            .execute(tokio_stream::iter(vec![start]))
            .await
            .expect_err("an unauthenticated Execute");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

        // 2. Registry/Register without the secret: refused, registry unchanged.
        let mut reg = RegistryClient::new(channel(&registry, Credentials::none()).await);
        let e = reg
            .register(RegisterRequest {
                instance: Some(ProviderInstance {
                    instance_id: "evil".into(),
                    provider: "evil".into(),
                    endpoint: "http://127.0.0.1:9".into(),
                    tools: vec![omicos_proto::ToolSpec {
                        name: "evil_tool".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ttl_seconds: 0,
            })
            .await
            .expect_err("an unauthenticated Register");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

        // 2b. The two ports are apart, so the NetworkPolicy that admits
        //    providers to the registry port admits them to nothing else: the
        //    ToolRunner port serves no Registry and the registry port no
        //    ToolRunner, even to a caller holding the secret.
        let mut reg_on_runner_port = RegistryClient::new(
            channel(
                &url("omicos-tool-runner"),
                Credentials::service(secret, ServiceRole::Operator).unwrap(),
            )
            .await,
        );
        let e = reg_on_runner_port
            .list(ListProvidersRequest {})
            .await
            .expect_err("the Registry on the ToolRunner port");
        assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
        let mut runner_on_registry_port = ToolRunnerClient::new(
            channel(
                &registry,
                Credentials::service(secret, ServiceRole::Orchestrator).unwrap(),
            )
            .await,
        );
        let e = runner_on_registry_port
            .list_tools(omicos_proto::ListToolsRequest::default())
            .await
            .expect_err("ToolRunner on the registry port");
        assert_eq!(e.code(), Code::Unimplemented, "{e:?}");

        // 3. A provider's CallTool without the secret: memory and the kernel
        //    refuse, and nothing was saved or run.
        let ctx = CallContext {
            call_id: "c2".into(),
            session_id: "s1".into(),
            scope: "default/assistant".into(),
            ..Default::default()
        };
        let mut mem =
            ToolProviderClient::new(channel(&url("omicos-memory"), Credentials::none()).await);
        let e = mem
            .call_tool(CallToolRequest {
                tool: "memory__save".into(),
                arguments_json: r#"{"content":"planted by a stranger","category":"project"}"#
                    .into(),
                context: Some(ctx.clone()),
            })
            .await
            .expect_err("an unauthenticated memory CallTool");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        let kernel_marker = ws.path().join("pwned-by-kernel");
        let mut kern =
            ToolProviderClient::new(channel(&url("omicos-kernel"), Credentials::none()).await);
        let e = kern
            .call_tool(CallToolRequest {
                tool: "run_python_code".into(),
                arguments_json: serde_json::json!({"code": format!("open({:?}, 'w').close()", kernel_marker.display().to_string())}).to_string(),
                context: Some(ctx.clone()),
            })
            .await
            .expect_err("an unauthenticated kernel CallTool");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

        // What did not happen: no file, no registration, no memory.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!marker.exists(), "the refused Execute ran its shell");
        assert!(!kernel_marker.exists(), "the refused CallTool ran its code");
        let after = providers(&registry, secret).await;
        assert_eq!(after.len(), before);
        assert!(after.iter().all(|i| i.provider != "evil"), "{after:?}");
        let mut mem_as_runner = ToolProviderClient::new(
            channel(
                &url("omicos-memory"),
                Credentials::service(secret, ServiceRole::Runner).unwrap(),
            )
            .await,
        );
        let mut found = mem_as_runner
            .call_tool(CallToolRequest {
                tool: "memory__search".into(),
                arguments_json: r#"{"query":"planted stranger"}"#.into(),
                context: Some(ctx),
            })
            .await
            .expect("the runner may search memory")
            .into_inner();
        let mut results = String::new();
        while let Some(ev) = found.message().await.unwrap() {
            if let Some(omicos_proto::call_tool_event::Event::Result(r)) = ev.event {
                results = r.value_json;
            }
        }
        assert!(!results.contains("planted"), "{results}");

        // 4. Clients: none without a key; the documented key chats.
        let orch = url("omicos-orchestrator");
        omicos_stack::wait_serving(&orch, std::time::Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{orch} never became SERVING: {e}"));
        let e = client_with(&orch, "")
            .await
            .list_sessions(ListSessionsRequest::default())
            .await
            .expect_err("no key");
        assert_eq!(e.code(), Code::Unauthenticated);
        let mut h = ChatHandle::open(
            client_with(&orch, DOCUMENTED_KEY).await,
            ChatRequest {
                message: "hi".into(),
                ..Default::default()
            },
        )
        .await
        .expect("the documented key is let in");
        let events = h.until_done().await;
        let text: String = events
            .iter()
            .filter_map(|e| match &e.kind {
                Some(chat_event::Kind::TextDelta(t)) => Some(t.text.clone()),
                _ => None,
            })
            .collect();
        assert!(text.contains("hello from the manifests"), "{events:#?}");
        assert_eq!(llm.requests().len(), 1);
        drop(procs);
    }

    /// A channel to `url` over `tls` (connected lazily, a new connection each time).
    fn tls_channel(tls: &omicos_servicekit::ClientTls, url: &str) -> tonic::transport::Channel {
        tonic::transport::Channel::new(
            tls.connector(),
            tonic::transport::Endpoint::from_shared(url.to_owned()).unwrap(),
        )
    }

    /// Refused at the TLS handshake, not by a gRPC answer (what
    /// docs/operations.md promises of a part under mutual TLS). Under TLS 1.3
    /// the server refuses a client certificate after the client finished its
    /// side, so the client sees the connection closed (CANCELLED) as often as
    /// a failed connect (UNAVAILABLE).
    fn assert_refused_at_handshake<T: std::fmt::Debug>(r: Result<T, tonic::Status>, who: &str) {
        let e = r.expect_err(who);
        assert!(
            matches!(
                e.code(),
                Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
            ) && e.metadata().is_empty(),
            "{who}: refused by the handshake, not by a gRPC answer: {e:?}"
        );
    }

    /// The mutual-TLS variant (deploy/k8s-mtls, rendered by `mtls()`) run as
    /// processes like the plain manifests above: each Certificate of
    /// certificates.yaml issued by a CA made here (its dnsNames and uris, plus
    /// localhost and 127.0.0.1 since every name is mapped to loopback) and
    /// written where the pod mounts its Secret (tls.crt, tls.key, ca.crt in a
    /// temporary directory standing for /tls). The runner, the kernel and the
    /// orchestrator, the parts the variant patches, run with exactly the
    /// rendered environment, web and memory included.
    ///
    /// Proven: the pods' exec probes pass; a client without a certificate is
    /// refused at the handshake by the runner's ToolRunner/Execute and the
    /// kernel's CallTool, even holding the service secret (the secret does
    /// not replace the certificate; it is a verified certificate that stands
    /// for the secret); a certificate from another CA is refused the same way;
    /// and the documented client key chats through the orchestrator with a
    /// `run_python_code` call of 1+1 that answers 2, so orchestrator → runner →
    /// kernel all speak mutual TLS with the rendered settings; web and memory
    /// register over it, and a second chat's `memory__save`, `memory__search`
    /// and `web_fetch` are answered by them (the fetch of a loopback address
    /// by the web provider's own SSRF refusal).
    #[tokio::test]
    async fn the_mtls_variant_runs_refuses_strangers_and_other_cas_and_serves_the_documented_key() {
        use omicos_e2e::pki::Ca;
        let Some(db) = omicos_testdb::postgres("deploy_mtls", "dmt").await else {
            return;
        };
        let k = mtls();
        let ws = tempfile::tempdir().unwrap();
        // Not under /tmp, which a box replaces with its own: the kernel's
        // key must be out of the boxed code's reach because the box does not
        // let it read there, not because the path is elsewhere.
        let certs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let kernel_key = certs.path().join("omicos-kernel-tls/tls.key");
        let steal = format!(
            "try:\n    v = open({:?}).read()\nexcept OSError as e:\n    v = type(e).__name__\nv",
            kernel_key.display().to_string()
        );
        let llm = FakeLlm::start(vec![
            Reply::Tools(
                String::new(),
                vec![
                    (
                        "call_py".into(),
                        "run_python_code".into(),
                        r#"{"code":"1+1"}"#.into(),
                    ),
                    (
                        "call_key".into(),
                        "run_python_code".into(),
                        serde_json::json!({ "code": steal }).to_string(),
                    ),
                ],
            ),
            Reply::Text("the kernel says 2".into()),
            Reply::Tools(
                String::new(),
                vec![(
                    "call_save".into(),
                    "memory__save".into(),
                    r#"{"content":"the variant speaks mutual TLS","category":"project"}"#.into(),
                )],
            ),
            Reply::Tools(
                String::new(),
                vec![(
                    "call_search".into(),
                    "memory__search".into(),
                    r#"{"query":"variant mutual TLS"}"#.into(),
                )],
            ),
            Reply::Tools(
                String::new(),
                vec![(
                    "call_fetch".into(),
                    "web_fetch".into(),
                    r#"{"url":"http://127.0.0.1:9/"}"#.into(),
                )],
            ),
            Reply::Text("memory and web answered".into()),
        ])
        .await;

        // cert-manager's part: each Certificate's Secret, from one CA.
        let ca = Ca::new("omicos-ca");
        let mut secrets = BTreeMap::new();
        let mut serial = 10;
        for c in k.of_kind("Certificate") {
            if s(c, "spec.isCA").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            let list = |key: &str| -> Vec<String> {
                s(c, &format!("spec.{key}"))
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            };
            let mut names = list("dnsNames");
            names.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
            names.dedup();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let uris = list("uris");
            let uris: Vec<&str> = uris.iter().map(String::as_str).collect();
            serial += 1;
            let leaf = ca.leaf_for(text(c, "metadata.name"), serial, &names, &uris);
            let secret = text(c, "spec.secretName");
            let dir = certs.path().join(secret);
            std::fs::create_dir_all(&dir).unwrap();
            leaf.write(&dir, "tls");
            ca.write(&dir, "ca.crt");
            secrets.insert(secret.to_owned(), dir);
        }

        let local = Local::new(&k, &db.url, ws.path(), &llm.openai_url(), secrets);
        let secret = text(
            k.named("Secret", "omicos").unwrap(),
            "stringData.service-secret",
        );
        let https = |w: &str, port: u16| format!("https://127.0.0.1:{}", local.port(w, port));
        let runner_url = https("omicos-tool-runner", 7001);
        let registry = https("omicos-tool-runner", 7011);
        let kernel_url = https("omicos-kernel", 7002);

        let mut procs = vec![];
        for bin in [
            "omicos-tool-runner",
            "omicos-memory",
            "omicos-web",
            "omicos-kernel",
            "omicos-orchestrator",
        ] {
            let w = k.running(bin);
            let name = text(w, "metadata.name");
            let c = s(w, "spec.template.spec.containers.0").unwrap();
            let env = local.env(&k, name, c);
            procs.push(spawn(name, bin, &env, ws.path()).await);
        }

        // Clients of the test: trusting the CA, with or without a certificate.
        let client = |leaf: Option<(&omicos_e2e::pki::Leaf, &str)>| {
            let mut cfg = omicos_servicekit::TlsConfig {
                ca: ca.write(certs.path(), "client-ca.crt"),
                ..Default::default()
            };
            if let Some((l, stem)) = leaf {
                (cfg.cert, cfg.key) = l.write(certs.path(), stem);
            }
            cfg.client("test").unwrap().expect("a client config")
        };
        let operator = client(Some((&ca.part("operator", 90), "operator")));
        let list = |tls: omicos_servicekit::ClientTls| {
            let registry = registry.clone();
            async move {
                RegistryClient::new(Credentials::none().channel(tls_channel(&tls, &registry)))
                    .list(ListProvidersRequest {})
                    .await
                    .map(|r| {
                        r.into_inner()
                            .instances
                            .into_iter()
                            .map(|i| i.provider)
                            .collect::<std::collections::BTreeSet<String>>()
                    })
            }
        };
        // Every provider registers over mutual TLS.
        let deadline = Instant::now() + WAIT;
        loop {
            match list(operator.clone()).await {
                Ok(got) if ["kernel", "memory", "web"].iter().all(|p| got.contains(*p)) => {
                    break;
                }
                got => assert!(Instant::now() < deadline, "providers registered: {got:?}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // The pods' exec probes, as rendered, with their own files.
        for w in [
            "omicos-tool-runner",
            "omicos-kernel",
            "omicos-web",
            "omicos-memory",
        ] {
            let wl = k
                .workloads()
                .find(|x| text(x, "metadata.name") == w)
                .unwrap();
            let mounts = local.mounts(wl);
            for probe in ["readinessProbe", "livenessProbe"] {
                let cmd: Vec<String> = s(
                    wl,
                    &format!("spec.template.spec.containers.0.{probe}.exec.command"),
                )
                .and_then(Value::as_sequence)
                .unwrap_or_else(|| panic!("{w}: no exec {probe}"))
                .iter()
                .map(|a| {
                    let a = a.as_str().unwrap();
                    if let Some(p) = Local::mapped_path(&mounts, a) {
                        p
                    } else if a.starts_with("https://") {
                        let (host, port) = host_port(a);
                        format!("https://{host}:{}", local.port(w, port))
                    } else {
                        a.to_owned()
                    }
                })
                .collect();
                let out = tokio::process::Command::new(binary(&cmd[0]))
                    .args(&cmd[1..])
                    .output()
                    .await
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{w}: {probe} {cmd:?} fails: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }

        // The documented key chats; the model's call of the kernel goes
        // orchestrator → runner → kernel over mutual TLS.
        let orch = local.url("omicos-orchestrator", 7000);
        omicos_stack::wait_serving(&orch, std::time::Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{orch} never became SERVING: {e}"));
        let mut h = ChatHandle::open(
            client_with(&orch, DOCUMENTED_KEY).await,
            ChatRequest {
                message: "what is 1+1?".into(),
                // The built-in agent whose toolsets hold the kernel's tools.
                agent: "data_analyst".into(),
                permission_mode: "auto".into(),
                ..Default::default()
            },
        )
        .await
        .expect("the documented key is let in");
        // `auto` may ask before running Python: the client allows it.
        let events = h.until_done_allowing().await;
        let finished = omicos_e2e::stack::finished_calls(&events);
        assert_eq!(finished.len(), 2, "{events:#?}");
        // The cell's value as the kernel reports it (execute_result text/plain).
        let value_of = |id: &str| {
            let c = finished
                .iter()
                .find(|c| c.call_id == id)
                .unwrap_or_else(|| panic!("no {id}: {events:#?}"));
            assert_eq!(c.status, omicos_proto::ToolStatus::Done as i32, "{c:?}");
            let v: serde_json::Value = serde_json::from_str(&c.result).unwrap_or_default();
            v["execute_result"]["text/plain"]
                .as_str()
                .or_else(|| v["result"]["execute_result"]["text/plain"].as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("{id}: no value: {c:?}"))
        };
        assert_eq!(value_of("call_py"), "2");
        // The kernel pod's own key is there, and the code the model wrote,
        // running in that kernel, cannot read it.
        assert!(
            std::fs::read_to_string(&kernel_key)
                .unwrap()
                .contains("PRIVATE KEY")
        );
        let stolen = value_of("call_key");
        assert!(
            matches!(stolen.as_str(), "'PermissionError'" | "'FileNotFoundError'"),
            "boxed code read the kernel's TLS key: {stolen:.200}"
        );
        let text = omicos_e2e::stack::events_text(&events);
        assert!(text.contains("the kernel says 2"), "{events:#?}");
        assert_eq!(llm.requests().len(), 2);

        // Memory and web, through the runner over mutual TLS: the agent
        // whose toolsets hold both.
        let mut h = ChatHandle::open(
            client_with(&orch, DOCUMENTED_KEY).await,
            ChatRequest {
                message: "remember, recall, fetch".into(),
                agent: "literature_scout".into(),
                permission_mode: "full".into(),
                ..Default::default()
            },
        )
        .await
        .expect("the documented key is let in");
        let events = h.until_done_allowing().await;
        let finished = omicos_e2e::stack::finished_calls(&events);
        let call = |name: &str| {
            finished
                .iter()
                .find(|c| c.call_id == name)
                .unwrap_or_else(|| panic!("no {name}: {events:#?}"))
        };
        for id in ["call_save", "call_search"] {
            assert_eq!(
                call(id).status,
                omicos_proto::ToolStatus::Done as i32,
                "{:?}",
                call(id)
            );
        }
        assert!(
            call("call_search")
                .result
                .contains("the variant speaks mutual TLS"),
            "memory__search did not find what memory__save kept: {:?}",
            call("call_search")
        );
        // The web provider's own answer, not a transport error of the runner.
        let fetch = call("call_fetch");
        let said = &fetch.result;
        assert!(
            said.contains("blocked:") && said.contains("SSRF protection"),
            "web_fetch was not answered by the web provider: {fetch:?}"
        );
        assert!(
            omicos_e2e::stack::events_text(&events).contains("memory and web answered"),
            "{events:#?}"
        );

        // Strangers: no certificate (with or without the secret), or one
        // from another CA (even naming the right role, even with the secret).
        let other = Ca::new("another CA");
        let strangers: Vec<(&str, omicos_servicekit::ClientTls, Credentials)> = vec![
            ("no certificate", client(None), Credentials::none()),
            (
                "no certificate, the service secret",
                client(None),
                Credentials::service(secret, ServiceRole::Orchestrator).unwrap(),
            ),
            (
                "another CA's orchestrator certificate",
                client(Some((&other.part("orchestrator", 91), "other-orch"))),
                Credentials::none(),
            ),
            (
                "another CA's orchestrator certificate, the service secret",
                client(Some((&other.part("orchestrator", 91), "other-orch"))),
                Credentials::service(secret, ServiceRole::Orchestrator).unwrap(),
            ),
        ];
        let marker = ws.path().join("pwned-by-execute");
        let kernel_marker = ws.path().join("pwned-by-kernel");
        for (who, tls, creds) in &strangers {
            let mut r = ToolRunnerClient::new(creds.clone().channel(tls_channel(tls, &runner_url)));
            let start = ExecuteClientMessage {
                msg: Some(In::Start(ExecuteStart {
                    call_id: "c1".into(),
                    tool_name: "shell".into(),
                    arguments:
                        serde_json::json!({"command": format!("touch {}", marker.display())})
                            .to_string(),
                    session_id: "s1".into(),
                    permission_mode: omicos_proto::PermissionMode::Full as i32,
                    ..Default::default()
                })),
            };
            assert_refused_at_handshake(
                r.execute(tokio_stream::iter(vec![start])).await,
                &format!("ToolRunner/Execute, {who}"),
            );
            let mut kern =
                ToolProviderClient::new(creds.clone().channel(tls_channel(tls, &kernel_url)));
            assert_refused_at_handshake(
                kern.call_tool(CallToolRequest {
                    tool: "run_python_code".into(),
                    arguments_json: serde_json::json!({"code": format!("open({:?}, 'w').close()", kernel_marker.display().to_string())}).to_string(),
                    context: Some(CallContext {
                        call_id: "c2".into(),
                        session_id: "s1".into(),
                        scope: "default/assistant".into(),
                        ..Default::default()
                    }),
                })
                .await,
                &format!("the kernel's CallTool, {who}"),
            );
            for (part, port, tool, args) in [
                (
                    "omicos-memory",
                    7004,
                    "memory__save",
                    r#"{"content":"planted by a stranger","category":"project"}"#,
                ),
                (
                    "omicos-web",
                    7003,
                    "web_fetch",
                    r#"{"url":"https://example.com/"}"#,
                ),
            ] {
                let mut p = ToolProviderClient::new(
                    creds.clone().channel(tls_channel(tls, &https(part, port))),
                );
                assert_refused_at_handshake(
                    p.call_tool(CallToolRequest {
                        tool: tool.into(),
                        arguments_json: args.into(),
                        context: Some(CallContext {
                            call_id: "c3".into(),
                            session_id: "s1".into(),
                            scope: "default/assistant".into(),
                            ..Default::default()
                        }),
                    })
                    .await,
                    &format!("{part}'s CallTool, {who}"),
                );
            }
        }
        // The registry port too: no certificate, or another CA's.
        assert_refused_at_handshake(list(client(None)).await, "Registry, no certificate");
        assert_refused_at_handshake(
            list(client(Some((
                &other.part("provider", 92),
                "other-provider",
            ))))
            .await,
            "Registry, another CA's provider certificate",
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!marker.exists(), "a refused Execute ran its shell");
        assert!(!kernel_marker.exists(), "a refused CallTool ran its code");
        // Memory kept nothing of the strangers: asked as a runner would, with
        // a runner certificate of the CA.
        let as_runner = client(Some((&ca.part("runner", 93), "runner")));
        let mut found = ToolProviderClient::new(
            Credentials::none().channel(tls_channel(&as_runner, &https("omicos-memory", 7004))),
        )
        .call_tool(CallToolRequest {
            tool: "memory__search".into(),
            arguments_json: r#"{"query":"planted stranger"}"#.into(),
            context: Some(CallContext {
                call_id: "c4".into(),
                session_id: "s1".into(),
                scope: "default/assistant".into(),
                ..Default::default()
            }),
        })
        .await
        .expect("a runner's certificate may search memory")
        .into_inner();
        let mut results = None;
        while let Some(ev) = found.message().await.unwrap() {
            if let Some(omicos_proto::call_tool_event::Event::Result(r)) = ev.event {
                results = Some(r.value_json);
            }
        }
        let results = results.expect("memory__search answered no result");
        assert!(!results.contains("planted"), "{results}");

        drop(procs);
    }
}
