//! Each uid's share of the grant map (issue 18; docs/DESIGN-NOTES.md): the
//! numbers the kernel's fork and exec hooks enforce, from the map's size.
//! The loader sets them in `.rodata`; `status` shows them with the counts.

use serde::{Deserialize, Serialize};

/// The limits for one map size (`max_grants`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantShare {
    /// Grants from the hooks (inherited at fork, `DRI_PRIME`, app rules)
    /// one plain uid may hold at once: an eighth of the map.
    pub share: u32,
    /// Once the hooks' grants (every uid's) fill this many entries (three
    /// quarters of the map), the rest is the reserve ...
    pub reserve_at: u32,
    /// ... which only a uid holding fewer than this many takes from.
    pub small: u32,
}

impl GrantShare {
    pub fn for_map(max_grants: u32) -> GrantShare {
        let n = max_grants.max(1);
        let share = (n / 8).max(1);
        GrantShare {
            share,
            reserve_at: n - n / 4,
            small: (share / 16).max(1),
        }
    }
}

/// What the kernel counted (a snapshot of its counters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareCounts {
    /// Grants from the hooks in the map now, root's included.
    pub kernel_grants: u64,
    /// Grants the hooks refused because a uid held its share.
    pub refused: u64,
    /// Per plain uid: (uid, grants from the hooks held now, refused).
    pub uids: Vec<(u32, u64, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_map_size() {
        let d = GrantShare::for_map(8192);
        assert_eq!((d.share, d.reserve_at, d.small), (1024, 6144, 64));
        let t = GrantShare::for_map(256);
        assert_eq!((t.share, t.reserve_at, t.small), (32, 192, 2));
        // The smallest maps still let each uid hold one.
        for n in [0, 1, 2, 7] {
            let s = GrantShare::for_map(n);
            assert!(
                s.share >= 1 && s.small >= 1 && s.reserve_at >= 1,
                "{n}: {s:?}"
            );
            assert!(s.reserve_at <= n.max(1), "{n}: {s:?}");
        }
        // Eight uids at their share fill the map; six fill all but the reserve.
        let s = GrantShare::for_map(1_000_000);
        assert!(8 * u64::from(s.share) <= 1_000_000);
        assert!(6 * u64::from(s.share) <= u64::from(s.reserve_at));
    }
}
