//! Tier 1: the man page and the shell completions that the packages ship,
//! as a user meets them (`man gpuctl`, `gpuctl set <TAB>`), and the help
//! text. Runs unprivileged; the groff check runs where groff is installed.

use std::process::Command;

use crate::common::harness::{describe, BIN};

fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(out.status.success(), "gpuctl {args:?}: {}", describe(&out));
    String::from_utf8(out.stdout).unwrap()
}

const MODES: [&str; 4] = ["hybrid", "integrated", "manual", "smart"];
const KEYS: [&str; 4] = ["group", "bpf_log", "env_grants", "max_grants"];
const HIDDEN: [&str; 2] = ["completions", "manpage"];
const TEST_ONLY: [&str; 2] = ["--sysfs-root", "--procfs-root"];

/// The `opts="..."` line bash offers after `gpuctl SUBCOMMAND` (clap_complete
/// names each case `gpuctl__subcmd__SUBCOMMAND`).
fn bash_opts(script: &str, sub: &str) -> String {
    let case = format!("gpuctl__subcmd__{sub})");
    let at = script
        .find(&case)
        .unwrap_or_else(|| panic!("no case {case} in the bash completion"));
    let rest = &script[at..];
    let line = rest
        .lines()
        .find(|l| l.trim_start().starts_with("opts=\""))
        .unwrap();
    line.trim().to_string()
}

#[test]
fn bash_offers_modes_and_keys_and_hides_what_is_hidden() {
    let bash = run(&["completions", "bash"]);
    let set = bash_opts(&bash, "set");
    for m in MODES {
        assert!(
            set.contains(m),
            "`gpuctl set <TAB>` does not offer {m}: {set}"
        );
    }
    let config = bash_opts(&bash, "config");
    for k in KEYS {
        assert!(
            config.contains(k),
            "`gpuctl config <TAB>` does not offer {k}: {config}"
        );
    }
    for w in HIDDEN.iter().chain(TEST_ONLY.iter()) {
        assert!(!bash.contains(w), "bash completion offers {w}");
    }
    // Visible subcommands are all there.
    let top = bash
        .lines()
        .find(|l| l.contains("opts=\"") && l.contains(" daemon "))
        .unwrap();
    for sub in ["daemon", "list", "set", "config", "doctor", "events"] {
        assert!(
            top.contains(&format!(" {sub} ")),
            "{sub} missing from {top}"
        );
    }
}

#[test]
fn zsh_and_fish_offer_modes_and_keys_and_hide_what_is_hidden() {
    let zsh = run(&["completions", "zsh"]);
    assert!(
        zsh.contains(&format!(
            ":mode -- The mode to switch to:({})'",
            MODES.join(" ")
        )),
        "zsh: no modes for set"
    );
    let keys = zsh
        .lines()
        .find(|l| l.starts_with("'::key"))
        .expect("zsh: no KEY argument for config");
    for k in KEYS {
        assert!(
            keys.contains(k),
            "zsh: config KEY does not offer {k}: {keys}"
        );
    }
    let fish = run(&["completions", "fish"]);
    for (sub, words) in [("set", &MODES), ("config", &KEYS)] {
        let start =
            format!("complete -c gpuctl -n \"__fish_gpuctl_using_subcommand {sub}\" -f -a \"");
        let line = fish
            .lines()
            .find(|l| l.starts_with(&start))
            .unwrap_or_else(|| panic!("fish: no values for {sub}"));
        for w in words {
            assert!(line.contains(w), "fish: {sub} does not offer {w}: {line}");
        }
    }
    for shell in ["zsh", "fish"] {
        let s = run(&["completions", shell]);
        for w in HIDDEN.iter().chain(TEST_ONLY.iter()) {
            assert!(
                !s.contains(w.trim_start_matches('-')),
                "{shell} completion offers {w}"
            );
        }
    }
}

#[test]
fn test_only_options_are_hidden_from_help_but_work() {
    for args in [&["--help"][..], &["set", "--help"], &["list", "--help"]] {
        let h = run(args);
        for w in TEST_ONLY {
            assert!(!h.contains(w), "gpuctl {args:?} shows {w}:\n{h}");
        }
        assert!(h.contains("--socket"), "{h}");
    }
    // Still accepted, flag and env twin: an empty sysfs tree lists no GPU.
    let dir = std::env::temp_dir().join(format!("gpuctl-docs-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sys")).unwrap();
    let sock = dir.join("none.sock");
    let flag = Command::new(BIN)
        .arg("--sysfs-root")
        .arg(dir.join("sys"))
        .arg("--procfs-root")
        .arg(&dir)
        .arg("--socket")
        .arg(&sock)
        .args(["list", "--json"])
        .output()
        .unwrap();
    assert!(flag.status.success(), "{}", describe(&flag));
    let v: serde_json::Value = serde_json::from_slice(&flag.stdout).unwrap();
    assert_eq!(v["gpus"], serde_json::json!([]));
    let env = Command::new(BIN)
        .env("GPUCTL_SYSFS_ROOT", dir.join("sys"))
        .env("GPUCTL_PROCFS_ROOT", &dir)
        .env("GPUCTL_SOCKET", &sock)
        .args(["list", "--json"])
        .output()
        .unwrap();
    assert!(env.status.success(), "{}", describe(&env));
    assert_eq!(env.stdout, flag.stdout);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn set_still_takes_any_word_and_the_daemon_judges_it() {
    // The offered modes do not turn into a clap check: an unknown mode still
    // reaches the daemon (here: none runs, exit 3), whose message says why.
    let dir = std::env::temp_dir().join(format!("gpuctl-docs-set-{}", std::process::id()));
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", dir.join("none.sock"))
        .args(["set", "turbo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
}

#[test]
fn man_page_has_the_sections_and_refers_to_no_missing_page() {
    let page = run(&["manpage"]);
    for sec in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "COMMANDS",
        "MODES",
        "CONFIGURATION",
        "FILES",
        "ENVIRONMENT",
        "EXIT STATUS",
        "SEE ALSO",
    ] {
        assert!(page.contains(&format!("\n.SH {sec}\n")), "no {sec} section");
    }
    // Only gpuctl(1) is shipped: no gpuctl-set(1) and the like.
    assert!(!page.contains("gpuctl\\-"), "refers to gpuctl-*(1) pages");
    for m in MODES {
        assert!(
            page.contains(&format!(".TP\n\\fB{m}\\fR\n")),
            "mode {m} not described"
        );
    }
    for k in KEYS {
        assert!(page.contains(k), "config key {k} not listed");
    }
    for sub in [
        "daemon", "list", "get", "set", "block", "unblock", "status", "who", "run", "config",
        "doctor", "events", "auto", "wakes",
    ] {
        assert!(
            page.contains(&format!("\\fBgpuctl {sub}\\fR")),
            "command {sub} not documented"
        );
    }
    assert!(page.contains("\\fBgpuctl app allow\\fR"));
    for w in HIDDEN {
        assert!(
            !page.contains(&format!("gpuctl {w}")),
            "documents hidden {w}"
        );
    }
    for f in [
        "/etc/gpuctl/gpuctl.toml",
        "/var/lib/gpuctl/state.json",
        "/run/gpuctl/gpuctl.sock",
    ] {
        assert!(page.contains(&f.replace('-', "\\-")), "FILES lacks {f}");
    }
    for e in [
        "GPUCTL_SOCKET",
        "GPUCTL_CONFIG",
        "GPUCTL_STATE_DIR",
        "NOTIFY_SOCKET",
    ] {
        assert!(
            page.contains(&e.replace('-', "\\-")),
            "ENVIRONMENT lacks {e}"
        );
    }
    for code in ["0", "1", "2", "3", "4", "5", "75", "78"] {
        assert!(
            page.contains(&format!(".TP\n\\fB{code}\\fR\n")),
            "EXIT STATUS lacks {code}"
        );
    }
    // groff finds nothing to warn about (what lintian runs on the package).
    if Command::new("groff").arg("--version").output().is_ok() {
        let dir = std::env::temp_dir().join(format!("gpuctl-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("gpuctl.1");
        std::fs::write(&f, &page).unwrap();
        let out = Command::new("groff")
            .args(["-man", "-ww", "-z", "-Tutf8"])
            .arg(&f)
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "groff: {}",
            describe(&out)
        );
    } else {
        eprintln!("SKIP groff check: groff not installed (Debian package groff-base)");
    }
}
