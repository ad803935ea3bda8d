//! The man page and shell completions, both derived from the clap definition
//! (and from `Mode::ALL` and `config::KEYS`), so a new subcommand, mode or
//! config key appears in them without editing this file.

use std::ffi::OsStr;
use std::fmt::Write as _;

use clap::builder::{PossibleValue, StringValueParser, TypedValueParser};
use clap::{Arg, Command};

use crate::daemon::config;
use crate::exit;
use crate::policy::Mode;

/// A value parser that accepts any string (the daemon checks it and says
/// why it is wrong) but offers a list of values to completions and help.
#[derive(Clone)]
pub struct Offered(pub fn() -> Vec<&'static str>);

impl TypedValueParser for Offered {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &Command,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        StringValueParser::new().parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new((self.0)().into_iter().map(PossibleValue::new)))
    }
}

/// Every mode's name, for `set MODE`.
pub fn mode_names() -> Vec<&'static str> {
    Mode::ALL.iter().map(|m| m.as_str()).collect()
}

/// Every config key, for `config KEY`.
pub fn config_keys() -> Vec<&'static str> {
    config::KEYS.to_vec()
}

/// What a user may type: the command without hidden subcommands or hidden
/// options (clap's generators would offer them), recursively.
pub fn visible(cmd: &Command) -> Command {
    let mut out = Command::new(cmd.get_name().to_string())
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .subcommands(
            cmd.get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(visible),
        );
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(v) = cmd.get_version() {
        out = out.version(v.to_string());
    }
    out
}

/// `gpuctl completions SHELL` (`root`: the command as defined, not built:
/// clap adds `--help` and propagates global options when it builds the copy).
pub fn completions(root: &Command, shell: clap_complete::Shell) -> std::io::Result<()> {
    use std::io::Write;
    let mut cmd = visible(root);
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gpuctl", &mut out);
    if shell == clap_complete::Shell::Fish {
        // clap_complete's fish generator skips positional arguments: offer
        // their values (`set MODE`, `config KEY`) here.
        for sub in cmd.get_subcommands() {
            for a in sub.get_positionals() {
                let vals = offered(a);
                if !vals.is_empty() {
                    let _ = writeln!(
                        out,
                        "complete -c gpuctl -n \"__fish_gpuctl_using_subcommand {}\" -f -a \"{}\"",
                        sub.get_name(),
                        vals.join(" ")
                    );
                }
            }
        }
    }
    std::io::stdout().write_all(&out)
}

/// roff-escapes text: backslashes, hyphens (so they stay ASCII minus), and a
/// leading dot or quote that roff would take for a request.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for line in s.split('\n') {
        if !out.is_empty() {
            out.push('\n');
        }
        if line.starts_with('.') || line.starts_with('\'') {
            out.push_str("\\&");
        }
        out.push_str(&line.replace('\\', "\\e").replace('-', "\\-"));
    }
    out
}

fn help_of(a: &Arg) -> String {
    sentence(a.get_help().map(|h| h.to_string()).unwrap_or_default())
}

/// `--long VALUE` / `NAME` (bold for literals, italic for values).
fn arg_word(a: &Arg) -> String {
    let name = a.get_id().as_str().to_uppercase();
    if a.is_positional() {
        let w = format!("\\fI{}\\fR", esc(&name));
        return if a.get_num_args().is_some_and(|n| n.max_values() > 1) {
            format!("{w}\\&...")
        } else {
            w
        };
    }
    let flag = match (a.get_long(), a.get_short()) {
        (Some(l), _) => format!("\\fB\\-\\-{}\\fR", esc(l)),
        (None, Some(s)) => format!("\\fB\\-{s}\\fR"),
        (None, None) => return String::new(),
    };
    let takes_value = a.get_action().takes_values();
    if takes_value {
        let v = a
            .get_value_names()
            .and_then(|v| v.first().map(|s| s.to_string()))
            .unwrap_or(name);
        format!("{flag} \\fI{}\\fR", esc(&v))
    } else {
        flag
    }
}

/// The word in a synopsis: optional ones in brackets.
fn synopsis_word(a: &Arg) -> String {
    if a.is_positional() && a.is_required_set() {
        arg_word(a)
    } else {
        format!("[{}]", arg_word(a))
    }
}

/// Help text as a sentence, so more can follow it.
fn sentence(s: String) -> String {
    let t = s.trim_end();
    if t.is_empty() || t.ends_with(['.', '!', '?']) {
        t.to_string()
    } else {
        format!("{t}.")
    }
}

fn offered(a: &Arg) -> Vec<String> {
    a.get_possible_values()
        .iter()
        .filter(|p| !p.is_hide_set())
        .map(|p| p.get_name().to_string())
        .collect()
}

/// One subcommand (and its own subcommands) for COMMANDS.
fn render_command(out: &mut String, prefix: &str, cmd: &Command) {
    let path = format!("{prefix} {}", cmd.get_name());
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_global_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    let subs: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    if subs.is_empty() {
        let words: Vec<String> = args.iter().map(|a| synopsis_word(a)).collect();
        let _ = writeln!(out, ".TP\n\\fB{}\\fR {}", esc(path.trim()), words.join(" "));
        let _ = writeln!(out, "{}", esc(&sentence(about(cmd))));
        let described: Vec<&&Arg> = args.iter().filter(|a| !help_of(a).is_empty()).collect();
        if !described.is_empty() {
            out.push_str(".RS\n");
            for a in described {
                let mut h = help_of(a);
                let vals = offered(a);
                if !vals.is_empty() {
                    let _ = write!(h, " One of: {}.", vals.join(", "));
                }
                let _ = writeln!(out, ".TP\n{}\n{}", arg_word(a), esc(&h));
            }
            out.push_str(".RE\n");
        }
    } else {
        for s in subs {
            render_command(out, &path, s);
        }
    }
}

fn about(cmd: &Command) -> String {
    cmd.get_long_about()
        .or(cmd.get_about())
        .map(|s| s.to_string())
        .unwrap_or_default()
}

fn mode_text(m: Mode) -> &'static str {
    match m {
        Mode::Hybrid => {
            "Nothing is blocked and no BPF program is attached: zero cost on every open."
        }
        Mode::Integrated => {
            "Every offload GPU is blocked for everyone. A GPU that drives a connected display is \
             refused unless --force is given."
        }
        Mode::Manual => "Only the GPUs chosen with block/unblock are blocked; the choice is saved.",
        Mode::Smart => {
            "Offload GPUs are blocked except for processes granted them: started with gpuctl run, \
             with an offload request in their environment (DRI_PRIME, \
             __NV_PRIME_RENDER_OFFLOAD, ...; config key env_grants), or allowed with gpuctl app \
             allow. A grant covers the process and its descendants."
        }
    }
}

/// `gpuctl manpage`: gpuctl(1), the one page the packages ship.
pub fn manpage(root: &Command) -> String {
    let mut root = root.clone();
    root.build();
    let version = root.get_version().unwrap_or("").to_string();
    let mut o = String::new();
    let _ = writeln!(
        o,
        ".TH GPUCTL 1 \"\" \"gpuctl {}\" \"User Commands\"",
        esc(&version)
    );
    let _ = writeln!(
        o,
        ".SH NAME\ngpuctl \\- {}",
        esc(&root.get_about().map(|s| s.to_string()).unwrap_or_default())
    );
    let globals: Vec<&Arg> = root
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    let _ = writeln!(
        o,
        ".SH SYNOPSIS\n\\fBgpuctl\\fR {} \\fICOMMAND\\fR [\\fIARGS\\fR]",
        globals
            .iter()
            .map(|a| synopsis_word(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    o.push_str(
        ".SH DESCRIPTION\n\
         gpuctl keeps a laptop's discrete GPU asleep by denying access to its device nodes in \
         the kernel with eBPF, per device and per process. \\fBgpuctl daemon\\fR runs under \
         systemd (gpuctl.service); every other command is a client of its socket, and \
         \\fBlist\\fR also works without it. Reading is open to every user; changing the mode \
         needs root or membership in the group named by the config key \\fBgroup\\fR \
         (default \\fBgpuctl\\fR).\n",
    );
    o.push_str(".SH OPTIONS\nThese apply to every command.\n");
    for a in &globals {
        let mut h = help_of(a);
        if let Some(d) = a.get_default_values().first() {
            let _ = write!(h, " Default: {}.", d.to_string_lossy());
        }
        if let Some(e) = a.get_env() {
            let _ = write!(h, " Environment: {}.", e.to_string_lossy());
        }
        let _ = writeln!(o, ".TP\n{}\n{}", arg_word(a), esc(&h));
    }
    o.push_str(".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nPrint help (also after any command).\n");
    o.push_str(".TP\n\\fB\\-V\\fR, \\fB\\-\\-version\\fR\nPrint the version.\n");
    o.push_str(".SH COMMANDS\n");
    for c in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        if c.get_name() == "help" {
            continue;
        }
        render_command(&mut o, "gpuctl", c);
    }
    o.push_str(".SH MODES\n");
    for m in Mode::ALL {
        let _ = writeln!(o, ".TP\n\\fB{}\\fR\n{}", m.as_str(), esc(mode_text(m)));
    }
    o.push_str(".PP\nThe default GPU (the boot VGA device) is never blocked. A mode change applies to new opens at once; \\fBgpuctl who\\fR lists the processes that still hold a GPU open.\n");
    let _ = writeln!(
        o,
        ".SH CONFIGURATION\n\
         The daemon reads \\fI/etc/gpuctl/gpuctl.toml\\fR (TOML; every key optional). \
         \\fBgpuctl config\\fR shows the settings, \\fBgpuctl config\\fR \\fIKEY\\fR one of them, \
         and \\fBgpuctl config\\fR \\fIKEY VALUE\\fR sets one (root or the group), keeping the \
         file's comments. Keys: {}. An annotated example is \
         \\fI/usr/share/doc/gpuctl/examples/gpuctl.toml\\fR. Who may change the mode and \
         block or unblock: root, members of \\fBgroup\\fR, and (\\fBseat_may_change\\fR, \
         default true) the user of the active, local login session on seat0, as logind's \
         root\\-owned state files in \\fI/run/systemd\\fR say when they connect (not a \
         remote or an inactive session).",
        esc(&config::KEYS.join(", "))
    );
    o.push_str(
        ".SH RESCUE\n\
         If a mode leaves the screen black (say \\fBintegrated\\fR on a machine whose panel is \
         wired to the discrete GPU), boot once with a word on the kernel command line: at the \
         boot menu edit the entry (GRUB: \\fBe\\fR, append to the \\fBlinux\\fR line, \
         Ctrl\\-X; systemd\\-boot: \\fBe\\fR) and add\n\
         .TP\n\\fBgpuctl.mode=\\fR\\fIMODE\\fR\n\
         This boot comes up in \\fIMODE\\fR (e.g. \\fBhybrid\\fR); the saved mode is kept and \
         is back on the next boot without the word. Automatic modes wait; a \
         \\fBgpuctl set\\fR during this boot is saved as usual.\n\
         .TP\n\\fBgpuctl.disable\\fR\n\
         The daemon starts but blocks nothing and powers off nothing; changes are refused. \
         Reboot without it to block again.\n\
         .PP\n\\fBgpuctl doctor\\fR says when this boot has either word.\n",
    );
    o.push_str(
        ".SH FILES\n\
         .TP\n\\fI/etc/gpuctl/gpuctl.toml\\fR\nThe config file (admin\\-edited; \\fBgpuctl config\\fR writes it too). A file that does not parse is copied to \\fIgpuctl.toml.bad\\fR and the defaults apply.\n\
         .TP\n\\fI/var/lib/gpuctl/state.json\\fR\nThe saved mode, manual blocks and application rules, written atomically by the daemon and applied before it reports ready.\n\
         .TP\n\\fI/run/gpuctl/gpuctl.sock\\fR\nThe daemon's socket (JSON lines).\n\
         .TP\n\\fIgpuctl.service\\fR\nThe systemd unit (in \\fI/usr/lib/systemd/system\\fR or \\fI/lib/systemd/system\\fR), ordered before the display manager.\n\
         .TP\n\\fI/usr/lib/sysusers.d/gpuctl.conf\\fR\nCreates the \\fBgpuctl\\fR group.\n",
    );
    o.push_str(".SH ENVIRONMENT\n");
    for a in root.get_arguments() {
        if let Some(e) = a.get_env() {
            let long = a.get_long().unwrap_or("");
            let text = if a.is_hide_set() {
                format!("Same as --{long} (for tests: a fixture tree instead of the real one).")
            } else {
                format!("Same as --{long}.")
            };
            let _ = writeln!(
                o,
                ".TP\n\\fB{}\\fR\n{}",
                esc(&e.to_string_lossy()),
                esc(&text)
            );
        }
    }
    o.push_str(".TP\n\\fBNOTIFY_SOCKET\\fR\nSet by systemd: \\fBgpuctl daemon\\fR reports readiness there once the saved mode is in force.\n");
    o.push_str(".SH EXIT STATUS\n");
    for (code, text) in [
        (exit::OK, "Success."),
        (exit::ERROR, "An error (the message says what)."),
        (
            exit::USAGE,
            "Bad usage: unknown command, option, mode, key or GPU.",
        ),
        (exit::NOT_RUNNING, "The daemon is not running."),
        (
            exit::REFUSED,
            "The rules refused the change (the message says why).",
        ),
        (
            exit::DENIED,
            "The caller may not change the mode (not root, not in the group).",
        ),
        (
            exit::BUSY,
            "The daemon is busy: too many clients, or no answer in time (EX_TEMPFAIL: try again).",
        ),
        (
            exit::UNSUPPORTED,
            "gpuctl daemon: this kernel cannot load or attach the BPF programs (EX_CONFIG); \
             the unit does not restart on it. See gpuctl doctor.",
        ),
    ] {
        let _ = writeln!(o, ".TP\n\\fB{code}\\fR\n{}", esc(text));
    }
    o.push_str(".SH SEE ALSO\n\\fBsystemctl\\fR(1), \\fBsysusers.d\\fR(5), \\fI/usr/share/doc/gpuctl/README.md\\fR\n");
    o
}
