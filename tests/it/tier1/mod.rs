//! Tier 1: against fixture machines, unprivileged (a test that needs root
//! here carries `#[ignore = "root"]`).

mod desktop;
mod discovery_cases;
mod docs;
mod doctor;
mod fixtures_selftest;
mod list;
