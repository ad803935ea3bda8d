//! The desktop surface, client side only (the daemon stays free of D-Bus):
//! `gpuctl tray` (a StatusNotifierItem with a menu, and notifications) and
//! `gpuctl watch` (a line per change for status bars). Both follow the
//! daemon's `events` stream; neither polls.

//!
//! The D-Bus side (zbus) is the cargo feature `tray`, on by default: without
//! it only `watch` and the pure model are built, and the model's tray-only
//! parts (menu, actions) are left unused rather than cut out.

#[cfg(feature = "tray")]
pub mod config;
#[cfg_attr(not(feature = "tray"), allow(dead_code))]
pub mod follow;
#[cfg(feature = "tray")]
pub mod icon;
#[cfg_attr(not(feature = "tray"), allow(dead_code))]
pub mod model;
#[cfg(feature = "tray")]
pub mod notify;
#[cfg_attr(not(feature = "tray"), allow(dead_code))]
pub mod offers;
#[cfg(feature = "tray")]
pub mod peer;
#[cfg(feature = "tray")]
pub mod sni;
#[cfg(feature = "tray")]
pub mod switcheroo;
#[cfg(feature = "tray")]
pub mod tray;
pub mod watch;

/// `gpuctl tray` in a binary built without the feature: say so, as usage.
#[cfg(not(feature = "tray"))]
pub mod tray {
    pub fn run(_socket: &std::path::Path) -> u8 {
        eprintln!(
            "gpuctl: this gpuctl was built without the tray (cargo feature \"tray\"); \
             `gpuctl watch` works without it"
        );
        crate::exit::USAGE
    }
}

/// `gpuctl switcheroo` in a binary built without the feature: say so, as usage.
#[cfg(not(feature = "tray"))]
pub mod switcheroo {
    pub fn run(_socket: &std::path::Path) -> u8 {
        eprintln!(
            "gpuctl: this gpuctl was built without D-Bus (cargo feature \"tray\"), \
             so without `gpuctl switcheroo`"
        );
        crate::exit::USAGE
    }
}
