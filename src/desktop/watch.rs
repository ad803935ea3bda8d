//! `gpuctl watch --waybar|--json`: one line on stdout per change, for
//! waybar/i3blocks/polybar custom modules and scripts. The first line comes
//! at once; then a line only when what it says changed.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;

use super::follow::{self, Msg};
use super::model::State;
use crate::exit;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Waybar,
    Json,
}

pub fn run(socket: &Path, format: Format) -> u8 {
    let (tx, rx) = mpsc::channel();
    follow::spawn(socket.to_path_buf(), tx);
    let mut state = State::default();
    let mut last = None;
    let mut out = std::io::stdout().lock();
    while let Ok(first) = rx.recv() {
        let mut refresh = false;
        for msg in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match msg {
                Msg::Up | Msg::Event(..) => refresh = true,
                Msg::Down(why) => state.set_down(why),
                Msg::Action(_) => {}
            }
        }
        if refresh {
            follow::fetch(socket, &mut state);
        }
        // What changed is judged on the facts, not on the wording (a daemon
        // that went away is one change, whichever error said so first).
        let facts = state.json();
        let mut key = facts.clone();
        if let Some(o) = key.as_object_mut() {
            o.remove("reason");
        }
        if last.as_ref() == Some(&key) {
            continue;
        }
        last = Some(key);
        let line = match format {
            Format::Waybar => state.waybar(),
            Format::Json => facts,
        };
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return exit::OK;
        }
    }
    exit::ERROR
}
