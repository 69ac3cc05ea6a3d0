//! Isolation of local sandboxes, checked from inside them: processes, files, hostname, network,
//! memory and PID limits, and what sandbox root may not do.
//!
//! These run real sandboxes and need root; they print a SKIPPED line otherwise.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions may unwrap too

mod common;

use std::time::Duration;

use common::*;
use oka_runtime::local::cgroup::Controller;
use oka_runtime_api::{Runtime, SandboxState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_sees_only_its_own_processes() {
    if !root_or_skip("a_sandbox_sees_only_its_own_processes") {
        return;
    }
    let (rt, _dir) = runtime("procs").await;
    rt.ensure(&sh("neighbour", "exec sleep 1000")).await.unwrap();
    let id = id_of("procs");
    let script = "sleep 1000 & ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' ' > /root/pids; \
                  cat /proc/1/cmdline | tr '\\0' ' ' > /root/init; echo >> /root/init; \
                  echo \"session $(cut -d' ' -f6 /proc/1/stat)\" >> /root/init; echo END >> /root/init; exec sleep 1000";
    rt.ensure(&sh("procs", script)).await.unwrap();
    let init = wait_for_file(&rt, &id, "/root/init", "END").await;
    assert!(init.starts_with("oka-init run"), "PID 1 is our init: {init}");
    assert!(
        init.contains("\nsession 1\n"),
        "the init leads its own session (CRIU needs it): {init}"
    );
    let pids = read_upper(&rt, &id, "/root/pids").await.unwrap();
    let pids: Vec<u32> = pids.split_whitespace().map(|p| p.parse().unwrap()).collect();
    // The init, the shell, its background sleep, and the `ls` (and maybe `grep`, `sort`, `tr`)
    // of the pipeline: nothing of the host or the neighbour, all numbered from 1.
    assert_eq!(pids[0], 1);
    assert!(pids.len() <= 7 && pids.iter().all(|&p| p < 20), "{pids:?}");
    rt.delete(&id).await.unwrap();
    rt.delete(&id_of("neighbour")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_read_another_sandboxs_writable_layer() {
    if !root_or_skip("a_sandbox_cannot_read_another_sandboxs_writable_layer") {
        return;
    }
    let (rt, _dir) = runtime("layers").await;
    let (a, b) = (id_of("layer-a"), id_of("layer-b"));
    rt.ensure(&sh(
        "layer-a",
        "echo secret-of-a > /root/secret; echo END > /root/done; exec sleep 1000",
    ))
    .await
    .unwrap();
    wait_for_file(&rt, &a, "/root/done", "END").await;
    let a_upper = rt.paths(&a).await.unwrap().upper;
    let a_secret = a_upper.join("root/secret");
    assert!(a_secret.exists());
    let script = format!(
        "cat /root/secret > /root/probe 2>&1; cat {} >> /root/probe 2>&1; \
         find / -xdev -name secret 2>/dev/null >> /root/probe; echo END >> /root/probe; exec sleep 1000",
        a_secret.display()
    );
    rt.ensure(&sh("layer-b", &script)).await.unwrap();
    let probe = wait_for_file(&rt, &b, "/root/probe", "END").await;
    eprintln!("{probe}");
    assert!(!probe.contains("secret-of-a"), "{probe}");
    assert!(probe.contains("No such file or directory"), "{probe}");
    rt.delete(&a).await.unwrap();
    rt.delete(&b).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_has_its_own_hostname() {
    if !root_or_skip("a_sandbox_has_its_own_hostname") {
        return;
    }
    let (rt, _dir) = runtime("hostname").await;
    let mut spec =
        sh("named", "echo \"$(hostname) $(cat /etc/hostname)\" > /root/h; exec sleep 1000");
    spec.hostname = "box-one".into();
    rt.ensure(&spec).await.unwrap();
    let h = wait_for_file(&rt, &spec.id, "/root/h", "box-one box-one").await;
    assert_eq!(h, "box-one box-one\n");
    let host = rustix::system::uname().nodename().to_string_lossy().into_owned();
    assert_ne!(host, "box-one", "the host's hostname is untouched");
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_has_only_loopback_and_cannot_reach_a_host_listener() {
    if !root_or_skip("a_sandbox_has_only_loopback_and_cannot_reach_a_host_listener") {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (rt, _dir) = runtime("network").await;
    let script = format!(
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > /root/ifaces; \
         python3 -c 'import socket; s = socket.socket(); s.settimeout(5)\ntry:\n    s.connect((\"127.0.0.1\", {port})); print(\"connected\")\nexcept OSError as e:\n    print(type(e).__name__)' > /root/connect 2>&1; \
         echo END >> /root/connect; exec sleep 1000"
    );
    let spec = sh("net", &script);
    rt.ensure(&spec).await.unwrap();
    let connect = wait_for_file(&rt, &spec.id, "/root/connect", "END").await;
    assert_eq!(connect, "ConnectionRefusedError\nEND\n");
    assert_eq!(read_upper(&rt, &spec.id, "/root/ifaces").await.as_deref(), Some("lo\n"));
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "nothing reached the host listener");
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_over_the_memory_limit_is_killed_while_the_sandbox_carries_on() {
    if !root_or_skip("a_process_over_the_memory_limit_is_killed_while_the_sandbox_carries_on") {
        return;
    }
    let (rt, _dir) = runtime("oom").await;
    let script = "python3 -c 'a = bytearray(300 << 20); print(len(a))' > /root/hog 2>&1; \
                  echo \"rc=$?\" > /root/rc; echo alive >> /root/rc; exec sleep 1000";
    let mut spec = sh("oom", script);
    spec.resources.memory_bytes = Some(64 << 20);
    rt.ensure(&spec).await.unwrap();
    let rc = wait_for_file(&rt, &spec.id, "/root/rc", "alive").await;
    assert_eq!(rc, "rc=137\nalive\n", "the hog dies of SIGKILL, the shell goes on");
    let status = rt.inspect(&spec.id).await.unwrap();
    assert_eq!(status.state, SandboxState::Running, "the init survived");
    let usage = status.usage.unwrap();
    assert!(usage.memory_bytes.unwrap() <= 64 << 20);
    let cgroup = rt.cgroup_paths(&spec.id).await.unwrap();
    let memory = cgroup.v1.iter().find(|(c, _)| *c == Controller::Memory).map(|(_, p)| p.clone());
    if let Some(memory) = memory {
        let oom = std::fs::read_to_string(memory.join("memory.oom_control")).unwrap();
        assert!(oom.lines().any(|l| l.starts_with("oom_kill ") && l != "oom_kill 0"), "{oom}");
    }
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stops_at_the_pid_limit() {
    if !root_or_skip("a_fork_bomb_stops_at_the_pid_limit") {
        return;
    }
    let (rt, _dir) = runtime("forkbomb").await;
    let script = "bomb() { bomb | bomb & }; echo started > /root/bomb; bomb; exec sleep 1000";
    let mut spec = sh("bomb", script);
    spec.resources.pids = Some(64);
    rt.ensure(&spec).await.unwrap();
    wait_for_file(&rt, &spec.id, "/root/bomb", "started").await;
    let cgroup = rt.cgroup_paths(&spec.id).await.unwrap();
    let pids_dir =
        cgroup.v1.iter().find(|(c, _)| *c == Controller::Pids).map(|(_, p)| p.clone()).unwrap();
    let events = pids_dir.join("pids.events");
    poll("the pid limit to refuse forks", Duration::from_secs(20), || async {
        std::fs::read_to_string(&events).ok().filter(|s| s.trim() != "max 0")
    })
    .await;
    let current: u64 =
        std::fs::read_to_string(pids_dir.join("pids.current")).unwrap().trim().parse().unwrap();
    assert!(current <= 64, "pids.current {current}");
    // The host can still start processes.
    assert!(std::process::Command::new("true").status().unwrap().success());
    rt.delete(&spec.id).await.unwrap();
    assert!(!pids_dir.exists(), "delete removes the bombed cgroup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_root_cannot_mount_write_kernel_settings_or_make_devices() {
    if !root_or_skip("sandbox_root_cannot_mount_write_kernel_settings_or_make_devices") {
        return;
    }
    let (rt, _dir) = runtime("caps").await;
    let script = "exec > /root/out 2>&1; \
                  mount -t tmpfs none /mnt && echo mounted; \
                  cat /proc/sys/vm/overcommit_memory > /proc/sys/vm/overcommit_memory && echo wrote-sysctl; \
                  mknod /root/disk b 254 0 && echo made-device; \
                  cat /proc/timer_list | wc -c; \
                  echo 0 > /usr/oka-probe && echo wrote-usr; \
                  echo END; exec sleep 1000";
    let spec = sh("caps", script);
    rt.ensure(&spec).await.unwrap();
    let out = wait_for_file(&rt, &spec.id, "/root/out", "END").await;
    eprintln!("{out}");
    for forbidden in ["mounted", "wrote-sysctl", "made-device", "wrote-usr"] {
        assert!(!out.lines().any(|l| l == forbidden), "{forbidden} in:\n{out}");
    }
    assert!(out.lines().any(|l| l.trim() == "0"), "/proc/timer_list is masked:\n{out}");
    assert!(!std::path::Path::new("/usr/oka-probe").exists());
    rt.delete(&spec.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_written_to_the_sandbox_cgroups() {
    if !root_or_skip("limits_are_written_to_the_sandbox_cgroups") {
        return;
    }
    let (rt, _dir) = runtime("limits").await;
    let mut spec = sh("limited", "exec sleep 1000");
    spec.resources.cpu_millis = Some(500);
    spec.resources.memory_bytes = Some(128 << 20);
    spec.resources.pids = Some(100);
    rt.ensure(&spec).await.unwrap();
    let cgroup = rt.cgroup_paths(&spec.id).await.unwrap();
    let read = |c: Controller, file: &str| {
        let dir = cgroup.v1.iter().find(|(k, _)| *k == c).map(|(_, p)| p.join(file));
        dir.map(|p| std::fs::read_to_string(p).unwrap().trim().to_owned())
    };
    if cgroup.v1.is_empty() {
        eprintln!("pure cgroup v2 machine: checking the unified files");
        let dir = cgroup.v2.clone().unwrap();
        let get = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap().trim().to_owned();
        assert_eq!(get("cpu.max"), "50000 100000");
        assert_eq!(get("memory.max"), (128u64 << 20).to_string());
        assert_eq!(get("pids.max"), "100");
    } else {
        assert_eq!(read(Controller::Cpu, "cpu.cfs_quota_us").as_deref(), Some("50000"));
        assert_eq!(read(Controller::Cpu, "cpu.cfs_period_us").as_deref(), Some("100000"));
        assert_eq!(
            read(Controller::Memory, "memory.limit_in_bytes"),
            Some((128u64 << 20).to_string())
        );
        assert_eq!(read(Controller::Memory, "memory.swappiness").as_deref(), Some("0"));
        assert_eq!(read(Controller::Pids, "pids.max").as_deref(), Some("100"));
    }
    let procs = std::fs::read_to_string(cgroup.dirs()[0].join("cgroup.procs")).unwrap();
    let status = rt.inspect(&spec.id).await.unwrap();
    assert!(
        procs.lines().any(|p| p.trim() == status.pid.unwrap().to_string()),
        "the init is in its cgroup"
    );
    rt.delete(&spec.id).await.unwrap();
}

extern "C" fn ignore_usr1(_: libc::c_int) {}

/// A daemon blocks, ignores and handles signals of its own; none of that may reach a sandbox.
/// The runtime's threads here block SIGUSR2, and the process ignores SIGHUP and handles SIGUSR1:
/// the sandbox's command still starts with no signal blocked, ignored or caught.
#[test]
fn a_sandbox_starts_with_a_clean_signal_state_whatever_the_runtime_blocks_or_handles() {
    if !root_or_skip(
        "a_sandbox_starts_with_a_clean_signal_state_whatever_the_runtime_blocks_or_handles",
    ) {
        return;
    }
    // SAFETY: a handler that does nothing, and SIG_IGN; both for this test process only.
    unsafe {
        libc::signal(libc::SIGUSR1, ignore_usr1 as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| {
            // SAFETY: blocks SIGUSR2 in the calling (runtime) thread only.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR2);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
        })
        .build()
        .unwrap();
    tokio.block_on(async {
        let (rt, _dir) = runtime("signals").await;
        // `grep` reads its own status: what `sh` passed on, which is what the init gave it.
        let script = "cat /proc/self/status | grep -E '^Sig(Blk|Ign|Cgt)' > /root/sig; \
                      echo END >> /root/sig; exec sleep 1000";
        let spec = sh("signals", script);
        rt.ensure(&spec).await.unwrap();
        let sig = wait_for_file(&rt, &spec.id, "/root/sig", "END").await;
        for line in sig.lines().filter(|l| l.starts_with("Sig")) {
            let (name, mask) = line.split_once(':').unwrap();
            assert_eq!(mask.trim(), "0000000000000000", "{name} of the sandbox's command:\n{sig}");
        }
        assert_eq!(sig.lines().count(), 4, "{sig}");
        rt.delete(&spec.id).await.unwrap();
    });
}

/// Copies each of `programs` (host paths) to the same path under `root`, with the shared
/// libraries and loader `ldd` names for it (and for the test's init, which runs from the root's
/// loader too), so a sandbox can run them on a root with nothing of the host's.
fn install_with_libraries(root: &std::path::Path, programs: &[&str]) {
    let copy = |from: &std::path::Path| {
        let to = root.join(from.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    };
    let init = init_binary();
    let mut inputs: Vec<&std::path::Path> = programs.iter().map(std::path::Path::new).collect();
    inputs.push(&init);
    for program in inputs {
        if program != init {
            copy(program);
        }
        let ldd = std::process::Command::new("ldd").arg(program).output().unwrap();
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            let path = line.split_whitespace().find(|w| w.starts_with('/'));
            if let Some(lib) = path {
                copy(std::path::Path::new(lib));
            }
        }
    }
}

/// An overlay whiteout (a `0:0` character device) at `path`: the file of the layers below is
/// hidden, as an OCI layer's `.wh.` entry unpacks.
fn whiteout(path: &std::path::Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        rustix::fs::makedev(0, 0),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_layers_stack_bottom_first_with_whiteouts_and_nothing_of_the_host() {
    if !root_or_skip("image_layers_stack_bottom_first_with_whiteouts_and_nothing_of_the_host") {
        return;
    }
    let layers = tempfile::tempdir().unwrap();
    let layer = |name: &str| {
        let dir = layers.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    };
    let write = |dir: &std::path::Path, rel: &str, body: &str| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    };
    // bottom: a shell and its C library, a hosts file, files the upper layers change.
    let bottom = layer("bottom");
    install_with_libraries(&bottom, &["/bin/sh", "/bin/cat"]);
    std::fs::create_dir_all(bottom.join("root")).unwrap();
    write(&bottom, "etc/hosts", "10.9.8.7\timage-host\n");
    write(&bottom, "data/winner", "bottom\n");
    write(&bottom, "data/deleted", "bottom\n");
    write(&bottom, "data/kept", "bottom\n");
    let middle = layer("middle");
    write(&middle, "data/winner", "middle\n");
    write(&middle, "data/middle-only", "middle\n");
    let top = layer("top");
    write(&top, "data/winner", "top\n");
    whiteout(&top.join("data/deleted"));

    let script = "exec > /root/out 2>&1\n\
                  cat /data/winner /data/kept /data/middle-only\n\
                  if [ -e /data/deleted ]; then echo deleted-visible; else echo deleted-hidden; fi\n\
                  if [ -e /usr/bin/python3 ]; then echo host-usr; else echo no-host-usr; fi\n\
                  cat /etc/hostname /etc/hosts\n\
                  echo END";
    let (rt, _dir) = runtime("layers").await;
    let expected = |host: &str| {
        format!(
            "top\nbottom\nmiddle\ndeleted-hidden\nno-host-usr\n{host}\n10.9.8.7\timage-host\n\
             127.0.1.1\t{host}\nEND\n"
        )
    };

    // Three layers: one mount(2) with `lowerdir=top:middle:bottom`.
    let mut spec = sh("layers", script);
    spec.root = oka_runtime_api::RootFs::Layers(vec![bottom.clone(), middle.clone(), top.clone()]);
    rt.ensure(&spec).await.unwrap();
    assert_eq!(wait_for_file(&rt, &spec.id, "/root/out", "END").await, expected("layers"));
    rt.delete(&spec.id).await.unwrap();

    // Sixty more layers under long paths: the joined options exceed a page, so the overlay is
    // mounted layer by layer (`lowerdir+`), with the same result.
    let deep = "d".repeat(60);
    let mut many = vec![bottom];
    many.extend((0..60).map(|i| layer(&format!("{deep}/{i:03}"))));
    many.extend([middle, top]);
    let joined: usize = many.iter().map(|l| l.as_os_str().len() + 1).sum();
    assert!(joined > 4096, "the layers' paths must not fit in one page: {joined}");
    let mut spec = sh("layers-many", script);
    spec.root = oka_runtime_api::RootFs::Layers(many);
    rt.ensure(&spec).await.unwrap();
    assert_eq!(wait_for_file(&rt, &spec.id, "/root/out", "END").await, expected("layers-many"));
    rt.delete(&spec.id).await.unwrap();
}
