//! Stage 6: run the tool, in process or over gRPC through the registry.
//! Progress and output chunks stream back as they come; a cancel (the
//! client's, or a dropped stream) stops the provider call; a provider that
//! panics or cannot be reached gives an error, never a crash.

use super::normalize::{Failure, Stage};
use crate::catalog::{Route, ToolEntry};
use crate::registry::Registry;
use futures::FutureExt;
use omicos_proto::ExecuteServerMessage;
use omicos_toolkit::{CallCtx, EventSink, Provider, ProviderEvent, ToolError};
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long a cancelled provider gets to stop before we stop waiting for it.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Runs `tool` with `args`. Events go to `out` when given.
pub async fn dispatch(
    tool: &ToolEntry,
    registry: &Registry,
    args: Value,
    ctx: CallCtx,
    out: Option<&mpsc::Sender<ExecuteServerMessage>>,
) -> Result<Value, Failure> {
    match dispatch_once(tool, registry, args.clone(), ctx.clone(), out, true).await {
        Attempt::Done(r) => r,
        // The session's instance was already reported lost by another
        // replica and the call never reached it: route it again, once.
        Attempt::Reroute => match dispatch_once(tool, registry, args, ctx, out, false).await {
            Attempt::Done(r) => r,
            Attempt::Reroute => Err(Failure::new(
                Stage::Dispatch,
                "the call could not be routed",
            )),
        },
    }
}

/// What one routing of a call came to.
enum Attempt {
    /// The call's outcome.
    Done(Result<Value, Failure>),
    /// The call never reached the instance, which another replica already
    /// reported lost: route it again (only offered when `may_reroute`).
    Reroute,
}

/// One attempt at routing and running the call.
async fn dispatch_once(
    tool: &ToolEntry,
    registry: &Registry,
    args: Value,
    mut ctx: CallCtx,
    out: Option<&mpsc::Sender<ExecuteServerMessage>>,
    may_reroute: bool,
) -> Attempt {
    // For a session-affine instance (the kernel): where the session's state lives.
    let mut affine_instance: Option<(String, String)> = None;
    let provider: Arc<dyn Provider> = match &tool.route {
        Route::Local(p) => p.clone(),
        Route::Remote(name) => {
            let routed = match registry.route(name, &tool.spec.name, &ctx.session_id) {
                Ok(r) => r,
                Err(e) => return Attempt::Done(Err(Failure::new(Stage::Dispatch, e.0))),
            };
            if routed.affine {
                affine_instance = Some((name.clone(), routed.instance_id.clone()));
            }
            routed.client
        }
    };
    let session = ctx.session_id.clone();
    let cancel = ctx.cancel.clone();
    let (ev_tx, mut ev_rx) = mpsc::channel::<ProviderEvent>(256);
    ctx.events = if out.is_some() {
        EventSink::new(ev_tx)
    } else {
        EventSink::discard()
    };
    let name = tool.spec.name.clone();
    // Polled in place (no task hop: that alone cost ~15 µs per call), with a
    // panic inside the provider caught and turned into an error result.
    let call =
        AssertUnwindSafe(async move { provider.call(&name, args, ctx).await }).catch_unwind();
    tokio::pin!(call);
    let joined = loop {
        tokio::select! {
            biased;
            r = &mut call => break r,
            Some(ev) = ev_rx.recv() => forward(out, ev).await,
            _ = cancel.cancelled() => {
                // The provider sees the same token; give it a moment to clean up (kill its processes).
                let _ = tokio::time::timeout(CANCEL_GRACE, &mut call).await;
                return Attempt::Done(Err(Failure::new(Stage::Dispatch, "cancelled")));
            }
        }
    };
    // Events produced just before the result still go out, in order.
    while let Ok(ev) = ev_rx.try_recv() {
        forward(out, ev).await;
    }
    let joined = match joined {
        Ok(Err(ToolError::Unavailable(why)))
            if may_reroute && why.contains("connect error") && affine_instance.is_some() =>
        {
            let (provider, instance) = affine_instance.clone().unwrap_or_default();
            if registry
                .lost_elsewhere(&provider, &instance, &session)
                .await
            {
                return Attempt::Reroute;
            }
            Ok(Err(ToolError::Unavailable(why)))
        }
        j => j,
    };
    Attempt::Done(Err(match joined {
        Ok(Ok(v)) => return Attempt::Done(Ok(v)),
        Ok(Err(ToolError::Cancelled)) => Failure::new(Stage::Dispatch, "cancelled"),
        // The instance holding the session's state stopped answering (killed
        // mid-cell, unreachable): say the state is lost and re-pin the session.
        Ok(Err(ToolError::Unavailable(why))) if affine_instance.is_some() => {
            let (provider, instance) = affine_instance.unwrap_or_default();
            Failure::new(
                Stage::Dispatch,
                registry
                    .instance_lost(&provider, &instance, &session, &why)
                    .await,
            )
        }
        Ok(Err(e)) => Failure::new(Stage::Dispatch, e.to_string()),
        Err(_panic) => Failure::new(
            Stage::Dispatch,
            format!(
                "the `{}` tool crashed (panic) in the `{}` provider; the runner is still serving",
                tool.spec.name, tool.spec.provider
            ),
        ),
    }))
}

async fn forward(out: Option<&mpsc::Sender<ExecuteServerMessage>>, ev: ProviderEvent) {
    if let Some(tx) = out {
        let _ = tx
            .send(ExecuteServerMessage {
                msg: Some(ev.into()),
            })
            .await;
    }
}
