//! The configuration error: what is wrong, and where (file or variable, line, column, key).

use std::fmt;
use std::path::{Path, PathBuf};

use super::position::Pos;

/// Where the text that a [`ConfigError`] is about came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorOrigin {
    /// A config file (for [`Config::parse`](super::Config::parse), the `origin` it was given).
    File(PathBuf),
    /// A config built in code, e.g. by [`Config::default_local`](super::Config::default_local).
    Defaults,
    /// An environment variable, by name.
    Env(String),
}

/// Which rule a config broke; the error's message says how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Io,
    /// The text is not valid TOML.
    Syntax,
    /// A key that ferrocx does not know (often a typo).
    UnknownKey,
    /// A value of the wrong TOML type (a string where a number belongs, ...).
    WrongType,
    /// A value of the right type that is not allowed (`timeout_ms = 0`, `ranks = "3-1"`, ...).
    InvalidValue,
    /// A required key is absent.
    MissingKey,
    /// Two clusters claim the same rank.
    RankOverlap,
    /// A cluster names an adaptor that is not available.
    UnknownAdaptor,
}

/// An invalid configuration, located as precisely as the source allows.
///
/// Displays as ``path/to/file.toml:LINE:COL: key `cluster[1].ranks`: message`` (line, column and
/// key are left out where unknown), or `environment variable NAME: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", Rendered(self))]
pub struct ConfigError {
    origin: ErrorOrigin,
    kind: ConfigErrorKind,
    line: Option<usize>,
    column: Option<usize>,
    key: Option<String>,
    message: String,
}

impl ConfigError {
    /// An error with no position and no key yet.
    pub(crate) fn new(
        origin: ErrorOrigin,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            origin,
            kind,
            line: None,
            column: None,
            key: None,
            message: message.into(),
        }
    }

    /// An error about the value of environment variable `var`.
    pub(crate) fn env(var: &str, message: impl Into<String>) -> Self {
        Self::new(
            ErrorOrigin::Env(var.to_owned()),
            ConfigErrorKind::InvalidValue,
            message,
        )
    }

    /// Sets the line and column.
    pub(crate) fn at(mut self, pos: Option<Pos>) -> Self {
        self.line = pos.map(|p| p.line);
        self.column = pos.map(|p| p.column);
        self
    }

    /// Sets the dotted key path (`cluster[1].ranks`).
    pub(crate) fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Where the offending text came from.
    pub fn origin(&self) -> &ErrorOrigin {
        &self.origin
    }

    /// The config file, when the error is about one.
    pub fn file(&self) -> Option<&Path> {
        match &self.origin {
            ErrorOrigin::File(path) => Some(path),
            _ => None,
        }
    }

    /// The environment variable, when the error is about one.
    pub fn env_var(&self) -> Option<&str> {
        match &self.origin {
            ErrorOrigin::Env(var) => Some(var),
            _ => None,
        }
    }

    /// Which rule was broken.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    /// The 1-based line of the offending key or value, where known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The 1-based column (in characters) of the offending key or value, where known.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The dotted key path, e.g. `cluster[1].ranks` or `runtime.timeout_ms`, where known.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// What is wrong, without the location.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// The `Display` of a [`ConfigError`], kept apart so the derive can call it.
struct Rendered<'a>(&'a ConfigError);

impl fmt::Display for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        match &e.origin {
            ErrorOrigin::Env(var) => return write!(f, "environment variable {var}: {}", e.message),
            ErrorOrigin::File(path) => write!(f, "{}", path.display())?,
            ErrorOrigin::Defaults => f.write_str("<built-in defaults>")?,
        }
        if let Some(line) = e.line {
            write!(f, ":{line}")?;
            if let Some(column) = e.column {
                write!(f, ":{column}")?;
            }
        }
        if let Some(key) = &e.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_line_column_and_key() {
        let e = ConfigError::new(
            ErrorOrigin::File("conf/a.toml".into()),
            ConfigErrorKind::InvalidValue,
            "range 3-1 is reversed",
        )
        .at(Some(Pos { line: 7, column: 9 }))
        .with_key("cluster[1].ranks");
        assert_eq!(
            e.to_string(),
            "conf/a.toml:7:9: key `cluster[1].ranks`: range 3-1 is reversed"
        );
        assert_eq!(
            (e.line(), e.column(), e.key()),
            (Some(7), Some(9), Some("cluster[1].ranks"))
        );
        assert_eq!(e.file(), Some(Path::new("conf/a.toml")));
    }

    #[test]
    fn display_leaves_out_what_is_unknown() {
        let io = ConfigError::new(
            ErrorOrigin::File("x.toml".into()),
            ConfigErrorKind::Io,
            "gone",
        );
        assert_eq!(io.to_string(), "x.toml: gone");
        let env = ConfigError::env("FERROCX_TIMEOUT_MS", "bad");
        assert_eq!(
            env.to_string(),
            "environment variable FERROCX_TIMEOUT_MS: bad"
        );
        assert_eq!(env.env_var(), Some("FERROCX_TIMEOUT_MS"));
        assert_eq!(env.file(), None);
    }
}
