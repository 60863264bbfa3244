//! seccomp: the syscalls a confined process may not make.
//!
//! A box's init installs them on itself, so every process of the box
//! inherits them. Unlike codex, connect/bind/listen/sendto stay allowed: a
//! box without the network has only its own loopback, and the kernels'
//! ZeroMQ channels are unix sockets the kernel binds itself.

use crate::SandboxError;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};
use std::collections::BTreeMap;

/// Denied under every confined policy: debugging other processes, io_uring
/// (it opens sockets without `socket()`), and what root could use to leave
/// the sandbox or take the machine down (capabilities are dropped too; this
/// is the second lock).
const ALWAYS_DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_open_by_handle_at,
    libc::SYS_userfaultfd,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
];

/// Denied in a box on top of [`ALWAYS_DENIED`]: making or entering
/// namespaces and changing mounts (the box's view stays the view; a nested
/// user namespace would hand out capabilities again), the kernel keyrings
/// (shared per uid, outside every namespace), the kernel log, raw ports.
const BOX_DENIED: &[i64] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_quotactl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `clone` flags that make a namespace: refused in a box.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x0000_0080, // CLONE_NEWTIME
];

/// Terminal ioctls that push input or reach the console: refused whatever
/// the terminal (a boxed process has none of its own; this is the second lock).
const DENIED_IOCTLS: &[u64] = &[
    libc::TIOCSTI,
    0x541C, // TIOCLINUX
];

/// The box's filters, in the order they are installed. The first denies
/// with EPERM; the second answers `clone3` with ENOSYS, so that libc falls
/// back to `clone`, whose flags the first can see (`clone3` passes them in
/// memory, out of seccomp's reach).
pub fn box_program(socket_domains: &[i32]) -> Result<Vec<BpfProgram>, SandboxError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALWAYS_DENIED
        .iter()
        .chain(BOX_DENIED)
        .map(|nr| (*nr, Vec::new()))
        .collect();
    let mut socket_rules = vec![domain_not_in(socket_domains)?];
    if socket_domains.contains(&libc::AF_NETLINK) {
        // Netlink is allowed for its route family only (what ZeroMQ and
        // getifaddrs read): sock_diag would list the sockets of the box's
        // network namespace (the host's, in a box with the network), and
        // the audit, uevent and other families have nothing for a box.
        socket_rules.push(
            SeccompRule::new(vec![
                SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    libc::AF_NETLINK as u64,
                )
                .map_err(seccomp_err)?,
                SeccompCondition::new(
                    2,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Ne,
                    libc::NETLINK_ROUTE as u64,
                )
                .map_err(seccomp_err)?,
            ])
            .map_err(seccomp_err)?,
        );
    }
    rules.insert(libc::SYS_socket, socket_rules);
    rules.insert(libc::SYS_socketpair, vec![domain_not_in(socket_domains)?]);
    let flag_rule = |flag: u64| {
        SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(flag),
            flag,
        )
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(seccomp_err)
    };
    rules.insert(
        libc::SYS_clone,
        NAMESPACE_FLAGS
            .iter()
            .map(|f| flag_rule(*f))
            .collect::<Result<_, _>>()?,
    );
    rules.insert(
        libc::SYS_ioctl,
        DENIED_IOCTLS
            .iter()
            .map(|req| {
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *req)
                    .and_then(|c| SeccompRule::new(vec![c]))
                    .map_err(seccomp_err)
            })
            .collect::<Result<_, _>>()?,
    );
    let main = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target_arch(),
    )
    .map_err(seccomp_err)?;
    let mut main: BpfProgram = main.try_into().map_err(seccomp_err)?;
    deny_x32(&mut main);
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target_arch(),
    )
    .map_err(seccomp_err)?;
    Ok(vec![main, clone3.try_into().map_err(seccomp_err)?])
}

fn target_arch() -> TargetArch {
    if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        TargetArch::x86_64
    }
}

fn seccomp_err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Seccomp(e.to_string())
}

/// A rule that matches when the domain (argument 0) is none of `allowed`.
fn domain_not_in(allowed: &[i32]) -> Result<SeccompRule, SandboxError> {
    let conditions = allowed
        .iter()
        .map(|d| {
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *d as u64)
                .map_err(seccomp_err)
        })
        .collect::<Result<Vec<_>, _>>()?;
    SeccompRule::new(conditions).map_err(seccomp_err)
}

/// On x86_64 the x32 ABI reaches the same syscalls under numbers with bit 30
/// set, which the rule map does not list: refuse them all. seccompiler's
/// program starts with the arch check (3 instructions) and loads the syscall
/// number (1); the two inserted instructions test it and fall through to the
/// unchanged rest, whose jumps are relative and stay valid.
fn deny_x32(prog: &mut BpfProgram) {
    if !cfg!(target_arch = "x86_64") || prog.len() < 4 {
        return;
    }
    const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let test = sock_filter {
        code: BPF_JMP_JGE_K,
        jt: 0,
        jf: 1,
        k: X32_SYSCALL_BIT,
    };
    let deny = sock_filter {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k: SECCOMP_RET_ERRNO | libc::EPERM as u32,
    };
    prog.splice(4..4, [test, deny]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_box_programs_build_with_the_x32_guard_and_clone3_apart() {
        let progs = box_program(&[libc::AF_UNIX]).unwrap();
        assert_eq!(progs.len(), 2);
        let p = &progs[0];
        if cfg!(target_arch = "x86_64") {
            // The syscall number is loaded (offset 0) right before the x32 test.
            assert_eq!((p[3].code, p[3].k), (0x20, 0));
            assert_eq!(p[4].k, 0x4000_0000);
        }
        // More socket domains, a longer program.
        let wider = box_program(&[libc::AF_UNIX, libc::AF_INET]).unwrap();
        assert!(wider[0].len() > p.len());
    }
}
