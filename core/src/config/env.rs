//! Environment overrides of a config, read through a lookup function so that tests never touch
//! the process environment.

use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::{Config, MulticastMode, LOG_LEVELS};

/// Path of the config file to load instead of the built-in defaults.
pub const ENV_CONFIG: &str = "FERROCX_CONFIG";
/// Colon-separated plugin directories (put before `runtime.plugin_dirs`) and `.so` files (put
/// before `runtime.plugins`).
pub const ENV_PLUGIN_PATH: &str = "FERROCX_PLUGIN_PATH";
/// Overrides `runtime.timeout_ms`.
pub const ENV_TIMEOUT_MS: &str = "FERROCX_TIMEOUT_MS";
/// Overrides `runtime.log`.
pub const ENV_LOG: &str = "FERROCX_LOG";
/// `0` turns multicast off for every cluster, whatever the config says.
pub const ENV_MULTICAST: &str = "FERROCX_MULTICAST";
/// NCCL's own NVLS switch; `0` turns ferrocx's multicast off as well.
pub const ENV_NCCL_NVLS_ENABLE: &str = "NCCL_NVLS_ENABLE";

impl Config {
    /// Applies the environment, read through `lookup` (e.g. `|v| std::env::var(v).ok()`):
    ///
    /// - `FERROCX_PLUGIN_PATH`: colon-separated; entries ending in `.so` go before
    ///   `runtime.plugins`, the others before `runtime.plugin_dirs` (a warning if one is not a
    ///   directory);
    /// - `FERROCX_TIMEOUT_MS`: a positive integer;
    /// - `FERROCX_LOG`: one of [`LOG_LEVELS`];
    /// - `FERROCX_MULTICAST=0` or `NCCL_NVLS_ENABLE=0`: every cluster's multicast becomes
    ///   [`Off`](MulticastMode::Off), with a warning for each cluster that said `on`
    ///   (`FERROCX_MULTICAST=1` is accepted and changes nothing: it is a kill-switch only).
    ///
    /// Empty values count as unset. Returns the warnings for the caller to log; on an error
    /// (which names the variable) the config is left unchanged.
    pub fn apply_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<String>, ConfigError> {
        let get = |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut warnings = Vec::new();

        // Read and check everything first, so that an error leaves the config as it was.
        let plugin_path = get(ENV_PLUGIN_PATH).map(|v| split_plugin_path(&v, &mut warnings));
        let timeout_ms = get(ENV_TIMEOUT_MS)
            .map(|v| match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(ms),
                _ => Err(ConfigError::env(
                    ENV_TIMEOUT_MS,
                    format!("expected a positive integer (milliseconds), got \"{v}\""),
                )),
            })
            .transpose()?;
        let log = get(ENV_LOG)
            .map(|v| {
                let level = v.to_ascii_lowercase();
                match LOG_LEVELS.contains(&level.as_str()) {
                    true => Ok(level),
                    false => Err(ConfigError::env(
                        ENV_LOG,
                        format!("expected one of {}, got \"{v}\"", LOG_LEVELS.join(", ")),
                    )),
                }
            })
            .transpose()?;
        let kill_switches = multicast_kill_switches(&lookup)?;

        let runtime = &mut self.runtime;
        if let Some((dirs, plugins)) = plugin_path {
            tracing::debug!(?dirs, ?plugins, "plugin paths from {ENV_PLUGIN_PATH}");
            runtime.env_plugin_dirs += dirs.len();
            runtime.plugin_dirs.splice(0..0, dirs);
            runtime.plugins.splice(0..0, plugins);
            // Indices into the lists moved; their file positions no longer apply.
            runtime.positions.retain(|key| !key.starts_with("plugin"));
        }
        if let Some(ms) = timeout_ms {
            tracing::debug!(timeout_ms = ms, "timeout from {ENV_TIMEOUT_MS}");
            runtime.timeout_ms = ms;
            runtime.positions.forget("timeout_ms");
        }
        if let Some(level) = log {
            runtime.log = Some(level);
            runtime.positions.forget("log");
        }
        if !kill_switches.is_empty() {
            let switches = kill_switches.join(" and ");
            tracing::debug!(%switches, "multicast turned off for every cluster");
            for cluster in &mut self.clusters {
                if cluster.multicast == MulticastMode::On {
                    warnings.push(format!(
                        "cluster `{}` asks for multicast = \"on\", but {switches} in the environment turns it off",
                        cluster.name
                    ));
                }
                cluster.multicast = MulticastMode::Off;
                cluster.positions.forget("multicast");
            }
        }
        Ok(warnings)
    }

    /// The config a program should run with: the file named by `FERROCX_CONFIG` if set, else
    /// [`Config::default_local`], then [`Config::apply_env`]. Returns it with the warnings.
    pub fn from_env(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        let path = lookup(ENV_CONFIG).filter(|p| !p.trim().is_empty());
        let mut config = match path {
            Some(path) => Config::load(Path::new(&path))?,
            None => Config::default_local(),
        };
        let warnings = config.apply_env(&lookup)?;
        Ok((config, warnings))
    }

    /// [`Config::from_env`] over the process environment.
    pub fn from_process_env() -> Result<(Config, Vec<String>), ConfigError> {
        Self::from_env(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }
}

/// The multicast kill-switches set in the environment, read through `lookup`, as `VAR=value`
/// in the order they are reported: `NCCL_NVLS_ENABLE=0`, then `FERROCX_MULTICAST=0` (or `off`,
/// `false`, `no`). Empty when neither is set (an empty value counts as unset).
///
/// [`Config::apply_env`] turns every cluster's multicast off when one is set; an adaptor that can
/// create multicast objects checks this at call time, before any driver call, and refuses while
/// the list is not empty.
///
/// # Errors
///
/// `FERROCX_MULTICAST` set to a value that is neither a switch (`0`, `off`, `false`, `no`) nor
/// "as configured" (`1`, `on`, `true`, `yes`, `auto`). A caller about to create a multicast
/// object treats that as off.
pub fn multicast_kill_switches(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ConfigError> {
    let get = |var: &str| {
        lookup(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let mut switches = Vec::new();
    // NCCL owns this variable and its other values: only its "off" matters here.
    if get(ENV_NCCL_NVLS_ENABLE).as_deref() == Some("0") {
        switches.push(format!("{ENV_NCCL_NVLS_ENABLE}=0"));
    }
    if let Some(v) = get(ENV_MULTICAST) {
        match v.to_ascii_lowercase().as_str() {
            "0" | "off" | "false" | "no" => switches.push(format!("{ENV_MULTICAST}={v}")),
            "1" | "on" | "true" | "yes" | "auto" => {}
            _ => {
                return Err(ConfigError::env(
                    ENV_MULTICAST,
                    format!("expected 0 (multicast off) or 1 (as configured), got \"{v}\""),
                ))
            }
        }
    }
    Ok(switches)
}

/// Splits `FERROCX_PLUGIN_PATH` into (directories, plugin files), in order.
fn split_plugin_path(value: &str, warnings: &mut Vec<String>) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut dirs, mut plugins) = (Vec::new(), Vec::new());
    for entry in value.split(':').map(str::trim).filter(|e| !e.is_empty()) {
        let path = PathBuf::from(entry);
        if entry.ends_with(".so") {
            if !path.is_file() {
                warnings.push(format!(
                    "{ENV_PLUGIN_PATH}: plugin \"{entry}\" does not exist"
                ));
            }
            plugins.push(path);
        } else {
            if !path.is_dir() {
                warnings.push(format!(
                    "{ENV_PLUGIN_PATH}: \"{entry}\" is not a directory (nor a .so file)"
                ));
            }
            dirs.push(path);
        }
    }
    (dirs, plugins)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::{ConfigErrorKind, ConfigOrigin};

    /// A lookup over a fixed set of variables.
    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |var| map.get(var).cloned()
    }

    fn two_clusters() -> Config {
        let text = "[runtime]\nplugin_dirs = [\"/file/dir\"]\ntimeout_ms = 100\n\n[[cluster]]\nname = \"gpu\"\nranks = \"0-3\"\ndevice = \"cuda\"\nccl = \"nccl\"\nmulticast = \"on\"\n\n[[cluster]]\nname = \"cpu\"\nranks = \"4-7\"\ndevice = \"host\"\nccl = \"host\"\n";
        match Config::parse(text, Path::new("/cfg/two.toml")) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn no_variables_change_nothing() -> Result<(), ConfigError> {
        let mut c = two_clusters();
        let before = c.clone();
        assert!(c.apply_env(vars(&[]))?.is_empty());
        assert_eq!(c, before);
        Ok(())
    }

    #[test]
    fn plugin_path_splits_into_dirs_and_files() -> Result<(), ConfigError> {
        let dir = tempfile::tempdir().map_err(|e| ConfigError::env("tmp", e.to_string()))?;
        let so = dir.path().join("libferrocx_adaptor_x.so");
        std::fs::write(&so, b"").map_err(|e| ConfigError::env("tmp", e.to_string()))?;
        let value = format!("{}::{}:/no/such/dir", dir.path().display(), so.display());
        let mut c = two_clusters();
        let warnings = c.apply_env(vars(&[(ENV_PLUGIN_PATH, &value)]))?;
        assert_eq!(
            c.runtime.plugin_dirs,
            [
                dir.path().to_path_buf(),
                PathBuf::from("/no/such/dir"),
                PathBuf::from("/file/dir")
            ]
        );
        assert_eq!(c.runtime.plugins, [so]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("/no/such/dir"));
        Ok(())
    }

    #[test]
    fn timeout_and_log_override_the_file() -> Result<(), ConfigError> {
        let mut c = two_clusters();
        c.apply_env(vars(&[(ENV_TIMEOUT_MS, " 2500 "), (ENV_LOG, "DEBUG")]))?;
        assert_eq!(c.runtime.timeout_ms, 2500);
        assert_eq!(c.runtime.log.as_deref(), Some("debug"));
        // The value no longer comes from line 3 of the file.
        assert_eq!(c.runtime.line_of("timeout_ms"), None);
        Ok(())
    }

    #[test]
    fn bad_values_name_the_variable_and_change_nothing() {
        for (var, value) in [
            (ENV_TIMEOUT_MS, "abc"),
            (ENV_TIMEOUT_MS, "0"),
            (ENV_TIMEOUT_MS, "-5"),
            (ENV_LOG, "loud"),
            (ENV_MULTICAST, "maybe"),
        ] {
            let mut c = two_clusters();
            let before = c.clone();
            let e = c
                .apply_env(vars(&[(var, value), (ENV_PLUGIN_PATH, "/x")]))
                .err();
            assert_eq!(
                e.as_ref().and_then(|e| e.env_var()),
                Some(var),
                "{var}={value}"
            );
            assert_eq!(
                e.as_ref().map(|e| e.kind()),
                Some(ConfigErrorKind::InvalidValue)
            );
            assert!(e
                .map(|e| e.to_string())
                .unwrap_or_default()
                .starts_with(&format!("environment variable {var}: ")));
            assert_eq!(c, before, "{var}={value} must leave the config unchanged");
        }
        let e = two_clusters()
            .apply_env(vars(&[(ENV_TIMEOUT_MS, "abc")]))
            .err();
        assert_eq!(
            e.map(|e| e.to_string()).unwrap_or_default(),
            "environment variable FERROCX_TIMEOUT_MS: expected a positive integer (milliseconds), got \"abc\""
        );
    }

    #[test]
    fn multicast_kill_switches_win_over_the_file() -> Result<(), ConfigError> {
        for switch in [(ENV_MULTICAST, "0"), (ENV_NCCL_NVLS_ENABLE, "0")] {
            let mut c = two_clusters();
            let warnings = c.apply_env(vars(&[switch]))?;
            assert!(c.clusters.iter().all(|c| c.multicast == MulticastMode::Off));
            // Only "gpu" said "on"; "cpu" was "auto" and is turned off silently.
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert!(
                warnings[0].contains("`gpu`") && warnings[0].contains(switch.0),
                "{}",
                warnings[0]
            );
        }
        Ok(())
    }

    #[test]
    fn kill_switches_are_listed_nccl_first() -> Result<(), ConfigError> {
        assert!(multicast_kill_switches(vars(&[]))?.is_empty());
        assert!(multicast_kill_switches(vars(&[(ENV_NCCL_NVLS_ENABLE, "1")]))?.is_empty());
        assert_eq!(
            multicast_kill_switches(vars(&[
                (ENV_MULTICAST, " off "),
                (ENV_NCCL_NVLS_ENABLE, "0")
            ]))?,
            ["NCCL_NVLS_ENABLE=0", "FERROCX_MULTICAST=off"]
        );
        let e = multicast_kill_switches(vars(&[(ENV_MULTICAST, "maybe")])).err();
        assert_eq!(e.as_ref().and_then(|e| e.env_var()), Some(ENV_MULTICAST));
        Ok(())
    }

    #[test]
    fn switches_that_are_not_off_leave_multicast_alone() -> Result<(), ConfigError> {
        let mut c = two_clusters();
        let warnings = c.apply_env(vars(&[(ENV_MULTICAST, "1"), (ENV_NCCL_NVLS_ENABLE, "1")]))?;
        assert!(warnings.is_empty());
        assert_eq!(c.clusters[0].multicast, MulticastMode::On);
        assert_eq!(c.clusters[1].multicast, MulticastMode::Auto);
        Ok(())
    }

    #[test]
    fn from_env_loads_the_named_file_or_the_defaults() -> Result<(), ConfigError> {
        let (c, warnings) = Config::from_env(vars(&[(ENV_MULTICAST, "0")]))?;
        assert_eq!(c.origin, ConfigOrigin::Defaults);
        assert!(warnings.is_empty());
        assert_eq!(c.clusters[0].multicast, MulticastMode::Off);

        let dir = tempfile::tempdir().map_err(|e| ConfigError::env("tmp", e.to_string()))?;
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[[cluster]]\nname = \"x\"\ndevice = \"host\"\nccl = \"host\"\n",
        )
        .map_err(|e| ConfigError::env("tmp", e.to_string()))?;
        let path_text = path.display().to_string();
        let (c, _) = Config::from_env(vars(&[(ENV_CONFIG, &path_text), (ENV_TIMEOUT_MS, "7")]))?;
        assert_eq!(c.origin, ConfigOrigin::File(path));
        assert_eq!(
            (c.clusters[0].name.as_str(), c.runtime.timeout_ms),
            ("x", 7)
        );

        let e = Config::from_env(vars(&[(ENV_CONFIG, "/no/such/ferrocx.toml")])).err();
        assert_eq!(e.map(|e| e.kind()), Some(ConfigErrorKind::Io));
        Ok(())
    }
}
