//! Tier 2: `gpuctl switcheroo` on a private system bus (dbus-daemon with a
//! system configuration and gpuctl's packaged policy), read by Debian's
//! own `switcherooctl`, in front of a real daemon with its BPF hooks
//! (issue 20). A launch from `switcherooctl` in smart mode opens the dGPU
//! (a fake node: ENXIO means the kernel let it through, EPERM denied it).

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::desktop::{have, Bus, BIN};
use crate::common::fixture::machine;
use crate::common::harness::{describe, join_cgroup_before_exec, require_root, Env, ENXIO, EPERM};

const NAME: &str = "net.hadess.SwitcherooControl";

struct Service(Child);

impl Service {
    fn start(env: &Env, bus: &Bus) -> Service {
        let child = Command::new(BIN)
            .arg("switcheroo")
            .env("GPUCTL_SOCKET", env.socket())
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Service(child)
    }

    fn stop(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut log = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut log);
        }
        log
    }
}

fn owner(bus: &Bus) -> Option<String> {
    let conn = bus.connect();
    let proxy = zbus::blocking::fdo::DBusProxy::new(&conn).unwrap();
    proxy
        .get_name_owner(zbus::names::BusName::try_from(NAME).unwrap())
        .ok()
        .map(|o| o.to_string())
}

fn wait_owned(bus: &Bus) {
    let t = Instant::now();
    while owner(bus).is_none() {
        assert!(t.elapsed() < Duration::from_secs(15), "nobody took {NAME}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn switcherooctl(bus: &Bus, args: &[&str], cgroup: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new("switcherooctl");
    cmd.args(args)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cg) = cgroup {
        join_cgroup_before_exec(&mut cmd, cg);
    }
    cmd.output().unwrap()
}

/// errno of opening `node` from a shell `switcherooctl launch` starts.
fn launch_open(bus: &Bus, env: &Env, node: &str) -> i32 {
    let out = switcherooctl(
        bus,
        &["launch", "/bin/sh", "-c", r#"exec 3<>"$0""#, node],
        Some(&env.cgroup),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Operation not permitted") {
        EPERM
    } else if err.contains("No such device or address") {
        ENXIO
    } else {
        panic!("switcherooctl launch: {}", describe(&out))
    }
}

/// Starts `gpuctl switcheroo` while someone else owns the name: it must
/// exit 0 within 15 s, saying it leaves the name be.
fn steps_aside(env: &Env, bus: &Bus) {
    let mut svc = Service::start(env, bus);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = svc.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "gpuctl switcheroo kept running beside the name's owner"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "it steps aside, successfully: {status:?}");
    let log = svc.stop();
    assert!(log.contains("leaving it be"), "{log}");
}

fn list(bus: &Bus) -> String {
    let out = switcherooctl(bus, &["list"], None);
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_list(bus: &Bus, what: &str, f: impl Fn(&str) -> bool) -> String {
    let t = Instant::now();
    loop {
        let l = list(bus);
        if f(&l) {
            return l;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{what}; list:\n{l}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "root"]
fn switcherooctl_lists_and_launches_what_the_mode_allows() {
    require_root(module_path!());
    if !have("switcherooctl", module_path!()) || !have("dbus-daemon", module_path!()) {
        return;
    }
    let bus = Bus::start_system();
    // intel_nvidia: i915 iGPU 00:02.0 (default), RTX 3050 01:00.0 (nvidia).
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let out = env.gpuctl(&["set", "smart"]);
    assert!(out.status.success(), "{}", describe(&out));
    let nv = env.mknod(226, 129).to_string_lossy().into_owned();
    let svc = Service::start(&env, &bus);
    wait_owned(&bus);

    let l = list(&bus);
    println!("$ switcherooctl list   # smart\n{l}");
    assert!(l.contains("Device: 0") && l.contains("Device: 1"), "{l}");
    assert!(
        l.contains("Environment: DRI_PRIME=pci-0000_00_02_0"),
        "the default GPU's tag: {l}"
    );
    assert!(
        l.contains(
            "Environment: __GLX_VENDOR_LIBRARY_NAME=nvidia __NV_PRIME_RENDER_OFFLOAD=1 \
             __VK_LAYER_NV_optimus=NVIDIA_only"
        ),
        "the NVIDIA GPU's PRIME variables: {l}"
    );
    let first = l.split("Device: 1").next().unwrap_or_default().to_string();
    assert!(first.contains("Default:     yes"), "{l}");

    // The launch is granted in the kernel; the same open without it is not.
    assert_eq!(
        launch_open(&bus, &env, &nv),
        ENXIO,
        "switcherooctl launch in smart mode"
    );
    let mut plain = Command::new("/bin/sh");
    plain
        .args(["-c", r#"exec 3<>"$0""#, &nv])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    join_cgroup_before_exec(&mut plain, &env.cgroup);
    let out = plain.output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
        "without the environment it is denied: {}",
        describe(&out)
    );

    // A mode change is a PropertiesChanged, and integrated offers one GPU.
    let conn = bus.connect();
    let props = zbus::blocking::fdo::PropertiesProxy::builder(&conn)
        .destination(NAME)
        .unwrap()
        .path("/net/hadess/SwitcherooControl")
        .unwrap()
        .build()
        .unwrap();
    let mut changes = props.receive_properties_changed().unwrap();
    let out = env.gpuctl(&["set", "integrated"]);
    assert!(out.status.success(), "{}", describe(&out));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Some(sig) = changes.next() {
            let a = sig.args().unwrap();
            let mut keys: Vec<String> = a
                .changed_properties()
                .keys()
                .map(|k| k.to_string())
                .collect();
            keys.sort();
            let n = a
                .changed_properties()
                .get("NumGPUs")
                .and_then(|v| u32::try_from(v).ok());
            let _ = tx.send((a.interface_name().to_string(), keys, n));
        }
    });
    let (iface, keys, n) = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("PropertiesChanged after `gpuctl set integrated`");
    assert_eq!(iface, NAME);
    assert_eq!(keys, ["GPUs", "HasDualGpu", "NumGPUs"]);
    assert_eq!(n, Some(1));
    let l = wait_list(&bus, "integrated offers only the default GPU", |l| {
        !l.contains("Device: 1")
    });
    println!("$ switcherooctl list   # integrated\n{l}");
    assert!(l.contains("Default:     yes"), "{l}");
    assert!(!l.contains("NVIDIA_only"), "{l}");
    let has_dual = props.get(NAME.try_into().unwrap(), "HasDualGpu").unwrap();
    assert_eq!(bool::try_from(&*has_dual).ok(), Some(false));

    // Back to hybrid: offered again.
    let out = env.gpuctl(&["set", "hybrid"]);
    assert!(out.status.success(), "{}", describe(&out));
    wait_list(&bus, "hybrid offers the dGPU again", |l| {
        l.contains("Device: 1")
    });
    let log = svc.stop();
    assert!(
        log.contains("serving net.hadess.SwitcherooControl"),
        "{log}"
    );
}

#[test]
#[ignore = "root"]
fn a_running_switcheroo_control_keeps_the_name() {
    require_root(module_path!());
    if !have("dbus-daemon", module_path!()) {
        return;
    }
    let bus = Bus::start_system();
    // The stand-in: a connection owning the name, as switcheroo-control does.
    let other = bus.connect();
    other.request_name(NAME).unwrap();
    let before = owner(&bus);
    assert!(before.is_some());
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    steps_aside(&env, &bus);
    assert_eq!(owner(&bus), before, "the name stays with its owner");
}

/// The real switcheroo-control (Debian's daemon, on the same private system
/// bus) owns the name first: `gpuctl switcheroo` steps aside and the name
/// stays with it. The stand-in test above covers any owner; this one is the
/// daemon desktops actually run.
#[test]
#[ignore = "root"]
fn the_real_switcheroo_control_keeps_the_name() {
    require_root(module_path!());
    const REAL: &str = "/usr/libexec/switcheroo-control";
    if !have("dbus-daemon", module_path!()) || !have("switcherooctl", module_path!()) {
        return;
    }
    assert!(
        std::path::Path::new(REAL).is_file(),
        "{REAL} missing although switcherooctl is installed"
    );
    let bus = Bus::start_system();
    let mut real = Command::new(REAL)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_owned(&bus);
    let before = owner(&bus);
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    steps_aside(&env, &bus);
    assert_eq!(
        owner(&bus),
        before,
        "the name stays with switcheroo-control"
    );
    assert!(
        real.try_wait().unwrap().is_none(),
        "switcheroo-control is still running"
    );
    let _ = real.kill();
    let _ = real.wait();
}

/// The policy: only root may own the name; a plain user is refused.
#[test]
#[ignore = "root"]
fn only_root_may_own_the_name() {
    require_root(module_path!());
    if !have("dbus-daemon", module_path!()) {
        return;
    }
    let bus = Bus::start_system();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let mut cmd = Command::new(BIN);
    cmd.arg("switcheroo")
        .env("GPUCTL_SOCKET", env.socket())
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address);
    {
        use std::os::unix::process::CommandExt;
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("asking the system bus for"),
        "{}",
        describe(&out)
    );
    assert!(owner(&bus).is_none());
}
