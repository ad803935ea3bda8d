//! The daemon's log: one line on stderr per call (the journal under
//! systemd). A function, with a one-line macro in front, so any module may
//! use it whatever the order of the module declarations.

/// Writes `gpuctl: <args>\n` with one write(2) (stderr is unbuffered, and
/// `eprintln!` writes each formatted piece separately).
pub(crate) fn line(args: std::fmt::Arguments) {
    // Names and paths in a message are other users' choice: a newline would
    // forge a line, escape sequences would act on whoever reads the journal.
    let line = format!("gpuctl: {}\n", crate::text::human(&args.to_string()));
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// `log!("…", args)`: one log line (see [`line`]).
macro_rules! log_line {
    ($($arg:tt)*) => { $crate::daemon::log::line(format_args!($($arg)*)) };
}
pub(crate) use log_line as log;
