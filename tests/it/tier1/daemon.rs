//! The daemon and its clients where no root is needed: a client with no
//! daemon to talk to, and a daemon on a kernel it cannot enforce on. The
//! daemon at work is in root::daemon.

use crate::common::fixture::machine;
use crate::common::harness::describe;

#[test]
fn client_without_daemon_exits_3() {
    let env_dir = std::env::temp_dir().join(format!("gpuctl-nodaemon-{}", std::process::id()));
    let out = std::process::Command::new(crate::common::harness::BIN)
        .env("GPUCTL_SOCKET", env_dir.join("none.sock"))
        .arg("get")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"));
}

/// A kernel gpuctl cannot enforce on is a permanent condition: the daemon
/// exits with 78 (EX_CONFIG), which the systemd unit does not restart.
#[test]
fn unsupported_kernel_exits_78_instead_of_crash_looping() {
    let m = machine("intel_nvidia");
    let dir = m.root().join("d");
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(crate::common::harness::BIN)
            .env("GPUCTL_SOCKET", dir.join("s.sock"))
            .env("GPUCTL_SYSFS_ROOT", m.sysfs())
            .env("GPUCTL_STATE_DIR", &dir)
            .env("GPUCTL_CONFIG", dir.join("c.toml"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["daemon", "--cgroup", "/nonexistent-cgroup"]);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpuctl doctor"));
    // The fixture has no BPF LSM in its security/lsm list.
    let out = run(&["daemon", "--backend", "lsm"]);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lsm="));
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/systemd/gpuctl.service"
    ))
    .unwrap();
    assert!(unit.contains("RestartPreventExitStatus=78"));
}

/// A plain `gpuctl get` skips the command-line parser (issue 21): it must
/// find the same socket and print exactly what the parsed path prints, for
/// an answer with a note. A fake daemon answers each connection once.
#[test]
fn plain_get_answers_as_the_parsed_path_does() {
    use std::io::{BufRead, BufReader, Write};
    let dir = std::env::temp_dir().join(format!("gpuctl-plainget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("fake.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for _ in 0..2 {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            lines.push(line);
            let answer = r#"{"ok": true, "proto": 1, "data": {"mode": "integrated", "force": false, "blocked": [1], "note": "GPU 1 is skipped"}}"#;
            (&s).write_all(format!("{answer}\n").as_bytes()).unwrap();
        }
        lines
    });
    let plain = std::process::Command::new(crate::common::harness::BIN)
        .env("GPUCTL_SOCKET", &sock)
        .arg("get")
        .output()
        .unwrap();
    let parsed = std::process::Command::new(crate::common::harness::BIN)
        .env_remove("GPUCTL_SOCKET")
        .arg("--socket")
        .arg(&sock)
        .arg("get")
        .output()
        .unwrap();
    let lines = server.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(plain.status.code(), Some(0), "{}", describe(&plain));
    assert_eq!(
        (&plain.status.code(), &plain.stdout, &plain.stderr),
        (&parsed.status.code(), &parsed.stdout, &parsed.stderr),
        "plain: {}\nparsed: {}",
        describe(&plain),
        describe(&parsed)
    );
    assert!(String::from_utf8_lossy(&plain.stdout).starts_with("integrated"));
    assert_eq!(lines[0], lines[1], "the same request line");
}

/// `GPUCTL_SOCKET=` (empty) is the same usage error on the plain path as
/// on the parsed one (clap refuses an empty value).
#[test]
fn plain_get_with_an_empty_socket_variable_is_the_same_usage_error() {
    let run = |args: &[&str]| {
        std::process::Command::new(crate::common::harness::BIN)
            .env("GPUCTL_SOCKET", "")
            .args(args)
            .output()
            .unwrap()
    };
    let (plain, parsed) = (run(&["get"]), run(&["get", "--json"]));
    assert_eq!(plain.status.code(), Some(2), "{}", describe(&plain));
    assert_eq!(
        (plain.status.code(), &plain.stderr),
        (parsed.status.code(), &parsed.stderr)
    );
}
