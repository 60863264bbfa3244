//! The replay backend: answers from a scripted file of model turns, so tests
//! and offline demos run the real loop and the real tools without a model.
//!
//! ```yaml
//! steps:
//!   - text: "Writing the file."
//!     tool_calls:
//!       - name: file_manager__write
//!         arguments: {path: hello.txt, content: "hi"}
//!   - agent: data_analyst        # only answers a request of this agent
//!     text: "Done."
//! ```
//! Each request takes the first unused step whose `agent` matches (or has none).

use super::{LlmBackend, LlmDelta, LlmError, LlmRequest, LlmTurn, ToolCall};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A scripted model turn.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayStep {
    /// Only for requests of this agent.
    #[serde(default)]
    pub agent: Option<String>,
    /// The text to stream.
    #[serde(default)]
    pub text: String,
    /// Tool calls to make.
    #[serde(default)]
    pub tool_calls: Vec<ReplayCall>,
}

/// A scripted tool call.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayCall {
    /// Tool name.
    pub name: String,
    /// Arguments: an object, or a raw string sent exactly as written.
    #[serde(default)]
    pub arguments: Value,
    /// Call id; generated when absent.
    #[serde(default)]
    pub id: Option<String>,
}

/// A replay script.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayScript {
    /// The turns, in order.
    pub steps: Vec<ReplayStep>,
}

/// The replay backend.
pub struct ReplayBackend {
    steps: Vec<ReplayStep>,
    used: Mutex<Vec<bool>>,
}

impl ReplayBackend {
    /// From a parsed script.
    pub fn new(script: ReplayScript) -> Self {
        let n = script.steps.len();
        Self {
            steps: script.steps,
            used: Mutex::new(vec![false; n]),
        }
    }

    /// From YAML (or JSON) text.
    pub fn from_yaml(text: &str) -> Result<Self, LlmError> {
        let script: ReplayScript = serde_yaml::from_str(text)
            .map_err(|e| LlmError::Config(format!("replay script: {e}")))?;
        Ok(Self::new(script))
    }

    /// From a file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, LlmError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LlmError::Config(format!("replay script {}: {e}", path.display())))?;
        Self::from_yaml(&text)
    }

    fn take(&self, agent: &str) -> Option<ReplayStep> {
        let mut used = self.used.lock().expect("replay lock");
        let i = (0..self.steps.len())
            .find(|&i| !used[i] && self.steps[i].agent.as_deref().is_none_or(|a| a == agent))?;
        used[i] = true;
        Some(self.steps[i].clone())
    }
}

#[async_trait]
impl LlmBackend for ReplayBackend {
    async fn complete(
        &self,
        req: &LlmRequest,
        deltas: mpsc::Sender<LlmDelta>,
        cancel: &CancellationToken,
    ) -> Result<LlmTurn, LlmError> {
        if cancel.is_cancelled() {
            return Err(LlmError::Cancelled);
        }
        let step = self.take(&req.agent_id).unwrap_or_else(|| ReplayStep {
            agent: None,
            text: "(the replay script has no more turns)".into(),
            tool_calls: vec![],
        });
        // Stream word by word, as a model would.
        let mut rest = step.text.as_str();
        while !rest.is_empty() {
            let cut = rest
                .char_indices()
                .skip(1)
                .find(|(_, c)| *c == ' ')
                .map(|(i, _)| i)
                .unwrap_or(rest.len());
            let _ = deltas.send(LlmDelta::Text(rest[..cut].to_owned())).await;
            rest = &rest[cut..];
        }
        let tool_calls = step
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id.unwrap_or_else(|| {
                    format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
                }),
                name: c.name,
                arguments: match c.arguments {
                    Value::String(s) => s,
                    Value::Null => "{}".into(),
                    v => v.to_string(),
                },
            })
            .collect();
        Ok(LlmTurn {
            text: step.text,
            tool_calls,
            model: "replay".into(),
            ..Default::default()
        })
    }
}
