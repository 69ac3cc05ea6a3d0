//! Outbound networking: a veth pair and NAT for sandboxes whose spec asks for
//! [`NetworkMode::Outbound`](oka_runtime_api::NetworkMode::Outbound). Loopback-only stays the default and
//! needs none of this (nor `ip` or `nft` on the host).
//!
//! Layout, per runtime: a private IPv4 subnet ([`Subnet`], default [`Subnet::DEFAULT`],
//! `10.213.0.0/16`, configurable as [`LocalConfig::outbound_subnet`](super::LocalConfig)) cut into
//! `/30` slots. Sandbox slot `n` is `base + 4n`: the host end of its veth pair gets `base + 4n + 1`,
//! the sandbox end (`eth0`) `base + 4n + 2`, and the sandbox's default route goes via the host end.
//! No bridge: each pair is a point-to-point link with its own connected route, so there is no
//! shared device to create, recover or clean up. One nftables table per runtime, `inet oka_<cgroup
//! name>` (so two runtimes on one machine never touch each other's rules), masquerades traffic
//! from the subnet to anything outside it, keeps sandboxes off the host and each other, and
//! holds each sandbox's egress policy (`egress.rs`); `net.ipv4.ip_forward` is switched on (never
//! off again: other users of the host may rely on it).
//!
//! Expected flow:
//! 1. `ensure` (create) takes the lowest free slot ([`Leases`]) and records the [`NetworkLease`]
//!    in the sandbox's state file before anything uses it; the lease lives as long as the
//!    sandbox (stop, hibernate and restore keep the same addresses) and is freed with its record;
//! 2. each start records the host end as [`Resource::Veth`](super::state::Resource::Veth) of the
//!    instance, writes the state file, and only then ([`attach`]) creates the pair straight into
//!    the init's network namespace (before the init is sent its plans, so the command finds its
//!    network up), addresses and raises both ends and adds the default route;
//! 3. releasing an instance (stop, delete, failed start, cleanup in `open`) deletes the host end
//!    ([`detach`]; the kernel removes the peer with it, and a missing link is success);
//! 4. the nftables table is (re)written atomically when `open` finds outbound sandboxes, before
//!    each start of one whose chain it lacks, and on every policy change (`egress.rs`); its name
//!    is written to `<state>/nftables-table` before it is created; deleting the last outbound
//!    sandbox deletes the table, and so does `open` when no sandbox holds a lease any more.
//!
//! Hibernate: CRIU dumps `eth0` (its addresses and routes) with the namespace; the host end dies
//! with the namespace. Restore passes `--external veth[eth0]:<host end>` so CRIU recreates the
//! pair with the recorded host-end name (a recorded resource before the restore runs), and
//! [`configure_host_end`] then addresses and raises it. A clone (`snapshot.rs`) is restored from
//! its source's images the same way with a lease of its own: [`readdress`] first moves `eth0`
//! from the source's address to the clone's, so the clone never uses the source's address.
//!
//! Why `ip` and `nft` as subprocesses rather than netlink: two `ip -batch` runs per start (one on
//! the host, one in the sandbox's namespace) cost a few milliseconds, need no netlink message code
//! of our own and are easy to check by hand with the same commands; the nftables ruleset is only
//! written when it changes. A netlink socket made inside the namespace (as `connect.rs` makes TCP
//! sockets) would save the two `execve`s if create-to-ready of outbound sandboxes ever matters.
//!
//! Caveats: two runtimes on one
//! machine need different subnets. A host firewall whose FORWARD policy drops (Docker sets one)
//! drops sandbox traffic too, whatever our table accepts.

use std::collections::BTreeSet;
use std::fmt;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Name of the veth end inside every outbound sandbox.
pub const SANDBOX_IF: &str = "eth0";

/// File under the state directory naming the runtime's nftables table while it may exist.
pub const TABLE_MARKER: &str = "nftables-table";

/// File under the state directory naming the subnet [`claim_subnet`] chose for it; `open` takes
/// the subnet from it when it exists (the sandboxes' leases were cut from it).
pub const SUBNET_FILE: &str = "outbound-subnet";

/// Where [`claim_subnet`] records which state directory holds which subnet.
pub const SUBNET_REGISTRY: &str = "/run/oka/subnets";

/// A `/16` for the runtime on `state_dir` that no other live runtime of this machine holds, so
/// several runtimes (several `oka serve` on one machine, as tests start them) never share
/// addresses: the one recorded in `<state_dir>/outbound-subnet` if any, else the first of
/// `10.213.0.0/16` to `10.254.0.0/16` whose claim file in `registry` is missing, names
/// `state_dir`, or names a directory that no longer exists. Blocking.
pub fn claim_subnet(state_dir: &Path, registry: &Path) -> Result<Subnet, NetworkError> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| NetworkError::Io { op, path, source }
    };
    std::fs::create_dir_all(state_dir).map_err(io("create", state_dir))?;
    std::fs::create_dir_all(registry).map_err(io("create", registry))?;
    let me = std::fs::canonicalize(state_dir).map_err(io("resolve", state_dir))?;
    let recorded = state_dir.join(SUBNET_FILE);
    if let Ok(text) = std::fs::read_to_string(&recorded)
        && let Ok(subnet) = text.trim().parse::<Subnet>()
    {
        let claim = registry.join(subnet.to_string().replace('/', "-"));
        std::fs::write(&claim, me.as_os_str().as_encoded_bytes()).map_err(io("write", &claim))?;
        return Ok(subnet);
    }
    for octet in 213..=254u8 {
        let subnet = Subnet { addr: Ipv4Addr::new(10, octet, 0, 0), prefix: 16 };
        let claim = registry.join(subnet.to_string().replace('/', "-"));
        let mine = match std::fs::OpenOptions::new().write(true).create_new(true).open(&claim) {
            Ok(mut file) => {
                file.write_all(me.as_os_str().as_encoded_bytes()).map_err(io("write", &claim))?;
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read(&claim).unwrap_or_default();
                let holder = PathBuf::from(String::from_utf8_lossy(&holder).into_owned());
                let free = holder == me || !holder.join(SUBNET_FILE).exists();
                if free {
                    std::fs::write(&claim, me.as_os_str().as_encoded_bytes())
                        .map_err(io("write", &claim))?;
                }
                free
            }
            Err(e) => return Err(io("create", &claim)(e)),
        };
        if mine {
            std::fs::write(&recorded, subnet.to_string()).map_err(io("write", &recorded))?;
            return Ok(subnet);
        }
    }
    Err(NetworkError::Exhausted(Subnet::DEFAULT))
}

/// The subnet recorded in `<state_dir>/outbound-subnet`, if any.
pub fn recorded_subnet(state_dir: &Path) -> Option<Subnet> {
    std::fs::read_to_string(state_dir.join(SUBNET_FILE)).ok()?.trim().parse().ok()
}

/// Why a network operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The subnet cannot be used.
    #[error("invalid outbound subnet {0:?}: use an IPv4 network a.b.c.d/len with len 8..=28")]
    InvalidSubnet(String),
    /// Every `/30` slot of the subnet is taken.
    #[error("outbound subnet {0} is full")]
    Exhausted(Subnet),
    /// A tool (`ip`, `nft`) could not be run.
    #[error(
        "cannot run {tool}: {source}; outbound-network is off on this machine: to turn it on: {}",
        oka_runtime_api::features::ENABLE_NETWORK_TOOLS
    )]
    Spawn {
        /// The tool.
        tool: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A tool ran and failed.
    #[error("{tool} {what} failed: {stderr}")]
    Failed {
        /// The tool.
        tool: &'static str,
        /// What it was asked.
        what: String,
        /// Its error output.
        stderr: String,
    },
    /// A file could not be written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// An IPv4 network (`10.213.0.0/16`) that outbound sandboxes get their addresses from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subnet {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Subnet {
    /// The default, `10.213.0.0/16`: private (RFC 1918), and clear of the usual defaults of
    /// Docker (`172.17.0.0/16`), Podman (`10.88.0.0/16`) and Kubernetes pods and services
    /// (`10.244.0.0/16`, `10.96.0.0/12`). 16384 sandboxes.
    pub const DEFAULT: Subnet = Subnet { addr: Ipv4Addr::new(10, 213, 0, 0), prefix: 16 };

    /// The network `addr/prefix`; `addr` must be the network's first address, `prefix` 8..=28.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Result<Self, NetworkError> {
        let bad = || NetworkError::InvalidSubnet(format!("{addr}/{prefix}"));
        if !(8..=28).contains(&prefix) {
            return Err(bad());
        }
        if u32::from(addr) & !mask(prefix) != 0 {
            return Err(bad());
        }
        Ok(Self { addr, prefix })
    }

    /// Number of sandboxes the subnet holds (one `/30` each).
    pub fn slots(&self) -> u32 {
        1 << (30 - self.prefix)
    }

    /// The addresses of slot `index` (< [`slots`](Self::slots)).
    fn slot(&self, index: u32) -> (Ipv4Addr, Ipv4Addr) {
        let base = u32::from(self.addr) + 4 * index;
        (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
    }
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Subnet {
    type Err = NetworkError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || NetworkError::InvalidSubnet(s.to_owned());
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        Self::new(addr, prefix).map_err(|_| bad())
    }
}

/// A sandbox's slot in the subnet, recorded in its state file for the sandbox's lifetime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkLease {
    /// The slot number.
    pub index: u32,
    /// Name of the veth pair's host end.
    pub host_if: String,
    /// Address of the host end (the sandbox's gateway), `/30`.
    pub host_addr: Ipv4Addr,
    /// Address of the sandbox's `eth0`, `/30`.
    pub sandbox_addr: Ipv4Addr,
}

/// The slots in use in one runtime, so concurrent creates never take the same one.
#[derive(Debug)]
pub struct Leases {
    subnet: Subnet,
    /// Prefix of host-end names: `ok` and six hex digits of a hash of the cgroup name, so two
    /// runtimes' links do not collide (interface names have at most 15 bytes).
    prefix: String,
    used: Mutex<BTreeSet<u32>>,
}

impl Leases {
    /// An empty table for `subnet`, naming links after `cgroup_name`.
    pub fn new(subnet: Subnet, cgroup_name: &str) -> Self {
        Self { subnet, prefix: if_prefix(cgroup_name), used: Mutex::new(BTreeSet::new()) }
    }

    /// The subnet.
    pub fn subnet(&self) -> Subnet {
        self.subnet
    }

    /// Marks a recovered lease as taken.
    pub fn adopt(&self, lease: &NetworkLease) {
        self.used.lock().unwrap_or_else(|p| p.into_inner()).insert(lease.index);
    }

    /// Takes the lowest free slot.
    pub fn take(&self) -> Result<NetworkLease, NetworkError> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let index = (0..self.subnet.slots())
            .find(|i| !used.contains(i))
            .ok_or(NetworkError::Exhausted(self.subnet))?;
        used.insert(index);
        let (host_addr, sandbox_addr) = self.subnet.slot(index);
        Ok(NetworkLease {
            index,
            host_if: format!("{}{index:04x}", self.prefix),
            host_addr,
            sandbox_addr,
        })
    }

    /// Frees a slot.
    pub fn release(&self, lease: &NetworkLease) {
        self.used.lock().unwrap_or_else(|p| p.into_inner()).remove(&lease.index);
    }

    /// The prefix every host-end name of this runtime starts with.
    pub fn if_prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether any slot is taken.
    pub fn any(&self) -> bool {
        !self.used.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }
}

/// `ok` + six hex digits of FNV-1a of `name`.
fn if_prefix(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("ok{:06x}", h & 0x00ff_ffff)
}

/// The runtime's nftables table name for `cgroup_name`: `oka_` and the name with every character
/// outside `[A-Za-z0-9_]` replaced by `_`.
pub fn table_name(cgroup_name: &str) -> String {
    let clean: String = cgroup_name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    format!("oka_{clean}")
}

/// Writes the runtime's table with `script` (an atomic replacement, see `egress.rs`), recording
/// its name in `<state_dir>/nftables-table` first, and switches on IPv4 forwarding. Blocking;
/// idempotent.
pub fn write_table(state_dir: &Path, table: &str, script: &str) -> Result<(), NetworkError> {
    let marker = state_dir.join(TABLE_MARKER);
    std::fs::write(&marker, table).map_err(|source| NetworkError::Io {
        op: "write",
        path: marker.clone(),
        source,
    })?;
    run("nft", &["-f", "-"], script, None, "write the firewall table")?;
    let forward = Path::new("/proc/sys/net/ipv4/ip_forward");
    if std::fs::read_to_string(forward).map(|s| s.trim() != "1").unwrap_or(true) {
        tracing::debug!("sysctl net.ipv4.ip_forward=1");
        std::fs::write(forward, "1").map_err(|source| NetworkError::Io {
            op: "write",
            path: forward.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Deletes the table named in `<state_dir>/nftables-table`, if that file exists, then the file.
/// Blocking.
pub fn remove_nat(state_dir: &Path) -> Result<(), NetworkError> {
    let marker = state_dir.join(TABLE_MARKER);
    let Ok(table) = std::fs::read_to_string(&marker) else { return Ok(()) };
    let table = table.trim();
    delete_table(table)?;
    tracing::debug!(table, "firewall table removed");
    std::fs::remove_file(&marker).map_err(|source| NetworkError::Io {
        op: "remove",
        path: marker.clone(),
        source,
    })
}

/// Deletes the runtime's table `table` (family `inet`; and an `ip` table of that name, which
/// runtimes before egress policies wrote); a missing table is success. Blocking.
pub fn delete_table(table: &str) -> Result<(), NetworkError> {
    for family in ["inet", "ip"] {
        match run("nft", &["delete", "table", family, table], "", None, "delete firewall table") {
            Ok(()) => {}
            Err(NetworkError::Failed { stderr, .. }) if stderr.contains("No such file") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates the veth pair of `lease` with its peer as `eth0` in the network namespace of the init
/// behind `pidfd` (host pid `pid`), and configures both ends. Blocking (two `ip` runs).
pub fn attach(lease: &NetworkLease, pid: i32, pidfd: BorrowedFd<'_>) -> Result<(), NetworkError> {
    let h = &lease.host_if;
    let host = format!(
        "link add {h} type veth peer name {SANDBOX_IF} netns {pid}\n\
         addr add {}/30 dev {h}\n\
         link set {h} up\n",
        lease.host_addr
    );
    run("ip", &["-batch", "-"], &host, None, "create veth pair")?;
    let inside = format!(
        "addr add {}/30 dev {SANDBOX_IF}\n\
         link set {SANDBOX_IF} up\n\
         route add default via {}\n",
        lease.sandbox_addr, lease.host_addr
    );
    run("ip", &["-batch", "-"], &inside, Some(pidfd), "configure sandbox eth0")
}

/// Addresses and raises the host end of a pair CRIU recreated on restore. Blocking.
pub fn configure_host_end(lease: &NetworkLease) -> Result<(), NetworkError> {
    let h = &lease.host_if;
    let script = format!("addr add {}/30 dev {h}\nlink set {h} up\n", lease.host_addr);
    run("ip", &["-batch", "-"], &script, None, "configure restored veth")
}

/// Gives the `eth0` CRIU restored in the network namespace of the init behind `pidfd` the
/// addresses of `lease`: a clone's images hold the address and default route of the sandbox
/// they were taken of. Every IPv4 address of `eth0` goes (sockets bound to the old address stay
/// bound and receive nothing; those on `0.0.0.0` carry on), then the lease's address and
/// default route are set. Blocking (one `ip` run in the sandbox's namespace).
pub fn readdress(lease: &NetworkLease, pidfd: BorrowedFd<'_>) -> Result<(), NetworkError> {
    run("ip", &["-4", "-batch", "-"], &readdress_script(lease), Some(pidfd), "readdress eth0")
}

fn readdress_script(lease: &NetworkLease) -> String {
    format!(
        "addr flush dev {SANDBOX_IF}\n\
         addr add {}/30 dev {SANDBOX_IF}\n\
         link set {SANDBOX_IF} up\n\
         route replace default via {}\n",
        lease.sandbox_addr, lease.host_addr
    )
}

/// The name of the `ifb` device that carries what the sandbox behind host end `host_if` sends
/// to its egress limit: the host end's name with `ok` made `ob` (host ends all start `ok`).
pub fn ifb_name(host_if: &str) -> String {
    format!("ob{}", host_if.get(2..).unwrap_or_default())
}

/// Bytes a token bucket of `bits_per_second` may send at once: 50 ms of traffic, at least
/// 128 KiB (more than one segmentation-offloaded packet, which a smaller bucket must cut up).
fn burst_bytes(bits_per_second: u64) -> u64 {
    (bits_per_second / 8 / 20).max(128 * 1024)
}

/// The `tc` commands that limit the traffic of the sandbox behind host end `host_if`, as the
/// CNI bandwidth plugin does on a pod's host-side veth: what the sandbox receives leaves the
/// host end, so a token bucket (`tbf`) is its root qdisc; what it sends arrives on the host
/// end, so the ingress qdisc redirects it to its `ifb` device ([`ifb_name`]), whose root is
/// the egress token bucket (a queue that paces, rather than a policer that drops, so TCP
/// settles at the limit). There is no prioritisation: a direction kept full delays the
/// acknowledgements of the other's connections by up to the queue's 200 ms. Pure.
pub fn shaping_script(host_if: &str, bandwidth: &oka_runtime_api::Bandwidth) -> String {
    let bucket = |dev: &str, rate: u64| {
        format!(
            "qdisc replace dev {dev} root tbf rate {rate}bit burst {} latency 200ms\n",
            burst_bytes(rate)
        )
    };
    let mut out = String::new();
    if let Some(rate) = bandwidth.ingress_bits_per_second {
        out.push_str(&bucket(host_if, rate));
    }
    if let Some(rate) = bandwidth.egress_bits_per_second {
        let ifb = ifb_name(host_if);
        out.push_str(&format!("qdisc replace dev {host_if} handle ffff: ingress\n"));
        out.push_str(&format!(
            "filter replace dev {host_if} parent ffff: protocol all prio 1 u32 match u32 0 0 \
             action mirred egress redirect dev {ifb}\n"
        ));
        out.push_str(&bucket(&ifb, rate));
    }
    out
}

/// Limits the traffic of the sandbox behind `lease` to `bandwidth` (nothing to do when
/// unlimited). Blocking (an `ip` and a `tc` run).
pub fn shape(
    lease: &NetworkLease,
    bandwidth: &oka_runtime_api::Bandwidth,
) -> Result<(), NetworkError> {
    if bandwidth.is_unlimited() {
        return Ok(());
    }
    if bandwidth.egress_bits_per_second.is_some() {
        let ifb = ifb_name(&lease.host_if);
        if !link_exists(&ifb) {
            let script = format!("link add {ifb} type ifb\nlink set {ifb} up\n");
            run("ip", &["-batch", "-"], &script, None, "create the egress limit's ifb device")?;
        }
    }
    let script = shaping_script(&lease.host_if, bandwidth);
    run("tc", &["-batch", "-"], &script, None, "limit the sandbox's bandwidth")
}

/// Deletes the host end `name` (and with it the peer) and its egress limit's `ifb` device; a
/// missing link is success (checked in
/// `/sys/class/net` first, which saves an `ip` run when the kernel already removed the pair with
/// the sandbox's namespace). Blocking.
pub fn detach(name: &str) -> Result<(), NetworkError> {
    let ifb = ifb_name(name);
    if link_exists(&ifb) {
        match run("ip", &["link", "del", &ifb], "", None, "delete ifb") {
            Ok(()) => {}
            Err(NetworkError::Failed { stderr, .. }) if stderr.contains("Cannot find device") => {}
            Err(e) => return Err(e),
        }
    }
    if !link_exists(name) {
        return Ok(());
    }
    match run("ip", &["link", "del", name], "", None, "delete veth") {
        Ok(()) => Ok(()),
        Err(NetworkError::Failed { stderr, .. }) if stderr.contains("Cannot find device") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether a link named `name` exists in the host's network namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// `/etc/resolv.conf` for an outbound sandbox: the host's nameservers (loopback ones dropped:
/// they are the host's own resolver, out of the sandbox's reach), its `search` and `options`.
pub fn resolv_conf(host: &str) -> String {
    let mut out = String::from("# generated by oka for an outbound sandbox\n");
    for line in host.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                let Some(addr) = words.next() else { continue };
                let loopback =
                    addr.parse::<std::net::IpAddr>().map(|a| a.is_loopback()).unwrap_or(true);
                if !loopback {
                    out.push_str(&format!("nameserver {addr}\n"));
                }
            }
            Some("search" | "options") => {
                out.push_str(line.trim());
                out.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// Writes [`resolv_conf`] of the host's `/etc/resolv.conf` into a fresh writable layer (whose
/// `etc` exists). Blocking.
pub fn write_resolv_conf(upper: &Path) -> Result<(), NetworkError> {
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let path = upper.join("etc/resolv.conf");
    std::fs::write(&path, resolv_conf(&host)).map_err(|source| NetworkError::Io {
        op: "write",
        path,
        source,
    })
}

/// Runs `tool args` with `stdin` as input, in the network namespace of `netns` (a pidfd) if
/// given; an unsuccessful exit is [`NetworkError::Failed`] with its stderr.
fn run(
    tool: &'static str,
    args: &[&str],
    stdin: &str,
    netns: Option<BorrowedFd<'_>>,
    what: &str,
) -> Result<(), NetworkError> {
    tracing::debug!(tool, ?args, stdin, in_sandbox = netns.is_some(), "{what}");
    let mut cmd = Command::new(tool);
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    if let Some(fd) = netns {
        let raw = fd.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and makes one syscall
        // (setns), which is async-signal-safe; `raw` stays open until exec (the caller borrows it
        // for the whole call).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(raw, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(|source| NetworkError::Spawn { tool, source })?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).map_err(|source| NetworkError::Spawn { tool, source })?;
    }
    let out = child.wait_with_output().map_err(|source| NetworkError::Spawn { tool, source })?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetworkError::Failed {
        tool,
        what: what.to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_cut_into_slots() {
        let s: Subnet = "10.213.0.0/16".parse().unwrap();
        assert_eq!(s, Subnet::DEFAULT);
        assert_eq!(s.slots(), 16384);
        assert_eq!(s.slot(0), (Ipv4Addr::new(10, 213, 0, 1), Ipv4Addr::new(10, 213, 0, 2)));
        assert_eq!(s.slot(65), (Ipv4Addr::new(10, 213, 1, 5), Ipv4Addr::new(10, 213, 1, 6)));
        for bad in ["10.213.0.1/16", "10.0.0.0/30", "10.0.0.0/4", "10.0.0.0", "x/16"] {
            assert!(bad.parse::<Subnet>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn leases_take_the_lowest_free_slot_and_never_twice() {
        let leases = Leases::new("192.168.50.0/28".parse().unwrap(), "oka");
        let a = leases.take().unwrap();
        let b = leases.take().unwrap();
        assert_eq!((a.index, b.index), (0, 1));
        assert_ne!(a.host_if, b.host_if);
        assert!(a.host_if.len() <= 15);
        assert_eq!(b.sandbox_addr, Ipv4Addr::new(192, 168, 50, 6));
        leases.release(&a);
        assert_eq!(leases.take().unwrap().index, 0);
        leases.take().unwrap();
        leases.take().unwrap();
        assert!(matches!(leases.take(), Err(NetworkError::Exhausted(_))));
        // Another runtime's links get other names.
        assert_ne!(Leases::new(Subnet::DEFAULT, "oka-b").take().unwrap().host_if, a.host_if);
    }

    #[test]
    fn resolv_conf_keeps_reachable_nameservers_only() {
        let host = "# comment\nnameserver 127.0.0.53\nnameserver 10.255.255.53\nnameserver ::1\n\
                    search example.internal\noptions edns0\n";
        assert_eq!(
            resolv_conf(host),
            "# generated by oka for an outbound sandbox\nnameserver 10.255.255.53\n\
             search example.internal\noptions edns0\n"
        );
    }

    #[test]
    fn each_state_directory_claims_a_subnet_of_its_own_and_keeps_it() {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join("registry");
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        let sa = claim_subnet(&a, &registry).unwrap();
        let sb = claim_subnet(&b, &registry).unwrap();
        assert_eq!(sa, Subnet::DEFAULT);
        assert_eq!(sb.to_string(), "10.214.0.0/16");
        assert_eq!(claim_subnet(&a, &registry).unwrap(), sa, "kept across starts");
        assert_eq!(recorded_subnet(&b), Some(sb));
        // A claim whose state directory is gone is free again.
        std::fs::remove_dir_all(&a).unwrap();
        assert_eq!(claim_subnet(&root.path().join("c"), &registry).unwrap(), sa);
    }

    #[test]
    fn shaping_limits_both_directions_on_the_host_end() {
        let limits = oka_runtime_api::Bandwidth {
            egress_bits_per_second: Some(10_000_000),
            ingress_bits_per_second: Some(80_000),
        };
        let script = shaping_script("ok12345600a1", &limits);
        assert_eq!(
            script.lines().collect::<Vec<_>>(),
            [
                "qdisc replace dev ok12345600a1 root tbf rate 80000bit burst 131072 latency 200ms",
                "qdisc replace dev ok12345600a1 handle ffff: ingress",
                "filter replace dev ok12345600a1 parent ffff: protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev ob12345600a1",
                "qdisc replace dev ob12345600a1 root tbf rate 10000000bit burst 131072 latency 200ms",
            ]
        );
        assert_eq!(shaping_script("ok1", &oka_runtime_api::Bandwidth::default()), "");
    }

    #[test]
    fn a_clone_readdresses_eth0_before_its_default_route() {
        let lease = NetworkLease {
            index: 1,
            host_if: "ok123456-1".into(),
            host_addr: Ipv4Addr::new(10, 213, 0, 5),
            sandbox_addr: Ipv4Addr::new(10, 213, 0, 6),
        };
        assert_eq!(
            readdress_script(&lease),
            "addr flush dev eth0\naddr add 10.213.0.6/30 dev eth0\nlink set eth0 up\n\
             route replace default via 10.213.0.5\n"
        );
    }

    #[test]
    fn table_names_are_nft_identifiers() {
        assert_eq!(table_name("oka-test-net.x"), "oka_oka_test_net_x");
    }
}
