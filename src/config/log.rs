//! `[log]`: how `claimd` writes its log lines on stderr.

use serde::{Deserialize, Serialize};

/// `[log]`. Every key may be left out.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `"json"`, `"pretty"` or `"auto"` (default: pretty when stderr is a terminal, JSON
    /// otherwise). `--log-format` on the command line wins over it.
    pub format: LogFormat,
}

/// Log line format, of `[log] format` and `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Pretty when stderr is a terminal (a person reads it), JSON otherwise (a collector does).
    #[default]
    Auto,
    /// One JSON object per line.
    Json,
    /// Human-readable.
    Pretty,
}

impl LogFormat {
    /// `Json` or `Pretty`: `Auto` decided by whether stderr is a terminal.
    pub fn resolve(self, stderr_is_terminal: bool) -> LogFormat {
        match self {
            LogFormat::Auto if stderr_is_terminal => LogFormat::Pretty,
            LogFormat::Auto => LogFormat::Json,
            chosen => chosen,
        }
    }
}
