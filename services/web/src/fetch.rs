//! web_fetch: a guarded request (SSRF checks on every hop, redirects followed
//! by hand, robots.txt when configured), a bounded body read, charset
//! decoding, and extraction by content type, then one page of the result.

use crate::{
    config::WebConfig,
    extract::{self, Bounds, Format},
    robots,
    ssrf::{Blocked, GuardedResolver, Lookup, Policy},
};
use omicos_servicekit::ConfigError;
use omicos_servicekit::config::duration;
use reqwest::{Response, header};
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::sync::Semaphore;
use url::Url;

/// How long a site's robots.txt is kept.
const ROBOTS_TTL: Duration = Duration::from_secs(600);
/// The most of a robots.txt that is read.
const ROBOTS_MAX_BYTES: u64 = 512 << 10;

/// Arguments of one fetch.
#[derive(Clone, Debug)]
pub struct FetchArgs {
    /// The URL.
    pub url: String,
    /// Characters returned at most.
    pub max_length: usize,
    /// First character returned.
    pub start_index: usize,
    /// Return the body as received (decoded), without extraction.
    pub raw: bool,
    /// Markdown or text for HTML.
    pub format: Format,
}

/// Fetches pages under the SSRF policy and the configured limits.
pub struct Fetcher {
    client: reqwest::Client,
    policy: Arc<Policy>,
    cfg: WebConfig,
    permits: Arc<Semaphore>,
    robots: Mutex<HashMap<String, (Instant, Arc<robots::Rules>)>>,
}

/// What kind of body a response has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Html,
    Text,
    Other,
}

impl Fetcher {
    /// A fetcher for `cfg`, resolving names through `lookup`.
    pub fn new(cfg: &WebConfig, lookup: Arc<dyn Lookup>) -> Result<Self, crate::WebError> {
        cfg.validate()?;
        let policy = Arc::new(
            Policy::new(cfg.ssrf_protection, &cfg.allow)
                .map_err(|e| ConfigError::key("web.allow", e.to_string()))?,
        );
        let client = reqwest::Client::builder()
            // A system proxy would connect to addresses we never checked.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(GuardedResolver::new(policy.clone(), lookup)))
            .connect_timeout(cfg.connect_timeout)
            .read_timeout(cfg.read_timeout)
            .timeout(cfg.total_timeout)
            .user_agent(cfg.user_agent.clone())
            .build()
            .map_err(crate::WebError::Client)?;
        Ok(Self {
            client,
            policy,
            cfg: cfg.clone(),
            permits: Arc::new(Semaphore::new(cfg.max_concurrent_fetches)),
            robots: Mutex::new(HashMap::new()),
        })
    }

    /// Fetches `args.url` and returns one page of its content.
    pub async fn fetch(&self, args: FetchArgs) -> Result<Value, String> {
        let url = Url::parse(args.url.trim())
            .map_err(|e| format!("`{}` is not a valid URL: {e}", args.url))?;
        self.policy.check_url(&url).map_err(|b| b.to_string())?;
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| "the fetcher is shutting down".to_string())?;
        let started = Instant::now();
        let total = self.cfg.total_timeout;
        let downloaded = tokio::time::timeout(total, self.download(url.clone()))
            .await
            .map_err(|_| {
                format!(
                    "timed out after {} (web.total_timeout)",
                    duration::format(total)
                )
            })
            .and_then(|r| r);
        let (final_url, head, body) = match downloaded {
            Ok(d) => d,
            Err(e) => {
                tracing::info!(host = url.host_str().unwrap_or(""), error = %e, "web_fetch refused or failed");
                return Err(e);
            }
        };
        tracing::info!(
            host = final_url.host_str().unwrap_or(""),
            status = head.status,
            bytes = body.len(),
            download_ms = started.elapsed().as_millis() as u64,
            "web_fetch downloaded"
        );
        self.shape(&args, final_url, head, body).await
    }

    /// Requests `url`, following redirects by hand, and reads the body.
    async fn download(&self, mut url: Url) -> Result<(Url, ResponseHead, Vec<u8>), String> {
        let mut redirects = 0;
        loop {
            self.policy.check_url(&url).map_err(|b| b.to_string())?;
            if self.cfg.robots_txt {
                self.check_robots(&url).await?;
            }
            let resp = self
                .client
                .get(url.clone())
                .header(header::ACCEPT, "text/html,application/xhtml+xml,text/markdown,text/plain;q=0.9,application/json;q=0.9,*/*;q=0.5")
                .send()
                .await
                .map_err(|e| self.describe(&e, &url))?;
            let status = resp.status();
            if status.is_redirection()
                && let Some(loc) = resp.headers().get(header::LOCATION)
            {
                let loc = loc
                    .to_str()
                    .map_err(|_| format!("{url} redirected to a Location that is not text"))?;
                let next = url.join(loc).map_err(|e| {
                    format!("{url} redirected to `{loc}`, which is not a valid URL: {e}")
                })?;
                redirects += 1;
                if redirects > self.cfg.max_redirects {
                    return Err(format!(
                        "too many redirects: more than {} (web.max_redirects), the last one to {next}",
                        self.cfg.max_redirects
                    ));
                }
                url = next;
                continue;
            }
            if !status.is_success() {
                return Err(format!("HTTP {} from {url}", status));
            }
            let head = ResponseHead::of(&resp);
            let body = self.read_body(resp, &url).await?;
            return Ok((url, head, body));
        }
    }

    /// Reads the body incrementally, refusing it as soon as it passes the cap.
    async fn read_body(&self, mut resp: Response, url: &Url) -> Result<Vec<u8>, String> {
        let cap = self.cfg.max_body_bytes;
        if let Some(len) = resp.content_length()
            && len > cap
        {
            return Err(format!(
                "the response body is {len} bytes, over the cap of {cap} bytes (web.max_body_bytes)"
            ));
        }
        let mut body =
            Vec::with_capacity(resp.content_length().unwrap_or(16 << 10).min(cap) as usize);
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.describe(&e, url))? {
            if body.len() as u64 + chunk.len() as u64 > cap {
                return Err(format!(
                    "the response body is larger than the cap of {cap} bytes (web.max_body_bytes)"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// A reqwest error as the model should read it; a refusal names its rule.
    fn describe(&self, e: &reqwest::Error, url: &Url) -> String {
        let mut src: Option<&dyn std::error::Error> = Some(e);
        while let Some(s) = src {
            if let Some(b) = s.downcast_ref::<Blocked>() {
                return b.to_string();
            }
            src = s.source();
        }
        if e.is_timeout() {
            return format!(
                "timed out fetching {url} (web.connect_timeout {} / web.read_timeout {} / web.total_timeout {})",
                duration::format(self.cfg.connect_timeout),
                duration::format(self.cfg.read_timeout),
                duration::format(self.cfg.total_timeout)
            );
        }
        let mut msg = format!("fetching {url} failed");
        let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        msg
    }

    /// Refuses `url` when its site's robots.txt disallows it for our agent.
    async fn check_robots(&self, url: &Url) -> Result<(), String> {
        let origin = url.origin().ascii_serialization();
        let cached = self.robots.lock().ok().and_then(|m| {
            m.get(&origin)
                .filter(|(at, _)| at.elapsed() < ROBOTS_TTL)
                .map(|(_, r)| r.clone())
        });
        let rules = match cached {
            Some(r) => r,
            None => {
                let r = Arc::new(self.load_robots(url).await?);
                if let Ok(mut m) = self.robots.lock() {
                    m.insert(origin.clone(), (Instant::now(), r.clone()));
                }
                r
            }
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        if rules.allowed(&path) {
            Ok(())
        } else {
            Err(format!(
                "{origin}/robots.txt disallows {path} for {} (web.robots_txt)",
                self.cfg.user_agent
            ))
        }
    }

    async fn load_robots(&self, url: &Url) -> Result<robots::Rules, String> {
        let mut robots_url = url.clone();
        robots_url.set_path("/robots.txt");
        robots_url.set_query(None);
        robots_url.set_fragment(None);
        let resp = match self.client.get(robots_url.clone()).send().await {
            Ok(r) => r,
            // A refusal of the site itself is reported by the page request.
            Err(e) if e.is_connect() || e.is_timeout() => return Ok(robots::Rules::allow_all()),
            Err(e) => return Err(self.describe(&e, &robots_url)),
        };
        // RFC 9309: 4xx means no rules; 5xx means assume everything is disallowed.
        let status = resp.status();
        if status.is_server_error() {
            return Ok(robots::Rules::parse(
                "User-agent: *\nDisallow: /\n",
                &self.cfg.user_agent,
            ));
        }
        if !status.is_success() || resp.content_length().is_some_and(|l| l > ROBOTS_MAX_BYTES) {
            return Ok(robots::Rules::allow_all());
        }
        let text = resp.text().await.unwrap_or_default();
        Ok(robots::Rules::parse(&text, &self.cfg.user_agent))
    }

    /// Decodes, extracts and pages the body.
    async fn shape(
        &self,
        args: &FetchArgs,
        final_url: Url,
        head: ResponseHead,
        body: Vec<u8>,
    ) -> Result<Value, String> {
        let kind = head.kind(&body);
        let mut out = json!({
            "url": args.url,
            "final_url": final_url.as_str(),
            "status": head.status,
            "content_type": head.content_type,
        });
        if kind == Kind::Other {
            out["bytes"] = json!(body.len());
            out["note"] = json!("this content type is not text: only its metadata is returned");
            return Ok(out);
        }
        let (text, charset) = decode(&body, head.charset.as_deref(), kind == Kind::Html);
        out["charset"] = json!(charset);
        drop(body);
        let (title, content, note) = if kind == Kind::Html && !args.raw {
            let bounds = Bounds {
                max_elements: self.cfg.max_elements,
                max_depth: self.cfg.max_depth,
            };
            let e = extract::extract_on_worker(text, final_url.to_string(), args.format, bounds)
                .await
                .map_err(|e| e.to_string())?;
            (Some(e.title), e.content, e.note)
        } else {
            (None, text, None)
        };
        if let Some(t) = title.filter(|t| !t.is_empty()) {
            out["title"] = json!(t);
        }
        if let Some(n) = note {
            out["note"] = json!(n);
        }
        page(&mut out, &content, args.start_index, args.max_length);
        Ok(out)
    }
}

/// Puts characters `start..start+max` of `content` into `out`, with where to go on.
fn page(out: &mut Value, content: &str, start: usize, max: usize) {
    let total = content.chars().count();
    let begin = content
        .char_indices()
        .nth(start)
        .map(|(i, _)| i)
        .unwrap_or(content.len());
    let slice: String = content[begin..].chars().take(max).collect();
    let taken = slice.chars().count();
    let next = start + taken;
    out["total_length"] = json!(total);
    out["start_index"] = json!(start);
    out["content"] = json!(slice);
    if next < total {
        out["next_start_index"] = json!(next);
        out["truncated"] = json!(true);
    } else {
        out["truncated"] = json!(false);
    }
    if start > total {
        out["note"] = json!(format!(
            "start_index {start} is past the end ({total} characters)"
        ));
    }
}

/// What is kept of a response once its body is being read.
struct ResponseHead {
    status: u16,
    content_type: String,
    charset: Option<String>,
}

impl ResponseHead {
    fn of(resp: &Response) -> Self {
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim()
            .to_owned();
        let charset = ct.split(';').skip(1).find_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("charset")
                .then(|| v.trim().trim_matches('"').to_owned())
        });
        Self {
            status: resp.status().as_u16(),
            content_type: ct,
            charset,
        }
    }

    fn kind(&self, body: &[u8]) -> Kind {
        let mime = self
            .content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match mime.as_str() {
            "text/html" | "application/xhtml+xml" => Kind::Html,
            "" => sniff(body),
            m if m.starts_with("text/") => Kind::Text,
            "application/json"
            | "application/xml"
            | "application/javascript"
            | "application/x-yaml"
            | "application/yaml" => Kind::Text,
            m if m.ends_with("+json") || m.ends_with("+xml") => Kind::Text,
            _ => Kind::Other,
        }
    }
}

/// Guesses a kind for a body that came without a Content-Type.
fn sniff(body: &[u8]) -> Kind {
    let head = &body[..body.len().min(1024)];
    let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
    let t = lower.trim_start();
    if t.starts_with("<!doctype html") || t.starts_with("<html") || lower.contains("<body") {
        Kind::Html
    } else if !head.contains(&0) && std::str::from_utf8(head).is_ok() {
        Kind::Text
    } else {
        Kind::Other
    }
}

/// Decodes `body`: a BOM first, then the header's charset, then (HTML) a
/// `<meta>` charset in the first 4 KiB, else UTF-8. Returns the text and the
/// encoding used.
pub fn decode(body: &[u8], header_charset: Option<&str>, html: bool) -> (String, &'static str) {
    let label = header_charset
        .and_then(|l| encoding_rs::Encoding::for_label(l.as_bytes()))
        .or_else(|| if html { meta_charset(body) } else { None })
        .unwrap_or(encoding_rs::UTF_8);
    // `decode` lets a BOM override the label, as browsers do.
    let (text, used, _) = label.decode(body);
    (text.into_owned(), used.name())
}

/// The charset a page declares in `<meta charset>` or `<meta http-equiv content>`.
fn meta_charset(body: &[u8]) -> Option<&'static encoding_rs::Encoding> {
    let head = &body[..body.len().min(4096)];
    let lower: Vec<u8> = head.to_ascii_lowercase();
    let mut from = 0;
    while let Some(pos) = find(&lower[from..], b"<meta") {
        let start = from + pos;
        let end = lower[start..]
            .iter()
            .position(|&b| b == b'>')
            .map(|e| start + e)
            .unwrap_or(lower.len());
        let tag = &lower[start..end];
        if let Some(cs) = find(tag, b"charset=") {
            let rest = &tag[cs + 8..];
            let rest = rest
                .strip_prefix(b"\"")
                .or_else(|| rest.strip_prefix(b"'"))
                .unwrap_or(rest);
            let label_end = rest
                .iter()
                .position(|b| matches!(b, b'"' | b'\'' | b';' | b' ' | b'/' | b'>'))
                .unwrap_or(rest.len());
            if let Some(enc) = encoding_rs::Encoding::for_label(&rest[..label_end]) {
                // A page that is really UTF-16 could not have been read this far as ASCII.
                return Some(
                    if enc == encoding_rs::UTF_16LE || enc == encoding_rs::UTF_16BE {
                        encoding_rs::UTF_8
                    } else {
                        enc
                    },
                );
            }
        }
        from = end.max(start + 1);
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charset_from_header_then_meta() {
        let (gbk, _, _) = encoding_rs::GBK
            .encode("<html><head><meta charset=\"gbk\"></head><body>中文网页</body></html>");
        let (t, used) = decode(&gbk, None, true);
        assert!(t.contains("中文网页") && used == "GBK", "{used}");
        let (sj, _, _) = encoding_rs::SHIFT_JIS.encode("<meta http-equiv=\"Content-Type\" content=\"text/html; charset=Shift_JIS\"><p>日本語のページ</p>");
        let (t, used) = decode(&sj, None, true);
        assert!(
            t.contains("日本語のページ") && used == "Shift_JIS",
            "{used}"
        );
        let (t, used) = decode(&sj, Some("shift_jis"), false);
        assert!(t.contains("日本語") && used == "Shift_JIS");
        let (t, used) = decode("plain é".as_bytes(), None, false);
        assert_eq!((t.as_str(), used), ("plain é", "UTF-8"));
    }

    #[test]
    fn paging_counts_characters() {
        let mut v = json!({});
        page(&mut v, "héllo wörld", 3, 4);
        assert_eq!(v["content"], "lo w");
        assert_eq!(v["next_start_index"], 7);
        assert_eq!(v["total_length"], 11);
        let mut v = json!({});
        page(&mut v, "héllo", 2, 100);
        assert_eq!(v["content"], "llo");
        assert_eq!(v["truncated"], false);
        let mut v = json!({});
        page(&mut v, "abc", 10, 5);
        assert_eq!(v["content"], "");
        assert!(v["note"].as_str().unwrap().contains("past the end"));
    }
}
