//! Bad and large input on the wire: the orchestrator decodes requests up to
//! the shared message limit, and answers a message that does not decode with
//! INVALID_ARGUMENT.

use omicos_e2e::{FakeLlm, Stack, StackOptions};
use omicos_proto::{ListAgentToolsRequest, MAX_MESSAGE_BYTES};

#[tokio::test]
async fn requests_past_the_old_16_mib_limit_decode() {
    let stack = Stack::start(FakeLlm::start(vec![]).await, StackOptions::default()).await;
    let size = (16 << 20) + (1 << 20);
    assert!(size < MAX_MESSAGE_BYTES);
    // A 17 MiB agent id: an unknown agent, so a placeholder that lists tools.
    let r = stack
        .client()
        .await
        .list_agent_tools(ListAgentToolsRequest {
            agent: "a".repeat(size),
            permission_mode: "read_only".into(),
            format: "openai".into(),
        })
        .await
        .expect("decoded at the shared limit, not refused at 16 MiB")
        .into_inner();
    assert!(
        r.tools.iter().any(|t| t.name == "file_manager__read"),
        "{:?}",
        r.tools
    );
}
