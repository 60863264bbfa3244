//! `task__create`, `task__update`, `task__list`: a per-session todo list kept
//! in `<workspace>/.omicos/tasks/<session>.json` (the runner is stateless, so
//! the list lives with the workspace and any runner replica can serve it).

use super::{session_file, str_arg};
use async_trait::async_trait;
use omicos_toolkit::{CallCtx, Provider, ToolError, ToolSpec, tool};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::path::Path;

/// Where a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Not started.
    Pending,
    /// Being worked on.
    InProgress,
    /// Done.
    Completed,
    /// Dropped.
    Cancelled,
}

impl TaskStatus {
    fn parse(s: &str) -> Result<Self, ToolError> {
        match s.trim() {
            "pending" => Ok(Self::Pending),
            "in_progress" => Ok(Self::InProgress),
            "completed" | "done" => Ok(Self::Completed),
            "cancelled" | "canceled" => Ok(Self::Cancelled),
            other => Err(ToolError::invalid(format!(
                "unknown status `{other}` (pending, in_progress, completed, cancelled)"
            ))),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Task {
    id: u64,
    title: String,
    #[serde(default)]
    description: String,
    status: TaskStatus,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct TaskList {
    #[serde(default)]
    next_id: u64,
    #[serde(default)]
    tasks: Vec<Task>,
}

/// Serialises read-modify-write of task files inside this process: parallel
/// tool calls of one session must not lose each other's updates.
static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// More tasks than this in one session is a runaway loop, not a plan.
const MAX_TASKS: usize = 500;
const MAX_TEXT: usize = 4096;

/// The task provider.
#[derive(Debug, Default, Clone)]
pub struct TaskProvider;

async fn read_list(path: &Path) -> Result<TaskList, ToolError> {
    match tokio::fs::read(path).await {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            ToolError::failed(format!("the task list {} is damaged: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TaskList {
            next_id: 1,
            tasks: Vec::new(),
        }),
        Err(e) => Err(ToolError::failed(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

fn summary(list: &TaskList) -> Value {
    let count = |s| list.tasks.iter().filter(|t| t.status == s).count();
    json!({
        "tasks": list.tasks,
        "counts": {
            "pending": count(TaskStatus::Pending),
            "in_progress": count(TaskStatus::InProgress),
            "completed": count(TaskStatus::Completed),
            "cancelled": count(TaskStatus::Cancelled),
        }
    })
}

fn text_arg(args: &Value, key: &str) -> Result<Option<String>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() > MAX_TEXT => Err(ToolError::invalid(format!(
            "`{key}` is longer than {MAX_TEXT} bytes"
        ))),
        Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
        Some(_) => Err(ToolError::invalid(format!("`{key}` must be a string"))),
    }
}

#[async_trait]
impl Provider for TaskProvider {
    fn name(&self) -> &str {
        "task"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        let status =
            json!({"type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"]});
        vec![
            tool(
                "task__create",
                "Add a task to this session's todo list. Use it to break multi-step work into steps you can tick off.",
                json!({
                    "type": "object",
                    "properties": {
                        "title": {"type": "string", "description": "Short imperative title."},
                        "description": {"type": "string", "description": "Details, acceptance criteria."},
                        "status": status,
                    },
                    "required": ["title"],
                    "additionalProperties": false
                }),
            )
            .toolset("task")
            .provider("task")
            .build(),
            tool(
                "task__update",
                "Change a task's status, title or description. Mark a task in_progress when you start it and \
                 completed as soon as it is done.",
                json!({
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 1},
                        "status": status,
                        "title": {"type": "string"},
                        "description": {"type": "string"},
                    },
                    "required": ["id"],
                    "additionalProperties": false
                }),
            )
            .toolset("task")
            .provider("task")
            .build(),
            tool(
                "task__list",
                "Show this session's todo list with counts per status.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            )
            .toolset("task")
            .provider("task")
            .build(),
        ]
    }

    fn validate_input(&self, _tool: &str, _args: &Value, ctx: &CallCtx) -> Result<(), ToolError> {
        session_file::path(&ctx.workspace, "tasks", &ctx.session_id, "json").map(|_| ())
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        if !matches!(tool, "task__create" | "task__update" | "task__list") {
            return Err(ToolError::UnknownTool(tool.into()));
        }
        let path = session_file::path(&ctx.workspace, "tasks", &ctx.session_id, "json")?;
        let _guard = LOCK.lock().await;
        let mut list = read_list(&path).await?;
        let changed = match tool {
            "task__list" => return Ok(summary(&list)),
            "task__create" => {
                let title = str_arg(&args, "title")?.trim().to_string();
                if title.is_empty() || title.len() > MAX_TEXT {
                    return Err(ToolError::invalid(format!(
                        "`title` must be 1 to {MAX_TEXT} bytes"
                    )));
                }
                if list.tasks.len() >= MAX_TASKS {
                    return Err(ToolError::failed(format!(
                        "the todo list already holds {MAX_TASKS} tasks"
                    )));
                }
                let status = match args.get("status").and_then(Value::as_str) {
                    Some(s) => TaskStatus::parse(s)?,
                    None => TaskStatus::Pending,
                };
                let id = list
                    .next_id
                    .max(list.tasks.iter().map(|t| t.id + 1).max().unwrap_or(1));
                list.next_id = id + 1;
                let task = Task {
                    id,
                    title,
                    description: text_arg(&args, "description")?.unwrap_or_default(),
                    status,
                };
                list.tasks.push(task.clone());
                json!({"created": task})
            }
            _ => {
                let id = args
                    .get("id")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| ToolError::invalid("`id` must be a positive integer"))?;
                let status = args
                    .get("status")
                    .and_then(Value::as_str)
                    .map(TaskStatus::parse)
                    .transpose()?;
                let title = text_arg(&args, "title")?;
                let description = text_arg(&args, "description")?;
                if status.is_none() && title.is_none() && description.is_none() {
                    return Err(ToolError::invalid(
                        "nothing to change: give status, title or description",
                    ));
                }
                let known: Vec<u64> = list.tasks.iter().map(|t| t.id).collect();
                let task = list.tasks.iter_mut().find(|t| t.id == id).ok_or_else(|| {
                    ToolError::invalid(format!("no task {id} in this session (ids: {known:?})"))
                })?;
                if let Some(s) = status {
                    task.status = s;
                }
                if let Some(t) = title {
                    if t.is_empty() {
                        return Err(ToolError::invalid("`title` cannot be empty"));
                    }
                    task.title = t;
                }
                if let Some(d) = description {
                    task.description = d;
                }
                json!({"updated": task.clone()})
            }
        };
        let bytes =
            serde_json::to_vec_pretty(&list).map_err(|e| ToolError::failed(e.to_string()))?;
        session_file::write_atomic(&path, &bytes).await?;
        let mut out = summary(&list);
        if let (Value::Object(o), Value::Object(c)) = (&mut out, changed) {
            o.extend(c);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_todo_list_per_session_kept_in_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let a = CallCtx::for_test(ws.path(), "sa");
        let b = CallCtx::for_test(ws.path(), "sb");
        let p = TaskProvider;
        let r = p
            .call("task__create", json!({"title": "load data"}), a.clone())
            .await
            .unwrap();
        assert_eq!(r["created"]["id"], 1);
        assert_eq!(r["created"]["status"], "pending");
        p.call(
            "task__create",
            json!({"title": "plot", "description": "umap"}),
            a.clone(),
        )
        .await
        .unwrap();
        let r = p
            .call(
                "task__update",
                json!({"id": 1, "status": "completed"}),
                a.clone(),
            )
            .await
            .unwrap();
        assert_eq!(r["updated"]["status"], "completed");
        assert_eq!(r["counts"]["completed"], 1);
        assert_eq!(r["counts"]["pending"], 1);
        // Another session has its own list.
        let rb = p.call("task__list", json!({}), b.clone()).await.unwrap();
        assert_eq!(rb["tasks"].as_array().unwrap().len(), 0);
        // The list is a file: a fresh provider (another runner replica) sees it.
        let stored: Value = serde_json::from_slice(
            &std::fs::read(ws.path().join(".omicos/tasks/sa.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(stored["tasks"][1]["title"], "plot");
        let r = TaskProvider
            .call("task__list", json!({}), a.clone())
            .await
            .unwrap();
        assert_eq!(r["tasks"][0]["title"], "load data");
        assert_eq!(r["tasks"][1]["description"], "umap");
        // Errors are clear and change nothing.
        let e = p
            .call(
                "task__update",
                json!({"id": 9, "status": "completed"}),
                a.clone(),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no task 9"), "{e}");
        let e = p
            .call("task__update", json!({"id": 1}), a.clone())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("nothing to change"));
        let e = p
            .call(
                "task__update",
                json!({"id": 1, "status": "maybe"}),
                a.clone(),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("unknown status"));
        assert!(
            p.call("task__create", json!({"title": " "}), a.clone())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn parallel_creates_lose_nothing() {
        let ws = tempfile::tempdir().unwrap();
        let ctx = CallCtx::for_test(ws.path(), "par");
        let mut handles = Vec::new();
        for i in 0..20 {
            let ctx = ctx.clone();
            handles.push(tokio::spawn(async move {
                TaskProvider
                    .call("task__create", json!({"title": format!("t{i}")}), ctx)
                    .await
                    .unwrap()
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let r = TaskProvider
            .call("task__list", json!({}), ctx)
            .await
            .unwrap();
        let mut ids: Vec<u64> = r["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap())
            .collect();
        ids.sort();
        assert_eq!(ids, (1..=20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_damaged_file_is_reported() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join(".omicos/tasks")).unwrap();
        std::fs::write(ws.path().join(".omicos/tasks/s.json"), "{not json").unwrap();
        let e = TaskProvider
            .call("task__list", json!({}), CallCtx::for_test(ws.path(), "s"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
    }
}
