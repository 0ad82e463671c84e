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
}
