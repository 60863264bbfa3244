//! Which network addresses a tool may reach (SSRF protection), shared by
//! every tool that makes a request on the model's behalf: `web_fetch`
//! (services/web, which adds a guarded reqwest resolver) and
//! `kernel_install`'s `index_url` (services/kernel).
//!
//! Two checks guard a request: the URL's host when it is an IP literal, in
//! any spelling ([`Policy::check_url`]), and every address a name resolves to
//! ([`Policy::check_addrs`]). Loopback, private, link-local (the cloud
//! metadata address 169.254.169.254 among them), CGNAT, multicast and
//! reserved ranges are refused, in IPv4 and in every IPv6 form that embeds
//! one, unless an allowlist names the host or network.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use url::{Host, Url};

/// A request refused by the SSRF policy. The message names the rule.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("blocked: {0} (SSRF protection)")]
pub struct Blocked(pub String);

/// An allowlist entry that is neither a host name, an IP address nor a CIDR.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("allowlist entry `{0}` is neither a host name, an IP address nor a CIDR")]
pub struct BadAllowEntry(pub String);

/// What `web_fetch` may reach: on by default, with an allowlist.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// False turns every address check off (the scheme check stays).
    pub enabled: bool,
    /// Host names allowed whatever they resolve to (lower case; `*.x.y` matches subdomains).
    pub hosts: Vec<String>,
    /// Networks allowed even when a rule would block them.
    pub nets: Vec<IpNet>,
}

impl Policy {
    /// Builds a policy from allowlist entries: host names, IP addresses or CIDRs.
    pub fn new(enabled: bool, allow: &[String]) -> Result<Self, BadAllowEntry> {
        let mut p = Policy {
            enabled,
            ..Default::default()
        };
        for raw in allow {
            let entry = raw.trim();
            if entry.is_empty() {
                continue;
            }
            let unbracketed = entry.trim_start_matches('[').trim_end_matches(']');
            if let Ok(net) = unbracketed.parse::<IpNet>() {
                p.nets.push(net);
            } else if let Ok(ip) = unbracketed.parse::<IpAddr>() {
                p.nets.push(IpNet::from(ip));
            } else if entry.contains('/') || entry.contains(' ') || entry.contains(':') {
                return Err(BadAllowEntry(entry.to_owned()));
            } else {
                p.hosts.push(entry.to_ascii_lowercase());
            }
        }
        Ok(p)
    }

    /// Whether `host` (a name) is on the allowlist.
    pub fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.hosts.iter().any(|h| match h.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len()
                    && host.ends_with(suffix)
                    && host[..host.len() - suffix.len()].ends_with('.')
            }
            None => *h == host,
        })
    }

    /// Checks one address: allowed by the allowlist, else by the rules.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Blocked> {
        if !self.enabled || self.nets.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        match blocked_rule(ip) {
            Some(rule) => Err(Blocked(rule)),
            None => Ok(()),
        }
    }

    /// Checks every address `host` resolved to (nothing when the allowlist
    /// names the host). One blocked address refuses the name: a name that
    /// mixes public and private answers is what a rebinding attack looks like.
    pub fn check_addrs(&self, host: &str, addrs: &[IpAddr]) -> Result<(), Blocked> {
        if self.host_allowed(host) {
            return Ok(());
        }
        for ip in addrs {
            self.check_ip(*ip)
                .map_err(|b| Blocked(format!("{} (host {host})", b.0)))?;
        }
        Ok(())
    }

    /// Checks a URL before it is requested: the scheme, and the host when it
    /// is an IP literal in any spelling.
    pub fn check_url(&self, url: &Url) -> Result<(), Blocked> {
        match url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(Blocked(format!(
                    "scheme `{other}` is not allowed (only http and https)"
                )));
            }
        }
        match url.host() {
            None => Err(Blocked(format!("URL `{url}` has no host"))),
            Some(Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(Host::Domain(name)) => {
                if self.host_allowed(name) {
                    return Ok(());
                }
                // The URL parser already turns `2130706433` and `0x7f.1` into
                // addresses; this catches any numeric spelling it would leave as a
                // name but a system resolver (inet_aton) would still accept.
                if let Some(ip) = parse_legacy_ipv4(name) {
                    return self.check_ip(IpAddr::V4(ip));
                }
                Ok(())
            }
        }
    }
}

/// The rule that blocks `ip`, as a message naming it, or None when it is public.
pub fn blocked_rule(ip: IpAddr) -> Option<String> {
    match ip {
        IpAddr::V4(v4) => v4_rule(v4).map(|r| format!("{r} {v4}")),
        IpAddr::V6(v6) => v6_rule(v6),
    }
}

fn v4_rule(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let rule = match o {
        [127, ..] => "loopback address",
        [0, ..] => "unspecified (\"this network\") address",
        [10, ..] => "private (RFC 1918) address",
        [172, b, ..] if (16..32).contains(&b) => "private (RFC 1918) address",
        [192, 168, ..] => "private (RFC 1918) address",
        [169, 254, ..] => "link-local address",
        [100, b, ..] if (64..128).contains(&b) => "carrier-grade NAT (RFC 6598) address",
        [255, 255, 255, 255] => "broadcast address",
        [a, ..] if (224..240).contains(&a) => "multicast address",
        [a, ..] if a >= 240 => "reserved address",
        [192, 0, 0, _] => "reserved (IETF protocol assignment) address",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "reserved (documentation) address",
        [198, b, ..] if b == 18 || b == 19 => "reserved (benchmarking) address",
        [192, 88, 99, _] => "reserved (6to4 relay anycast) address",
        _ => return None,
    };
    Some(rule)
}

fn v6_rule(ip: Ipv6Addr) -> Option<String> {
    let s = ip.segments();
    let embedded = |v4: Ipv4Addr, how: &str| {
        v4_rule(v4).map(|r| format!("{r} {v4} embedded in {how} address {ip}"))
    };
    if ip.is_loopback() {
        return Some(format!("loopback address {ip}"));
    }
    if ip.is_unspecified() {
        return Some(format!("unspecified address {ip}"));
    }
    // ::ffff:0:a.b.c.d (IPv4-translated, SIIT).
    if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return embedded(v4, "IPv4-translated IPv6");
    }
    // ::ffff:a.b.c.d (IPv4-mapped) and ::a.b.c.d (IPv4-compatible, deprecated).
    if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        let how = if s[5] == 0xffff {
            "IPv4-mapped IPv6"
        } else {
            "IPv4-compatible IPv6"
        };
        return embedded(v4, how);
    }
    // 64:ff9b::/96, the NAT64 well-known prefix.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return embedded(v4, "NAT64");
    }
    // 2002::/16, 6to4: the IPv4 address is in bits 16..48.
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return embedded(v4, "6to4");
    }
    let rule = if s[0] & 0xfe00 == 0xfc00 {
        "unique local (fc00::/7) address"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "link-local (fe80::/10) address"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "site-local (fec0::/10, deprecated) address"
    } else if s[0] & 0xff00 == 0xff00 {
        "multicast address"
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        "reserved (local-use NAT64 64:ff9b:1::/48) address"
    } else if s[0] == 0x2001 && s[1] == 0 {
        "reserved (Teredo 2001::/32) address"
    } else if s[0] == 0x2001 && s[1] == 0x0db8 {
        "reserved (documentation) address"
    } else if s[..4] == [0x100, 0, 0, 0] {
        "reserved (discard-only 100::/64) address"
    } else {
        return None;
    };
    Some(format!("{rule} {ip}"))
}

/// Parses the numeric IPv4 spellings that `inet_aton` accepts: one to four
/// parts, each decimal, octal (leading 0) or hex (0x), the last part filling
/// the remaining bytes (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`).
pub fn parse_legacy_ipv4(host: &str) -> Option<Ipv4Addr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X"))
        {
            (h, 16)
        } else if p.len() > 1 && p.starts_with('0') {
            (&p[1..], 8)
        } else {
            (*p, 10)
        };
        if p.is_empty() || (digits.is_empty() && radix != 16) {
            return None;
        }
        let n = if digits.is_empty() {
            0
        } else {
            u64::from_str_radix(digits, radix).ok()?
        };
        nums.push(n);
    }
    let (last, init) = nums.split_last()?;
    if init.iter().any(|&n| n > 255) {
        return None;
    }
    let rest_bytes = 4 - init.len();
    if *last >= 1u64 << (8 * rest_bytes) {
        return None;
    }
    let mut value: u32 = 0;
    for (i, n) in init.iter().enumerate() {
        value |= (*n as u32) << (24 - 8 * i);
    }
    value |= *last as u32;
    Some(Ipv4Addr::from(value))
}

/// The future a [`Lookup`] returns.
pub type LookupFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;

/// How names become addresses. The system resolver by default; tests may
/// answer with fixed addresses to act out a DNS rebinding.
pub trait Lookup: Send + Sync + 'static {
    /// Every address of `host`.
    fn lookup(&self, host: &str) -> LookupFuture;
}

/// The operating system's resolver (getaddrinfo through tokio).
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        let host = host.to_owned();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn legacy_ipv4_spellings() {
        let lo = Some(Ipv4Addr::new(127, 0, 0, 1));
        assert_eq!(parse_legacy_ipv4("2130706433"), lo);
        assert_eq!(parse_legacy_ipv4("0x7f.1"), lo);
        assert_eq!(parse_legacy_ipv4("0177.0.0.1"), lo);
        assert_eq!(parse_legacy_ipv4("127.1"), lo);
        assert_eq!(parse_legacy_ipv4("0x7f000001"), lo);
        assert_eq!(parse_legacy_ipv4("127.0.1"), lo);
        assert_eq!(parse_legacy_ipv4("example.com"), None);
        assert_eq!(parse_legacy_ipv4("1.2.3.4.5"), None);
        assert_eq!(parse_legacy_ipv4("256.1.1.1"), None);
        assert_eq!(parse_legacy_ipv4("08.1.1.1"), None);
    }

    #[test]
    fn rules_name_the_range() {
        let p = Policy::new(true, &[]).unwrap();
        let cases = [
            ("127.0.0.1", "loopback address 127.0.0.1"),
            ("10.1.2.3", "private (RFC 1918)"),
            ("172.20.0.1", "private (RFC 1918)"),
            ("192.168.1.1", "private (RFC 1918)"),
            ("169.254.169.254", "link-local address 169.254.169.254"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("224.0.0.1", "multicast"),
            ("240.0.0.1", "reserved"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback address ::1"),
            ("fc00::1", "unique local"),
            ("fd12::1", "unique local"),
            ("fe80::1", "link-local (fe80::/10)"),
            ("ff02::1", "multicast"),
            (
                "::ffff:127.0.0.1",
                "loopback address 127.0.0.1 embedded in IPv4-mapped IPv6",
            ),
            (
                "64:ff9b::a9fe:a9fe",
                "link-local address 169.254.169.254 embedded in NAT64",
            ),
            (
                "2002:7f00:1::",
                "loopback address 127.0.0.1 embedded in 6to4",
            ),
            (
                "::ffff:0:7f00:1",
                "loopback address 127.0.0.1 embedded in IPv4-translated IPv6",
            ),
            (
                "::7f00:1",
                "loopback address 127.0.0.1 embedded in IPv4-compatible IPv6",
            ),
            ("192.88.99.1", "6to4 relay anycast"),
            ("64:ff9b:1::1", "local-use NAT64"),
            ("2001:db8::1", "documentation"),
        ];
        for (ip, want) in cases {
            let err = p.check_ip(ip.parse().unwrap()).unwrap_err().to_string();
            assert!(
                err.contains(want)
                    && err.starts_with("blocked: ")
                    && err.ends_with("(SSRF protection)"),
                "{ip}: {err}"
            );
        }
        for ok in [
            "93.184.216.34",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "172.32.0.1",
            "100.128.0.1",
        ] {
            assert!(p.check_ip(ok.parse().unwrap()).is_ok(), "{ok}");
        }
    }

    #[test]
    fn url_literals_in_every_form() {
        let p = Policy::new(true, &[]).unwrap();
        for u in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[2002:7f00:0001::]/",
            "http://[::1]:8080/",
        ] {
            let err = p.check_url(&url(u)).unwrap_err().to_string();
            assert!(err.contains("loopback"), "{u}: {err}");
        }
        assert!(
            p.check_url(&url("ftp://example.com/"))
                .unwrap_err()
                .to_string()
                .contains("scheme `ftp`")
        );
        assert!(
            p.check_url(&url("file:///etc/passwd"))
                .unwrap_err()
                .to_string()
                .contains("scheme `file`")
        );
        assert!(p.check_url(&url("https://example.com/")).is_ok());
    }

    #[test]
    fn allowlist_hosts_and_nets() {
        let p = Policy::new(
            true,
            &[
                "127.0.0.1/32".into(),
                "Intranet.Example".into(),
                "*.corp.test".into(),
                "::1".into(),
            ],
        )
        .unwrap();
        assert!(p.check_url(&url("http://127.0.0.1:9/")).is_ok());
        assert!(p.check_url(&url("http://[::1]/")).is_ok());
        assert!(p.check_url(&url("http://127.0.0.2/")).is_err());
        assert!(p.host_allowed("intranet.example"));
        assert!(p.host_allowed("a.corp.test"));
        assert!(!p.host_allowed("corp.test"));
        assert!(!p.host_allowed("evilcorp.test"));
        assert!(Policy::new(true, &["10.0.0.0/33".into()]).is_err());
        let off = Policy::new(false, &[]).unwrap();
        assert!(off.check_url(&url("http://127.0.0.1/")).is_ok());
        assert!(off.check_url(&url("gopher://127.0.0.1/")).is_err());
    }
}
