//! The SSRF guard of the `http_request` tool: which addresses a request may reach.
//!
//! An address is refused when it is not a public unicast address (loopback, private, carrier-grade
//! NAT, link-local, unique-local, site-local, multicast, unspecified, broadcast, documentation,
//! benchmarking, reserved) or when it is a cloud metadata endpoint. IPv6 forms that carry an IPv4
//! address (IPv4-mapped, IPv4-compatible, NAT64, 6to4) are judged by the address they carry, so
//! `[::ffff:127.0.0.1]` is as loopback as `127.0.0.1`. The operator may allow exact host names and
//! CIDRs (`PES_HTTP_TOOL_ALLOW`); a metadata address is only allowed by a CIDR that is that single
//! address, never by a wider range that happens to hold it.
//!
//! The guard is applied where the connection is made: [`GuardedResolver`] resolves a name and
//! hands the HTTP client only the addresses the guard allows, so the address checked is the
//! address connected (a name that resolves differently a moment later — DNS rebinding — gains
//! nothing). IP-literal URLs never reach a resolver; [`Guard::check_url`] judges them, before the
//! request and on every redirect.
//!
//! The A2A client (`a2a::client::net`) uses the same guard for remote agents' endpoints, with its
//! own allow list (`PES_A2A_ALLOW`): an [`AllowList`] remembers the setting it was read from, and
//! every refusal names that setting.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The setting that lists what the operator allows the HTTP tool; named in its refusals.
pub const ALLOW_VAR: &str = "PES_HTTP_TOOL_ALLOW";

/// Why an address is not a public one the tool may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    Unspecified,
    Loopback,
    Private,
    SharedCgnat,
    LinkLocal,
    UniqueLocal,
    SiteLocal,
    Multicast,
    Broadcast,
    Documentation,
    Benchmarking,
    Reserved,
    Tunnel,
    CloudMetadata,
}

impl Blocked {
    fn describe(self) -> &'static str {
        match self {
            Blocked::Unspecified => "an unspecified (\"this network\") address",
            Blocked::Loopback => "a loopback address",
            Blocked::Private => "a private address",
            Blocked::SharedCgnat => "a carrier-grade NAT (shared) address",
            Blocked::LinkLocal => "a link-local address",
            Blocked::UniqueLocal => "a unique-local (private IPv6) address",
            Blocked::SiteLocal => "a site-local address",
            Blocked::Multicast => "a multicast address",
            Blocked::Broadcast => "the broadcast address",
            Blocked::Documentation => "a documentation address",
            Blocked::Benchmarking => "a benchmarking address",
            Blocked::Reserved => "a reserved address",
            Blocked::Tunnel => "a Teredo tunnel address",
            Blocked::CloudMetadata => "a cloud metadata address",
        }
    }
}

/// How an IPv6 address carries an IPv4 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    Mapped,
    Compatible,
    Translated,
    Nat64,
    SixToFour,
}

impl Embedding {
    fn describe(self) -> &'static str {
        match self {
            Embedding::Mapped => "an IPv4-mapped",
            Embedding::Compatible => "an IPv4-compatible",
            Embedding::Translated => "an IPv4-translated",
            Embedding::Nat64 => "a NAT64",
            Embedding::SixToFour => "a 6to4",
        }
    }
}

/// What is wrong with an address: its kind, and the IPv4 address it carries when that is what
/// was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub kind: Blocked,
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.embedded {
            Some((how, v4)) => write!(
                f,
                "{} form of {v4}, {}",
                how.describe(),
                self.kind.describe()
            ),
            None => f.write_str(self.kind.describe()),
        }
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

/// IPv4 ranges that are refused, most specific first (the first match names the reason).
const V4_BLOCKED: &[(Ipv4Net, Blocked)] = &[
    // AWS, GCP, Azure, OpenStack, Oracle; ECS task credentials; EKS pod identity; Alibaba.
    (v4(169, 254, 169, 254, 32), Blocked::CloudMetadata),
    (v4(169, 254, 170, 2, 32), Blocked::CloudMetadata),
    (v4(169, 254, 170, 23, 32), Blocked::CloudMetadata),
    (v4(100, 100, 100, 200, 32), Blocked::CloudMetadata),
    (v4(0, 0, 0, 0, 8), Blocked::Unspecified),
    (v4(10, 0, 0, 0, 8), Blocked::Private),
    (v4(100, 64, 0, 0, 10), Blocked::SharedCgnat),
    (v4(127, 0, 0, 0, 8), Blocked::Loopback),
    (v4(169, 254, 0, 0, 16), Blocked::LinkLocal),
    (v4(172, 16, 0, 0, 12), Blocked::Private),
    (v4(192, 0, 0, 0, 24), Blocked::Reserved),
    (v4(192, 0, 2, 0, 24), Blocked::Documentation),
    (v4(192, 88, 99, 0, 24), Blocked::Reserved),
    (v4(192, 168, 0, 0, 16), Blocked::Private),
    (v4(198, 18, 0, 0, 15), Blocked::Benchmarking),
    (v4(198, 51, 100, 0, 24), Blocked::Documentation),
    (v4(203, 0, 113, 0, 24), Blocked::Documentation),
    (v4(224, 0, 0, 0, 4), Blocked::Multicast),
    (v4(255, 255, 255, 255, 32), Blocked::Broadcast),
    (v4(240, 0, 0, 0, 4), Blocked::Reserved),
];

const fn v6(s: [u16; 8], len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(
        Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        len,
    )
}

/// IPv6 ranges refused outright, most specific first. Forms that carry an IPv4 address are
/// handled before this table (see [`embedded_v4`]).
const V6_BLOCKED: &[(Ipv6Net, Blocked)] = &[
    (
        v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128),
        Blocked::CloudMetadata,
    ),
    (
        v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23], 128),
        Blocked::CloudMetadata,
    ),
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 128), Blocked::Unspecified),
    (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), Blocked::Loopback),
    (v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), Blocked::Private),
    (v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), Blocked::Reserved),
    (v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), Blocked::Tunnel),
    (v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48), Blocked::Benchmarking),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        Blocked::Documentation,
    ),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        Blocked::Documentation,
    ),
    (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), Blocked::UniqueLocal),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), Blocked::LinkLocal),
    (v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), Blocked::SiteLocal),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), Blocked::Multicast),
];

/// The IPv4 address an IPv6 address stands for, and how, for the forms that a host or a gateway
/// turns into an IPv4 connection. `::` and `::1` are not IPv4-compatible forms.
fn embedded_v4(ip: Ipv6Addr) -> Option<(Embedding, Ipv4Addr)> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let how = match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Embedding::Mapped,
        [0, 0, 0, 0, 0xffff, 0, _, _] => Embedding::Translated,
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => return None,
        [0, 0, 0, 0, 0, 0, _, _] => Embedding::Compatible,
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Embedding::Nat64,
        [0x2002, hi, lo, ..] => {
            let v = Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
            return Some((Embedding::SixToFour, v));
        }
        _ => return None,
    };
    Some((how, low))
}

/// Why `ip` may not be reached by default, or `None` for a public unicast address.
pub fn classify(ip: IpAddr) -> Option<Refusal> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(|kind| Refusal {
            kind,
            embedded: None,
        }),
        IpAddr::V6(v6) => {
            if let Some((how, v4)) = embedded_v4(v6) {
                return classify_v4(v4).map(|kind| Refusal {
                    kind,
                    embedded: Some((how, v4)),
                });
            }
            V6_BLOCKED
                .iter()
                .find(|(net, _)| net.contains(&v6))
                .map(|(_, kind)| Refusal {
                    kind: *kind,
                    embedded: None,
                })
        }
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Blocked> {
    V4_BLOCKED
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|(_, kind)| *kind)
}

/// What the operator allows beyond public addresses: exact host names and CIDRs, and the setting
/// they come from (refusals name it, so the operator knows what to change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    hosts: BTreeSet<String>,
    nets: Vec<IpNet>,
    setting: &'static str,
}

impl Default for AllowList {
    /// Nothing allowed, for the HTTP tool.
    fn default() -> Self {
        Self::empty(ALLOW_VAR)
    }
}

/// An allow-list entry that cannot be read, named with the setting it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowListError {
    #[error("{setting}: `{entry}` is not a CIDR (expected e.g. `10.0.0.0/8` or `fd00::/8`)")]
    Cidr {
        setting: &'static str,
        entry: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    #[error(
        "{setting}: `{entry}` is neither a host name nor an IP address or CIDR (no scheme, port \
         or path: e.g. `api.internal`, `10.0.0.0/8`)"
    )]
    Entry {
        setting: &'static str,
        entry: String,
    },
}

impl AllowList {
    /// Nothing allowed; refusals name `setting`.
    pub fn empty(setting: &'static str) -> Self {
        Self {
            hosts: BTreeSet::new(),
            nets: Vec::new(),
            setting,
        }
    }

    /// Parse `PES_HTTP_TOOL_ALLOW`: comma-separated host names (`localhost`, `api.internal`),
    /// CIDRs (`10.0.0.0/8`, `::1/128`) and single addresses (`127.0.0.1`, `[::1]`).
    ///
    /// # Errors
    /// The first entry that is none of these, named, with what was expected.
    pub fn parse(raw: &str) -> Result<Self, AllowListError> {
        Self::parse_setting(ALLOW_VAR, raw)
    }

    /// Parse an allow list of the same form read from `setting` (e.g. `PES_A2A_ALLOW`), which
    /// its errors and the guard's refusals name.
    ///
    /// # Errors
    /// The first entry that is not a host name, an address or a CIDR, named, with what was
    /// expected.
    pub fn parse_setting(setting: &'static str, raw: &str) -> Result<Self, AllowListError> {
        let mut list = AllowList::empty(setting);
        for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry.contains('/') {
                let net: IpNet = entry.parse().map_err(|source| AllowListError::Cidr {
                    setting,
                    entry: entry.to_owned(),
                    source,
                })?;
                list.nets.push(net.trunc());
            } else if let Ok(ip) = entry
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
            {
                list.nets.push(IpNet::from(ip));
            } else if is_host_name(entry) {
                list.hosts.insert(normalize_host(entry));
            } else {
                return Err(AllowListError::Entry {
                    setting,
                    entry: entry.to_owned(),
                });
            }
        }
        Ok(list)
    }

    /// True when nothing beyond public addresses is allowed.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.nets.is_empty()
    }

    /// Whether `host` (a name from a URL) is allowed by name: then every address it resolves to
    /// may be reached.
    pub fn allows_host(&self, host: &str) -> bool {
        self.hosts.contains(&normalize_host(host))
    }

    /// Whether an allowed CIDR holds `ip` (an IPv4-mapped address also by its IPv4 form). A
    /// metadata address needs an entry that is exactly that address.
    fn allows_ip(&self, ip: IpAddr, kind: Blocked) -> bool {
        let canonical = ip.to_canonical();
        self.nets.iter().any(|net| {
            (net.contains(&ip) || net.contains(&canonical))
                && (kind != Blocked::CloudMetadata || net.prefix_len() == net.max_prefix_len())
        })
    }
}

impl fmt::Display for AllowList {
    /// `localhost, 10.0.0.0/8`, or `nothing` when empty (for the start-up log).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("nothing");
        }
        let items: Vec<String> = self
            .hosts
            .iter()
            .cloned()
            .chain(self.nets.iter().map(ToString::to_string))
            .collect();
        f.write_str(&items.join(", "))
    }
}

fn is_host_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn normalize_host(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// Why the guard stopped a request. Its message is what the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    /// Why, and the setting that could allow it.
    #[error("refused: {0}; the operator can allow it in {1}")]
    Refused(String, &'static str),
    #[error("refused: only http and https URLs are allowed, not `{0}:`")]
    Scheme(String),
    #[error("refused: `{0}` has no host")]
    NoHost(String),
    #[error("could not resolve `{host}`: {reason}")]
    Unresolvable { host: String, reason: String },
    #[error("refused: more than {0} redirects")]
    TooManyRedirects(usize),
}

/// The addresses a tool request may reach: public ones, and what the operator allows.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allow: AllowList,
}

impl Guard {
    pub fn new(allow: AllowList) -> Self {
        Self { allow }
    }

    /// What the operator allows.
    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// Why `ip` may not be reached, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<Refusal> {
        classify(ip).filter(|r| !self.allow.allows_ip(ip, r.kind))
    }

    /// The scheme must be http or https, and a host that is an IP literal must be allowed (a
    /// name is judged when it is resolved, by [`GuardedResolver`]).
    ///
    /// # Errors
    /// A [`GuardError`] that says why.
    pub fn check_url(&self, url: &Url) -> Result<(), GuardError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(GuardError::Scheme(url.scheme().to_owned()));
        }
        let host = url
            .host_str()
            .ok_or_else(|| GuardError::NoHost(url.to_string()))?;
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            && let Some(r) = self.refusal(ip)
        {
            // The caller wrote this address: saying what kind it is discloses nothing.
            return Err(GuardError::Refused(
                format!("{ip} is not an allowed address ({r})"),
                self.allow.setting,
            ));
        }
        Ok(())
    }

    /// The resolved addresses of `host` that may be reached (all of them when the host is
    /// allowed by name), in the resolver's order and without repeats.
    ///
    /// # Errors
    /// [`GuardError::Refused`] naming every address and why, when none may be reached.
    pub fn filter_resolved(
        &self,
        host: &str,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Result<Vec<SocketAddr>, GuardError> {
        let mut seen = BTreeSet::new();
        let addrs: Vec<SocketAddr> = addrs.into_iter().filter(|a| seen.insert(*a)).collect();
        if addrs.is_empty() {
            return Err(GuardError::Unresolvable {
                host: host.to_owned(),
                reason: "no addresses".into(),
            });
        }
        if self.allow.allows_host(host) {
            return Ok(addrs);
        }
        let (ok, refused): (Vec<_>, Vec<_>) = addrs
            .into_iter()
            .map(|a| (a, self.refusal(a.ip())))
            .partition(|(_, r)| r.is_none());
        if !ok.is_empty() {
            return Ok(ok.into_iter().map(|(a, _)| a).collect());
        }
        // The refusal reaches the tenant (a tool result, a webhook's `lastError`): it names the
        // rule, never what the name resolved to, which would map the operator's internal DNS.
        // The operator reads the addresses in the log.
        let each: Vec<String> = refused
            .iter()
            .filter_map(|(a, r)| r.map(|r| format!("{} ({r})", a.ip())))
            .collect();
        tracing::info!(host, resolved = %each.join(", "), "refused: a name that resolves only to addresses not allowed");
        Err(GuardError::Refused(
            format!("`{host}` is not an allowed address"),
            self.allow.setting,
        ))
    }
}

/// The HTTP client's resolver: resolves with the system resolver, then keeps only the addresses
/// the [`Guard`] allows (an error when none), so the connection goes to an address that was
/// checked.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    guard: Arc<Guard>,
}

impl GuardedResolver {
    pub fn new(guard: Arc<Guard>) -> Self {
        Self { guard }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.guard.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| GuardError::Unresolvable {
                    host: host.clone(),
                    reason: e.to_string(),
                })?;
            let allowed = guard.filter_resolved(&host, resolved)?;
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(s: &str) -> Option<Blocked> {
        classify(s.parse().unwrap()).map(|r| r.kind)
    }

    #[test]
    fn ipv4_ranges_are_classified() {
        for (ip, want) in [
            ("127.0.0.1", Some(Blocked::Loopback)),
            ("127.255.255.254", Some(Blocked::Loopback)),
            ("10.1.2.3", Some(Blocked::Private)),
            ("172.16.0.1", Some(Blocked::Private)),
            ("172.31.255.255", Some(Blocked::Private)),
            ("192.168.1.1", Some(Blocked::Private)),
            ("100.64.0.1", Some(Blocked::SharedCgnat)),
            ("169.254.1.1", Some(Blocked::LinkLocal)),
            ("169.254.169.254", Some(Blocked::CloudMetadata)),
            ("100.100.100.200", Some(Blocked::CloudMetadata)),
            ("0.0.0.0", Some(Blocked::Unspecified)),
            ("224.0.0.1", Some(Blocked::Multicast)),
            ("255.255.255.255", Some(Blocked::Broadcast)),
            ("240.0.0.1", Some(Blocked::Reserved)),
            ("192.0.2.7", Some(Blocked::Documentation)),
            ("198.18.0.1", Some(Blocked::Benchmarking)),
            ("8.8.8.8", None),
            ("172.32.0.1", None),
            ("100.128.0.1", None),
            ("1.1.1.1", None),
        ] {
            assert_eq!(kind(ip), want, "{ip}");
        }
    }

    #[test]
    fn ipv6_ranges_are_classified() {
        for (ip, want) in [
            ("::1", Some(Blocked::Loopback)),
            ("::", Some(Blocked::Unspecified)),
            ("fe80::1", Some(Blocked::LinkLocal)),
            ("fd12:3456::1", Some(Blocked::UniqueLocal)),
            ("fc00::1", Some(Blocked::UniqueLocal)),
            ("fd00:ec2::254", Some(Blocked::CloudMetadata)),
            ("ff02::1", Some(Blocked::Multicast)),
            ("2001:db8::1", Some(Blocked::Documentation)),
            ("fec0::1", Some(Blocked::SiteLocal)),
            ("2001::1", Some(Blocked::Tunnel)),
            ("64:ff9b:1::1", Some(Blocked::Private)),
            ("2606:4700:4700::1111", None),
            ("2001:4860:4860::8888", None),
        ] {
            assert_eq!(kind(ip), want, "{ip}");
        }
    }

    #[test]
    fn ipv6_forms_of_ipv4_are_judged_by_the_ipv4_address() {
        let r = classify("::ffff:127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(r.kind, Blocked::Loopback);
        assert_eq!(
            r.to_string(),
            "an IPv4-mapped form of 127.0.0.1, a loopback address"
        );
        assert_eq!(kind("::ffff:10.0.0.1"), Some(Blocked::Private));
        assert_eq!(kind("::ffff:169.254.169.254"), Some(Blocked::CloudMetadata));
        assert_eq!(kind("::127.0.0.1"), Some(Blocked::Loopback));
        assert_eq!(kind("::ffff:0:7f00:1"), Some(Blocked::Loopback));
        assert_eq!(kind("64:ff9b::a9fe:a9fe"), Some(Blocked::CloudMetadata));
        assert_eq!(kind("64:ff9b::192.168.0.1"), Some(Blocked::Private));
        assert_eq!(kind("2002:7f00:1::"), Some(Blocked::Loopback));
        assert_eq!(kind("2002:0a00:0001::1"), Some(Blocked::Private));
        assert_eq!(kind("::ffff:8.8.8.8"), None);
        assert_eq!(kind("64:ff9b::8.8.8.8"), None);
    }

    #[test]
    fn the_allow_list_parses_hosts_addresses_and_cidrs() {
        let a =
            AllowList::parse(" localhost, API.internal., 10.0.0.0/8,127.0.0.1, [::1], fd00::/8,")
                .unwrap();
        assert!(a.allows_host("localhost"));
        assert!(a.allows_host("api.internal"));
        assert!(a.allows_host("Api.Internal."));
        assert!(!a.allows_host("other.internal"));
        assert_eq!(
            a.to_string(),
            "api.internal, localhost, 10.0.0.0/8, 127.0.0.1/32, ::1/128, fd00::/8"
        );
        assert!(AllowList::parse("").unwrap().is_empty());
        assert_eq!(
            AllowList::parse("10.0.0.1/8").unwrap().to_string(),
            "10.0.0.0/8"
        );
        for bad in [
            "localhost:8080",
            "10.0.0.0/33",
            "http://x",
            "a b",
            "1.2.3.4/x",
        ] {
            let err = AllowList::parse(&format!("ok.host, {bad}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
            assert!(err.starts_with("PES_HTTP_TOOL_ALLOW: "), "{err}");
        }
    }

    #[test]
    fn another_setting_s_list_is_named_in_its_errors_and_refusals() {
        let err = AllowList::parse_setting("PES_A2A_ALLOW", "a b")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("PES_A2A_ALLOW: `a b`"), "{err}");
        let g = Guard::new(AllowList::parse_setting("PES_A2A_ALLOW", "10.0.0.0/8").unwrap());
        let err = g
            .check_url(&Url::parse("http://127.0.0.1:9/a2a").unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("the operator can allow it in PES_A2A_ALLOW"),
            "{err}"
        );
        assert!(
            g.check_url(&Url::parse("http://10.1.2.3/").unwrap())
                .is_ok()
        );
    }

    #[test]
    fn allowed_cidrs_open_their_addresses_only() {
        let g = Guard::new(AllowList::parse("127.0.0.1/32, 10.0.0.0/8, ::1/128").unwrap());
        let ok = |s: &str| g.refusal(s.parse().unwrap()).is_none();
        assert!(ok("127.0.0.1"));
        assert!(
            ok("::ffff:127.0.0.1"),
            "the mapped form of an allowed address"
        );
        assert!(ok("10.200.0.1"));
        assert!(ok("::1"));
        assert!(!ok("127.0.0.2"));
        assert!(!ok("192.168.0.1"));
        assert!(ok("8.8.8.8"));
    }

    #[test]
    fn metadata_addresses_need_an_entry_of_their_own() {
        let wide = Guard::new(AllowList::parse("169.254.0.0/16").unwrap());
        assert!(wide.refusal("169.254.1.1".parse().unwrap()).is_none());
        assert!(wide.refusal("169.254.169.254".parse().unwrap()).is_some());
        let exact = Guard::new(AllowList::parse("169.254.169.254").unwrap());
        assert!(exact.refusal("169.254.169.254".parse().unwrap()).is_none());
    }

    #[test]
    fn urls_are_checked_for_scheme_and_ip_literals() {
        let g = Guard::default();
        let check = |s: &str| g.check_url(&Url::parse(s).unwrap());
        assert_eq!(
            check("ftp://example.com/x"),
            Err(GuardError::Scheme("ftp".into()))
        );
        assert!(check("https://example.com/").is_ok());
        assert!(check("http://8.8.8.8/").is_ok());
        let err = check("http://127.0.0.1:8080/").unwrap_err().to_string();
        assert_eq!(
            err,
            "refused: 127.0.0.1 is not an allowed address (a loopback address); the operator can \
             allow it in PES_HTTP_TOOL_ALLOW"
        );
        let err = check("http://[::ffff:10.0.0.1]/").unwrap_err().to_string();
        assert!(
            err.contains(
                "::ffff:10.0.0.1 is not an allowed address (an IPv4-mapped form of 10.0.0.1, a \
                 private address)"
            ),
            "{err}"
        );
        // The URL parser reads every spelling of an IPv4 address, so none slips by as a name.
        for sneaky in ["http://2130706433/", "http://0x7f.1/", "http://0177.0.0.1/"] {
            assert!(
                matches!(check(sneaky), Err(GuardError::Refused(..))),
                "{sneaky}"
            );
        }
    }

    #[test]
    fn resolved_addresses_are_filtered_or_refused_with_reasons() {
        let sa = |s: &str| SocketAddr::new(s.parse().unwrap(), 0);
        let g = Guard::default();
        let err = g
            .filter_resolved("localhost", [sa("127.0.0.1")])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "refused: `localhost` is not an allowed address; the operator can allow it in \
             PES_HTTP_TOOL_ALLOW",
            "the rule, never the address the name resolved to"
        );
        let err = g
            .filter_resolved("internal.example", [sa("::1"), sa("10.1.2.3"), sa("::1")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`internal.example` is not an allowed address")
                && !err.contains("10.1.2.3")
                && !err.contains("::1")
                && !err.contains("private"),
            "{err}"
        );
        assert_eq!(
            g.filter_resolved("mixed.example", [sa("10.0.0.1"), sa("8.8.8.8")]),
            Ok(vec![sa("8.8.8.8")]),
            "only the public address is handed to the connector"
        );
        let by_name = Guard::new(AllowList::parse("localhost").unwrap());
        assert_eq!(
            by_name.filter_resolved("LOCALHOST", [sa("127.0.0.1"), sa("::1")]),
            Ok(vec![sa("127.0.0.1"), sa("::1")])
        );
    }
}
