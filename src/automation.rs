//! Automatic modes (`[auto]` in the config): the pure rule that picks the
//! mode from the power source, an external display and the user's manual
//! choice. The daemon (`daemon::auto`) gathers the inputs from the kernel
//! and applies the decision; every rule lives here and is unit-tested over
//! all of its inputs.
//!
//! Precedence, highest first:
//! 1. automation off (`gpuctl auto off`) or no rule configured: hands off;
//! 2. a manual choice (`gpuctl set`/`block`/`unblock`) made since the last
//!    power-source change: it stands until the power source changes again
//!    or `gpuctl auto on` is run;
//! 3. a display connected to an offload GPU, with `external_display =
//!    "unblock"`: hybrid (everything unblocked, the compositor told to
//!    re-scan), as long as the power rule would block offload GPUs;
//! 4. the power source's rule (`on_ac`, `on_battery`); a mode this machine
//!    refuses (integrated on a MUX laptop in dGPU mode) gives hybrid, and
//!    the reason says why.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::policy::Mode;

/// Where the machine's power comes from, as `class/power_supply` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Power {
    /// A `Mains` or `USB` supply is online, or the machine has no battery.
    Ac,
    /// Only system batteries (not a mouse's: `scope=Device`) supply it.
    Battery,
    /// `class/power_supply` could not be read.
    Unknown,
}

impl Power {
    #[cfg(test)]
    pub const ALL: [Power; 3] = [Power::Ac, Power::Battery, Power::Unknown];
    pub fn describe(self) -> &'static str {
        match self {
            Power::Ac => "on AC",
            Power::Battery => "on battery",
            Power::Unknown => "power source unknown",
        }
    }
}

/// A rule's mode: one of the automatic modes, or `none` (leave it alone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    #[default]
    None,
    Hybrid,
    Integrated,
    Smart,
}

impl Target {
    #[cfg(test)]
    pub const ALL: [Target; 4] = [
        Target::None,
        Target::Hybrid,
        Target::Integrated,
        Target::Smart,
    ];
    pub fn mode(self) -> Option<Mode> {
        match self {
            Target::None => None,
            Target::Hybrid => Some(Mode::Hybrid),
            Target::Integrated => Some(Mode::Integrated),
            Target::Smart => Some(Mode::Smart),
        }
    }
}

/// `external_display`: what a display connected to an offload GPU does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DisplayRule {
    /// Switch to hybrid while it is connected; tell compositors to re-scan.
    #[default]
    Unblock,
    /// Ignore it (the GPU still is not blocked while it drives a connected
    /// display: that rule is not automation's to lift).
    None,
}

/// `[auto]` in the config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rules {
    pub on_battery: Target,
    pub on_ac: Target,
    pub external_display: DisplayRule,
}

impl Rules {
    /// Whether any power rule is set (no rule: automation is inert).
    pub fn any(&self) -> bool {
        self.on_battery != Target::None || self.on_ac != Target::None
    }
    fn for_power(&self, p: Power) -> Target {
        match p {
            Power::Ac => self.on_ac,
            Power::Battery => self.on_battery,
            Power::Unknown => Target::None,
        }
    }
}

/// Everything the rule looks at.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub rules: &'a Rules,
    /// Not turned off with `gpuctl auto off`.
    pub enabled: bool,
    pub power: Power,
    /// A manual choice was made since the last power-source change.
    pub overridden: bool,
    /// A connected display on an offload GPU, as `GPU 1 DP-1`.
    pub display: Option<&'a str>,
    /// Modes this machine refuses, with the sentence that says why.
    pub refused: &'a BTreeMap<Mode, String>,
}

/// Why the decided mode (or no decision) stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// No power rule in the config.
    NoRules,
    /// `gpuctl auto off`.
    Off,
    /// A manual choice stands until the power source changes.
    Manual,
    /// The power source has no rule (`none`) or is unknown.
    NoRule(Power),
    /// The power source's rule.
    Power(Power),
    /// A display on an offload GPU (`external_display = "unblock"`).
    Display(String),
    /// The rule's mode is refused here; nothing is blocked instead.
    Unavailable {
        power: Power,
        wanted: Mode,
        why: String,
    },
}

/// The rule's answer: the mode to be in (`None`: leave it as it is) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub mode: Option<Mode>,
    pub why: Why,
}

/// The rule.
pub fn decide(i: &Inputs) -> Decision {
    let none = |why| Decision { mode: None, why };
    if !i.rules.any() {
        return none(Why::NoRules);
    }
    if !i.enabled {
        return none(Why::Off);
    }
    if i.overridden {
        return none(Why::Manual);
    }
    let Some(wanted) = i.rules.for_power(i.power).mode() else {
        return none(Why::NoRule(i.power));
    };
    let blocks = matches!(wanted, Mode::Integrated | Mode::Smart);
    if let (true, Some(d), DisplayRule::Unblock) = (blocks, i.display, i.rules.external_display) {
        return Decision {
            mode: Some(Mode::Hybrid),
            why: Why::Display(d.to_string()),
        };
    }
    if let Some(why) = i.refused.get(&wanted) {
        return Decision {
            mode: Some(Mode::Hybrid),
            why: Why::Unavailable {
                power: i.power,
                wanted,
                why: why.clone(),
            },
        };
    }
    Decision {
        mode: Some(wanted),
        why: Why::Power(i.power),
    }
}

impl fmt::Display for Why {
    /// The sentence `status` shows after the mode, without the "since".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::NoRules => f.write_str("no automatic rule configured"),
            Why::Off => f.write_str("automation off (gpuctl auto off)"),
            Why::Manual => {
                f.write_str("manual choice; automation resumes at the next power-source change")
            }
            Why::NoRule(Power::Unknown) => f.write_str("auto: power source unknown, no change"),
            Why::NoRule(p) => write!(
                f,
                "auto: no rule for {}",
                p.describe().trim_start_matches("on ")
            ),
            Why::Power(p) => write!(f, "auto: {}", p.describe()),
            Why::Display(d) => write!(f, "auto: external display {d}"),
            Why::Unavailable { power, wanted, why } => write!(
                f,
                "auto: {}, but {wanted} is refused here ({why})",
                power.describe()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal_sets() -> Vec<BTreeMap<Mode, String>> {
        let r = |m: &[Mode]| m.iter().map(|m| (*m, format!("no {m}"))).collect();
        vec![
            r(&[]),
            r(&[Mode::Integrated]),
            r(&[Mode::Smart]),
            r(&[Mode::Integrated, Mode::Smart]),
        ]
    }

    /// Every combination of every input (4 × 4 × 2 rules, 2 enabled,
    /// 3 power sources, 2 overrides, 2 display states, 4 refusal sets:
    /// 3072 cases), each checked against the precedence documented above.
    #[test]
    fn exhaustive_over_every_input() {
        let mut n = 0;
        let mut seen_modes = std::collections::BTreeSet::new();
        for on_battery in Target::ALL {
            for on_ac in Target::ALL {
                for external_display in [DisplayRule::Unblock, DisplayRule::None] {
                    let rules = Rules {
                        on_battery,
                        on_ac,
                        external_display,
                    };
                    for enabled in [true, false] {
                        for power in Power::ALL {
                            for overridden in [false, true] {
                                for display in [None, Some("GPU 1 DP-1")] {
                                    for refused in refusal_sets() {
                                        let i = Inputs {
                                            rules: &rules,
                                            enabled,
                                            power,
                                            overridden,
                                            display,
                                            refused: &refused,
                                        };
                                        let d = decide(&i);
                                        check(&i, &d);
                                        if let Some(m) = d.mode {
                                            seen_modes.insert(m);
                                        }
                                        n += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(n, 3072);
        // Automation reaches every automatic mode, and never manual.
        assert_eq!(
            seen_modes.into_iter().collect::<Vec<_>>(),
            vec![Mode::Hybrid, Mode::Integrated, Mode::Smart]
        );
    }

    fn check(i: &Inputs, d: &Decision) {
        let ctx = format!("{i:?} -> {d:?}");
        let target = match i.power {
            Power::Ac => i.rules.on_ac,
            Power::Battery => i.rules.on_battery,
            Power::Unknown => Target::None,
        };
        // 1. Off or no rules: hands off.
        if !i.rules.any() {
            assert_eq!(
                *d,
                Decision {
                    mode: None,
                    why: Why::NoRules
                },
                "{ctx}"
            );
            return;
        }
        if !i.enabled {
            assert_eq!(
                *d,
                Decision {
                    mode: None,
                    why: Why::Off
                },
                "{ctx}"
            );
            return;
        }
        // 2. A manual choice wins until the power source changes.
        if i.overridden {
            assert_eq!(
                *d,
                Decision {
                    mode: None,
                    why: Why::Manual
                },
                "{ctx}"
            );
            return;
        }
        // No rule for this power source (or unknown power): no change.
        if target == Target::None {
            assert_eq!(d.mode, None, "{ctx}");
            assert_eq!(d.why, Why::NoRule(i.power), "{ctx}");
            return;
        }
        let wanted = target.mode().unwrap();
        let blocks = wanted != Mode::Hybrid;
        // 3. An external display unblocks, whatever the machine refuses.
        if blocks && i.display.is_some() && i.rules.external_display == DisplayRule::Unblock {
            assert_eq!(d.mode, Some(Mode::Hybrid), "{ctx}");
            assert_eq!(d.why, Why::Display("GPU 1 DP-1".into()), "{ctx}");
            return;
        }
        // 4. The power rule, or hybrid when its mode is refused here.
        if i.refused.contains_key(&wanted) {
            assert_eq!(d.mode, Some(Mode::Hybrid), "{ctx}");
            assert!(
                matches!(&d.why, Why::Unavailable { wanted: w, .. } if *w == wanted),
                "{ctx}"
            );
            assert!(d.why.to_string().contains(&format!("no {wanted}")), "{ctx}");
        } else {
            assert_eq!(d.mode, Some(wanted), "{ctx}");
            assert_eq!(d.why, Why::Power(i.power), "{ctx}");
        }
        // Never a refused mode, never manual.
        let m = d.mode.unwrap();
        assert!(!i.refused.contains_key(&m), "{ctx}");
        assert_ne!(m, Mode::Manual, "{ctx}");
    }

    #[test]
    fn the_issue_example_and_status_sentences() {
        let rules = Rules {
            on_battery: Target::Integrated,
            on_ac: Target::Hybrid,
            external_display: DisplayRule::Unblock,
        };
        let none = BTreeMap::new();
        let at = |power, display| {
            decide(&Inputs {
                rules: &rules,
                enabled: true,
                power,
                overridden: false,
                display,
                refused: &none,
            })
        };
        let d = at(Power::Battery, None);
        assert_eq!(d.mode, Some(Mode::Integrated));
        assert_eq!(d.why.to_string(), "auto: on battery");
        assert_eq!(at(Power::Ac, None).mode, Some(Mode::Hybrid));
        let d = at(Power::Battery, Some("GPU 1 HDMI-A-1"));
        assert_eq!(d.mode, Some(Mode::Hybrid));
        assert_eq!(d.why.to_string(), "auto: external display GPU 1 HDMI-A-1");
        // Unplugged again: back to the rule's mode.
        assert_eq!(at(Power::Battery, None).mode, Some(Mode::Integrated));
        assert_eq!(Why::NoRule(Power::Ac).to_string(), "auto: no rule for AC");
        assert!(Why::Manual.to_string().starts_with("manual choice"));
    }

    #[test]
    fn config_values() {
        let r: Rules = toml::from_str(
            "on_battery = \"integrated\"\non_ac = \"smart\"\nexternal_display = \"none\"\n",
        )
        .unwrap();
        assert_eq!(r.on_battery, Target::Integrated);
        assert_eq!(r.on_ac, Target::Smart);
        assert_eq!(r.external_display, DisplayRule::None);
        assert_eq!(toml::from_str::<Rules>("").unwrap(), Rules::default());
        assert!(!Rules::default().any());
        // Manual is not an automatic mode; unknown keys are refused.
        assert!(toml::from_str::<Rules>("on_ac = \"manual\"").is_err());
        assert!(toml::from_str::<Rules>("on_mains = \"hybrid\"").is_err());
    }
}
