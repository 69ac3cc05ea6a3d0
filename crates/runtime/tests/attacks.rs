//! Attacks on the sandbox boundary from inside real sandboxes, as the sandbox's root and as an
//! unprivileged user (uid 1000 of the default root): each attempt must fail, and each test
//! asserts how (the errno the capability check, the system call filter or the mount answers).
//!
//! The attacker is Python with `ctypes` (the default root has the host's `python3`): one probe
//! script makes each call and prints `name result` lines, the test compares them with what the
//! runtime's rules say. These run real sandboxes and need root; they print a SKIPPED line
//! otherwise.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use oka_runtime::local::LocalRuntime;
use oka_runtime_api::spec::User;
use oka_runtime_api::{Runtime, SandboxId, SandboxSpec, Seccomp, Security};

/// The probe: each attack, with `ok` or the errno's name. Its arguments are the ports to try on
/// the sandbox's loopback (the host's and a neighbour sandbox's listeners).
const PROBE: &str = r#"
import ctypes, errno, os, socket, stat, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = []
def name(e):
    return errno.errorcode.get(e, str(e))
def sc(label, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r == 0 and label.startswith("clone"):
        os._exit(0)
    out.append(f"{label} {'ok' if r != -1 else name(ctypes.get_errno())}")
def py(label, f):
    try:
        f()
        out.append(f"{label} ok")
    except OSError as e:
        out.append(f"{label} {name(e.errno)}")
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return line.split()[1]
out.append(f"seccomp-mode {status('Seccomp')}")
out.append(f"uid {os.getuid()}")
# Other processes: PID 1 (the init) is not traceable, its memory and environment not readable.
sc("ptrace-attach-pid1", 101, 16, 1, 0, 0)
py("read-pid1-mem", lambda: open("/proc/1/mem", "rb").read(1))
py("read-pid1-environ", lambda: open("/proc/1/environ", "rb").read())
# Raw sockets: packet sockets need NET_RAW; whatever they see is the sandbox's own loopback.
py("packet-socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)).close())
out.append("interfaces " + ",".join(n for _, n in socket.if_nameindex()))
py("vsock-socket", lambda: socket.socket(40, socket.SOCK_STREAM).close())
# Kernel keyrings, modules, kexec, reboot, BPF, perf: none is namespaced.
sc("add_key", 248, 0, 0, 0, 0, 0)
sc("keyctl", 250, 0, -3, 0)
sc("request_key", 249, 0, 0, 0, 0)
sc("init_module", 175, 0, 0, 0)
sc("finit_module", 313, 0, 0, 0)
sc("delete_module", 176, 0, 0)
sc("kexec_load", 246, 0, 0, 0, 0)
sc("kexec_file_load", 320, -1, -1, 0, 0, 0)
sc("reboot", 169, 0xfee1dead, 672274793, 0x4321fedc, 0)
sc("bpf", 321, 0, 0, 0)
sc("perf_event_open", 298, 0, 0, -1, -1, 0)
sc("io_uring_setup", 425, 1, 0)
# Mounts and namespaces.
sc("mount", 165, 0, 0, 0, 0, 0)
sc("umount2", 166, 0, 2)
sc("unshare-user", 272, 0x10000000)
sc("unshare-mount", 272, 0x00020000)
sc("unshare-net", 272, 0x40000000)
sc("clone-newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
sc("clone3", 435, 0, 0)
sc("setns", 308, os.open("/proc/self/ns/net", os.O_RDONLY), 0)
sc("open_by_handle_at", 304, -100, 0, 0)
sc("pivot_root", 155, 0, 0)
# Kernel settings and devices.
py("write-proc-sys", lambda: open("/proc/sys/kernel/hostname", "w").write("x"))
py("write-sysrq-trigger", lambda: open("/proc/sysrq-trigger", "w").write("h"))
py("write-sys", lambda: open("/sys/kernel/uevent_helper", "w").write("/x"))
py("mknod-mem", lambda: os.mknod("/tmp/mem", 0o600 | stat.S_IFCHR, os.makedev(1, 1)))
py("open-dev-mem", lambda: open("/dev/mem", "rb"))
out.append("dev " + ",".join(sorted(os.listdir("/dev"))))
# Cgroups: the host's hierarchy is not there and no cgroup file system can be mounted.
py("cgroup-fs", lambda: os.listdir("/sys/fs/cgroup"))
out.append("own-cgroup " + open("/proc/self/cgroup").read().strip().replace("\n", ";"))
# Loopback: the host's and the neighbour's listeners are in other network namespaces.
for port in sys.argv[2:]:
    s = socket.socket()
    s.settimeout(5)
    py(f"connect-{port}", lambda: s.connect(("127.0.0.1", int(port))))
# What must keep working under the filter: fork, threads (glibc falls back from clone3).
pid = os.fork()
if pid == 0:
    os._exit(7)
out.append(f"fork-exit {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
t = threading.Thread(target=lambda: None); t.start(); t.join()
out.append("thread ok")
out.append("END")
with open(sys.argv[1], "w") as f:
    f.write("\n".join(out) + "\n")
"#;

/// The probe's answers by attack.
fn answers(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A sandbox that runs the probe into `out` (inside the sandbox) and then sleeps.
fn probe_spec(id: &str, user: Option<u32>, out: &str, ports: &[u16]) -> SandboxSpec {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let script = format!(
        "python3 -c \"$PROBE\" {out} {} > {out}.err 2>&1; exec sleep 1000",
        ports.join(" ")
    );
    let mut spec = sh(id, &script);
    spec.process.env.push(oka_runtime_api::EnvVar::new("PROBE", PROBE));
    spec.process.user = user.map(|uid| User { uid, gid: uid });
    spec
}

async fn run_probe(rt: &LocalRuntime, spec: &SandboxSpec, out: &str) -> BTreeMap<String, String> {
    rt.ensure(spec).await.unwrap();
    let text = poll("the probe's answers", Duration::from_secs(30), || async {
        let done = read_upper(rt, &spec.id, out).await.filter(|s| s.ends_with("END\n"));
        if done.is_none()
            && let Some(err) = read_upper(rt, &spec.id, &format!("{out}.err")).await
            && err.contains("Traceback")
        {
            panic!("the probe failed:\n{err}");
        }
        done
    })
    .await;
    eprintln!("{}:\n{text}", spec.id);
    answers(&text)
}

/// Asserts each `(attack, expected answer)`.
fn expect(got: &BTreeMap<String, String>, who: &str, want: &[(&str, &str)]) {
    let wrong: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| format!("{k}: want {v}, got {:?}", got.get(*k)))
        .collect();
    assert!(wrong.is_empty(), "as {who}:\n{}", wrong.join("\n"));
}

/// What fails the same way for root and for the user: the filter's `EPERM` (or `ENOSYS` for
/// `clone3`), whatever the capabilities would say.
const FILTERED: &[(&str, &str)] = &[
    ("seccomp-mode", "2"),
    ("vsock-socket", "EPERM"),
    ("add_key", "EPERM"),
    ("keyctl", "EPERM"),
    ("request_key", "EPERM"),
    ("init_module", "EPERM"),
    ("finit_module", "EPERM"),
    ("delete_module", "EPERM"),
    ("kexec_load", "EPERM"),
    ("kexec_file_load", "EPERM"),
    ("reboot", "EPERM"),
    ("bpf", "EPERM"),
    ("perf_event_open", "EPERM"),
    ("io_uring_setup", "EPERM"),
    ("mount", "EPERM"),
    ("umount2", "EPERM"),
    ("unshare-user", "EPERM"),
    ("unshare-mount", "EPERM"),
    ("unshare-net", "EPERM"),
    ("clone-newuser", "EPERM"),
    ("clone3", "ENOSYS"),
    ("setns", "EPERM"),
    ("open_by_handle_at", "EPERM"),
    ("pivot_root", "EPERM"),
    ("ptrace-attach-pid1", "EPERM"),
    ("mknod-mem", "EPERM"),
    ("open-dev-mem", "ENOENT"),
    ("write-sys", "ENOENT"),
    ("cgroup-fs", "ENOENT"),
    ("interfaces", "lo"),
    ("fork-exit", "7"),
    ("thread", "ok"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_from_inside_fail_as_root_and_as_a_user_and_the_filter_survives_hibernation() {
    if !root_or_skip(
        "attacks_from_inside_fail_as_root_and_as_a_user_and_the_filter_survives_hibernation",
    ) {
        return;
    }
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    let (rt, _dir) = runtime("attacks").await;
    let neighbour = http_server("neighbour", 8123);
    rt.ensure(&neighbour).await.unwrap();
    poll("the neighbour to serve", Duration::from_secs(20), || http_get(&rt, &neighbour.id, 8123))
        .await;
    let ports = [host_port, 8123];
    // A kernel without magic SysRq has no trigger file to write.
    let sysrq = std::path::Path::new("/proc/sysrq-trigger").exists();

    let root =
        run_probe(&rt, &probe_spec("attack-root", None, "/root/out", &ports), "/root/out").await;
    expect(&root, "root", FILTERED);
    expect(
        &root,
        "root",
        &[
            ("uid", "0"),
            // PID 1 is not dumpable: without CAP_SYS_PTRACE, root of the sandbox is refused too.
            ("read-pid1-mem", "EACCES"),
            ("read-pid1-environ", "EACCES"),
            // NET_RAW is in the default set (as Docker's): a packet socket opens, on `lo` only.
            ("packet-socket", "ok"),
            ("write-proc-sys", "EROFS"),
            ("write-sysrq-trigger", if sysrq { "EROFS" } else { "ENOENT" }),
            (&format!("connect-{host_port}"), "ECONNREFUSED"),
            ("connect-8123", "ECONNREFUSED"),
        ],
    );
    let cgroups = root.get("own-cgroup").unwrap();
    assert!(
        cgroups.split(';').all(|line| line.ends_with(":/")),
        "every hierarchy is rooted at the sandbox's own cgroup: {cgroups}"
    );
    let dev = root.get("dev").unwrap();
    for node in dev.split(',') {
        assert!(
            ["console", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin"]
                .contains(&node)
                || ["stdout", "tty", "urandom", "zero"].contains(&node),
            "/dev has {node}: {dev}"
        );
    }

    let user = run_probe(
        &rt,
        &probe_spec("attack-user", Some(1000), "/home/user/out", &ports),
        "/home/user/out",
    )
    .await;
    expect(&user, "user", FILTERED);
    expect(
        &user,
        "user",
        &[
            ("uid", "1000"),
            ("read-pid1-mem", "EACCES"),
            ("read-pid1-environ", "EACCES"),
            ("packet-socket", "EPERM"),
            // The read-only mount answers before the file's mode (an open for writing with
            // O_TRUNC checks the mount first).
            ("write-proc-sys", "EROFS"),
            ("write-sysrq-trigger", if sysrq { "EROFS" } else { "ENOENT" }),
            (&format!("connect-{host_port}"), "ECONNREFUSED"),
            ("connect-8123", "ECONNREFUSED"),
        ],
    );
    host.set_nonblocking(true).unwrap();
    assert!(host.accept().is_err(), "nothing reached the host listener");

    // CRIU checkpoints the filter with the processes and restores it: every process of the
    // restored sandbox is filtered again (one filter each).
    let id = id_of("attack-root");
    rt.hibernate(&id).await.unwrap();
    rt.restore(&id).await.unwrap();
    let pids = sandbox_pids(&rt, &id).await;
    assert!(pids.len() >= 2, "the init and the sleep: {pids:?}");
    for pid in &pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |f: &str| {
            status.lines().find_map(|l| l.strip_prefix(f)).map(str::trim).unwrap_or("").to_owned()
        };
        assert_eq!(field("Seccomp:"), "2", "pid {pid} after restore:\n{status}");
        assert_eq!(field("Seccomp_filters:"), "1", "pid {pid} after restore:\n{status}");
    }
    for id in [id, id_of("attack-user"), neighbour.id.clone()] {
        rt.delete(&id).await.unwrap();
    }
}

/// The host pids of every process of sandbox `id` (its cgroup's `cgroup.procs`).
async fn sandbox_pids(rt: &LocalRuntime, id: &SandboxId) -> Vec<u32> {
    let cgroup = rt.cgroup_paths(id).await.unwrap();
    let procs = std::fs::read_to_string(cgroup.dirs()[0].join("cgroup.procs")).unwrap();
    procs.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_capability_opens_its_calls_and_unconfined_turns_the_filter_off() {
    if !root_or_skip("an_added_capability_opens_its_calls_and_unconfined_turns_the_filter_off") {
        return;
    }
    let (rt, _dir) = runtime("attacks-caps").await;
    let mut admin = probe_spec("cap-admin", None, "/root/out", &[]);
    admin.security = Security { add_capabilities: vec!["SYS_ADMIN".into()], ..Security::default() };
    let got = run_probe(&rt, &admin, "/root/out").await;
    // SYS_ADMIN opens mount and namespaces (the kernel then answers for itself), not keyrings.
    expect(
        &got,
        "root with SYS_ADMIN",
        &[
            ("seccomp-mode", "2"),
            ("unshare-mount", "ok"),
            ("mount", "EFAULT"),
            ("keyctl", "EPERM"),
            ("kexec_load", "EPERM"),
            ("thread", "ok"),
        ],
    );
    let mut unconfined = probe_spec("unconfined", None, "/root/out", &[]);
    unconfined.security = Security { seccomp: Seccomp::Unconfined, ..Security::default() };
    let got = run_probe(&rt, &unconfined, "/root/out").await;
    // No filter: the capabilities answer alone (keyrings are not theirs to refuse).
    expect(
        &got,
        "root unconfined",
        &[("seccomp-mode", "0"), ("mount", "EFAULT"), ("clone3", "EINVAL"), ("thread", "ok")],
    );
    assert_ne!(got.get("keyctl").map(String::as_str), Some("EPERM"), "{got:?}");
    for id in [admin.id, unconfined.id] {
        rt.delete(&id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_sandbox_with_a_cpu_limit_does_not_starve_its_neighbour() {
    if !root_or_skip("a_busy_sandbox_with_a_cpu_limit_does_not_starve_its_neighbour") {
        return;
    }
    let (rt, _dir) = runtime("starve").await;
    // The neighbour (no limit) spins for 1.5 s; the CPU time it got is its progress. It runs
    // once alone and once beside the hog, so a machine others load too is the same for both.
    let counter = "import time\nt0 = time.time()\nwhile time.time() - t0 < 1.5:\n    pass\n\
                   open('/root/done', 'w').write('END\\n')";
    let neighbour = |id: &str| {
        let mut spec = sh(id, "python3 -c \"$COUNTER\"; exec sleep 1000");
        spec.process.env.push(oka_runtime_api::EnvVar::new("COUNTER", counter));
        spec
    };
    let progress = |spec: SandboxSpec| {
        let rt = &rt;
        async move {
            rt.ensure(&spec).await.unwrap();
            wait_for_file(rt, &spec.id, "/root/done", "END").await;
            let used = cpu_usec(rt, &spec.id).await;
            rt.delete(&spec.id).await.unwrap();
            used
        }
    };
    let alone = progress(neighbour("alone")).await;
    // Four busy loops under a limit of a fifth of a CPU.
    let mut hog = sh("hog", "for i in 1 2 3 4; do (while :; do :; done) & done; exec sleep 1000");
    hog.resources.cpu_millis = Some(200);
    rt.ensure(&hog).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (hog_before, start) = (cpu_usec(&rt, &hog.id).await, Instant::now());
    let beside = progress(neighbour("beside")).await;
    let hog_used = cpu_usec(&rt, &hog.id).await - hog_before;
    let hog_share = hog_used as f64 / start.elapsed().as_micros() as f64;
    eprintln!(
        "neighbour alone {alone} µs, beside the hog {beside} µs; hog {hog_used} µs ({hog_share:.2} CPU)"
    );
    assert!(hog_share < 0.3, "the hog stays near its 0.2 CPU: {hog_share:.2}");
    // What the neighbour loses beside four runnable loops is at most what the hog's limit lets
    // it take (with a margin for a machine others load too): it is not starved.
    assert!(
        (beside + hog_used) as f64 > 0.75 * alone as f64,
        "the neighbour ran {beside} µs beside the hog ({hog_used} µs), {alone} µs alone"
    );
    rt.delete(&hog.id).await.unwrap();
}

/// CPU time sandbox `id`'s cgroup used so far, in microseconds (v2 `cpu.stat`, else v1
/// `cpuacct.usage`).
async fn cpu_usec(rt: &LocalRuntime, id: &SandboxId) -> u64 {
    let cgroup = rt.cgroup_paths(id).await.unwrap();
    if let Some(dir) = &cgroup.v2
        && let Ok(stat) = std::fs::read_to_string(dir.join("cpu.stat"))
    {
        return stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
    }
    let dir = cgroup
        .v1
        .iter()
        .find(|(c, _)| *c == oka_runtime::local::cgroup::Controller::Cpuacct)
        .map(|(_, p)| p.clone())
        .unwrap();
    let ns: u64 =
        std::fs::read_to_string(dir.join("cpuacct.usage")).unwrap().trim().parse().unwrap();
    ns / 1000
}
