//! Tier 2: the daemon and its BPF programs on this kernel, as root. Every
//! test here carries `#[ignore = "root"]` and calls `require_root`
//! (tests/common/harness.rs), which fails it when it is run without root.

mod auto;
mod chipset;
mod daemon;
mod desktop;
mod envgrant;
mod grant_share;
mod hostile;
mod logind;
mod power;
mod poweroff;
mod protocol;
mod rescue;
mod seat;
mod smart;
mod switcheroo;
mod tray_host;
mod who;
