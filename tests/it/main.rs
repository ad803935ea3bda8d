//! The integration tests, in one binary (`cargo test --test it`), so the
//! shared kit in tests/common compiles and links once.
//!
//! - `tier1::*`: the CLI, discovery, docs and the desktop surface against
//!   fixture machines; unprivileged.
//! - `root::*`: the daemon with its BPF programs on this kernel, checked by
//!   real open(2)s from a test-owned cgroup. Every test there carries
//!   `#[ignore = "root"]`, so an unprivileged `cargo test` reports it as
//!   ignored; as root, `cargo test -- --ignored` runs them (`make test-root`)
//!   and `-- --include-ignored` runs everything (`make test`).
//!
//! One test or a group: `cargo test --test it -- root::smart` (see HACKING.md).

// Test and bench code: a failed step panics, which is how the harness reports it
// (the crate's unwrap/expect lints are for the shipped binary's runtime paths).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod root;
mod tier1;
