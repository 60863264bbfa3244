//! The tools the runner can run right now: in-process providers plus the live
//! provider instances of the registry, indexed by name, alias and deprecated
//! name. Each tool's JSON schema is compiled once and kept across rebuilds.

use crate::pipeline::resolve::Matched;
use crate::registry::Registry;
use omicos_proto::ToolSpec;
use omicos_toolkit::Provider;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// Where a tool runs.
#[derive(Clone)]
pub enum Route {
    /// In this process.
    Local(Arc<dyn Provider>),
    /// A provider service found through the registry, by provider name.
    Remote(String),
}

/// A tool's compiled schema.
pub struct Compiled {
    /// The schema document (repair walks it).
    pub schema: Value,
    /// The compiled validator, or why the schema cannot be used.
    pub validator: Result<jsonschema::Validator, String>,
}

/// One runnable tool.
pub struct ToolEntry {
    /// Its spec (schema, risk, aliases, provider).
    pub spec: ToolSpec,
    /// Where it runs.
    pub route: Route,
    compiled: OnceLock<Arc<Compiled>>,
}

impl ToolEntry {
    fn new(spec: ToolSpec, route: Route) -> Self {
        Self {
            spec,
            route,
            compiled: OnceLock::new(),
        }
    }

    /// The schema, compiled on first use and then reused for every call.
    pub fn compiled(&self) -> &Arc<Compiled> {
        self.compiled.get_or_init(|| Arc::new(compile(&self.spec)))
    }

    /// The risk class.
    pub fn risk(&self) -> omicos_proto::Risk {
        omicos_proto::Risk::try_from(self.spec.risk).unwrap_or(omicos_proto::Risk::Read)
    }
}

fn compile(spec: &ToolSpec) -> Compiled {
    let schema: Value = if spec.input_schema_json.trim().is_empty() {
        serde_json::json!({"type": "object"})
    } else {
        match serde_json::from_str(&spec.input_schema_json) {
            Ok(v) => v,
            Err(e) => {
                return Compiled {
                    schema: Value::Null,
                    validator: Err(format!("the schema of `{}` is not JSON: {e}", spec.name)),
                };
            }
        }
    };
    // Without the default features there is no HTTP retriever: a remote $ref fails here, cleanly.
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| format!("the schema of `{}` is not usable: {e}", spec.name));
    Compiled { schema, validator }
}

/// An immutable index of the runnable tools.
#[derive(Default)]
pub struct Catalog {
    entries: Vec<Arc<ToolEntry>>,
    names: HashMap<String, (usize, Matched)>,
    digest: u64,
}

impl Catalog {
    /// Builds the index. In-process tools win over remote tools of the same
    /// name; entries whose spec did not change are taken from `previous` so
    /// their compiled schemas survive.
    pub fn build(
        local: &[Arc<dyn Provider>],
        remote: Vec<ToolSpec>,
        previous: Option<&Catalog>,
    ) -> Self {
        let mut specs: Vec<(ToolSpec, Route)> = Vec::new();
        for p in local {
            for mut t in p.tools() {
                if t.provider.is_empty() {
                    t.provider = p.name().to_owned();
                }
                specs.push((t, Route::Local(p.clone())));
            }
        }
        for t in remote {
            let provider = t.provider.clone();
            specs.push((t, Route::Remote(provider)));
        }
        let mut me = Catalog::default();
        for (spec, route) in specs {
            if me
                .names
                .get(&spec.name)
                .is_some_and(|(_, m)| *m == Matched::Name)
            {
                tracing::warn!(tool = %spec.name, provider = %spec.provider, "tool served twice; keeping the first");
                continue;
            }
            let reused = previous
                .and_then(|p| p.lookup(&spec.name))
                .filter(|(e, m)| {
                    *m == Matched::Name
                        && e.spec == spec
                        && matches!(
                            (&e.route, &route),
                            (Route::Local(_), Route::Local(_))
                                | (Route::Remote(_), Route::Remote(_))
                        )
                });
            let entry = match reused {
                Some((e, _)) => e,
                None => Arc::new(ToolEntry::new(spec, route)),
            };
            let idx = me.entries.len();
            me.names
                .insert(entry.spec.name.clone(), (idx, Matched::Name));
            me.entries.push(entry);
        }
        me.digest = digest(&me.entries);
        // Aliases and deprecated names never shadow a real name.
        for (idx, e) in me.entries.iter().enumerate() {
            for a in &e.spec.aliases {
                me.names.entry(a.clone()).or_insert((idx, Matched::Alias));
            }
            for d in &e.spec.deprecated_names {
                me.names
                    .entry(d.clone())
                    .or_insert((idx, Matched::Deprecated));
            }
        }
        me
    }

    /// Finds a tool by name, alias or deprecated name.
    pub fn lookup(&self, name: &str) -> Option<(Arc<ToolEntry>, Matched)> {
        self.names
            .get(name)
            .map(|(i, m)| (self.entries[*i].clone(), *m))
    }

    /// Every tool, in provider order.
    pub fn entries(&self) -> impl Iterator<Item = &Arc<ToolEntry>> {
        self.entries.iter()
    }

    /// A digest of every tool's spec and route kind, in order: the same on
    /// every runner that serves the same tools, new when any tool changes.
    pub fn digest(&self) -> u64 {
        self.digest
    }
}

/// SipHash with fixed keys over every field of the specs (their `Debug`
/// form names them all): stable across processes of one build (a runner of
/// another build may digest the same catalog differently, which costs its
/// callers one full answer, never a wrong one). Done once per rebuild.
fn digest(entries: &[Arc<ToolEntry>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    for e in entries {
        format!("{:?}", e.spec).hash(&mut h);
        matches!(e.route, Route::Local(_)).hash(&mut h);
    }
    h.finish()
}

/// The current catalog, rebuilt when the registry changes.
pub struct Tools {
    local: Vec<Arc<dyn Provider>>,
    registry: Arc<Registry>,
    current: RwLock<(u64, Arc<Catalog>)>,
}

impl Tools {
    /// The in-process providers.
    pub fn local(&self) -> &[Arc<dyn Provider>] {
        &self.local
    }

    /// The tools of `local` providers plus whatever `registry` holds.
    pub fn new(local: Vec<Arc<dyn Provider>>, registry: Arc<Registry>) -> Self {
        let version = registry.version();
        let cat = Catalog::build(&local, registry.live_tools(), None);
        Self {
            local,
            registry,
            current: RwLock::new((version, Arc::new(cat))),
        }
    }

    /// The registry behind the remote tools.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The catalog as of now (cheap unless the registry changed).
    pub fn snapshot(&self) -> Arc<Catalog> {
        let version = self.registry.version();
        {
            let cur = self.current.read().unwrap_or_else(|p| p.into_inner());
            if cur.0 == version {
                return cur.1.clone();
            }
        }
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if cur.0 != version {
            let cat = Catalog::build(&self.local, self.registry.live_tools(), Some(&cur.1));
            *cur = (version, Arc::new(cat));
        }
        cur.1.clone()
    }
}
