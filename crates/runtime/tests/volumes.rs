//! Volumes and security settings of real sandboxes: each volume kind mounted where the spec
//! says, read-only where it says, a sub-path, a read-only root with writable volumes, what
//! survives a stop, a pause and a hibernation, capabilities and `no_new_privs`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use oka_runtime_api::{
    HostPathKind, Medium, Mount, MountSource, Runtime, SandboxState, Security, VolumeFile,
};

fn mount(target: &str, source: MountSource) -> Mount {
    Mount { target: target.into(), source, sub_path: None, read_only: false }
}

fn empty_dir(volume: &str, medium: Medium) -> MountSource {
    MountSource::EmptyDir { volume: volume.into(), medium }
}

/// Reads `name` of disk emptyDir `volume` of sandbox `id` from the host.
async fn read_volume(
    rt: &oka_runtime::local::LocalRuntime,
    id: &oka_runtime_api::SandboxId,
    volume: &str,
    name: &str,
) -> Option<String> {
    let dir = rt.paths(id).await?.dir;
    std::fs::read_to_string(dir.join("volumes").join(volume).join(name)).ok()
}

async fn wait_for_volume_file(
    rt: &oka_runtime::local::LocalRuntime,
    id: &oka_runtime_api::SandboxId,
    volume: &str,
    name: &str,
) -> String {
    poll(&format!("{volume}/{name} ending with END"), Duration::from_secs(20), || async {
        read_volume(rt, id, volume, name).await.filter(|s| s.lines().last() == Some("END"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_volume_kind_is_mounted_as_the_spec_says() {
    if !root_or_skip("each_volume_kind_is_mounted_as_the_spec_says") {
        return;
    }
    let (rt, dir) = runtime("volumes").await;
    let host = dir.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("greeting"), "hello from the host\n").unwrap();
    let made_dir = dir.path().join("made/by/kubelet-rules");
    let made_file = host.join("made-file");

    let script = "exec > /scratch/out 2>&1; \
        cat /scratch/persist 2>/dev/null; echo was-here > /scratch/persist; \
        echo mem-files $(ls /mem | wc -l); \
        cat /host/greeting; \
        echo x > /host/new && echo wrote-readonly-host; \
        echo ok > /made/probe && echo wrote-made-dir; \
        test -f /made-file && echo made-file-is-a-file; \
        echo sub > /sub/file && echo wrote-sub; \
        dd if=/dev/zero of=/mem/big bs=1024 count=2048 2>/dev/null || echo memory-full; \
        echo kept > /mem/small; \
        cat /cfg/nested/key; echo; stat -c %a /cfg/nested/key; \
        cat /cfg/other; echo; stat -c %a /cfg/other; \
        echo x > /cfg/new && echo wrote-files; \
        echo END; exec sleep 1000";
    let mut spec = sh("vols", script);
    spec.mounts = vec![
        mount("/scratch", empty_dir("scratch", Medium::Disk)),
        Mount {
            sub_path: Some("deep/sub".into()),
            ..mount("/sub", empty_dir("scratch", Medium::Disk))
        },
        Mount {
            read_only: true,
            ..mount(
                "/host",
                MountSource::HostPath { path: host.clone(), kind: HostPathKind::Directory },
            )
        },
        mount(
            "/made",
            MountSource::HostPath { path: made_dir.clone(), kind: HostPathKind::DirectoryOrCreate },
        ),
        mount(
            "/made-file",
            MountSource::HostPath { path: made_file.clone(), kind: HostPathKind::FileOrCreate },
        ),
        mount("/mem", empty_dir("mem", Medium::Memory { size_bytes: Some(1 << 20) })),
        mount(
            "/cfg",
            MountSource::Files {
                volume: "cfg".into(),
                files: vec![
                    VolumeFile { path: "nested/key".into(), mode: 0o400, content: b"v1".to_vec() },
                    VolumeFile { path: "other".into(), mode: 0o644, content: b"v2".to_vec() },
                ],
            },
        ),
    ];
    rt.ensure(&spec).await.unwrap();
    let out = wait_for_volume_file(&rt, &spec.id, "scratch", "out").await;
    eprintln!("{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(!lines.contains(&"was-here"), "{out}");
    assert!(lines.contains(&"mem-files 0") && lines.contains(&"hello from the host"), "{out}");
    assert!(!lines.contains(&"wrote-readonly-host"), "{out}");
    assert!(!host.join("new").exists());
    assert!(lines.contains(&"wrote-made-dir"), "{out}");
    assert_eq!(std::fs::read_to_string(made_dir.join("probe")).unwrap(), "ok\n");
    assert!(lines.contains(&"made-file-is-a-file"), "{out}");
    assert!(made_file.is_file());
    assert!(lines.contains(&"wrote-sub"), "{out}");
    assert_eq!(read_volume(&rt, &spec.id, "scratch", "deep/sub/file").await.unwrap(), "sub\n");
    assert!(lines.contains(&"memory-full"), "the memory emptyDir holds 1 MiB: {out}");
    let at = |v: &str| lines.iter().position(|l| *l == v).unwrap_or_else(|| panic!("{v}: {out}"));
    assert_eq!(lines[at("v1") + 1], "400", "{out}");
    assert_eq!(lines[at("v2") + 1], "644", "{out}");
    assert!(!lines.contains(&"wrote-files"), "files are mounted read-only: {out}");

    // A clone would share the original's volume directories: refused.
    let id = spec.id.clone();
    let refused = rt.snapshot(&id, &id_of("vols-snap")).await.unwrap_err();
    assert!(
        refused.to_string().contains("volumes other than memory emptyDirs cannot be snapshotted"),
        "{refused}"
    );

    // A stop and a start keep the disk emptyDir; the memory one starts empty again.
    rt.stop(&id, Duration::from_secs(5)).await.unwrap();
    std::fs::remove_file(rt.paths(&id).await.unwrap().dir.join("volumes/scratch/out")).unwrap();
    rt.ensure(&spec).await.unwrap();
    let out = wait_for_volume_file(&rt, &id, "scratch", "out").await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"was-here"), "the disk emptyDir is kept: {out}");
    assert!(lines.contains(&"mem-files 0"), "the memory one starts empty: {out}");
    assert_eq!(read_volume(&rt, &id, "scratch", "deep/sub/file").await.unwrap(), "sub\n");

    let sandbox_dir = rt.paths(&id).await.unwrap().dir;
    rt.delete(&id).await.unwrap();
    assert!(!sandbox_dir.exists(), "the sandbox's volumes go with it");
    assert!(host.join("greeting").is_file() && made_dir.is_dir(), "host paths stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_path_of_the_wrong_type_keeps_the_sandbox_from_starting() {
    if !root_or_skip("a_host_path_of_the_wrong_type_keeps_the_sandbox_from_starting") {
        return;
    }
    let (rt, dir) = runtime("hostpath-type").await;
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let mut spec = sh("wrong-type", "exec sleep 1000");
    spec.mounts = vec![mount(
        "/d",
        MountSource::HostPath { path: file.clone(), kind: HostPathKind::Directory },
    )];
    let err = rt.ensure(&spec).await.unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "hostPath type check failed: {} is not a directory",
            file.display()
        )),
        "{err}"
    );
    assert_eq!(rt.inspect(&spec.id).await.unwrap().state, SandboxState::Gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_root_keeps_volumes_and_tmp_writable() {
    if !root_or_skip("a_read_only_root_keeps_volumes_and_tmp_writable") {
        return;
    }
    let (rt, _dir) = runtime("roroot").await;
    let script = "exec > /out/log 2>&1; \
        touch /root/x && echo wrote-root; \
        touch /tmp/x && echo wrote-tmp; \
        touch /out/x && echo wrote-volume; \
        echo END; exec sleep 1000";
    let mut spec = sh("roroot", script);
    spec.security.read_only_root = true;
    spec.mounts = vec![mount("/out", empty_dir("out", Medium::Disk))];
    rt.ensure(&spec).await.unwrap();
    let out = wait_for_volume_file(&rt, &spec.id, "out", "log").await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(!lines.contains(&"wrote-root"), "{out}");
    assert!(lines.contains(&"wrote-tmp") && lines.contains(&"wrote-volume"), "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    rt.delete(&spec.id).await.unwrap();
}

/// The `Cap*` and `NoNewPrivs` lines of the sandbox command's `/proc/self/status`, with a raw
/// ICMP socket's outcome.
const SECURITY_PROBE: &str = "exec > /out/log 2>&1; \
    grep -E '^(CapBnd|CapEff|NoNewPrivs):' /proc/self/status; \
    python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)' \
      && echo raw-socket; \
    echo END; exec sleep 1000";

async fn security_probe(
    rt: &oka_runtime::local::LocalRuntime,
    name: &str,
    security: Security,
) -> String {
    let mut spec = sh(name, SECURITY_PROBE);
    spec.security = security;
    spec.mounts = vec![mount("/out", empty_dir("out", Medium::Disk))];
    rt.ensure(&spec).await.expect("ensure");
    let out = wait_for_volume_file(rt, &spec.id, "out", "log").await;
    rt.delete(&spec.id).await.expect("delete");
    out
}

fn status_field(out: &str, field: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_owned()))
        .unwrap_or_else(|| panic!("{field} in {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_added_and_dropped_and_no_new_privs_is_set() {
    if !root_or_skip("capabilities_are_added_and_dropped_and_no_new_privs_is_set") {
        return;
    }
    let (rt, _dir) = runtime("security").await;
    let default = security_probe(&rt, "caps-default", Security::default()).await;
    assert!(default.lines().any(|l| l == "raw-socket"), "NET_RAW is in the default set: {default}");
    assert_eq!(status_field(&default, "NoNewPrivs:"), "0");

    let dropped = security_probe(
        &rt,
        "caps-dropped",
        Security {
            drop_capabilities: vec!["NET_RAW".into()],
            no_new_privileges: true,
            ..Security::default()
        },
    )
    .await;
    assert!(!dropped.lines().any(|l| l == "raw-socket"), "{dropped}");
    assert!(dropped.contains("Operation not permitted"), "{dropped}");
    assert_eq!(status_field(&dropped, "NoNewPrivs:"), "1");
    let bnd = u64::from_str_radix(&status_field(&dropped, "CapBnd:"), 16).unwrap();
    assert_eq!(bnd & (1 << 13), 0, "{dropped}");
    assert_ne!(bnd & (1 << 10), 0, "NET_BIND_SERVICE stays: {dropped}");

    let only = security_probe(
        &rt,
        "caps-only",
        Security {
            drop_capabilities: vec!["ALL".into()],
            add_capabilities: vec!["CAP_NET_BIND_SERVICE".into()],
            ..Security::default()
        },
    )
    .await;
    // Drops apply after additions, as Kubernetes' runtimes apply them: nothing is left.
    assert_eq!(status_field(&only, "CapBnd:"), "0000000000000000", "{only}");

    let added = security_probe(
        &rt,
        "caps-added",
        Security { add_capabilities: vec!["NET_ADMIN".into()], ..Security::default() },
    )
    .await;
    let eff = u64::from_str_radix(&status_field(&added, "CapEff:"), 16).unwrap();
    assert_ne!(eff & (1 << 12), 0, "NET_ADMIN is added: {added}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_survive_pause_and_hibernation() {
    if !root_or_skip("volumes_survive_pause_and_hibernation") {
        return;
    }
    if !Path::new("/usr/local/sbin/criu").exists() && which("criu").is_none() {
        eprintln!("SKIPPED volumes_survive_pause_and_hibernation: no criu");
        return;
    }
    let (rt, dir) = runtime("volumes-criu").await;
    let host = dir.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    // Each second, the counter in memory and the files of every volume kind are read again.
    let script = "i=0; while true; do i=$((i+1)); \
        { echo \"$i $(cat /mem/v) $(cat /cfg/k) $(cat /host/h 2>&1)\"; echo END; } > /scratch/tick.tmp; \
        mv /scratch/tick.tmp /scratch/tick; sleep 0.2; done";
    let mut spec = sh("vols-criu", script);
    spec.mounts = vec![
        mount("/scratch", empty_dir("scratch", Medium::Disk)),
        mount("/mem", empty_dir("mem", Medium::Memory { size_bytes: Some(1 << 20) })),
        mount(
            "/cfg",
            MountSource::Files {
                volume: "cfg".into(),
                files: vec![VolumeFile { path: "k".into(), mode: 0o644, content: b"cfg".to_vec() }],
            },
        ),
        mount("/host", MountSource::HostPath { path: host.clone(), kind: HostPathKind::Directory }),
    ];
    std::fs::write(host.join("h"), "host").unwrap();
    // The memory volume's content is written before the loop starts.
    spec.process.command[2] = format!("echo mem > /mem/v; {script}");
    let id = spec.id.clone();
    rt.ensure(&spec).await.unwrap();
    let tick = wait_for_volume_file(&rt, &id, "scratch", "tick").await;
    assert!(tick.ends_with(" mem cfg host\nEND\n") || tick.contains(" mem cfg host\n"), "{tick}");

    rt.pause(&id).await.unwrap();
    rt.resume(&id).await.unwrap();
    rt.hibernate(&id).await.unwrap();
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Hibernated);
    std::fs::remove_file(dir.path().join("host/h")).unwrap();
    std::fs::write(host.join("h"), "host-after").unwrap();
    rt.restore(&id).await.unwrap();
    let count = |t: &str| t.split_whitespace().next().and_then(|n| n.parse::<u64>().ok());
    let before = count(&tick).unwrap();
    let after = poll("a tick after the restore", Duration::from_secs(20), || async {
        read_volume(&rt, &id, "scratch", "tick")
            .await
            .filter(|t| t.contains("host-after") && t.lines().last() == Some("END"))
    })
    .await;
    assert!(after.contains(" mem cfg host-after"), "memory volume restored, host bound: {after}");
    assert!(count(&after).unwrap() > before, "{after}");
    rt.delete(&id).await.unwrap();
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

fn files(content: &str) -> Mount {
    mount(
        "/cfg",
        MountSource::Files {
            volume: "cfg".into(),
            files: vec![VolumeFile { path: "k".into(), mode: 0o644, content: content.into() }],
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_file_contents_are_taken_at_the_next_start_and_nothing_else_may_change() {
    if !root_or_skip("new_file_contents_are_taken_at_the_next_start_and_nothing_else_may_change") {
        return;
    }
    let (rt, _dir) = runtime("volumes-update").await;
    let mut spec = sh("cfg-update", "{ cat /cfg/k; echo; echo END; } > /out/seen; exec sleep 1000");
    spec.mounts = vec![mount("/out", empty_dir("out", Medium::Disk)), files("v1")];
    let id = spec.id.clone();
    rt.ensure(&spec).await.unwrap();
    assert_eq!(wait_for_volume_file(&rt, &id, "out", "seen").await, "v1\nEND\n");
    let mut changed = spec.clone();
    changed.mounts[1] = files("v2");
    // Running: accepted, the sandbox keeps what it started with.
    assert_eq!(rt.ensure(&changed).await.unwrap().state, SandboxState::Running);
    rt.stop(&id, Duration::from_secs(5)).await.unwrap();
    let mut other = changed.clone();
    other.process.command[2] = "exec sleep 1".into();
    assert!(matches!(rt.ensure(&other).await, Err(oka_runtime_api::RuntimeError::SpecMismatch(_))));
    std::fs::remove_file(rt.paths(&id).await.unwrap().dir.join("volumes/out/seen")).unwrap();
    rt.ensure(&changed).await.unwrap();
    assert_eq!(wait_for_volume_file(&rt, &id, "out", "seen").await, "v2\nEND\n");
    rt.delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_and_a_read_only_root_survive_a_runtime_restart_and_a_hibernation() {
    if !root_or_skip("volumes_and_a_read_only_root_survive_a_runtime_restart_and_a_hibernation") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let script = "echo mem > /mem/v; i=0; while true; do i=$((i+1)); \
        { echo \"$i $(cat /mem/v) $(cat /cfg/k)\"; touch /root/x 2>/dev/null && echo root-writable; \
          echo END; } > /out/tick.tmp; mv /out/tick.tmp /out/tick; sleep 0.2; done";
    let mut spec = sh("vols-restart", script);
    spec.security.read_only_root = true;
    spec.mounts = vec![
        mount("/out", empty_dir("out", Medium::Disk)),
        mount("/mem", empty_dir("mem", Medium::Memory { size_bytes: Some(1 << 20) })),
        files("cfg"),
    ];
    let id = spec.id.clone();
    let rt =
        oka_runtime::local::LocalRuntime::open(config(state.clone(), "volrestart")).await.unwrap();
    rt.ensure(&spec).await.unwrap();
    let first = wait_for_volume_file(&rt, &id, "out", "tick").await;
    drop(rt);

    let rt =
        oka_runtime::local::LocalRuntime::open(config(state.clone(), "volrestart")).await.unwrap();
    assert_eq!(rt.inspect(&id).await.unwrap().state, SandboxState::Running);
    rt.ensure(&spec).await.unwrap();
    rt.hibernate(&id).await.unwrap();
    rt.restore(&id).await.unwrap();
    let count = |t: &str| t.split_whitespace().next().and_then(|n| n.parse::<u64>().ok());
    let before = count(&first).unwrap();
    let after =
        poll("a tick after the restart and the restore", Duration::from_secs(20), || async {
            read_volume(&rt, &id, "out", "tick").await.filter(|t| {
                t.lines().last() == Some("END") && count(t).is_some_and(|n| n > before + 2)
            })
        })
        .await;
    assert!(after.contains(" mem cfg\n"), "{after}");
    assert!(!after.contains("root-writable"), "the root stays read-only: {after}");
    rt.delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fs_group_owns_the_volumes_and_supplementary_groups_are_the_commands() {
    if !root_or_skip("an_fs_group_owns_the_volumes_and_supplementary_groups_are_the_commands") {
        return;
    }
    let (rt, _dir) = runtime("fsgroup").await;
    let script = "exec > /out/log 2>&1; id -u; id -G; cat /cfg/k; echo; stat -c '%a %g' /cfg/k; \
                  touch /out/mine; stat -c %g /out/mine; touch /mem/mine; stat -c %g /mem/mine; \
                  echo END; exec sleep 1000";
    let mut spec = sh("fsgroup", script);
    spec.process.user = Some(oka_runtime_api::User { uid: 1000, gid: 1000 });
    spec.process.supplementary_groups = vec![3000];
    spec.security.fs_group = Some(2000);
    spec.mounts = vec![
        mount("/out", empty_dir("out", Medium::Disk)),
        mount("/mem", empty_dir("mem", Medium::Memory { size_bytes: None })),
        mount(
            "/cfg",
            MountSource::Files {
                volume: "cfg".into(),
                files: vec![VolumeFile {
                    path: "k".into(),
                    mode: 0o400,
                    content: b"secret".to_vec(),
                }],
            },
        ),
    ];
    rt.ensure(&spec).await.unwrap();
    let out = wait_for_volume_file(&rt, &spec.id, "out", "log").await;
    assert_eq!(out, "1000\n1000 2000 3000\nsecret\n440 2000\n2000\n2000\nEND\n");
    rt.delete(&spec.id).await.unwrap();
}
