//! `ferrocx info`.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use ferrocx::registry::Registry;
use serde_json::{json, Value};

use crate::report::{abi_version, adaptor_text, describe};

/// Clusters of `config` with their selection (or the reason there is none), and for each
/// adaptor the clusters that selected it.
pub(crate) fn clusters_json(
    config: &ferrocx::config::Config,
    registry: &Registry,
    probes: &std::collections::HashMap<String, Value>,
) -> (Vec<Value>, Vec<(String, String)>) {
    let mut clusters = Vec::new();
    let mut uses = Vec::new();
    for (i, c) in config.clusters.iter().enumerate() {
        let mut v = json!({
            "name": c.name,
            "ranks": c.ranks.to_string(),
            "device": c.device,
            "ccl": c.ccl,
            "fallback": c.fallback.to_string(),
            "multicast": c.multicast.to_string(),
            "window": c.window.to_string(),
            "options": c.options,
        });
        match registry.select(config, i) {
            Ok(sel) => {
                v["selected"] = json!(true);
                // Whether the CCL's library registers windows, as its probe (in a child, after
                // `init`) found; without a probe, the CCL is asked.
                let known = probes
                    .get(&c.ccl)
                    .and_then(|p| p.get("ccl_runtime"))
                    .and_then(|r| r.get("window_register"))
                    .map(|w| match w["reason"].as_str() {
                        Some(why) => Err(why.to_string()),
                        None => Ok(()),
                    });
                let plan =
                    ferrocx::window::plan_with_support(c, &sel.device, &sel.ccl, known, |k| {
                        std::env::var(k).ok()
                    });
                v["windows"] = json!({
                    "backing": plan.backing.to_string(),
                    "reason": plan.reason,
                    "multicast": plan.multicast.allowed,
                    "multicast_reason": plan.multicast.reason,
                });
                uses.push((c.device.clone(), format!("cluster {:?} (device)", c.name)));
                uses.push((c.ccl.clone(), format!("cluster {:?} (ccl)", c.name)));
            }
            Err(e) => {
                v["selected"] = json!(false);
                v["error"] = json!(e.to_string());
            }
        }
        clusters.push(v);
    }
    (clusters, uses)
}

pub(crate) fn rejected_json(registry: &Registry) -> Vec<Value> {
    registry
        .rejected()
        .iter()
        .map(|e| {
            json!({
                "path": e.path.display().to_string(),
                "symbol": e.symbol,
                "kind": format!("{:?}", e.kind),
                "reason": e.reason,
                "message": e.to_string(),
            })
        })
        .collect()
}

pub fn run(
    config_path: Option<&PathBuf>,
    as_json: bool,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let config = crate::load_config(config_path)?;
    // Multicast kill-switches as the user's environment sets them, read before any adaptor
    // runs (the NCCL adaptor's `init` sets NCCL_NVLS_ENABLE=0 when it is unset).
    let switches = ferrocx::config::multicast_kill_switches(|k| std::env::var(k).ok())
        .unwrap_or_else(|e| vec![e.to_string()]);
    let registry = Registry::discover(&config.runtime);
    // In a child with a deadline: an adaptor's init that crashes, exits or hangs is that
    // adaptor's entry, not the end of `info`.
    let probes: std::collections::HashMap<String, Value> = registry
        .entries()
        .iter()
        .map(|e| (e.name.clone(), crate::probe::isolated(e, config_path)))
        .collect();
    let (clusters, uses) = clusters_json(&config, &registry, &probes);
    let adaptors: Vec<Value> = registry
        .entries()
        .iter()
        .map(|e| {
            let mut v = describe(e);
            if let (Value::Object(m), Some(Value::Object(p))) = (&mut v, probes.get(&e.name)) {
                m.extend(p.clone());
            }
            v["selected_by"] = json!(uses
                .iter()
                .filter(|(name, _)| *name == e.name)
                .map(|(_, who)| who.clone())
                .collect::<Vec<_>>());
            if let Some(m) = multicast_status(&v, &switches, &config) {
                v["multicast"] = m;
            }
            v
        })
        .collect();
    // A config of several clusters that name their ranks fixes the world: its plan across
    // clusters (the bridge and how an all-reduce is cut) is printed as `config check --world`
    // would.
    let world = (config.clusters.len() > 1)
        .then(|| {
            config
                .clusters
                .iter()
                .map(|c| {
                    c.ranks
                        .ranges()
                        .and_then(|r| r.iter().map(|r| *r.end() + 1).max())
                })
                .collect::<Option<Vec<usize>>>()
        })
        .flatten()
        .and_then(|ends| ends.into_iter().max());
    let plan = match world.map(|w| ferrocx::hetero::plan::describe(&config, w)) {
        Some(Ok(Some(text))) => json!({ "world": world, "text": text }),
        Some(Err(e)) => json!({ "world": world, "error": e }),
        _ => Value::Null,
    };
    let report = json!({
        "ferrocx": env!("CARGO_PKG_VERSION"),
        "abi": abi_version(),
        "plan": plan,
        "config": config.origin.to_string(),
        "plugin_dirs": config.runtime.plugin_dirs,
        "plugins": config.runtime.plugins,
        "adaptors": adaptors,
        "rejected": rejected_json(&registry),
        "shadowed": registry.shadowed().iter().map(|(p, by)| json!({
            "path": p.display().to_string(), "by": by,
        })).collect::<Vec<_>>(),
        "clusters": clusters,
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a device adaptor may create multicast objects here, by the first reason that
/// applies: a kill-switch in the environment (`disabled by NCCL_NVLS_ENABLE=0`, then
/// `FERROCX_MULTICAST=0`), the device (`not supported by the device`: no multicast group, the
/// device unavailable, or no multicast capability), the config (`config off`: every cluster that
/// selects the device says "off"). `None` for an adaptor without a device.
fn multicast_status(
    a: &Value,
    switches: &[String],
    config: &ferrocx::config::Config,
) -> Option<Value> {
    use ferrocx::abi::{AbiTable, DeviceMulticastV1};
    use ferrocx::config::MulticastMode;
    if a["kinds"]["device"] != true {
        return None;
    }
    let status = |allowed: bool, why: &str| Some(json!({ "allowed": allowed, "status": why }));
    if let Some(switch) = switches.first() {
        return status(false, &format!("disabled by {switch}"));
    }
    let has = |v: &Value, what: &str| v.as_array().is_some_and(|l| l.iter().any(|x| x == what));
    if !has(&a["groups"], DeviceMulticastV1::SYMBOL) {
        return status(false, "not supported by the device (no multicast group)");
    }
    let probe = &a["device_probe"];
    if probe["available"] != true {
        return status(false, "not supported by the device (unavailable)");
    }
    if !has(&probe["info"]["device0"]["capabilities"], "multicast") {
        return status(false, "not supported by the device");
    }
    let name = a["name"].as_str().unwrap_or_default();
    let mut modes: Vec<String> = Vec::new();
    for c in config.clusters.iter().filter(|c| c.device == name) {
        if c.multicast != MulticastMode::Off && !modes.contains(&c.multicast.to_string()) {
            modes.push(c.multicast.to_string());
        }
    }
    if config.clusters.iter().all(|c| c.device != name) {
        return status(false, "supported; no cluster selects this device");
    }
    if modes.is_empty() {
        return status(false, "config off");
    }
    status(true, &format!("allowed (config {})", modes.join(", ")))
}

/// What a CCL supports with the vendor library its `init` loaded, for the entries whose support
/// depends on it (NCCL's window registration needs `ncclCommWindowRegister`, 2.27), from its
/// capabilities (the adaptor's `query_support`, ABI 1.2; an older table supports what it
/// exports). `None` when it has none.
pub(crate) fn ccl_runtime(e: &ferrocx::registry::AdaptorEntry) -> Option<Value> {
    use ferrocx::adaptor::RuntimeSupport;
    let ccl = e.ccl()?;
    let mut out = serde_json::Map::new();
    for (entry, support) in ccl.caps().runtime.clone() {
        let v = match support {
            RuntimeSupport::Absent => continue,
            RuntimeSupport::Supported => json!({ "supported": true }),
            RuntimeSupport::Unsupported(why) => json!({ "supported": false, "reason": why }),
        };
        out.insert(entry.to_string(), v);
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

fn render(r: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let paths = |v: &Value| -> String {
        let p: Vec<String> = v.as_array().into_iter().flatten().map(s).collect();
        if p.is_empty() {
            "(none)".into()
        } else {
            p.join(", ")
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ferrocx {} (plugin ABI {})",
        s(&r["ferrocx"]),
        s(&r["abi"])
    );
    let _ = writeln!(out, "config: {}", s(&r["config"]));
    let _ = writeln!(out, "plugin directories: {}", paths(&r["plugin_dirs"]));
    let _ = writeln!(
        out,
        "plugin files named one by one: {}",
        paths(&r["plugins"])
    );
    // What was loaded from those directories and files (built-ins are `[built-in]`).
    let loaded: Vec<String> = r["adaptors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| s(&a["source"]))
        .filter(|src| src != "built-in")
        .collect();
    let _ = writeln!(
        out,
        "plugins loaded: {}",
        if loaded.is_empty() {
            "(none)".to_string()
        } else {
            loaded.join(", ")
        }
    );
    let adaptors = r["adaptors"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "\nadaptors ({}):", adaptors.len());
    if adaptors.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for a in &adaptors {
        adaptor_text(a, &mut out);
        if let Some(Value::Object(r)) = a.get("ccl_runtime") {
            let said: Vec<String> = r
                .iter()
                .map(|(entry, v)| match v["reason"].as_str() {
                    Some(why) => format!("{entry} unsupported ({why})"),
                    None => format!("{entry} supported"),
                })
                .collect();
            let _ = writeln!(out, "    ccl at run time: {}", said.join("; "));
        }
        if let Some(m) = a.get("multicast") {
            let _ = writeln!(out, "    multicast: {}", s(&m["status"]));
        }
    }
    let rejected = r["rejected"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "\nrejected ({}):", rejected.len());
    if rejected.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for e in &rejected {
        let _ = writeln!(out, "  {}", s(&e["message"]));
    }
    for sh in r["shadowed"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  (not opened: {}, shadowed by {})",
            s(&sh["path"]),
            s(&sh["by"])
        );
    }
    let clusters = r["clusters"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "\nclusters ({}):", clusters.len());
    for c in &clusters {
        let _ = writeln!(
            out,
            "  {} (ranks {}): device {}, ccl {}, multicast {}, fallback {}",
            s(&c["name"]),
            s(&c["ranks"]),
            s(&c["device"]),
            s(&c["ccl"]),
            s(&c["multicast"]),
            s(&c["fallback"])
        );
        if c["selected"].as_bool() != Some(true) {
            let _ = writeln!(out, "    not selectable: {}", s(&c["error"]));
        } else {
            let w = &c["windows"];
            let _ = writeln!(
                out,
                "    windows: {} ({}); multicast {} ({})",
                s(&w["backing"]),
                s(&w["reason"]),
                if w["multicast"].as_bool() == Some(true) {
                    "allowed"
                } else {
                    "off"
                },
                s(&w["multicast_reason"])
            );
        }
    }
    let plan = &r["plan"];
    if let Some(text) = plan["text"].as_str() {
        let _ = write!(
            out,
            "\nplan across clusters ({} ranks):\n{text}",
            plan["world"]
        );
    } else if let Some(e) = plan["error"].as_str() {
        let _ = writeln!(out, "\nplan across clusters: {e}");
    }
    out
}
