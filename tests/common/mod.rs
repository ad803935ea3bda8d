//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod desktop;
pub mod fixture;
pub mod harness;
