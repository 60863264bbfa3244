//! Test support for omicos end-to-end tests: a scripted fake LLM, an
//! in-process stack of real services on loopback ports, a Chat client, and
//! certificates for TLS tests ([`pki`]).

pub mod fake_llm;
pub mod flaky_store;
pub mod idp;
pub mod pki;
pub mod stack;
pub mod stream_shapes;

pub use fake_llm::{FakeLlm, Reasoning, Reply, Shape};
pub use flaky_store::{FlakyStore, Op};
pub use stack::{
    ChatHandle, Client, Stack, StackOptions, TEST_TOKEN, api_key, assert_gap_free, client_at,
    client_with, done_reason, events_text, finished_calls,
};
