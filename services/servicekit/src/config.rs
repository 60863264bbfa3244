//! Configuration: defaults, then a YAML file (with `${VAR:-default}` expansion),
//! then `OMICOS_*` environment variables. Validated once, at start.
//!
//! Environment names are derived from the key path: `llm.base_url` is
//! `OMICOS_LLM_BASE_URL`. Only keys that the service knows are read from the
//! environment (one environment may serve several services); unknown keys in
//! the file are refused, naming the key.

use serde::{Serialize, de::DeserializeOwned};
pub use serde_yaml::Value;
use std::path::Path;

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
    /// A key has a value of the wrong kind, or is unknown.
    #[error("config key `{key}`: {message}")]
    Key {
        /// Dotted key path.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// Loads `T` from its defaults, an optional YAML file and the environment.
pub fn load_config<T>(file: Option<&Path>, env: &[(String, String)]) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default,
{
    let overlay = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.display().to_string(),
                source,
            })?;
            let expanded = expand_vars(&text, env);
            let v: Value = serde_yaml::from_str(&expanded).map_err(|e| ConfigError::Syntax {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            Some(v)
        }
        None => None,
    };
    load_config_value(overlay, env, "")
}

/// Like [`load_config`], with the file already parsed (e.g. one section of a
/// whole-stack file). `section` prefixes key names in error messages.
pub fn load_config_value<T>(
    overlay: Option<Value>,
    env: &[(String, String)],
    section: &str,
) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default,
{
    let mut tree = serde_yaml::to_value(T::default()).map_err(|e| ConfigError::Key {
        key: String::new(),
        message: e.to_string(),
    })?;
    if let Some(overlay) = overlay.filter(|v| !v.is_null()) {
        merge(&mut tree, overlay, section)?;
    }
    apply_env(&mut tree, env);
    serde_path_to_error::deserialize(tree).map_err(|e| ConfigError::Key {
        key: if section.is_empty() {
            e.path().to_string()
        } else {
            format!("{section}.{}", e.path())
        },
        message: e.inner().to_string(),
    })
}

/// The process environment as pairs, for [`load_config`].
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars().collect()
}

fn merge(base: &mut Value, overlay: Value, path: &str) -> Result<(), ConfigError> {
    match (base, overlay) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                let key = k
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("{k:?}"));
                let sub = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v, &sub)?,
                    None => {
                        return Err(ConfigError::Key {
                            key: sub,
                            message: "unknown key".into(),
                        });
                    }
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
    fn walk(v: &mut Value, prefix: &str, env: &[(String, String)]) {
        match v {
            Value::Mapping(m) => {
                for (k, child) in m.iter_mut() {
                    if let Some(k) = k.as_str() {
                        let name = format!("{prefix}_{}", k.to_ascii_uppercase());
                        walk(child, &name, env);
                    }
                }
            }
            leaf => {
                if let Some((_, raw)) = env.iter().find(|(k, _)| k == prefix) {
                    *leaf = parse_env_value(leaf, raw);
                }
            }
        }
    }
    walk(tree, "OMICOS", env);
}

fn parse_env_value(current: &Value, raw: &str) -> Value {
    match current {
        // Strings stay strings even when they look like numbers.
        Value::String(_) => Value::String(raw.to_owned()),
        Value::Sequence(_) => Value::Sequence(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| serde_yaml::from_str(s).unwrap_or_else(|_| Value::String(s.to_owned())))
                .collect(),
        ),
        _ => serde_yaml::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Llm {
        base_url: String,
        retries: u32,
    }
    impl Default for Llm {
        fn default() -> Self {
            Self {
                base_url: "http://x".into(),
                retries: 3,
            }
        }
    }
    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Cfg {
        listen: String,
        llm: Llm,
        toolsets: Vec<String>,
    }

    fn write(text: &str) -> tempfile_path::TempPath {
        tempfile_path::write(text)
    }

    mod tempfile_path {
        pub struct TempPath(pub std::path::PathBuf);
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        pub fn write(text: &str) -> TempPath {
            let p = std::env::temp_dir().join(format!(
                "omicos-cfg-{}.yaml",
                std::process::id() as u64 * 1000 + rand_suffix()
            ));
            std::fs::write(&p, text).unwrap();
            TempPath(p)
        }
        fn rand_suffix() -> u64 {
            use std::sync::atomic::{AtomicU64, Ordering};
            static N: AtomicU64 = AtomicU64::new(0);
            N.fetch_add(1, Ordering::Relaxed)
        }
    }

    #[test]
    fn layers_apply_in_order() {
        let f = write("listen: 1.2.3.4:5\nllm:\n  base_url: ${BASE:-http://default}\n");
        let env = vec![("OMICOS_LLM_RETRIES".to_string(), "7".to_string())];
        let c: Cfg = load_config(Some(&f.0), &env).unwrap();
        assert_eq!(c.listen, "1.2.3.4:5");
        assert_eq!(c.llm.base_url, "http://default");
        assert_eq!(c.llm.retries, 7);
        let env = vec![
            ("BASE".to_string(), "http://from-env".to_string()),
            ("OMICOS_TOOLSETS".to_string(), "web, shell".to_string()),
        ];
        let c: Cfg = load_config(Some(&f.0), &env).unwrap();
        assert_eq!(c.llm.base_url, "http://from-env");
        assert_eq!(c.toolsets, vec!["web", "shell"]);
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
        let env = vec![("OMICOS_LLM_RETRIES".to_string(), "-1".to_string())];
        let err = load_config::<Cfg>(None, &env).unwrap_err().to_string();
        assert!(err.contains("llm.retries"), "{err}");
    }
}
