//! Egress policy: which destinations an outbound sandbox may open connections to.
//!
//! A policy is a default ([`EgressAction::Allow`]: the internet is reachable;
//! [`EgressAction::Deny`]: nothing is) and an ordered list of rules, the first matching one
//! deciding: each names a destination (an IP network, or a domain name kept as a name and
//! resolved by the runtime), optionally a protocol and ports. E2B's options map onto it as the
//! reference maps them onto a TrafficPolicy: `allowOut` rules first, then `denyOut` rules (so
//! an allowed address wins over a denied one), `allow_internet_access: false` is a default of
//! deny.
//!
//! Rules every runtime keeps, whatever the policy: private, shared, link-local, loopback and
//! multicast networks ([`NON_PUBLIC`]) are reachable only through an allow rule whose network
//! lies inside one of them (so `0.0.0.0/0` never opens the host's LAN), the host itself never,
//! and other sandboxes never.
//!
//! Pure: parsing and validation only; enforcement is the runtime's.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What happens to a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EgressAction {
    /// It may be opened.
    #[default]
    Allow,
    /// It is refused at once (the sender sees an ICMP "administratively prohibited").
    Deny,
}

/// A sandbox's egress policy. The default value allows the internet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EgressPolicy {
    /// What happens to a connection no rule matches.
    pub default: EgressAction,
    /// Rules, the first matching one deciding.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<EgressRule>,
}

impl EgressPolicy {
    /// Everything allowed (the non-public networks excepted, as always).
    pub fn allow_all() -> Self {
        Self::default()
    }

    /// Nothing allowed.
    pub fn deny_all() -> Self {
        Self { default: EgressAction::Deny, rules: Vec::new() }
    }

    /// Whether the policy lets anything out (a default of allow, or one allow rule).
    pub fn allows_anything(&self) -> bool {
        self.default == EgressAction::Allow
            || self.rules.iter().any(|r| r.action == EgressAction::Allow)
    }

    /// The domain names the rules name, each once, in order.
    pub fn domains(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for rule in &self.rules {
            if let Destination::Domain(name) = &rule.destination
                && !out.contains(&name.as_str())
            {
                out.push(name);
            }
        }
        out
    }
}

/// One rule of an [`EgressPolicy`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EgressRule {
    /// Allow or deny.
    pub action: EgressAction,
    /// Where to.
    pub destination: Destination,
    /// Which protocol; `None` is any (with ports: TCP and UDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Destination ports, inclusive ranges; empty is every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<(u16, u16)>,
}

impl EgressRule {
    /// A rule for every protocol and port of `destination`.
    pub fn new(action: EgressAction, destination: Destination) -> Self {
        Self { action, destination, protocol: None, ports: Vec::new() }
    }
}

/// A transport protocol a rule may be limited to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
    /// ICMP (a rule of it has no ports).
    Icmp,
}

impl Protocol {
    /// The protocol's nftables (and Kubernetes, lower-cased) name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
            Self::Icmp => "icmp",
        }
    }
}

/// Where a rule applies.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Destination {
    /// An IP network.
    Cidr(Cidr),
    /// A domain name, lower case, without a trailing dot; the runtime allows (or denies) the
    /// addresses it resolves to, re-resolved while the rule stands.
    Domain(String),
}

impl Destination {
    /// Parses an E2B `allowOut`/`denyOut` entry or a rule's destination: an address
    /// (`1.2.3.4`, a `/32`), a network (`10.0.0.0/8`, host bits cleared) or a domain name
    /// (`example.com`; wildcards such as `*.example.com` are refused: a name must resolve).
    pub fn parse(entry: &str) -> Result<Self, EgressError> {
        let entry = entry.trim();
        if entry.parse::<IpAddr>().is_ok() || entry.contains('/') {
            return entry.parse().map(Self::Cidr);
        }
        parse_domain(entry).map(Self::Domain)
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cidr(c) => c.fmt(f),
            Self::Domain(d) => f.write_str(d),
        }
    }
}

/// Why an egress entry is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// Not a valid address or network.
    #[error("{0:?} is not a valid IP address or CIDR network")]
    InvalidCidr(String),
    /// Not a valid domain name.
    #[error("{entry:?} is not a valid domain name: {reason}")]
    InvalidDomain {
        /// The entry.
        entry: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// An IP network, address and prefix length, host bits cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cidr {
    /// The network's first address.
    pub addr: IpAddr,
    /// Prefix length (0..=32 for IPv4, 0..=128 for IPv6).
    pub prefix: u8,
}

impl Cidr {
    /// `addr/prefix` with host bits cleared; `None` if the prefix is too long.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let addr = match addr {
            IpAddr::V4(a) if prefix <= 32 => {
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & v4_mask(prefix)))
            }
            IpAddr::V6(a) if prefix <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
            _ => return None,
        };
        Some(Self { addr, prefix })
    }

    /// The network as IPv4 first address and prefix, if it is IPv4.
    pub fn v4(&self) -> Option<(Ipv4Addr, u8)> {
        match self.addr {
            IpAddr::V4(a) => Some((a, self.prefix)),
            IpAddr::V6(_) => None,
        }
    }

    /// Whether `self` lies entirely inside `outer`.
    pub fn within(&self, outer: &Cidr) -> bool {
        match (self.addr, outer.addr) {
            (IpAddr::V4(a), IpAddr::V4(o)) => {
                self.prefix >= outer.prefix && u32::from(a) & v4_mask(outer.prefix) == u32::from(o)
            }
            (IpAddr::V6(a), IpAddr::V6(o)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(outer.prefix)).unwrap_or(0);
                self.prefix >= outer.prefix && u128::from(a) & mask == u128::from(o)
            }
            _ => false,
        }
    }

    /// Whether the network lies inside one of [`NON_PUBLIC`].
    pub fn is_non_public(&self) -> bool {
        NON_PUBLIC
            .iter()
            .any(|&(a, p)| self.within(&Cidr { addr: IpAddr::V4(Ipv4Addr::from(a)), prefix: p }))
    }
}

fn v4_mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = EgressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || EgressError::InvalidCidr(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => {
                let addr: IpAddr = a.parse().map_err(|_| bad())?;
                let prefix: u8 = p.parse().map_err(|_| bad())?;
                (addr, prefix)
            }
            None => {
                let addr: IpAddr = s.parse().map_err(|_| bad())?;
                (addr, if addr.is_ipv4() { 32 } else { 128 })
            }
        };
        Cidr::new(addr, prefix).ok_or_else(bad)
    }
}

/// The IPv4 networks no sandbox reaches unless an allow rule inside one of them names it:
/// "this network", RFC 1918 private, shared address space (carrier-grade NAT), loopback,
/// link-local (cloud metadata services), multicast and reserved. As `(first address, prefix)`.
pub const NON_PUBLIC: [(u32, u8); 9] = [
    (0x0000_0000, 8),  // 0.0.0.0/8
    (0x0a00_0000, 8),  // 10.0.0.0/8
    (0x6440_0000, 10), // 100.64.0.0/10
    (0x7f00_0000, 8),  // 127.0.0.0/8
    (0xa9fe_0000, 16), // 169.254.0.0/16
    (0xac10_0000, 12), // 172.16.0.0/12
    (0xc0a8_0000, 16), // 192.168.0.0/16
    (0xe000_0000, 4),  // 224.0.0.0/4
    (0xf000_0000, 4),  // 240.0.0.0/4
];

/// A domain name checked as DNS names are (labels of letters, digits and hyphens, 1 to 63
/// bytes, 253 in all), lower-cased, trailing dot dropped.
fn parse_domain(entry: &str) -> Result<String, EgressError> {
    let bad = |reason| EgressError::InvalidDomain { entry: entry.to_owned(), reason };
    let name = entry.strip_suffix('.').unwrap_or(entry).to_ascii_lowercase();
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.starts_with("*.") || name.contains('*') {
        return Err(bad("wildcard names cannot be resolved; name each host"));
    }
    if name.len() > 253 {
        return Err(bad("it is longer than 253 bytes"));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad("each label must have 1 to 63 characters"));
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err(bad("labels are letters, digits and inner hyphens"));
        }
    }
    if name.rsplit('.').next().is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit())) {
        return Err(bad("the last label is all digits (an address? write it as one)"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entries_parse_as_networks_or_names() {
        assert_eq!(Destination::parse("1.2.3.4").unwrap().to_string(), "1.2.3.4/32");
        assert_eq!(Destination::parse("10.1.2.3/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(Destination::parse("2001:db8::1/32").unwrap().to_string(), "2001:db8::/32");
        assert_eq!(
            Destination::parse("Example.COM.").unwrap(),
            Destination::Domain("example.com".into())
        );
        for bad in ["1.2.3.4/33", "1.2.3/8", "300.1.1.1", "*.example.com", "a..b", "-a.com", ""] {
            assert!(Destination::parse(bad).is_err(), "{bad} accepted");
        }
        let err = Destination::parse("10.0.0.0/40").unwrap_err();
        assert!(err.to_string().contains("10.0.0.0/40"), "{err}");
    }

    #[test]
    fn non_public_networks_are_recognised_by_containment() {
        let c = |s: &str| s.parse::<Cidr>().unwrap();
        assert!(c("10.1.0.0/16").is_non_public());
        assert!(c("169.254.169.254").is_non_public());
        assert!(c("192.168.1.1").is_non_public());
        assert!(!c("0.0.0.0/0").is_non_public(), "a wider network does not name the LAN");
        assert!(!c("198.51.100.0/24").is_non_public());
        assert!(!c("8.8.8.8").is_non_public());
    }

    #[test]
    fn a_policy_knows_whether_it_lets_anything_out_and_its_names() {
        assert!(EgressPolicy::allow_all().allows_anything());
        assert!(!EgressPolicy::deny_all().allows_anything());
        let mut p = EgressPolicy::deny_all();
        for entry in ["a.example", "1.2.3.4", "a.example"] {
            p.rules.push(EgressRule::new(EgressAction::Allow, Destination::parse(entry).unwrap()));
        }
        assert!(p.allows_anything());
        assert_eq!(p.domains(), vec!["a.example"]);
    }
}
