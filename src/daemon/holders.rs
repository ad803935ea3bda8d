//! Split sessions (issue 10, item 8): a display server that holds a GPU's
//! primary node keeps advertising that GPU to its clients; blocking it then
//! gives them black windows. Before a plan blocks a GPU that is not blocked
//! yet, the daemon looks for a display server holding its primary node and
//! records it on the GPU, so `policy` refuses (or, for the automatic rules,
//! skips) it with the holder's name, exactly like a connected display.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::gpu::{DevNum, Inventory};
use crate::policy::{self, Choice, Plan, Refusal};
use crate::procs;

/// The plan for `choice`, with the split-session rule: a GPU that `choice`
/// would newly block (not in `blocked` now) and whose primary node a
/// display server holds is planned with that holder recorded on it, so
/// `policy` refuses (or skips) it. The procfs scan runs only when such a
/// GPU exists and the choice is not forced: switching to hybrid, or
/// re-applying a plan that blocks the same GPUs, costs nothing, and
/// `policy::plan` runs a second time only when a holder was found.
pub fn plan(
    inv: &Inventory,
    procfs: &Path,
    choice: &Choice,
    blocked: &BTreeSet<u32>,
) -> Result<Plan, Refusal> {
    let first = policy::plan(inv, choice)?;
    if choice.force && choice.mode != policy::Mode::Manual {
        return Ok(first);
    }
    let newly: Vec<u32> = first.blocked.difference(blocked).copied().collect();
    if newly.is_empty() {
        return Ok(first);
    }
    let primary: BTreeMap<DevNum, u32> = inv
        .gpus
        .iter()
        .filter(|g| newly.contains(&g.id))
        .flat_map(|g| {
            g.nodes
                .iter()
                .filter(|n| is_primary(**n))
                .map(move |n| (*n, g.id))
        })
        .collect();
    let held = procs::display_holders(procfs, &primary);
    if held.is_empty() {
        // Discovery never fills `display_holder`: the inventory with no
        // holder recorded is `inv` itself, and so is its plan.
        return Ok(first);
    }
    let mut out = inv.clone();
    for g in &mut out.gpus {
        g.display_holder = held.get(&g.id).cloned();
    }
    policy::plan(&out, choice)
}

/// [`plan`] for a change that is made or refused as a whole
/// (`policy::check`'s rule: a GPU it would skip refuses it).
pub fn check(
    inv: &Inventory,
    procfs: &Path,
    choice: &Choice,
    blocked: &BTreeSet<u32>,
) -> Result<Plan, Refusal> {
    policy::refuse_skips(plan(inv, procfs, choice, blocked)?)
}

/// A primary node: DRM `cardN` (226, minor < 64 on every kernel gpuctl
/// supports; render nodes start at 128), or `/dev/nvidiaN` (195, below
/// `nvidiactl`'s 255), which NVIDIA's Xorg driver holds.
fn is_primary(n: DevNum) -> bool {
    (n.major == 226 && n.minor < 128) || (n.major == 195 && n.minor < 255)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_nodes() {
        assert!(is_primary(DevNum::new(226, 1)));
        assert!(!is_primary(DevNum::new(226, 129)));
        assert!(is_primary(DevNum::new(195, 0)));
        assert!(!is_primary(DevNum::new(195, 255)));
        assert!(!is_primary(DevNum::new(1, 3)));
    }
}
