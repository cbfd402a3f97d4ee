//! What a request is limited by: [`Key`] extracts the limiting key from a request's head.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderMap, HeaderName, StatusCode};
use ipnet::IpNet;

type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// Extracts a rule's key from a request: a header, the peer IP, the client IP behind trusted
/// proxies (`X-Forwarded-For` or `Forwarded`), one key for everyone, or a closure. IP keys
/// group IPv6 addresses by prefix (a /64 by default: one subscriber's network) so that one
/// client cannot take a fresh limit per address.
#[derive(Clone)]
pub struct Key {
    kind: Kind,
    missing: Option<Missing>,
}

#[derive(Clone)]
enum Kind {
    Header(HeaderName),
    Ip(IpKey),
    Global,
    Fn(KeyFn),
}

#[derive(Clone, Debug)]
struct IpKey {
    /// `None`: the peer address; else the forwarded chain and the proxies trusted to extend it.
    forwarded: Option<(Forwarded, Arc<[IpNet]>)>,
    v4_prefix: u8,
    v6_prefix: u8,
}

/// Which header carries the forwarded chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

/// What a rule does with a request that has no key (no such header, no peer address, a closure
/// that answers `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// Answer this status (no rate-limit headers), and do not call the service.
    Refuse(StatusCode),
    /// The rule does not apply to the request.
    Skip,
    /// Use this key: every such request shares one limit.
    Shared(String),
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Header(h) => write!(f, "Key::header({h})"),
            Kind::Ip(ip) => write!(f, "Key::ip({ip:?})"),
            Kind::Global => write!(f, "Key::global()"),
            Kind::Fn(_) => write!(f, "Key::from_fn(..)"),
        }
    }
}

impl Key {
    fn new(kind: Kind) -> Key {
        Key { kind, missing: None }
    }

    /// The value of a request header, e.g. `x-api-key` (any case). A request without it is
    /// refused with 400 unless [`Key::when_missing`] says otherwise.
    ///
    /// Panics if `name` is not a valid header name (configuration, checked at start-up).
    pub fn header<N>(name: N) -> Key
    where
        HeaderName: TryFrom<N>,
        <HeaderName as TryFrom<N>>::Error: std::fmt::Debug,
    {
        let name = HeaderName::try_from(name).unwrap_or_else(|e| panic!("Key::header: invalid header name: {e:?}"));
        Key::new(Kind::Header(name))
    }

    /// The peer's IP address: axum's `ConnectInfo<SocketAddr>` (serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`) or a `SocketAddr` request
    /// extension (hyper, tonic: insert it). Without one the request is refused with 500 (a
    /// configuration error), unless [`Key::when_missing`] says otherwise.
    ///
    /// Behind a reverse proxy the peer is the proxy: use [`Key::client_ip`].
    pub fn peer_ip() -> Key {
        Key::new(Kind::Ip(IpKey { forwarded: None, v4_prefix: 32, v6_prefix: 64 }))
    }

    /// The client's IP address behind trusted proxies: starting from the peer, each hop of the
    /// forwarded chain (right to left) is believed only while the address that reported it is
    /// one of `trusted` (networks such as `10.0.0.0/8` or single addresses); the first address
    /// that is not trusted is the client. A peer that is not trusted is the client whatever
    /// the headers say, so clients cannot pick their own key. A hop that does not parse
    /// (`unknown`, an obfuscated name) stops the walk at the proxy that reported it.
    ///
    /// Panics on an entry of `trusted` that is not an address or a network (configuration,
    /// checked at start-up).
    pub fn client_ip<I, S>(header: Forwarded, trusted: I) -> Key
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted: Arc<[IpNet]> = trusted
            .into_iter()
            .map(|s| {
                let s = s.as_ref().trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .unwrap_or_else(|_| panic!("Key::client_ip: not an address or network: {s:?}"))
            })
            .collect();
        Key::new(Kind::Ip(IpKey { forwarded: Some((header, trusted)), v4_prefix: 32, v6_prefix: 64 }))
    }

    /// One key for every request (a global limit).
    pub fn global() -> Key {
        Key::new(Kind::Global)
    }

    /// A closure over the request head (headers, URI, extensions such as an authenticated
    /// user). `None` skips the rule for that request unless [`Key::when_missing`] says
    /// otherwise.
    pub fn from_fn<F>(f: F) -> Key
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Key::new(Kind::Fn(Arc::new(f)))
    }

    /// IP keys: group IPv6 addresses by this prefix (default 64; 128 keys each address).
    /// No effect on other keys.
    pub fn ipv6_prefix(mut self, bits: u8) -> Key {
        if let Kind::Ip(ip) = &mut self.kind {
            ip.v6_prefix = bits.min(128);
        }
        self
    }

    /// IP keys: group IPv4 addresses by this prefix (default 32: each address).
    pub fn ipv4_prefix(mut self, bits: u8) -> Key {
        if let Kind::Ip(ip) = &mut self.kind {
            ip.v4_prefix = bits.min(32);
        }
        self
    }

    /// What to do with a request that has no key.
    pub fn when_missing(mut self, m: Missing) -> Key {
        self.missing = Some(m);
        self
    }

    /// The policy for a request without a key.
    pub(crate) fn missing(&self) -> Missing {
        self.missing.clone().unwrap_or(match self.kind {
            Kind::Header(_) => Missing::Refuse(StatusCode::BAD_REQUEST),
            Kind::Ip(_) => Missing::Refuse(StatusCode::INTERNAL_SERVER_ERROR),
            Kind::Global | Kind::Fn(_) => Missing::Skip,
        })
    }

    /// The key of a request, if it has one.
    pub fn extract(&self, parts: &Parts) -> Option<String> {
        match &self.kind {
            Kind::Header(name) => {
                let v = parts.headers.get(name)?.as_bytes();
                (!v.is_empty()).then(|| String::from_utf8_lossy(v).into_owned())
            }
            Kind::Ip(ip) => ip.client(parts).map(|a| ip.key(a)),
            Kind::Global => Some(String::new()),
            Kind::Fn(f) => f(parts),
        }
    }
}

impl IpKey {
    fn client(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = canonical(peer_ip(parts)?);
        let Some((header, trusted)) = &self.forwarded else { return Some(peer) };
        let is_trusted = |a: &IpAddr| trusted.iter().any(|n| n.contains(a));
        let mut client = peer;
        if !is_trusted(&client) {
            return Some(client);
        }
        for hop in chain(&parts.headers, *header).iter().rev() {
            match parse_node(hop) {
                Some(a) => {
                    client = canonical(a);
                    if !is_trusted(&client) {
                        break;
                    }
                }
                None => break,
            }
        }
        Some(client)
    }

    /// `1.2.3.4`, or the network when grouped: `2001:db8:1:2::/64`.
    fn key(&self, a: IpAddr) -> String {
        let bits = if a.is_ipv4() { self.v4_prefix } else { self.v6_prefix };
        match IpNet::new(a, bits) {
            Ok(n) if n.prefix_len() < n.max_prefix_len() => n.trunc().to_string(),
            _ => a.to_string(),
        }
    }
}

/// IPv4-mapped IPv6 addresses (a dual-stack socket's view of IPv4 clients) as IPv4.
fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = parts.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0.ip());
    }
    parts.extensions.get::<SocketAddr>().map(|a| a.ip())
}

/// The forwarded chain, left (the client, as the first proxy saw it) to right (the last
/// proxy's view), over every field line of the header.
fn chain(headers: &HeaderMap, header: Forwarded) -> Vec<&str> {
    let mut hops = Vec::new();
    match header {
        Forwarded::XForwardedFor => {
            for v in headers.get_all("x-forwarded-for") {
                let Ok(v) = v.to_str() else { return Vec::new() };
                hops.extend(v.split(',').map(str::trim).filter(|s| !s.is_empty()));
            }
        }
        Forwarded::Forwarded => {
            for v in headers.get_all(http::header::FORWARDED) {
                let Ok(v) = v.to_str() else { return Vec::new() };
                for element in v.split(',') {
                    // An element without `for=` says nothing about the client: the walk stops
                    // there, as at any hop that does not parse.
                    let node = element.split(';').find_map(|pair| {
                        let (k, v) = pair.split_once('=')?;
                        k.trim().eq_ignore_ascii_case("for").then(|| v.trim().trim_matches('"'))
                    });
                    hops.push(node.unwrap_or(""));
                }
            }
        }
    }
    hops
}

/// A node of a forwarded chain: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`; `None` for `unknown` and obfuscated names.
fn parse_node(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .or_else(|| s.strip_prefix('[')?.strip_suffix(']')?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)], peer: Option<&str>) -> Parts {
        let mut b = http::Request::builder();
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let (mut p, ()) = b.body(()).unwrap().into_parts();
        if let Some(peer) = peer {
            p.extensions.insert(peer.parse::<SocketAddr>().unwrap());
        }
        p
    }

    #[test]
    fn header_key_any_case() {
        let k = Key::header("X-Api-Key");
        assert_eq!(k.extract(&parts(&[("x-api-key", "alice")], None)).as_deref(), Some("alice"));
        assert_eq!(k.extract(&parts(&[], None)), None);
        assert_eq!(k.extract(&parts(&[("x-api-key", "")], None)), None);
        assert_eq!(k.missing(), Missing::Refuse(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn peer_ip_groups_ipv6_by_prefix() {
        let k = Key::peer_ip();
        assert_eq!(k.extract(&parts(&[], Some("192.0.2.7:5000"))).as_deref(), Some("192.0.2.7"));
        assert_eq!(k.extract(&parts(&[], Some("[2001:db8:1:2:3:4:5:6]:80"))).as_deref(), Some("2001:db8:1:2::/64"));
        assert_eq!(k.extract(&parts(&[], Some("[::ffff:192.0.2.7]:80"))).as_deref(), Some("192.0.2.7"));
        let k = Key::peer_ip().ipv6_prefix(128).ipv4_prefix(24);
        assert_eq!(k.extract(&parts(&[], Some("[2001:db8::1]:80"))).as_deref(), Some("2001:db8::1"));
        assert_eq!(k.extract(&parts(&[], Some("192.0.2.7:1"))).as_deref(), Some("192.0.2.0/24"));
        assert_eq!(k.extract(&parts(&[], None)), None);
        assert_eq!(k.missing(), Missing::Refuse(StatusCode::INTERNAL_SERVER_ERROR));
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let k = Key::client_ip(Forwarded::XForwardedFor, ["10.0.0.0/8", "192.168.1.1"]);
        // Through two trusted proxies: the rightmost untrusted address is the client.
        let p = parts(&[("x-forwarded-for", "203.0.113.9, 10.1.1.1")], Some("192.168.1.1:443"));
        assert_eq!(k.extract(&p).as_deref(), Some("203.0.113.9"));
        // A client prepending a spoofed address is still limited by its own.
        let p = parts(&[("x-forwarded-for", "1.1.1.1, 203.0.113.9")], Some("10.0.0.2:443"));
        assert_eq!(k.extract(&p).as_deref(), Some("203.0.113.9"));
        // Several field lines are one list.
        let mut p = parts(&[("x-forwarded-for", "1.1.1.1")], Some("10.0.0.2:443"));
        p.headers.append("x-forwarded-for", "203.0.113.9:1234".parse().unwrap());
        assert_eq!(k.extract(&p).as_deref(), Some("203.0.113.9"));
        // An untrusted peer is the client whatever it sends.
        let p = parts(&[("x-forwarded-for", "1.1.1.1")], Some("198.51.100.4:443"));
        assert_eq!(k.extract(&p).as_deref(), Some("198.51.100.4"));
        // Only trusted hops: the leftmost; no header: the proxy itself.
        let p = parts(&[("x-forwarded-for", "10.9.9.9")], Some("10.0.0.2:443"));
        assert_eq!(k.extract(&p).as_deref(), Some("10.9.9.9"));
        assert_eq!(k.extract(&parts(&[], Some("10.0.0.2:1"))).as_deref(), Some("10.0.0.2"));
        // A hop that does not parse stops at the proxy that reported it.
        let p = parts(&[("x-forwarded-for", "1.1.1.1, garbage, 10.3.3.3")], Some("10.0.0.2:443"));
        assert_eq!(k.extract(&p).as_deref(), Some("10.3.3.3"));
    }

    #[test]
    fn rfc7239_forwarded() {
        let k = Key::client_ip(Forwarded::Forwarded, ["10.0.0.0/8"]);
        let p = parts(
            &[("forwarded", r#"for=1.1.1.1, for="[2001:db8:cafe::17]:4711";proto=https, For=10.0.0.9;by=10.0.0.1"#)],
            Some("10.0.0.1:443"),
        );
        assert_eq!(k.extract(&p).as_deref(), Some("2001:db8:cafe::/64"));
        let p = parts(&[("forwarded", "for=unknown")], Some("10.0.0.1:443"));
        assert_eq!(k.extract(&p).as_deref(), Some("10.0.0.1"));
        let p = parts(&[("forwarded", "for=_hidden, for=198.51.100.1")], Some("10.0.0.1:443"));
        assert_eq!(k.extract(&p).as_deref(), Some("198.51.100.1"));
    }

    #[test]
    #[should_panic(expected = "not an address or network")]
    fn bad_trusted_network_is_a_start_up_error() {
        let _ = Key::client_ip(Forwarded::XForwardedFor, ["10.0.0.0/33"]);
    }

    #[test]
    fn closures_and_global() {
        let k = Key::from_fn(|p| p.uri.path().strip_prefix("/t/").map(str::to_owned));
        assert_eq!(k.extract(&http::Request::get("/t/acme").body(()).unwrap().into_parts().0).as_deref(), Some("acme"));
        assert_eq!(k.missing(), Missing::Skip);
        assert_eq!(Key::global().extract(&parts(&[], None)).as_deref(), Some(""));
    }
}
