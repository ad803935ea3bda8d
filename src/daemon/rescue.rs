//! A rescue at boot: kernel command line words, read from the procfs
//! root's `cmdline` when the daemon starts, for a user whose saved mode
//! leaves them without a picture (say `integrated` on a machine whose
//! panel turned out to hang off the dGPU):
//!
//! - `gpuctl.mode=MODE` (`hybrid`, `integrated`, `smart`, `manual`): this
//!   boot comes up in MODE. The saved state is untouched: the next boot
//!   without the word is back in the saved mode. Automatic modes are held
//!   for this boot; a `gpuctl set` by the user ends the override (and is
//!   saved as usual).
//! - `gpuctl.disable` (or `gpuctl.disable=1`): the daemon starts, answers,
//!   and blocks nothing and powers off nothing; changes are refused with
//!   the reason. `Core::disabled` is the one flag to check (issue 19's
//!   power-off checks it too).
//!
//! Set once from GRUB's menu (`e` on the entry, append to the `linux`
//! line, Ctrl-X), or with systemd-boot's `e`.

use std::path::Path;

use crate::policy::Mode;
use crate::safefile;

/// What this boot's command line asks of gpuctl.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rescue {
    /// `gpuctl.mode=MODE`.
    pub mode: Option<Mode>,
    /// `gpuctl.disable`.
    pub disable: bool,
}

/// The words of `cmdline`, and a line for the log about any it could not
/// use.
pub fn parse(cmdline: &str) -> (Rescue, Vec<String>) {
    let mut r = Rescue::default();
    let mut warns = Vec::new();
    for w in cmdline.split_ascii_whitespace() {
        match w.split_once('=') {
            None if w == "gpuctl.disable" => r.disable = true,
            Some(("gpuctl.disable", v)) => match v {
                "1" | "y" | "yes" | "true" | "on" => r.disable = true,
                "0" | "n" | "no" | "false" | "off" => r.disable = false,
                _ => warns.push(format!(
                    "kernel command line: gpuctl.disable={v:?} is not a yes or no; ignored"
                )),
            },
            Some(("gpuctl.mode", v)) => match v.parse::<Mode>() {
                Ok(m) => r.mode = Some(m),
                Err(e) => warns.push(format!("kernel command line: gpuctl.mode: {e}; ignored")),
            },
            _ if w.starts_with("gpuctl.") => warns.push(format!(
                "kernel command line: {w:?} is not a gpuctl word \
                 (gpuctl.mode=MODE, gpuctl.disable); ignored"
            )),
            _ => {}
        }
    }
    (r, warns)
}

/// Reads `PROCFS/cmdline`. No file (a container) is no rescue.
pub fn read(procfs: &Path) -> (Rescue, Vec<String>) {
    match safefile::read_capped(&procfs.join("cmdline"), 64 << 10) {
        Ok(b) => parse(&String::from_utf8_lossy(&b)),
        Err(safefile::ReadError::Missing) => (Rescue::default(), Vec::new()),
        Err(e) => (
            Rescue::default(),
            vec![format!("reading the kernel command line: {e}")],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_words() {
        let (r, w) = parse("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet gpuctl.mode=hybrid\n");
        assert_eq!(r.mode, Some(Mode::Hybrid));
        assert!(!r.disable);
        assert!(w.is_empty());
        let (r, w) = parse("quiet gpuctl.disable splash");
        assert!(r.disable && r.mode.is_none() && w.is_empty());
        assert!(parse("gpuctl.disable=1").0.disable);
        assert!(!parse("gpuctl.disable gpuctl.disable=0").0.disable);
        // The last word wins, as for kernel parameters.
        assert_eq!(
            parse("gpuctl.mode=integrated gpuctl.mode=smart").0.mode,
            Some(Mode::Smart)
        );
    }

    #[test]
    fn bad_words_are_reported_and_ignored() {
        let (r, w) = parse("gpuctl.mode=dgpu gpuctl.disable=maybe gpuctl.mod=hybrid");
        assert_eq!(r, Rescue::default());
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("unknown mode"), "{w:?}");
        // Other programs' words are not ours.
        let (r, w) = parse("nvidia-drm.modeset=1 mygpuctl.mode=x gpuctlmode=hybrid");
        assert_eq!(r, Rescue::default());
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn no_cmdline_is_no_rescue() {
        let (r, w) = read(Path::new("/nonexistent-gpuctl-procfs"));
        assert_eq!(r, Rescue::default());
        assert!(w.is_empty());
    }
}
