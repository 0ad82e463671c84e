//! Which addresses Spillway's own outbound requests (alert webhooks) may reach: anything on
//! the internet, and inside the network it runs in only what an admin allowed
//! (`SPILLWAY_WEBHOOK_ALLOWED_TARGETS`). A URL whose host is a loopback, private,
//! link-local (cloud metadata), shared or otherwise internal address, or a local name, is
//! refused; the webhook client checks the addresses a name resolves to the same way.

use std::net::IpAddr;

/// The internal targets an admin allowed webhooks to reach
/// (`SPILLWAY_WEBHOOK_ALLOWED_TARGETS`: host names, addresses and CIDR blocks,
/// comma-separated; default none). Public addresses are always allowed.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    hosts: Vec<String>,
    nets: Vec<ipnet::IpNet>,
}

impl Targets {
    /// Reads the setting; the error names the entry that is neither a host nor a network.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut targets = Self::default();
        for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Ok(net) = entry.parse::<ipnet::IpNet>() {
                targets.nets.push(net);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                targets.nets.push(ipnet::IpNet::from(ip));
            } else if entry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                targets.hosts.push(entry.to_ascii_lowercase());
            } else {
                return Err(format!(
                    "{entry:?} is not a host name, an address or a CIDR block"
                ));
            }
        }
        Ok(targets)
    }

    /// Whether a connection may go to `ip`.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        !internal(ip) || self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Whether `host` (lowercase, no trailing dot) is allowed by name, whatever it resolves to.
    pub fn allows_host(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h == host)
    }

    /// Whether a webhook may go to `url` as far as its text tells (the host as written,
    /// decimal and short IPv4 forms included); the message says why not. Names are
    /// resolved at each delivery, where [`Webhooks`] checks the addresses.
    pub fn check_url(&self, url: &str) -> Result<(), String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("is not a URL: {e}"))?;
        let refused = |what: &str| {
            Err(format!(
                "points at {what}, inside the network Spillway runs in; an admin can allow \
                 it with SPILLWAY_WEBHOOK_ALLOWED_TARGETS"
            ))
        };
        match parsed.host() {
            None => Err("must name a host".into()),
            Some(url::Host::Ipv4(ip)) if !self.allows_ip(ip.into()) => {
                refused(&format!("the internal address {ip}"))
            }
            Some(url::Host::Ipv6(ip)) if !self.allows_ip(ip.into()) => {
                refused(&format!("the internal address {ip}"))
            }
            Some(url::Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let local = name == "localhost"
                    || name.ends_with(".localhost")
                    || name.ends_with(".local")
                    || name.ends_with(".internal")
                    || !name.contains('.');
                if local && !self.allows_host(&name) {
                    refused(&format!("the local name {name}"))
                } else {
                    Ok(())
                }
            }
            Some(_) => Ok(()),
        }
    }
}

impl Targets {
    /// Whether the addresses `url`'s host name resolves to now may be reached (true when it
    /// is an address, or does not resolve: [`Targets::check_url`] and the delivery's own
    /// resolution cover those).
    pub async fn check_resolved(&self, url: &str) -> Result<(), String> {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return Ok(());
        };
        let Some(url::Host::Domain(name)) = parsed.host() else {
            return Ok(());
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if self.allows_host(&name) {
            return Ok(());
        }
        let Ok(Ok(addrs)) = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::net::lookup_host((name.as_str(), 0)),
        )
        .await
        else {
            return Ok(());
        };
        for addr in addrs {
            if !self.allows_ip(addr.ip()) {
                return Err(format!(
                    "{name} resolves to the internal address {}; an admin can allow it with \
                     SPILLWAY_WEBHOOK_ALLOWED_TARGETS",
                    addr.ip()
                ));
            }
        }
        Ok(())
    }
}

/// The IPv4 address two 16-bit groups of an IPv6 address carry.
fn embedded(high: u16, low: u16) -> std::net::Ipv4Addr {
    let [a, b] = high.to_be_bytes();
    let [c, d] = low.to_be_bytes();
    std::net::Ipv4Addr::new(a, b, c, d)
}

/// Whether `ip` is an address inside a network rather than on the internet: loopback,
/// unspecified, private, shared (CGNAT), link-local (where cloud metadata answers),
/// benchmarking, multicast, broadcast, reserved, unique-local IPv6, and IPv4 written as
/// IPv6.
pub fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (b == 18 || b == 19))
                // IETF protocol assignments (192.0.0.0/24: DS-Lite, NAT64 discovery).
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || a >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                // IPv4-compatible (::a.b.c.d) and NAT64 (64:ff9b::/96) reach IPv4 inside.
                || v6.segments()[..6] == [0; 6]
                || v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
                // Local-use NAT64 (64:ff9b:1::/48), deprecated site-local (fec0::/10) and
                // Teredo (2001::/32, which tunnels to an IPv4 address).
                || v6.segments()[..3] == [0x64, 0xff9b, 1]
                || (first & 0xffc0) == 0xfec0
                || (first == 0x2001 && v6.segments()[1] == 0)
                // SIIT's IPv4-translated addresses (::ffff:0:a.b.c.d) and 6to4 (2002::/16,
                // the IPv4 address in bits 16-48): internal when the IPv4 inside is.
                || (v6.segments()[..6] == [0, 0, 0, 0, 0xffff, 0]
                    && internal(IpAddr::V4(embedded(v6.segments()[6], v6.segments()[7]))))
                || (first == 0x2002
                    && internal(IpAddr::V4(embedded(v6.segments()[1], v6.segments()[2]))))
        }
    }
}

#[cfg(test)]
mod tests {
    /// N6 of the second probe: webhooks could target loopback, `[::1]`, `localhost`,
    /// decimal IPs and the Redis port. Every internal form is refused unless allowed.
    #[test]
    fn internal_targets_are_refused_unless_allowed() {
        let none = super::Targets::default();
        for url in [
            "http://127.0.0.1:6379/",
            "http://[::1]/",
            "http://localhost/x",
            "http://LOCALHOST./x",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://017700000001/",
            "http://10.1.2.3/",
            "http://172.20.0.1/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fd00:ec2::254]/",
            "http://[fe80::1]/",
            "http://metadata.google.internal/",
            "http://[::ffff:0:7f00:1]/",
            "http://[2002:7f00:1::1]/",
            "http://[2002:a00:1::1]/",
            "http://[64:ff9b:1::7f00:1]/",
            "http://[fec0::1]/",
            "http://[2001:0:4136:e378::1]/",
            "http://192.0.0.8/",
            "http://redis/",
        ] {
            let refused = none.check_url(url).expect_err(url);
            assert!(
                refused.contains("SPILLWAY_WEBHOOK_ALLOWED_TARGETS"),
                "{url}: {refused}"
            );
        }
        for url in [
            "https://hooks.slack.com/services/x",
            "http://203.0.113.9:8080/",
            "http://[2001:db8::1]/",
            "http://[2002:cb00:7109::1]/",
        ] {
            assert_eq!(none.check_url(url), Ok(()), "{url}");
        }
        let allowed = super::Targets::parse("127.0.0.1, 10.0.0.0/8, receiver").unwrap();
        for url in [
            "http://127.0.0.1:9000/",
            "http://10.9.9.9/",
            "http://receiver/",
        ] {
            assert_eq!(allowed.check_url(url), Ok(()), "{url}");
        }
        assert!(allowed.check_url("http://127.0.0.2/").is_err());
        assert!(super::Targets::parse("10.0.0.0/33").is_err());
        assert!(super::Targets::parse("a b").is_err());
    }

    /// A name is resolved when the rule is saved, and one that resolves inside is refused
    /// (`localhost` resolves to loopback on every machine; a dotted name would be the same
    /// but needs a resolver that knows one).
    #[tokio::test]
    async fn names_that_resolve_inside_are_refused() {
        let none = super::Targets::default();
        let refused = none
            .check_resolved("http://localhost:9/x")
            .await
            .unwrap_err();
        assert!(
            refused.contains("resolves to the internal address"),
            "{refused}"
        );
        let allowed = super::Targets::parse("localhost").unwrap();
        assert_eq!(allowed.check_resolved("http://localhost:9/x").await, Ok(()));
        // Not resolvable here: taken, and checked at each delivery.
        assert_eq!(
            none.check_resolved("http://no-such-host.invalid/").await,
            Ok(())
        );
        assert_eq!(none.check_resolved("http://203.0.113.9/").await, Ok(()));
    }
}
