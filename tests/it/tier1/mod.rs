//! Tier 1: the CLI, discovery, docs and the desktop surface against fixture
//! machines. Unprivileged: no test here needs root.

mod daemon;
mod desktop;
mod discovery_cases;
mod docs;
pub(crate) mod doctor;
pub(crate) mod envgrant;
mod fixtures_selftest;
mod list;
mod power;
