//! A real tray host, looked at: waybar with its tray module under a
//! headless sway (wlroots headless backend, pixman software rendering),
//! `gpuctl tray` against the real daemon on a fixture laptop, and `grim`
//! screenshots before and after a mode change. The icon's pixels must show
//! the state's colour (green: dGPU asleep; blue: blocked) in the bar. The
//! screenshots are kept in $CARGO_TARGET_TMPDIR/tray-host/ (docs/USAGE.md shows
//! one). sway refuses to run as root, so the session runs as `nobody`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::desktop::*;
use crate::common::fixture::machine;
use crate::common::harness::{require_root, Env};

const NOBODY: u32 = 65534;
const ASLEEP: [u8; 3] = [0x2e, 0x9e, 0x4f];
const BLOCKED: [u8; 3] = [0x2f, 0x6f, 0xd8];

/// The sway session (and everything it started), as one process group.
struct Sway {
    child: std::process::Child,
}

impl Drop for Sway {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this test created.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

struct Shot {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Shot {
    /// Pixels of exactly `c` in the right half of the bar (the tray).
    fn count(&self, c: [u8; 3]) -> usize {
        let mut n = 0;
        for y in 0..self.height.min(40) {
            for x in self.width / 2..self.width {
                let i = (y * self.width + x) * 3;
                if self.rgb[i..i + 3] == c {
                    n += 1;
                }
            }
        }
        n
    }
}

fn session_cmd(prog: &str, xdg: &Path) -> Command {
    let mut c = Command::new(prog);
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", xdg)
        .env("XDG_RUNTIME_DIR", xdg)
        .env("WAYLAND_DISPLAY", "wayland-1")
        .uid(NOBODY)
        .gid(NOBODY);
    c
}

/// One screenshot: PPM for the test, PNG kept as an artifact.
fn grim(xdg: &Path, keep: &Path) -> Shot {
    let out = session_cmd("grim", xdg)
        .args(["-t", "ppm", "-"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "grim: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = session_cmd("grim", xdg).arg("-").output().unwrap();
    std::fs::write(keep, &png.stdout).unwrap();
    // P6\nW H\n255\n then RGB.
    let d = out.stdout;
    let mut fields = Vec::new();
    let mut i = 0;
    while fields.len() < 4 {
        while d[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while !d[i].is_ascii_whitespace() {
            i += 1;
        }
        fields.push(String::from_utf8_lossy(&d[start..i]).to_string());
    }
    assert_eq!(fields[0], "P6");
    let (width, height) = (fields[1].parse().unwrap(), fields[2].parse().unwrap());
    Shot {
        width,
        height,
        rgb: d[i + 1..].to_vec(),
    }
}

fn wait_shot(xdg: &Path, keep: &Path, what: &str, ok: impl Fn(&Shot) -> bool) -> Shot {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = grim(xdg, keep);
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not on screen after 30 s (asleep px {}, blocked px {}); see {}",
            s.count(ASLEEP),
            s.count(BLOCKED),
            keep.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "root"]
fn waybar_shows_the_icon_and_its_change() {
    let test = "waybar_shows_the_icon_and_its_change";
    require_root(test);
    if !["dbus-daemon", "sway", "waybar", "grim"]
        .iter()
        .all(|p| have(p, test))
    {
        return;
    }
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let dir = Scratch::new("trayhost");
    set_mode(&dir.0, 0o755);
    let xdg = dir.0.join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    std::os::unix::fs::chown(&xdg, Some(NOBODY), Some(NOBODY)).unwrap();
    set_mode(&xdg, 0o700);
    let artifacts = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tray-host");
    std::fs::create_dir_all(&artifacts).unwrap();

    std::fs::write(
        dir.0.join("waybar.json"),
        format!(
            r#"{{"layer": "top", "position": "top", "height": 40,
  "modules-left": ["custom/gpuctl"], "modules-right": ["tray"],
  "tray": {{"icon-size": 32, "spacing": 8}},
  "custom/gpuctl": {{"exec": "{} watch --waybar", "return-type": "json", "format": "{{}}"}}}}"#,
            BIN
        ),
    )
    .unwrap();
    std::fs::write(
        dir.0.join("waybar.css"),
        "* { font-family: monospace; font-size: 14px; }\n\
         window#waybar { background: #303030; color: #ffffff; }\n\
         #custom-gpuctl { padding: 0 10px; }\n\
         #custom-gpuctl.asleep { color: #7fdf7f; }\n\
         #custom-gpuctl.blocked { color: #7fb0ff; }\n\
         #custom-gpuctl.awake { color: #ffc060; }\n\
         #tray { padding: 0 10px; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.0.join("sway.conf"),
        format!(
            "output HEADLESS-1 resolution 640x120 bg #222222 solid_color\n\
             default_border none\n\
             exec waybar -c {d}/waybar.json -s {d}/waybar.css\n",
            d = dir.0.display()
        ),
    )
    .unwrap();

    let bus = Bus::start();
    let mut sway = session_cmd("sway", &xdg);
    sway.arg("-c")
        .arg(dir.0.join("sway.conf"))
        .env("DBUS_SESSION_BUS_ADDRESS", &bus.address)
        .env("GPUCTL_SOCKET", env.socket())
        .env("WLR_BACKENDS", "headless")
        .env("WLR_RENDERER", "pixman")
        .env("WLR_LIBINPUT_NO_DEVICES", "1")
        .env_remove("WAYLAND_DISPLAY")
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(artifacts.join("sway.log")).unwrap(),
        ))
        .process_group(0);
    let _sway = Sway {
        child: sway.spawn().unwrap(),
    };
    wait_for("sway's wayland socket", 30, || {
        xdg.join("wayland-1").exists().then_some(())
    });

    let cfg = dir.0.join("desktop.toml");
    std::fs::write(&cfg, "[notify]\nmode = false\n").unwrap();
    let mut tray = Tray::start(&bus, &env.socket(), &cfg, None);

    let before = artifacts.join("before.png");
    let s = wait_shot(&xdg, &before, "the green (asleep) tray icon", |s| {
        s.count(ASLEEP) > 100
    });
    assert_eq!(s.count(BLOCKED), 0);

    let out = env.gpuctl(&["set", "integrated"]);
    assert!(out.status.success());
    let after = artifacts.join("after.png");
    let s = wait_shot(&xdg, &after, "the blue (blocked) tray icon", |s| {
        s.count(BLOCKED) > 100
    });
    assert_eq!(s.count(ASLEEP), 0, "the old icon is gone");
    let log = tray.stop();
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "tray host screenshots: {} and {}\n",
            before.display(),
            after.display()
        )
        .as_bytes(),
    );
    assert!(!log.contains("panicked"), "{log}");
}
