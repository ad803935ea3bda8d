//! `get` (in the dispatcher), `set`, `block` and `unblock`.

use super::super::Daemon;
use super::Rejection;
use crate::policy::{self, Choice, ManualBlock, Mode};
use crate::proto::data::ModeData;

/// Makes `choice` the choice (the core checks and applies it); answers
/// with the mode now in force.
pub(super) fn change(d: &mut Daemon, choice: Choice) -> Result<ModeData, Rejection> {
    d.core.change(choice)?;
    Ok(d.core.mode_json())
}

pub(super) fn set(d: &mut Daemon, mode: &str, force: bool) -> Result<ModeData, Rejection> {
    let mode = mode.parse::<Mode>().map_err(Rejection::BadRequest)?;
    change(
        d,
        Choice {
            mode,
            force,
            only_grants: false,
            ..d.core.choice().clone()
        },
    )
}

pub(super) fn block(
    d: &mut Daemon,
    arg: &str,
    force: bool,
    block: bool,
) -> Result<ModeData, Rejection> {
    let gpu = d
        .core
        .inventory()
        .find(arg)
        .map_err(Rejection::UnknownGpu)?
        .clone();
    if block {
        if let Some(reason) = policy::protect_reason(&gpu, force) {
            return Err(Rejection::Refused(format!("refused: {reason}")));
        }
    }
    let choice = d.core.choice();
    let plan = d.core.plan();
    // Entering manual mode starts from what is blocked now.
    let mut manual = if choice.mode == Mode::Manual {
        choice.manual.clone()
    } else {
        d.core
            .inventory()
            .gpus
            .iter()
            .filter(|g| plan.blocked.contains(&g.id))
            .map(|g| ManualBlock {
                pci: g.pci,
                force: choice.force,
            })
            .collect()
    };
    manual.retain(|m| m.pci != gpu.pci);
    if block {
        manual.insert(ManualBlock {
            pci: gpu.pci,
            force,
        });
    }
    let choice = Choice {
        mode: Mode::Manual,
        force: false,
        manual,
        ..choice.clone()
    };
    change(d, choice)
}
