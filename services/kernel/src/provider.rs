//! The `kernel` provider: run_python_code, kernel_install, registry_lookup and
//! the notebook tools, over the session kernels.

use crate::config::KernelConfig;
use crate::install;
use crate::kernel::{ExecLimits, ExecOutcome, Interruption};
use crate::lookup::Lookup;
use crate::notebook::Notebook;
use crate::output::{collapse_cr, kept_mime};
use crate::sessions::{Kernels, session_file_name};
use async_trait::async_trait;
use base64::Engine;
use omicos_toolkit::{CallCtx, Provider, Risk, ToolError, ToolSpec, confine_tool_path, tool};
use serde_json::{Value, json};
use std::{path::PathBuf, sync::Arc, time::Duration};

const TOOLSET: &str = "integrated_notebook";

/// The kernel provider. Cheap to share: wrap it in an `Arc`.
pub struct KernelProvider {
    kernels: Arc<Kernels>,
    lookup: Lookup,
    /// Where kernel_install's index_url may point (omicos-ssrf, as web_fetch).
    index_policy: omicos_ssrf::Policy,
    /// How index hosts are resolved for that check.
    resolver: Arc<dyn omicos_ssrf::Lookup>,
}

impl KernelProvider {
    /// A provider whose default workspace is `workspace`, reading the
    /// interpreter environment variables from `env`. Starts the warm pool and
    /// the idle culler (needs a tokio runtime).
    pub fn new(
        cfg: KernelConfig,
        workspace: PathBuf,
        env: Vec<(String, String)>,
    ) -> Result<Arc<Self>, omicos_servicekit::ConfigError> {
        Self::with_resolver(cfg, workspace, env, Arc::new(omicos_ssrf::SystemLookup))
    }

    /// [`KernelProvider::new`], resolving index_url hosts with `resolver`
    /// (tests act out a name that resolves to a private address).
    pub fn with_resolver(
        cfg: KernelConfig,
        workspace: PathBuf,
        env: Vec<(String, String)>,
        resolver: Arc<dyn omicos_ssrf::Lookup>,
    ) -> Result<Arc<Self>, omicos_servicekit::ConfigError> {
        cfg.validate()?;
        let index_policy = cfg.index_policy().map_err(|e| {
            omicos_servicekit::ConfigError::key("kernel.install_index_allow", e.to_string())
        })?;
        let kernels = Kernels::new(cfg, workspace, env);
        kernels.spawn_background();
        Ok(Arc::new(Self {
            kernels,
            lookup: Lookup::default(),
            index_policy,
            resolver,
        }))
    }

    /// The session kernels (for tests, benches and shutdown).
    pub fn kernels(&self) -> &Arc<Kernels> {
        &self.kernels
    }

    /// Stops every kernel.
    pub async fn close(&self) {
        self.kernels.close().await
    }

    fn cfg(&self) -> &KernelConfig {
        self.kernels.config()
    }

    fn limits(&self, args: &Value) -> ExecLimits {
        let timeout = args["timeout"]
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(self.cfg().timeout.as_secs_f64())
            .min(86_400.0);
        ExecLimits {
            timeout: Duration::from_secs_f64(timeout),
            grace: self.cfg().interrupt_grace,
            max_output: self.cfg().max_output_bytes,
        }
    }

    /// The session's kernel; a cancel while waiting (for the session's running
    /// cell, or for a kernel to start) ends the wait.
    async fn lease(&self, ctx: &CallCtx) -> Result<crate::sessions::Lease, ToolError> {
        tokio::select! {
            l = self.kernels.lease(&ctx.tenant, &ctx.session_id, &ctx.workspace) => l,
            _ = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
        }
    }

    async fn run_python_code(&self, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let code = code_arg(&args)?;
        let limits = self.limits(&args);
        let mut lease = self.lease(&ctx).await?;
        let kernel = lease.kernel();
        let outcome = kernel
            .execute(&code, false, &limits, &ctx.events, &ctx.cancel)
            .await;
        self.kernels.touch(&ctx.session_id);
        if outcome.cancelled {
            return Err(ToolError::Cancelled);
        }
        // A kernel that died or was killed stays in the slot: the next call sees it and says so.
        let mut notices = std::mem::take(&mut lease.notices);
        drop(lease);
        self.result_value(&outcome, &ctx, &limits, &mut notices)
    }

    fn result_value(
        &self,
        o: &ExecOutcome,
        ctx: &CallCtx,
        limits: &ExecLimits,
        notices: &mut Vec<String>,
    ) -> Result<Value, ToolError> {
        let mut display = Vec::new();
        let mut png_n = 0;
        for d in &o.out.displays {
            let mut kept = kept_mime(d);
            if let Some(Value::String(b64)) = kept.get("image/png").cloned() {
                png_n += 1;
                match self.save_png(ctx, &b64, png_n) {
                    Ok(rel) => {
                        kept.insert("png_path".into(), json!(rel));
                    }
                    Err(e) => notices.push(format!("a PNG could not be saved: {e}")),
                }
            }
            if !kept.is_empty() {
                display.push(Value::Object(kept));
            }
        }
        let error = o.out.error.as_ref().map(
            |e| json!({"ename": e.ename, "evalue": e.evalue, "traceback": e.traceback.join("\n")}),
        );
        let error = match (&o.died, error) {
            (Some(why), _) => {
                notices.push(format!("the kernel died while running this cell ({why}); kernel restarted, variables lost: the next call runs in a fresh kernel"));
                Some(json!({"ename": "KernelDied", "evalue": why, "traceback": ""}))
            }
            (None, e) => e,
        };
        let mut v = json!({
            "stdout": collapse_cr(&o.out.stdout.text()),
            "stderr": collapse_cr(&o.out.stderr.text()),
            "display_data": display,
            "execute_result": o.out.result.as_ref().map(|r| Value::Object(kept_mime(r))),
            "error": error,
            "execution_count": o.out.execution_count,
        });
        if o.timed_out {
            let secs = limits.timeout.as_secs_f64();
            let (how, msg) = match o.interruption {
                Some(Interruption::InterruptRequest) => (
                    "interrupt_request",
                    format!(
                        "the cell ran past its {secs} s timeout and was stopped by a Jupyter interrupt_request (KeyboardInterrupt); the kernel's variables are kept"
                    ),
                ),
                Some(Interruption::Sigint) => (
                    "sigint",
                    format!(
                        "the cell ran past its {secs} s timeout, did not stop on interrupt_request, and was stopped by SIGINT to the kernel's process group; the kernel's variables are kept"
                    ),
                ),
                _ => (
                    "killed_and_restarted",
                    format!(
                        "the cell ran past its {secs} s timeout and stopped neither on interrupt_request nor on SIGINT: the kernel was killed and will be restarted, its variables are lost"
                    ),
                ),
            };
            v["timeout"] = json!({"seconds": secs, "stopped_by": how, "message": msg});
        }
        if !notices.is_empty() {
            v["notice"] = json!(notices.join("\n"));
        }
        Ok(v)
    }

    fn save_png(&self, ctx: &CallCtx, b64: &str, n: usize) -> Result<String, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.split_whitespace().collect::<String>())
            .map_err(|e| format!("not base64: {e}"))?;
        let session = session_file_name(&ctx.session_id).map_err(|e| e.to_string())?;
        let rel_dir = format!(".omicos/outputs/{session}");
        let dir = ctx.workspace.join(&rel_dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {rel_dir}: {e}"))?;
        let call = session_file_name(&ctx.call_id).unwrap_or_else(|_| "call".into());
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let name = format!("{ms}_{call}_{n}.png");
        std::fs::write(dir.join(&name), bytes)
            .map_err(|e| format!("cannot write {rel_dir}/{name}: {e}"))?;
        Ok(format!("{rel_dir}/{name}"))
    }

    async fn kernel_install(&self, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let req = install::parse_request(&args)?;
        if let Some(u) = &req.index_url {
            install::check_index(&self.index_policy, self.resolver.as_ref(), u).await?;
        }
        let python = self.kernels.interpreter(&ctx.workspace).python;
        // The install runs in the session's box with the network, into the
        // session's own package directory.
        let who = crate::sandboxing::SessionRef {
            tenant: ctx.tenant.clone(),
            session: ctx.session_id.clone(),
        };
        let (place, target) = self
            .kernels
            .sandbox()
            .for_install(&python, &ctx.workspace, &who)
            .await
            .map_err(|e| ToolError::failed(e.to_string()))?;
        let r = install::run(
            &python,
            &target,
            &req,
            self.cfg().install_timeout,
            self.cfg().install_output_bytes,
            &ctx.events,
            &ctx.cancel,
            self.kernels.sandbox(),
            &place,
        )
        .await;
        self.lookup.invalidate(&python);
        let mut v = r?;
        // A running kernel caches the import system's view of site-packages.
        if let Some(k) = self.kernels.session_kernel(&ctx.session_id) {
            let limits = ExecLimits {
                timeout: Duration::from_secs(10),
                grace: Duration::from_secs(1),
                max_output: 4096,
            };
            let _ = k
                .execute(
                    "__import__('importlib').invalidate_caches()",
                    true,
                    &limits,
                    &omicos_toolkit::EventSink::discard(),
                    &ctx.cancel,
                )
                .await;
        }
        v["python"] = json!(python.display().to_string());
        Ok(v)
    }

    async fn registry_lookup(&self, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let query = args["query"]
            .as_str()
            .ok_or_else(|| ToolError::invalid("query is required"))?;
        let max = args["max_results"].as_u64().unwrap_or(15).clamp(1, 200) as usize;
        let python = self.kernels.interpreter(&ctx.workspace).python;
        self.lookup
            .search(&python, query, max, self.cfg().lookup_timeout)
            .await
    }

    fn notebook_path(&self, args: &Value, ctx: &CallCtx) -> Result<(PathBuf, String), ToolError> {
        let p = args["path"]
            .as_str()
            .ok_or_else(|| ToolError::invalid("path is required"))?;
        if !p.ends_with(".ipynb") {
            return Err(ToolError::invalid(format!("`{p}` is not a .ipynb file")));
        }
        let full =
            confine_tool_path(&ctx.workspace, p).map_err(|e| ToolError::invalid(e.to_string()))?;
        Ok((full, p.to_owned()))
    }

    async fn notebook_run(&self, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        let (path, shown) = self.notebook_path(&args, &ctx)?;
        let mut nb = Notebook::read_confined(&ctx.workspace, &path, &shown)?;
        let code_cells: Vec<usize> = nb
            .cells()
            .iter()
            .enumerate()
            .filter(|(_, c)| c["cell_type"] == "code")
            .map(|(i, _)| i)
            .collect();
        let wanted: Vec<usize> = match &args["cells"] {
            Value::Array(a) => {
                let mut v = Vec::new();
                for x in a {
                    let i = x
                        .as_u64()
                        .ok_or_else(|| ToolError::invalid("cells must be cell indices"))?
                        as usize;
                    if !code_cells.contains(&i) {
                        return Err(ToolError::invalid(format!(
                            "cell {i} is not a code cell of {shown} (code cells: {code_cells:?})"
                        )));
                    }
                    v.push(i);
                }
                v
            }
            _ => code_cells,
        };
        let stop_on_error = args["stop_on_error"].as_bool().unwrap_or(true);
        let limits = self.limits(&args);
        let mut lease = self.lease(&ctx).await?;
        let kernel = lease.kernel();
        let mut notices = std::mem::take(&mut lease.notices);
        let mut ran = Vec::new();
        for i in wanted {
            let code = crate::notebook::source_text(&nb.cells()[i]);
            let o = kernel
                .execute(&code, false, &limits, &ctx.events, &ctx.cancel)
                .await;
            if o.cancelled {
                // Outputs of the cells that finished are kept.
                nb.write_confined(&ctx.workspace, &path, &shown)?;
                return Err(ToolError::Cancelled);
            }
            let cell = &mut nb.cells_mut()[i];
            cell["outputs"] = Value::Array(o.out.notebook_outputs());
            cell["execution_count"] = o
                .out
                .execution_count
                .map(Value::from)
                .unwrap_or(Value::Null);
            let failed = o.out.error.is_some() || o.died.is_some() || o.timed_out;
            let mut entry = json!({"index": i, "execution_count": cell["execution_count"], "status": if failed { "error" } else { "ok" }, "outputs": crate::notebook::summarize_outputs(cell)});
            if let Some(why) = &o.died {
                entry["error"] = json!(format!(
                    "the kernel died ({why}); kernel restarted, variables lost"
                ));
            }
            if o.timed_out {
                entry["timeout"] = json!(format!(
                    "stopped after {} s ({:?})",
                    limits.timeout.as_secs_f64(),
                    o.interruption
                ));
            }
            ran.push(entry);
            if o.died.is_some() || o.interruption == Some(Interruption::Killed) {
                notices.push(
                    "the kernel died during the run; the remaining cells were not run".into(),
                );
                break;
            }
            if failed && stop_on_error {
                break;
            }
        }
        drop(lease);
        self.kernels.touch(&ctx.session_id);
        nb.write_confined(&ctx.workspace, &path, &shown)?;
        let mut v = json!({"path": shown, "ran": ran});
        if !notices.is_empty() {
            v["notice"] = json!(notices.join("\n"));
        }
        Ok(v)
    }
}

fn code_arg(args: &Value) -> Result<String, ToolError> {
    match (
        args.get("code").and_then(Value::as_str),
        args.get("content").and_then(Value::as_str),
    ) {
        (Some(c), _) | (None, Some(c)) => Ok(c.to_owned()),
        _ => Err(ToolError::invalid(
            "code is required (the Python source to run; `content` is accepted too)",
        )),
    }
}

#[async_trait]
impl Provider for KernelProvider {
    fn name(&self) -> &str {
        "kernel"
    }

    fn session_affinity(&self) -> bool {
        true
    }

    async fn end_session(&self, tenant: &str, session: &str) -> u32 {
        let who = crate::sandboxing::SessionRef {
            tenant: tenant.to_owned(),
            session: session.to_owned(),
        };
        u32::from(self.kernels.end_session(&who).await)
    }

    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            tool(
                "run_python_code",
                "Run Python code in this session's persistent Jupyter kernel (variables, imports and definitions persist across calls; cwd is the workspace). \
                 Returns stdout, stderr, display_data (text/plain, text/html, text/markdown, image/png with a saved png_path), execute_result (the last expression's value) and error (ename, evalue, traceback).",
                json!({
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "Python source to run."},
                        "content": {"type": "string", "description": "Same as code (accepted for compatibility)."},
                        "timeout": {"type": "number", "description": "Seconds before the cell is interrupted (default from the service config, 600)."}
                    }
                }),
            )
            .risk(Risk::Python)
            .alias("python")
            .toolset(TOOLSET)
            .build(),
            tool(
                "kernel_install",
                "Install Python packages into the kernel's environment with pip (package names only; no -r, --target, paths or URLs).",
                json!({
                    "type": "object",
                    "properties": {
                        "packages": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "Package names or specifiers, e.g. [\"scanpy\", \"numpy>=1.26\"]."},
                        "upgrade": {"type": "boolean", "description": "Pass --upgrade."},
                        "index_url": {"type": "string", "description": "An http(s) package index URL."}
                    },
                    "required": ["packages"]
                }),
            )
            .risk(Risk::Python)
            .toolset(TOOLSET)
            .build(),
            tool(
                "registry_lookup",
                "Search the functions, classes and methods of the Python packages installed in the kernel's environment; returns module path, signature and the docstring's first line.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Words to find in names, modules or docstrings, e.g. \"read csv\"."},
                        "max_results": {"type": "integer", "minimum": 1, "maximum": 200, "default": 15}
                    },
                    "required": ["query"]
                }),
            )
            .toolset(TOOLSET)
            .build(),
            tool(
                "notebook__inspect",
                "Show a workspace notebook's (.ipynb, nbformat 4) cells: index, type, source and a summary of outputs.",
                json!({"type": "object", "properties": {"path": {"type": "string", "description": "Workspace-relative .ipynb path."}}, "required": ["path"]}),
            )
            .toolset(TOOLSET)
            .build(),
            tool(
                "notebook__edit",
                "Replace, insert or delete a cell of a workspace notebook (insert into a missing file creates it).",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "action": {"type": "string", "enum": ["replace", "insert", "delete"]},
                        "index": {"type": "integer", "minimum": 0, "description": "Cell index (insert: position; default the end)."},
                        "source": {"type": "string"},
                        "cell_type": {"type": "string", "enum": ["code", "markdown", "raw"]}
                    },
                    "required": ["path", "action"]
                }),
            )
            .risk(Risk::FileWrite)
            .toolset(TOOLSET)
            .build(),
            tool(
                "notebook__run",
                "Run a workspace notebook's code cells (all, or the given indices) in this session's kernel and write their outputs back into the file.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "cells": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                        "stop_on_error": {"type": "boolean", "default": true},
                        "timeout": {"type": "number", "description": "Per-cell timeout in seconds."}
                    },
                    "required": ["path"]
                }),
            )
            .risk(Risk::Python)
            .toolset(TOOLSET)
            .build(),
        ]
    }

    fn validate_input(&self, tool: &str, args: &Value, ctx: &CallCtx) -> Result<(), ToolError> {
        match tool {
            "run_python_code" | "python" => code_arg(args).map(|_| ()),
            "kernel_install" => install::parse_request(args).map(|_| ()),
            "notebook__inspect" | "notebook__edit" | "notebook__run" => {
                self.notebook_path(args, ctx).map(|_| ())
            }
            _ => Ok(()),
        }
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        if !args.is_object() {
            return Err(ToolError::invalid("arguments must be a JSON object"));
        }
        match tool {
            "run_python_code" | "python" => self.run_python_code(args, ctx).await,
            "kernel_install" => self.kernel_install(args, ctx).await,
            "registry_lookup" => self.registry_lookup(args, ctx).await,
            "notebook__inspect" => {
                let (path, shown) = self.notebook_path(&args, &ctx)?;
                Ok(Notebook::read_confined(&ctx.workspace, &path, &shown)?.inspect(&shown))
            }
            "notebook__edit" => {
                let (path, shown) = self.notebook_path(&args, &ctx)?;
                let action = args["action"]
                    .as_str()
                    .ok_or_else(|| ToolError::invalid("action is required"))?;
                let mut nb = if !path.exists() && action == "insert" {
                    Notebook::new_empty()
                } else {
                    Notebook::read_confined(&ctx.workspace, &path, &shown)?
                };
                let index =
                    match &args["index"] {
                        Value::Null => None,
                        v => Some(v.as_u64().ok_or_else(|| {
                            ToolError::invalid("index must be a non-negative integer")
                        })? as usize),
                    };
                let what = nb.edit(
                    action,
                    index,
                    args["source"].as_str(),
                    args["cell_type"].as_str(),
                )?;
                nb.write_confined(&ctx.workspace, &path, &shown)?;
                Ok(json!({"path": shown, "done": what, "cell_count": nb.cells().len()}))
            }
            "notebook__run" => self.notebook_run(args, ctx).await,
            other => Err(ToolError::UnknownTool(other.into())),
        }
    }
}
