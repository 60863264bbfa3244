//! Graceful shutdown: SIGINT/SIGTERM start a drain that is bounded by a grace
//! period; long streams hold [`Shutdown::streams_token`] and end when it is cancelled.

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

    /// The grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Triggers on SIGINT or SIGTERM (listened for from this call on).
    pub fn on_signals(&self) {
        let me = self.clone();
        let mut signals = Signals::install();
        tokio::spawn(async move {
            signals.recv().await;
            tracing::info!("signal received: draining");
            me.trigger();
        });
    }
}

/// SIGINT and SIGTERM, caught from the moment [`Signals::install`] returns:
/// a signal that arrives before the first [`Signals::recv`] is kept, not
/// left to kill the process.
pub struct Signals {
    #[cfg(unix)]
    streams: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Starts catching SIGINT and SIGTERM (needs a tokio runtime).
    pub fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let streams = signal(SignalKind::interrupt())
                .and_then(|i| Ok((i, signal(SignalKind::terminate())?)))
                .ok();
            Self { streams }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    /// The next SIGINT or SIGTERM.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some((int, term)) = &mut self.streams {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Waits for SIGINT or SIGTERM.
pub async fn wait_for_signal() {
    Signals::install().recv().await
}
