//! Generated types and services of the `omicos.v1` package, the codec every
//! service uses, and the helpers of the contract's enums.

/// The `omicos.v1` package.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("omicos.v1");
}

/// A2A 1.0's `lf.a2a.v1` package (proto/lf/a2a/v1/a2a.proto, the SDK's
/// contract as scripts/a2a-proto.py writes it).
#[allow(clippy::all, missing_docs)]
pub mod a2a {
    tonic::include_proto!("lf.a2a.v1");
}

pub mod codec;
pub mod states;

/// The encoded file descriptor set, for tonic-reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/omicos_descriptor.bin"));

/// The encoded file descriptor set of [`a2a`] (with the google/api files it
/// imports), for tonic-reflection and the session guard's test.
pub const A2A_FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/a2a_descriptor.bin"));

/// The largest gRPC message any omicos service sends or accepts. Tool
/// arguments and results above the spool threshold travel as previews, so
/// only whole-file writes come near it.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Unix milliseconds now: the clock of every `*_ms` timestamp the services
/// write (events, records, registrations, store rows).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub use states::{UnknownMode, model_envelope};
pub use v1::*;
