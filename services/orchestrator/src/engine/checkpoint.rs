//! A turn's place in the history and its file checkpoint, as the turn
//! runs: RewindSession and ForkSession read them (service::fork).
//!
//! Neither stops a turn when the store refuses it: the turn goes on, and
//! the error is logged (a rewind of that turn then says what is missing).

use super::Engine;
use crate::hub::SessionState;
use omicos_sessionstore::{FileCheckpoint, TurnMark};

impl Engine {
    /// Records that `turn_id` starts at `first_message` of the history the
    /// model sees (and at event `first_seq`).
    pub(super) async fn mark_turn(
        &self,
        st: &SessionState,
        turn_id: &str,
        first_message: usize,
        first_seq: u64,
    ) {
        let mark = TurnMark {
            turn_id: turn_id.to_owned(),
            first_message: first_message as u64,
            first_seq,
        };
        if let Err(e) = st.store().mark_turn(&st.id, &mark).await {
            tracing::error!(session = %st.id, turn = turn_id, error = %e, "turn start not recorded: rewind and fork cannot cut at this turn");
        }
    }

    /// Keeps what a tool call's file changes overwrote in its turn's
    /// checkpoint (the first change of a path in a turn counts).
    pub(super) async fn keep_checkpoint(
        &self,
        st: &SessionState,
        turn_id: &str,
        changes: &[omicos_proto::FileChange],
    ) {
        if changes.is_empty() {
            return;
        }
        let kept: Vec<FileCheckpoint> = changes
            .iter()
            .map(|c| FileCheckpoint {
                path: c.path.clone(),
                created: c.created,
                too_large: c.too_large,
                prior: c.prior.clone(),
            })
            .collect();
        if let Err(e) = st.store().keep_file_changes(&st.id, turn_id, &kept).await {
            tracing::error!(session = %st.id, turn = turn_id, error = %e, "file checkpoint not kept: a rewind of this turn cannot restore these files");
        }
    }
}
