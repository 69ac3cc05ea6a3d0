//! The runtime's firewall: one nftables table per runtime holding the NAT of outbound sandboxes,
//! the isolation of the host and of other sandboxes, and each sandbox's egress policy
//! ([`EgressPolicy`]) as a chain of its own.
//!
//! Table `inet oka_<cgroup name>` (both families, so the host's IPv6 link-local address on a
//! host end is as closed as its IPv4 ones):
//! - `postrouting`: masquerade from the subnet to anything outside it;
//! - `input`: from any host end of this runtime (`iifname "<prefix>*"`), replies to connections
//!   the host opened pass, everything else is refused: **no outbound sandbox reaches the host's
//!   own listeners**, on the host end's address, on the host's other addresses or via IPv6;
//! - `forward`: sandbox to sandbox is refused; replies pass; each host end jumps to its
//!   sandbox's chain `sb<slot>`; a host end without a chain is refused (never let out by
//!   accident);
//! - `sb<slot>`: DNS (port 53) to the nameservers of the sandbox's `resolv.conf` if the policy
//!   lets anything out at all; the policy's rules in order (an allow rule whose network is not
//!   inside one of [`NON_PUBLIC`](oka_runtime_api::egress::NON_PUBLIC) does not reach those
//!   networks); then the non-public networks refused; then the policy's default.
//!
//! Refused connections get an ICMP "administratively prohibited" (`reject with icmpx type
//! admin-prohibited`), so a program fails at once instead of timing out.
//!
//! Domain rules: the runtime resolves each name with the host's resolver (a hosts file of
//! [`LocalConfig::egress_hosts`](super::LocalConfig) first) when a policy naming it is set, and
//! again every [`REFRESH`]; the addresses are a named set per sandbox and name
//! (`sb<slot>_<hash of the name>`) that the rule matches and a refresh updates in place. So a
//! domain rule allows (or denies) the addresses the name had when last resolved, for every
//! service on them. E2B's own infrastructure instead matches the TLS SNI or HTTP `Host` in a
//! proxy; that needs a proxy in every connection's path and still trusts what the client says.
//! Addresses are what the kernel can enforce without one; the cost is that a name sharing its
//! addresses with other names (a CDN) opens those too. IPv6 rules are kept but not written:
//! sandboxes have no IPv6 route.
//!
//! Expected flow: the table's frame (sets, NAT, `input`, `forward` with a verdict map
//! `sandboxes` from host-end name to `jump sb<slot>`) is written whole, with every sandbox's
//! chain, by the first change of a runtime process (a start, `open`'s re-adoption, a policy)
//! and after any failed write; every later change is one `nft -f` transaction for that sandbox
//! alone (its chain flushed and refilled, its sets, its map element), so a change costs the
//! same with a thousand sandboxes as with one, and no packet ever sees half a policy. When the
//! last outbound sandbox is deleted the table goes. One `nft -f` costs 10 to 20 ms on a 2-core
//! VM (the process, and nftables reading the table back for its cache), which is most of what
//! a policy adds to a create; a netlink socket of our own, or one long-lived `nft -i`, would
//! save it if that matters. Connections already open keep going under
//! a new policy (replies pass before any policy chain); new ones follow it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oka_runtime_api::egress::NON_PUBLIC;
use oka_runtime_api::{
    Destination, EgressAction, EgressPolicy, EgressRule, Operation, Protocol, RuntimeError,
    SandboxId,
};

use super::network::{self, NetworkError, Subnet};
use super::{Inner, LocalError, blocking, from_state};

/// How often domain rules are resolved again.
pub const REFRESH: Duration = Duration::from_secs(60);

/// What the firewall holds for one outbound sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guarded {
    /// Its host end's link name.
    pub host_if: String,
    /// Its policy.
    pub policy: EgressPolicy,
}

/// What the frame of the table is made of.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// The table's name.
    pub table: &'a str,
    /// The outbound subnet.
    pub subnet: Subnet,
    /// The prefix every host end of this runtime starts with.
    pub if_prefix: &'a str,
}

/// What one sandbox's chain is made of.
#[derive(Clone, Copy, Debug)]
pub struct SandboxInput<'a> {
    /// Its slot.
    pub slot: u32,
    /// Its host end and policy.
    pub guarded: &'a Guarded,
    /// The nameservers it is given.
    pub nameservers: &'a [Ipv4Addr],
    /// The addresses each domain name resolved to.
    pub resolved: &'a BTreeMap<String, Vec<Ipv4Addr>>,
}

const REJECT: &str = "reject with icmpx type admin-prohibited";

/// The nftables script that replaces the whole table atomically: the frame, then each of
/// `sandboxes` as [`sandbox_script`] adds it. Pure.
pub fn table_script(frame: Frame<'_>, sandboxes: &[SandboxInput<'_>]) -> String {
    let Frame { table, subnet, if_prefix } = frame;
    let mut out = String::new();
    let _ =
        writeln!(out, "table inet {table} {{}}\ndelete table inet {table}\ntable inet {table} {{");
    let non_public: Vec<String> =
        NON_PUBLIC.iter().map(|&(a, p)| format!("{}/{p}", Ipv4Addr::from(a))).collect();
    let any_if = format!("iifname \"{if_prefix}*\"");
    let _ = write!(
        out,
        "\tset non_public {{\n\t\ttype ipv4_addr; flags interval;\n\t\telements = {{ {} }}\n\t}}\n\
         \tmap sandboxes {{\n\t\ttype ifname : verdict;\n\t}}\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {subnet} ip daddr != {subnet} masquerade\n\
         \t}}\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\t{any_if} ct state established,related accept\n\
         \t\t{any_if} {REJECT}\n\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tip saddr {subnet} ip daddr {subnet} {REJECT}\n\
         \t\t{any_if} ct state established,related accept\n\
         \t\tiifname vmap @sandboxes\n\
         \t\t{any_if} {REJECT}\n\
         \t}}\n\
         }}\n",
        non_public.join(", ")
    );
    for sandbox in sandboxes {
        out.push_str(&sandbox_script(table, sandbox, &[]));
    }
    out
}

/// The name of sandbox `slot`'s set of the addresses of `domain`: stable for the name, so a
/// refresh or a new policy naming it again updates the same set.
fn domain_set(slot: u32, domain: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in domain.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("sb{slot}_{h:08x}")
}

/// `flush set` and the elements of `set` (none when `addrs` is empty).
fn fill_set(table: &str, set: &str, addrs: &[Ipv4Addr]) -> String {
    let mut out = format!("flush set inet {table} {set}\n");
    if !addrs.is_empty() {
        let list: Vec<String> = addrs.iter().map(Ipv4Addr::to_string).collect();
        let _ = writeln!(out, "add element inet {table} {set} {{ {} }}", list.join(", "));
    }
    out
}

/// The commands that make sandbox `input`'s chain its policy, replacing what it had
/// (`old_domains`: the names its previous policy had sets for), and map its host end to it.
/// Pure.
pub fn sandbox_script(table: &str, input: &SandboxInput<'_>, old_domains: &[&str]) -> String {
    let SandboxInput { slot, guarded, nameservers, resolved } = *input;
    let chain = format!("sb{slot}");
    let mut out = format!("add chain inet {table} {chain}\nflush chain inet {table} {chain}\n");
    let policy = &guarded.policy;
    let domains = policy.domains();
    for name in old_domains.iter().filter(|d| !domains.contains(d)) {
        let _ = writeln!(out, "delete set inet {table} {}", domain_set(slot, name));
    }
    let mut sets = BTreeMap::new();
    for name in &domains {
        let set = domain_set(slot, name);
        let _ = writeln!(out, "add set inet {table} {set} {{ type ipv4_addr; }}");
        out.push_str(&fill_set(table, &set, resolved.get(*name).map_or(&[], Vec::as_slice)));
        sets.insert(*name, set);
    }
    let rule = |out: &mut String, line: &str| {
        let _ = writeln!(out, "add rule inet {table} {chain} {line}");
    };
    if policy.allows_anything() && !nameservers.is_empty() {
        let list: Vec<String> = nameservers.iter().map(Ipv4Addr::to_string).collect();
        let dns = format!(
            "ip daddr {{ {} }} meta l4proto {{ tcp, udp }} th dport 53 accept",
            list.join(", ")
        );
        rule(&mut out, &dns);
    }
    for r in &policy.rules {
        if let Some(line) = rule_line(r, &sets) {
            rule(&mut out, &line);
        }
    }
    rule(&mut out, &format!("ip daddr @non_public {REJECT}"));
    match policy.default {
        EgressAction::Allow => rule(&mut out, "accept"),
        EgressAction::Deny => rule(&mut out, REJECT),
    }
    let _ = writeln!(
        out,
        "add element inet {table} sandboxes {{ \"{}\" : jump {chain} }}",
        guarded.host_if
    );
    out
}

/// The commands that take sandbox `slot` (host end `host_if`, sets for `domains`) out of the
/// table. Pure.
pub fn forget_script(table: &str, slot: u32, host_if: &str, domains: &[&str]) -> String {
    let chain = format!("sb{slot}");
    let mut out = format!(
        "delete element inet {table} sandboxes {{ \"{host_if}\" }}\n\
         flush chain inet {table} {chain}\n\
         delete chain inet {table} {chain}\n"
    );
    for name in domains {
        let _ = writeln!(out, "delete set inet {table} {}", domain_set(slot, name));
    }
    out
}

/// The commands that give every set of `domain` in `sandboxes` its new addresses. Pure.
pub fn refresh_script(
    table: &str,
    sandboxes: &BTreeMap<u32, Guarded>,
    domain: &str,
    addrs: &[Ipv4Addr],
) -> String {
    sandboxes
        .iter()
        .filter(|(_, g)| g.policy.domains().contains(&domain))
        .map(|(slot, _)| fill_set(table, &domain_set(*slot, domain), addrs))
        .collect()
}

/// One rule as an nftables rule; `None` for an IPv6 network (sandboxes have no IPv6 route).
fn rule_line(rule: &EgressRule, domain_sets: &BTreeMap<&str, String>) -> Option<String> {
    let mut line = match &rule.destination {
        Destination::Cidr(cidr) => {
            let (addr, prefix) = cidr.v4()?;
            let mut m = format!("ip daddr {addr}/{prefix}");
            if rule.action == EgressAction::Allow && !cidr.is_non_public() {
                m.push_str(" ip daddr != @non_public");
            }
            m
        }
        Destination::Domain(name) => {
            let set = domain_sets.get(name.as_str())?;
            let mut m = format!("ip daddr @{set}");
            if rule.action == EgressAction::Allow {
                m.push_str(" ip daddr != @non_public");
            }
            m
        }
    };
    let ports: Vec<String> = rule
        .ports
        .iter()
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    match (rule.protocol, ports.is_empty()) {
        // ICMP has no ports.
        (Some(p @ Protocol::Icmp), _) | (Some(p), true) => {
            let _ = write!(line, " meta l4proto {}", p.name());
        }
        (Some(p), false) => {
            let _ = write!(line, " {} dport {{ {} }}", p.name(), ports.join(", "));
        }
        (None, false) => {
            let _ =
                write!(line, " meta l4proto {{ tcp, udp }} th dport {{ {} }}", ports.join(", "));
        }
        (None, true) => {}
    }
    line.push(' ');
    line.push_str(match rule.action {
        EgressAction::Allow => "accept",
        EgressAction::Deny => REJECT,
    });
    Some(line)
}

/// The IPv4 nameservers a sandbox's `resolv.conf` names (see [`network::resolv_conf`]).
pub fn nameservers(resolv_conf: &str) -> Vec<Ipv4Addr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<Ipv4Addr>().ok())
        .filter(|a| !a.is_loopback())
        .collect()
}

/// The IPv4 addresses `name` has in a hosts file's text (`/etc/hosts` format).
pub fn hosts_lookup(hosts: &str, name: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    for line in hosts.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let Some(Ok(addr)) = words.next().map(str::parse::<Ipv4Addr>) else { continue };
        if words.any(|w| w.eq_ignore_ascii_case(name)) && !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

/// Resolves `name` to its IPv4 addresses: from the hosts file `hosts` if it names it, else with
/// the host's resolver (`getaddrinfo`). Sorted; empty when it does not resolve. Blocking.
pub fn resolve(name: &str, hosts: Option<&Path>) -> Vec<Ipv4Addr> {
    if let Some(path) = hosts {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let found = hosts_lookup(&text, name);
        if !found.is_empty() {
            return found;
        }
    }
    let mut out: Vec<Ipv4Addr> = match std::net::ToSocketAddrs::to_socket_addrs(&(name, 0)) {
        Ok(addrs) => addrs
            .filter_map(|a| match a.ip() {
                std::net::IpAddr::V4(v4) => Some(v4),
                std::net::IpAddr::V6(_) => None,
            })
            .collect(),
        Err(e) => {
            tracing::warn!(name, error = %e, "a domain of an egress rule does not resolve");
            Vec::new()
        }
    };
    out.sort();
    out.dedup();
    out
}

/// The firewall's state in one runtime process: what the table holds.
#[derive(Debug, Default)]
pub struct Firewall {
    /// Outbound sandboxes, by slot.
    pub sandboxes: BTreeMap<u32, Guarded>,
    /// Each domain any policy names, with its addresses.
    pub resolved: BTreeMap<String, Vec<Ipv4Addr>>,
    /// Whether the table's frame and every sandbox above are written as this process wrote
    /// them (`false` after a failed write: the next change writes the whole table).
    pub written: bool,
}

impl Inner {
    fn firewall_frame<'a>(&'a self, table: &'a str) -> Frame<'a> {
        Frame { table, subnet: self.leases.subnet(), if_prefix: self.leases.if_prefix() }
    }

    /// Adds or replaces sandbox `slot` and writes what changed. Resolves the policy's names it
    /// has not resolved yet. Blocking.
    pub(super) fn firewall_set(
        &self,
        slot: u32,
        host_if: &str,
        policy: &EgressPolicy,
    ) -> Result<(), NetworkError> {
        let missing: Vec<String> = {
            let fw = self.firewall.lock().unwrap_or_else(|p| p.into_inner());
            policy
                .domains()
                .into_iter()
                .filter(|d| !fw.resolved.contains_key(*d))
                .map(str::to_owned)
                .collect()
        };
        let hosts = self.config.egress_hosts.as_deref();
        let found: Vec<(String, Vec<Ipv4Addr>)> =
            missing.into_iter().map(|d| (resolve(&d, hosts), d)).map(|(a, d)| (d, a)).collect();
        let mut fw = self.firewall.lock().unwrap_or_else(|p| p.into_inner());
        for (name, addrs) in found {
            fw.resolved.entry(name).or_insert(addrs);
        }
        let guarded = Guarded { host_if: host_if.to_owned(), policy: policy.clone() };
        let old = fw.sandboxes.insert(slot, guarded.clone());
        if fw.written && old.as_ref() == Some(&guarded) {
            return Ok(());
        }
        let table = network::table_name(&self.config.cgroup_name);
        let servers = host_nameservers();
        let script = if fw.written {
            let old_domains = old.as_ref().map(|g| g.policy.domains()).unwrap_or_default();
            let input = SandboxInput {
                slot,
                guarded: &guarded,
                nameservers: &servers,
                resolved: &fw.resolved,
            };
            sandbox_script(&table, &input, &old_domains)
        } else {
            whole_table(self.firewall_frame(&table), &fw, &servers)
        };
        self.write_firewall(&mut fw, &table, &script)
    }

    /// Forgets sandbox `slot`; deletes the table when it was the last one. Blocking.
    pub(super) fn firewall_forget(&self, slot: u32) -> Result<(), NetworkError> {
        let mut fw = self.firewall.lock().unwrap_or_else(|p| p.into_inner());
        let gone = fw.sandboxes.remove(&slot);
        if fw.sandboxes.is_empty() {
            fw.written = false;
            fw.resolved.clear();
            return network::remove_nat(&self.config.state_dir);
        }
        let Some(gone) = gone else { return Ok(()) };
        if !fw.written {
            return Ok(());
        }
        let table = network::table_name(&self.config.cgroup_name);
        let script = forget_script(&table, slot, &gone.host_if, &gone.policy.domains());
        self.write_firewall(&mut fw, &table, &script)
    }

    /// Resolves every domain again and updates the sets of those whose addresses changed.
    /// Blocking.
    pub(super) fn firewall_refresh(&self) -> Result<(), NetworkError> {
        let names: std::collections::BTreeSet<String> = {
            let fw = self.firewall.lock().unwrap_or_else(|p| p.into_inner());
            fw.sandboxes.values().flat_map(|g| g.policy.domains()).map(str::to_owned).collect()
        };
        if names.is_empty() {
            return Ok(());
        }
        let hosts = self.config.egress_hosts.as_deref();
        let fresh: Vec<(String, Vec<Ipv4Addr>)> =
            names.into_iter().map(|n| (resolve(&n, hosts), n)).map(|(a, n)| (n, a)).collect();
        let mut fw = self.firewall.lock().unwrap_or_else(|p| p.into_inner());
        let table = network::table_name(&self.config.cgroup_name);
        let mut script = String::new();
        for (name, addrs) in fresh {
            if fw.resolved.get(&name) != Some(&addrs) {
                tracing::debug!(name, ?addrs, "a domain of an egress rule resolves anew");
                script.push_str(&refresh_script(&table, &fw.sandboxes, &name, &addrs));
                fw.resolved.insert(name, addrs);
            }
        }
        if script.is_empty() || !fw.written {
            return Ok(());
        }
        self.write_firewall(&mut fw, &table, &script)
    }

    /// Runs `script`; a failure leaves the table to be written whole by the next change.
    fn write_firewall(
        &self,
        fw: &mut Firewall,
        table: &str,
        script: &str,
    ) -> Result<(), NetworkError> {
        fw.written = false;
        network::write_table(&self.config.state_dir, table, script)?;
        fw.written = true;
        tracing::debug!(table, sandboxes = fw.sandboxes.len(), "firewall written");
        Ok(())
    }
}

/// The whole table for `fw`.
fn whole_table(frame: Frame<'_>, fw: &Firewall, nameservers: &[Ipv4Addr]) -> String {
    let inputs: Vec<SandboxInput<'_>> = fw
        .sandboxes
        .iter()
        .map(|(slot, guarded)| SandboxInput {
            slot: *slot,
            guarded,
            nameservers,
            resolved: &fw.resolved,
        })
        .collect();
    table_script(frame, &inputs)
}

/// The nameservers of the host's `/etc/resolv.conf` that sandboxes are given.
fn host_nameservers() -> Vec<Ipv4Addr> {
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    nameservers(&network::resolv_conf(&host))
}

/// [`Runtime::set_egress`](oka_runtime_api::Runtime::set_egress): records `policy` in the
/// sandbox's state file, then writes the table.
pub(super) async fn set_egress(
    inner: &Arc<Inner>,
    id: &SandboxId,
    policy: &EgressPolicy,
) -> Result<(), RuntimeError> {
    let Some(guard) = inner.lock(id, false).await else {
        return Err(RuntimeError::NotFound(id.clone()));
    };
    let inner2 = inner.clone();
    let policy = policy.clone();
    let id2 = id.clone();
    blocking(move || {
        let mut guard = guard;
        let Some(record) = guard.record.as_mut() else {
            return Err(RuntimeError::NotFound(id2));
        };
        let Some(lease) = record.network.clone() else {
            return Err(RuntimeError::Unsupported {
                operation: Operation::Egress,
                reason: format!(
                    "sandbox {id2} is loopback-only (no outbound network): it reaches nothing \
                     to allow or deny; its template needs the annotation \
                     agents.kruise.io/network: outbound"
                ),
            });
        };
        if record.egress.as_ref() != Some(&policy) {
            record.egress = Some(policy.clone());
            inner2.store.write(record).map_err(from_state)?;
        }
        inner2.firewall_set(lease.index, &lease.host_if, &policy).map_err(LocalError::from)?;
        tracing::debug!(id = %id2, ?policy, "egress policy set");
        Ok(())
    })
    .await?
}

/// Resolves the domains of egress rules again every [`REFRESH`] while the runtime lives.
pub(super) fn spawn_refresh(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let result = tokio::task::spawn_blocking(move || inner.firewall_refresh()).await;
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot refresh the egress domain sets"),
                Err(e) => tracing::warn!(error = %e, "the egress refresh task failed"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use oka_runtime_api::{Protocol, egress::EgressRule};

    const FRAME: Frame<'static> =
        Frame { table: "oka_t", subnet: Subnet::DEFAULT, if_prefix: "ok123456" };

    fn chain<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let start = format!("\tchain {name} {{");
        let body = text.split(&start).nth(1).unwrap();
        body.split("\n\t}")
            .next()
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The rules a script adds to `chain`, without the `add rule inet oka_t <chain>` prefix.
    fn rules<'a>(script: &'a str, chain: &str) -> Vec<&'a str> {
        let prefix = format!("add rule inet oka_t {chain} ");
        script.lines().filter_map(|l| l.strip_prefix(prefix.as_str())).collect()
    }

    #[test]
    fn every_host_end_is_kept_off_the_host_and_other_sandboxes() {
        let text = table_script(FRAME, &[]);
        assert!(
            text.starts_with("table inet oka_t {}\ndelete table inet oka_t\ntable inet oka_t {")
        );
        assert_eq!(
            chain(&text, "input")[1..],
            [
                "iifname \"ok123456*\" ct state established,related accept",
                "iifname \"ok123456*\" reject with icmpx type admin-prohibited"
            ]
        );
        assert_eq!(
            chain(&text, "forward")[1..],
            [
                "ip saddr 10.213.0.0/16 ip daddr 10.213.0.0/16 reject with icmpx type admin-prohibited",
                "iifname \"ok123456*\" ct state established,related accept",
                "iifname vmap @sandboxes",
                "iifname \"ok123456*\" reject with icmpx type admin-prohibited",
            ]
        );
        assert!(text.contains("ip saddr 10.213.0.0/16 ip daddr != 10.213.0.0/16 masquerade"));
    }

    #[test]
    fn e2b_rules_compile_in_order_with_allow_first_and_the_lan_closed() {
        let deny = |s: &str| EgressRule::new(EgressAction::Deny, Destination::parse(s).unwrap());
        let allow = |s: &str| EgressRule::new(EgressAction::Allow, Destination::parse(s).unwrap());
        let open = Guarded {
            host_if: "ok1234560000".into(),
            policy: EgressPolicy {
                default: EgressAction::Allow,
                rules: vec![allow("198.51.100.7"), allow("10.1.2.0/24"), deny("198.51.100.0/24")],
            },
        };
        let mut web = allow("api.example");
        web.protocol = Some(Protocol::Tcp);
        web.ports = vec![(443, 443), (8000, 8080)];
        let closed = Guarded {
            host_if: "ok1234560003".into(),
            policy: EgressPolicy { default: EgressAction::Deny, rules: vec![web] },
        };
        let nothing = Guarded { host_if: "ok1234560004".into(), policy: EgressPolicy::deny_all() };
        let resolved =
            BTreeMap::from([("api.example".to_owned(), vec![Ipv4Addr::new(203, 0, 113, 9)])]);
        let ns = [Ipv4Addr::new(10, 255, 255, 53)];
        let input =
            |slot, guarded| SandboxInput { slot, guarded, nameservers: &ns, resolved: &resolved };
        let dns = "ip daddr { 10.255.255.53 } meta l4proto { tcp, udp } th dport 53 accept";

        let script = sandbox_script("oka_t", &input(0, &open), &[]);
        assert!(script.starts_with("add chain inet oka_t sb0\nflush chain inet oka_t sb0\n"));
        assert_eq!(
            rules(&script, "sb0"),
            [
                dns,
                "ip daddr 198.51.100.7/32 ip daddr != @non_public accept",
                "ip daddr 10.1.2.0/24 accept",
                "ip daddr 198.51.100.0/24 reject with icmpx type admin-prohibited",
                "ip daddr @non_public reject with icmpx type admin-prohibited",
                "accept",
            ]
        );
        assert!(
            script.ends_with("add element inet oka_t sandboxes { \"ok1234560000\" : jump sb0 }\n")
        );

        let script = sandbox_script("oka_t", &input(3, &closed), &["gone.example"]);
        let set = domain_set(3, "api.example");
        assert!(script.contains(&format!(
            "add set inet oka_t {set} {{ type ipv4_addr; }}\nflush set inet oka_t {set}\n\
             add element inet oka_t {set} {{ 203.0.113.9 }}\n"
        )));
        assert!(
            script.contains(&format!("delete set inet oka_t {}", domain_set(3, "gone.example")))
        );
        assert_eq!(
            rules(&script, "sb3"),
            [
                dns.to_owned(),
                format!(
                    "ip daddr @{set} ip daddr != @non_public tcp dport {{ 443, 8000-8080 }} accept"
                ),
                "ip daddr @non_public reject with icmpx type admin-prohibited".to_owned(),
                "reject with icmpx type admin-prohibited".to_owned(),
            ]
        );
        // Denied everything: not even DNS.
        assert_eq!(
            rules(&sandbox_script("oka_t", &input(4, &nothing), &[]), "sb4"),
            [
                "ip daddr @non_public reject with icmpx type admin-prohibited",
                "reject with icmpx type admin-prohibited",
            ]
        );
        // The whole table holds every sandbox; a refresh touches the sets of its name only.
        let all = table_script(FRAME, &[input(0, &open), input(3, &closed)]);
        assert!(all.contains("jump sb0") && all.contains("jump sb3"));
        let sandboxes = BTreeMap::from([(0, open.clone()), (3, closed.clone())]);
        assert_eq!(
            refresh_script("oka_t", &sandboxes, "api.example", &[]),
            format!("flush set inet oka_t {set}\n")
        );
        assert_eq!(
            forget_script("oka_t", 3, "ok1234560003", &["api.example"]),
            format!(
                "delete element inet oka_t sandboxes {{ \"ok1234560003\" }}\n\
                 flush chain inet oka_t sb3\ndelete chain inet oka_t sb3\n\
                 delete set inet oka_t {set}\n"
            )
        );
    }

    #[test]
    fn names_come_from_a_hosts_file_and_nameservers_from_resolv_conf() {
        let hosts =
            "# x\n203.0.113.5 api.example api\n::1 api.example\n203.0.113.6\tAPI.example # c\n";
        assert_eq!(
            hosts_lookup(hosts, "api.example"),
            [Ipv4Addr::new(203, 0, 113, 5), Ipv4Addr::new(203, 0, 113, 6)]
        );
        assert!(hosts_lookup(hosts, "other.example").is_empty());
        assert_eq!(
            nameservers("nameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\n"),
            [Ipv4Addr::new(10, 0, 0, 2)]
        );
    }
}
