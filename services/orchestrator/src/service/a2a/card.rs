//! The Agent Card (`/.well-known/agent-card.json`): the deployment as one
//! A2A agent whose skills are the catalog's agents, reached over JSON-RPC at
//! [`super::RPC_PATH`] and over gRPC at the same port (`lf.a2a.v1.A2AService`),
//! with the security schemes its auth accepts.
//!
//! The card is A2A 1.0's `AgentCard` in ProtoJSON. It also carries 0.3's
//! `url`, `preferredTransport` and `protocolVersion`, so that a 0.3 client
//! finds the endpoint; a 1.0 client reads `supportedInterfaces` and ignores them.

use crate::agents::AgentDirectory;
use omicos_auth::ClientAuthConfig;
use serde_json::{Value, json};

/// The A2A versions the endpoint speaks, newest first.
pub const PROTOCOL_VERSIONS: [&str; 2] = ["1.0", "0.3"];

/// The version the gRPC binding speaks (`a2a.proto` is 1.0's).
pub const GRPC_PROTOCOL_VERSION: &str = "1.0";

/// The card for a deployment reached at `base` (`https://host:port`), whose
/// HTTP `Host` is `host` (the gRPC binding's address is `host:port`, as A2A
/// 1.0 writes it: no scheme).
pub fn card(base: &str, host: &str, agents: &dyn AgentDirectory, auth: &ClientAuthConfig) -> Value {
    let url = format!("{base}{}", super::RPC_PATH);
    let has_port = host
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let grpc = if has_port {
        host.to_owned()
    } else {
        let port = if base.starts_with("https:") { 443 } else { 80 };
        format!("{host}:{port}")
    };
    let mut interfaces: Vec<Value> = PROTOCOL_VERSIONS
        .iter()
        .map(|v| json!({"url": url, "protocolBinding": "JSONRPC", "protocolVersion": v}))
        .collect();
    interfaces.push(
        json!({"url": grpc, "protocolBinding": "GRPC", "protocolVersion": GRPC_PROTOCOL_VERSION}),
    );
    let (infos, _tier) = agents.list();
    let skills: Vec<Value> = infos
        .iter()
        .filter(|a| !a.locked)
        .map(|a| {
            let mut tags: Vec<&str> = vec!["omicos-agent"];
            if !a.category.is_empty() {
                tags.push(&a.category);
            }
            let description = [&a.summary, &a.description, &a.use_when]
                .into_iter()
                .find(|s| !s.trim().is_empty())
                .cloned()
                .unwrap_or_else(|| a.name.clone());
            json!({
                "id": a.id,
                "name": a.name,
                "description": description,
                "tags": tags,
                "examples": a.example_prompts,
                "inputModes": ["text/plain"],
                "outputModes": ["text/plain"],
            })
        })
        .collect();
    let mut card = json!({
        "name": "omicos",
        "description": "An omicos deployment: a team of LLM agents with tools (a Python kernel, a shell, files, the web, memory). \
                        Each skill is one agent; name it in the message's metadata (`agent`), or the default agent answers. \
                        A task is one turn; a context is one omicos session.",
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": interfaces,
        "provider": {"organization": "omicos", "url": base},
        "capabilities": {"streaming": true, "pushNotifications": false, "extendedAgentCard": false},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
        // 0.3 clients.
        "url": url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
    });
    if auth.enabled {
        let mut schemes = serde_json::Map::new();
        let mut requirements = vec![];
        if !auth.api_keys.is_empty() {
            schemes.insert(
                "apiKey".into(),
                json!({"httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "An omicos API key, as `Authorization: Bearer <key>` (the same keys as the gRPC API)",
                }}),
            );
            requirements.push(json!({"schemes": {"apiKey": {"list": []}}}));
        }
        if !auth.jwt.jwks_url.is_empty() {
            let mut oidc = json!({
                "description": "An OIDC access token (JWT), as `Authorization: Bearer <token>`",
            });
            if !auth.jwt.issuer.is_empty() {
                oidc["openIdConnectUrl"] = json!(format!(
                    "{}/.well-known/openid-configuration",
                    auth.jwt.issuer.trim_end_matches('/')
                ));
            }
            schemes.insert("oidc".into(), json!({"openIdConnectSecurityScheme": oidc}));
            requirements.push(json!({"schemes": {"oidc": {"list": []}}}));
        }
        card["securitySchemes"] = Value::Object(schemes);
        card["securityRequirements"] = Value::Array(requirements);
    }
    card
}
