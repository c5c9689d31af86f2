//! How the A2A client reaches remote agents, what it sends them, and how much it reads of them.
//!
//! A remote agent's card names its own endpoint, so what a card says is not trusted. A request
//! goes either to an origin the operator configured for the agent (its card URL's origin, and the
//! agent's `origins`), or through the HTTP tool's SSRF guard (`tools::http::guard`) with the A2A
//! allow list (`PES_A2A_ALLOW`): an IP literal is judged before the request, a name when it is
//! resolved (the guarded client's resolver hands the connector only allowed addresses), so the
//! address checked is the address connected. The guarded client uses no proxy, which could route
//! around the guard. The agent's configured headers go only to its configured origins: an
//! endpoint or a redirect target on another origin, allowed or not, never sees them.
//!
//! The HTTP clients follow no redirect themselves. A card fetch (a GET that an operator's URL may
//! legitimately redirect: http to https, a card that moved) follows at most [`MAX_REDIRECTS`]
//! hops by hand, each judged like a first request (guard, headers). A JSON-RPC call follows none:
//! a redirected POST would carry the message (on a 307/308, its body) somewhere neither the
//! operator nor the card named, so the card must name the endpoint itself.
//!
//! Every body is read chunk by chunk and abandoned past `PES_A2A_MAX_BYTES` (a declared
//! `Content-Length` past it is refused before a byte is read), so a hostile remote never makes
//! the process hold more. Remote text that ends up in a prompt is cut by [`bound_text`].

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Response, StatusCode, Url, redirect};
use serde_json::Value;

use super::config::AgentConfig;
use crate::tools::http::guard::{AllowList, AllowListError, Guard, GuardError, GuardedResolver};

/// The setting that allows remote endpoints beyond public addresses; refusals name it.
pub const ALLOW_VAR: &str = "PES_A2A_ALLOW";

/// The setting that bounds what is read of a remote agent; errors name it.
pub const MAX_BYTES_VAR: &str = "PES_A2A_MAX_BYTES";

/// Redirects a card fetch follows at most, each one judged by the guard.
pub const MAX_REDIRECTS: usize = 5;

/// How long connecting to a remote agent may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Room kept for the marker [`bound_text`] appends, so text and marker fit the bound together.
const MARKER_ROOM: usize = 64;

/// What the A2A client may reach and read.
#[derive(Debug, Clone)]
pub struct NetSettings {
    /// Hosts and CIDRs reachable beyond public addresses (`PES_A2A_ALLOW`).
    pub allow: AllowList,
    /// The most bytes read of a card, a reply or one stream event (`PES_A2A_MAX_BYTES`).
    pub max_bytes: usize,
}

impl Default for NetSettings {
    /// Public addresses only, 1 MiB.
    fn default() -> Self {
        Self {
            allow: AllowList::empty(ALLOW_VAR),
            max_bytes: 1024 * 1024,
        }
    }
}

impl NetSettings {
    /// From the settings `PES_A2A_ALLOW` (`allow`) and `PES_A2A_MAX_BYTES`.
    ///
    /// # Errors
    /// An allow-list entry that is not a host name, an address or a CIDR, named.
    pub fn new(allow: Option<&str>, max_bytes: u64) -> Result<Self, AllowListError> {
        Ok(Self {
            allow: AllowList::parse_setting(ALLOW_VAR, allow.unwrap_or(""))?,
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
        })
    }
}

/// Why a request to a remote agent got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// Refused on our side: by the guard, a redirect not followed, a body past the bound.
    /// Trying again gives the same answer.
    #[error("{0}")]
    Refused(String),
    /// The remote could not be reached, or broke off.
    #[error("{0}")]
    Transport(String),
}

/// The A2A HTTP client cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("building the A2A HTTP client: {0}")]
pub struct ClientBuildError(#[source] reqwest::Error);

/// `RemoteAgents::start` (`agents.rs`) still reports its errors as text.
impl From<ClientBuildError> for String {
    fn from(e: ClientBuildError) -> Self {
        e.to_string()
    }
}

/// Why a configured agent cannot be reached as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReachError {
    #[error("`{url}` is not a URL: {source}")]
    NotAUrl {
        url: String,
        #[source]
        source: crate::model::webhooks::UrlParseError,
    },
    #[error("the header `{0}` is not a valid HTTP header")]
    Header(String),
}

/// A redirect whose `Location` is not a URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{from}` redirects to a Location that is not a URL")]
struct BadLocation {
    from: Url,
}

/// The HTTP clients every remote agent is reached with: one for the origins the operator
/// configured, one guarded for everything else.
pub struct Net {
    trusted: reqwest::Client,
    guarded: reqwest::Client,
    guard: Arc<Guard>,
    max_bytes: usize,
}

impl Net {
    /// Build both clients (no redirects followed, no `Referer`; the guarded one resolves through
    /// the guard and uses no proxy).
    ///
    /// # Errors
    /// An HTTP client that cannot be built.
    pub fn new(settings: NetSettings) -> Result<Self, ClientBuildError> {
        let guard = Arc::new(Guard::new(settings.allow));
        let build = |b: reqwest::ClientBuilder| {
            b.connect_timeout(CONNECT_TIMEOUT)
                .redirect(redirect::Policy::none())
                .referer(false)
                .build()
                .map_err(ClientBuildError)
        };
        let trusted = build(crate::net::client_builder())?;
        let guarded = build(
            crate::net::client_builder()
                .no_proxy()
                .dns_resolver(GuardedResolver::new(guard.clone())),
        )?;
        Ok(Self {
            trusted,
            guarded,
            guard,
            max_bytes: settings.max_bytes.max(1),
        })
    }

    /// What the operator allows beyond public addresses (for the start-up log).
    pub fn allow_list(&self) -> &AllowList {
        self.guard.allow_list()
    }
}

/// How one configured agent is reached: the shared clients, its configured origins, and the
/// headers that go only to them. Cheap to clone.
#[derive(Clone)]
pub struct Reach {
    net: Arc<Net>,
    /// ASCII serializations (`https://host:port`) of the origins the operator configured.
    origins: Arc<[String]>,
    headers: HeaderMap,
}

/// The origin of `url` as `scheme://host[:port]`.
fn origin_of(url: &Url) -> String {
    url.origin().ascii_serialization()
}

impl Reach {
    /// How `config`'s agent is reached over `net`.
    ///
    /// # Errors
    /// A card URL or origin that is not a URL, or a header that is not valid.
    pub fn new(net: Arc<Net>, config: &AgentConfig) -> Result<Self, ReachError> {
        let mut origins = Vec::new();
        for u in std::iter::once(&config.card_url).chain(&config.origins) {
            let url = Url::parse(u).map_err(|source| ReachError::NotAUrl {
                url: u.clone(),
                source,
            })?;
            origins.push(origin_of(&url));
        }
        let mut headers = HeaderMap::new();
        for (k, v) in &config.headers {
            let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) else {
                return Err(ReachError::Header(k.clone()));
            };
            headers.insert(k, v);
        }
        Ok(Self {
            net,
            origins: origins.into(),
            headers,
        })
    }

    /// The most bytes read of a card, a reply or a stream event.
    pub fn max_bytes(&self) -> usize {
        self.net.max_bytes
    }

    /// Whether the operator configured `url`'s origin for this agent: reached without the guard,
    /// and sent the agent's headers.
    pub fn is_configured_origin(&self, url: &Url) -> bool {
        let origin = origin_of(url);
        self.origins.contains(&origin)
    }

    /// One request, no redirect followed: to a configured origin with the agent's headers, else
    /// through the guard without them. `extra` headers (the protocol's) go everywhere.
    async fn send_once(
        &self,
        method: Method,
        url: &Url,
        extra: &HeaderMap,
        body: Option<&Value>,
        timeout: Option<Duration>,
    ) -> Result<Response, NetError> {
        let configured = self.is_configured_origin(url);
        let client = if configured {
            &self.net.trusted
        } else {
            self.net
                .guard
                .check_url(url)
                .map_err(|e| NetError::Refused(format!("`{url}`: {e}")))?;
            &self.net.guarded
        };
        let mut req = client.request(method, url.clone());
        if configured {
            req = req.headers(self.headers.clone());
        }
        req = req.headers(extra.clone());
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        req.send().await.map_err(|e| describe(&e, url))
    }

    /// GET the JSON document at `url` (a card), following redirects by hand: each hop is judged
    /// like a first request, and the agent's headers go only to its configured origins. The
    /// body is read up to the bound.
    ///
    /// # Errors
    /// [`NetError::Refused`] for a refused hop, too many redirects or a body past the bound;
    /// [`NetError::Transport`] when it cannot be fetched, is not a success or is not JSON.
    pub async fn get_json(&self, url: &str, timeout: Duration) -> Result<Value, NetError> {
        let mut url =
            Url::parse(url).map_err(|e| NetError::Refused(format!("`{url}` is not a URL: {e}")))?;
        let mut hops = 0;
        let resp = loop {
            let resp = self
                .send_once(Method::GET, &url, &HeaderMap::new(), None, Some(timeout))
                .await?;
            let Some(next) = redirect_target(&resp, &url) else {
                break resp;
            };
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(NetError::Refused(format!(
                    "`{url}`: refused: more than {MAX_REDIRECTS} redirects"
                )));
            }
            url = next.map_err(|e| NetError::Refused(e.to_string()))?;
        };
        let status = resp.status();
        if !status.is_success() {
            return Err(NetError::Transport(format!("`{url}`: HTTP {status}")));
        }
        let body = self
            .read_body(resp, &format!("the document at `{url}`"))
            .await?;
        serde_json::from_slice(&body)
            .map_err(|e| NetError::Transport(format!("`{url}` is not JSON: {e}")))
    }

    /// POST `body` as JSON to `url`, with `extra` headers; `timeout` bounds the whole exchange
    /// (none for a stream). A redirect is an error, never followed.
    ///
    /// # Errors
    /// [`NetError::Refused`] for a refused endpoint or a redirect; [`NetError::Transport`] when
    /// it cannot be reached.
    pub async fn post(
        &self,
        url: &str,
        extra: &HeaderMap,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<Response, NetError> {
        let url =
            Url::parse(url).map_err(|e| NetError::Refused(format!("`{url}` is not a URL: {e}")))?;
        let resp = self
            .send_once(Method::POST, &url, extra, Some(body), timeout)
            .await?;
        if let Some(target) = redirect_target(&resp, &url) {
            let to = target.map_or_else(|e| e.to_string(), |t| format!("`{t}`"));
            return Err(NetError::Refused(format!(
                "`{url}` answered with a redirect (HTTP {}) to {to}, which A2A calls do not \
                 follow: the agent's card must name its endpoint",
                resp.status()
            )));
        }
        Ok(resp)
    }

    /// The whole body of `resp`, read chunk by chunk and abandoned past the bound. `what` names
    /// it in the error.
    ///
    /// # Errors
    /// [`NetError::Refused`] past the bound, [`NetError::Transport`] when the body breaks off.
    pub async fn read_body(&self, mut resp: Response, what: &str) -> Result<Vec<u8>, NetError> {
        let max = self.net.max_bytes;
        if resp.content_length().is_some_and(|n| n > max as u64) {
            return Err(too_large(what, max));
        }
        let url = resp.url().clone();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| describe(&e, &url))? {
            if chunk.len() > max - body.len() {
                return Err(too_large(what, max));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// The error for something larger than the bound.
pub(crate) fn too_large(what: &str, max: usize) -> NetError {
    NetError::Refused(format!(
        "{what} is larger than {max} bytes ({MAX_BYTES_VAR}): it was not read further"
    ))
}

/// Where a redirect answer leads (`None` when `resp` is not one): the resolved URL, or why it
/// cannot be followed.
fn redirect_target(resp: &Response, from: &Url) -> Option<Result<Url, BadLocation>> {
    let status = resp.status();
    if !status.is_redirection() || status == StatusCode::NOT_MODIFIED {
        return None;
    }
    let location = resp.headers().get(reqwest::header::LOCATION)?;
    Some(
        location
            .to_str()
            .ok()
            .and_then(|l| from.join(l).ok())
            .ok_or_else(|| BadLocation { from: from.clone() }),
    )
}

/// What went wrong with a request: the guard's own message when the guard stopped it (its
/// resolver, somewhere in the error's causes), else what failed, with its causes.
fn describe(err: &reqwest::Error, url: &Url) -> NetError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = err.source();
    while let Some(e) = source {
        if let Some(g) = e.downcast_ref::<GuardError>() {
            return NetError::Refused(format!("`{url}`: {g}"));
        }
        source = e.source();
    }
    if err.is_timeout() {
        return NetError::Transport(format!("`{url}`: timed out"));
    }
    let mut msg = format!("`{url}`: {err}");
    let mut source = err.source();
    while let Some(e) = source {
        msg.push_str(": ");
        msg.push_str(&e.to_string());
        source = e.source();
    }
    NetError::Transport(msg)
}

/// Remote text bound for a prompt (a delegation's result or question, a card's description):
/// at most `max` bytes in all, cut at a character boundary with a marker that says how many
/// bytes were cut. `dropped` counts bytes already left out before `text` was assembled (they are
/// counted in the marker, and force one).
pub fn bound_text(text: &str, max: usize, dropped: usize) -> String {
    if dropped == 0 && text.len() <= max {
        return text.to_owned();
    }
    let mut keep = text.len().min(max.saturating_sub(MARKER_ROOM));
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    let cut = text.len() - keep + dropped;
    format!("{}…[truncated: {cut} bytes cut]", &text[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_text_is_cut_once_at_a_character_boundary_with_the_count() {
        assert_eq!(bound_text("short", 1024, 0), "short");
        let long = "é".repeat(1000); // 2000 bytes
        let cut = bound_text(&long, 1024, 0);
        assert!(cut.len() <= 1024, "{}", cut.len());
        let kept = cut.split('…').next().unwrap();
        assert!(kept.chars().all(|c| c == 'é'));
        assert!(
            cut.ends_with(&format!("…[truncated: {} bytes cut]", 2000 - kept.len())),
            "{cut}"
        );
        assert_eq!(
            bound_text("all here", 1024, 10),
            "all here…[truncated: 10 bytes cut]",
            "parts left out earlier are counted"
        );
    }

    #[test]
    fn configured_origins_are_the_card_url_and_the_listed_ones() {
        let net = Arc::new(Net::new(NetSettings::default()).unwrap());
        let config = AgentConfig {
            name: "a".into(),
            card_url: "https://cards.example/.well-known/agent-card.json".into(),
            headers: [("Authorization".to_owned(), "Bearer k".to_owned())].into(),
            origins: vec!["https://api.example:8443".into()],
        };
        let reach = Reach::new(net, &config).unwrap();
        let yes = |u: &str| reach.is_configured_origin(&Url::parse(u).unwrap());
        assert!(yes("https://cards.example/a2a"));
        assert!(yes("https://cards.example:443/other"), "the default port");
        assert!(yes("https://api.example:8443/a2a"));
        assert!(!yes("http://cards.example/a2a"), "another scheme");
        assert!(!yes("https://cards.example:8080/a2a"), "another port");
        assert!(!yes("https://evil.example/a2a"));
        assert_eq!(reach.net.allow_list().to_string(), "nothing");
    }
}
