//! The TOML schema of a config file and its conversion into a [`Config`]: structure, types and
//! required keys are checked here, with the position of every key kept for later checks.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_path_to_error::Segment;
use toml::Spanned;

use super::error::{ConfigError, ConfigErrorKind, ErrorOrigin};
use super::position::{KeyPositions, LineIndex, Pos};
use super::{
    BridgeCcl, BridgeConfig, ClusterConfig, Config, ConfigOrigin, Fallback, MulticastMode, RankSet,
    RuntimeConfig, SmallMessage, WindowMode,
};

/// The whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    #[serde(default)]
    runtime: RawRuntime,
    #[serde(default)]
    cluster: Vec<Spanned<RawCluster>>,
    #[serde(default)]
    bridge: RawBridge,
}

/// `[bridge]`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBridge {
    ccl: Option<Spanned<BridgeCcl>>,
    chunk_bytes: Option<Spanned<u64>>,
    depth: Option<Spanned<u64>>,
}

/// `[runtime]`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    plugin_dirs: Option<Vec<Spanned<String>>>,
    plugins: Option<Vec<Spanned<String>>>,
    timeout_ms: Option<Spanned<u64>>,
    log: Option<Spanned<String>>,
}

/// One `[[cluster]]`. Required keys are `Option` so that their absence is reported here, at
/// the cluster's header, with the key's full path.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    name: Option<Spanned<String>>,
    ranks: Option<Spanned<RankSet>>,
    device: Option<Spanned<String>>,
    ccl: Option<Spanned<String>>,
    fallback: Option<Spanned<Fallback>>,
    multicast: Option<Spanned<MulticastMode>>,
    window: Option<Spanned<WindowMode>>,
    small_message: Option<Spanned<SmallMessage>>,
    window_one_shot_max: Option<Spanned<u64>>,
    window_two_shot_max: Option<Spanned<u64>>,
    options: Option<BTreeMap<String, Spanned<RawOptions>>>,
}

/// The options of one adaptor (`[cluster.options.<adaptor>]`).
type RawOptions = BTreeMap<String, Spanned<OptionValue>>;

/// An adaptor option: a string, integer, float or boolean, kept as the string handed to the
/// adaptor.
struct OptionValue(String);

impl<'de> Deserialize<'de> for OptionValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OptionVisitor;

        impl Visitor<'_> for OptionVisitor {
            type Value = OptionValue;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, integer, float or boolean")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<OptionValue, E> {
                Ok(OptionValue(v.to_owned()))
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<OptionValue, E> {
                Ok(OptionValue(v.to_string()))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<OptionValue, E> {
                Ok(OptionValue(v.to_string()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<OptionValue, E> {
                Ok(OptionValue(v.to_string()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<OptionValue, E> {
                // Debug keeps the fraction: 1.0 stays "1.0", as written.
                Ok(OptionValue(format!("{v:?}")))
            }
        }

        deserializer.deserialize_any(OptionVisitor)
    }
}

/// Parses `text` into a [`Config`] whose structure, types and required keys are checked; the
/// semantic rules are left to [`Config::validate`].
pub(super) fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    let file = || ErrorOrigin::File(origin.to_path_buf());
    let deserializer =
        toml::Deserializer::parse(text).map_err(|e| syntax_error(&e, text, file()))?;
    let raw: RawDocument = serde_path_to_error::deserialize(deserializer)
        .map_err(|e| schema_error(e, text, file()))?;
    Builder {
        lines: LineIndex::new(text),
        origin: file(),
        base: origin.parent().unwrap_or(Path::new("")),
    }
    .build(raw, origin)
}

/// A TOML syntax error, located; a duplicate key is named, and an error without a place (too
/// deep a nesting of table headers) is put at the most deeply nested line.
fn syntax_error(e: &toml::de::Error, text: &str, origin: ErrorOrigin) -> ConfigError {
    let mut message = e.message().to_owned();
    let mut span = e.span();
    if message == "duplicate key" {
        if let Some(key) = span.clone().and_then(|s| written_key(text, s)) {
            message = format!("duplicate key `{key}`: it is already set in the same table");
        }
    } else if span.is_none() && message.contains("recursion") {
        if let Some(at) = deepest_line(text) {
            message = format!("{message}: tables or keys are nested too deeply");
            span = Some(at..at);
        }
    }
    ConfigError::new(origin, ConfigErrorKind::Syntax, message)
        .at(span.map(|s| Pos::at(text, s.start)))
}

/// The key a duplicate-key span points into, as written: the whole dotted key before the `=` of
/// its line (or inside its `[header]`), else the span's own text (a key of an inline table).
fn written_key(text: &str, span: std::ops::Range<usize>) -> Option<String> {
    let token = text.get(span.clone())?.trim();
    let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[span.start..]
        .find('\n')
        .map_or(text.len(), |i| span.start + i);
    let line = &text[line_start..line_end];
    let at = span.start - line_start;
    let trimmed = line.trim_start();
    let whole = if trimmed.starts_with('[') {
        let inner = trimmed.trim_start_matches('[');
        inner.find(']').map(|end| inner[..end].trim())
    } else {
        line.find('=')
            .filter(|&eq| at < eq)
            .map(|eq| line[..eq].trim())
    };
    let key = whole.filter(|k| !k.is_empty()).unwrap_or(token);
    // A key is shown, not trusted: keep it short and printable.
    let shown: String = key.chars().filter(|c| !c.is_control()).take(120).collect();
    (!shown.is_empty()).then_some(shown)
}

/// Byte offset of the start of the line nested most deeply: brackets and braces open across
/// lines plus the dots of its keys, outside strings and comments (a close estimate: enough to
/// point at the line that broke the parser's nesting limit).
fn deepest_line(text: &str) -> Option<usize> {
    let mut open = 0usize;
    let mut best: Option<(usize, usize)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let mut depth = open;
        let mut quote: Option<char> = None;
        let mut escaped = false;
        for c in line.chars() {
            match quote {
                Some(q) => {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' && q == '"' {
                        escaped = true;
                    } else if c == q {
                        quote = None;
                    }
                }
                None => match c {
                    '"' | '\'' => quote = Some(c),
                    '#' => break,
                    '[' | '{' => {
                        open += 1;
                        depth = depth.max(open);
                    }
                    ']' | '}' => open = open.saturating_sub(1),
                    '.' => depth += 1,
                    _ => {}
                },
            }
        }
        if best.is_none_or(|(d, _)| depth > d) {
            best = Some((depth, offset));
        }
        offset += line.len();
    }
    best.map(|(_, at)| at)
}

/// Converts a serde error into a located [`ConfigError`] with the key's dotted path.
fn schema_error(
    err: serde_path_to_error::Error<toml::de::Error>,
    text: &str,
    origin: ErrorOrigin,
) -> ConfigError {
    let mut key = key_path(err.path());
    let inner = err.into_inner();
    let mut message = inner.message().to_owned();
    let kind = if message.starts_with("unknown field") {
        if let Some(hint) = did_you_mean(&message) {
            message.push_str(&hint);
        }
        ConfigErrorKind::UnknownKey
    } else if message.starts_with("missing field") {
        if let Some(field) = backticked(&message).first() {
            key = Some(join_key(key.as_deref(), field));
        }
        ConfigErrorKind::MissingKey
    } else if message.starts_with("invalid type") || message.starts_with("invalid length") {
        if key.as_deref() == Some("cluster") && message.contains("expected a sequence") {
            message.push_str(
                "; clusters are an array of tables: write `[[cluster]]`, not `[cluster]`",
            );
        }
        ConfigErrorKind::WrongType
    } else {
        ConfigErrorKind::InvalidValue
    };
    let error =
        ConfigError::new(origin, kind, message).at(inner.span().map(|s| Pos::at(text, s.start)));
    match key {
        Some(key) => error.with_key(key),
        None => error,
    }
}

/// The dotted key path of a serde path, without the segments `toml::Spanned` adds.
fn key_path(path: &serde_path_to_error::Path) -> Option<String> {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !key.starts_with("$__serde_spanned_private") {
                    out = join_key(Some(&out), key);
                }
            }
            Segment::Unknown => out = join_key(Some(&out), "?"),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// `parent.key`, quoting `key` the way TOML would if it is not a bare key.
fn join_key(parent: Option<&str>, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    };
    match parent {
        Some(parent) if !parent.is_empty() => format!("{parent}.{key}"),
        _ => key,
    }
}

/// The words between backticks in a serde message (the field, then the expected ones).
fn backticked(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

/// `` (did you mean `device`?)`` when an unknown field is a likely typo of an expected one.
fn did_you_mean(message: &str) -> Option<String> {
    let words = backticked(message);
    let (unknown, expected) = words.split_first()?;
    let (distance, best) = expected
        .iter()
        .map(|candidate| (edit_distance(unknown, candidate), candidate))
        .min()?;
    (distance <= 2 && distance < unknown.len()).then(|| format!(" (did you mean `{best}`?)"))
}

/// Levenshtein distance, with a swap of two neighbours counted as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitution = rows[i - 1][j - 1] + usize::from(a[i - 1] != b[j - 1]);
            let mut best = substitution.min(rows[i - 1][j] + 1).min(rows[i][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// Turns the raw document into a [`Config`], locating every key.
struct Builder<'a> {
    /// The file's line starts: every key's position from one pass over the text.
    lines: LineIndex<'a>,
    origin: ErrorOrigin,
    /// The config file's directory, against which relative plugin paths are resolved.
    base: &'a Path,
}

impl Builder<'_> {
    fn pos<T>(&self, spanned: &Spanned<T>) -> Pos {
        self.lines.at(spanned.span().start)
    }

    fn error(
        &self,
        kind: ConfigErrorKind,
        pos: Option<Pos>,
        key: String,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(self.origin.clone(), kind, message)
            .at(pos)
            .with_key(key)
    }

    fn build(&self, raw: RawDocument, origin: &Path) -> Result<Config, ConfigError> {
        let runtime = self.runtime(raw.runtime)?;
        if raw.cluster.is_empty() {
            return Err(ConfigError::new(
                self.origin.clone(),
                ConfigErrorKind::MissingKey,
                "no `[[cluster]]` table: a config needs at least one cluster (see configs/local.toml)",
            )
            .with_key("cluster"));
        }
        let several = raw.cluster.len() > 1;
        let clusters = raw
            .cluster
            .into_iter()
            .enumerate()
            .map(|(index, cluster)| self.cluster(index, cluster, several))
            .collect::<Result<_, _>>()?;
        Ok(Config {
            origin: ConfigOrigin::File(origin.to_path_buf()),
            runtime,
            clusters,
            bridge: self.bridge(raw.bridge),
        })
    }

    fn bridge(&self, raw: RawBridge) -> BridgeConfig {
        let mut bridge = BridgeConfig::default();
        if let Some(ccl) = raw.ccl {
            bridge.positions.set("ccl", self.pos(&ccl));
            bridge.ccl = ccl.into_inner();
        }
        if let Some(chunk) = raw.chunk_bytes {
            bridge.positions.set("chunk_bytes", self.pos(&chunk));
            bridge.chunk_bytes = chunk.into_inner();
        }
        if let Some(depth) = raw.depth {
            bridge.positions.set("depth", self.pos(&depth));
            bridge.depth = depth.into_inner();
        }
        bridge
    }

    fn runtime(&self, raw: RawRuntime) -> Result<RuntimeConfig, ConfigError> {
        let mut runtime = RuntimeConfig::default();
        runtime.plugin_dirs = self.paths("plugin_dirs", raw.plugin_dirs, &mut runtime.positions)?;
        runtime.plugins = self.paths("plugins", raw.plugins, &mut runtime.positions)?;
        if let Some(timeout) = raw.timeout_ms {
            runtime.positions.set("timeout_ms", self.pos(&timeout));
            runtime.timeout_ms = timeout.into_inner();
        }
        if let Some(log) = raw.log {
            runtime.positions.set("log", self.pos(&log));
            runtime.log = Some(log.into_inner());
        }
        Ok(runtime)
    }

    /// Resolves the paths of `runtime.<key>` against the file's directory.
    fn paths(
        &self,
        key: &str,
        raw: Option<Vec<Spanned<String>>>,
        positions: &mut KeyPositions,
    ) -> Result<Vec<PathBuf>, ConfigError> {
        let mut paths = Vec::new();
        for (i, entry) in raw.into_iter().flatten().enumerate() {
            let pos = self.pos(&entry);
            let entry_key = format!("{key}[{i}]");
            if i == 0 {
                positions.set(key, pos);
            }
            positions.set(entry_key.clone(), pos);
            if entry.get_ref().trim().is_empty() {
                return Err(self.error(
                    ConfigErrorKind::InvalidValue,
                    Some(pos),
                    format!("runtime.{entry_key}"),
                    "empty path",
                ));
            }
            paths.push(resolve(self.base, Path::new(entry.get_ref())));
        }
        Ok(paths)
    }

    fn cluster(
        &self,
        index: usize,
        raw: Spanned<RawCluster>,
        several: bool,
    ) -> Result<ClusterConfig, ConfigError> {
        let header = self.pos(&raw);
        let raw = raw.into_inner();
        let mut positions = KeyPositions::default();
        positions.set_table(header);
        let missing = |key: &str, why: &str| {
            self.error(
                ConfigErrorKind::MissingKey,
                Some(header),
                format!("cluster[{index}].{key}"),
                format!("missing required key `{key}` ({why})"),
            )
        };

        let name = raw
            .name
            .ok_or_else(|| missing("name", "a unique name for this cluster"))?;
        positions.set("name", self.pos(&name));
        let device = raw
            .device
            .ok_or_else(|| missing("device", "the device adaptor, e.g. \"cuda\" or \"host\""))?;
        positions.set("device", self.pos(&device));
        let ccl = raw
            .ccl
            .ok_or_else(|| missing("ccl", "the CCL adaptor, e.g. \"nccl\" or \"host\""))?;
        positions.set("ccl", self.pos(&ccl));
        let ranks = match raw.ranks {
            Some(ranks) => {
                positions.set("ranks", self.pos(&ranks));
                ranks.into_inner()
            }
            None if several => {
                return Err(missing(
                    "ranks",
                    "required when the file has more than one cluster, e.g. \"0-3\"",
                ))
            }
            None => RankSet::all(),
        };

        let mut cluster = ClusterConfig::new(
            name.into_inner(),
            ranks,
            device.into_inner(),
            ccl.into_inner(),
        );
        if let Some(fallback) = raw.fallback {
            positions.set("fallback", self.pos(&fallback));
            cluster.fallback = fallback.into_inner();
        }
        if let Some(multicast) = raw.multicast {
            positions.set("multicast", self.pos(&multicast));
            cluster.multicast = multicast.into_inner();
        }
        if let Some(window) = raw.window {
            positions.set("window", self.pos(&window));
            cluster.window = window.into_inner();
        }
        if let Some(small) = raw.small_message {
            positions.set("small_message", self.pos(&small));
            cluster.small_message = small.into_inner();
        }
        if let Some(max) = raw.window_one_shot_max {
            positions.set("window_one_shot_max", self.pos(&max));
            cluster.window_one_shot_max = Some(max.into_inner());
        }
        if let Some(max) = raw.window_two_shot_max {
            positions.set("window_two_shot_max", self.pos(&max));
            cluster.window_two_shot_max = Some(max.into_inner());
        }
        for (adaptor, table) in raw.options.into_iter().flatten() {
            let table_key = format!("options.{}", join_key(None, &adaptor));
            positions.set(table_key.clone(), self.pos(&table));
            let values = table
                .into_inner()
                .into_iter()
                .map(|(option, value)| {
                    positions.set(
                        format!("{table_key}.{}", join_key(None, &option)),
                        self.pos(&value),
                    );
                    (option, value.into_inner().0)
                })
                .collect();
            cluster.options.insert(adaptor, values);
        }
        cluster.positions = positions;
        Ok(cluster)
    }
}

/// `path` if absolute, else `base/path`, without `.` components.
fn resolve(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let mut out = base.to_path_buf();
    out.extend(
        path.components()
            .filter(|c| !matches!(c, Component::CurDir)),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(text: &str) -> ConfigError {
        match parse(text, Path::new("t.toml")) {
            Ok(_) => panic!("should not parse:\n{text}"),
            Err(e) => e,
        }
    }

    #[test]
    fn positions_of_every_key_come_from_one_pass_over_the_file() {
        // 8000 clusters: rescanning the file per key took seconds and grew with its square.
        let mut text = String::new();
        for i in 0..8000 {
            text.push_str(&format!(
                "[[cluster]]\nname = \"c{i}\"\nranks = \"{i}\"\ndevice = \"host\"\nccl = \"host\"\n\n"
            ));
        }
        super::super::position::SCANNED.with(|s| s.set(0));
        let c = parse(&text, Path::new("big.toml")).expect("parses");
        assert_eq!(c.clusters.len(), 8000);
        assert_eq!(c.clusters[7999].line_of("ccl"), Some(8000 * 6 - 1));
        let scanned = super::super::position::SCANNED.with(|s| s.get());
        // One pass to index the lines, then each key's own line only.
        assert!(
            scanned <= 2 * text.len(),
            "{scanned} bytes examined for a {}-byte file",
            text.len()
        );
    }

    #[test]
    fn a_duplicate_key_is_named() {
        let e = parse_err("[[cluster]]\nname = \"a\"\nname = \"b\"\n");
        assert_eq!(e.line(), Some(3));
        assert!(e.message().starts_with("duplicate key `name`"), "{e}");
        let e = parse_err("[[cluster]]\noptions.nccl.x = 1\noptions.nccl.x = 2\n");
        assert_eq!(e.line(), Some(3));
        assert!(
            e.message().starts_with("duplicate key `options.nccl.x`"),
            "{e}"
        );
        let e = parse_err("[runtime]\ntimeout_ms = 1\n[runtime]\nlog = \"info\"\n");
        assert_eq!(e.line(), Some(3));
        assert!(e.message().starts_with("duplicate key `runtime`"), "{e}");
        let e = parse_err("a = { b = 1, b = 2 }\n");
        assert!(e.message().starts_with("duplicate key `b`"), "{e}");
    }

    #[test]
    fn a_too_deep_table_header_has_a_line() {
        let text = format!(
            "[runtime]\ntimeout_ms = 5\n\n[{}b]\nx = 1\n",
            "a.".repeat(300)
        );
        let e = parse_err(&text);
        assert_eq!(e.kind(), ConfigErrorKind::Syntax);
        assert_eq!(e.line(), Some(4), "{e}");
        assert!(e.message().contains("nested too deeply"), "{e}");
    }

    #[test]
    fn keys_of_spanned_fields_have_clean_paths() {
        let e = parse_err("[runtime]\ntimeout_ms = \"fast\"\n");
        assert_eq!(
            (e.kind(), e.line(), e.key()),
            (
                ConfigErrorKind::WrongType,
                Some(2),
                Some("runtime.timeout_ms")
            )
        );
        let e = parse_err("[[cluster]]\nname=\"a\"\n[cluster.options.nccl]\n\"lib.path\" = [1]\n");
        assert_eq!(
            (e.line(), e.key()),
            (Some(4), Some("cluster[0].options.nccl.\"lib.path\""))
        );
    }

    #[test]
    fn unknown_field_suggests_the_nearest_key() {
        let e = parse_err("[[cluster]]\nname=\"a\"\ndevcie=\"x\"\n");
        assert_eq!(
            (e.kind(), e.line(), e.key()),
            (
                ConfigErrorKind::UnknownKey,
                Some(3),
                Some("cluster[0].devcie")
            )
        );
        assert!(e.message().contains("did you mean `device`?"), "{e}");
        let e = parse_err("[runtime]\nzzz = 1\n");
        assert!(!e.message().contains("did you mean"), "{e}");
    }

    #[test]
    fn single_cluster_table_gets_a_hint() {
        let e = parse_err("[cluster]\nname=\"a\"\n");
        assert_eq!(
            (e.kind(), e.key()),
            (ConfigErrorKind::WrongType, Some("cluster"))
        );
        assert!(e.message().contains("[[cluster]]"), "{e}");
    }

    #[test]
    fn options_become_strings() -> Result<(), ConfigError> {
        let text = "[[cluster]]\nname=\"a\"\ndevice=\"cuda\"\nccl=\"nccl\"\n[cluster.options.nccl]\ns=\"x\"\ni=4\nf=1.0\nb=true\n";
        let c = parse(text, Path::new("t.toml"))?;
        let nccl = c.clusters[0]
            .options_for("nccl")
            .cloned()
            .unwrap_or_default();
        let got: Vec<(&str, &str)> = nccl.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [("b", "true"), ("f", "1.0"), ("i", "4"), ("s", "x")]);
        assert_eq!(c.clusters[0].line_of("options.nccl.i"), Some(7));
        assert_eq!(c.clusters[0].line_of("options.nccl"), Some(5));
        Ok(())
    }

    #[test]
    fn relative_paths_follow_the_file() -> Result<(), ConfigError> {
        let text = "[runtime]\nplugin_dirs = [\"./lib\", \"/abs\"]\nplugins = [\"../p/x.so\"]\n[[cluster]]\nname=\"a\"\ndevice=\"h\"\nccl=\"h\"\n";
        let c = parse(text, Path::new("/etc/ferrocx/c.toml"))?;
        assert_eq!(
            c.runtime.plugin_dirs,
            [PathBuf::from("/etc/ferrocx/lib"), PathBuf::from("/abs")]
        );
        assert_eq!(c.runtime.plugins, [PathBuf::from("/etc/ferrocx/../p/x.so")]);
        let c = parse(text, Path::new("c.toml"))?;
        assert_eq!(c.runtime.plugin_dirs[0], PathBuf::from("lib"));
        assert_eq!(c.runtime.line_of("plugins[0]"), Some(3));
        Ok(())
    }

    #[test]
    fn edit_distance_counts_typos() {
        assert_eq!(edit_distance("devcie", "device"), 1);
        assert_eq!(edit_distance("plugin_dir", "plugin_dirs"), 1);
        assert_eq!(edit_distance("abc", "xyz"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
    }
}
