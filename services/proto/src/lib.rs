//! Generated types and services of the `omicos.v1` package.

/// The `omicos.v1` package.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("omicos.v1");
}

/// The encoded file descriptor set, for tonic-reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/omicos_descriptor.bin"));

pub use v1::*;
