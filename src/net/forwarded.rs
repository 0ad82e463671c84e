//! Which forwarded headers to believe. Behind a reverse proxy the TCP peer is the proxy, and
//! the client's address, the host it asked for and its scheme come in `X-Forwarded-For`,
//! `X-Forwarded-Host` and `X-Forwarded-Proto`, which any client can also send. They are
//! believed only from the proxies named in `SPILLWAY_TRUSTED_PROXIES`, and the client's
//! address is read as nginx's `real_ip_recursive` and Traefik's `trustedIPs` read it: from
//! the right of `X-Forwarded-For`, skipping trusted proxies, the first address that is not
//! one. Whatever a client wrote to the left of that is never looked at.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

/// The proxies whose forwarded headers are believed. Empty: none (Spillway faces clients).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses a comma-separated list of addresses and CIDR blocks.
    pub fn parse(raw: &str) -> Result<Self, String> {
        raw.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<IpNet>()
                    .or_else(|_| p.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("{p:?} is neither an IP address nor a CIDR block"))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client's address for a request from `peer`: `peer` itself unless it is a trusted
    /// proxy; then what `X-Forwarded-For` says (see [`Self::forwarded_client`]), or `peer`
    /// when the header is missing or unreadable.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return canonical(peer);
        }
        match self.forwarded_client(headers) {
            Ok(Some(ip)) => ip,
            _ => canonical(peer),
        }
    }

    /// The client's address as `X-Forwarded-For` gives it, for a caller that is trusted to
    /// have appended it (a trusted proxy, or a forward-auth caller holding a service key):
    /// from the right, the first address that is not a trusted proxy (the leftmost when all
    /// are). `Ok(None)` without the header; `Err` with the entry that is not an address.
    pub fn forwarded_client(&self, headers: &HeaderMap) -> Result<Option<IpAddr>, String> {
        let mut found = None;
        for value in headers.get_all("x-forwarded-for").iter().rev() {
            let text = value.to_str().map_err(|_| "is not text".to_owned())?;
            for entry in text.rsplit(',').map(str::trim) {
                if entry.is_empty() {
                    continue;
                }
                let ip =
                    parse_entry(entry).ok_or_else(|| format!("{entry:?} is not an IP address"))?;
                if !self.trusts(ip) {
                    return Ok(Some(ip));
                }
                found = Some(ip);
            }
        }
        Ok(found)
    }

    /// A forwarded header (`X-Forwarded-Host`, `X-Forwarded-Proto`) of a request from
    /// `peer`, only when `peer` is a trusted proxy: the value the nearest proxy set (the last
    /// of a list).
    pub fn header<'h>(&self, peer: IpAddr, headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
        if !self.trusts(peer) {
            return None;
        }
        headers
            .get_all(name)
            .iter()
            .next_back()?
            .to_str()
            .ok()?
            .rsplit(',')
            .next()
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One `X-Forwarded-For` entry: an address, with or without a port (`[::1]:80`).
fn parse_entry(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .or_else(|_| entry.parse::<SocketAddr>().map(|s| s.ip()))
        .or_else(|_| {
            entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .ok_or(())
                .and_then(|e| e.parse::<IpAddr>().map_err(|_| ()))
        })
        .ok()
        .map(canonical)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn xff(values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_static(v));
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").unwrap();
        let h = xff(&["1.2.3.4"]);
        assert_eq!(trusted.client_ip(ip("192.0.2.1"), &h), ip("192.0.2.1"));
        assert_eq!(
            TrustedProxies::default().client_ip(ip("10.0.0.1"), &h),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn the_client_is_the_first_untrusted_address_from_the_right() {
        let trusted = TrustedProxies::parse("10.0.0.0/8, 192.0.2.9").unwrap();
        // The client wrote "6.6.6.6" itself; the proxy appended the address it saw.
        let h = xff(&["6.6.6.6, 203.0.113.7"]);
        assert_eq!(trusted.client_ip(ip("10.1.1.1"), &h), ip("203.0.113.7"));
        // Two trusted hops (a load balancer, then the proxy), over two header lines.
        let h = xff(&["6.6.6.6, 203.0.113.7", "192.0.2.9"]);
        assert_eq!(trusted.client_ip(ip("10.1.1.1"), &h), ip("203.0.113.7"));
        // Ports and brackets, IPv4 written as IPv6.
        let h = xff(&["[2001:db8::1]:4711, ::ffff:10.0.0.2"]);
        assert_eq!(trusted.client_ip(ip("10.1.1.1"), &h), ip("2001:db8::1"));
        // Every entry trusted: the leftmost. None: the peer.
        let h = xff(&["10.0.0.3, 10.0.0.2"]);
        assert_eq!(trusted.client_ip(ip("10.1.1.1"), &h), ip("10.0.0.3"));
        assert_eq!(
            trusted.client_ip(ip("10.1.1.1"), &HeaderMap::new()),
            ip("10.1.1.1")
        );
    }

    #[test]
    fn an_entry_that_is_not_an_address_is_named() {
        let trusted = TrustedProxies::default();
        let err = trusted
            .forwarded_client(&xff(&["1.2.3.4, evil"]))
            .unwrap_err();
        assert!(err.contains("\"evil\""), "{err}");
        // Left of the client's address nothing is read.
        assert_eq!(
            trusted.forwarded_client(&xff(&["evil, 1.2.3.4"])).unwrap(),
            Some(ip("1.2.3.4"))
        );
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let trusted = TrustedProxies::parse("127.0.0.1").unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-host",
            HeaderValue::from_static("evil.example, spillway.example"),
        );
        assert_eq!(
            trusted.header(ip("127.0.0.1"), &h, "x-forwarded-host"),
            Some("spillway.example")
        );
        assert_eq!(
            trusted.header(ip("192.0.2.1"), &h, "x-forwarded-host"),
            None
        );
    }

    #[test]
    fn settings_that_are_not_addresses_are_refused() {
        assert!(TrustedProxies::parse("10.0.0.0/8,::1,192.0.2.1").is_ok());
        assert!(TrustedProxies::parse("").unwrap().0.is_empty());
        assert!(
            TrustedProxies::parse("proxy.local")
                .unwrap_err()
                .contains("proxy.local")
        );
    }
}
