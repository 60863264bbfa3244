//! The runner's RestoreFiles, for RewindSession and ForkSession with files.

use super::Runner;
use crate::error::{OrchestratorError, RunnerStatus};
use std::time::Duration;
use tonic::Status;

/// How long a restore may take (files of up to a few MiB each, written and
/// synced one by one).
const RESTORE_TIMEOUT: Duration = Duration::from_secs(60);

impl Runner {
    /// One RestoreFiles call for `principal`'s tenant (the runner takes the
    /// tenant from the forwarded principal), bounded by [`RESTORE_TIMEOUT`]:
    /// the paths written, or the runner's status (DEADLINE_EXCEEDED, saying
    /// what was not `done`, when it did not answer in time).
    async fn restore_call(
        &self,
        session: &str,
        principal: &omicos_auth::Principal,
        files: Vec<omicos_proto::RestoreFile>,
        create_new: bool,
        done: &str,
    ) -> Result<Vec<String>, Status> {
        let mut c = self.client.clone();
        let mut req =
            omicos_servicekit::telemetry::traced_request(omicos_proto::RestoreFilesRequest {
                session_id: session.to_owned(),
                files,
                create_new,
            });
        omicos_auth::credentials::forward_principal(req.metadata_mut(), principal);
        match tokio::time::timeout(RESTORE_TIMEOUT, c.restore_files(req)).await {
            Ok(r) => r.map(|r| r.into_inner().restored),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no tool-runner {done} within {RESTORE_TIMEOUT:?}"
            ))),
        }
    }

    /// Writes `files` back into the workspace of `principal`'s tenant. A
    /// refusal (a path outside the workspace or in `.omicos/`) writes nothing
    /// and is [`OrchestratorError::FilesNotRestored`]; a runner that does not
    /// answer is [`OrchestratorError::ToolRunner`].
    pub async fn restore_files(
        &self,
        session: &str,
        principal: &omicos_auth::Principal,
        files: Vec<omicos_proto::RestoreFile>,
    ) -> Result<Vec<String>, OrchestratorError> {
        self.restore_call(session, principal, files, false, "restored the files")
            .await
            .map_err(|s| match s.code() {
                tonic::Code::InvalidArgument
                | tonic::Code::PermissionDenied
                | tonic::Code::FailedPrecondition => OrchestratorError::FilesNotRestored {
                    session: session.to_owned(),
                    source: RunnerStatus(s),
                },
                _ => OrchestratorError::ToolRunner(RunnerStatus(s)),
            })
    }

    /// Writes attached files into the workspace of `principal`'s tenant as
    /// new files (RestoreFiles with `create_new`: a clash gets a numbered
    /// name); the workspace-relative paths used, in order. Over the
    /// workspace's disk bound: [`OrchestratorError::UploadTooLarge`]; a path
    /// the runner refuses: [`OrchestratorError::InvalidArgument`]. A refused
    /// upload writes nothing.
    pub async fn upload_files(
        &self,
        session: &str,
        principal: &omicos_auth::Principal,
        files: Vec<omicos_proto::RestoreFile>,
    ) -> Result<Vec<String>, OrchestratorError> {
        self.restore_call(session, principal, files, true, "wrote the files")
            .await
            .map_err(|s| match s.code() {
                tonic::Code::ResourceExhausted => {
                    OrchestratorError::UploadTooLarge(s.message().to_owned())
                }
                tonic::Code::InvalidArgument
                | tonic::Code::PermissionDenied
                | tonic::Code::AlreadyExists
                | tonic::Code::FailedPrecondition => OrchestratorError::InvalidArgument(format!(
                    "the files were not written: {}",
                    s.message()
                )),
                _ => OrchestratorError::ToolRunner(RunnerStatus(s)),
            })
    }
}
