//! `gpuctl tray`: the session loop. Daemon events and menu clicks arrive on
//! one channel; each batch re-reads the daemon's state once (one `status`,
//! one `who`), redraws what changed and posts the notifications due.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::follow::{self, Msg};
use super::model::{Action, Denial, Look, State};
use super::notify::Notifier;
use super::sni::{Shown, Tray};
use super::{config, icon};
use crate::exit;
use crate::proto::event::Event;

fn shown(state: &State) -> Shown {
    let look = state.look();
    Shown {
        title: state.title(),
        // NeedsAttention while the dGPU is awake: hosts may highlight it.
        status: if look == Look::Awake {
            "NeedsAttention"
        } else {
            "Active"
        }
        .into(),
        pixmaps: icon::pixmaps(look, state.mode()),
        tip_title: state.title(),
        // The StatusNotifierItem tooltip body may be rendered as markup.
        tip_body: crate::text::markup(&state.tooltip()),
        menu: state.menu(),
        revision: 0,
    }
}

fn describe_action(a: &Action) -> String {
    match a {
        Action::SetMode(m) => format!("switching to {m} mode"),
        Action::Block(g) => format!("blocking GPU {g}"),
        Action::Unblock(g) => format!("unblocking GPU {g}"),
        Action::Allow(p) => format!("allowing {p}"),
        Action::Auto(on) => format!("turning automatic modes {}", if *on { "on" } else { "off" }),
        Action::Quit => "quitting".into(),
    }
}

pub fn run(socket: &Path) -> u8 {
    let (cfg, warn) = config::load();
    if let Some(w) = warn {
        eprintln!("gpuctl tray: {w}");
    }
    let (tx, rx) = mpsc::channel();
    let tray = match Tray::start(tx.clone()) {
        Ok(Some(t)) => t,
        Ok(None) => {
            eprintln!("gpuctl tray: another gpuctl tray runs in this session; leaving it be");
            return exit::OK;
        }
        Err(e) => {
            eprintln!("gpuctl tray: {e:#}");
            return exit::ERROR;
        }
    };
    let mut notifier = Notifier::new(cfg.notify, super::notify::dbus_sink(tray.conn.clone()));
    let mut state = State::default();
    state.set_down("connecting to the gpuctl daemon…".into());
    tray.show(shown(&state));
    follow::spawn(socket.to_path_buf(), tx);
    loop {
        let wait = notifier
            .deadline()
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(3600));
        let first = match rx.recv_timeout(wait) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return exit::ERROR,
        };
        let mut refresh = false;
        for msg in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            let now = Instant::now();
            match msg {
                Msg::Up => refresh = true,
                Msg::Down(why) => state.set_down(why),
                Msg::Event(e, exe) => {
                    refresh = true;
                    if let Event::Denied(d) = e.as_ref() {
                        state.add_denial(Denial {
                            pid: d.pid.map(u64::from),
                            comm: d.comm.clone().unwrap_or_else(|| "a process".to_string()),
                            gpu: Some(u64::from(d.gpu)),
                            exe,
                        });
                    }
                    notifier.event(&e, now);
                }
                Msg::Action(Action::Quit) => return exit::OK,
                Msg::Action(a) => {
                    refresh = true;
                    match follow::perform(socket, &a) {
                        Ok(()) => state.last_error = None,
                        Err(why) => {
                            let what = describe_action(&a);
                            notifier.action_failed(&what, &why, now);
                            state.last_error = Some(format!("{what}: {why}"));
                        }
                    }
                }
            }
        }
        if refresh {
            follow::fetch(socket, &mut state);
        }
        tray.show(shown(&state));
        notifier.tick(Instant::now());
    }
}
