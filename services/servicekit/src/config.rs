//! Configuration: defaults, then a YAML file (with `${VAR:-default}` expansion),
//! then `OMICOS_*` environment variables. Validated once, at load.
//!
//! Environment names are derived from the key path: `llm.base_url` is
//! `OMICOS_LLM_BASE_URL`. Only keys that the service knows are read from the
//! environment (one environment may serve several services); unknown keys in
//! the file are refused, naming the key.
//!
//! Every service's config implements [`ServiceConfig`]: its renamed keys
//! ([`Renamed`], read under the old name for one release with a warning) and
//! its `validate`, which names the key it refuses ([`ConfigError::key`]).
//! Durations are [`std::time::Duration`] read by [`duration`]: a number of
//! seconds, or a string with a unit (`500ms`, `30s`, `5m`, `1h 30m`).

use serde::{Serialize, de::DeserializeOwned};
pub use serde_yaml::Value;
use std::collections::HashSet;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A configuration that cannot be used. The message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not YAML.
    #[error("config file {path}: not valid YAML: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// A key has a value of the wrong kind, is unknown, or is out of range.
    #[error("config key `{key}`: {message}")]
    Key {
        /// Dotted key path.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// A value the service cannot use: `key` is the dotted path, `message`
    /// says what is wrong and, where it helps, what would work.
    pub fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Key {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The key named by the error, if it names one.
    pub fn key_path(&self) -> Option<&str> {
        match self {
            Self::Key { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The same error with `section.` before its key (one section of a
    /// whole-stack file).
    pub fn in_section(self, section: &str) -> Self {
        match self {
            Self::Key { key, message } if !section.is_empty() => Self::Key {
                key: qualified(section, &key),
                message,
            },
            other => other,
        }
    }
}

/// A service's configuration: its defaults (`Default`), the keys it renamed,
/// and the checks serde cannot make. [`load_config`] applies all three.
pub trait ServiceConfig: Serialize + DeserializeOwned + Default {
    /// Keys renamed in this release, still read under their old names (in
    /// the file and as `OMICOS_*` variables) with a warning.
    const RENAMED: &'static [Renamed] = &[];

    /// Refuses values that cannot work, naming the key. Called once, at load.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The log filter when `RUST_LOG` is unset, if the config sets one.
    fn log_filter(&self) -> Option<&str> {
        None
    }

    /// Where `GET /metrics` (Prometheus) is served, if the config sets
    /// `metrics_addr`; `None` or empty: no scrape endpoint.
    fn metrics_addr(&self) -> Option<&str> {
        None
    }

    /// How long in-flight calls get to finish on SIGINT/SIGTERM.
    fn shutdown_grace(&self) -> Duration {
        DEFAULT_SHUTDOWN_GRACE
    }
}

/// The drain grace period of a service whose config names none.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How a bare number under an old key reads once moved to its new key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OldUnit {
    /// The same as under the new key (seconds for a duration).
    Same,
    /// Milliseconds: the old key ended in `_ms`.
    Millis,
}

/// A key renamed in this release: `old` is still read, moved to `new`.
#[derive(Clone, Copy, Debug)]
pub struct Renamed {
    /// The old dotted path, relative to the service's config root.
    pub old: &'static str,
    /// The new dotted path.
    pub new: &'static str,
    /// How a bare number under the old key reads.
    pub unit: OldUnit,
}

impl Renamed {
    /// `old` is now `new`, with the same value.
    pub const fn to(old: &'static str, new: &'static str) -> Self {
        Self {
            old,
            new,
            unit: OldUnit::Same,
        }
    }

    /// `old` (a number of milliseconds) is now the duration `new`.
    pub const fn millis(old: &'static str, new: &'static str) -> Self {
        Self {
            old,
            new,
            unit: OldUnit::Millis,
        }
    }

    fn convert(&self, v: Value) -> Value {
        if self.unit == OldUnit::Same {
            return v;
        }
        let ms = match &v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        match ms.filter(|m| m.is_finite() && *m >= 0.0) {
            Some(ms) => Value::String(
                humantime::format_duration(Duration::from_secs_f64(ms.min(1e15) / 1000.0))
                    .to_string(),
            ),
            // Not a number: the new key's parser reports it.
            None => v,
        }
    }
}

/// An old name that was used: logged once at start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Deprecation {
    /// An old key in the file.
    #[error(
        "config key `{old}` is deprecated: it is now `{new}` (the old name is read until the next release)"
    )]
    Key {
        /// The old dotted path.
        old: String,
        /// The new one.
        new: String,
    },
    /// An old environment variable.
    #[error(
        "environment variable {old} is deprecated: it is now {new} (the old name is read until the next release)"
    )]
    Env {
        /// The old variable.
        old: String,
        /// The new one.
        new: String,
    },
    /// An old environment variable next to its new one: the new one wins.
    #[error("environment variable {old} is ignored: {new} is set too (and {old} is deprecated)")]
    EnvIgnored {
        /// The old variable.
        old: String,
        /// The new one.
        new: String,
    },
}

impl Deprecation {
    /// Logs the warning, once per process whatever the number of loads
    /// (`omicos up` loads one section per service from one environment).
    pub fn warn_once(&self) {
        static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
        let text = self.to_string();
        let first = SEEN
            .get_or_init(Default::default)
            .lock()
            .map(|mut s| s.insert(text.clone()))
            .unwrap_or(true);
        if first {
            tracing::warn!("{text}");
        }
    }
}

/// A loaded, validated config and the old names it was read under.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The config.
    pub config: T,
    /// Old keys and variables that were used, to warn about.
    pub deprecations: Vec<Deprecation>,
}

/// Loads `T` from its defaults, an optional YAML file and the environment,
/// and validates it. Old key names are read and logged (once) as warnings.
pub fn load_config<T: ServiceConfig>(
    file: Option<&Path>,
    env: &[(String, String)],
) -> Result<T, ConfigError> {
    let loaded = load_config_noting::<T>(file, env)?;
    for d in &loaded.deprecations {
        d.warn_once();
    }
    Ok(loaded.config)
}

/// Like [`load_config`], returning the deprecations instead of logging them
/// (for a binary that starts its logging after it read its config).
pub fn load_config_noting<T: ServiceConfig>(
    file: Option<&Path>,
    env: &[(String, String)],
) -> Result<Loaded<T>, ConfigError> {
    let overlay = match file {
        Some(path) => Some(read_yaml(path, env)?),
        None => None,
    };
    load_layers(overlay, env, "")
}

/// Reads a YAML file, with `${VAR}` expanded from `env`.
pub fn read_yaml(path: &Path, env: &[(String, String)]) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let expanded = expand_vars(&text, env);
    serde_yaml::from_str(&expanded).map_err(|e| ConfigError::Syntax {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Like [`load_config`], with the file already parsed (one section of a
/// whole-stack file). `section` prefixes key names in messages.
pub fn load_config_value<T: ServiceConfig>(
    overlay: Option<Value>,
    env: &[(String, String)],
    section: &str,
) -> Result<T, ConfigError> {
    let loaded = load_layers::<T>(overlay, env, section)?;
    for d in &loaded.deprecations {
        d.warn_once();
    }
    Ok(loaded.config)
}

fn load_layers<T: ServiceConfig>(
    overlay: Option<Value>,
    env: &[(String, String)],
    section: &str,
) -> Result<Loaded<T>, ConfigError> {
    let mut deprecations = Vec::new();
    let mut tree = serde_yaml::to_value(T::default())
        .map_err(|e| ConfigError::key(section, format!("the defaults do not serialize: {e}")))?;
    if let Some(mut overlay) = overlay.filter(|v| !v.is_null()) {
        rename_in_file(&mut overlay, T::RENAMED, section, &mut deprecations)?;
        merge(&mut tree, overlay, section)?;
    }
    let env = rename_in_env(env, T::RENAMED, &mut deprecations);
    apply_env(&mut tree, &env);
    let config: T = serde_path_to_error::deserialize(tree).map_err(|e| {
        ConfigError::key(
            qualified(section, &e.path().to_string()),
            e.inner().to_string(),
        )
    })?;
    config.validate().map_err(|e| e.in_section(section))?;
    Ok(Loaded {
        config,
        deprecations,
    })
}

/// The `OMICOS_*` variables in `env` that `T` reads under no name, neither a
/// key of its own nor a renamed one. A service's own environment (a container,
/// say) should have none: each is a typo or a setting for another service, and
/// is otherwise ignored without a word (`tests/tests/deploy.rs` checks the
/// manifests with it).
pub fn unknown_env<T: ServiceConfig>(env: &[(String, String)]) -> Vec<String> {
    let mut known = HashSet::new();
    if let Ok(mut tree) = serde_yaml::to_value(T::default()) {
        for_each_env_leaf(&mut tree, &mut |name, _| {
            known.insert(name.to_owned());
        });
    }
    known.extend(T::RENAMED.iter().map(|r| env_name(r.old)));
    env.iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("OMICOS_") && !known.contains(k.as_str()))
        .cloned()
        .collect()
}

/// The process environment as pairs, for [`load_config`].
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars().collect()
}

fn qualified(section: &str, key: &str) -> String {
    match (section.is_empty(), key.is_empty()) {
        (true, _) => key.to_owned(),
        (false, true) => section.to_owned(),
        (false, false) => format!("{section}.{key}"),
    }
}

/// `OMICOS_` and the key path in upper case, dots as underscores.
pub fn env_name(path: &str) -> String {
    format!("OMICOS_{}", path.replace('.', "_").to_ascii_uppercase())
}

fn take_path(tree: &mut Value, path: &str) -> Option<Value> {
    let (parent, last) = match path.rsplit_once('.') {
        Some((p, l)) => (get_path_mut(tree, p)?, l),
        None => (tree, path),
    };
    parent.as_mapping_mut()?.remove(last)
}

fn get_path_mut<'a>(tree: &'a mut Value, path: &str) -> Option<&'a mut Value> {
    path.split('.')
        .try_fold(tree, |v, k| v.as_mapping_mut()?.get_mut(k))
}

fn set_path(tree: &mut Value, path: &str, value: Value) {
    let mut slot = tree;
    let mut parts = path.split('.').peekable();
    while let Some(k) = parts.next() {
        let Some(m) = slot.as_mapping_mut() else {
            // Not a mapping: merge names the key that is wrong.
            return;
        };
        let key = Value::String(k.to_owned());
        if parts.peek().is_none() {
            m.insert(key, value);
            return;
        }
        slot = m
            .entry(key)
            .or_insert_with(|| Value::Mapping(Default::default()));
    }
}

fn rename_in_file(
    tree: &mut Value,
    renamed: &[Renamed],
    section: &str,
    notes: &mut Vec<Deprecation>,
) -> Result<(), ConfigError> {
    for r in renamed {
        let Some(v) = take_path(tree, r.old) else {
            continue;
        };
        if get_path_mut(tree, r.new).is_some() {
            return Err(ConfigError::key(
                qualified(section, r.old),
                format!(
                    "is the old name of `{}`, which is set too: keep only `{}`",
                    qualified(section, r.new),
                    qualified(section, r.new)
                ),
            ));
        }
        set_path(tree, r.new, r.convert(v));
        notes.push(Deprecation::Key {
            old: qualified(section, r.old),
            new: qualified(section, r.new),
        });
    }
    Ok(())
}

fn rename_in_env(
    env: &[(String, String)],
    renamed: &[Renamed],
    notes: &mut Vec<Deprecation>,
) -> Vec<(String, String)> {
    let mut out = env.to_vec();
    let set = |name: &str| env.iter().any(|(k, v)| k == name && !v.is_empty());
    for r in renamed {
        let (old, new) = (env_name(r.old), env_name(r.new));
        let Some((_, raw)) = env.iter().find(|(k, v)| *k == old && !v.is_empty()) else {
            continue;
        };
        if set(&new) {
            notes.push(Deprecation::EnvIgnored { old, new });
            continue;
        }
        let value = match r.convert(Value::String(raw.clone())) {
            Value::String(s) => s,
            _ => raw.clone(),
        };
        out.push((new.clone(), value));
        notes.push(Deprecation::Env { old, new });
    }
    out
}

fn merge(base: &mut Value, overlay: Value, path: &str) -> Result<(), ConfigError> {
    match (base, overlay) {
        // A map whose default is empty is the operator's to fill (agent ids,
        // model names, tool names): its keys are data, not settings to check.
        // Merging key by key refused every one as unknown.
        (Value::Mapping(b), Value::Mapping(o)) if b.is_empty() => {
            *b = o;
            Ok(())
        }
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                let key = k
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("{k:?}"));
                let sub = qualified(path, &key);
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v, &sub)?,
                    None => return Err(ConfigError::key(sub, "unknown key")),
                }
            }
            Ok(())
        }
        (slot, v) => {
            *slot = v;
            Ok(())
        }
    }
}

fn apply_env(tree: &mut Value, env: &[(String, String)]) {
    for_each_env_leaf(tree, &mut |name, leaf| {
        if let Some((_, raw)) = env.iter().find(|(k, _)| k == name) {
            *leaf = parse_env_value(leaf, raw);
        }
    });
}

/// Calls `f` with each leaf of `tree` and the `OMICOS_*` variable that names
/// it (mapping keys upper-cased, joined by `_`): the one rule both
/// [`apply_env`] and [`unknown_env`] follow.
fn for_each_env_leaf(tree: &mut Value, f: &mut impl FnMut(&str, &mut Value)) {
    fn walk(v: &mut Value, prefix: &str, f: &mut impl FnMut(&str, &mut Value)) {
        match v {
            Value::Mapping(m) => {
                for (k, child) in m.iter_mut() {
                    if let Some(k) = k.as_str() {
                        walk(child, &format!("{prefix}_{}", k.to_ascii_uppercase()), f);
                    }
                }
            }
            leaf => f(prefix, leaf),
        }
    }
    walk(tree, "OMICOS", f);
}

fn parse_env_value(current: &Value, raw: &str) -> Value {
    match current {
        // Strings stay strings even when they look like numbers.
        Value::String(_) => Value::String(raw.to_owned()),
        // A YAML flow sequence as it is (`[a, "b, c"]`).
        Value::Sequence(_) if raw.trim_start().starts_with('[') => serde_yaml::from_str(raw)
            .ok()
            .filter(Value::is_sequence)
            .unwrap_or_else(|| Value::Sequence(list_items(raw))),
        Value::Sequence(_) => Value::Sequence(list_items(raw)),
        _ => serde_yaml::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned())),
    }
}

/// The items of a comma-separated list: commas inside brackets, or inside an
/// item quoted as a whole, belong to the item (`shell(git log
/// --format=%h,%s)` is one rule; an apostrophe inside an item is a letter).
fn list_items(raw: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let (mut depth, mut quote, mut start) = (0usize, None::<char>, 0usize);
    for (i, c) in raw.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') if raw[start..i].trim().is_empty() => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            (None, ',') if depth == 0 => {
                items.push(&raw[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&raw[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| serde_yaml::from_str(s).unwrap_or_else(|_| Value::String(s.to_owned())))
        .collect()
}

/// Expands `${VAR}` and `${VAR:-default}` in a config file's text.
pub fn expand_vars(text: &str, env: &[(String, String)]) -> String {
    let re =
        regex::Regex::new(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}").expect("static regex");
    re.replace_all(text, |c: &regex::Captures<'_>| {
        let name = &c[1];
        env.iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| c.get(2).map(|m| m.as_str().to_owned()).unwrap_or_default())
    })
    .into_owned()
}

/// Refuses a zero duration under `key`: a timeout, TTL or interval of zero
/// would fire at once or spin.
pub fn require_nonzero(key: &str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        Err(ConfigError::key(
            key,
            "must be more than 0 (a number of seconds, or a value with a unit: 500ms, 30s, 5m)",
        ))
    } else {
        Ok(())
    }
}

/// Refuses a registry TTL that is neither 0 (the registry's default) nor
/// at least a second: registrations count whole seconds.
pub fn require_registry_ttl(key: &str, value: Duration) -> Result<(), ConfigError> {
    if !value.is_zero() && value < Duration::from_secs(1) {
        Err(ConfigError::key(
            key,
            format!(
                "{} is under a second: use 0 (the registry's default) or at least 1s",
                duration::format(value)
            ),
        ))
    } else {
        Ok(())
    }
}

/// `value` in whole seconds for a `u32` wire field (registry TTLs), saturating.
pub fn whole_secs_u32(value: Duration) -> u32 {
    u32::try_from(value.as_secs()).unwrap_or(u32::MAX)
}

/// Durations in config: `#[serde(with = "omicos_servicekit::config::duration")]`.
///
/// Read from a number of seconds (`30`, `0.5`) or a string: a number of
/// seconds (`"30"`, as environment variables arrive) or a value with units
/// (`"500ms"`, `"30s"`, `"5m"`, `"1h 30m"`, as [`humantime`] spells them).
/// Written in the unit form, so the defaults read back the same.
pub mod duration {
    use serde::{Deserialize, Deserializer, Serializer, de};
    use std::time::Duration;

    /// A text that is not a duration.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    #[error(
        "`{text}` is not a duration: use a number of seconds or a value with a unit (500ms, 30s, 5m, 1h){detail}"
    )]
    pub struct DurationError {
        text: String,
        detail: String,
    }

    /// Parses a number of seconds or a value with units.
    pub fn parse(text: &str) -> Result<Duration, DurationError> {
        let t = text.trim();
        let fail = |detail: String| DurationError {
            text: t.to_owned(),
            detail,
        };
        if let Ok(secs) = t.parse::<f64>() {
            return from_secs(secs).map_err(|e| fail(format!(" ({e})")));
        }
        humantime::parse_duration(t).map_err(|e| fail(format!(" ({e})")))
    }

    fn from_secs(secs: f64) -> Result<Duration, String> {
        if secs < 0.0 {
            return Err("negative".into());
        }
        Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
    }

    /// Writes `d` in the unit form (`1m 30s`).
    pub fn format(d: Duration) -> String {
        humantime::format_duration(d).to_string()
    }

    /// Serializes in the unit form.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*d))
    }

    /// Deserializes a number of seconds or a string (see the module).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(Visitor)
    }

    struct Visitor;

    impl de::Visitor<'_> for Visitor {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration: a number of seconds or a string such as 500ms, 30s, 5m")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(v))
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_secs)
                .map_err(|_| E::custom(format!("{v} is negative: a duration must not be")))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            from_secs(v).map_err(|e| E::custom(format!("{v} is not a duration in seconds: {e}")))
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            parse(v).map_err(E::custom)
        }
    }

    /// A duration that may be absent: `#[serde(default, with = "omicos_servicekit::config::duration::option")]`.
    pub mod option {
        use super::*;

        struct Wrapped(Duration);

        impl<'de> Deserialize<'de> for Wrapped {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                super::deserialize(d).map(Wrapped)
            }
        }

        /// Serializes `None` as null, `Some` in the unit form.
        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        /// Deserializes null or a duration.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Llm {
        base_url: String,
        retries: u32,
        #[serde(with = "duration")]
        idle_timeout: Duration,
        #[serde(with = "duration")]
        retry_base_delay: Duration,
    }
    impl Default for Llm {
        fn default() -> Self {
            Self {
                base_url: "http://x".into(),
                retries: 3,
                idle_timeout: Duration::from_secs(120),
                retry_base_delay: Duration::from_millis(500),
            }
        }
    }
    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Cfg {
        listen: String,
        llm: Llm,
        toolsets: Vec<String>,
        #[serde(with = "duration")]
        shutdown_grace: Duration,
        #[serde(with = "duration::option")]
        hook_timeout: Option<Duration>,
        windows: std::collections::BTreeMap<String, u64>,
    }
    impl Default for Cfg {
        fn default() -> Self {
            Self {
                listen: String::new(),
                llm: Llm::default(),
                toolsets: Vec::new(),
                shutdown_grace: Duration::from_secs(10),
                hook_timeout: None,
                windows: Default::default(),
            }
        }
    }
    impl ServiceConfig for Cfg {
        const RENAMED: &'static [Renamed] = &[
            Renamed::to("grace_secs", "shutdown_grace"),
            Renamed::to("llm.idle_timeout_secs", "llm.idle_timeout"),
            Renamed::millis("llm.retry_base_ms", "llm.retry_base_delay"),
        ];
        fn validate(&self) -> Result<(), ConfigError> {
            require_nonzero("llm.idle_timeout", self.llm.idle_timeout)
        }
    }

    struct TempFile(std::path::PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn write(text: &str) -> TempFile {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "omicos-cfg-{}-{}.yaml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&p, text).unwrap();
        TempFile(p)
    }
    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A map whose default is empty takes the operator's keys (they are
    /// data: model names, agent ids); a key beside it is still checked.
    #[test]
    fn an_empty_default_map_takes_the_operators_keys() {
        let f = write("windows:\n  gpt-x: 1000\n  claude-y: 2000\n");
        let c: Cfg = load_config(Some(&f.0), &[]).unwrap();
        assert_eq!(c.windows.get("gpt-x"), Some(&1000));
        assert_eq!(c.windows.get("claude-y"), Some(&2000));
        let f = write("windows:\n  gpt-x: 1000\nwindowz: {}\n");
        let e = load_config::<Cfg>(Some(&f.0), &[]).unwrap_err();
        assert_eq!(e.key_path(), Some("windowz"), "{e}");
        let f = write("windows:\n  gpt-x: many\n");
        assert!(load_config::<Cfg>(Some(&f.0), &[]).is_err());
    }

    #[test]
    fn layers_apply_in_order() {
        let f = write("listen: 1.2.3.4:5\nllm:\n  base_url: ${BASE:-http://default}\n");
        let c: Cfg = load_config(Some(&f.0), &env(&[("OMICOS_LLM_RETRIES", "7")])).unwrap();
        assert_eq!(c.listen, "1.2.3.4:5");
        assert_eq!(c.llm.base_url, "http://default");
        assert_eq!(c.llm.retries, 7);
        let e = env(&[
            ("BASE", "http://from-env"),
            ("OMICOS_TOOLSETS", "web, shell"),
        ]);
        let c: Cfg = load_config(Some(&f.0), &e).unwrap();
        assert_eq!(c.llm.base_url, "http://from-env");
        assert_eq!(c.toolsets, vec!["web", "shell"]);
    }

    #[test]
    fn env_lists_keep_commas_inside_rules_and_quotes() {
        let list = |raw: &str| -> Vec<String> {
            match parse_env_value(&Value::Sequence(vec![]), raw) {
                Value::Sequence(v) => v.iter().map(|v| v.as_str().unwrap().to_owned()).collect(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            list(
                "shell(git log --format=%h,%s), web_fetch(domain:example.org),file_manager__write(docs/{a,b}/**)"
            ),
            [
                "shell(git log --format=%h,%s)",
                "web_fetch(domain:example.org)",
                "file_manager__write(docs/{a,b}/**)"
            ]
        );
        assert_eq!(list(r#""a, b", c"#), ["a, b", "c"]);
        assert_eq!(list("shell(echo it's), web"), ["shell(echo it's)", "web"]);
        assert_eq!(list(r#"["x, y", z]"#), ["x, y", "z"]);
        assert_eq!(list(" , web,, "), ["web"]);
    }

    #[test]
    fn unknown_env_names_what_no_key_reads() {
        let e = env(&[
            ("OMICOS_LISTEN", "x"),
            ("OMICOS_LLM_RETRIES", "2"),
            ("OMICOS_HOOK_TIMEOUT", "1s"),
            ("OMICOS_GRACE_SECS", "3"),
            ("OMICOS_LLM", "not a leaf"),
            ("OMICOS_LISTN", "typo"),
            ("PATH", "/bin"),
        ]);
        assert_eq!(unknown_env::<Cfg>(&e), vec!["OMICOS_LLM", "OMICOS_LISTN"]);
    }

    #[test]
    fn bad_config_names_the_key() {
        let f = write("llm:\n  retries: lots\n");
        let err = load_config::<Cfg>(Some(&f.0), &[]).unwrap_err().to_string();
        assert!(err.contains("llm.retries"), "{err}");
        let f = write("llm:\n  base_ulr: x\n");
        let err = load_config::<Cfg>(Some(&f.0), &[]).unwrap_err().to_string();
        assert!(
            err.contains("llm.base_ulr") && err.contains("unknown"),
            "{err}"
        );
        let err = load_config::<Cfg>(None, &env(&[("OMICOS_LLM_RETRIES", "-1")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("llm.retries"), "{err}");
    }

    #[test]
    fn durations_read_seconds_and_units_from_file_and_environment() {
        let f = write(
            "shutdown_grace: 3\nllm:\n  idle_timeout: 1m 30s\n  retry_base_delay: 250ms\nhook_timeout: 0.5\n",
        );
        let c: Cfg = load_config(Some(&f.0), &[]).unwrap();
        assert_eq!(c.shutdown_grace, Duration::from_secs(3));
        assert_eq!(c.llm.idle_timeout, Duration::from_secs(90));
        assert_eq!(c.llm.retry_base_delay, Duration::from_millis(250));
        assert_eq!(c.hook_timeout, Some(Duration::from_millis(500)));
        let e = env(&[
            ("OMICOS_SHUTDOWN_GRACE", "30"),
            ("OMICOS_LLM_IDLE_TIMEOUT", "5m"),
            ("OMICOS_HOOK_TIMEOUT", "2s"),
        ]);
        let c: Cfg = load_config(None, &e).unwrap();
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert_eq!(c.llm.idle_timeout, Duration::from_secs(300));
        assert_eq!(c.hook_timeout, Some(Duration::from_secs(2)));
        // The defaults survive their own round trip.
        assert_eq!(load_config::<Cfg>(None, &[]).unwrap(), Cfg::default());
        for (bad, why) in [
            ("shutdown_grace: soon\n", "not a duration"),
            ("shutdown_grace: -2\n", "negative"),
            ("shutdown_grace: 5 parsecs\n", "not a duration"),
        ] {
            let f = write(bad);
            let err = load_config::<Cfg>(Some(&f.0), &[]).unwrap_err().to_string();
            assert!(
                err.contains("config key `shutdown_grace`") && err.contains(why),
                "{bad}: {err}"
            );
        }
        assert_eq!(
            duration::parse("1h 30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(duration::format(Duration::from_millis(1500)), "1s 500ms");
    }

    #[test]
    fn validation_runs_at_load_and_names_the_key_in_its_section() {
        let f = write("llm:\n  idle_timeout: 0s\n");
        let err = load_config::<Cfg>(Some(&f.0), &[]).unwrap_err();
        assert_eq!(err.key_path(), Some("llm.idle_timeout"));
        assert!(err.to_string().contains("must be more than 0"), "{err}");
        let section: Value = serde_yaml::from_str("llm: {idle_timeout: 0}").unwrap();
        let err = load_config_value::<Cfg>(Some(section), &[], "orchestrator").unwrap_err();
        assert_eq!(err.key_path(), Some("orchestrator.llm.idle_timeout"));
    }

    #[test]
    fn old_keys_are_read_with_a_warning_and_millis_convert() {
        let f = write("grace_secs: 4\nllm:\n  idle_timeout_secs: 7\n  retry_base_ms: 1500\n");
        let l = load_config_noting::<Cfg>(Some(&f.0), &[]).unwrap();
        assert_eq!(l.config.shutdown_grace, Duration::from_secs(4));
        assert_eq!(l.config.llm.idle_timeout, Duration::from_secs(7));
        assert_eq!(l.config.llm.retry_base_delay, Duration::from_millis(1500));
        let text: Vec<String> = l.deprecations.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(
            text[0].contains("`grace_secs` is deprecated") && text[0].contains("`shutdown_grace`"),
            "{text:?}"
        );
        // Both names at once is ambiguous: refused, naming both.
        let f = write("grace_secs: 4\nshutdown_grace: 5\n");
        let err = load_config::<Cfg>(Some(&f.0), &[]).unwrap_err().to_string();
        assert!(
            err.contains("`grace_secs`") && err.contains("keep only `shutdown_grace`"),
            "{err}"
        );
        // In a section the messages carry its name.
        let section: Value = serde_yaml::from_str("grace_secs: 2").unwrap();
        let l = load_layers::<Cfg>(Some(section), &[], "memory").unwrap();
        assert_eq!(
            l.deprecations,
            vec![Deprecation::Key {
                old: "memory.grace_secs".into(),
                new: "memory.shutdown_grace".into()
            }]
        );
    }

    #[test]
    fn old_environment_variables_are_read_unless_the_new_one_is_set() {
        let e = env(&[
            ("OMICOS_GRACE_SECS", "6"),
            ("OMICOS_LLM_RETRY_BASE_MS", "40"),
        ]);
        let l = load_config_noting::<Cfg>(None, &e).unwrap();
        assert_eq!(l.config.shutdown_grace, Duration::from_secs(6));
        assert_eq!(l.config.llm.retry_base_delay, Duration::from_millis(40));
        assert!(l.deprecations.contains(&Deprecation::Env {
            old: "OMICOS_GRACE_SECS".into(),
            new: "OMICOS_SHUTDOWN_GRACE".into()
        }));
        let e = env(&[("OMICOS_GRACE_SECS", "6"), ("OMICOS_SHUTDOWN_GRACE", "8s")]);
        let l = load_config_noting::<Cfg>(None, &e).unwrap();
        assert_eq!(l.config.shutdown_grace, Duration::from_secs(8));
        assert_eq!(
            l.deprecations,
            vec![Deprecation::EnvIgnored {
                old: "OMICOS_GRACE_SECS".into(),
                new: "OMICOS_SHUTDOWN_GRACE".into()
            }]
        );
    }
}
