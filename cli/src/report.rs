//! What `info` and `config check` say about an adaptor, as data (for `--json`) and as text.

use ferrocx::abi::{AbiTable, ABI_MAJOR, ABI_MINOR};
use ferrocx::loader::{Checked, Table};
use ferrocx::registry::{AdaptorEntry, Source};
use serde_json::{json, Value};

/// Calls `init` where present and reads what the adaptor says about itself. Errors are data:
/// an adaptor that cannot start here (no driver, no library) is "unavailable" with the reason.
pub fn probe(entry: &AdaptorEntry) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(dev) = entry.device() {
        let d = &dev.tables().root;
        let started = if d.get().init.is_some() {
            dev.init(&[]).map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        // The capabilities, probed once after init: what every reader (the router, the kit)
        // sees.
        let info = started.and_then(|()| {
            let caps = dev.caps();
            let ordinals = caps.ordinals.as_ref().map_err(Clone::clone)?;
            let props = match ordinals.first() {
                Some(o) => match &o.properties {
                    Some(p) => json!({
                        "vendor": p.vendor, "name": p.name, "arch": p.arch,
                        "total_memory": p.total_memory, "capabilities": p.capabilities.names(),
                        "kernel_formats": o.image_formats.iter().map(|f| f.to_string())
                            .collect::<Vec<_>>(),
                    }),
                    None => Value::Null,
                },
                None => Value::Null,
            };
            Ok(json!({ "device_count": ordinals.len(), "device0": props }))
        });
        out.insert(
            "device_probe".into(),
            match info {
                Ok(v) => json!({ "available": true, "info": v }),
                Err(e) => json!({ "available": false, "reason": e }),
            },
        );
    }
    if let Some(ccl) = entry.ccl() {
        let c = &ccl.tables().root;
        let started = if c.get().init.is_some() {
            ccl.init().map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        let version = started.and_then(|()| match ccl.caps().version {
            Some(v) => Ok(json!(v)),
            None if c.get().get_version.is_some() => {
                ccl.version().map(|v| json!(v)).map_err(|e| e.to_string())
            }
            None => Ok(Value::Null),
        });
        out.insert(
            "ccl_probe".into(),
            match version {
                Ok(v) => json!({ "available": true, "version": v }),
                Err(e) => json!({ "available": false, "reason": e }),
            },
        );
    }
    Value::Object(out)
}

fn table_json<T: AbiTable>(t: &Table<T>) -> Value {
    let (major, minor) = t.version();
    json!({
        "symbol": T::SYMBOL,
        "abi": format!("{major}.{minor}"),
        "struct_size": t.declared_size(),
        "entries_present": t.present().len(),
        "entries_total": T::entries().len(),
        "present": t.present(),
        "absent": t.absent(),
        "beyond_struct_size": t.beyond_size(),
    })
}

/// Everything known about one adaptor, without calling it.
pub fn describe(entry: &AdaptorEntry) -> Value {
    let (major, minor) = entry.abi_version();
    let mut tables = Vec::new();
    if let Some(d) = &entry.device {
        tables.push(table_json(&d.root));
        tables.extend(d.vmm.as_ref().map(table_json));
        tables.extend(d.flatmap.as_ref().map(table_json));
        tables.extend(d.multicast.as_ref().map(table_json));
        tables.extend(d.graph.as_ref().map(table_json));
        tables.extend(d.kernel.as_ref().map(table_json));
        tables.extend(d.memops.as_ref().map(table_json));
    }
    if let Some(c) = &entry.ccl {
        tables.push(table_json(&c.root));
        tables.extend(c.window.as_ref().map(table_json));
    }
    json!({
        "name": entry.name,
        "source": match &entry.source {
            Source::Builtin => "built-in".to_string(),
            Source::Plugin(p) => p.display().to_string(),
        },
        "abi": format!("{major}.{minor}"),
        "checked": match entry.checked {
            Checked::AbiStable => "abi_stable layout check + headers",
            Checked::HeaderOnly => "headers (C/C++ plugin)",
            Checked::Builtin => "built-in",
        },
        "kinds": {
            "device": entry.device.is_some(),
            "ccl": entry.ccl.is_some(),
        },
        "groups": entry.groups(),
        "tables": tables,
        "ccl_limits": entry.ccl().map(|c| limits_json(&c)),
        "notes": entry.notes,
    })
}

/// A CCL's declared limits (ABI 1.3's `get_limits`, callable before `init`): `null` when it
/// declares none, else the maximum ranks (0: any) and the data types and reductions claimed.
fn limits_json(ccl: &ferrocx::adaptor::Ccl) -> Value {
    use ferrocx::abi::{DataType, ReduceOp};
    match ccl.limits() {
        Err(e) => json!({ "error": e.to_string() }),
        Ok(l) if l.is_none() => Value::Null,
        Ok(l) => json!({
            "max_ranks": l.max_ranks,
            "dtypes": DataType::ALL.iter().filter(|&&d| l.allows_dtype(d))
                .filter_map(|d| d.name()).collect::<Vec<_>>(),
            "reduce_ops": ReduceOp::ALL.iter().filter(|&&o| l.allows_op(o))
                .filter_map(|o| o.name()).collect::<Vec<_>>(),
        }),
    }
}

/// The loader's own ABI version, for headers of reports.
pub fn abi_version() -> String {
    format!("{ABI_MAJOR}.{ABI_MINOR}")
}

/// Renders a described-and-probed adaptor as indented text lines.
pub fn adaptor_text(a: &Value, out: &mut String) {
    use std::fmt::Write;
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let _ = writeln!(out, "  {}  [{}]", s(&a["name"]), s(&a["source"]));
    let _ = writeln!(
        out,
        "    ABI {}, checked by {}",
        s(&a["abi"]),
        s(&a["checked"])
    );
    let groups: Vec<String> = a["groups"]
        .as_array()
        .map(|g| g.iter().map(s).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "    tables: {}", groups.join(", "));
    let l = &a["ccl_limits"];
    if l.is_object() {
        let list = |v: &Value| -> String {
            v.as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let line = match l.get("error") {
            Some(e) => format!("get_limits failed: {}", s(e)),
            None => format!(
                "at most {} rank(s); data types {}; reductions {}",
                match l["max_ranks"].as_u64() {
                    Some(0) | None => "any number of".to_string(),
                    Some(n) => n.to_string(),
                },
                list(&l["dtypes"]),
                list(&l["reduce_ops"])
            ),
        };
        let _ = writeln!(out, "    ccl limits: {line}");
    }
    for t in a["tables"].as_array().into_iter().flatten() {
        let absent: Vec<String> = t["absent"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        let present = t["entries_present"].as_u64().unwrap_or(0) as usize;
        let beyond: Vec<String> = t["beyond_struct_size"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        let mut line = format!(
            "      {} {}/{} entries",
            s(&t["symbol"]),
            t["entries_present"],
            t["entries_total"]
        );
        if !absent.is_empty() && absent.len() <= present {
            line += &format!("; absent: {}", absent.join(", "));
        } else if !absent.is_empty() {
            line += &format!(
                "; present: {}",
                t["present"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(s)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if !beyond.is_empty() {
            line += &format!(
                "; past struct_size {} (older minor): {}",
                t["struct_size"],
                beyond.join(", ")
            );
        }
        let _ = writeln!(out, "{line}");
    }
    if let Some(p) = a.get("device_probe") {
        if p["available"].as_bool() == Some(true) {
            let i = &p["info"];
            let d0 = &i["device0"];
            let caps: Vec<String> = d0["capabilities"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            let _ = writeln!(
                out,
                "    device: {} device(s); device 0: {} (capabilities: {})",
                i["device_count"],
                device_label(&s(&d0["vendor"]), &s(&d0["name"])),
                if caps.is_empty() {
                    "none".to_string()
                } else {
                    caps.join(", ")
                }
            );
            let formats: Vec<String> = d0["kernel_formats"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            if !formats.is_empty() {
                let _ = writeln!(
                    out,
                    "    kernels: device 0 loads {} images",
                    formats.join(", ")
                );
            }
        } else {
            let _ = writeln!(out, "    device: unavailable: {}", s(&p["reason"]));
        }
    }
    if let Some(p) = a.get("ccl_probe") {
        if p["available"].as_bool() == Some(true) {
            let _ = writeln!(out, "    ccl: version {}", p["version"]);
        } else {
            let _ = writeln!(out, "    ccl: unavailable: {}", s(&p["reason"]));
        }
    }
    for n in a["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "    note: {}", s(n));
    }
    if let Some(sel) = a.get("selected_by").and_then(|v| v.as_array()) {
        if sel.is_empty() {
            let _ = writeln!(out, "    selected: no cluster uses it");
        } else {
            let who: Vec<String> = sel.iter().map(s).collect();
            let _ = writeln!(out, "    selected: {}", who.join(", "));
        }
    }
}

/// "vendor name", without repeating a vendor the name already starts with ("NVIDIA H200").
fn device_label(vendor: &str, name: &str) -> String {
    if vendor.is_empty() || name.starts_with(vendor) {
        name.to_string()
    } else {
        format!("{vendor} {name}")
    }
}
