//! Integration tests of the web provider against real HTTP servers on loopback.

mod binary;
mod fetch;
mod grpc;
mod search;
mod ssrf;
mod support;
