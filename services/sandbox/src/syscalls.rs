//! seccomp: the syscalls a confined process may not make.
//!
//! Built once per [`crate::Sandbox`] into BPF programs; the child only
//! installs one. Unlike codex, connect/bind/listen/sendto stay allowed: without
//! a non-AF_UNIX socket they reach nothing but unix sockets, and the kernel's
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

/// Which sockets a confined process may create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sockets {
    /// Any (the `network` policy).
    Any,
    /// AF_UNIX only: no network at all.
    UnixOnly,
    /// AF_UNIX, and AF_INET/AF_INET6/AF_NETLINK inside a private network
    /// namespace whose only interface is its own loopback.
    PrivateLoopback,
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

/// The rule map: syscall → conditions under which it is denied (empty: always).
fn rules(sockets: Sockets) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SandboxError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALWAYS_DENIED.iter().map(|nr| (*nr, Vec::new())).collect();
    let allowed: &[i32] = match sockets {
        Sockets::Any => return Ok(rules),
        Sockets::UnixOnly => &[libc::AF_UNIX],
        Sockets::PrivateLoopback => &[
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
        ],
    };
    rules.insert(libc::SYS_socket, vec![domain_not_in(allowed)?]);
    rules.insert(libc::SYS_socketpair, vec![domain_not_in(allowed)?]);
    Ok(rules)
}

/// The BPF program for a socket regime.
pub fn program(sockets: Sockets) -> Result<BpfProgram, SandboxError> {
    let filter = SeccompFilter::new(
        rules(sockets)?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target_arch(),
    )
    .map_err(seccomp_err)?;
    let mut prog: BpfProgram = filter.try_into().map_err(seccomp_err)?;
    deny_x32(&mut prog);
    Ok(prog)
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
    fn programs_build_and_offline_adds_the_socket_rules() {
        let off = rules(Sockets::UnixOnly).unwrap();
        let on = rules(Sockets::Any).unwrap();
        let lo = rules(Sockets::PrivateLoopback).unwrap();
        assert!(off.contains_key(&libc::SYS_socket) && off.contains_key(&libc::SYS_socketpair));
        assert!(lo.contains_key(&libc::SYS_socket));
        assert!(!on.contains_key(&libc::SYS_socket));
        for nr in [libc::SYS_io_uring_setup, libc::SYS_ptrace, libc::SYS_reboot] {
            assert!(on[&nr].is_empty() && off[&nr].is_empty() && lo[&nr].is_empty());
        }
        let p = program(Sockets::UnixOnly).unwrap();
        assert!(p.len() > program(Sockets::Any).unwrap().len());
        assert!(program(Sockets::PrivateLoopback).unwrap().len() > p.len());
        if cfg!(target_arch = "x86_64") {
            // The syscall number is loaded (offset 0) right before the x32 test.
            assert_eq!((p[3].code, p[3].k), (0x20, 0));
            assert_eq!(p[4].k, 0x4000_0000);
        }
    }
}
