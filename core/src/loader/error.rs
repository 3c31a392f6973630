//! Why a plugin was not loaded.

use std::fmt;
use std::path::PathBuf;

/// What went wrong, for callers that match on it (tests, `ferrocx info --json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoadErrorKind {
    /// The file or directory does not exist or cannot be read.
    NotFound,
    /// `dlopen` refused the file (not ELF, wrong architecture, unresolved symbol, …).
    Open,
    /// The library exports no ferrocx table.
    NoSymbols,
    /// The library only exports tables of a major this build does not know.
    NewerMajor,
    /// A table's header is malformed (magic, major, size, name).
    BadHeader,
    /// The `abi_stable` version or layout check of a Rust plugin failed.
    LayoutCheck,
    /// The library's tables contradict each other or its root module.
    Inconsistent,
    /// Another adaptor of the same name is already registered.
    Duplicate,
}

/// A plugin that was not loaded: the path, the symbol concerned (if any) and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    /// What went wrong.
    pub kind: LoadErrorKind,
    /// The library (or directory) concerned.
    pub path: PathBuf,
    /// The symbol concerned, if one.
    pub symbol: Option<String>,
    /// Human-readable reason.
    pub reason: String,
}

impl LoadError {
    pub(crate) fn new(
        kind: LoadErrorKind,
        path: impl Into<PathBuf>,
        reason: impl Into<String>,
    ) -> Self {
        LoadError {
            kind,
            path: path.into(),
            symbol: None,
            reason: reason.into(),
        }
    }

    pub(crate) fn at(mut self, symbol: impl Into<String>) -> Self {
        self.symbol = Some(symbol.into());
        self
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(s) = &self.symbol {
            write!(f, ": symbol `{s}`")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for LoadError {}
