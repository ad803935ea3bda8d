//! Tier 2: on an AMD 760G desktop that boots on its add-in card (issue 20),
//! the chipset's IGP is integrated, so `integrated` (block every GPU but
//! the default one: here the IGP) is refused, not carried out.

use crate::common::fixture::machine;
use crate::common::harness::{describe, require_root, Env};

#[test]
#[ignore = "root"]
fn integrated_is_refused_on_a_desktop_booting_on_its_card() {
    require_root(module_path!());
    let mut env = Env::new(machine("amd_760g"));
    env.start();
    let out = env.gpuctl(&["set", "integrated"]);
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the default GPU here is the discrete"),
        "{}",
        describe(&out)
    );
    let get = env.json(&["get"]);
    assert_eq!(get["mode"], "hybrid", "{get}");
    assert_eq!(get["blocked"], serde_json::json!([]), "{get}");
}
