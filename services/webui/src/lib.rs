//! The omicos web page, built from `ui/` and committed under `dist/`, embedded
//! in the binary (cargo alone builds it; no npm at build time), and served as
//! an axum [`Router`]:
//!
//! - `GET /` and any path without a file extension (`/s/<session>`): the
//!   page's `index.html` (SPA fallback), `Cache-Control: no-cache` with an ETag;
//! - `GET /assets/<name>-<hash>.<ext>`: the bundle's files, content-hashed
//!   by Vite, so cached for a year as immutable;
//! - `GET /files/<workspace-relative path>`: a workspace file under
//!   `.omicos/outputs/` (images a kernel drew, generated images) or
//!   `.omicos/tool_outputs/` (spooled large results), read-only, with Range
//!   support for previews; anything else is 404. Behind a [`FileGate`]
//!   (the orchestrator's: the same bearer token as gRPC, in `Authorization`
//!   or the page's `omicos_token` cookie, and only the caller's own
//!   sessions' outputs, in its tenant's workspace).
//!
//! The orchestrator serves this beside its gRPC and gRPC-web services on one
//! port: `routes.into_axum_router().fallback_service(omicos_webui::router(ws))`.

use axum::{
    Router,
    body::Body,
    extract::{Path as UrlPath, Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use std::path::PathBuf;
use std::sync::Arc;
use tower::ServiceExt;

#[derive(rust_embed::Embed)]
#[folder = "dist/"]
struct Dist;

/// The workspace folders `/files/` serves, relative to the workspace root.
pub const FILE_ROOTS: [&str; 2] = [".omicos/outputs", ".omicos/tool_outputs"];

/// What the page's policy allows: its own scripts, styles, images and
/// gRPC-web calls, nothing inline, no framing.
const PAGE_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// A workspace file (an SVG or HTML output, say) opened directly runs nothing.
const FILE_CSP: &str = "sandbox; default-src 'none'; img-src 'self'; style-src 'unsafe-inline'";

/// Hashed assets never change under their name.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// The cookie the page sets (path `/files/`, SameSite=Strict) so that an
/// `<img src="/files/…">` carries its bearer token: an image request cannot
/// send an `Authorization` header.
pub const TOKEN_COOKIE: &str = "omicos_token";

/// The future a [`FileGate`] answers with.
pub type GateFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<PathBuf, StatusCode>> + Send + 'a>>;

/// Who may read which `/files/` path. Resolve, then authorize: a gate first
/// resolves `rel` to the real file ([`resolve_workspace_file`]: percent-decoded
/// by the router, `..` and symlinks resolved, confined to [`FILE_ROOTS`]) and
/// decides on that real path, never on the text asked for. Answers the real
/// path to serve, or the status to answer instead (401 without a valid
/// credential, 404 for what is missing or not the caller's).
pub trait FileGate: Send + Sync + 'static {
    /// Decides one request.
    fn resolve<'a>(&'a self, headers: &'a HeaderMap, rel: &'a str) -> GateFuture<'a>;
}

/// No gate: every request is served from one workspace (tests, and a page
/// served without an orchestrator).
struct Open(PathBuf);

impl FileGate for Open {
    fn resolve<'a>(&'a self, _headers: &'a HeaderMap, rel: &'a str) -> GateFuture<'a> {
        Box::pin(async move { resolve_workspace_file(&self.0, rel).ok_or(StatusCode::NOT_FOUND) })
    }
}

/// How an HTTP route is guarded.
#[derive(Clone, Copy, Debug)]
pub enum RouteAccess {
    /// Behind the [`FileGate`]: a credential, and only the caller's own
    /// sessions' files in its tenant's workspace.
    Gated,
    /// Open to anyone; why that is safe.
    Open(&'static str),
}

/// Which handler a route runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// Workspace output files.
    Files,
    /// The embedded page (the router's fallback: every other path).
    Page,
}

/// Every route of the page's router, with how it is guarded; the router is
/// built from this table ([`router_with`]), so a route cannot exist without
/// an entry. `*` is the fallback.
pub const ROUTES: &[(&str, Handler, RouteAccess)] = &[
    ("/files/{*path}", Handler::Files, RouteAccess::Gated),
    (
        "*",
        Handler::Page,
        RouteAccess::Open(
            "the page's own embedded bundle (GET/HEAD only): the same bytes for everyone, no workspace or session data",
        ),
    ),
];

/// The bearer token a request carries: `Authorization`, else the page's cookie.
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return Some(v.to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == TOKEN_COOKIE && !v.is_empty()).then(|| format!("Bearer {v}"))
        })
}

/// The page and the workspace output files, for the workspace at `workspace`
/// (no credential asked: see [`router_with`]).
pub fn router(workspace: impl Into<PathBuf>) -> Router {
    router_with(Arc::new(Open(workspace.into())))
}

/// The page, and the output files behind `gate`: the routes of [`ROUTES`].
pub fn router_with(gate: Arc<dyn FileGate>) -> Router {
    let mut files = Router::new();
    let mut page_router = Router::new();
    for (path, handler, _) in ROUTES {
        match handler {
            Handler::Files => files = files.route(path, get(workspace_file)),
            // The page's script is ~300 KB and ~95 KB gzipped; workspace files are
            // sent as they are (images are compressed already, and Range needs the bytes).
            Handler::Page => {
                page_router = page_router
                    .fallback(page)
                    .layer(tower_http::compression::CompressionLayer::new().gzip(true))
            }
        }
    }
    files.with_state(gate).merge(page_router)
}

/// Whether the embedded page has an `index.html` (a build without one is a packaging bug).
pub fn has_page() -> bool {
    Dist::get("index.html").is_some()
}

async fn page(method: Method, headers: HeaderMap, req: Request) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, HEAD")],
        )
            .into_response();
    }
    let path = req.uri().path().trim_start_matches('/');
    let name = if path.is_empty() { "index.html" } else { path };
    if let Some(file) = Dist::get(name) {
        return asset(name, file, &headers, method == Method::HEAD);
    }
    // A missing file stays missing: only page routes (no extension) get the page.
    let last = name.rsplit('/').next().unwrap_or_default();
    if name.starts_with("assets/") || last.contains('.') {
        return StatusCode::NOT_FOUND.into_response();
    }
    match Dist::get("index.html") {
        Some(index) => asset("index.html", index, &headers, method == Method::HEAD),
        None => (
            StatusCode::NOT_FOUND,
            "the page is not built into this binary",
        )
            .into_response(),
    }
}

fn asset(name: &str, file: rust_embed::EmbeddedFile, req: &HeaderMap, head: bool) -> Response {
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()));
    let cache = if name.starts_with("assets/") {
        IMMUTABLE
    } else {
        "no-cache"
    };
    let mime = file.metadata.mimetype();
    let content_type = if mime.starts_with("text/") || mime == "application/javascript" {
        format!("{mime}; charset=utf-8")
    } else {
        mime.to_owned()
    };
    let mut res = if req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else if head {
        let mut r = Response::new(Body::empty());
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(file.data.len()));
        r
    } else {
        Response::new(Body::from(file.data.into_owned()))
    };
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if name == "index.html" {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PAGE_CSP),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    res
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The real path of a `/files/` request, or None when it is not a regular
/// file inside one of [`FILE_ROOTS`] (after `..` and symlinks are resolved).
/// `rel` is already percent-decoded (the router decodes the path once:
/// `%2e%2e` arrives as `..`).
pub fn resolve_workspace_file(workspace: &std::path::Path, rel: &str) -> Option<PathBuf> {
    let (root, rest) = FILE_ROOTS.iter().find_map(|r| {
        rel.strip_prefix(r)
            .and_then(|rest| rest.strip_prefix('/'))
            .map(|rest| (*r, rest))
    })?;
    if rest.is_empty() || rest.contains('\\') {
        return None;
    }
    let full = omicos_toolkit::confine_path(&workspace.join(root), rest).ok()?;
    full.is_file().then_some(full)
}

async fn workspace_file(
    State(gate): State<Arc<dyn FileGate>>,
    UrlPath(rel): UrlPath<String>,
    req: Request,
) -> Response {
    let full = match gate.resolve(req.headers(), &rel).await {
        Ok(f) => f,
        Err(code) => return code.into_response(),
    };
    let served = tower_http::services::ServeFile::new(&full)
        .oneshot(req)
        .await;
    let mut res = match served {
        Ok(r) => r.map(Body::new),
        Err(never) => match never {},
    };
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(FILE_CSP),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    async fn get(app: &Router, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut b = Request::builder().uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        app.clone()
            .oneshot(b.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    fn header(r: &Response, name: header::HeaderName) -> &str {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    async fn body(r: Response) -> Vec<u8> {
        to_bytes(r.into_body(), 64 << 20).await.unwrap().to_vec()
    }

    fn first_asset(ext: &str) -> String {
        Dist::iter()
            .find(|n| n.starts_with("assets/") && n.ends_with(ext))
            .map(|n| format!("/{n}"))
            .unwrap_or_else(|| panic!("no {ext} asset embedded"))
    }

    #[tokio::test]
    async fn index_is_html_and_revalidated() {
        let app = router("/nonexistent");
        let r = get(&app, "/", &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, header::CONTENT_TYPE), "text/html; charset=utf-8");
        assert_eq!(header(&r, header::CACHE_CONTROL), "no-cache");
        assert!(header(&r, header::CONTENT_SECURITY_POLICY).contains("script-src 'self'"));
        let etag = header(&r, header::ETAG).to_owned();
        let html = String::from_utf8(body(r).await).unwrap();
        assert!(html.contains(r#"<div id="app">"#), "{html}");
        // Every script and stylesheet the page names is embedded.
        for part in html.split("/assets/").skip(1) {
            let name = part.split('"').next().unwrap();
            assert!(Dist::get(&format!("assets/{name}")).is_some(), "{name}");
        }
        let again = get(&app, "/", &[("if-none-match", &etag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert!(body(again).await.is_empty());
    }

    #[tokio::test]
    async fn assets_have_their_types_and_are_immutable() {
        let app = router("/nonexistent");
        let js = get(&app, &first_asset(".js"), &[]).await;
        assert_eq!(js.status(), StatusCode::OK);
        assert!(
            header(&js, header::CONTENT_TYPE).starts_with("text/javascript")
                || header(&js, header::CONTENT_TYPE).starts_with("application/javascript"),
            "{:?}",
            js.headers()
        );
        assert_eq!(header(&js, header::CACHE_CONTROL), IMMUTABLE);
        assert!(!body(js).await.is_empty());
        let css = get(&app, &first_asset(".css"), &[]).await;
        assert_eq!(
            header(&css, header::CONTENT_TYPE),
            "text/css; charset=utf-8"
        );
    }

    #[tokio::test]
    async fn the_script_is_gzipped_for_clients_that_take_it() {
        let app = router("/nonexistent");
        let path = first_asset(".js");
        let plain = body(get(&app, &path, &[]).await).await;
        let r = get(&app, &path, &[("accept-encoding", "gzip")]).await;
        assert_eq!(header(&r, header::CONTENT_ENCODING), "gzip");
        assert_eq!(header(&r, header::CACHE_CONTROL), IMMUTABLE);
        let packed = body(r).await;
        assert!(
            packed.len() * 2 < plain.len(),
            "{} vs {}",
            packed.len(),
            plain.len()
        );
        let mut unpacked = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(packed.as_slice()),
            &mut unpacked,
        )
        .unwrap();
        assert_eq!(unpacked, plain);
    }

    #[tokio::test]
    async fn page_routes_fall_back_to_index_and_missing_files_do_not() {
        let app = router("/nonexistent");
        let r = get(&app, "/s/0b6a-session", &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, header::CONTENT_TYPE), "text/html; charset=utf-8");
        for missing in ["/assets/index-nothere.js", "/favicon.png", "/x/y.css"] {
            assert_eq!(
                get(&app, missing, &[]).await.status(),
                StatusCode::NOT_FOUND,
                "{missing}"
            );
        }
        let post = app
            .clone()
            .oneshot(
                Request::builder()
                    .method(Method::POST)
                    .uri("/")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        let head = app
            .clone()
            .oneshot(
                Request::builder()
                    .method(Method::HEAD)
                    .uri("/")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(head.status(), StatusCode::OK);
        assert!(body(head).await.is_empty());
    }

    /// Every route is gated or open with a reason, and both handlers are routed.
    #[test]
    fn every_route_is_gated_or_open_with_a_reason() {
        for (path, _, access) in ROUTES {
            if let RouteAccess::Open(why) = access {
                assert!(!why.trim().is_empty(), "{path} is open without a reason");
            }
        }
        for h in [Handler::Files, Handler::Page] {
            assert!(ROUTES.iter().any(|(_, x, _)| *x == h), "{h:?} has no route");
        }
        // Workspace data is only ever behind the gate.
        for (path, h, access) in ROUTES {
            if *h == Handler::Files {
                assert!(matches!(access, RouteAccess::Gated), "{path}");
            }
        }
    }

    #[tokio::test]
    async fn workspace_files_only_under_their_roots() {
        let ws = tempfile::tempdir().unwrap();
        let w = ws.path();
        std::fs::create_dir_all(w.join(".omicos/outputs/s1")).unwrap();
        std::fs::create_dir_all(w.join(".omicos/tool_outputs")).unwrap();
        let png = b"\x89PNG\r\n\x1a\nfake";
        std::fs::write(w.join(".omicos/outputs/s1/1_c_1.png"), png).unwrap();
        std::fs::write(w.join(".omicos/tool_outputs/17__c.txt"), "0123456789").unwrap();
        std::fs::write(w.join(".omicos/sessions.db"), "secret").unwrap();
        std::fs::write(w.join("notes.md"), "private").unwrap();
        std::os::unix::fs::symlink(
            w.join(".omicos/sessions.db"),
            w.join(".omicos/outputs/s1/link.png"),
        )
        .unwrap();
        let app = router(w);

        let r = get(&app, "/files/.omicos/outputs/s1/1_c_1.png", &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, header::CONTENT_TYPE), "image/png");
        assert_eq!(header(&r, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert_eq!(body(r).await, png);

        let r = get(
            &app,
            "/files/.omicos/tool_outputs/17__c.txt",
            &[("range", "bytes=0-3")],
        )
        .await;
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(header(&r, header::CONTENT_RANGE), "bytes 0-3/10");
        assert_eq!(body(r).await, b"0123");

        for refused in [
            "/files/.omicos/sessions.db",
            "/files/notes.md",
            "/files/.omicos/outputs/../sessions.db",
            "/files/.omicos/outputs/%2e%2e/sessions.db",
            "/files/.omicos/outputs/s1/link.png",
            "/files/.omicos/outputs/s1",
            "/files/.omicos/outputs/",
            "/files/.omicos/outputsX/a.png",
            "/files/%2fetc%2fpasswd",
            "/files/.omicos/outputs/s1/missing.png",
        ] {
            assert_eq!(
                get(&app, refused, &[]).await.status(),
                StatusCode::NOT_FOUND,
                "{refused}"
            );
        }
    }
}
