//! Who may register what (issue 14, "the registry is guarded").
//!
//! The service secret only proves that a caller is a part of the system; every
//! part holds the same one. What it does not settle, this does:
//!
//! - an instance id belongs to the key and endpoint that first registered it
//!   (`x-omicos-instance-key`, a random value each provider process makes at
//!   start and sends with Register, Heartbeat and Deregister): another caller
//!   cannot re-register the id elsewhere, keep it alive, or remove it;
//! - a tool name (and each alias and deprecated name) belongs to the provider
//!   that first registered it; names served in-process (file_manager, shell,
//!   MCP, ...) are never taken; `registry_tool_owners` in config hands a name
//!   to another provider;
//! - static entries come from config only, and a TTL is capped
//!   (`registry_max_ttl`).
//!
//! The in-memory registry keeps these here; a shared registry keeps them in
//! PostgreSQL (see `shared_registry`), checked in the registration's own
//! transaction so replicas agree.

use crate::error::RunnerError;
use omicos_proto::ProviderInstance;
use sha2::Digest;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long the owner of an instance id that is no longer registered is
/// remembered: an id that went quiet cannot be taken by someone else when
/// its provider comes back within this.
pub const OWNER_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// What config says about registrations.
#[derive(Clone, Debug)]
pub struct RegistryPolicy {
    /// The longest TTL a registration gets.
    pub max_ttl: Duration,
    /// Tool name → the provider that may serve it (overrides the first claim).
    pub tool_owners: BTreeMap<String, String>,
}

impl Default for RegistryPolicy {
    fn default() -> Self {
        Self {
            max_ttl: Duration::from_secs(300),
            tool_owners: BTreeMap::new(),
        }
    }
}

impl RegistryPolicy {
    /// The policy of a runner's config.
    pub fn of(config: &crate::Config) -> Self {
        Self {
            max_ttl: config.registry_max_ttl,
            tool_owners: config.registry_tool_owners.clone(),
        }
    }

    /// `ttl` (zero: `default`) capped at `max_ttl`.
    pub fn cap_ttl(&self, ttl: Duration, default: Duration) -> Duration {
        let ttl = if ttl.is_zero() { default } else { ttl };
        ttl.min(self.max_ttl)
    }
}

/// What is kept of an instance key: its sha256 in hex (an absent key is the empty one).
pub fn key_digest(key: Option<&str>) -> String {
    hex::encode(sha2::Sha256::digest(key.unwrap_or("").as_bytes()))
}

/// A tool name a registration claims, and whether config hands it to this provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The name (tool name, alias or deprecated name).
    pub name: String,
    /// Config names this provider as its owner: the claim replaces an earlier one.
    pub by_config: bool,
}

/// Whether a caller owns an instance id.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyCheck {
    /// The id is the caller's.
    Owner,
    /// The id belongs to another key.
    NotOwner,
    /// Nobody owns the id (never registered, or forgotten).
    Unknown,
}

struct Owner {
    key: String,
    endpoint: String,
    seen: Instant,
}

/// The owners of instance ids and tool names, for the in-memory registry;
/// the built-in names for both.
#[derive(Default)]
pub struct Owners {
    instances: HashMap<String, Owner>,
    tools: HashMap<String, String>,
    builtin: HashSet<String>,
}

impl Owners {
    /// Names served in-process: no registration may claim them.
    pub fn reserve_builtin(&mut self, names: impl IntoIterator<Item = String>) {
        self.builtin.extend(names);
    }

    /// The claims of `info` that config and the built-ins allow, or why not.
    pub fn check_claims(
        &self,
        policy: &RegistryPolicy,
        info: &ProviderInstance,
    ) -> Result<Vec<Claim>, RunnerError> {
        let mut names: Vec<&String> = vec![];
        for t in &info.tools {
            names.push(&t.name);
            names.extend(t.aliases.iter());
            names.extend(t.deprecated_names.iter());
        }
        let mut seen = HashSet::new();
        let mut claims = vec![];
        for name in names {
            if !seen.insert(name.as_str()) {
                continue;
            }
            if self.builtin.contains(name) {
                return Err(RunnerError::RegistrationDenied(format!(
                    "`{name}` is a built-in tool of the runner; a provider cannot serve it"
                )));
            }
            let by_config = match policy.tool_owners.get(name) {
                Some(p) if *p == info.provider => true,
                Some(p) => {
                    return Err(RunnerError::RegistrationDenied(format!(
                        "`{name}` belongs to the provider `{p}` (registry_tool_owners), not `{}`",
                        info.provider
                    )));
                }
                None => false,
            };
            claims.push(Claim {
                name: name.clone(),
                by_config,
            });
        }
        Ok(claims)
    }

    /// Takes the instance id for `key` and the claimed names for `info`'s
    /// provider, all or nothing.
    pub fn claim(
        &mut self,
        info: &ProviderInstance,
        key: &str,
        claims: &[Claim],
    ) -> Result<(), RunnerError> {
        if let Some(o) = self.instances.get(&info.instance_id)
            && (o.key != key || o.endpoint != info.endpoint)
        {
            return Err(RunnerError::RegistrationDenied(format!(
                "the instance id `{}` belongs to another registrant (its key or endpoint differs)",
                info.instance_id
            )));
        }
        for c in claims {
            if let Some(p) = self.tools.get(&c.name)
                && *p != info.provider
                && !c.by_config
            {
                return Err(RunnerError::RegistrationDenied(format!(
                    "`{}` belongs to the provider `{p}` that registered it first; `{}` cannot take it over (registry_tool_owners can hand it over)",
                    c.name, info.provider
                )));
            }
        }
        for c in claims {
            self.tools.insert(c.name.clone(), info.provider.clone());
        }
        self.instances.insert(
            info.instance_id.clone(),
            Owner {
                key: key.to_owned(),
                endpoint: info.endpoint.clone(),
                seen: Instant::now(),
            },
        );
        Ok(())
    }

    /// Whether `key` owns `instance_id` (and marks it seen when it does).
    pub fn check(&mut self, instance_id: &str, key: &str) -> KeyCheck {
        match self.instances.get_mut(instance_id) {
            Some(o) if o.key == key => {
                o.seen = Instant::now();
                KeyCheck::Owner
            }
            Some(_) => KeyCheck::NotOwner,
            None => KeyCheck::Unknown,
        }
    }

    /// Forgets the owner of an id its owner deregistered.
    pub fn forget(&mut self, instance_id: &str) {
        self.instances.remove(instance_id);
    }

    /// Forgets owners of ids not seen for [`OWNER_KEEP`] and not in `live`.
    pub fn prune(&mut self, live: &dyn Fn(&str) -> bool) {
        let now = Instant::now();
        self.instances
            .retain(|id, o| live(id) || now.duration_since(o.seen) < OWNER_KEEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(id: &str, provider: &str, endpoint: &str, tool: &str) -> ProviderInstance {
        ProviderInstance {
            instance_id: id.into(),
            provider: provider.into(),
            endpoint: endpoint.into(),
            tools: vec![omicos_proto::ToolSpec {
                name: tool.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn ids_and_names_belong_to_their_first_registrant() {
        let policy = RegistryPolicy::default();
        let mut o = Owners::default();
        o.reserve_builtin(["shell".to_owned()]);
        let (k, other) = (key_digest(Some("k")), key_digest(Some("x")));
        let kernel = inst("k1", "kernel", "http://127.0.0.1:1", "run_python_code");
        let c = o.check_claims(&policy, &kernel).unwrap();
        o.claim(&kernel, &k, &c).unwrap();
        // Again, same key and endpoint: fine (a re-registration).
        o.claim(&kernel, &k, &c).unwrap();
        // Same id, another key or endpoint: refused.
        assert!(o.claim(&kernel, &other, &c).is_err());
        let moved = inst("k1", "kernel", "http://127.0.0.1:2", "run_python_code");
        assert!(o.claim(&moved, &k, &c).is_err());
        assert_eq!(o.check("k1", &k), KeyCheck::Owner);
        assert_eq!(o.check("k1", &other), KeyCheck::NotOwner);
        assert_eq!(o.check("k2", &k), KeyCheck::Unknown);
        // Another provider cannot take the tool name, nor a built-in one.
        let evil = inst("e1", "evil", "http://127.0.0.1:9", "run_python_code");
        let c = o.check_claims(&policy, &evil).unwrap();
        let e = o.claim(&evil, &other, &c).unwrap_err();
        assert!(
            e.to_string().contains("belongs to the provider `kernel`"),
            "{e}"
        );
        let shell = inst("e2", "evil", "http://127.0.0.1:9", "shell");
        assert!(o.check_claims(&policy, &shell).is_err());
        // Unless config hands it over.
        let mut handed = RegistryPolicy::default();
        handed
            .tool_owners
            .insert("run_python_code".into(), "evil".into());
        let c = o.check_claims(&handed, &evil).unwrap();
        o.claim(&evil, &other, &c).unwrap();
        // And then the old owner may not come back with it.
        assert!(o.check_claims(&handed, &kernel).is_err());
    }

    #[test]
    fn ttl_is_capped() {
        let p = RegistryPolicy::default();
        let d = Duration::from_secs(30);
        assert_eq!(p.cap_ttl(Duration::ZERO, d), d);
        assert_eq!(p.cap_ttl(Duration::from_secs(4_000_000_000), d), p.max_ttl);
    }
}
