//! What backs a cluster's windows, and whether they may have multicast: decided from the
//! configuration, the adaptors' tables and the environment, with the reason in words (for
//! `ferrocx info` and the log).

use std::fmt;

use crate::adaptor::{Ccl, Device};
use crate::config::{multicast_kill_switches, ClusterConfig, Fallback, MulticastMode, WindowMode};

use super::resources;

/// What `register_window` tries first on a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backing {
    /// The CCL's own window group.
    Vendor,
    /// The symmetric heap: buffers of `alloc_symmetric` in one flat range, others through IPC.
    SymHeap,
    /// Per-peer pointers (IPC handles, or each peer's heap allocation mapped on its own).
    Ipc,
    /// Nothing: registering fails with the plan's reason.
    Unavailable,
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backing::Vendor => "vendor",
            Backing::SymHeap => "symheap",
            Backing::Ipc => "ipc",
            Backing::Unavailable => "unavailable",
        })
    }
}

/// Whether windows of a cluster may map multicast.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MulticastPlan {
    /// `true` when multicast is mapped where the device reports support at registration and
    /// every rank agrees.
    pub allowed: bool,
    /// Why, in words.
    pub reason: String,
    /// A warning to log once: the config said `on` and something turns it off.
    pub warning: Option<String>,
}

/// A cluster's window plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// What is tried first.
    pub backing: Backing,
    /// Why, in words.
    pub reason: String,
    /// Multicast on symmetric windows.
    pub multicast: MulticastPlan,
}

impl fmt::Display for WindowPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}); multicast {} ({})",
            self.backing,
            self.reason,
            if self.multicast.allowed {
                "allowed"
            } else {
                "off"
            },
            self.multicast.reason
        )
    }
}

/// The plan of `cluster` with its `device` and `ccl`, reading the multicast kill-switches
/// through `env` (e.g. `|v| std::env::var(v).ok()`).
///
/// - `window = "vendor"`: the CCL's window group, or nothing when it has none;
/// - `window = "ipc"`: per-peer pointers;
/// - `window = "symheap"`, or `auto` when the CCL has no window group and `fallback` is not
///   `none`: the symmetric heap, or IPC when the device cannot map peers (no VMM or flat-map
///   group);
/// - `auto` with a CCL window group: the CCL's.
pub fn plan(
    cluster: &ClusterConfig,
    device: &Device,
    ccl: &Ccl,
    env: impl Fn(&str) -> Option<String>,
) -> WindowPlan {
    plan_with_support(cluster, device, ccl, None, env)
}

/// As [`plan`], where whether the CCL's vendor library can register windows is already known
/// (`Some(Err(why))`: it cannot): `ferrocx info` learns it from the adaptor initialised in a
/// child process, while the CCL in its own process never runs `init`. `None` asks the CCL
/// (after its `init`).
pub fn plan_with_support(
    cluster: &ClusterConfig,
    device: &Device,
    ccl: &Ccl,
    window_register: Option<Result<(), String>>,
    env: impl Fn(&str) -> Option<String>,
) -> WindowPlan {
    let vendor = match window_register {
        None => resources::has_vendor_windows(ccl),
        Some(known) => resources::has_window_group(ccl).and_then(|()| {
            known.map_err(|why| format!("the CCL `{}` has a window group, but {why}", ccl.name()))
        }),
    };
    let (backing, reason) = match (cluster.window, vendor) {
        (WindowMode::Vendor, Ok(())) => (
            Backing::Vendor,
            format!(
                "window = \"vendor\"; the CCL `{}` has a window group",
                ccl.name()
            ),
        ),
        (WindowMode::Vendor, Err(why)) => (
            Backing::Unavailable,
            format!("window = \"vendor\", but {why}"),
        ),
        (WindowMode::Ipc, _) => (Backing::Ipc, "window = \"ipc\"".to_string()),
        (WindowMode::Auto, Ok(())) => (
            Backing::Vendor,
            format!("the CCL `{}` has a window group", ccl.name()),
        ),
        (WindowMode::Auto, Err(why)) if cluster.fallback == Fallback::Disabled => (
            Backing::Unavailable,
            format!("{why} and fallback = \"none\""),
        ),
        (WindowMode::Auto, Err(why)) | (WindowMode::SymHeap, Err(why)) => {
            let why = match cluster.window {
                WindowMode::SymHeap => "window = \"symheap\"".to_string(),
                _ => why,
            };
            symheap_or_ipc(device, why)
        }
        (WindowMode::SymHeap, Ok(())) => symheap_or_ipc(device, "window = \"symheap\"".to_string()),
    };
    let multicast = multicast_plan(
        cluster.multicast,
        backing == Backing::SymHeap,
        resources::has_multicast(device),
        device.name(),
        env,
    );
    WindowPlan {
        backing,
        reason,
        multicast,
    }
}

/// The symmetric heap when `device` can map peers, else IPC; `why` says what chose the heap.
fn symheap_or_ipc(device: &Device, why: String) -> (Backing, String) {
    if resources::can_map_peers(device) {
        (Backing::SymHeap, why)
    } else {
        (
            Backing::Ipc,
            format!(
                "{why}, and the device `{}` cannot map peers (no VMM or flat-map group)",
                device.name()
            ),
        )
    }
}

/// Multicast is allowed when the config says `auto` or `on`, no kill-switch is set, windows
/// are symmetric and the device has the multicast group; a kill-switch wins over `on`, with a
/// warning.
fn multicast_plan(
    mode: MulticastMode,
    symmetric: bool,
    device_group: bool,
    device: &str,
    env: impl Fn(&str) -> Option<String>,
) -> MulticastPlan {
    let off = |reason: String, warn: bool| MulticastPlan {
        allowed: false,
        warning: (warn && mode == MulticastMode::On).then(|| {
            format!("multicast = \"on\" in the config, but {reason}: multicast stays off")
        }),
        reason,
    };
    let switches = match multicast_kill_switches(&env) {
        Ok(s) => s,
        // Unreadable is off: a kill-switch that cannot be read must not be ignored.
        Err(e) => vec![format!("an unreadable kill-switch ({e})")],
    };
    if !switches.is_empty() {
        return off(
            format!("{} in the environment", switches.join(" and ")),
            true,
        );
    }
    if mode == MulticastMode::Off {
        return off("multicast = \"off\" in the config".to_string(), false);
    }
    if !symmetric {
        return off("windows are not symmetric here".to_string(), true);
    }
    if !device_group {
        return off(
            format!("the device `{device}` has no multicast group"),
            true,
        );
    }
    MulticastPlan {
        allowed: true,
        reason: format!(
            "multicast = \"{mode}\"; mapped where the device reports support and every rank agrees"
        ),
        warning: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_kill_switch_wins_over_on_with_a_warning() {
        for env in [
            &[("FERROCX_MULTICAST", "0")][..],
            &[("NCCL_NVLS_ENABLE", "0")][..],
            &[("FERROCX_MULTICAST", "banana")][..],
        ] {
            let p = multicast_plan(MulticastMode::On, true, true, "d", vars(env));
            assert!(!p.allowed, "{env:?}");
            let w = p.warning.expect("a warning for `on`");
            assert!(w.contains("multicast = \"on\""), "{w}");
            assert!(w.contains(env[0].0), "{w}");
            // `auto` is turned off silently.
            let p = multicast_plan(MulticastMode::Auto, true, true, "d", vars(env));
            assert_eq!((p.allowed, p.warning), (false, None));
        }
    }

    #[test]
    fn multicast_needs_config_symmetry_and_the_group() {
        let none = vars(&[("NCCL_NVLS_ENABLE", "1"), ("FERROCX_MULTICAST", "1")]);
        assert!(multicast_plan(MulticastMode::Auto, true, true, "d", &none).allowed);
        assert!(multicast_plan(MulticastMode::On, true, true, "d", &none).allowed);
        let p = multicast_plan(MulticastMode::Off, true, true, "d", &none);
        assert_eq!((p.allowed, p.warning.is_some()), (false, false));
        let p = multicast_plan(MulticastMode::On, true, false, "dev9", &none);
        assert!(!p.allowed && p.reason.contains("dev9"), "{p:?}");
        assert!(p.warning.is_some());
        assert!(!multicast_plan(MulticastMode::Auto, false, true, "d", &none).allowed);
    }
}
