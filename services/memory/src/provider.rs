//! The `memory` provider: the five `memory__*` tools over a [`MemoryStore`].

use crate::store::{CATEGORIES, MAX_LIMIT, MemoryError, MemoryStore, NewMemory, SearchQuery};
use async_trait::async_trait;
use omicos_toolkit::{CallCtx, Provider, Risk, ToolError, ToolSpec, tool};
use serde::Deserialize;
use serde_json::{Value, json};

/// The provider. The scope of every call is `CallCtx::scope`, which the
/// runner sets from the deployment; arguments never name a scope (the
/// schemas refuse unknown fields, so a model cannot even try).
#[derive(Clone, Debug)]
pub struct MemoryProvider {
    store: MemoryStore,
}

impl MemoryProvider {
    /// A provider over `store`.
    pub fn new(store: MemoryStore) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SaveArgs {
    content: String,
    category: String,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default = "default_search_limit")]
    limit: i64,
    #[serde(default)]
    include_expired: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    category: Option<String>,
    #[serde(default = "default_list_limit")]
    limit: i64,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    include_expired: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateArgs {
    id: i64,
    content: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForgetArgs {
    id: i64,
}

fn default_search_limit() -> i64 {
    10
}
fn default_list_limit() -> i64 {
    20
}

fn parse<T: for<'de> Deserialize<'de>>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError::invalid(format!("{tool}: {e}")))
}

fn check_category(c: &Option<String>) -> Result<(), ToolError> {
    match c {
        Some(c) if !CATEGORIES.contains(&c.as_str()) => Err(ToolError::invalid(format!(
            "category {c:?} is not one of {}",
            CATEGORIES.join(", ")
        ))),
        _ => Ok(()),
    }
}

fn check_limit(limit: i64) -> Result<(), ToolError> {
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(())
    } else {
        Err(ToolError::invalid(format!(
            "limit must be between 1 and {MAX_LIMIT}, got {limit}"
        )))
    }
}

fn to_tool_error(e: MemoryError) -> ToolError {
    match e {
        MemoryError::Invalid(m) => ToolError::InvalidInput(m),
        MemoryError::Backend(m) => ToolError::Unavailable(m),
        e => ToolError::Failed(e.to_string()),
    }
}

const CATEGORY_HELP: &str = "user: who the user is and what they prefer; feedback: corrections and guidance the user gave; \
project: facts and decisions about the current work; reference: pointers to documents, data and resources.";

#[async_trait]
impl Provider for MemoryProvider {
    fn name(&self) -> &str {
        "memory"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        // Writes (save, update, forget) are Risk::MemoryWrite: they persist
        // beyond the session, so read_only refuses them; they only touch this
        // agent's own memory in its tenant's scope and nothing is ever deleted
        // (update and forget keep history), so auto runs them without asking.
        let cat = json!({"type": "string", "enum": CATEGORIES});
        vec![
            tool(
                "memory__save",
                &format!(
                    "Save a fact to long-term memory so later conversations can recall it. {CATEGORY_HELP} \
                     Give a `key` for a fact that changes over time: saving again under the same key replaces the previous entry (kept as history)."
                ),
                json!({
                    "type": "object",
                    "properties": {
                        "content": {"type": "string", "minLength": 1, "description": "The fact, self-contained."},
                        "category": cat,
                        "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels to filter by later."},
                        "key": {"type": "string", "description": "Optional stable name for this fact."}
                    },
                    "required": ["content", "category"],
                    "additionalProperties": false
                }),
            )
            .risk(Risk::MemoryWrite)
            .toolset("memory")
            .provider("memory")
            .build(),
            tool(
                "memory__search",
                "Search long-term memory by words; the best matches that were used recently come first. \
                 Returns only entries that are still valid unless include_expired is true.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Words to look for (plain text, no operators)."},
                        "category": cat,
                        "tags": {"type": "array", "items": {"type": "string"}, "description": "Only entries with all these tags."},
                        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 10},
                        "include_expired": {"type": "boolean", "default": false, "description": "Also superseded and forgotten entries."}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            )
            .risk(Risk::Read)
            .toolset("memory")
            .provider("memory")
            .build(),
            tool(
                "memory__list",
                "List long-term memory entries, newest first. Pass next_cursor back as cursor for the next page.",
                json!({
                    "type": "object",
                    "properties": {
                        "category": cat,
                        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 20},
                        "cursor": {"type": "string", "description": "next_cursor of the previous page."},
                        "include_expired": {"type": "boolean", "default": false}
                    },
                    "additionalProperties": false
                }),
            )
            .risk(Risk::Read)
            .toolset("memory")
            .provider("memory")
            .build(),
            tool(
                "memory__update",
                "Replace the content of a memory entry. The old entry is kept as superseded history and the new one points to it.",
                json!({
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "description": "The entry's id."},
                        "content": {"type": "string", "minLength": 1}
                    },
                    "required": ["id", "content"],
                    "additionalProperties": false
                }),
            )
            .risk(Risk::MemoryWrite)
            .toolset("memory")
            .provider("memory")
            .build(),
            tool(
                "memory__forget",
                "Mark a memory entry as no longer valid. It stops appearing in searches but is kept as history.",
                json!({
                    "type": "object",
                    "properties": {"id": {"type": "integer", "description": "The entry's id."}},
                    "required": ["id"],
                    "additionalProperties": false
                }),
            )
            .risk(Risk::MemoryWrite)
            .toolset("memory")
            .provider("memory")
            .build(),
        ]
    }

    fn validate_input(&self, tool: &str, args: &Value, _ctx: &CallCtx) -> Result<(), ToolError> {
        match tool {
            "memory__save" => {
                let a: SaveArgs = parse(tool, args.clone())?;
                check_category(&Some(a.category))
            }
            "memory__search" => {
                let a: SearchArgs = parse(tool, args.clone())?;
                check_category(&a.category)?;
                check_limit(a.limit)
            }
            "memory__list" => {
                let a: ListArgs = parse(tool, args.clone())?;
                check_category(&a.category)?;
                check_limit(a.limit)
            }
            "memory__update" => parse::<UpdateArgs>(tool, args.clone()).map(|_| ()),
            "memory__forget" => parse::<ForgetArgs>(tool, args.clone()).map(|_| ()),
            other => Err(ToolError::UnknownTool(other.into())),
        }
    }

    async fn call(&self, tool: &str, args: Value, ctx: CallCtx) -> Result<Value, ToolError> {
        // validate_input ran already over gRPC; in-process callers may skip
        // it, so the same checks run again here.
        self.validate_input(tool, &args, &ctx)?;
        let scope = ctx.scope.as_str();
        if scope.is_empty() {
            return Err(ToolError::failed(
                "the call carries no memory scope; the runner must set one",
            ));
        }
        let s = &self.store;
        let out = match tool {
            "memory__save" => {
                let a: SaveArgs = parse(tool, args)?;
                let m = s
                    .save(
                        scope,
                        NewMemory {
                            content: a.content,
                            category: a.category,
                            tags: a.tags,
                            key: a.key,
                        },
                    )
                    .await
                    .map_err(to_tool_error)?;
                json!({"saved": m})
            }
            "memory__search" => {
                let a: SearchArgs = parse(tool, args)?;
                let q = SearchQuery {
                    text: a.query,
                    category: a.category,
                    tags: a.tags,
                    limit: a.limit,
                    include_expired: a.include_expired,
                };
                let hits = s.search(scope, &q).await.map_err(to_tool_error)?;
                if crate::terms::search_words(&q.text).is_empty() {
                    json!({"results": hits, "note": "the query has no words to search for (letters or digits)"})
                } else {
                    json!({"results": hits})
                }
            }
            "memory__list" => {
                let a: ListArgs = parse(tool, args)?;
                let page = s
                    .list(
                        scope,
                        a.category.as_deref(),
                        a.limit,
                        a.cursor.as_deref(),
                        a.include_expired,
                    )
                    .await
                    .map_err(to_tool_error)?;
                serde_json::to_value(page).map_err(|e| ToolError::failed(e.to_string()))?
            }
            "memory__update" => {
                let a: UpdateArgs = parse(tool, args)?;
                let m = s
                    .update(scope, a.id, &a.content)
                    .await
                    .map_err(to_tool_error)?;
                json!({"updated": m})
            }
            "memory__forget" => {
                let a: ForgetArgs = parse(tool, args)?;
                let m = s.forget(scope, a.id).await.map_err(to_tool_error)?;
                json!({"forgotten": m})
            }
            other => return Err(ToolError::UnknownTool(other.into())),
        };
        Ok(out)
    }
}
