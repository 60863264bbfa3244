//! The page, gRPC and gRPC-web on one port, composed the way the orchestrator
//! will compose them: tonic's routes (behind tonic-web's layer) first, the
//! page's router as the fallback. A real server on 127.0.0.1, real clients:
//! a browser-style HTTP/1.1 GET, a gRPC-web POST over HTTP/1.1, and a tonic
//! client over HTTP/2.

use std::time::Duration;

async fn serve(ws: &std::path::Path) -> String {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let grpc = tonic::service::Routes::new(health)
        .into_axum_router()
        .layer(tonic_web::GrpcWebLayer::new());
    let app = grpc.fallback_service(omicos_webui::router(ws));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn page_grpc_and_grpc_web_share_a_port() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join(".omicos/outputs/s")).unwrap();
    std::fs::write(ws.path().join(".omicos/outputs/s/p.png"), b"\x89PNG").unwrap();
    let base = serve(ws.path()).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // The page, as a browser asks for it.
    let page = http
        .get(format!("{base}/s/some-session"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert!(page.text().await.unwrap().contains(r#"<div id="app">"#));
    let img = http
        .get(format!("{base}/files/.omicos/outputs/s/p.png"))
        .send()
        .await
        .unwrap();
    assert_eq!(img.status(), 200);
    assert_eq!(img.headers()["content-type"], "image/png");

    // gRPC-web over HTTP/1.1: an empty HealthCheckRequest in one data frame.
    let res = http
        .post(format!("{base}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .body(vec![0u8, 0, 0, 0, 0])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/grpc-web+proto");
    let body = res.bytes().await.unwrap();
    // Data frame: HealthCheckResponse { status: SERVING (1) }, then the trailer frame.
    assert_eq!(&body[..7], &[0, 0, 0, 0, 2, 0x08, 0x01], "{body:?}");
    assert_eq!(body[7], 0x80, "{body:?}");
    let trailers = String::from_utf8_lossy(&body[12..]).to_lowercase();
    assert!(trailers.contains("grpc-status:0"), "{trailers}");

    // Plain gRPC over HTTP/2 on the same port.
    let ch = tonic::transport::Channel::from_shared(base.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = client
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, 1);

    // An unknown gRPC method still gets a gRPC answer, not the page.
    let res = http
        .post(format!("{base}/omicos.v1.Nope/Nothing"))
        .header("content-type", "application/grpc-web+proto")
        .body(vec![0u8, 0, 0, 0, 0])
        .send()
        .await
        .unwrap();
    assert_ne!(
        res.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"text/html; charset=utf-8"[..])
    );
}
