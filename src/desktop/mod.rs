//! The desktop surface, client side only (the daemon stays free of D-Bus):
//! `gpuctl tray` (a StatusNotifierItem with a menu, and notifications) and
//! `gpuctl watch` (a line per change for status bars). Both follow the
//! daemon's `events` stream; neither polls.

pub mod config;
pub mod follow;
pub mod icon;
pub mod model;
pub mod notify;
pub mod sni;
pub mod tray;
pub mod watch;
