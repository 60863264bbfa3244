//! The governed pipeline every tool call goes through, whichever provider runs
//! it. One module per stage, called in order from [`Pipeline::run_stages`]:
//! resolve → parse → validate → permission → hooks → (approval) → dispatch →
//! post hooks → shape → normalize.

pub mod approval;
pub mod dispatch;
pub mod hooks;
pub mod normalize;
pub mod parse;
pub mod permission;
pub mod resolve;
pub use omicos_rules as rules;
pub mod shape;
pub mod validate;

use crate::catalog::Tools;
use crate::config::Config;
use crate::error::RunnerError;
use crate::record::{
    ApprovalDecision, ApprovalRecord, ApprovalSource, PermissionRecord, SpooledArguments,
    ToolCallInfo,
};
use crate::registry::Registry;
use hooks::{HookInput, Hooks, Verdict};
use normalize::{Failure, Stage};
use omicos_proto::{
    ApprovalRequired, Decision, ExecuteApproval, ExecuteServerMessage, ToolResult, ToolSpec,
};
use omicos_proto::{PermissionMode, ToolStatus};
use omicos_toolkit::{CallCtx, EventSink, Provider};
use permission::{Gate, Legacy, RunBecause};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// One tool call as the orchestrator asks for it (ExecuteStart).
#[derive(Clone, Debug, Default)]
pub struct CallRequest {
    /// The model's call id.
    pub call_id: String,
    /// The name the model used.
    pub tool_name: String,
    /// The argument string exactly as the model produced it.
    pub arguments: String,
    /// Chat session.
    pub session_id: String,
    /// Calling agent.
    pub agent_id: String,
    /// The `PermissionMode` as on the wire; unspecified: the configured default.
    pub permission_mode: i32,
    /// Legacy switches; when present they win.
    pub legacy: Legacy,
    /// Toolsets visible to this call; empty: every tool.
    pub toolsets: Vec<String>,
    /// Tools the session already allowed for the rest of the session.
    pub session_allowed_tools: Vec<String>,
    /// The orchestrator's trajectory file, given to hooks.
    pub transcript_path: String,
    /// "root" or "root/<call_id>".
    pub execution_context_id: String,
    /// The calling agent's rules (its frontmatter), merged with the deployment's.
    pub agent_rules: rules::RuleLists,
    /// The ChatRequest's rules: they only narrow.
    pub request_rules: rules::RuleLists,
    /// Allow rules the session was granted by approvals answered as a rule.
    pub session_rules: Vec<String>,
    /// The tenant the call acts for, from the principal an authenticated
    /// orchestrator forwarded (never from the request body); empty: the root
    /// tenant. Picks the workspace, memory scope and kernels.
    pub tenant: String,
    /// The principal (`subject@tenant`) the call acts for, for the audit log
    /// and the trajectory record; empty when none was forwarded.
    pub principal: String,
}

/// The rules a caller brings besides the deployment's: the calling agent's
/// (its frontmatter) and the ChatRequest's (they only narrow).
#[derive(Clone, Debug, Default)]
pub struct CallerRules {
    /// The agent's frontmatter rules, merged with the deployment's.
    pub agent: rules::RuleLists,
    /// The request's rules: they only narrow.
    pub request: rules::RuleLists,
}

/// The wire form of three rule lists.
pub fn rule_lists(p: Option<omicos_proto::PermissionRules>) -> rules::RuleLists {
    let p = p.unwrap_or_default();
    rules::RuleLists {
        allow: p.allow,
        ask: p.ask,
        deny: p.deny,
    }
}

impl From<omicos_proto::ExecuteStart> for CallRequest {
    fn from(s: omicos_proto::ExecuteStart) -> Self {
        Self {
            call_id: s.call_id,
            tool_name: s.tool_name,
            arguments: s.arguments,
            session_id: s.session_id,
            agent_id: s.agent_id,
            permission_mode: s.permission_mode,
            legacy: Legacy {
                allow_shell: s.allow_shell,
                allow_file_write: s.allow_file_write,
            },
            toolsets: s.toolsets,
            session_allowed_tools: s.session_allowed_tools,
            transcript_path: s.transcript_path,
            execution_context_id: s.execution_context_id,
            agent_rules: rule_lists(s.agent_rules),
            request_rules: rule_lists(s.request_rules),
            session_rules: s.session_rules,
            tenant: String::new(),
            principal: String::new(),
        }
    }
}

/// The two-way channel of one call: events out, approvals in, cancel.
pub struct CallIo {
    /// Progress, output chunks and approval requests go here (None: dropped).
    pub events: Option<mpsc::Sender<ExecuteServerMessage>>,
    /// Approval decisions come from here (None: nobody can answer, asking denies).
    pub approvals: Option<mpsc::Receiver<ExecuteApproval>>,
    /// Fires on a client cancel or a dropped stream.
    pub cancel: CancellationToken,
}

impl CallIo {
    /// No client: events are dropped, approvals cannot be answered.
    pub fn detached() -> Self {
        Self {
            events: None,
            approvals: None,
            cancel: CancellationToken::new(),
        }
    }
}

/// The result of one call and its trajectory record.
#[derive(Clone, Debug)]
pub struct CallOutcome {
    /// The result (its `record_json` is empty; see [`CallOutcome::into_result`]).
    pub result: ToolResult,
    /// The trajectory record.
    pub record: ToolCallInfo,
}

impl CallOutcome {
    /// The result with the record serialized into `record_json`.
    pub fn into_result(mut self) -> ToolResult {
        self.result.record_json = serde_json::to_string(&self.record).unwrap_or_default();
        self.result
    }
}

struct Inner {
    tools: Tools,
    /// The deployment's permission rules (config `permissions`).
    rules: rules::Rules,
    hooks: Hooks,
    workspace: PathBuf,
    default_mode: PermissionMode,
    approval_timeout: Duration,
    spool_threshold: usize,
    memory_scope: String,
    /// Each principal its own memory (`memory_sharing: principal`).
    memory_per_principal: bool,
    /// Agents whose choice differs from the deployment's (`memory_sharing_agents`).
    memory_per_principal_agents: std::collections::BTreeMap<String, bool>,
    metrics: crate::metrics::RunnerMetrics,
}

/// The pipeline: cheap to clone, shared by every call.
#[derive(Clone)]
pub struct Pipeline {
    inner: Arc<Inner>,
}

/// What the stages hand to shaping.
struct Ran {
    text: String,
    spool_path: Option<String>,
    full_bytes: usize,
    approval: Decision,
}

impl Pipeline {
    /// The session ended: every in-process provider (the shell's boxes, MCP
    /// servers started for it) and every live provider instance stops what
    /// it left running. Returns how many things were stopped.
    pub async fn end_session(&self, tenant: &str, session: &str) -> u32 {
        let mut stopped = 0;
        for p in self.inner.tools.local() {
            stopped += p.end_session(tenant, session).await;
        }
        let remote = self.inner.tools.registry().live_clients();
        let calls = remote
            .iter()
            .map(|c| omicos_toolkit::Provider::end_session(c.as_ref(), tenant, session));
        stopped += futures::future::join_all(calls)
            .await
            .into_iter()
            .sum::<u32>();
        crate::audit::session_ended(tenant, session, stopped);
        stopped
    }

    /// Builds the pipeline over `providers` (in process) and `registry`
    /// (remote). The workspace is created if missing.
    pub fn new(
        config: &Config,
        registry: Arc<Registry>,
        providers: Vec<Arc<dyn Provider>>,
    ) -> Result<Self, RunnerError> {
        omicos_servicekit::ServiceConfig::validate(config)?;
        let workspace = canonical_workspace(&config.workspace)?;
        let hooks = Hooks::new(
            &config.hooks,
            &workspace,
            config.pre_tool_use_timeout_blocks,
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                tools: Tools::new(providers, registry),
                rules: rules::Rules::parse(&config.permissions, rules::Source::Deployment)
                    .map_err(|e| {
                        omicos_servicekit::ConfigError::key("permissions", e.to_string())
                    })?,
                hooks,
                workspace,
                default_mode: PermissionMode::parse(&config.default_permission_mode)
                    .map_err(|e| {
                        omicos_servicekit::ConfigError::key(
                            "default_permission_mode",
                            e.to_string(),
                        )
                    })?
                    .or(PermissionMode::ReadOnly),
                approval_timeout: config.approval_timeout,
                spool_threshold: config.spool_threshold_bytes.max(1),
                memory_scope: config.memory_scope.clone(),
                memory_per_principal: config.memory_sharing != "tenant",
                memory_per_principal_agents: config
                    .memory_sharing_agents
                    .iter()
                    .map(|(a, v)| (a.clone(), v != "tenant"))
                    .collect(),
                metrics: crate::metrics::RunnerMetrics::new(),
            }),
        })
    }

    /// The workspace root (canonical).
    pub fn workspace(&self) -> &Path {
        &self.inner.workspace
    }

    /// The registry behind remote tools.
    pub fn registry(&self) -> &Arc<Registry> {
        self.inner.tools.registry()
    }

    /// The tools visible under `toolsets`, a permission mode and the
    /// caller's rules (the agent's and the request's, as a call of that
    /// agent would carry them), and the toolset names that matched no tool.
    pub fn list_tools(
        &self,
        toolsets: &[String],
        mode: i32,
        legacy: Legacy,
        caller: &CallerRules,
    ) -> Result<(Vec<ToolSpec>, Vec<String>), RunnerError> {
        let mode = PermissionMode::from_wire(mode)?.or(self.inner.default_mode);
        let rules = self
            .caller_rules(&caller.agent, &caller.request)
            .map_err(|f| RunnerError::Rules(f.message))?;
        let catalog = self.inner.tools.snapshot();
        let tools: Vec<ToolSpec> = catalog
            .entries()
            .filter(|e| omicos_toolkit::toolsets::in_toolsets(toolsets, &e.spec.name))
            .filter(|e| permission::visible(mode, legacy, &e.spec, &rules))
            .map(|e| e.spec.clone())
            .collect();
        let unknown = toolsets
            .iter()
            .filter(|ts| {
                !catalog.entries().any(|e| {
                    omicos_toolkit::toolsets::in_toolsets(std::slice::from_ref(*ts), &e.spec.name)
                })
            })
            .cloned()
            .collect();
        Ok((tools, unknown))
    }

    /// The version of [`Pipeline::list_tools`]'s answers: the catalog's
    /// digest and the default mode (what, with the request, decides them).
    pub fn catalog_version(&self) -> String {
        let digest = self.inner.tools.snapshot().digest();
        format!("{digest:016x}-{}", self.inner.default_mode as i32)
    }

    /// Runs one call through every stage. Never fails: any failure becomes an
    /// error result.
    pub async fn execute(&self, req: CallRequest, mut io: CallIo) -> CallOutcome {
        let started = Instant::now();
        let _in_flight = self.inner.metrics.start();
        let span = tracing::info_span!(
            "tool_call",
            tool_name = %req.tool_name,
            call_id = %req.call_id,
            status = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
            result_chars = tracing::field::Empty,
        );
        let mut rec = ToolCallInfo {
            id: req.call_id.clone(),
            name: req.tool_name.clone(),
            requested_name: req.tool_name.clone(),
            session_id: req.session_id.clone(),
            agent_id: req.agent_id.clone(),
            principal: req.principal.clone(),
            execution_context_id: req.execution_context_id.clone(),
            started_at_ms: omicos_proto::now_ms(),
            ..Default::default()
        };
        let outcome = self
            .run_stages(&req, &mut io, &mut rec)
            .instrument(span.clone())
            .await;
        let (ok, text, spool_path, full_bytes, approval) = match outcome {
            Ok(r) => (true, r.text, r.spool_path, r.full_bytes, r.approval),
            Err((f, approval)) => {
                rec.error_stage = Some(f.stage);
                let n = f.message.len();
                // A long error (a timed-out command's output) is bounded like any result.
                match shape::shape(
                    f.message.clone(),
                    &self.workspace_of(&req.tenant),
                    shape::SpoolAt {
                        session: &req.session_id,
                        call_id: &req.call_id,
                    },
                    self.inner.spool_threshold,
                ) {
                    Ok(s) => (false, s.text, s.spool_path, n, approval),
                    Err(_) => (false, f.message, None, n, approval),
                }
            }
        };
        let status = ToolStatus::from_ok(ok);
        crate::audit::call(&rec);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let result_chars = text.chars().count();
        span.record("status", status.as_str());
        span.record("elapsed_ms", elapsed_ms);
        span.record("result_chars", result_chars);
        span.in_scope(|| {
            tracing::debug!(
                status = status.as_str(),
                elapsed_ms,
                result_chars,
                "tool call finished"
            )
        });
        self.inner
            .metrics
            .finish(&rec.name, &rec.provider, status.as_str(), started.elapsed());
        rec.status = status.as_str().to_owned();
        rec.result = text.clone();
        rec.spool_path = spool_path.clone();
        rec.result_bytes = full_bytes;
        rec.elapsed_ms = elapsed_ms;
        let call_id = req.call_id;
        self.record_arguments(&mut rec, req.arguments, &req.tenant, &req.session_id);
        CallOutcome {
            result: ToolResult {
                call_id,
                status: status as i32,
                result: text,
                spool_path: spool_path.unwrap_or_default(),
                elapsed_ms,
                record_json: String::new(),
                approval: approval as i32,
                tool_name: rec.name.clone(),
                granted_rule: rec
                    .approval
                    .as_ref()
                    .and_then(|a| a.granted_rule.clone())
                    .unwrap_or_default(),
                // File checkpoints are main's RewindSession work, not this branch's.
                file_changes: Vec::new(),
            },
            record: rec,
        }
    }

    /// The stages, in order. Reads like the pipeline.
    async fn run_stages(
        &self,
        req: &CallRequest,
        io: &mut CallIo,
        rec: &mut ToolCallInfo,
    ) -> Result<Ran, (Failure, Decision)> {
        let no = |f: Failure| (f, Decision::Unspecified);
        let me = &*self.inner;

        let mode = permission::mode_for_call(req.permission_mode, me.default_mode).map_err(no)?;
        rec.permission_mode = mode.as_str().to_owned();

        // 1. Resolve.
        let catalog = me.tools.snapshot();
        let (tool, _matched) =
            resolve::resolve(&catalog, &req.tool_name, &req.toolsets).map_err(no)?;
        rec.name = tool.spec.name.clone();
        rec.provider = tool.spec.provider.clone();
        rec.risk = permission::risk_name(tool.risk()).to_owned();

        // 2. Parse (with repair).
        let parsed = parse::parse(&req.arguments, &tool.compiled().schema).map_err(no)?;
        rec.repairs = parsed.repairs.clone();
        let mut args = parsed.value;

        // 3. Validate.
        let mut ctx = self.call_ctx(req, io.cancel.child_token()).map_err(no)?;
        let call_workspace = ctx.workspace.clone();
        validate::validate(&tool, &args, &ctx, &rec.repairs).map_err(no)?;
        self.note_arguments_run(rec, &args, &req.arguments);

        // 4. Risk, permission mode and rules.
        let rule_set = self.call_rules(req).map_err(no)?;
        let decided = rule_set.decide(&self.rule_call(&tool.spec.name, &args));
        let mut gate = permission::gate(mode, req.legacy, &tool.spec, decided.as_ref());
        rec.permission = Some(PermissionRecord {
            gate: gate.as_str().to_owned(),
            reason: gate_reason(&gate),
            rule: decided.clone(),
        });
        if let Gate::Refuse(msg) = &gate {
            return Err(no(Failure::new(Stage::Permission, msg.clone())));
        }

        // 5. PreToolUse hooks: allow, deny, ask, rewrite the input, add context.
        let mut context = Vec::new();
        let pre = me
            .hooks
            .pre_tool_use(
                &self.hook_input(req, mode, &tool.spec.name, &args),
                &mut rec.hooks,
            )
            .await;
        if let Some(updated) = pre.updated_input {
            validate::validate(&tool, &updated, &ctx, &[]).map_err(|f| {
                no(Failure::new(
                    Stage::Hook,
                    format!(
                        "the PreToolUse hook rewrote the input into something invalid: {}",
                        f.message
                    ),
                ))
            })?;
            // Deny rules see what will really run.
            if let Some(d) = rule_set
                .decide(&self.rule_call(&tool.spec.name, &updated))
                .filter(|d| d.behavior == rules::Behavior::Deny)
            {
                let msg = format!(
                    "refused: the PreToolUse hook rewrote the input into something the {d} refuses"
                );
                rec.permission = Some(PermissionRecord {
                    gate: "refuse".into(),
                    reason: msg.clone(),
                    rule: Some(d),
                });
                return Err(no(Failure::new(Stage::Permission, msg)));
            }
            args = updated;
            ctx.user_modified = true;
            rec.user_modified = true;
            self.note_arguments_run(rec, &args, &req.arguments);
        }
        context.extend(pre.context);
        gate = match (pre.verdict, gate) {
            (Verdict::Deny(reason), _) => return Err(no(Failure::new(Stage::Hook, reason))),
            (Verdict::Ask(reason), _) => Gate::Ask {
                reason: if reason.is_empty() {
                    "hook".into()
                } else {
                    format!("hook: {reason}")
                },
            },
            (Verdict::Allow, Gate::Ask { .. }) => {
                rec.approval = Some(ApprovalRecord {
                    asked: false,
                    decision: ApprovalDecision::AllowOnce,
                    source: ApprovalSource::Hook,
                    reason: "PreToolUse".into(),
                    ..Default::default()
                });
                Gate::Run {
                    source: RunBecause::Hook,
                }
            }
            (_, g) => g,
        };

        // 4b. Approval: PermissionRequest hooks, then the user.
        let approval = match gate {
            Gate::Ask { reason } => {
                let waited = Instant::now();
                let answer = self
                    .approve(req, io, &tool.spec, mode, &mut args, &mut ctx, reason, rec)
                    .await;
                rec.approval_wait_ms = waited.elapsed().as_millis() as u64;
                answer?
            }
            Gate::Run {
                source: RunBecause::Rule,
            } if decided
                .as_ref()
                .is_some_and(|d| d.source == rules::Source::Session) =>
            {
                rec.approval = Some(ApprovalRecord {
                    asked: false,
                    decision: ApprovalDecision::AllowSession,
                    source: ApprovalSource::Session,
                    reason: decided.as_ref().map(|d| d.to_string()).unwrap_or_default(),
                    ..Default::default()
                });
                Decision::Unspecified
            }
            _ => Decision::Unspecified,
        };
        let keep = |f: Failure| (f, approval);

        // 6. Dispatch.
        let dispatched = Instant::now();
        // Post hooks read the input; without them the provider takes it, not a
        // copy (the arguments can be a whole file).
        let kept = me.hooks.has_post().then(|| args.clone());
        let result =
            dispatch::dispatch(&tool, me.tools.registry(), args, ctx, io.events.as_ref()).await;
        let args = kept.unwrap_or(Value::Null);
        rec.dispatch_ms = dispatched.elapsed().as_millis() as u64;
        let input = self.hook_input(req, mode, &tool.spec.name, &args);
        let value = match result {
            Ok(v) => v,
            Err(f) => {
                let extra = me
                    .hooks
                    .post_tool_use_failure(&input, &f.message, &mut rec.hooks)
                    .await;
                return Err(keep(Failure::new(f.stage, with_context(f.message, &extra))));
            }
        };

        // 5b. PostToolUse hooks: block or replace the output, add context.
        let post = me.hooks.post_tool_use(&input, &value, &mut rec.hooks).await;
        if let Some(reason) = post.block {
            return Err(keep(Failure::new(
                Stage::Hook,
                with_context(
                    format!("blocked by PostToolUse hook: {reason}"),
                    &post.context,
                ),
            )));
        }
        let value = post.updated_output.unwrap_or(value);
        context.extend(post.context);

        // 7. Shape (spool large results).
        let mut text = shape::stringify(&value);
        if !rec.repairs.is_empty() {
            text.push_str(&format!(
                "\n\n[note: the arguments were repaired: {}]",
                rec.repairs.join("; ")
            ));
        }
        let text = with_context(text, &context);
        let shaped = shape::shape(
            text,
            &call_workspace,
            shape::SpoolAt {
                session: &req.session_id,
                call_id: &req.call_id,
            },
            me.spool_threshold,
        )
        .map_err(keep)?;

        // 8. Normalize happens in `execute`: Ok → "done".
        Ok(Ran {
            text: shaped.text,
            spool_path: shaped.spool_path,
            full_bytes: shaped.full_bytes,
            approval,
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn approve(
        &self,
        req: &CallRequest,
        io: &mut CallIo,
        spec: &ToolSpec,
        mode: PermissionMode,
        args: &mut Value,
        ctx: &mut CallCtx,
        reason: String,
        rec: &mut ToolCallInfo,
    ) -> Result<Decision, (Failure, Decision)> {
        let me = &*self.inner;
        let hook = me
            .hooks
            .permission_request(
                &self.hook_input(req, mode, &spec.name, args),
                &mut rec.hooks,
            )
            .await;
        if let Some(updated) = hook.updated_input {
            let tool = me.tools.snapshot().lookup(&spec.name).map(|(t, _)| t);
            if let Some(tool) = tool {
                validate::validate(&tool, &updated, ctx, &[]).map_err(|f| {
                    (Failure::new(Stage::Hook, format!("the PermissionRequest hook rewrote the input into something invalid: {}", f.message)), Decision::Unspecified)
                })?;
            }
            *args = updated;
            ctx.user_modified = true;
            rec.user_modified = true;
            self.note_arguments_run(rec, args, &req.arguments);
        }
        match hook.verdict {
            Verdict::Allow => {
                rec.approval = Some(ApprovalRecord {
                    asked: false,
                    decision: ApprovalDecision::AllowOnce,
                    source: ApprovalSource::Hook,
                    reason,
                    ..Default::default()
                });
                return Ok(Decision::Unspecified);
            }
            Verdict::Deny(msg) => {
                rec.approval = Some(ApprovalRecord {
                    asked: false,
                    decision: ApprovalDecision::Deny,
                    source: ApprovalSource::Hook,
                    reason,
                    ..Default::default()
                });
                return Err((Failure::new(Stage::Permission, msg), Decision::Deny));
            }
            _ => {}
        }
        let request = ApprovalRequired {
            call_id: req.call_id.clone(),
            tool_name: spec.name.clone(),
            risk: spec.risk,
            summary: summary(&spec.name, args),
            arguments: args.to_string(),
            reason,
        };
        match approval::ask(io, request, me.approval_timeout).await {
            Ok(mut a) => {
                if a.decision == Decision::AllowSession && !a.rule.is_empty() {
                    match self.session_rule(&a.rule, &spec.name, args) {
                        Ok(text) => a.record.granted_rule = Some(text),
                        Err(why) => {
                            // Never wider than asked: the call the user saw
                            // runs once, and nothing is kept for the session.
                            tracing::warn!(call_id = %req.call_id, rule = %a.rule, %why, "approval rule refused");
                            a.decision = Decision::AllowOnce;
                            a.record.decision = ApprovalDecision::AllowOnce;
                            a.record.rule_refused = Some(why);
                        }
                    }
                }
                rec.approval = Some(a.record);
                Ok(a.decision)
            }
            Err((f, r)) => {
                rec.approval = Some(r);
                Err((f, Decision::Deny))
            }
        }
    }

    /// The rules that decide this call: the deployment's and the agent's
    /// (trusted alike), narrowed by the request's, then the session's grants
    /// (whole tools and rules) as allow rules that the request does not
    /// narrow (the user granted them) but every deny and ask rule beats.
    fn call_rules(&self, req: &CallRequest) -> Result<rules::Rules, Failure> {
        let mut out = self.caller_rules(&req.agent_rules, &req.request_rules)?;
        if req.session_allowed_tools.is_empty() && req.session_rules.is_empty() {
            return Ok(out);
        }
        let mut session = rules::Rules::default();
        for t in &req.session_allowed_tools {
            session.add(
                rules::Behavior::Allow,
                rules::Rule::whole_tool(t, rules::Source::Session),
            );
        }
        for r in &req.session_rules {
            match rules::Rule::parse(r, rules::Source::Session) {
                Ok(rule) => session.add(rules::Behavior::Allow, rule),
                // A grant that no longer parses only means a question again.
                Err(e) => {
                    tracing::warn!(session = %req.session_id, error = %e, "session rule skipped")
                }
            }
        }
        out.add_unnarrowed(&session);
        Ok(out)
    }

    /// The deployment's rules and the agent's (trusted alike), narrowed by
    /// the request's: what decides a call before the session's grants, and
    /// what ListTools hides by.
    fn caller_rules(
        &self,
        agent: &rules::RuleLists,
        request: &rules::RuleLists,
    ) -> Result<rules::Rules, Failure> {
        let bad = |what: &str, e: rules::RuleError| {
            Failure::new(Stage::Permission, format!("the {what}'s {e}"))
        };
        let agent =
            rules::Rules::parse(agent, rules::Source::Agent).map_err(|e| bad("agent", e))?;
        let request =
            rules::Rules::parse(request, rules::Source::Request).map_err(|e| bad("request", e))?;
        Ok(self.inner.rules.union(&agent).narrowed_by(&request))
    }

    fn rule_call<'a>(&'a self, tool: &'a str, args: &'a Value) -> rules::Call<'a> {
        rules::Call {
            tool,
            args,
            workspace: &self.inner.workspace,
        }
    }

    /// Checks an approval's rule before it is kept for the session
    /// ([`rules::session_grant`]). Applied later, it is an allow rule: every
    /// deny and ask rule beats it and the mode's ceiling bounds it, so it
    /// never widens what the deployment allows.
    fn session_rule(&self, text: &str, tool: &str, args: &Value) -> Result<String, String> {
        rules::session_grant(text, &self.rule_call(tool, args))
    }

    /// Keeps the arguments as run in the record, unless they are large raw
    /// arguments that ran unchanged: those are spooled once, at the end.
    fn note_arguments_run(&self, rec: &mut ToolCallInfo, args: &Value, raw: &str) {
        let large = raw.len() >= self.inner.spool_threshold;
        let unchanged = !rec.user_modified && rec.repairs.is_empty();
        if large && unchanged {
            rec.arguments_run = None;
            rec.arguments_spool
                .get_or_insert_with(SpooledArguments::default)
                .run_is_raw = true;
        } else {
            rec.arguments_run = Some(args.clone());
            if let Some(s) = rec.arguments_spool.as_mut() {
                s.run_is_raw = false;
            }
        }
    }

    /// Puts the raw arguments into the record, or, when they are as large as
    /// the spool threshold, into the spool with only their head in the record;
    /// large arguments as run go to the spool too. A record stays a few KiB
    /// whatever the arguments, so a result always fits its message.
    fn record_arguments(&self, rec: &mut ToolCallInfo, raw: String, tenant: &str, session: &str) {
        let threshold = self.inner.spool_threshold;
        // Into the call's tenant workspace and session folder; the
        // workspace is resolved only when something is spooled.
        let call_id = rec.id.clone();
        let spool = |text: &str, ext: &str| {
            let at = shape::SpoolAt {
                session,
                call_id: &call_id,
            };
            shape::spool(text, &self.workspace_of(tenant), at, ext)
        };
        if let Some(run) = &rec.arguments_run
            && (raw.len() >= threshold || rec.user_modified)
        {
            let json = run.to_string();
            if json.len() >= threshold {
                let spooled = spool(&json, "arguments_run.json");
                let s = rec
                    .arguments_spool
                    .get_or_insert_with(SpooledArguments::default);
                match spooled {
                    Ok(p) => s.run_path = Some(p),
                    Err(e) => s.error = Some(format!("arguments as run: {e}")),
                }
                rec.arguments_run = None;
            }
        }
        if raw.len() < threshold {
            rec.arguments = raw;
            return;
        }
        let spooled = spool(&raw, "arguments.txt");
        let s = rec
            .arguments_spool
            .get_or_insert_with(SpooledArguments::default);
        s.raw_bytes = raw.len();
        match spooled {
            Ok(p) => {
                rec.arguments = shape::arguments_head(&raw, Some(&p));
                s.raw_path = Some(p);
            }
            Err(e) => {
                rec.arguments = shape::arguments_head(&raw, None);
                s.error = Some(format!("raw arguments: {e}"));
                s.run_is_raw = false;
            }
        }
    }

    /// The workspace of `tenant` (the root when it cannot be made: the call
    /// itself was refused then, in [`Pipeline::call_ctx`]).
    fn workspace_of(&self, tenant: &str) -> PathBuf {
        omicos_toolkit::tenancy::tenant_workspace(&self.inner.workspace, tenant)
            .unwrap_or_else(|_| self.inner.workspace.clone())
    }

    /// The call's context: its tenant's workspace and memory scope.
    fn call_ctx(&self, req: &CallRequest, cancel: CancellationToken) -> Result<CallCtx, Failure> {
        use omicos_toolkit::tenancy::{tenant_scope, tenant_workspace};
        let workspace = tenant_workspace(&self.inner.workspace, &req.tenant)
            .map_err(|e| Failure::new(Stage::Validate, e))?;
        Ok(CallCtx {
            call_id: req.call_id.clone(),
            session_id: req.session_id.clone(),
            agent_id: req.agent_id.clone(),
            user_modified: false,
            scope: memory_scope(
                &tenant_scope(&self.inner.memory_scope, &req.tenant),
                &req.principal,
                self.inner
                    .memory_per_principal_agents
                    .get(&req.agent_id)
                    .copied()
                    .unwrap_or(self.inner.memory_per_principal),
            ),
            workspace,
            tenant: req.tenant.clone(),
            events: EventSink::discard(),
            cancel,
        })
    }

    fn hook_input<'a>(
        &self,
        req: &'a CallRequest,
        mode: PermissionMode,
        tool: &'a str,
        args: &'a Value,
    ) -> HookInput<'a> {
        HookInput {
            session_id: &req.session_id,
            transcript_path: &req.transcript_path,
            permission_mode: mode.as_str(),
            tool_name: tool,
            tool_input: args,
            tool_use_id: &req.call_id,
        }
    }
}

/// Why the gate decided as it did, for the record.
fn gate_reason(g: &Gate) -> String {
    match g {
        Gate::Run { source } => match source {
            RunBecause::Mode => "permission mode",
            RunBecause::Legacy => "legacy switch",
            RunBecause::Rule => "allow rule",
            RunBecause::Hook => "hook",
        }
        .to_owned(),
        Gate::Ask { reason } => reason.clone(),
        Gate::Refuse(msg) => msg.clone(),
    }
}

fn with_context(mut text: String, context: &[String]) -> String {
    for c in context {
        text.push_str("\n\n[hook context] ");
        text.push_str(c);
    }
    text
}

/// A one-line summary of a call for the approval prompt.
fn summary(tool: &str, args: &Value) -> String {
    let detail = ["command", "path", "pattern", "code", "packages"]
        .iter()
        .find_map(|k| args.get(*k))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| args.to_string());
    let line = detail.lines().next().unwrap_or("").to_owned();
    let short: String = line.chars().take(120).collect();
    let more = if short.len() < detail.len() {
        "…"
    } else {
        ""
    };
    format!("{tool}: {short}{more}")
}

fn canonical_workspace(p: &Path) -> Result<PathBuf, RunnerError> {
    let fail = |action| {
        move |source| RunnerError::Workspace {
            action,
            path: p.to_path_buf(),
            source,
        }
    };
    std::fs::create_dir_all(p).map_err(fail("create"))?;
    p.canonicalize().map_err(fail("resolve"))
}

/// The memory scope of a call: the tenant's scope, narrowed to the principal
/// when memory is per principal. `principal` is `subject@tenant` (the tenant
/// has no `@`; a subject may, as an e-mail address does). The laptop's
/// principal (`local`) and a call with no forwarded principal keep the
/// tenant's scope, where their rows from before were written.
pub fn memory_scope(tenant_scope: &str, principal: &str, per_principal: bool) -> String {
    let subject = principal
        .rsplit_once('@')
        .map(|(s, _)| s)
        .unwrap_or(principal);
    if !per_principal || subject.is_empty() || subject == omicos_auth::config::LOCAL_SUBJECT {
        return tenant_scope.to_owned();
    }
    format!("{tenant_scope}/principal/{subject}")
}

/// A value quoted in an error, cut to 200 bytes (a config value or name
/// must not come back whole).
pub fn bounded_text(text: &str) -> String {
    if text.len() <= 200 {
        return text.to_owned();
    }
    let mut end = 200;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod memory_scope_tests {
    use super::memory_scope;

    #[test]
    fn each_principal_has_its_own_memory_unless_the_tenant_shares_one() {
        assert_eq!(
            memory_scope("acme/workspace", "alice@acme", true),
            "acme/workspace/principal/alice"
        );
        assert_eq!(
            memory_scope("acme/workspace", "bob@corp.example@acme", true),
            "acme/workspace/principal/bob@corp.example"
        );
        assert_ne!(
            memory_scope("acme/workspace", "alice@acme", true),
            memory_scope("acme/workspace", "bob@acme", true)
        );
        // Shared per tenant when the deployment says so.
        assert_eq!(
            memory_scope("acme/workspace", "alice@acme", false),
            "acme/workspace"
        );
        // The laptop's principal and unattributed calls keep their old scope.
        assert_eq!(
            memory_scope("workspace", "local@default", true),
            "workspace"
        );
        assert_eq!(memory_scope("workspace", "", true), "workspace");
    }
}
