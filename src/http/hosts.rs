//! Which `Host` and `Origin` the service answers, one check in front of every door (`/v1`, the
//! AG-UI routes, `/mcp`, `/a2a`, `/console`, `/docs`), against DNS rebinding and cross-site writes.
//!
//! - **Host.** A request whose `Host` (or absolute-form authority) is not in `PES_ALLOWED_HOSTS`
//!   is 403 `host_refused`. Default: while the service is bound to a loopback address, the loopback
//!   names (`localhost`, `127.0.0.1`, `[::1]`), the bound address and the host of `PES_PUBLIC_URL`,
//!   any port; bound beyond loopback, any host (a public service is reached under names we cannot
//!   guess, and it has API keys). A page that rebinds its own name to 127.0.0.1 sends its own name
//!   as `Host`, so it is refused before anything runs.
//! - **Probes.** `GET`/`HEAD` of `/healthz`, `/readyz` and `/metrics` answer any `Host`: a
//!   container probe names the pod's address, and they change nothing and carry no tenant data
//!   (`PES_METRICS_KEY` guards `/metrics` when it must be private).
//! - **Origin.** A write (POST, PUT, PATCH, DELETE) that carries an `Origin` other than the
//!   service's own (the request's `Host` under `http` or `https`, the port the same) or one of
//!   `PES_ALLOWED_ORIGINS` is 403 `origin_refused`; `Origin: null` (a sandboxed page) is refused.
//! - **CORS.** A request from an allowed origin gets `Access-Control-Allow-Origin` naming it, and
//!   its preflight (`OPTIONS` with `Access-Control-Request-Method`) is answered 204 with the
//!   methods and headers the API takes, so a web front end elsewhere (an AG-UI client) can call
//!   the API with its key. A preflight from any other origin is 403 `origin_refused`.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::config::Config;
use crate::problem::Refusal;

/// The methods a preflight is told the API takes.
const METHODS: &str = "GET, POST, PUT, PATCH, DELETE, OPTIONS";

/// The request headers a preflight is told the API reads.
const ALLOWED_HEADERS: &str = "authorization, content-type, accept, last-event-id, \
     if-none-match, x-request-id, traceparent, tracestate, mcp-protocol-version, mcp-session-id";

/// The response headers a page from an allowed origin may read.
const EXPOSED_HEADERS: &str = "x-request-id, retry-after, etag, www-authenticate, mcp-session-id";

/// How long a browser may keep a preflight's answer (seconds).
const PREFLIGHT_MAX_AGE: &str = "600";

/// The paths every `Host` reaches (with GET or HEAD): the probes.
const PROBES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// One entry of the allowed hosts: a name or address, with a port or any.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    host: String,
    port: Option<u16>,
}

/// The hosts and origins the service answers (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct HostPolicy {
    /// `None`: any host.
    hosts: Option<Vec<HostRule>>,
    /// Other sites' origins, as `scheme://host:port` (the port always written).
    origins: Vec<String>,
}

/// A `Host` (or authority) split into its lower-case host, brackets kept for IPv6, and its port.
fn split_host(raw: &str) -> Option<(String, Option<u16>)> {
    let raw = raw.trim();
    if raw.is_empty() || raw.contains(['/', '@', ' ', '?', '#']) {
        return None;
    }
    let (host, port) = if let Some(rest) = raw.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        (format!("[{v6}]"), port)
    } else if raw.matches(':').count() > 1 {
        // A bare IPv6 address (only in settings; a `Host` header brackets it).
        let v6: std::net::Ipv6Addr = raw.parse().ok()?;
        (format!("[{v6}]"), None)
    } else {
        match raw.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p.parse().ok()?)),
            None => (raw.to_owned(), None),
        }
    };
    let host = host.to_ascii_lowercase();
    // `localhost.` is `localhost`: the root label changes nothing.
    let host = host.strip_suffix('.').map(str::to_owned).unwrap_or(host);
    (!host.is_empty()).then_some((host, port))
}

/// An origin (`scheme://host[:port]`) as `scheme://host:port`, the port always written.
fn normalize_origin(raw: &str) -> Option<String> {
    let raw = raw.trim().trim_end_matches('/');
    let (scheme, rest) = raw.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (host, port) = split_host(rest)?;
    Some(format!("{scheme}://{host}:{}", port.unwrap_or(default)))
}

/// An address as a `Host` names it (IPv6 in brackets).
fn ip_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// A `PES_ALLOWED_HOSTS` or `PES_ALLOWED_ORIGINS` entry the service cannot start with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadHostSetting {
    #[error("PES_ALLOWED_HOSTS: `{0}` is not a host (`name`, `name:port`, `[v6]:port` or `*`)")]
    Host(String),
    #[error(
        "PES_ALLOWED_ORIGINS: `{0}` is not an origin (`http://host[:port]` or `https://host[:port]`)"
    )]
    Origin(String),
}

impl HostPolicy {
    /// The policy `PES_ALLOWED_HOSTS` (or `PES_MCP_ALLOWED_HOSTS`) and `PES_ALLOWED_ORIGINS`
    /// configure, with the defaults of the module doc.
    ///
    /// # Errors
    /// An entry that is not a host (`name`, `name:port`, `[v6]:port`, `*`) or not an origin
    /// (`http(s)://host[:port]`), named.
    pub fn from_config(config: &Config) -> Result<Self, BadHostSetting> {
        let hosts = match config.allowed_hosts() {
            Some(entries) if entries.iter().any(|e| e == "*") => None,
            Some(entries) => Some(
                entries
                    .iter()
                    .map(|e| {
                        split_host(e)
                            .map(|(host, port)| HostRule { host, port })
                            .ok_or_else(|| BadHostSetting::Host(e.clone()))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            None if config.binds_beyond_loopback() => None,
            None => {
                let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
                    .map(str::to_owned)
                    .to_vec();
                names.push(ip_host(config.bind.ip()));
                if let Some(u) = config.public_url.as_deref()
                    && let Some((_, rest)) = u.trim().split_once("://")
                    && let Some((host, _)) = split_host(rest.split('/').next().unwrap_or(""))
                {
                    names.push(host);
                }
                names.sort();
                names.dedup();
                Some(
                    names
                        .into_iter()
                        .map(|host| HostRule { host, port: None })
                        .collect(),
                )
            }
        };
        let origins = config
            .allowed_origins()
            .iter()
            .map(|o| normalize_origin(o).ok_or_else(|| BadHostSetting::Origin(o.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { hosts, origins })
    }

    /// Whether a request naming `host` is answered.
    fn host_allowed(&self, host: &str) -> bool {
        let Some(rules) = &self.hosts else {
            return true;
        };
        let Some((name, port)) = split_host(host) else {
            return false;
        };
        rules
            .iter()
            .any(|r| r.host == name && r.port.is_none_or(|p| Some(p) == port))
    }

    /// Whether `origin` is the service's own, as reached under `host`: the same host and port,
    /// under `http` or `https` (a proxy in front may add TLS).
    fn own_origin(origin: &str, host: Option<&str>) -> bool {
        let (Some(origin), Some((name, port))) =
            (normalize_origin(origin), host.and_then(split_host))
        else {
            return false;
        };
        let candidates = match port {
            Some(p) => vec![format!("http://{name}:{p}"), format!("https://{name}:{p}")],
            None => vec![format!("http://{name}:80"), format!("https://{name}:443")],
        };
        candidates.contains(&origin)
    }

    /// Whether `origin` is one of `PES_ALLOWED_ORIGINS`.
    fn listed_origin(&self, origin: &str) -> bool {
        normalize_origin(origin).is_some_and(|o| self.origins.contains(&o))
    }
}

/// The `Host` a request names: its header, else the authority of an absolute-form target.
fn host_of(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
}

fn host_refused(host: Option<&str>) -> ApiError {
    let shown = host.map_or_else(
        || "no `Host`".to_owned(),
        |h| format!("`Host: {}`", crate::text::truncate(h, 100)),
    );
    Refusal::Forbidden {
        code: "host_refused",
        detail: format!(
            "this service does not answer {shown}: it answers only the hosts of \
             PES_ALLOWED_HOSTS (while bound to loopback: localhost, 127.0.0.1 and [::1]); a \
             page that reaches it under another name is refused"
        ),
    }
    .into()
}

fn origin_refused(origin: &str) -> ApiError {
    Refusal::Forbidden {
        code: "origin_refused",
        detail: format!(
            "requests from `Origin: {}` may not change anything here: only the service's own \
             pages and the origins of PES_ALLOWED_ORIGINS may",
            crate::text::truncate(origin, 200)
        ),
    }
    .into()
}

/// Refuse a request from a host or (a write) an origin the service does not answer, answer the
/// preflights of allowed origins, and give their responses CORS headers (see the module doc).
pub(super) async fn guard(
    State(policy): State<Arc<HostPolicy>>,
    req: Request,
    next: Next,
) -> Response {
    let probe =
        matches!(*req.method(), Method::GET | Method::HEAD) && PROBES.contains(&req.uri().path());
    let host = host_of(&req);
    // An absolute-form target's authority is checked too: it is what the request names.
    let authority = req.uri().authority().map(|a| a.as_str());
    let hosts_ok = host.is_some_and(|h| policy.host_allowed(h))
        && authority.is_none_or(|a| policy.host_allowed(a));
    if !probe && !hosts_ok {
        return host_refused(host).into_response();
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let Some(origin) = origin else {
        return next.run(req).await;
    };
    let listed = policy.listed_origin(&origin);
    let allowed = listed || HostPolicy::own_origin(&origin, host);
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        if !allowed {
            return origin_refused(&origin).into_response();
        }
        let mut res = StatusCode::NO_CONTENT.into_response();
        cors_headers(res.headers_mut(), &origin);
        let h = res.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOWED_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
        return res;
    }
    let writes = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if writes && !allowed {
        return origin_refused(&origin).into_response();
    }
    let mut res = next.run(req).await;
    if listed {
        cors_headers(res.headers_mut(), &origin);
    }
    res
}

/// The CORS headers of a response to an allowed `origin`.
fn cors_headers(h: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.append(header::VARY, HeaderValue::from_static("origin"));
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED_HEADERS),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: Option<&str>, origins: Option<&str>, bind: &str) -> HostPolicy {
        use clap::Parser;
        let mut c = crate::cli::Cli::parse_from(["pes-server"]).config;
        c.bind = bind.parse().unwrap();
        c.allowed_hosts = hosts.map(str::to_owned);
        c.mcp_allowed_hosts = None;
        c.allowed_origins = origins.map(str::to_owned);
        c.public_url = None;
        HostPolicy::from_config(&c).unwrap()
    }

    #[test]
    fn on_loopback_only_the_loopback_names_are_answered() {
        let p = policy(None, None, "127.0.0.1:8080");
        for ok in [
            "localhost",
            "localhost:3000",
            "LOCALHOST.:8080",
            "127.0.0.1:8080",
            "[::1]:9",
        ] {
            assert!(p.host_allowed(ok), "{ok}");
        }
        for bad in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "",
            "user@localhost",
        ] {
            assert!(!p.host_allowed(bad), "{bad}");
        }
        let open = policy(None, None, "0.0.0.0:8080");
        assert!(open.host_allowed("anything.example"));
    }

    #[test]
    fn listed_hosts_take_a_port_or_any() {
        let p = policy(Some("api.example.com, box:8080, [::1]"), None, "0.0.0.0:1");
        assert!(p.host_allowed("api.example.com:443"));
        assert!(p.host_allowed("box:8080"));
        assert!(!p.host_allowed("box:8081"));
        assert!(p.host_allowed("[::1]:5"));
        assert!(!p.host_allowed("localhost"));
        assert!(policy(Some("*"), None, "127.0.0.1:1").host_allowed("x.example"));
    }

    #[test]
    fn origins_are_the_services_own_or_listed() {
        let p = policy(
            None,
            Some("https://app.example.com, http://localhost:5173"),
            "127.0.0.1:1",
        );
        assert!(HostPolicy::own_origin(
            "http://localhost:8080",
            Some("localhost:8080")
        ));
        assert!(HostPolicy::own_origin(
            "https://api.example",
            Some("api.example")
        ));
        assert!(!HostPolicy::own_origin(
            "http://localhost:3000",
            Some("localhost:8080")
        ));
        assert!(!HostPolicy::own_origin("null", Some("localhost:8080")));
        assert!(p.listed_origin("https://app.example.com:443"));
        assert!(p.listed_origin("http://LOCALHOST:5173"));
        assert!(!p.listed_origin("http://app.example.com"));
        use clap::Parser;
        let mut c = crate::cli::Cli::parse_from(["pes-server"]).config;
        c.allowed_origins = Some("app.example.com".into());
        assert!(HostPolicy::from_config(&c).is_err());
        c.allowed_origins = None;
        c.allowed_hosts = Some("a b".into());
        assert!(HostPolicy::from_config(&c).is_err());
    }
}
