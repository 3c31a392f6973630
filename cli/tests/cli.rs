//! The `ferrocx` binary as a user runs it: plugins found through `FERROCX_PLUGIN_PATH`, the
//! reason for each refused one, and `config check` on good and bad files.

use std::path::Path;
use std::process::{Command, Output};

use ferrocx_tests::{c_plugin, file_name, plugin_dir, rust_plugin};

fn ferrocx(args: &[&str], plugin_path: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrocx"));
    cmd.args(args)
        .env_remove("FERROCX_CONFIG")
        .env_remove("FERROCX_PLUGIN_PATH")
        .env_remove("FERROCX_LOG");
    if let Some(p) = plugin_path {
        cmd.env("FERROCX_PLUGIN_PATH", p);
    }
    cmd.output().expect("run ferrocx")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn info_lists_plugins_from_the_plugin_path_and_why_others_were_refused() {
    let dir = plugin_dir(
        &[rust_plugin(), c_plugin("testc"), c_plugin("newmajor")],
        &[(&file_name("garbage"), b"not ELF")],
    );
    let out = ferrocx(&["info"], Some(dir.path()));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let rust_so = dir.path().join(file_name("testrust"));
    assert!(
        stdout.contains(&format!("testrust  [{}]", rust_so.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("checked by abi_stable layout check"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ferrocx_device_vmm_v1 5/5 entries"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ferrocx_ccl_adaptor_v1 31/32 entries; absent: all_to_allv"),
        "{stdout}"
    );
    // The kernel group (ABI 1.2) and the formats device 0 loads, from the capabilities.
    assert!(
        stdout.contains("ferrocx_device_kernel_v1 5/5 entries"),
        "{stdout}"
    );
    assert!(
        stdout.contains("kernels: device 0 loads vendor(0x1001) images"),
        "{stdout}"
    );
    assert!(
        stdout.contains("device 0: ferrocx-test rust test device"),
        "{stdout}"
    );
    assert!(stdout.contains("ccl: version 12345"), "{stdout}");
    assert!(stdout.contains(&format!(
        "testc  [{}]",
        dir.path().join(file_name("testc")).display()
    )));
    assert!(stdout.contains("rejected (2):"), "{stdout}");
    assert!(
        stdout.contains("libferrocx_adaptor_garbage.so: dlopen failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("libferrocx_adaptor_newmajor.so: symbol `ferrocx_device_adaptor_v1`: plugin built for ABI 2.x, this build reads ABI 1.x"),
        "{stdout}"
    );
    // Refusals are also logged at WARN on stderr.
    assert!(
        text(&out.stderr).contains("plugin refused"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn info_json_is_machine_readable() {
    let dir = plugin_dir(&[c_plugin("testc"), c_plugin("nosymbols")], &[]);
    let out = ferrocx(&["info", "--json"], Some(dir.path()));
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let names: Vec<&str> = v["adaptors"]
        .as_array()
        .expect("adaptors")
        .iter()
        .map(|a| a["name"].as_str().unwrap_or(""))
        .collect();
    // The host backend and the MPI CCL are built in; the plugin follows them.
    assert_eq!(names, ["host", "mpi", "testc"]);
    assert_eq!(v["adaptors"][0]["source"], "built-in");
    assert_eq!(v["adaptors"][1]["source"], "built-in");
    let a = &v["adaptors"][2];
    assert_eq!(a["groups"][1], "ferrocx_device_flatmap_v1");
    assert_eq!(a["device_probe"]["info"]["device_count"], 2);
    assert_eq!(a["ccl_probe"]["version"], 20800);
    assert_eq!(v["rejected"][0]["kind"], "NoSymbols");
    assert!(v["rejected"][0]["path"]
        .as_str()
        .unwrap_or("")
        .ends_with(&file_name("nosymbols")));
}

fn write_config(dir: &Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("cluster.toml");
    std::fs::write(&p, body).expect("write config");
    p
}

#[test]
fn config_check_prints_what_each_cluster_uses() {
    let plugins = plugin_dir(&[rust_plugin(), c_plugin("testc")], &[]);
    let body = format!(
        "[runtime]\nplugin_dirs = [{:?}]\n\n[[cluster]]\nname = \"a\"\nranks = \"0-1\"\ndevice = \"testc\"\nccl = \"testrust\"\n\n[[cluster]]\nname = \"b\"\nranks = \"2-3\"\ndevice = \"testrust\"\nccl = \"testc\"\n",
        plugins.path()
    );
    let cfg = write_config(plugins.path(), &body);
    let out = ferrocx(
        &["config", "check", cfg.to_str().expect("utf-8 path")],
        None,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains(": valid"), "{stdout}");
    assert!(stdout.contains("cluster a (ranks 0-1)"), "{stdout}");
    assert!(stdout.contains(&format!(
        "device: testc ({})",
        plugins.path().join(file_name("testc")).display()
    )));
    assert!(stdout.contains(&format!(
        "ccl:    testrust ({})",
        plugins.path().join(file_name("testrust")).display()
    )));
    assert!(stdout.contains("cluster b (ranks 2-3)"), "{stdout}");
}

#[test]
fn config_check_names_file_line_and_key_of_an_unknown_adaptor() {
    let plugins = plugin_dir(&[c_plugin("testc")], &[]);
    let body = format!(
        "[runtime]\nplugin_dirs = [{:?}]\n\n[[cluster]]\nname = \"a\"\ndevice = \"testc\"\nccl = \"nccl\"\n",
        plugins.path()
    );
    let cfg = write_config(plugins.path(), &body);
    let out = ferrocx(
        &["config", "check", cfg.to_str().expect("utf-8 path")],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("{}:7", cfg.display())), "{stderr}");
    assert!(stderr.contains("cluster[0].ccl"), "{stderr}");
    assert!(stderr.contains("\"nccl\" is not available"), "{stderr}");
    assert!(stderr.contains("available: host, mpi, testc"), "{stderr}");
}

#[test]
fn config_check_reports_a_syntax_error_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "[runtime]\ntimeout_ms = 5\n\n[[cluster]\nname = \"x\"\n",
    );
    let out = ferrocx(
        &["config", "check", cfg.to_str().expect("utf-8 path")],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("{}:4", cfg.display())), "{stderr}");
}

#[test]
fn config_check_json_carries_line_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(
        dir.path(),
        "[[cluster]]\nname = \"x\"\ndevice = \"host\"\nccl = \"host\"\nmulticast = \"maybe\"\n",
    );
    let out = ferrocx(
        &[
            "config",
            "check",
            "--json",
            cfg.to_str().expect("utf-8 path"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["valid"], false);
    assert_eq!(v["error"]["line"], 5);
    assert_eq!(v["error"]["key"], "cluster[0].multicast");
}

#[test]
fn config_check_prints_the_plan_across_clusters_of_the_one_gpu_config() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/hetero-1gpu.toml");
    let out = ferrocx(
        &[
            "config",
            "check",
            cfg.to_str().expect("utf-8 path"),
            "--world",
            "4",
        ],
        None,
    );
    let stdout = text(&out.stdout);
    for line in [
        "cluster gpu: ranks [0]",
        "cluster cpu: ranks [1, 2, 3]",
        "bridge: ccl host, chunk_bytes 4194304, depth 2",
        "all_reduce up to 64 KiB per rank: one step over the bridge",
        "all_reduce of f32 past that: the flat plan",
        "chunks of 1048576 elements (4194304 bytes)",
        "  rank 0 (gpu): share 0..262144 of each chunk",
        "  rank 2 (cpu): share 524288..786432 of each chunk",
    ] {
        assert!(stdout.contains(line), "{line:?} not in:\n{stdout}");
    }
    // The file parses; without a CUDA build its only complaint is the cuda adaptor.
    let stderr = text(&out.stderr);
    if !out.status.success() {
        assert!(
            stderr.contains("cluster[0].device") && stderr.contains("\"cuda\""),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn info_prints_the_plan_across_clusters_when_the_clusters_fix_the_world() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/hetero-1gpu.toml");
    let out = ferrocx(
        &["info", "--config", cfg.to_str().expect("utf-8 path")],
        None,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for line in [
        "plan across clusters (4 ranks):",
        "bridge: ccl host, chunk_bytes 4194304, depth 2",
        "all_reduce of f32 past that: the flat plan",
        "  rank 3 (cpu): share 786432..1048576 of each chunk",
    ] {
        assert!(stdout.contains(line), "{line:?} not in:\n{stdout}");
    }
    let json = ferrocx(
        &[
            "info",
            "--json",
            "--config",
            cfg.to_str().expect("utf-8 path"),
        ],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("valid JSON");
    assert_eq!(v["plan"]["world"], 4);
    assert!(v["plan"]["text"]
        .as_str()
        .is_some_and(|t| t.contains("cluster gpu: ranks [0]")));
}
