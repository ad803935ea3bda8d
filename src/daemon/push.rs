//! Daemon → client push of what a user sees (`gpuctl events`), beside the
//! `mode` events of auto.rs and the `wake`/`sleep`/`power` events of
//! power.rs: a GPU's blocked state (from any cause: a mode change, manual
//! blocks, automation, a display plugged in, a hot-plugged GPU) and
//! `gpuctl run` grants. `blocked` events come from comparing what was last
//! announced with what is in force, once per loop turn, so every cause is
//! covered by one call and nothing is announced twice. It costs a
//! comparison of two small sets per turn and no system call.

use std::collections::BTreeSet;

use crate::gpu::Inventory;
use crate::policy::{self, Choice, Mode, Plan};
use crate::proto::data::Modes;
use crate::proto::event::{Blocked, Event, GrantEvent, HeldEvent};

#[derive(Default)]
pub struct Push {
    /// The mode and blocked GPU ids last announced.
    last: Option<(Mode, BTreeSet<u32>)>,
    /// The skips for a display server last announced: (GPU id, holder pid).
    held: BTreeSet<(u32, u32)>,
    /// Events queued by request handlers (grants), sent after the turn.
    /// Each says whose it is: pid and command name go only to root, the
    /// group and that user (the rule `denied` follows; `proto::redact`).
    outbox: Vec<Event>,
}

impl Push {
    /// Starts from what is in force (nobody is subscribed before the first
    /// turn, so there is nothing to announce).
    pub fn new(choice: &Choice, plan: &Plan) -> Push {
        Push {
            last: Some((choice.mode, plan.blocked.iter().copied().collect())),
            held: held_now(plan),
            outbox: Vec::new(),
        }
    }

    /// The events that bring a subscriber from the last announced state to
    /// the one in force: one `blocked` per GPU whose blocked state changed.
    pub fn changes(&mut self, inv: &Inventory, choice: &Choice, plan: &Plan) -> Vec<Event> {
        let now: BTreeSet<u32> = plan.blocked.iter().copied().collect();
        let (mode0, blocked0) = match &self.last {
            Some((m, b)) if *m == choice.mode && *b == now => return Vec::new(),
            Some((m, b)) => (Some(*m), b.clone()),
            None => (None, BTreeSet::new()),
        };
        let mut out = Vec::new();
        for g in &inv.gpus {
            let (was, is) = (blocked0.contains(&g.id), now.contains(&g.id));
            if was == is {
                continue;
            }
            let displays: Vec<String> = g
                .displays
                .iter()
                .filter(|d| d.connected())
                .map(|d| d.connector.clone())
                .collect();
            // Unblocked while the mode still wants it blocked: a display
            // appeared on one of its ports.
            let reason = if !is && mode0 == Some(choice.mode) && !displays.is_empty() {
                "display"
            } else {
                "mode"
            };
            out.push(Event::Blocked(Blocked {
                gpu: g.id,
                pci: Some(g.pci),
                blocked: is,
                reason: reason.to_string(),
                displays,
            }));
        }
        self.last = Some((choice.mode, now));
        out
    }

    /// One `held` event per GPU the plan newly leaves alone for a display
    /// server (issue 18): a skip is announced when it begins (a new GPU,
    /// or another holder), not at each re-plan that keeps it. `auto`: the
    /// mode in force is automation's.
    pub fn held(
        &mut self,
        inv: &Inventory,
        choice: &Choice,
        plan: &Plan,
        auto: bool,
    ) -> Vec<Event> {
        let now = held_now(plan);
        let out = plan
            .skipped
            .iter()
            .filter_map(|s| Some((s, s.holder.as_ref()?)))
            .filter(|(s, h)| !self.held.contains(&(s.gpu, h.pid)))
            .map(|(s, h)| {
                Event::Held(HeldEvent {
                    gpu: s.gpu,
                    pci: inv.gpus.iter().find(|g| g.id == s.gpu).map(|g| g.pci),
                    mode: choice.mode,
                    auto,
                    pid: Some(h.pid),
                    comm: Some(h.comm.clone()),
                    uid: Some(h.uid),
                })
            })
            .collect();
        self.held = now;
        out
    }

    /// What to send subscribers this turn: what changed in `core` since
    /// the last announcement, then the queued events. Taken even when
    /// nobody listens, so nothing is announced late. `auto`: automation
    /// is active (the mode in force is its).
    pub fn take(&mut self, core: &super::core::Core, auto: bool) -> Vec<Event> {
        let changed = self.changes(core.inventory(), core.choice(), core.plan());
        let held = self.held(core.inventory(), core.choice(), core.plan(), auto);
        let queued = std::mem::take(&mut self.outbox);
        changed.into_iter().chain(held).chain(queued).collect()
    }

    /// A GPU's power-off changed (poweroff.rs).
    pub fn power_off(
        &mut self,
        gpu: u32,
        pci: crate::gpu::PciAddr,
        info: Option<crate::proto::data::PowerOffInfo>,
    ) {
        self.outbox
            .push(Event::PowerOff(crate::proto::event::PowerOffEvent {
                gpu,
                pci: Some(pci),
                power_off: info,
            }));
    }

    /// A `gpuctl run` grant was made.
    pub fn grant(&mut self, pid: i32, uid: u32, comm: &str, gpu: u32, only: bool) {
        self.outbox.push(Event::Grant(GrantEvent {
            pid: Some(pid),
            comm: Some(comm.to_string()),
            uid: Some(uid),
            gpus: vec![gpu],
            how: if only { "run --only" } else { "run" }.to_string(),
        }));
    }
}

/// The skips for a display server in `plan`: (GPU id, holder pid).
fn held_now(plan: &Plan) -> BTreeSet<(u32, u32)> {
    plan.skipped
        .iter()
        .filter_map(|s| Some((s.gpu, s.holder.as_ref()?.pid)))
        .collect()
}

/// Which modes this machine can be put in now: `null` for each that can,
/// the refusal's sentence for each that cannot (`status --json` `modes`).
pub fn modes(inv: &Inventory, choice: &Choice) -> Modes {
    let mut out = Modes::default();
    for mode in [Mode::Hybrid, Mode::Integrated, Mode::Smart, Mode::Manual] {
        let why = if mode != Mode::Hybrid && !inv.gpus.iter().any(|g| g.offload) {
            Some("this machine has no offload GPU".to_string())
        } else if mode == Mode::Manual {
            None
        } else {
            policy::check(
                inv,
                &Choice {
                    mode,
                    force: false,
                    only_grants: false,
                    ..choice.clone()
                },
            )
            .err()
            .map(|r| r.0)
        };
        out.set(mode, why);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Choice;
    use crate::proto::redact::Viewer;
    use serde_json::Value;

    fn vals(v: Vec<Event>) -> Vec<Value> {
        v.iter().map(Event::to_value).collect()
    }

    fn gpu(id: u32, pci: &str, default: bool) -> crate::gpu::Gpu {
        let vendor = if default { "8086" } else { "10de" };
        crate::gpu::test_gpu(id, pci, vendor, default)
    }

    fn laptop() -> Inventory {
        Inventory {
            gpus: vec![gpu(0, "0000:00:02.0", true), gpu(1, "0000:01:00.0", false)],
            ..Default::default()
        }
    }

    #[test]
    fn display_unblock_says_so() {
        let mut inv = laptop();
        let integrated = Choice {
            mode: Mode::Integrated,
            ..Choice::default()
        };
        let mut p = Push::new(&integrated, &policy::plan(&inv, &integrated).unwrap());
        inv.gpus[1].displays.push(crate::gpu::Display {
            connector: "HDMI-A-1".into(),
            status: Some("connected".into()),
        });
        let ev = vals(p.changes(&inv, &integrated, &policy::plan(&inv, &integrated).unwrap()));
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0]["blocked"], false);
        assert_eq!(ev[0]["reason"], "display");
        assert_eq!(ev[0]["displays"][0], "HDMI-A-1");
    }

    #[test]
    fn announces_each_change_once() {
        let inv = laptop();
        let hybrid = Choice::default();
        let mut p = Push::new(&hybrid, &policy::plan(&inv, &hybrid).unwrap());
        assert!(p
            .changes(&inv, &hybrid, &policy::plan(&inv, &hybrid).unwrap())
            .is_empty());
        let integrated = Choice {
            mode: Mode::Integrated,
            ..Choice::default()
        };
        let plan = policy::plan(&inv, &integrated).unwrap();
        let ev = vals(p.changes(&inv, &integrated, &plan));
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0]["event"], "blocked");
        assert_eq!(ev[0]["gpu"], 1);
        assert_eq!(ev[0]["blocked"], true);
        assert_eq!(ev[0]["reason"], "mode");
        assert!(p.changes(&inv, &integrated, &plan).is_empty());
    }

    /// Issue 18 F2: a GPU left alone for a display server is announced
    /// once when the skip begins (not at each re-plan that keeps it), again
    /// for a new holder or after the skip ended; its holder is private.
    #[test]
    fn a_skip_for_a_display_server_is_announced_once() {
        let mut inv = laptop();
        let hybrid = Choice::default();
        let mut p = Push::new(&hybrid, &policy::plan(&inv, &hybrid).unwrap());
        let integrated = Choice {
            mode: Mode::Integrated,
            ..Choice::default()
        };
        let holder = |pid: u32| crate::gpu::DisplayHolder {
            comm: "gnome-shell".into(),
            pid,
            uid: 1000,
        };
        inv.gpus[1].display_holder = Some(holder(2210));
        let plan = policy::plan(&inv, &integrated).unwrap();
        let ev = vals(p.held(&inv, &integrated, &plan, true));
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(
            ev[0],
            serde_json::json!({"event": "held", "gpu": 1, "pci": "0000:01:00.0",
                "mode": "integrated", "auto": true, "pid": 2210,
                "comm": "gnome-shell", "uid": 1000})
        );
        // Re-planned with the same holder: nothing new.
        assert!(p.held(&inv, &integrated, &plan, true).is_empty());
        // Another display server holds it now: announced.
        inv.gpus[1].display_holder = Some(holder(2300));
        let plan = policy::plan(&inv, &integrated).unwrap();
        let ev = vals(p.held(&inv, &integrated, &plan, true));
        assert_eq!((ev.len(), ev[0]["pid"].clone()), (1, 2300.into()), "{ev:?}");
        // It exits (the GPU is blocked), then one comes back: announced again.
        inv.gpus[1].display_holder = None;
        let plan = policy::plan(&inv, &integrated).unwrap();
        assert!(p.held(&inv, &integrated, &plan, true).is_empty());
        inv.gpus[1].display_holder = Some(holder(2300));
        let plan = policy::plan(&inv, &integrated).unwrap();
        let e = p.held(&inv, &integrated, &plan, false);
        assert_eq!(e.len(), 1);
        let stranger = e[0].clone().for_viewer(Viewer::user(1001)).to_value();
        assert_eq!(
            (
                stranger["pid"].clone(),
                stranger["comm"].clone(),
                stranger["auto"].clone()
            ),
            (Value::Null, Value::Null, false.into())
        );
        assert_eq!(
            e[0].clone().for_viewer(Viewer::user(1000)).to_value()["pid"],
            2300
        );
    }

    #[test]
    fn modes_say_why_not() {
        let inv = laptop();
        let m = serde_json::to_value(modes(&inv, &Choice::default())).unwrap();
        assert_eq!(m["hybrid"], Value::Null);
        assert_eq!(m["integrated"], Value::Null);
        let mut one = inv.clone();
        one.gpus.retain(|g| g.default);
        let m = serde_json::to_value(modes(&one, &Choice::default())).unwrap();
        assert_eq!(m["integrated"], "this machine has no offload GPU");
        assert_eq!(m["hybrid"], Value::Null);
    }

    #[test]
    fn redacts_other_users() {
        let e = Event::Grant(GrantEvent {
            pid: Some(5),
            comm: Some("game".into()),
            uid: Some(1000),
            gpus: vec![1],
            how: "run".into(),
        });
        let redact = |v: Viewer| e.clone().for_viewer(v).to_value();
        assert_eq!(redact(Viewer::user(1001))["pid"], Value::Null);
        assert_eq!(redact(Viewer::user(1000))["pid"], 5);
        assert_eq!(redact(Viewer::ALL)["comm"], "game");
    }
}
