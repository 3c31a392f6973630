//! `ferrocx config check FILE`.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use ferrocx::registry::{Registry, Source};
use serde_json::{json, Value};

use crate::info::{clusters_json, rejected_json};

pub fn run(
    file: &PathBuf,
    as_json: bool,
    world: Option<usize>,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let config = match crate::load_config(Some(file)) {
        Ok(c) => c,
        Err(e) => {
            if as_json {
                let v = json!({
                    "valid": false,
                    "error": {
                        "message": e.to_string(), "line": e.line(), "column": e.column(),
                        "key": e.key(), "kind": format!("{:?}", e.kind()),
                    }
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                eprintln!("{e}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let registry = Registry::discover(&config.runtime);
    let (mut clusters, _) = clusters_json(&config, &registry, &Default::default());
    for c in clusters.iter_mut() {
        let source = |name: &Value, device: bool| -> Value {
            let name = name.as_str().unwrap_or("");
            let e = if device {
                registry.device(name)
            } else {
                registry.ccl(name)
            };
            match e.map(|e| &e.source) {
                Some(Source::Builtin) => json!("built-in"),
                Some(Source::Plugin(p)) => json!(p.display().to_string()),
                None => Value::Null,
            }
        };
        c["device_source"] = source(&c["device"], true);
        c["ccl_source"] = source(&c["ccl"], false);
    }
    let valid = clusters
        .iter()
        .all(|c| c["selected"].as_bool() == Some(true));
    // The plan across clusters of a job of `world` ranks.
    let plan = world.map(|w| ferrocx::hetero::plan::describe(&config, w));
    let valid = valid && !matches!(plan, Some(Err(_)));
    let plan_json = match &plan {
        None | Some(Ok(None)) => Value::Null,
        Some(Ok(Some(text))) => json!(text),
        Some(Err(e)) => json!({ "error": e }),
    };
    let report = json!({
        "plan": plan_json,
        "valid": valid,
        "config": config.origin.to_string(),
        "timeout_ms": config.runtime.timeout_ms,
        "clusters": clusters,
        "rejected": rejected_json(&registry),
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let (text, errors) = render(&report);
        print!("{text}");
        match &plan {
            Some(Ok(Some(p))) => {
                print!("plan across clusters ({} ranks):\n{p}", world.unwrap_or(0))
            }
            Some(Ok(None)) => println!("one cluster for {} ranks: no bridge", world.unwrap_or(0)),
            Some(Err(e)) => eprintln!("{e}"),
            None => {}
        }
        eprint!("{errors}");
    }
    Ok(if valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn render(r: &Value) -> (String, String) {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let mut out = String::new();
    let mut err = String::new();
    let verdict = if r["valid"].as_bool() == Some(true) {
        "valid"
    } else {
        "INVALID"
    };
    let _ = writeln!(
        out,
        "{}: {verdict} (timeout {} ms)",
        s(&r["config"]),
        r["timeout_ms"]
    );
    for c in r["clusters"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  cluster {} (ranks {})",
            s(&c["name"]),
            s(&c["ranks"])
        );
        if c["selected"].as_bool() == Some(true) {
            let _ = writeln!(
                out,
                "    device: {} ({})",
                s(&c["device"]),
                s(&c["device_source"])
            );
            let _ = writeln!(
                out,
                "    ccl:    {} ({})",
                s(&c["ccl"]),
                s(&c["ccl_source"])
            );
            let _ = writeln!(
                out,
                "    multicast: {}, fallback: {}",
                s(&c["multicast"]),
                s(&c["fallback"])
            );
            if let Some(opts) = c["options"].as_object().filter(|o| !o.is_empty()) {
                for (adaptor, kv) in opts {
                    let _ = writeln!(out, "    options for {adaptor}: {kv}");
                }
            }
        } else {
            let _ = writeln!(out, "    not selectable (see below)");
            let _ = writeln!(err, "{}", s(&c["error"]));
        }
    }
    for e in r["rejected"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "  note: plugin refused: {}", s(&e["message"]));
    }
    (out, err)
}
