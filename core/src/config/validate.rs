//! The rules a config must follow beyond its schema (values, unique names, disjoint ranks),
//! and the check of adaptor names against those available.

use super::error::{ConfigError, ConfigErrorKind};
use super::{ClusterConfig, Config, LOG_LEVELS};

impl Config {
    /// Checks every rule that does not need the adaptor registry: `timeout_ms > 0`, a known log
    /// level, non-empty plugin paths, and per cluster a non-empty unique name, well-formed
    /// adaptor names, a non-empty rank set disjoint from every earlier cluster's, and options
    /// only for the cluster's own adaptors.
    ///
    /// [`Config::parse`] and [`Config::load`] already call it; call it again after changing a
    /// config in code.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use ConfigErrorKind::InvalidValue;

        let runtime = &self.runtime;
        if runtime.timeout_ms == 0 {
            return Err(self.runtime_error(
                "timeout_ms",
                InvalidValue,
                "must be greater than 0 (milliseconds to wait for a peer)",
            ));
        }
        if let Some(log) = &runtime.log {
            if !LOG_LEVELS.contains(&log.as_str()) {
                return Err(self.runtime_error(
                    "log",
                    InvalidValue,
                    format!(
                        "unknown log level \"{log}\": expected one of {}",
                        LOG_LEVELS.join(", ")
                    ),
                ));
            }
        }
        for (key, paths) in [
            ("plugin_dirs", &runtime.plugin_dirs),
            ("plugins", &runtime.plugins),
        ] {
            if let Some(i) = paths.iter().position(|p| p.as_os_str().is_empty()) {
                return Err(self.runtime_error(&format!("{key}[{i}]"), InvalidValue, "empty path"));
            }
            for (i, p) in paths.iter().enumerate() {
                if let Some(why) = control_problem(&p.to_string_lossy()) {
                    return Err(self.runtime_error(
                        &format!("{key}[{i}]"),
                        InvalidValue,
                        format!("path {why}"),
                    ));
                }
            }
        }

        if let Some(why) = self.bridge.chunk_problem() {
            return Err(self.bridge_error("chunk_bytes", InvalidValue, why));
        }
        if let Some(why) = self.bridge.depth_problem() {
            return Err(self.bridge_error("depth", InvalidValue, why));
        }
        for (index, cluster) in self.clusters.iter().enumerate() {
            self.check_cluster(index, cluster)?;
        }
        Ok(())
    }

    /// The rules for cluster `index`, including those against the clusters before it.
    fn check_cluster(&self, index: usize, cluster: &ClusterConfig) -> Result<(), ConfigError> {
        use ConfigErrorKind::InvalidValue;

        let name = cluster.name.as_str();
        if name.trim().is_empty() {
            return Err(self.cluster_error(
                index,
                "name",
                InvalidValue,
                "cluster name must not be empty",
            ));
        }
        if let Some(why) = control_problem(name) {
            return Err(self.cluster_error(
                index,
                "name",
                InvalidValue,
                format!("cluster name {why}"),
            ));
        }
        for (adaptor, options) in &cluster.options {
            for (key, value) in options {
                // Passed to the adaptor as C strings: a NUL would cut them short.
                let problem = control_problem(key)
                    .map(|why| format!("option name {why}"))
                    .or_else(|| control_problem(value).map(|why| format!("option value {why}")));
                if let Some(why) = problem {
                    return Err(self.cluster_error(
                        index,
                        &format!("options.{adaptor}"),
                        InvalidValue,
                        why,
                    ));
                }
            }
        }
        for (key, adaptor) in [("device", &cluster.device), ("ccl", &cluster.ccl)] {
            if let Some(why) = adaptor_name_problem(adaptor) {
                return Err(self.cluster_error(
                    index,
                    key,
                    InvalidValue,
                    format!("adaptor name \"{adaptor}\" {why}"),
                ));
            }
        }
        if cluster.ranks.is_empty() {
            return Err(self.cluster_error(
                index,
                "ranks",
                InvalidValue,
                format!("cluster `{name}` has no ranks"),
            ));
        }
        if let (Some(one), Some(two)) = (cluster.window_one_shot_max, cluster.window_two_shot_max) {
            if one > two {
                return Err(self.cluster_error(
                    index,
                    "window_one_shot_max",
                    InvalidValue,
                    format!(
                        "{one} bytes is above window_two_shot_max ({two} bytes): one-shot runs \
                         below two-shot, which runs below the crossover"
                    ),
                ));
            }
        }
        for adaptor in cluster.options.keys() {
            if adaptor != &cluster.device && adaptor != &cluster.ccl {
                return Err(self.cluster_error(
                    index,
                    &format!("options.{adaptor}"),
                    InvalidValue,
                    format!(
                        "options for adaptor `{adaptor}`, which cluster `{name}` does not use \
                         (its device is `{}` and its ccl `{}`)",
                        cluster.device, cluster.ccl
                    ),
                ));
            }
        }

        for (earlier_index, earlier) in self.clusters[..index].iter().enumerate() {
            let at = |key: &str| match earlier.line_of(key) {
                Some(line) => format!("cluster[{earlier_index}], line {line}"),
                None => format!("cluster[{earlier_index}]"),
            };
            if earlier.name == cluster.name {
                return Err(self.cluster_error(
                    index,
                    "name",
                    InvalidValue,
                    format!(
                        "duplicate cluster name `{name}`: already used by {}",
                        at("name")
                    ),
                ));
            }
            let shared = earlier.ranks.intersection(&cluster.ranks);
            if !shared.is_empty() {
                return Err(self.cluster_error(
                    index,
                    "ranks",
                    ConfigErrorKind::RankOverlap,
                    format!(
                        "ranks {shared} of cluster `{name}` also belong to cluster `{}` ({}): \
                         a rank is in exactly one cluster",
                        earlier.name,
                        at("ranks")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that every cluster's device and CCL adaptor exist, as told by `is_device` and
    /// `is_ccl` (e.g. backed by the registry). The error names the file, line and key
    /// (`cluster[1].ccl`).
    pub fn check_adaptors(
        &self,
        is_device: impl Fn(&str) -> bool,
        is_ccl: impl Fn(&str) -> bool,
    ) -> Result<(), ConfigError> {
        self.find_unknown_adaptor(is_device, is_ccl, |_| String::new())
    }

    /// Like [`Config::check_adaptors`], from the lists of available adaptor names; the error
    /// lists the available ones of the kind that was wrong.
    pub fn check_adaptors_known<D: AsRef<str>, C: AsRef<str>>(
        &self,
        devices: &[D],
        ccls: &[C],
    ) -> Result<(), ConfigError> {
        let list = |names: Vec<&str>| match names.is_empty() {
            true => {
                "; none is available (check runtime.plugin_dirs and FERROCX_PLUGIN_PATH)".to_owned()
            }
            false => format!("; available: {}", names.join(", ")),
        };
        self.find_unknown_adaptor(
            |name| devices.iter().any(|d| d.as_ref() == name),
            |name| ccls.iter().any(|c| c.as_ref() == name),
            |key| match key {
                "device" => list(devices.iter().map(AsRef::as_ref).collect()),
                _ => list(ccls.iter().map(AsRef::as_ref).collect()),
            },
        )
    }

    fn find_unknown_adaptor(
        &self,
        is_device: impl Fn(&str) -> bool,
        is_ccl: impl Fn(&str) -> bool,
        known: impl Fn(&str) -> String,
    ) -> Result<(), ConfigError> {
        for (index, cluster) in self.clusters.iter().enumerate() {
            let checks = [
                (
                    "device",
                    &cluster.device,
                    is_device(&cluster.device),
                    "device",
                ),
                ("ccl", &cluster.ccl, is_ccl(&cluster.ccl), "CCL"),
            ];
            for (key, name, exists, what) in checks {
                if !exists {
                    return Err(self.cluster_error(
                        index,
                        key,
                        ConfigErrorKind::UnknownAdaptor,
                        format!(
                            "unknown {what} adaptor \"{name}\" in cluster `{}`{}",
                            cluster.name,
                            known(key)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Why `text` (a name, a path, an option) is refused: a control character (NUL, escape, line
/// break, ...) would be cut at by C or rewrite the terminal when printed.
fn control_problem(text: &str) -> Option<String> {
    let (at, c) = text.chars().enumerate().find(|(_, c)| c.is_control())?;
    Some(format!(
        "must not contain control characters (U+{:04X} at character {})",
        c as u32,
        at + 1
    ))
}

/// Why `name` cannot name an adaptor (it becomes part of `libferrocx_adaptor_<name>.so`).
fn adaptor_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        Some("may contain only ASCII letters, digits, '_' and '-'")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::RankSet;

    const TWO: &str = r#"
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

    fn two() -> Config {
        match Config::parse(TWO, Path::new("two.toml")) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn control_characters_in_names_options_and_paths_are_refused() {
        let text = TWO.replace("name = \"cpu\"", "name = \"c\\u0000pu\"");
        let e = Config::parse(&text, Path::new("nul.toml")).unwrap_err();
        assert_eq!(
            (e.kind(), e.line(), e.key()),
            (
                ConfigErrorKind::InvalidValue,
                Some(9),
                Some("cluster[1].name")
            )
        );
        assert_eq!(
            e.message(),
            "cluster name must not contain control characters (U+0000 at character 2)"
        );
        let text = TWO.replace("name = \"gpu\"", "name = \"g\\u001b[2Jpu\"");
        let e = Config::parse(&text, Path::new("esc.toml")).unwrap_err();
        assert!(e.message().contains("U+001B at character 2"), "{e}");
        let text = format!("{TWO}\n[cluster.options.host]\nkey = \"a\\u0000b\"\n");
        let e = Config::parse(&text, Path::new("opt.toml")).unwrap_err();
        assert!(
            e.message().starts_with("option value must not contain"),
            "{e}"
        );
        let mut c = two();
        c.runtime.plugin_dirs = vec!["/a\nb".into()];
        let e = c.validate().unwrap_err();
        assert_eq!(e.key(), Some("runtime.plugin_dirs[0]"));
        assert!(e.message().contains("U+000A"), "{e}");
    }

    #[test]
    fn validate_catches_changes_made_in_code() {
        let mut c = two();
        c.clusters[1].ranks = RankSet::from_ranges([3..=5]);
        let e = c.validate().err();
        assert_eq!(
            e.as_ref().map(|e| (e.kind(), e.line(), e.key())),
            Some((
                ConfigErrorKind::RankOverlap,
                Some(10),
                Some("cluster[1].ranks")
            ))
        );
        let message = e.map(|e| e.message().to_owned()).unwrap_or_default();
        assert!(
            message.contains("ranks 3 of cluster `cpu`") && message.contains("`gpu`"),
            "{message}"
        );

        let mut c = two();
        c.runtime.timeout_ms = 0;
        assert_eq!(
            c.validate().err().map(|e| e.kind()),
            Some(ConfigErrorKind::InvalidValue)
        );

        let mut c = two();
        c.clusters[0].device = "cu da".into();
        assert_eq!(c.validate().err().and_then(|e| e.line()), Some(5));
    }

    #[test]
    fn check_adaptors_names_the_key_and_lists_the_known() {
        let c = two();
        assert_eq!(c.check_adaptors(|_| true, |_| true), Ok(()));
        let e = c.check_adaptors(|d| d != "host", |_| true).err();
        assert_eq!(
            e.as_ref().map(|e| (e.line(), e.key())),
            Some((Some(11), Some("cluster[1].device")))
        );

        let e = c.check_adaptors_known(&["cuda", "host"], &["host"]).err();
        assert_eq!(
            e.as_ref().map(|e| (e.kind(), e.line(), e.key())),
            Some((
                ConfigErrorKind::UnknownAdaptor,
                Some(6),
                Some("cluster[0].ccl")
            ))
        );
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.starts_with("two.toml:6:"), "{text}");
        assert!(
            text.contains("unknown CCL adaptor \"nccl\"") && text.ends_with("available: host"),
            "{text}"
        );

        let none: [&str; 0] = [];
        let e = c
            .check_adaptors_known(&none, &none)
            .err()
            .map(|e| e.to_string());
        assert!(e.unwrap_or_default().contains("none is available"));
    }

    #[test]
    fn options_must_belong_to_the_clusters_adaptors() {
        let text = format!("{TWO}\n[cluster.options.ncl]\nlibrary = \"x\"\n");
        let e = Config::parse(&text, Path::new("two.toml")).err();
        assert_eq!(
            e.as_ref().map(|e| (e.line(), e.key())),
            Some((Some(14), Some("cluster[1].options.ncl")))
        );
    }
}
