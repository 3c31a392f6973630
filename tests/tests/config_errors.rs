//! Every kind of config error names the file, the line and the key: each test writes a broken
//! config to a temporary file, loads it, and checks exactly where the error points.

use std::path::{Path, PathBuf};

use ferrocx::config::{Config, ConfigError, ConfigErrorKind, Fallback, MulticastMode, RankSet};

/// A config file written to a fresh temporary directory, removed on drop.
struct ConfigFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn write_config(text: &str) -> ConfigFile {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("ferrocx.toml");
    std::fs::write(&path, text).expect("write the config file");
    ConfigFile { _dir: dir, path }
}

/// Loads `text` from a file and returns the error it must produce, after checking its kind,
/// line, key, and that its Display starts with `file:line`.
fn expect_error(text: &str, kind: ConfigErrorKind, line: usize, key: &str) -> ConfigError {
    let file = write_config(text);
    let err = match Config::load(&file.path) {
        Ok(config) => panic!("config should be rejected, got {config:?}\n{text}"),
        Err(err) => err,
    };
    assert_eq!(
        (err.kind(), err.line(), err.key()),
        (kind, Some(line), Some(key)),
        "wrong location in: {err}"
    );
    assert_eq!(err.file(), Some(file.path.as_path()));
    let shown = err.to_string();
    let at = format!("{}:{line}", file.path.display());
    assert!(shown.starts_with(&at), "{shown:?} should start with {at:?}");
    assert!(shown.contains(&format!("key `{key}`")), "{shown}");
    err
}

const TWO_CLUSTERS: &str = r#"[runtime]
timeout_ms = 1000

[[cluster]]
name = "gpu"
ranks = "0-3"
device = "cuda"
ccl = "nccl"

[[cluster]]
name = "cpu"
ranks = "4-7"
device = "host"
ccl = "host"
"#;

// 1. unreadable file
#[test]
fn unreadable_file_says_why() {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let missing = dir.path().join("absent.toml");
    let err = Config::load(&missing).expect_err("a missing file cannot load");
    assert_eq!(
        (err.kind(), err.line(), err.key()),
        (ConfigErrorKind::Io, None, None)
    );
    assert_eq!(err.file(), Some(missing.as_path()));
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}: ", missing.display())),
        "{shown}"
    );
    assert!(shown.contains("No such file or directory"), "{shown}");

    let err = Config::load(dir.path()).expect_err("a directory is not a config file");
    assert_eq!(err.kind(), ConfigErrorKind::Io);
}

// 2. TOML syntax error
#[test]
fn syntax_error_has_line_and_column() {
    let text = "[runtime]\ntimeout_ms = 1000\n\n[[cluster]\nname = \"a\"\n";
    let file = write_config(text);
    let err = Config::load(&file.path).expect_err("unclosed header");
    assert_eq!(
        (err.kind(), err.line(), err.column()),
        (ConfigErrorKind::Syntax, Some(4), Some(11))
    );
    let at = format!("{}:4:11: ", file.path.display());
    assert!(err.to_string().starts_with(&at), "{err}");

    let file = write_config("[[cluster]]\nname = \"a\"\nname = \"b\"\n");
    let err = Config::load(&file.path).expect_err("duplicate key");
    assert_eq!((err.kind(), err.line()), (ConfigErrorKind::Syntax, Some(3)));
}

// 3. unknown key, at every level
#[test]
fn unknown_key_is_named_with_its_path() {
    let err = expect_error(
        "[runtime]\nplugin_dir = [\"x\"]\n",
        ConfigErrorKind::UnknownKey,
        2,
        "runtime.plugin_dir",
    );
    assert!(
        err.message().contains("did you mean `plugin_dirs`?"),
        "{err}"
    );

    let text = TWO_CLUSTERS.replace("device = \"host\"", "devcie = \"host\"");
    expect_error(&text, ConfigErrorKind::UnknownKey, 13, "cluster[1].devcie");

    expect_error(
        "[runtim]\ntimeout_ms = 5\n",
        ConfigErrorKind::UnknownKey,
        1,
        "runtim",
    );
}

// 4. wrong type
#[test]
fn wrong_type_names_the_key() {
    let text = TWO_CLUSTERS.replace("timeout_ms = 1000", "timeout_ms = \"fast\"");
    expect_error(&text, ConfigErrorKind::WrongType, 2, "runtime.timeout_ms");

    let text = TWO_CLUSTERS.replace("ranks = \"4-7\"", "ranks = 3.5");
    expect_error(&text, ConfigErrorKind::WrongType, 12, "cluster[1].ranks");

    let text = TWO_CLUSTERS.replace("timeout_ms = 1000", "plugin_dirs = \"x\"");
    expect_error(&text, ConfigErrorKind::WrongType, 2, "runtime.plugin_dirs");

    let text = format!("{TWO_CLUSTERS}\n[cluster.options.host]\nthreads = [1, 2]\n");
    expect_error(
        &text,
        ConfigErrorKind::WrongType,
        17,
        "cluster[1].options.host.threads",
    );
}

// 5. bad value
#[test]
fn bad_values_are_rejected_at_their_line() {
    let text = TWO_CLUSTERS.replace("ccl = \"host\"", "ccl = \"host\"\nmulticast = \"maybe\"");
    let err = expect_error(
        &text,
        ConfigErrorKind::InvalidValue,
        15,
        "cluster[1].multicast",
    );
    assert!(err.message().contains("`auto`, `off`, `on`"), "{err}");

    let text = TWO_CLUSTERS.replace("ranks = \"4-7\"", "ranks = \"7-4\"");
    let err = expect_error(&text, ConfigErrorKind::InvalidValue, 12, "cluster[1].ranks");
    assert!(err.message().contains("reversed"), "{err}");

    let text = TWO_CLUSTERS.replace("timeout_ms = 1000", "timeout_ms = 0");
    expect_error(
        &text,
        ConfigErrorKind::InvalidValue,
        2,
        "runtime.timeout_ms",
    );

    let text = TWO_CLUSTERS.replace("name = \"cpu\"", "name = \"\"");
    expect_error(&text, ConfigErrorKind::InvalidValue, 11, "cluster[1].name");

    let text = TWO_CLUSTERS.replace("name = \"cpu\"", "name = \"gpu\"");
    let err = expect_error(&text, ConfigErrorKind::InvalidValue, 11, "cluster[1].name");
    assert!(
        err.message().contains("duplicate cluster name `gpu`"),
        "{err}"
    );
    assert!(err.message().contains("line 5"), "{err}");

    let text = TWO_CLUSTERS.replace("timeout_ms = 1000", "log = \"loud\"");
    expect_error(&text, ConfigErrorKind::InvalidValue, 2, "runtime.log");

    let text = TWO_CLUSTERS.replace("ccl = \"nccl\"", "ccl = \"nccl\"\nfallback = \"kernels\"");
    expect_error(
        &text,
        ConfigErrorKind::InvalidValue,
        9,
        "cluster[0].fallback",
    );
}

// 6. overlapping ranks
#[test]
fn overlapping_ranks_name_both_clusters() {
    let text = TWO_CLUSTERS.replace("ranks = \"4-7\"", "ranks = \"2-5,9\"");
    let err = expect_error(&text, ConfigErrorKind::RankOverlap, 12, "cluster[1].ranks");
    let message = err.message();
    assert!(
        message.contains("`cpu`") && message.contains("`gpu`"),
        "{message}"
    );
    assert!(message.contains("ranks 2-3 "), "{message}");
}

// 7. unknown adaptor
#[test]
fn unknown_adaptor_names_the_key_and_the_known_ones() {
    let file = write_config(TWO_CLUSTERS);
    let config = Config::load(&file.path).expect("a valid config");

    let err = config
        .check_adaptors_known(&["cuda", "host"], &["host", "gloo"])
        .expect_err("nccl is not available");
    assert_eq!(
        (err.kind(), err.line(), err.key()),
        (
            ConfigErrorKind::UnknownAdaptor,
            Some(8),
            Some("cluster[0].ccl")
        )
    );
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}:8:", file.path.display())),
        "{shown}"
    );
    assert!(
        shown.contains("\"nccl\"") && shown.contains("available: host, gloo"),
        "{shown}"
    );

    let err = config
        .check_adaptors(|device| device == "cuda", |_| true)
        .expect_err("host is not a known device");
    assert_eq!(
        (err.line(), err.key()),
        (Some(13), Some("cluster[1].device"))
    );
    assert!(config.check_adaptors(|_| true, |_| true).is_ok());
}

// 8. missing required key
#[test]
fn missing_keys_point_at_the_cluster() {
    let text = TWO_CLUSTERS.replace("device = \"host\"\n", "");
    let err = expect_error(&text, ConfigErrorKind::MissingKey, 10, "cluster[1].device");
    assert!(
        err.message().contains("missing required key `device`"),
        "{err}"
    );

    let text = TWO_CLUSTERS.replace("ccl = \"nccl\"\n", "");
    expect_error(&text, ConfigErrorKind::MissingKey, 4, "cluster[0].ccl");

    let text = TWO_CLUSTERS.replace("ranks = \"4-7\"\n", "");
    let err = expect_error(&text, ConfigErrorKind::MissingKey, 10, "cluster[1].ranks");
    assert!(err.message().contains("more than one cluster"), "{err}");

    // With a single cluster, `ranks` may be left out: it takes every rank.
    let file = write_config("[[cluster]]\nname = \"solo\"\ndevice = \"host\"\nccl = \"host\"\n");
    let config = Config::load(&file.path).expect("one cluster needs no ranks");
    assert!(config.clusters[0].ranks.is_all());
}

fn example(name: &str) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(name);
    Config::load(&path).unwrap_or_else(|e| panic!("{name} must load: {e}"))
}

#[test]
fn shipped_configs_load_cleanly() {
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");

    let local = example("local.toml");
    assert_eq!(local.clusters.len(), 1);
    let c = &local.clusters[0];
    assert_eq!(
        (c.name.as_str(), c.device.as_str(), c.ccl.as_str()),
        ("local", "host", "host")
    );
    assert!(c.ranks.is_all());
    assert_eq!(
        (c.fallback, c.multicast),
        (Fallback::SymHeap, MulticastMode::Auto)
    );
    assert_eq!(
        local.runtime.plugin_dirs,
        [
            configs.join("../target/release"),
            configs.join("../target/debug")
        ]
    );
    assert_eq!(local.runtime.timeout_ms, 30_000);

    let nccl = example("nccl.toml");
    assert_eq!(nccl.clusters.len(), 1);
    let c = &nccl.clusters[0];
    assert_eq!(
        (c.device.as_str(), c.ccl.as_str(), c.multicast),
        ("cuda", "nccl", MulticastMode::Off)
    );
    // The library option is shipped commented out.
    assert_eq!(c.options_for("nccl").map(|o| o.len()), Some(0));

    let hetero = example("hetero.toml");
    let summary: Vec<(String, String, &str, &str)> = hetero
        .clusters
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.ranks.to_string(),
                c.device.as_str(),
                c.ccl.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("gpu".to_string(), "0-3".to_string(), "cuda", "nccl"),
            ("cpu".to_string(), "4-7".to_string(), "host", "host"),
        ]
    );
    let owner = |rank| hetero.cluster_for_rank(rank).map(|c| c.name.as_str());
    assert_eq!(
        (owner(3), owner(4), owner(8)),
        (Some("gpu"), Some("cpu"), None)
    );
    assert_eq!(
        hetero.clusters[1].ranks,
        "4-7".parse::<RankSet>().expect("a rank list")
    );
}
