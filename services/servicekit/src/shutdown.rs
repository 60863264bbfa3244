//! Graceful shutdown: SIGINT/SIGTERM start a drain that is bounded by a grace
//! period; long streams watch [`Shutdown::streams_cancelled`] and end when it fires.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Shared shutdown state of one service (or of a whole in-process stack).
#[derive(Clone, Debug)]
pub struct Shutdown {
    drain: CancellationToken,
    streams: CancellationToken,
    grace: Duration,
}

impl Shutdown {
    /// A new, untriggered shutdown with the given grace period.
    pub fn new(grace: Duration) -> Self {
        Self {
            drain: CancellationToken::new(),
            streams: CancellationToken::new(),
            grace,
        }
    }

    /// A child that drains when the parent does, and may also drain on its own.
    pub fn child(&self) -> Self {
        Self {
            drain: self.drain.child_token(),
            streams: self.streams.child_token(),
            grace: self.grace,
        }
    }

    /// Starts the drain: no new RPCs; after the grace period, streams are cancelled.
    pub fn trigger(&self) {
        if self.drain.is_cancelled() {
            return;
        }
        self.drain.cancel();
        let streams = self.streams.clone();
        let grace = self.grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            streams.cancel();
        });
    }

    /// Resolves when the drain starts.
    pub async fn draining(&self) {
        self.drain.cancelled().await
    }

    /// True once the drain started.
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Cancelled when the grace period ends: long streams stop on it.
    pub fn streams_token(&self) -> CancellationToken {
        self.streams.clone()
    }

    /// Resolves when long streams must stop.
    pub async fn streams_cancelled(&self) {
        self.streams.cancelled().await
    }

    /// The grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Triggers on SIGINT or SIGTERM.
    pub fn on_signals(&self) {
        let me = self.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received: draining");
            me.trigger();
        });
    }
}

/// Waits for SIGINT or SIGTERM.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
