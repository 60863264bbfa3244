//! The kernel provider: a persistent Jupyter kernel (real ipykernel, spoken to
//! over the Jupyter protocol on IPC sockets) for every chat session, and the
//! tools that use it: run_python_code, kernel_install, registry_lookup and the
//! notebook tools. Served as its own gRPC service with
//! [`omicos_toolkit::serve_provider`]; the registry pins sessions to it.

pub mod config;
pub mod install;
pub mod interpreter;
pub mod kernel;
pub mod lookup;
pub mod notebook;
pub mod output;
pub mod provider;
pub mod sessions;

pub use config::{Config, KernelConfig};
pub use interpreter::{Interpreter, setup_venv, write_kernel_choice};
pub use provider::KernelProvider;

/// Sets TCP_NODELAY on a listening socket; Linux copies it to every accepted
/// connection. Without it a unary-sized streamed answer (headers, then data
/// and trailers a few ms later) waits ~40 ms for the peer's delayed ACK
/// (Nagle), because the shared host accepts connections with the defaults.
pub fn set_listener_nodelay(listener: &tokio::net::TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a correctly sized int option.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
