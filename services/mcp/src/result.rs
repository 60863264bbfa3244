//! An MCP `CallToolResult` as the runner's result value: text joined, images
//! saved under `<workspace>/.omicos/outputs/<session>/` (as the kernel saves
//! PNGs) and replaced by their path, resource links and embedded resources
//! kept, structured content kept as is. `isError` becomes a tool error.

use base64::Engine;
use omicos_toolkit::{CallCtx, ToolError, confine_path};
use serde_json::{Map, Value, json};

/// Converts `result` of `tool` (qualified name, for messages).
pub fn convert(result: rmcp::model::CallToolResult, ctx: &CallCtx) -> Result<Value, ToolError> {
    let raw = serde_json::to_value(&result)
        .map_err(|e| ToolError::failed(format!("cannot read the MCP result: {e}")))?;
    let is_error = raw.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let blocks = raw
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut texts: Vec<String> = Vec::new();
    let mut content: Vec<Value> = Vec::new();
    let mut images = 0usize;
    for b in blocks {
        match b.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => {
                let t = b
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                texts.push(t.clone());
                content.push(json!({"type": "text", "text": t}));
            }
            kind @ ("image" | "audio") => {
                images += 1;
                let mime = b
                    .get("mimeType")
                    .and_then(Value::as_str)
                    .unwrap_or("application/octet-stream")
                    .to_owned();
                let data = b.get("data").and_then(Value::as_str).unwrap_or("");
                match save(ctx, kind, &mime, data, images) {
                    Ok((path, bytes)) => {
                        texts.push(format!("[{kind} saved: {path}]"));
                        content.push(
                            json!({"type": kind, "mime_type": mime, "path": path, "bytes": bytes}),
                        );
                    }
                    Err(e) => {
                        texts.push(format!("[{kind} not saved: {e}]"));
                        content.push(json!({"type": kind, "mime_type": mime, "error": e}));
                    }
                }
            }
            "resource_link" => {
                let mut link = Map::new();
                link.insert("type".into(), json!("resource_link"));
                for k in ["uri", "name", "title", "description", "mimeType", "size"] {
                    if let Some(v) = b.get(k) {
                        link.insert(k.into(), v.clone());
                    }
                }
                texts.push(format!(
                    "[resource link: {}]",
                    b.get("uri").and_then(Value::as_str).unwrap_or("")
                ));
                content.push(Value::Object(link));
            }
            "resource" => {
                let r = b.get("resource").cloned().unwrap_or(Value::Null);
                if let Some(t) = r.get("text").and_then(Value::as_str) {
                    texts.push(t.to_owned());
                }
                content.push(json!({"type": "resource", "resource": r}));
            }
            _ => content.push(b),
        }
    }
    let structured = raw.get("structuredContent").cloned();
    if is_error {
        let msg = if texts.is_empty() {
            "the MCP tool reported an error (isError) without a message".to_owned()
        } else {
            texts.join("\n")
        };
        return Err(ToolError::failed(msg));
    }
    // The plain case stays plain: one text block is just that text.
    let only_text = structured.is_none() && content.iter().all(|c| c["type"] == "text");
    if only_text {
        return Ok(Value::String(texts.join("\n")));
    }
    let mut out = Map::new();
    out.insert("text".into(), Value::String(texts.join("\n")));
    out.insert("content".into(), Value::Array(content));
    if let Some(s) = structured {
        out.insert("structured_content".into(), s);
    }
    Ok(Value::Object(out))
}

fn extension(mime: &str) -> &str {
    match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "audio/wav" | "audio/x-wav" => "wav",
        "audio/mpeg" => "mp3",
        _ => "bin",
    }
}

fn component(s: &str, fallback: &str) -> String {
    let out: String = s
        .chars()
        .take(120)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() { fallback.into() } else { out }
}

/// Saves base64 `data` and returns its workspace-relative path and size.
fn save(
    ctx: &CallCtx,
    kind: &str,
    mime: &str,
    data: &str,
    n: usize,
) -> Result<(String, usize), String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.split_whitespace().collect::<String>())
        .map_err(|e| format!("the {kind} is not base64: {e}"))?;
    let rel_dir = format!(".omicos/outputs/{}", component(&ctx.session_id, "default"));
    let dir = confine_path(&ctx.workspace, &rel_dir).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {rel_dir}: {e}"))?;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let name = format!(
        "{ms}_{}_{n}.{}",
        component(&ctx.call_id, "call"),
        extension(mime)
    );
    std::fs::write(dir.join(&name), &bytes)
        .map_err(|e| format!("cannot write {rel_dir}/{name}: {e}"))?;
    Ok((format!("{rel_dir}/{name}"), bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(v: Value) -> rmcp::model::CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn text_image_links_structured_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = CallCtx::for_test(dir.path(), "s1");
        let v = convert(
            result(json!({"content": [{"type": "text", "text": "hi"}]})),
            &ctx,
        )
        .unwrap();
        assert_eq!(v, json!("hi"));
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG\r\n\x1a\nfake");
        let v = convert(
            result(json!({
                "content": [
                    {"type": "image", "data": png, "mimeType": "image/png"},
                    {"type": "resource_link", "uri": "demo://r/1", "name": "r1"}
                ],
                "structuredContent": {"sum": 3}
            })),
            &ctx,
        )
        .unwrap();
        let path = v["content"][0]["path"].as_str().unwrap();
        assert!(
            path.starts_with(".omicos/outputs/s1/") && path.ends_with(".png"),
            "{path}"
        );
        assert_eq!(
            std::fs::read(dir.path().join(path)).unwrap(),
            b"\x89PNG\r\n\x1a\nfake"
        );
        assert_eq!(v["content"][1]["uri"], "demo://r/1");
        assert_eq!(v["structured_content"]["sum"], 3);
        let e = convert(
            result(json!({"content": [{"type": "text", "text": "boom"}], "isError": true})),
            &ctx,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "boom");
    }
}
