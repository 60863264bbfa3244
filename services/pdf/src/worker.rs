//! Running PDF parsing off the async runtime, bounded in count and time.
//!
//! Each call gets its own OS thread (with a large stack: PDF object graphs
//! are parsed recursively) and holds one of a few slots until that thread
//! really ends, so a parser stuck on a hostile file can occupy a slot but
//! never multiply. A panic becomes an error result.

use crate::extract::Budget;
use omicos_toolkit::{CallCtx, ToolError};
use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};
use tokio::sync::{Semaphore, oneshot};

/// Stack of a parsing thread. Only the pages touched are committed.
const STACK_BYTES: usize = 64 << 20;

/// A pool of parsing slots.
#[derive(Clone, Debug)]
pub struct Workers {
    slots: Arc<Semaphore>,
}

impl Workers {
    /// At most `n` (at least 1) files are parsed at once.
    pub fn new(n: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(n.max(1))),
        }
    }

    /// Runs `job` on a parsing thread within `budget`. Stops waiting at the
    /// deadline (plus a short grace for the page in progress) or when the
    /// call is cancelled; the thread then stops at its next page.
    pub async fn run<T, F>(&self, ctx: &CallCtx, budget: Budget, job: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce(&Budget) -> Result<T, ToolError> + Send + 'static,
    {
        let seconds = budget
            .deadline
            .saturating_duration_since(std::time::Instant::now())
            .as_secs_f64();
        let permit = tokio::select! {
            p = self.slots.clone().acquire_owned() => p.map_err(|_| ToolError::Unavailable("the pdf tools are shutting down".into()))?,
            _ = tokio::time::sleep_until(budget.deadline.into()) => {
                return Err(ToolError::Unavailable(format!(
                    "the pdf tools are busy with other files (waited {seconds:.0} s); try again shortly"
                )));
            }
            _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        let (tx, rx) = oneshot::channel();
        let stop = budget.stop.clone();
        let deadline = budget.deadline;
        std::thread::Builder::new()
            .name("omicos-pdf".into())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                let r = catch_unwind(AssertUnwindSafe(|| job(&budget)));
                let _ = tx.send(r);
                drop(permit);
            })
            .map_err(|e| ToolError::Unavailable(format!("cannot start a parsing thread: {e}")))?;
        let grace = Duration::from_secs(2);
        let outcome = tokio::select! {
            r = rx => r,
            _ = tokio::time::sleep_until((deadline + grace).into()) => {
                stop.store(true, Ordering::Relaxed);
                return Err(ToolError::failed(format!(
                    "reading this PDF took longer than the {seconds:.0} s budget; ask for fewer pages"
                )));
            }
            _ = ctx.cancel.cancelled() => {
                stop.store(true, Ordering::Relaxed);
                return Err(ToolError::Cancelled);
            }
        };
        match outcome {
            Ok(Ok(r)) => r,
            Ok(Err(_panic)) => Err(ToolError::failed(
                "the PDF parser failed on this file (it is malformed in a way it cannot handle)",
            )),
            Err(_) => Err(ToolError::failed(
                "the PDF parsing thread ended without an answer",
            )),
        }
    }
}
