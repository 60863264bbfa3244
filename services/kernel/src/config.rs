//! Configuration of the kernel provider service.

use serde::{Deserialize, Serialize};

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
    /// Workspace root used when a call carries none (`OMICOS_WORKSPACE`).
    pub workspace: String,
    /// Registry TTL in seconds; 0: the registry's default.
    pub ttl_seconds: u32,
    /// Drain grace period on SIGTERM, in seconds.
    pub grace_seconds: u64,
    /// The kernels themselves (`OMICOS_KERNEL_*`).
    pub kernel: KernelConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            registry: String::new(),
            advertise: String::new(),
            workspace: ".".into(),
            ttl_seconds: 0,
            grace_seconds: 10,
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
    pub idle_cull_seconds: u64,
    /// Default per-call timeout of run_python_code.
    pub timeout_seconds: f64,
    /// How long each interrupt step (interrupt_request, SIGINT) waits before the next.
    pub interrupt_grace_seconds: f64,
    /// Time a kernel may take to become ready.
    pub startup_timeout_seconds: f64,
    /// Heartbeat period; a kernel that misses three in a row is declared dead.
    pub heartbeat_seconds: f64,
    /// kernel_install's pip timeout.
    pub install_timeout_seconds: f64,
    /// kernel_install keeps at most this much pip output (head and tail).
    pub install_output_bytes: usize,
    /// run_python_code keeps at most this much of stdout and of stderr.
    pub max_output_bytes: usize,
    /// registry_lookup's time budget.
    pub lookup_timeout_seconds: f64,
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
            idle_cull_seconds: 3600,
            timeout_seconds: 600.0,
            interrupt_grace_seconds: 5.0,
            startup_timeout_seconds: 60.0,
            heartbeat_seconds: 5.0,
            install_timeout_seconds: 600.0,
            install_output_bytes: 32 * 1024,
            max_output_bytes: 1 << 20,
            lookup_timeout_seconds: 60.0,
            sandbox: omicos_sandbox::SandboxConfig::for_kernels(),
        }
    }
}

impl KernelConfig {
    /// Refuses values that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        self.sandbox
            .validate()
            .map_err(|e| format!("config key `kernel.sandbox.{}`: {}", e.key, e.reason))?;
        if !self.sandbox.agent_policies.is_empty() {
            return Err("kernel.sandbox.agent_policies: a kernel belongs to a session and serves every agent in it; set kernel.sandbox.policy instead".into());
        }
        if self.max_kernels == 0 {
            return Err("kernel.max_kernels must be at least 1".into());
        }
        for (key, v) in [
            ("kernel.timeout_seconds", self.timeout_seconds),
            (
                "kernel.interrupt_grace_seconds",
                self.interrupt_grace_seconds,
            ),
            (
                "kernel.startup_timeout_seconds",
                self.startup_timeout_seconds,
            ),
            ("kernel.heartbeat_seconds", self.heartbeat_seconds),
            (
                "kernel.install_timeout_seconds",
                self.install_timeout_seconds,
            ),
            ("kernel.lookup_timeout_seconds", self.lookup_timeout_seconds),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{key} must be a positive number of seconds, not {v}"
                ));
            }
        }
        Ok(())
    }
}
