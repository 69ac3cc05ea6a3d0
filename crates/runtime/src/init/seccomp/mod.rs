//! The sandbox's system call filter: the rules of Docker's default seccomp profile (moby's
//! `profiles/seccomp/default.json`), compiled to classic BPF for x86_64 by a pure planner
//! ([`program`]) and installed by the init ([`install`]) before it starts anything.
//!
//! The policy, for a sandbox that keeps the capability set `kept`:
//! - a system call of another architecture (`i386` through `int 0x80`, x32) kills the process:
//!   the compatibility entry points are a large attack surface no sandbox program needs;
//! - the syscalls of [`ALLOWED`] (Docker's unconditional allowlist, with the calls added to it
//!   up to Linux 6.13) are allowed, and so are `arch_prctl` and `modify_ldt` (x86's own) and
//!   `ptrace`, `process_vm_readv`/`writev` (Docker allows them since Linux 4.8, where seccomp is
//!   checked again after a tracer changed a call; the capability checks of ptrace still hold);
//! - `personality` only with the values Docker allows ([`PERSONALITIES`]); `socket` for any
//!   family but `AF_VSOCK` (a channel to the host's hypervisor);
//! - without `CAP_SYS_ADMIN`: `clone` only without namespace flags ([`CLONE_NAMESPACES`]),
//!   `clone3` answered `ENOSYS` (its flags are behind a pointer a filter cannot read; the C
//!   library then falls back to `clone`), and none of mount, namespaces, `bpf`,
//!   `perf_event_open`, `fanotify_init`, quotas, host names, `syslog`;
//! - each group of [`CAPABILITY_GATED`] is allowed only when its capability is kept, so a
//!   template's `capabilities.add` keeps working (`SYS_PTRACE`, `SYS_MODULE`, `SYS_BOOT`,
//!   `SYS_TIME`, `SYS_NICE`, `SYSLOG`, `SYS_RAWIO`, `SYS_PACCT`, `SYS_CHROOT`, `BPF`,
//!   `PERFMON`, `DAC_READ_SEARCH`, `SYS_TTY_CONFIG`);
//! - any other call this table knows (keyrings, `kexec_load`, `userfaultfd`, `io_uring_*`,
//!   swap, `pivot_root`, ...) fails with `EPERM`, Docker's default action; a call numbered above
//!   every call the table knows fails with `ENOSYS`, so a C library built for a newer kernel
//!   falls back to the older call as it would on an older kernel (what runc does too).
//!
//! Why hand-written BPF rather than libseccomp or a crate: the program is a few hundred
//! instructions of one shape (compare the number, maybe one argument word, return), the
//! init is static and has no C dependencies, and the tests run the program itself through
//! an interpreter of the same instructions the kernel runs.
//!
//! Arguments are compared on their low 32 bits: every argument the rules test is an `int` or
//! flags whose bits all live there (`clone`'s namespace flags), and the kernel reads no more.
//! On other architectures there is no program ([`program`] returns `None`): the sandbox then
//! runs with capabilities and namespaces only.

use std::io;

mod x86_64;

pub use x86_64::X86_64;

/// `AUDIT_ARCH_X86_64` (`linux/audit.h`).
pub const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// The bit that marks an x32 system call number on x86_64.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `EPERM`, Docker's answer to a call it does not allow.
pub const EPERM: u16 = 1;
/// `ENOSYS`: what a kernel without the call answers.
pub const ENOSYS: u16 = 38;
/// `AF_VSOCK`.
pub const AF_VSOCK: u32 = 40;
/// `CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET`.
pub const CLONE_NAMESPACES: u32 = 0x7E02_0000;
/// The `personality` values Docker allows: `PER_LINUX`, `UNAME26`, `ADDR_NO_RANDOMIZE`, both,
/// and the query `0xffffffff`.
pub const PERSONALITIES: &[u32] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xFFFF_FFFF];

/// What a filter answers (`SECCOMP_RET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run the call.
    Allow,
    /// Fail it with this errno.
    Errno(u16),
    /// Kill the whole process (`SIGSYS`).
    KillProcess,
}

impl Action {
    /// The filter's return value.
    pub const fn ret(self) -> u32 {
        match self {
            Self::Allow => 0x7FFF_0000,
            Self::Errno(e) => 0x0005_0000 | e as u32,
            Self::KillProcess => 0x8000_0000,
        }
    }
}

/// One classic BPF instruction, laid out as the kernel's `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Instruction {
    /// Operation.
    pub code: u16,
    /// Jump offset when the test holds.
    pub jt: u8,
    /// Jump offset when it does not.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

/// `BPF_LD | BPF_W | BPF_ABS`.
const LD_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA`.
const JA: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const JEQ: u16 = 0x15;
/// `BPF_JMP | BPF_JGT | BPF_K`.
const JGT: u16 = 0x25;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const JGE: u16 = 0x35;
/// `BPF_JMP | BPF_JSET | BPF_K`.
const JSET: u16 = 0x45;
/// `BPF_RET | BPF_K`.
const RET: u16 = 0x06;

/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
const fn arg_low_offset(arg: u8) -> u32 {
    16 + 8 * arg as u32
}

const fn ins(code: u16, jt: u8, jf: u8, k: u32) -> Instruction {
    Instruction { code, jt, jf, k }
}

/// When a call the policy names is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// Always, with this action.
    Always(Action),
    /// Allowed when the low word of argument `arg` is one of `values`.
    ArgOneOf {
        /// Argument index.
        arg: u8,
        /// Allowed values.
        values: Vec<u32>,
    },
    /// Allowed when argument `arg` has none of the bits of `mask`.
    ArgNoBits {
        /// Argument index.
        arg: u8,
        /// Forbidden bits.
        mask: u32,
    },
    /// Allowed when argument `arg` is not `value`.
    ArgNot {
        /// Argument index.
        arg: u8,
        /// Forbidden value.
        value: u32,
    },
}

/// Capability numbers (`linux/capability.h`) the gated groups name.
mod cap {
    pub const DAC_READ_SEARCH: u32 = 2;
    pub const SYS_MODULE: u32 = 16;
    pub const SYS_RAWIO: u32 = 17;
    pub const SYS_CHROOT: u32 = 18;
    pub const SYS_PTRACE: u32 = 19;
    pub const SYS_PACCT: u32 = 20;
    pub const SYS_ADMIN: u32 = 21;
    pub const SYS_BOOT: u32 = 22;
    pub const SYS_NICE: u32 = 23;
    pub const SYS_TIME: u32 = 25;
    pub const SYS_TTY_CONFIG: u32 = 26;
    pub const SYSLOG: u32 = 34;
    pub const PERFMON: u32 = 38;
    pub const BPF: u32 = 39;
}

/// Docker's unconditional allowlist, as x86_64 has it, without `io_uring_*` (Docker removed
/// them in 25.0, as containerd did: a ring performs I/O the filter never sees, and it has been
/// the way out of many a container).
pub const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "clock_adjtime",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_waitv",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "socketpair",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
];

/// Calls Docker's profile allows since Linux 6.13 (moby's update to libseccomp 2.6): newer
/// syscalls of the same kinds as [`ALLOWED`] (xattrs at a directory, futex variants, mount
/// listings, `mseal`, `cachestat`, `fchmodat2`).
pub const ALLOWED_SINCE_6_13: &[&str] = &[
    "cachestat",
    "fchmodat2",
    "futex_requeue",
    "futex_wait",
    "futex_wake",
    "getxattrat",
    "listmount",
    "listxattrat",
    "lsm_get_self_attr",
    "lsm_list_modules",
    "lsm_set_self_attr",
    "map_shadow_stack",
    "mseal",
    "removexattrat",
    "setxattrat",
    "statmount",
    "uretprobe",
];

/// x86_64 only: `arch_prctl` and `modify_ldt` (Docker's `amd64` rules); `ptrace` and the
/// cross-process memory calls (Docker's `minKernel: 4.8` rule).
pub const ALLOWED_X86_64: &[&str] =
    &["arch_prctl", "modify_ldt", "ptrace", "process_vm_readv", "process_vm_writev"];

/// Calls allowed only while the sandbox keeps a capability: Docker's `includes.caps` rules.
pub const CAPABILITY_GATED: &[(u32, &[&str])] = &[
    (cap::DAC_READ_SEARCH, &["open_by_handle_at"]),
    (
        cap::SYS_ADMIN,
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount2",
            "unshare",
        ],
    ),
    (cap::SYS_BOOT, &["reboot"]),
    (cap::SYS_CHROOT, &["chroot"]),
    (cap::SYS_MODULE, &["delete_module", "init_module", "finit_module"]),
    (cap::SYS_PACCT, &["acct"]),
    (
        cap::SYS_PTRACE,
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
    ),
    (cap::SYS_RAWIO, &["iopl", "ioperm"]),
    (cap::SYS_TIME, &["settimeofday", "clock_settime"]),
    (cap::SYS_TTY_CONFIG, &["vhangup"]),
    (cap::SYS_NICE, &["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"]),
    (cap::SYSLOG, &["syslog"]),
    (cap::BPF, &["bpf"]),
    (cap::PERFMON, &["perf_event_open"]),
];

/// The x86_64 number of the system call `name`.
pub fn number(name: &str) -> Option<u32> {
    X86_64.iter().find(|(n, _)| *n == name).map(|(_, nr)| *nr)
}

/// The highest call number the table knows; anything above answers `ENOSYS`.
pub fn highest_known() -> u32 {
    X86_64.iter().map(|(_, nr)| *nr).max().unwrap_or(0)
}

/// The rules for a sandbox keeping the capabilities of the bit mask `kept` (bit `n` is
/// capability `n`), by call number; a number without a rule fails with `EPERM`.
pub fn policy(kept: u64) -> std::collections::BTreeMap<u32, Rule> {
    let has = |c: u32| kept & (1u64 << c) != 0;
    let mut rules = std::collections::BTreeMap::new();
    let mut allow = |name: &str, rule: Rule| {
        if let Some(nr) = number(name) {
            rules.insert(nr, rule);
        }
    };
    for name in ALLOWED.iter().chain(ALLOWED_SINCE_6_13).chain(ALLOWED_X86_64) {
        allow(name, Rule::Always(Action::Allow));
    }
    allow("personality", Rule::ArgOneOf { arg: 0, values: PERSONALITIES.to_vec() });
    allow("socket", Rule::ArgNot { arg: 0, value: AF_VSOCK });
    if !has(cap::SYS_ADMIN) {
        allow("clone", Rule::ArgNoBits { arg: 0, mask: CLONE_NAMESPACES });
        allow("clone3", Rule::Always(Action::Errno(ENOSYS)));
    }
    for (capability, names) in CAPABILITY_GATED {
        if has(*capability) {
            for name in *names {
                allow(name, Rule::Always(Action::Allow));
            }
        }
    }
    rules
}

/// The longest run of compares that jump to one shared `ret` (a jump offset is a byte).
const CHUNK: usize = 250;

/// The BPF program of [`policy`]`(kept)`; `None` on an architecture the filter does not cover.
pub fn program(kept: u64) -> Option<Vec<Instruction>> {
    cfg!(target_arch = "x86_64").then(|| compile(&policy(kept)))
}

/// Compiles rules by call number into a program for x86_64: the architecture check, the
/// x32 and unknown-number checks, the always-allowed calls in runs of compares that share one
/// `ret`, then one block per other rule, and `EPERM` at the end.
pub fn compile(rules: &std::collections::BTreeMap<u32, Rule>) -> Vec<Instruction> {
    let deny = Action::Errno(EPERM).ret();
    let allow = Action::Allow.ret();
    let mut prog = vec![
        ins(LD_ABS, 0, 0, ARCH_OFFSET),
        ins(JEQ, 1, 0, AUDIT_ARCH_X86_64),
        ins(RET, 0, 0, Action::KillProcess.ret()),
        ins(LD_ABS, 0, 0, NR_OFFSET),
        ins(JGE, 0, 1, X32_SYSCALL_BIT),
        ins(RET, 0, 0, Action::KillProcess.ret()),
        ins(JGT, 0, 1, highest_known()),
        ins(RET, 0, 0, Action::Errno(ENOSYS).ret()),
    ];
    let plain: Vec<u32> = rules
        .iter()
        .filter(|(_, r)| **r == Rule::Always(Action::Allow))
        .map(|(nr, _)| *nr)
        .collect();
    for chunk in plain.chunks(CHUNK) {
        let n = chunk.len();
        for (i, nr) in chunk.iter().enumerate() {
            // From compare i, the shared `ret` is past the compares after it and the `ja`.
            prog.push(ins(JEQ, jump(n - i), 0, *nr));
        }
        prog.push(ins(JA, 0, 0, 1));
        prog.push(ins(RET, 0, 0, allow));
    }
    for (nr, rule) in rules {
        let body = match rule {
            Rule::Always(Action::Allow) => continue,
            Rule::Always(action) => vec![ins(RET, 0, 0, action.ret())],
            Rule::ArgOneOf { arg, values } => {
                let n = values.len();
                let mut body = vec![ins(LD_ABS, 0, 0, arg_low_offset(*arg))];
                for (i, v) in values.iter().enumerate() {
                    body.push(ins(JEQ, jump(n - i), 0, *v));
                }
                body.extend([ins(RET, 0, 0, deny), ins(RET, 0, 0, allow)]);
                body
            }
            Rule::ArgNoBits { arg, mask } => vec![
                ins(LD_ABS, 0, 0, arg_low_offset(*arg)),
                ins(JSET, 0, 1, *mask),
                ins(RET, 0, 0, deny),
                ins(RET, 0, 0, allow),
            ],
            Rule::ArgNot { arg, value } => vec![
                ins(LD_ABS, 0, 0, arg_low_offset(*arg)),
                ins(JEQ, 0, 1, *value),
                ins(RET, 0, 0, deny),
                ins(RET, 0, 0, allow),
            ],
        };
        // Every body ends in `ret`, so skipping it leaves the call number in the accumulator.
        prog.push(ins(JEQ, 0, jump(body.len()), *nr));
        prog.extend(body);
    }
    prog.push(ins(RET, 0, 0, deny));
    prog
}

/// A jump offset; the planner keeps every one below 256.
fn jump(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// Installs `prog` as the calling thread's filter (inherited by every child from then on).
/// The caller has `no_new_privs` set or `CAP_SYS_ADMIN`; the init is single-threaded, so no
/// other thread is left without it.
pub fn install(prog: &[Instruction]) -> io::Result<()> {
    let filters: Vec<libc::sock_filter> = prog
        .iter()
        .map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k })
        .collect();
    let len = u16::try_from(filters.len()).map_err(|_| io::Error::other("filter too long"))?;
    let fprog = libc::sock_fprog { len, filter: filters.as_ptr().cast_mut() };
    // SAFETY: `fprog` points at `len` initialised instructions that outlive the call; the
    // kernel copies them.
    let rc = unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const _, 0, 0)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `prog` on a `struct seccomp_data` as the kernel does; returns its answer.
    fn run(prog: &[Instruction], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let word = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => arch,
                o if (16..64).contains(&o) => {
                    let a = args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 { a as u32 } else { (a >> 32) as u32 }
                }
                o => panic!("load at {o}"),
            }
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = prog[pc];
            pc += 1;
            let cond = match i.code {
                LD_ABS => {
                    acc = word(i.k);
                    continue;
                }
                RET => return i.k,
                JA => {
                    pc += i.k as usize;
                    continue;
                }
                JEQ => acc == i.k,
                JGT => acc > i.k,
                JGE => acc >= i.k,
                JSET => acc & i.k != 0,
                c => panic!("opcode {c:#x}"),
            };
            pc += if cond { i.jt } else { i.jf } as usize;
        }
    }

    const DEFAULT_CAPS: u64 = crate::init::run::KEPT_CAPABILITIES.bits();

    fn call(kept: u64, name: &str, args: [u64; 6]) -> u32 {
        let prog = compile(&policy(kept));
        run(&prog, AUDIT_ARCH_X86_64, number(name).unwrap(), args)
    }

    fn call0(kept: u64, name: &str) -> u32 {
        call(kept, name, [0; 6])
    }

    const ALLOW: u32 = Action::Allow.ret();
    const DENY: u32 = Action::Errno(EPERM).ret();

    #[test]
    fn every_name_is_an_x86_64_call() {
        let gated = CAPABILITY_GATED.iter().flat_map(|(_, names)| names.iter());
        for name in ALLOWED.iter().chain(ALLOWED_SINCE_6_13).chain(ALLOWED_X86_64).chain(gated) {
            assert!(number(name).is_some(), "{name}");
        }
        #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
        for (name, nr) in [
            ("read", libc::SYS_read),
            ("clone3", libc::SYS_clone3),
            ("mseal", libc::SYS_mseal),
            ("keyctl", libc::SYS_keyctl),
            ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ] {
            assert_eq!(number(name), u32::try_from(nr).ok(), "{name}");
        }
    }

    #[test]
    fn the_default_set_allows_ordinary_calls_and_refuses_the_kernels_own() {
        for name in ["read", "write", "openat", "mmap", "execve", "wait4", "setuid", "mknodat"] {
            assert_eq!(call0(DEFAULT_CAPS, name), ALLOW, "{name}");
        }
        // chroot: the default set keeps SYS_CHROOT, as Docker's does.
        assert_eq!(call0(DEFAULT_CAPS, "chroot"), ALLOW);
        for name in [
            "mount",
            "umount2",
            "unshare",
            "setns",
            "add_key",
            "keyctl",
            "request_key",
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "reboot",
            "bpf",
            "perf_event_open",
            "open_by_handle_at",
            "pivot_root",
            "swapon",
            "userfaultfd",
            "io_uring_setup",
            "settimeofday",
            "acct",
            "iopl",
            "syslog",
            "kcmp",
            "mbind",
        ] {
            assert_eq!(call0(DEFAULT_CAPS, name), DENY, "{name}");
        }
    }

    #[test]
    fn arguments_decide_clone_socket_and_personality() {
        let clone = |flags: u64| call(DEFAULT_CAPS, "clone", [flags, 0, 0, 0, 0, 0]);
        // A thread (glibc's flags) and a fork are allowed; any namespace flag is not.
        assert_eq!(clone(0x003D_0F00), ALLOW);
        assert_eq!(clone(libc::SIGCHLD as u64 | 0x0120_0000), ALLOW);
        for ns in [0x1000_0000u64, 0x0002_0000, 0x4000_0000, 0x2000_0000, 0x0200_0000] {
            assert_eq!(clone(ns | libc::SIGCHLD as u64), DENY, "{ns:#x}");
        }
        assert_eq!(call0(DEFAULT_CAPS, "clone3"), Action::Errno(ENOSYS).ret());
        let socket = |family: u64| call(DEFAULT_CAPS, "socket", [family, 1, 0, 0, 0, 0]);
        assert_eq!(socket(2), ALLOW);
        assert_eq!(socket(17), ALLOW, "AF_PACKET is the capabilities' business (NET_RAW)");
        assert_eq!(socket(40), DENY);
        let personality = |p: u64| call(DEFAULT_CAPS, "personality", [p, 0, 0, 0, 0, 0]);
        for p in [0, 8, 0x2_0000, 0x2_0008, 0xFFFF_FFFF] {
            assert_eq!(personality(p), ALLOW, "{p:#x}");
        }
        assert_eq!(personality(0x0040_0000), DENY, "READ_IMPLIES_EXEC");
    }

    #[test]
    fn added_capabilities_open_their_groups() {
        let with = |c: u32| DEFAULT_CAPS | (1u64 << c);
        let admin = with(cap::SYS_ADMIN);
        assert_eq!(call(admin, "clone", [0x1000_0000, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call0(admin, "clone3"), ALLOW);
        assert_eq!(call0(admin, "mount"), ALLOW);
        assert_eq!(call0(admin, "unshare"), ALLOW);
        assert_eq!(call0(with(cap::SYS_PTRACE), "kcmp"), ALLOW);
        assert_eq!(call0(with(cap::SYS_MODULE), "finit_module"), ALLOW);
        assert_eq!(call0(with(cap::SYS_BOOT), "reboot"), ALLOW);
        assert_eq!(call0(with(cap::SYS_TIME), "clock_settime"), ALLOW);
        assert_eq!(call0(with(cap::BPF), "bpf"), ALLOW);
        assert_eq!(call0(with(cap::PERFMON), "perf_event_open"), ALLOW);
        assert_eq!(call0(with(cap::DAC_READ_SEARCH), "open_by_handle_at"), ALLOW);
        // Dropping SYS_CHROOT takes chroot away; keyrings stay closed whatever is kept.
        assert_eq!(call0(DEFAULT_CAPS & !(1u64 << cap::SYS_CHROOT), "chroot"), DENY);
        assert_eq!(call0(u64::MAX, "keyctl"), DENY);
    }

    #[test]
    fn other_architectures_are_killed_and_newer_calls_are_unknown() {
        let prog = compile(&policy(DEFAULT_CAPS));
        let kill = Action::KillProcess.ret();
        assert_eq!(run(&prog, 0x4000_0003, 0, [0; 6]), kill, "i386");
        assert_eq!(run(&prog, AUDIT_ARCH_X86_64, X32_SYSCALL_BIT, [0; 6]), kill, "x32 read");
        assert_eq!(run(&prog, AUDIT_ARCH_X86_64, 999, [0; 6]), Action::Errno(ENOSYS).ret());
        assert_eq!(run(&prog, AUDIT_ARCH_X86_64, 466, [0; 6]), ALLOW, "removexattrat");
    }

    #[test]
    fn every_jump_lands_inside_the_program() {
        for kept in [0, DEFAULT_CAPS, u64::MAX] {
            let prog = compile(&policy(kept));
            assert!(prog.len() < 4096, "BPF_MAXINSNS");
            for (pc, i) in prog.iter().enumerate() {
                if i.code == RET {
                    continue;
                }
                let far = if i.code == JA { i.k as usize } else { i.jt.max(i.jf) as usize };
                assert!(pc + 1 + far < prog.len(), "{pc}: {i:?}");
                assert!(i.jt < u8::MAX && i.jf < u8::MAX, "{pc}: {i:?}");
            }
            assert_eq!(prog.last().map(|i| i.k), Some(DENY));
        }
    }
}
