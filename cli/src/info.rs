//! `ferrocx info`.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use ferrocx::registry::Registry;
use serde_json::{json, Value};

use crate::report::{abi_version, adaptor_text, describe, probe};

/// Clusters of `config` with their selection (or the reason there is none), and for each
/// adaptor the clusters that selected it.
pub(crate) fn clusters_json(
    config: &ferrocx::config::Config,
    registry: &Registry,
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
            "options": c.options,
        });
        match registry.select(config, i) {
            Ok(_) => {
                v["selected"] = json!(true);
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
    let registry = Registry::discover(&config.runtime);
    let (clusters, uses) = clusters_json(&config, &registry);
    let adaptors: Vec<Value> = registry
        .entries()
        .iter()
        .map(|e| {
            let mut v = describe(e);
            if let (Value::Object(m), Value::Object(p)) = (&mut v, probe(e)) {
                m.extend(p);
            }
            v["selected_by"] = json!(uses
                .iter()
                .filter(|(name, _)| *name == e.name)
                .map(|(_, who)| who.clone())
                .collect::<Vec<_>>());
            v
        })
        .collect();
    let report = json!({
        "ferrocx": env!("CARGO_PKG_VERSION"),
        "abi": abi_version(),
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
    let _ = writeln!(out, "plugin files: {}", paths(&r["plugins"]));
    let adaptors = r["adaptors"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "\nadaptors ({}):", adaptors.len());
    if adaptors.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for a in &adaptors {
        adaptor_text(a, &mut out);
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
        }
    }
    out
}
