//! Configuration of the kernel provider service.

use omicos_servicekit::config::{ConfigError, Renamed, ServiceConfig, duration, require_nonzero};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The service's configuration: defaults, then the YAML file, then `OMICOS_*`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on (`OMICOS_LISTEN`); port 0 picks one.
    pub listen: String,
    /// Registry to announce to (`OMICOS_REGISTRY`); empty: do not register.
    pub registry: String,
    /// Endpoint to announce (`OMICOS_ADVERTISE`); empty: `http://<bound address>`.
    pub advertise: String,
    /// TLS (`tls.cert`, `tls.key`, `tls.client_ca`, `tls.ca`): the port
    /// serves TLS with `cert`/`key`; with `client_ca` only peers presenting a
    /// certificate from that CA get in (mutual TLS); `ca` verifies an
    /// `https://` registry, `cert`/`key` is also the client certificate to it.
    pub tls: omicos_servicekit::TlsConfig,
    /// Workspace root used when a call carries none (`OMICOS_WORKSPACE`).
    pub workspace: String,
    /// The TTL asked of the registry (whole seconds); 0: the registry's default.
    #[serde(with = "duration")]
    pub registry_ttl: Duration,
    /// Drain grace period on SIGTERM.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Where `GET /metrics` (Prometheus) is served, e.g. `0.0.0.0:9464`; empty: not served.
    pub metrics_addr: String,
    /// The kernels themselves (`OMICOS_KERNEL_*`).
    pub kernel: KernelConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            registry: String::new(),
            advertise: String::new(),
            tls: Default::default(),
            workspace: ".".into(),
            registry_ttl: Duration::ZERO,
            shutdown_grace: Duration::from_secs(10),
            metrics_addr: String::new(),
            kernel: KernelConfig::default(),
        }
    }
}

/// How kernels are started, pooled, bounded and stopped.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct KernelConfig {
    /// The interpreter (`OMICOS_KERNEL_PYTHON`); empty: resolve it (see README).
    pub python: String,
    /// Started kernels kept ready for new sessions.
    pub pool_size: usize,
    /// Kernels (session and warm) this instance may run at once.
    pub max_kernels: usize,
    /// A session kernel unused this long is stopped (0: never).
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// Default per-call timeout of run_python_code.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// How long each interrupt step (interrupt_request, SIGINT) waits before the next.
    #[serde(with = "duration")]
    pub interrupt_grace: Duration,
    /// Time a kernel may take to become ready.
    #[serde(with = "duration")]
    pub startup_timeout: Duration,
    /// Heartbeat period; a kernel that misses three in a row is declared dead.
    #[serde(with = "duration")]
    pub heartbeat_interval: Duration,
    /// kernel_install's pip timeout.
    #[serde(with = "duration")]
    pub install_timeout: Duration,
    /// kernel_install keeps at most this much pip output (head and tail).
    pub install_output_bytes: usize,
    /// Hosts, IP addresses and CIDRs kernel_install's `index_url` may name
    /// although they are loopback, private, link-local or otherwise not
    /// public (a company's package mirror); the same rules and spelling as
    /// `web.allow` (omicos-ssrf). Empty: only public addresses.
    pub install_index_allow: Vec<String>,
    /// run_python_code keeps at most this much of stdout and of stderr.
    pub max_output_bytes: usize,
    /// registry_lookup's time budget.
    #[serde(with = "duration")]
    pub lookup_timeout: Duration,
    /// How kernels (and kernel_install's pip) are confined. Defaults as for
    /// shell, but no CPU-time limit: RLIMIT_CPU would count the whole session.
    pub sandbox: omicos_sandbox::SandboxConfig,
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            python: String::new(),
            pool_size: 1,
            max_kernels: 16,
            idle_timeout: Duration::from_secs(3600),
            timeout: Duration::from_secs(600),
            interrupt_grace: Duration::from_secs(5),
            startup_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(5),
            install_timeout: Duration::from_secs(600),
            install_output_bytes: 32 * 1024,
            install_index_allow: Vec::new(),
            max_output_bytes: 1 << 20,
            lookup_timeout: Duration::from_secs(60),
            sandbox: omicos_sandbox::SandboxConfig::for_kernels(),
        }
    }
}

impl ServiceConfig for Config {
    const RENAMED: &'static [Renamed] = &[
        Renamed::to("ttl_seconds", "registry_ttl"),
        Renamed::to("grace_seconds", "shutdown_grace"),
        Renamed::to("kernel.idle_cull_seconds", "kernel.idle_timeout"),
        Renamed::to("kernel.timeout_seconds", "kernel.timeout"),
        Renamed::to("kernel.interrupt_grace_seconds", "kernel.interrupt_grace"),
        Renamed::to("kernel.startup_timeout_seconds", "kernel.startup_timeout"),
        Renamed::to("kernel.heartbeat_seconds", "kernel.heartbeat_interval"),
        Renamed::to("kernel.install_timeout_seconds", "kernel.install_timeout"),
        Renamed::to("kernel.lookup_timeout_seconds", "kernel.lookup_timeout"),
    ];

    fn validate(&self) -> Result<(), ConfigError> {
        // The files are read now, so a missing or garbled one stops the start.
        self.tls.load("tls")?;
        omicos_servicekit::config::require_registry_ttl("registry_ttl", self.registry_ttl)?;
        self.kernel.validate()
    }

    fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    fn metrics_addr(&self) -> Option<&str> {
        Some(self.metrics_addr.as_str()).filter(|a| !a.trim().is_empty())
    }
}

impl KernelConfig {
    /// The addresses kernel_install's `index_url` may reach.
    pub fn index_policy(&self) -> Result<omicos_ssrf::Policy, omicos_ssrf::BadAllowEntry> {
        omicos_ssrf::Policy::new(true, &self.install_index_allow)
    }

    /// Refuses values that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.sandbox
            .validate()
            .map_err(|e| ConfigError::key(format!("kernel.sandbox.{}", e.key), e.reason))?;
        if !self.sandbox.agent_policies.is_empty() {
            return Err(ConfigError::key(
                "kernel.sandbox.agent_policies",
                "a kernel belongs to a session and serves every agent in it; set kernel.sandbox.policy instead",
            ));
        }
        self.index_policy()
            .map_err(|e| ConfigError::key("kernel.install_index_allow", e.to_string()))?;
        if self.max_kernels == 0 {
            return Err(ConfigError::key("kernel.max_kernels", "must be at least 1"));
        }
        for (key, v) in [
            ("kernel.timeout", self.timeout),
            ("kernel.interrupt_grace", self.interrupt_grace),
            ("kernel.startup_timeout", self.startup_timeout),
            ("kernel.heartbeat_interval", self.heartbeat_interval),
            ("kernel.install_timeout", self.install_timeout),
            ("kernel.lookup_timeout", self.lookup_timeout),
        ] {
            require_nonzero(key, v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kernel.yaml");
        std::fs::write(&file, yaml).unwrap();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        omicos_servicekit::load_config(Some(&file), &env)
    }

    #[test]
    fn durations_take_units_and_the_old_seconds_keys_still_read() {
        let c = load(
            "kernel: {idle_timeout: 30m, timeout: 90, interrupt_grace: 500ms}\nregistry_ttl: 20s\n",
            &[("OMICOS_KERNEL_HEARTBEAT_INTERVAL", "2s")],
        )
        .unwrap();
        assert_eq!(c.kernel.idle_timeout, Duration::from_secs(1800));
        assert_eq!(c.kernel.timeout, Duration::from_secs(90));
        assert_eq!(c.kernel.interrupt_grace, Duration::from_millis(500));
        assert_eq!(c.kernel.heartbeat_interval, Duration::from_secs(2));
        assert_eq!(c.registry_ttl, Duration::from_secs(20));
        let c = load(
            "grace_seconds: 3\nkernel: {idle_cull_seconds: 0, timeout_seconds: 1.5}\n",
            &[("OMICOS_KERNEL_STARTUP_TIMEOUT_SECONDS", "7")],
        )
        .unwrap();
        assert_eq!(c.shutdown_grace, Duration::from_secs(3));
        assert!(c.kernel.idle_timeout.is_zero(), "0 still means never");
        assert_eq!(c.kernel.timeout, Duration::from_millis(1500));
        assert_eq!(c.kernel.startup_timeout, Duration::from_secs(7));
    }

    #[test]
    fn zero_timeouts_and_sub_second_ttls_are_refused_by_name() {
        let e = load("kernel: {timeout: 0}\n", &[]).unwrap_err();
        assert_eq!(e.key_path(), Some("kernel.timeout"));
        let e = load("registry_ttl: 200ms\n", &[]).unwrap_err();
        assert_eq!(e.key_path(), Some("registry_ttl"));
        assert!(e.to_string().contains("at least 1s"), "{e}");
        let e = load("kernel: {max_kernels: 0}\n", &[]).unwrap_err();
        assert!(e.to_string().contains("must be at least 1"), "{e}");
    }
}
