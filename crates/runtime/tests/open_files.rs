//! The open-files limit: the runtime raises the daemon's own (it holds descriptors per sandbox),
//! and sandboxes still start with the limit the daemon started with. Its own test binary: the
//! limit is process-wide and raised once.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use oka_runtime_api::Runtime as _;

fn limit() -> libc::rlimit64 {
    let mut limit = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit64 on this process, reading into a valid struct.
    assert_eq!(unsafe { libc::prlimit64(0, libc::RLIMIT_NOFILE, std::ptr::null(), &mut limit) }, 0);
    limit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_raises_its_open_files_limit_and_sandboxes_keep_the_one_it_had() {
    if !root_or_skip("the_daemon_raises_its_open_files_limit_and_sandboxes_keep_the_one_it_had") {
        return;
    }
    // Start low, as a common login default would.
    let hard = limit().rlim_max;
    let low = libc::rlimit64 { rlim_cur: 256, rlim_max: hard };
    // SAFETY: prlimit64 on this process with a valid struct.
    assert_eq!(unsafe { libc::prlimit64(0, libc::RLIMIT_NOFILE, &low, std::ptr::null_mut()) }, 0);
    let (rt, _dir) = runtime("nofile").await;
    let raised = limit();
    assert!(raised.rlim_cur > 256 && raised.rlim_cur <= hard, "{} of {hard}", raised.rlim_cur);

    let spec = sh("nofile", "ulimit -n > /root/out; echo END >> /root/out; exec sleep 1000");
    rt.ensure(&spec).await.unwrap();
    assert_eq!(wait_for_file(&rt, &spec.id, "/root/out", "END").await, "256\nEND\n");
    rt.delete(&spec.id).await.unwrap();
}
