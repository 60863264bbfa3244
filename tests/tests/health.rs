//! Health and reflection answer on every service.

use omicos_e2e::{FakeLlm, Stack, StackOptions};
use tonic::transport::Channel;

/// `list_services_v1` and `list_services_v1alpha`: the same ListServices
/// call through each reflection version's generated client.
macro_rules! list_services {
    ($name:ident, $version:ident) => {
        async fn $name(url: &str) -> Vec<String> {
            use tonic_reflection::pb::$version::*;
            let ch = Channel::from_shared(url.to_owned())
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut c = server_reflection_client::ServerReflectionClient::new(ch);
            let req = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(server_reflection_request::MessageRequest::ListServices(
                    String::new(),
                )),
            };
            let mut s = c
                .server_reflection_info(tokio_stream::iter(vec![req]))
                .await
                .unwrap()
                .into_inner();
            let r = s.message().await.unwrap().unwrap();
            match r.message_response {
                Some(server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
                    l.service.into_iter().map(|s| s.name).collect()
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    };
}

list_services!(list_services_v1, v1);
list_services!(list_services_v1alpha, v1alpha);

#[tokio::test]
async fn health_and_reflection_on_orchestrator_and_runner() {
    let stack = Stack::start(FakeLlm::start(vec![]).await, StackOptions::default()).await;
    stack.wait_serving(&stack.runner).await;
    let orch = list_services_v1(&stack.orchestrator).await;
    assert!(
        orch.contains(&"omicos.v1.Orchestrator".to_string()),
        "{orch:?}"
    );
    assert!(
        orch.contains(&"grpc.health.v1.Health".to_string()),
        "{orch:?}"
    );
    let runner = list_services_v1alpha(&stack.runner).await;
    assert!(
        runner.contains(&"omicos.v1.ToolRunner".to_string()),
        "{runner:?}"
    );
    assert!(
        runner.contains(&"omicos.v1.Registry".to_string()),
        "{runner:?}"
    );
    // Draining flips health to NOT_SERVING: a Watch opened before the drain sees it.
    let ch = Channel::from_shared(stack.orchestrator.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let mut watch = h
        .watch(tonic_health::pb::HealthCheckRequest {
            service: "omicos.v1.Orchestrator".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(
        first.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    stack.orch_shutdown.trigger();
    let next = tokio::time::timeout(std::time::Duration::from_secs(5), watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        next.status,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32
    );
}
