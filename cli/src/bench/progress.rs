//! The progress line (`\r[bench] all_reduce 12/24 sizes` on stderr), shown only on a terminal.
//!
//! A rank's stderr goes through the launcher's pipes, so it is never a terminal: when the
//! front-end's stderr is one, it sets [`ENV_PROGRESS`] and rank 0 reports progress as marker
//! lines on stdout, which the front-end turns back into the line on its own stderr.

use std::io::{IsTerminal, Write};

/// Set by the front-end for the ranks when its stderr is a terminal.
pub const ENV_PROGRESS: &str = "FERROCX_BENCH_PROGRESS";
/// Start of a progress marker line: `<MARKER><op> <done>/<total>`.
pub const MARKER: &str = "##ferrocx-bench-progress ";

/// Where progress goes.
enum Mode {
    Off,
    /// Drawn on this process's stderr.
    Terminal,
    /// Marker lines on stdout, for the front-end.
    Marker,
}

/// The progress line of one process.
pub struct Progress {
    mode: Mode,
    /// Characters of the line on screen (0: none).
    shown: usize,
}

impl Progress {
    /// For a rank: only rank 0 reports; through the front-end when it asked, else on a terminal.
    pub fn for_rank(rank: usize) -> Progress {
        let mode = if rank != 0 {
            Mode::Off
        } else if std::env::var_os(ENV_PROGRESS).is_some_and(|v| v == "1") {
            Mode::Marker
        } else if std::io::stderr().is_terminal() {
            Mode::Terminal
        } else {
            Mode::Off
        };
        Progress { mode, shown: 0 }
    }

    /// For the front-end: drawn on stderr (the caller checked that it is a terminal).
    pub fn terminal(enabled: bool) -> Progress {
        let mode = if enabled { Mode::Terminal } else { Mode::Off };
        Progress { mode, shown: 0 }
    }

    /// Reports `done` of `total` sizes of `op`.
    pub fn update(&mut self, op: &str, done: usize, total: usize) {
        match self.mode {
            Mode::Off => {}
            Mode::Marker => {
                let _ = writeln!(std::io::stdout(), "{MARKER}{op} {done}/{total}");
            }
            Mode::Terminal => self.draw(&format!("[bench] {op} {done}/{total} sizes")),
        }
    }

    /// Interprets a marker line (the front-end's side); `false` if `line` is not one.
    pub fn relay(&mut self, line: &str) -> bool {
        let Some(rest) = line.strip_prefix(MARKER) else {
            return false;
        };
        if let Mode::Terminal = self.mode {
            self.draw(&format!("[bench] {} sizes", rest.trim_end()));
        }
        true
    }

    fn draw(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        // Spaces over what is left of a longer previous line.
        let pad = self.shown.saturating_sub(text.len());
        let _ = write!(err, "\r{text}{:pad$}", "");
        let _ = err.flush();
        self.shown = text.len();
    }

    /// Removes the line, if shown (before other output, and at the end).
    pub fn clear(&mut self) {
        if self.shown == 0 {
            return;
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{:w$}\r", "", w = self.shown);
        let _ = err.flush();
        self.shown = 0;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
