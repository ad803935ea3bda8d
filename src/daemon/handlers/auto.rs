//! `gpuctl auto [on|off|status]`.

use super::super::reject::internal;
use super::super::Daemon;
use super::Rejection;
use crate::proto::data::AutoData;
use crate::proto::AutoAction;

pub(super) fn auto(d: &mut Daemon, action: Option<AutoAction>) -> Result<AutoData, Rejection> {
    match action {
        Some(AutoAction::On) => {
            d.auto.set_enabled(true);
            d.auto_evaluate(true, "gpuctl auto on");
        }
        Some(AutoAction::Off) => {
            d.auto.set_enabled(false);
            d.auto_evaluate(true, "gpuctl auto off");
        }
        Some(AutoAction::Status) | None => {
            // Read the power source now: status is never stale.
            d.auto_evaluate(true, "status");
        }
    }
    if let Some(e) = d.auto.save_error() {
        return Err(internal(format!("automation state not saved: {e}")));
    }
    Ok(d.auto.json(&d.core.config().auto, d.core.choice().mode))
}
