//! Outbound networking of local sandboxes: veth pair, default route, NAT, DNS, cleanup, and
//! hibernation, against the real kernel (as root).
//!
//! No packet leaves the machine: the only peers are listeners on the host end of a sandbox's veth
//! and a "fake internet" network namespace the test creates itself (its own veth and a TEST-NET-2
//! subnet, `198.51.100.0/30`, routed only to that namespace). Every test uses its own outbound
//! subnet and cgroup name, so tests running in parallel never share addresses or NAT tables.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::time::Duration;

use common::*;
use oka_runtime::local::network::{NetworkLease, Subnet, link_exists, table_name};
use oka_runtime::local::{LocalConfig, LocalRuntime};
use oka_runtime_api::{EgressPolicy, NetworkMode, Runtime, SandboxSpec};

/// Deletes a runtime's NAT table when the test ends, also when it fails (a runtime that is not
/// opened again on its state directory leaves its table behind by design).
struct TableGuard(String);

impl Drop for TableGuard {
    fn drop(&mut self) {
        let _ = Command::new("nft").args(["delete", "table", "inet", &self.0]).output();
    }
}

/// A runtime whose outbound sandboxes get addresses from `10.<octet>.0.0/16`.
async fn runtime_on(
    name: &str,
    octet: u8,
) -> (LocalRuntime, tempfile::TempDir, LocalConfig, TableGuard) {
    let dir = tempfile::Builder::new().prefix("oka-net-").tempdir().unwrap();
    let mut config = config(dir.path().join("state"), name);
    config.outbound_subnet = Subnet::new(Ipv4Addr::new(10, octet, 0, 0), 16).unwrap();
    let guard = TableGuard(table_name(&config.cgroup_name));
    let rt = LocalRuntime::open(config.clone()).await.unwrap();
    (rt, dir, config, guard)
}

/// `sh -c script` with outbound networking.
fn outbound(id: &str, script: &str) -> SandboxSpec {
    let mut spec = sh(id, script);
    spec.network = NetworkMode::Outbound;
    spec
}

/// A shell script that tries a TCP connection to `addr:port` from inside the sandbox, sends
/// `hello`, writes `connected <local address>` or the error's class to `/root/out`, then `END`,
/// and sleeps.
fn connect_script(addr: Ipv4Addr, port: u16) -> String {
    format!(
        "python3 -c 'import socket\ns = socket.socket(); s.settimeout(5)\ntry:\n    s.connect((\"{addr}\", {port})); s.sendall(b\"hello\"); print(\"connected\", s.getsockname()[0])\nexcept OSError as e:\n    print(type(e).__name__)' > /root/out 2>&1; \
         echo END >> /root/out; exec sleep 1000"
    )
}

/// Accepts one connection on `listener` within 20 s; returns the peer address and what it sent.
fn accept_one(listener: TcpListener) -> std::thread::JoinHandle<Option<(Ipv4Addr, String)>> {
    std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            match listener.accept() {
                Ok((mut stream, peer)) => {
                    stream.set_nonblocking(false).unwrap();
                    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut buf = String::new();
                    let _ = stream.read_to_string(&mut buf);
                    let std::net::IpAddr::V4(ip) = peer.ip() else { return None };
                    return Some((ip, buf));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() > deadline {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return None,
            }
        }
    })
}

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().unwrap()
}

fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A network namespace standing in for the internet, joined to the host by a veth pair with
/// `198.51.100.1/30` on the host and `198.51.100.2/30` inside (or the `/30` a test chooses),
/// and more addresses of its own routed from the host. Removed on drop, also when the test
/// fails.
struct FakeInternet {
    netns: String,
    host_if: String,
    inside: Ipv4Addr,
    extra: Vec<Ipv4Addr>,
}

impl FakeInternet {
    const HOST: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
    const INSIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);

    fn new() -> Self {
        Self::with(Ipv4Addr::new(198, 51, 100, 0), &[])
    }

    /// Host `link + 1`, inside `link + 2` (a `/30`), and `extra` addresses inside, each routed
    /// from the host via the link.
    fn with(link: Ipv4Addr, extra: &[Ipv4Addr]) -> Self {
        let pid = std::process::id();
        let (host, inside) =
            (Ipv4Addr::from(u32::from(link) + 1), Ipv4Addr::from(u32::from(link) + 2));
        let me = Self {
            netns: format!("oka-inet-{pid}"),
            host_if: format!("okinet{}", pid % 100_000),
            inside,
            extra: extra.to_vec(),
        };
        ip_ok(&["netns", "add", &me.netns]);
        ip_ok(&[
            "link",
            "add",
            &me.host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &me.netns,
        ]);
        ip_ok(&["addr", "add", &format!("{host}/30"), "dev", &me.host_if]);
        ip_ok(&["link", "set", &me.host_if, "up"]);
        ip_ok(&["-n", &me.netns, "addr", "add", &format!("{inside}/30"), "dev", "eth0"]);
        ip_ok(&["-n", &me.netns, "link", "set", "eth0", "up"]);
        ip_ok(&["-n", &me.netns, "link", "set", "lo", "up"]);
        for a in extra {
            ip_ok(&["-n", &me.netns, "addr", "add", &format!("{a}/32"), "dev", "lo"]);
            ip_ok(&["route", "add", &format!("{a}/32"), "via", &inside.to_string()]);
        }
        me
    }

    /// A TCP listener inside the namespace (the socket is made there; the thread goes back).
    fn listen(&self) -> TcpListener {
        self.listen_on(self.inside)
    }

    /// A TCP listener on `addr` inside the namespace.
    fn listen_on(&self, addr: Ipv4Addr) -> TcpListener {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.netns)).unwrap();
        let own = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let name = self.netns.clone();
        std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            let l = TcpListener::bind((addr, 0)).unwrap_or_else(|e| panic!("{name}: {e}"));
            drop(own);
            l
        })
        .join()
        .unwrap()
    }
}

impl FakeInternet {
    /// A UDP socket on `addr` inside the namespace that echoes every datagram, forever.
    fn echo_udp_on(&self, addr: Ipv4Addr) -> u16 {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.netns)).unwrap();
        let socket = std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            std::net::UdpSocket::bind((addr, 0)).unwrap()
        })
        .join()
        .unwrap();
        let port = socket.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(&buf[..n], from);
            }
        });
        port
    }
}

impl Drop for FakeInternet {
    fn drop(&mut self) {
        for a in &self.extra {
            let _ = ip(&["route", "del", &format!("{a}/32")]);
        }
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

async fn lease(rt: &LocalRuntime, id: &str) -> NetworkLease {
    rt.network(&id_of(id)).await.expect("an outbound sandbox has a lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_an_outbound_nor_a_loopback_sandbox_reaches_the_host() {
    if !root_or_skip("neither_an_outbound_nor_a_loopback_sandbox_reaches_the_host") {
        return;
    }
    let (rt, _dir, _, _table) = runtime_on("net-host-end", 214).await;
    // The outbound sandbox first, idle, to learn its host-end address.
    let idle = outbound("out-idle", "exec sleep 1000");
    rt.ensure(&idle).await.unwrap();
    let l = lease(&rt, "out-idle").await;
    assert!(link_exists(&l.host_if), "host end {} exists", l.host_if);
    let listener = TcpListener::bind((l.host_addr, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();

    // A loopback sandbox cannot reach it (nor any non-loopback address: it has no route).
    let lo = sh("lo-only", &connect_script(l.host_addr, port));
    rt.ensure(&lo).await.unwrap();
    let out = wait_for_file(&rt, &lo.id, "/root/out", "END").await;
    assert!(out.starts_with("OSError") || out.contains("Unreachable"), "{out}");
    assert!(!out.contains("connected"), "{out}");
    assert!(rt.network(&lo.id).await.is_none());
    let resolv = read_upper(&rt, &lo.id, "/etc/resolv.conf").await;
    assert!(resolv.is_none(), "a loopback sandbox keeps the template's resolv.conf");

    // Nor does an outbound sandbox: the host's listeners are closed to every host end.
    let out_spec = outbound("out-conn", &connect_script(l.host_addr, port));
    rt.ensure(&out_spec).await.unwrap();
    let l2 = lease(&rt, "out-conn").await;
    assert_ne!(l2.index, l.index, "two sandboxes never share a slot");
    let out = wait_for_file(&rt, &out_spec.id, "/root/out", "END").await;
    assert!(!out.contains("connected"), "{out}");
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "nothing reached the host's listener");
    let resolv = read_upper(&rt, &out_spec.id, "/etc/resolv.conf").await.unwrap();
    assert!(resolv.starts_with("# generated by oka"), "{resolv}");

    // The port is still reached through `connect` as for any sandbox, and delete leaves no link.
    for id in [&idle.id, &lo.id, &out_spec.id] {
        rt.delete(id).await.unwrap();
    }
    assert!(!link_exists(&l.host_if) && !link_exists(&l2.host_if), "veths removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbound_sandbox_reaches_a_fake_internet_through_nat() {
    if !root_or_skip("an_outbound_sandbox_reaches_a_fake_internet_through_nat") {
        return;
    }
    let inet = FakeInternet::new();
    let listener = inet.listen();
    let port = listener.local_addr().unwrap().port();
    let accepted = accept_one(listener);
    let (rt, _dir, config, _table) = runtime_on("net-nat", 215).await;
    let spec = outbound("nat", &connect_script(FakeInternet::INSIDE, port));
    rt.ensure(&spec).await.unwrap();
    let l = lease(&rt, "nat").await;
    let out = wait_for_file(&rt, &spec.id, "/root/out", "END").await;
    assert_eq!(out, format!("connected {}\nEND\n", l.sandbox_addr));
    let (peer, data) = accepted.join().unwrap().expect("the fake internet was reached");
    assert_eq!(data, "hello");
    assert_eq!(peer, FakeInternet::HOST, "the source was masqueraded to the host's address");

    // The NAT table is the runtime's own, and goes when no outbound sandbox is left.
    let table = table_name(&config.cgroup_name);
    let listed = Command::new("nft").args(["list", "table", "inet", &table]).output().unwrap();
    assert!(listed.status.success(), "table {table} exists");
    rt.delete(&spec.id).await.unwrap();
    assert!(!link_exists(&l.host_if));
    let listed = Command::new("nft").args(["list", "table", "inet", &table]).output().unwrap();
    assert!(!listed.status.success(), "table {table} removed with the last outbound sandbox");
}

/// `GET /` from `addr:port` over the host's routes (here: the veth), if it answers 200.
fn get_over_veth(addr: Ipv4Addr, port: u16) -> Option<String> {
    use std::io::Write;
    let mut s =
        std::net::TcpStream::connect_timeout(&(addr, port).into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /marker HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.0 200").then_some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbound_sandbox_hibernates_restores_and_keeps_its_network() {
    if !root_or_skip("an_outbound_sandbox_hibernates_restores_and_keeps_its_network") {
        return;
    }
    let (rt, _dir, _, _table) = runtime_on("net-criu", 216).await;
    // A server on every address of the sandbox, so the host reaches it over the veth.
    let mut spec = sh(
        "net-criu",
        "echo restored-fine > /tmp/marker; exec python3 -m http.server --bind 0.0.0.0 --directory /tmp 8080",
    );
    spec.network = NetworkMode::Outbound;
    rt.ensure(&spec).await.unwrap();
    let l = lease(&rt, "net-criu").await;
    let addr = l.sandbox_addr;
    let body = poll("the server over the veth", Duration::from_secs(20), || async move {
        tokio::task::spawn_blocking(move || get_over_veth(addr, 8080)).await.unwrap()
    })
    .await;
    assert!(body.ends_with("restored-fine\n"), "{body}");

    rt.hibernate(&spec.id).await.unwrap();
    assert!(!link_exists(&l.host_if), "the host end went with the namespace");
    rt.restore(&spec.id).await.unwrap();
    assert!(link_exists(&l.host_if), "CRIU recreated the pair under the recorded name");
    let body = poll("the restored server over the veth", Duration::from_secs(20), || async move {
        tokio::task::spawn_blocking(move || get_over_veth(addr, 8080)).await.unwrap()
    })
    .await;
    assert!(body.ends_with("restored-fine\n"), "{body}");
    let pid = rt.inspect(&spec.id).await.unwrap().pid.unwrap();
    let routes = std::fs::read_to_string(format!("/proc/{pid}/net/route")).unwrap();
    assert!(routes.lines().any(|r| r.starts_with("eth0\t00000000")), "default route: {routes}");

    rt.delete(&spec.id).await.unwrap();
    assert!(!link_exists(&l.host_if));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_removes_the_veth_of_a_sandbox_that_died_unwatched() {
    if !root_or_skip("reopening_removes_the_veth_of_a_sandbox_that_died_unwatched") {
        return;
    }
    let (rt, _dir, config, _table) = runtime_on("net-reopen", 217).await;
    let spec = outbound("reopen", "exec sleep 1000");
    rt.ensure(&spec).await.unwrap();
    let l = lease(&rt, "reopen").await;
    let pid = rt.inspect(&spec.id).await.unwrap().pid.unwrap();
    drop(rt);
    // The sandbox dies while no runtime watches; the record still names its host end.
    // SAFETY: plain kill(2) of the sandbox init this test created.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    poll("the init to die", Duration::from_secs(10), || async move {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        (stat.is_empty() || stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z')))
            .then_some(())
    })
    .await;
    let rt = LocalRuntime::open(config.clone()).await.unwrap();
    assert!(!link_exists(&l.host_if), "open released the dead instance's veth");
    // The sandbox is stopped with its lease kept; starting it again gets the same addresses.
    rt.ensure(&spec).await.unwrap();
    assert_eq!(lease(&rt, "reopen").await, l);
    assert!(link_exists(&l.host_if));
    rt.delete(&spec.id).await.unwrap();
    assert!(!link_exists(&l.host_if));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbound_sandbox_in_a_user_namespace_reaches_the_outside() {
    if !root_or_skip("an_outbound_sandbox_in_a_user_namespace_reaches_the_outside") {
        return;
    }
    let inet = FakeInternet::with(Ipv4Addr::new(198, 51, 100, 12), &[]);
    let listener = inet.listen();
    let port = listener.local_addr().unwrap().port();
    let accepted = accept_one(listener);
    let (rt, _dir, _, _table) = runtime_on("net-userns", 218).await;
    // (`/root` of the template is not its root's: write at the top of its writable layer.)
    let script = connect_script(inet.inside, port).replace("/root/out", "/out");
    let mut probe = outbound("userns-probe", &script);
    probe.user_namespace =
        oka_runtime_api::UserNamespace::Remapped { host_base: 1_400_000, size: 65_536 };
    rt.ensure(&probe).await.unwrap();
    let l = lease(&rt, "userns-probe").await;
    let out = wait_for_file(&rt, &probe.id, "/out", "END").await;
    assert_eq!(out, format!("connected {}\nEND\n", l.sandbox_addr));
    let (peer, data) = accepted.join().unwrap().expect("the outside was reached");
    assert_eq!((peer, data.as_str()), (Ipv4Addr::new(198, 51, 100, 13), "hello"));
    rt.delete(&probe.id).await.unwrap();
    assert!(!link_exists(&l.host_if));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nft_an_outbound_sandbox_is_unsupported_and_leaves_nothing() {
    if !root_or_skip("without_nft_an_outbound_sandbox_is_unsupported_and_leaves_nothing") {
        return;
    }
    let (rt, dir, _, _table) = runtime_on("net-no-nft", 219).await;
    // This test is its own process (nextest): no other test sees the emptied PATH.
    let empty = dir.path().join("empty-path");
    std::fs::create_dir(&empty).unwrap();
    // SAFETY: no other thread of this test process reads the environment concurrently (the
    // runtime's threads only read it when they run `ip` or `nft`, which happens below).
    unsafe { std::env::set_var("PATH", &empty) };
    let err = rt.ensure(&outbound("no-nft", "exec sleep 1000")).await.unwrap_err();
    assert!(
        matches!(&err, oka_runtime_api::RuntimeError::Unsupported { reason, .. } if reason.contains("nftables")),
        "{err:?}"
    );
    assert!(rt.list().await.unwrap().is_empty(), "nothing half-created is left");
    // Its slot was given back: the next outbound sandbox gets the first one.
    unsafe {
        std::env::set_var("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    };
    rt.ensure(&outbound("with-nft", "exec sleep 1000")).await.unwrap();
    assert_eq!(lease(&rt, "with-nft").await.index, 0);
    rt.delete(&id_of("with-nft")).await.unwrap();
}

/// A Python prober run as a sandbox's command: every round it tries a TCP connection (1 s
/// timeout; a target named `udp…`: a datagram and its echo) to each `name=addr:port` target (`gw` as the address is the sandbox's gateway, its
/// host end) and replaces `/root/probe` with one `name ok|no` line per target.
fn prober(targets: &[(&str, String)]) -> String {
    const PROBE: &str = r#"
import os, socket, struct, time
gw = '0.0.0.0'
for line in open('/proc/net/route').read().splitlines()[1:]:
    f = line.split()
    if f[1] == '00000000':
        gw = socket.inet_ntoa(struct.pack('<I', int(f[2], 16)))
targets = [TARGETS]
while True:
    out = []
    for name, t in targets:
        addr, port = t.rsplit(':', 1)
        addr = gw if addr == 'gw' else addr
        if name.startswith('udp'):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
            try:
                s.connect((addr, int(port))); s.send(b'ping')
                out.append(name + (' ok' if s.recv(16) == b'ping' else ' no'))
            except OSError:
                out.append(name + ' no')
        else:
            s = socket.socket(); s.settimeout(1)
            try:
                s.connect((addr, int(port))); out.append(name + ' ok')
            except OSError:
                out.append(name + ' no')
        s.close()
    open('/root/probe.tmp', 'w').write('\n'.join(out) + '\n')
    os.rename('/root/probe.tmp', '/root/probe')
    time.sleep(0.05)
"#;
    let list: Vec<String> = targets.iter().map(|(n, t)| format!("('{n}', '{t}')")).collect();
    let script = PROBE.replace("TARGETS", &list.join(", "));
    format!("cat > /tmp/probe.py <<'PY'{script}PY\nexec python3 /tmp/probe.py 2>/root/probe.err")
}

/// Accepts and closes connections on `listener` until the process ends.
fn serve_forever(listener: TcpListener) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
}

/// Waits until the prober in `id` reports exactly `expected` (`name ok|no` lines, in order).
async fn reach(rt: &LocalRuntime, id: &str, expected: &[(&str, bool)], what: &str) {
    let want: String =
        expected.iter().map(|(n, ok)| format!("{n} {}\n", if *ok { "ok" } else { "no" })).collect();
    let id = id_of(id);
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(now) = read_upper(rt, &id, "/root/probe").await {
            if now == want {
                return;
            }
            last = now;
        }
        if std::time::Instant::now() > deadline {
            let err = read_upper(rt, &id, "/root/probe.err").await;
            panic!("{what}: want\n{want}got\n{last}\nprober stderr: {err:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn e2b(allow_internet: bool, allow_out: &[&str], deny_out: &[&str]) -> EgressPolicy {
    use oka_runtime_api::{Destination, EgressAction, EgressRule};
    let mut policy =
        if allow_internet { EgressPolicy::allow_all() } else { EgressPolicy::deny_all() };
    for (action, list) in [(EgressAction::Allow, allow_out), (EgressAction::Deny, deny_out)] {
        for entry in list {
            policy.rules.push(EgressRule::new(action, Destination::parse(entry).unwrap()));
        }
    }
    policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_policies_decide_what_a_sandbox_reaches_live_and_across_restarts() {
    if !root_or_skip("egress_policies_decide_what_a_sandbox_reaches_live_and_across_restarts") {
        return;
    }
    // The outside world: 198.51.100.77 and 203.0.113.77 behind a link of their own.
    let (a, b) = (Ipv4Addr::new(198, 51, 100, 77), Ipv4Addr::new(203, 0, 113, 77));
    let inet = FakeInternet::with(Ipv4Addr::new(198, 51, 100, 8), &[a, b]);
    let host_other = Ipv4Addr::new(198, 51, 100, 9);
    let (la, lb) = (inet.listen_on(a), inet.listen_on(b));
    let (pa, pb) = (la.local_addr().unwrap().port(), lb.local_addr().unwrap().port());
    serve_forever(la);
    serve_forever(lb);
    // The host's own listener, on every address.
    let lh = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let ph = lh.local_addr().unwrap().port();
    serve_forever(lh);

    let dir = tempfile::Builder::new().prefix("oka-net-").tempdir().unwrap();
    let mut config = config(dir.path().join("state"), "net-egress");
    config.outbound_subnet = Subnet::new(Ipv4Addr::new(10, 220, 0, 0), 16).unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, format!("{b} b.example\n")).unwrap();
    config.egress_hosts = Some(hosts);
    let table = table_name(&config.cgroup_name);
    let _guard = TableGuard(table.clone());
    let rt = LocalRuntime::open(config.clone()).await.unwrap();

    // Another sandbox, serving on all its addresses.
    let peer = outbound(
        "peer",
        "exec python3 -m http.server --bind 0.0.0.0 --directory /tmp 8080 >/dev/null 2>&1",
    );
    rt.ensure(&peer).await.unwrap();
    let peer_addr = lease(&rt, "peer").await.sandbox_addr;
    let probe = outbound(
        "probe",
        &prober(&[
            ("a", format!("{a}:{pa}")),
            ("b", format!("{b}:{pb}")),
            ("host-end", format!("gw:{ph}")),
            ("host-other", format!("{host_other}:{ph}")),
            ("peer", format!("{peer_addr}:8080")),
        ]),
    );
    let t = |a_ok: bool, b_ok: bool| {
        [("a", a_ok), ("b", b_ok), ("host-end", false), ("host-other", false), ("peer", false)]
    };
    rt.ensure(&probe).await.unwrap();
    reach(&rt, "probe", &t(true, true), "default: the internet, never the host or a peer").await;

    let id = id_of("probe");
    rt.set_egress(&id, &e2b(false, &[], &[])).await.unwrap();
    reach(&rt, "probe", &t(false, false), "allow_internet_access: false").await;
    rt.set_egress(&id, &e2b(true, &[], &["198.51.100.0/24"])).await.unwrap();
    reach(&rt, "probe", &t(false, true), "denyOut 198.51.100.0/24").await;
    rt.set_egress(&id, &e2b(true, &["198.51.100.77"], &["0.0.0.0/0"])).await.unwrap();
    reach(&rt, "probe", &t(true, false), "allowOut wins over denyOut").await;
    rt.set_egress(&id, &e2b(true, &["b.example"], &["0.0.0.0/0"])).await.unwrap();
    reach(&rt, "probe", &t(false, true), "a domain rule allows its address").await;
    // An allow rule never opens the host.
    rt.set_egress(&id, &e2b(true, &["0.0.0.0/0"], &[])).await.unwrap();
    reach(&rt, "probe", &t(true, true), "allowOut 0.0.0.0/0").await;
    rt.set_egress(&id, &e2b(true, &["b.example"], &["0.0.0.0/0"])).await.unwrap();
    reach(&rt, "probe", &t(false, true), "the domain rule again").await;

    // Pause and resume keep it.
    rt.pause(&id).await.unwrap();
    rt.resume(&id).await.unwrap();
    reach(&rt, "probe", &t(false, true), "after pause and resume").await;
    // Hibernation (with CRIU) keeps it: the restored host end gets the same chain.
    if rt.hibernate(&id).await.is_ok() {
        rt.restore(&id).await.unwrap();
        reach(&rt, "probe", &t(false, true), "after hibernate and restore").await;
    } else {
        eprintln!("no CRIU: hibernation not checked");
    }
    // A new runtime process writes the table again from the state files.
    drop(rt);
    let out = Command::new("nft").args(["delete", "table", "inet", &table]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rt = LocalRuntime::open(config.clone()).await.unwrap();
    reach(&rt, "probe", &t(false, true), "after the runtime reopened").await;

    // A loopback-only sandbox has nothing to filter.
    rt.ensure(&sh("lo", "exec sleep 1000")).await.unwrap();
    let err = rt.set_egress(&id_of("lo"), &EgressPolicy::deny_all()).await.unwrap_err();
    assert!(err.to_string().contains("loopback-only"), "{err}");
    for s in ["probe", "peer", "lo"] {
        rt.delete(&id_of(s)).await.unwrap();
    }
    let listed = Command::new("nft").args(["list", "table", "inet", &table]).output().unwrap();
    assert!(!listed.status.success(), "the table went with the last outbound sandbox");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_rules_match_protocols_and_ports() {
    use oka_runtime_api::{Destination, EgressAction, EgressRule, Protocol};
    if !root_or_skip("egress_rules_match_protocols_and_ports") {
        return;
    }
    // The outside world: 203.0.113.90 with two TCP ports and a UDP echo.
    let a = Ipv4Addr::new(203, 0, 113, 90);
    let inet = FakeInternet::with(Ipv4Addr::new(198, 51, 100, 16), &[a]);
    let (l1, l2) = (inet.listen_on(a), inet.listen_on(a));
    let (p1, p2) = (l1.local_addr().unwrap().port(), l2.local_addr().unwrap().port());
    serve_forever(l1);
    serve_forever(l2);
    let pu = inet.echo_udp_on(a);

    let dir = tempfile::Builder::new().prefix("oka-net-").tempdir().unwrap();
    let mut config = config(dir.path().join("state"), "net-ports");
    config.outbound_subnet = Subnet::new(Ipv4Addr::new(10, 221, 0, 0), 16).unwrap();
    let table = table_name(&config.cgroup_name);
    let _guard = TableGuard(table.clone());
    let rt = LocalRuntime::open(config).await.unwrap();
    let probe = outbound(
        "ports",
        &prober(&[
            ("tcp1", format!("{a}:{p1}")),
            ("tcp2", format!("{a}:{p2}")),
            ("udp", format!("{a}:{pu}")),
        ]),
    );
    rt.ensure(&probe).await.unwrap();
    let t = |one: bool, two: bool, udp: bool| [("tcp1", one), ("tcp2", two), ("udp", udp)];
    reach(&rt, "ports", &t(true, true, true), "no policy").await;

    let id = id_of("ports");
    let dest = || Destination::Cidr(format!("{a}/32").parse().unwrap());
    let rule = |action, protocol: Option<Protocol>, ports: &[(u16, u16)]| EgressRule {
        action,
        destination: dest(),
        protocol,
        ports: ports.to_vec(),
    };
    let mut only = EgressPolicy::deny_all();
    only.rules = vec![
        rule(EgressAction::Allow, Some(Protocol::Tcp), &[(p1, p1)]),
        rule(EgressAction::Allow, Some(Protocol::Udp), &[(pu.saturating_sub(1), pu)]),
    ];
    rt.set_egress(&id, &only).await.unwrap();
    reach(&rt, "ports", &t(true, false, true), "TCP one port and a UDP range").await;

    let mut udp_only = EgressPolicy::deny_all();
    udp_only.rules = vec![rule(EgressAction::Allow, Some(Protocol::Udp), &[])];
    rt.set_egress(&id, &udp_only).await.unwrap();
    reach(&rt, "ports", &t(false, false, true), "every UDP port, no TCP").await;

    let mut but_one = EgressPolicy::allow_all();
    but_one.rules = vec![rule(EgressAction::Deny, None, &[(p1, p1), (pu, pu)])];
    rt.set_egress(&id, &but_one).await.unwrap();
    reach(&rt, "ports", &t(false, true, false), "ports without a protocol: TCP and UDP").await;
    rt.delete(&id).await.unwrap();
}

/// Bytes per second over the window from 1 s to 4 s after the first byte (after slow start and
/// the token bucket's burst), counted as the bytes arrive.
const MEASURE: &str = r#"
import time
def rate(recv):
    start = None; counted = 0
    while True:
        data = recv()
        if not data:
            break
        now = time.monotonic()
        if start is None:
            start = now
        if start + 1 <= now < start + 4:
            counted += len(data)
        if now >= start + 4:
            break
    return counted / 3
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bandwidth_limits_hold_both_ways_within_a_fifth() {
    use std::io::{Read as _, Write as _};
    if !root_or_skip("bandwidth_limits_hold_both_ways_within_a_fifth") {
        return;
    }
    const EGRESS: u64 = 8_000_000;
    const INGRESS: u64 = 4_000_000;
    let a = Ipv4Addr::new(203, 0, 113, 91);
    let inet = FakeInternet::with(Ipv4Addr::new(198, 51, 100, 24), &[a]);
    // The sink counts what the sandbox sends; the source sends to the sandbox as fast as it can.
    let (sink, source) = (inet.listen_on(a), inet.listen_on(a));
    let (sink_port, source_port) =
        (sink.local_addr().unwrap().port(), source.local_addr().unwrap().port());
    let received = std::thread::spawn(move || {
        let (mut stream, _) = sink.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        let (mut start, mut counted) = (None, 0usize);
        loop {
            let n = stream.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            let now = std::time::Instant::now();
            let first = *start.get_or_insert(now);
            let elapsed = now - first;
            if elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(4) {
                counted += n;
            }
            if elapsed >= Duration::from_secs(4) {
                break;
            }
        }
        counted as f64 / 3.0
    });
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = source.accept() {
            let chunk = vec![7u8; 65536];
            while stream.write_all(&chunk).is_ok() {}
        }
    });

    let (rt, _dir, _, _table) = runtime_on("net-bandwidth", 222).await;
    // One direction at a time (a saturated direction delays the other's acknowledgements):
    // first `cat` sends for 5 s, then Python counts what it receives.
    let script = format!(
        "timeout 5 bash -c 'exec cat /dev/zero > /dev/tcp/{a}/{sink_port}' 2>/root/send.err
cat > /tmp/m.py <<'PY'{MEASURE}
import socket
inp = socket.create_connection(('{a}', {source_port}))
got = rate(lambda: inp.recv(65536))
open('/root/rate.tmp', 'w').write(str(got))
import os; os.rename('/root/rate.tmp', '/root/rate')
PY
python3 /tmp/m.py 2>/root/m.err; exec sleep 1000"
    );
    let mut spec = outbound("bw", &script);
    spec.bandwidth = oka_runtime_api::Bandwidth {
        egress_bits_per_second: Some(EGRESS),
        ingress_bits_per_second: Some(INGRESS),
    };
    rt.ensure(&spec).await.unwrap();
    let sent = tokio::task::spawn_blocking(move || received.join().unwrap()).await.unwrap();
    let id = id_of("bw");
    let mut got = None;
    for _ in 0..200 {
        got = read_upper(&rt, &id, "/root/rate").await;
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = read_upper(&rt, &id, "/root/m.err").await;
    let got: f64 =
        got.unwrap_or_else(|| panic!("no rate measured inside: {err:?}")).parse().unwrap();
    let within = |measured: f64, limit: u64| {
        let limit = limit as f64 / 8.0;
        (measured - limit).abs() <= limit / 5.0
    };
    assert!(within(sent, EGRESS), "egress {sent} B/s against a limit of {} B/s", EGRESS / 8);
    assert!(within(got, INGRESS), "ingress {got} B/s against a limit of {} B/s", INGRESS / 8);
    eprintln!(
        "egress {sent:.0} B/s (limit {}), ingress {got:.0} B/s (limit {})",
        EGRESS / 8,
        INGRESS / 8
    );

    // A loopback-only sandbox has no traffic to limit: refused, naming the fix.
    let mut lo = sh("bw-lo", "exec sleep 1000");
    lo.bandwidth.egress_bits_per_second = Some(EGRESS);
    let err = rt.ensure(&lo).await.unwrap_err();
    assert!(err.to_string().contains("needs an outbound sandbox"), "{err}");
    let ifb = format!("ob{}", &lease(&rt, "bw").await.host_if[2..]);
    assert!(std::path::Path::new("/sys/class/net").join(&ifb).exists(), "{ifb} carries egress");
    rt.delete(&id).await.unwrap();
    assert!(!std::path::Path::new("/sys/class/net").join(&ifb).exists(), "the ifb went too");
}

/// A server on `0.0.0.0:8080` holding a count in memory: `GET /count` counts and answers
/// `count=N`; `GET /out/<addr>/<port>` connects to `addr:port`, sends `hello` and answers
/// `connected <its local address>` or the error's class; `GET /hold/<addr>/<port>` opens a
/// connection and keeps it; `GET /send` sends `x` on each kept connection and answers `sent` or
/// the error's class for each.
fn forkable_server(id: &str) -> SandboxSpec {
    const SERVER: &str = r#"
import http.server, socket
count = 0
held = []
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        if self.path == "/count":
            count += 1
            body = f"count={count}"
        elif self.path.startswith("/out/"):
            _, _, addr, port = self.path.split("/")
            s = socket.socket(); s.settimeout(5)
            try:
                s.connect((addr, int(port))); s.sendall(b"hello"); body = "connected " + s.getsockname()[0]
            except OSError as e:
                body = type(e).__name__
            s.close()
        elif self.path.startswith("/hold/"):
            _, _, addr, port = self.path.split("/")
            held.append(socket.create_connection((addr, int(port)), 5))
            body = "held"
        elif self.path == "/send":
            out = []
            for s in held:
                try:
                    s.sendall(b"x"); out.append("sent")
                except OSError as e:
                    out.append(type(e).__name__)
            body = ",".join(out)
        else:
            body = "ok"
        b = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#;
    let mut spec = SandboxSpec::new(id_of(id), vec!["python3".into(), "-c".into(), SERVER.into()]);
    spec.network = NetworkMode::Outbound;
    spec
}

/// The body of `GET path` from `addr:8080` over the host's routes (the veth), if it answered 200.
async fn get_body(addr: Ipv4Addr, path: &str) -> Option<String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut s =
            std::net::TcpStream::connect_timeout(&(addr, 8080).into(), Duration::from_secs(2))
                .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        if !out.starts_with("HTTP/1.0 200") {
            return None;
        }
        out.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
    })
    .await
    .unwrap()
}

/// Accepts connections on `listener` until the process ends and sends what each one sent.
fn record_forever(listener: TcpListener) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = String::new();
            let _ = stream.read_to_string(&mut buf);
            if tx.send(buf).is_err() {
                return;
            }
        }
    });
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbound_sandbox_is_snapshotted_and_cloned_with_an_address_of_its_own() {
    if !root_or_skip("an_outbound_sandbox_is_snapshotted_and_cloned_with_an_address_of_its_own") {
        return;
    }
    let inet = FakeInternet::with(Ipv4Addr::new(198, 51, 100, 32), &[]);
    let listener = inet.listen();
    let port = listener.local_addr().unwrap().port();
    let outside = record_forever(listener);
    let out = format!("/out/{}/{port}", inet.inside);
    // A second server outside that forwards every byte of one connection, kept open.
    let keeper = inet.listen();
    let hold = format!("/hold/{}/{}", inet.inside, keeper.local_addr().unwrap().port());
    let (kept_tx, kept) = std::sync::mpsc::channel::<u8>();
    std::thread::spawn(move || {
        let (mut stream, _) = keeper.accept().unwrap();
        let mut byte = [0u8; 1];
        while let Ok(1) = stream.read(&mut byte) {
            if kept_tx.send(byte[0]).is_err() {
                return;
            }
        }
    });
    let (rt, dir, _, _table) = runtime_on("net-fork", 223).await;

    let spec = forkable_server("fork-origin");
    rt.ensure(&spec).await.unwrap();
    let origin = lease(&rt, "fork-origin").await;
    let o = origin.sandbox_addr;
    poll("the origin's server over its veth", Duration::from_secs(20), || get_body(o, "/ping"))
        .await;
    for n in 1..=3 {
        assert_eq!(get_body(o, "/count").await.as_deref(), Some(format!("count={n}").as_str()));
    }
    assert_eq!(get_body(o, &out).await, Some(format!("connected {o}")));
    assert_eq!(outside.recv_timeout(Duration::from_secs(10)).unwrap(), "hello");
    assert_eq!(get_body(o, &hold).await.as_deref(), Some("held"));
    assert_eq!(get_body(o, "/send").await.as_deref(), Some("sent"));
    assert_eq!(kept.recv_timeout(Duration::from_secs(10)).unwrap(), b'x');
    // The origin's own policy keeps it off the outside; its clones start under it.
    rt.set_egress(&spec.id, &EgressPolicy::deny_all()).await.unwrap();
    let refused = get_body(o, &out).await.unwrap();
    assert!(!refused.starts_with("connected"), "{refused}");

    let snap = id_of("fork-snap");
    rt.snapshot(&spec.id, &snap).await.unwrap();
    assert_eq!(get_body(o, "/count").await.as_deref(), Some("count=4"), "the origin runs on");

    let clone = SandboxSpec { from_snapshot: Some(snap.clone()), ..forkable_server("fork-clone") };
    rt.ensure(&clone).await.unwrap();
    let cloned = lease(&rt, "fork-clone").await;
    let c = cloned.sandbox_addr;
    assert_ne!(cloned.index, origin.index);
    assert_ne!(c, o, "the clone has an address of its own");
    assert_ne!(cloned.host_if, origin.host_if);
    assert!(link_exists(&cloned.host_if) && link_exists(&origin.host_if));
    // Its process kept the count and listens on its new address.
    assert_eq!(get_body(c, "/count").await.as_deref(), Some("count=4"));
    assert_eq!(get_body(c, "/count").await.as_deref(), Some("count=5"));
    // The connection the origin held is closed in the clone, and goes on in the origin.
    let sent = get_body(c, "/send").await.unwrap();
    assert_ne!(sent, "sent", "a clone's copy of a connection is closed");
    assert_eq!(get_body(o, "/send").await.as_deref(), Some("sent"));
    assert_eq!(kept.recv_timeout(Duration::from_secs(10)).unwrap(), b'x');
    assert!(kept.recv_timeout(Duration::from_millis(200)).is_err(), "nothing came from the clone");
    let pid = rt.inspect(&clone.id).await.unwrap().pid.unwrap();
    let addrs = std::fs::read_to_string(format!("/proc/{pid}/net/fib_trie")).unwrap();
    assert!(addrs.contains(&c.to_string()), "{addrs}");
    assert!(!addrs.contains(&o.to_string()), "the source's address is gone: {addrs}");
    let routes = std::fs::read_to_string(format!("/proc/{pid}/net/route")).unwrap();
    let gateway = format!("{:08X}", u32::from_le_bytes(cloned.host_addr.octets()));
    assert!(
        routes.lines().any(|r| r.starts_with(&format!("eth0\t00000000\t{gateway}"))),
        "the default route goes via the clone's own host end: {routes}"
    );
    // It starts under its source's policy, never more open, then reaches the outside through
    // its own address once its own policy allows it.
    let refused = get_body(c, &out).await.unwrap();
    assert!(!refused.starts_with("connected"), "a clone is as closed as its source: {refused}");
    rt.set_egress(&clone.id, &EgressPolicy::allow_all()).await.unwrap();
    assert_eq!(get_body(c, &out).await, Some(format!("connected {c}")));
    assert_eq!(outside.recv_timeout(Duration::from_secs(10)).unwrap(), "hello");

    // Policies stay apart: closing the clone and opening the origin moves neither the other.
    rt.set_egress(&clone.id, &EgressPolicy::deny_all()).await.unwrap();
    let refused = get_body(c, &out).await.unwrap();
    assert!(!refused.starts_with("connected"), "{refused}");
    rt.set_egress(&spec.id, &EgressPolicy::allow_all()).await.unwrap();
    assert_eq!(get_body(o, &out).await, Some(format!("connected {o}")));
    assert_eq!(outside.recv_timeout(Duration::from_secs(10)).unwrap(), "hello");
    assert_eq!(get_body(o, "/count").await.as_deref(), Some("count=5"), "the origin's own count");

    // A clone of an outbound snapshot is outbound: a loopback-only one is refused, leaving nothing.
    let mut lo = SandboxSpec { from_snapshot: Some(snap.clone()), ..forkable_server("fork-lo") };
    lo.network = NetworkMode::Loopback;
    let err = rt.ensure(&lo).await.unwrap_err();
    assert!(err.to_string().contains("must be outbound too"), "{err}");

    // Another clone of the same snapshot at once: a third address, the snapshot's count.
    let second = SandboxSpec { from_snapshot: Some(snap.clone()), ..forkable_server("fork-2") };
    rt.ensure(&second).await.unwrap();
    let third = lease(&rt, "fork-2").await.sandbox_addr;
    assert!(third != o && third != c, "{third}");
    assert_eq!(get_body(third, "/count").await.as_deref(), Some("count=4"));
    rt.set_egress(&second.id, &EgressPolicy::allow_all()).await.unwrap();
    assert_eq!(get_body(third, &out).await, Some(format!("connected {third}")));
    assert_eq!(outside.recv_timeout(Duration::from_secs(10)).unwrap(), "hello");
    rt.delete(&second.id).await.unwrap();

    // The clone hibernates and restores at its own address.
    rt.hibernate(&clone.id).await.unwrap();
    rt.restore(&clone.id).await.unwrap();
    assert_eq!(get_body(c, "/count").await.as_deref(), Some("count=6"));

    rt.delete_snapshot(&snap).await.unwrap();
    for id in [&spec.id, &clone.id] {
        rt.delete(id).await.unwrap();
    }
    assert!(!link_exists(&cloned.host_if) && !link_exists(&origin.host_if));
    assert!(rt.list().await.unwrap().is_empty());
    assert_eq!(std::fs::read_dir(dir.path().join("state/sandboxes")).unwrap().count(), 0);
}
