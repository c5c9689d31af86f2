//! The web console: a person's view of threads, runs, the live observation tree and the pending
//! suspensions, at `/console`. It is a static page and a few hand-written JavaScript modules
//! (`console/` at the repository root), embedded in the binary at compile time: no build step, no
//! separate server. Everything it shows comes from the public API and its SSE stream, called by
//! the browser with the person's API key; the page and its assets are public, so a browser can
//! load them and then ask for a key when the API answers 401.
//!
//! Every answer here carries a strict Content-Security-Policy: scripts, styles and connections
//! only from this origin, no inline script or style, no framing. The page never needs more, so an
//! injected string can never run as code.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
use utoipa::openapi::{ContentBuilder, ResponseBuilder};

use super::ApiError;

/// Where the console lives.
pub const CONSOLE_PATH: &str = "/console";

/// The policy of every console answer: nothing but this origin's own files, and no inline code.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// One embedded file: its name under `/console/assets/`, media type, bytes, and a validator
/// computed at compile time (browsers revalidate with it and get a 304 while it is unchanged).
struct Asset {
    name: &'static str,
    media_type: &'static str,
    bytes: &'static [u8],
    etag: &'static str,
}

/// FNV-1a over `bytes`: a compile-time fingerprint for the `ETag` (not a security measure; it only
/// has to change when the file does).
const fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Hex digits of a fingerprint, as a quoted entity tag, at compile time.
const fn etag_of(bytes: &[u8]) -> [u8; 18] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = fingerprint(bytes);
    let mut out = [b'"'; 18];
    let mut i = 0;
    while i < 16 {
        out[1 + i] = HEX[((hash >> (60 - 4 * i)) & 0xf) as usize];
        i += 1;
    }
    out
}

macro_rules! asset {
    ($name:literal, $media:expr) => {{
        const BYTES: &[u8] = include_bytes!(concat!("../../console/", $name));
        const TAG: [u8; 18] = etag_of(BYTES);
        Asset {
            name: $name,
            media_type: $media,
            bytes: BYTES,
            etag: match std::str::from_utf8(&TAG) {
                Ok(s) => s,
                Err(_) => panic!("an entity tag is ASCII"),
            },
        }
    }};
}

const JS: &str = "text/javascript; charset=utf-8";

/// The page, then the assets it loads (the modules import each other by relative path).
static PAGE: Asset = asset!("index.html", "text/html; charset=utf-8");
static ASSETS: &[Asset] = &[
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("icon.svg", "image/svg+xml"),
    asset!("main.js", JS),
    asset!("api.js", JS),
    asset!("events.js", JS),
    asset!("dom.js", JS),
    asset!("threads.js", JS),
    asset!("thread.js", JS),
    asset!("answer.js", JS),
    asset!("tree.js", JS),
    asset!("live.js", JS),
    asset!("todo.js", JS),
    asset!("suspensions.js", JS),
];

/// The console's routes; stateless, so they merge into any router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(CONSOLE_PATH, get(page))
        // The page's relative links resolve against `/console`; with a trailing slash they would
        // not, so that address sends the browser to the right one.
        .route(
            "/console/",
            get(|| async { Redirect::permanent(CONSOLE_PATH) }),
        )
        .route("/console/assets/{name}", get(asset))
}

async fn page(headers: HeaderMap) -> Response {
    serve(&PAGE, &headers)
}

async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => serve(a, &headers),
        None => ApiError::RouteNotFound(format!("GET /console/assets/{name}")).into_response(),
    }
}

/// The file with its headers, or 304 when the browser's copy is current. `no-cache` makes the
/// browser ask every time (cheap, with the entity tag), so a new binary's console is seen at once.
fn serve(a: &Asset, headers: &HeaderMap) -> Response {
    let fresh = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == a.etag || t.trim() == "*");
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, a.media_type)], a.bytes).into_response()
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, HeaderValue::from_static(a.etag));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Add `GET /console` (an HTML page, open to everyone) to the OpenAPI document; its assets are
/// the page's own business and stay out of it.
pub fn document_route(api: &mut utoipa::openapi::OpenApi) {
    let summary = "The web console: threads, the live observation tree, suspensions (HTML)";
    let op = OperationBuilder::new()
        .summary(Some(summary))
        .tag("console")
        .response(
            "200",
            ResponseBuilder::new()
                .description(summary)
                .content("text/html", ContentBuilder::new().build())
                .build(),
        )
        .build();
    api.paths
        .paths
        .insert(CONSOLE_PATH.into(), PathItem::new(HttpMethod::Get, op));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_tags_are_quoted_hex_and_differ_between_files() {
        let tags: Vec<&str> = ASSETS.iter().chain([&PAGE]).map(|a| a.etag).collect();
        for t in &tags {
            assert_eq!(t.len(), 18);
            assert!(t.starts_with('"') && t.ends_with('"'), "{t}");
            assert!(t[1..17].bytes().all(|b| b.is_ascii_hexdigit()), "{t}");
        }
        let mut unique = tags.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), tags.len());
    }

    #[test]
    fn the_page_loads_only_embedded_modules() {
        let html = std::str::from_utf8(PAGE.bytes).unwrap();
        assert!(html.contains(r#"src="console/assets/main.js""#));
        assert!(
            !html.contains("<script>"),
            "no inline script: the policy forbids it"
        );
        // Every module a module imports is one the binary serves.
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            let text = std::str::from_utf8(a.bytes).unwrap();
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .split(['"', '\''])
                    .nth(1)
                    .and_then(|p| p.strip_prefix("./"))
                    .unwrap_or_else(|| panic!("{}: relative import expected: {line}", a.name));
                assert!(
                    ASSETS.iter().any(|b| b.name == target),
                    "{} imports {target}, which is not embedded",
                    a.name
                );
            }
        }
    }
}
