//! Configuration: TOML, then `CLAIMD__SECTION__KEY` environment overrides, then `${VAR}`
//! expansion in string values, then validation.
//!
//! Every error names the file and the key (`consumers[0].lease: ...`) on one line; `main` turns
//! it into exit code 2. Unknown keys are errors, never ignored.

mod encryption;
mod features;
mod follow_ups;
mod layering;
mod log;
mod outcomes;
mod provider_events;
mod retention;
mod schedules;
mod schema;
mod sources;
mod tenant_tokens;
mod validate;

pub use crate::provider::effect::settings::*;
pub use crate::provider::provider_events::settings::ProviderEventsConfig;
pub use encryption::EncryptionConfig;
pub use follow_ups::{FollowUpConfig, FollowUpOn};
pub use log::{LogConfig, LogFormat};
pub use outcomes::{
    MAX_DESTINATIONS, OutcomeKind, OutcomesConfig, check_destinations, render_routing_key,
};
pub use provider_events::MAX_EVENT_TOLERANCE;
pub use retention::RetentionConfig;
pub use schedules::{ScheduleConfig, parse_schedule_cron};
pub use schema::*;
pub use sources::{AmqpSourceConfig, NatsSourceConfig, Source, SourceConfig};
pub use tenant_tokens::TenantTokens;
pub use validate::{parse_cron, validate_cron};

use layering::{apply_override, expand_vars, one_line};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A configuration that cannot be used. Displayed as one line: where, what.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("{path}: not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's words, on one line.
        message: String,
    },
    /// A key is unknown, missing or of the wrong kind, or a value is refused.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key, like `consumers[0].lease`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// Shortest `admin_token`, `intake_token` or tenant token accepted (when one is set): 16
/// characters, so a token cannot be guessed from a short word list. `openssl rand -hex 24`
/// gives 48.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Largest configuration file read (1 MiB; the shipped ones are a few KiB). A bigger file, or
/// one that never ends (`--config /dev/zero`), is refused instead of read into memory.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Reads a configuration file: a regular file (not a device, pipe or directory: `/dev/zero`
/// would be read until memory runs out, a FIFO would wait forever), at most
/// [`MAX_CONFIG_BYTES`] long, UTF-8. The size is counted while reading, as files under `/proc`
/// say they are empty.
fn read_config_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    // The error names no byte of the file: it may be any file, secrets included.
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text (at byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// A TOML syntax error as one line: where (line, column, and the key being read when the line
/// names one) and the parser's words, never the text of the line. The line is often a secret
/// (`admin_token = "SuperSecret...` without its closing quote), and `--config` may name any
/// file (`/proc/self/environ`).
fn syntax_message(text: &str, mut e: toml::de::Error) -> String {
    let at = e.span().map(|s| s.start.min(text.len()));
    // Without the input, the error's own text is its message (and key) only.
    e.set_input(None);
    let words = one_line(&e.to_string());
    let Some(at) = at else { return words };
    let before = &text[..text.floor_char_boundary(at)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    match key_on_line(text, line_start) {
        Some(key) => format!("line {line}, column {column}, key {key}: {words}"),
        None => format!("line {line}, column {column}: {words}"),
    }
}

/// The dotted key a `key = value` line starting at `line_start` sets, with its table
/// (`http.admin_token`); `None` when the line is not one (the inside of a multi-line string,
/// say, which is not shown).
fn key_on_line(text: &str, line_start: usize) -> Option<String> {
    let bare = |k: &str| {
        !k.is_empty()
            && k.len() <= 64
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    let line = text[line_start..].lines().next().unwrap_or("");
    // A line with control characters is not from a TOML file (`/proc/self/environ` is one
    // line of `NAME=value` joined by NULs): nothing of it is shown.
    if line
        .chars()
        .any(|c| c.is_control() && c != '\t' && c != '\r')
    {
        return None;
    }
    let key = line.split_once('=')?.0.trim();
    if !bare(key) {
        return None;
    }
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim())
        .filter(|t| bare(t));
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

/// A loaded configuration plus the warnings an operator should see at start.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration.
    pub config: Config,
    /// Risky but allowed settings (colliding keys, missing `{tenant}`, unset `${VAR}`).
    pub warnings: Vec<String>,
}

impl Config {
    /// Names of the configured consumers, in configuration order.
    pub fn consumer_names(&self) -> Vec<String> {
        self.consumers.iter().map(|c| c.name.clone()).collect()
    }

    /// Reads `path` (a regular file of at most [`MAX_CONFIG_BYTES`]), applies the process
    /// environment and validates.
    pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
        let text = read_config_file(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut loaded = Self::from_toml(&text, path, std::env::vars())?;
        // Absolute, so a suggested command works from any directory.
        loaded.config.file = Some(std::fs::canonicalize(path).unwrap_or_else(|_| path.into()));
        Ok(loaded)
    }

    /// [`Config::load`] for a command that calls no provider (`report`, `claims ...`,
    /// `prune`, `migrate`): a provider secret that is not set (in a provider's URL or header,
    /// a provider event's signing secret, an outcome webhook's secret) is no error there,
    /// since the value is never used; a placeholder stands in for it.
    pub fn load_without_provider_secrets(path: &Path) -> Result<Loaded, ConfigError> {
        let text = read_config_file(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let env =
            std::env::vars().chain([(layering::NO_PROVIDER_CALLS.to_string(), String::new())]);
        let mut loaded = Self::from_toml(&text, path, env)?;
        loaded.config.file = Some(std::fs::canonicalize(path).unwrap_or_else(|_| path.into()));
        Ok(loaded)
    }

    /// Parses `text` (named `path` in errors) with the given environment.
    pub fn from_toml(
        text: &str,
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Loaded, ConfigError> {
        let env: BTreeMap<String, String> = env.into_iter().collect();
        let mut value: toml::Value = toml::from_str::<toml::Table>(text)
            .map(toml::Value::Table)
            .map_err(|e| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: syntax_message(text, e),
            })?;
        // Keys set from the environment, so an error in one names the variable, not the file.
        let mut from_env: Vec<(String, String)> = Vec::new();
        for (name, raw) in &env {
            if let Some(rest) = name.strip_prefix("CLAIMD__") {
                apply_override(&mut value, rest, raw).map_err(|m| ConfigError::Invalid {
                    path: path.to_path_buf(),
                    key: format!("environment {name}"),
                    message: m,
                })?;
                from_env.push((layering::key_of(rest), name.clone()));
            }
        }
        let store_url_from = layering::store_url_vars(&value, &from_env, &env);
        let invalid = |key: String, message: String| {
            let set_by = from_env
                .iter()
                .find(|(k, _)| key == *k || key.starts_with(&format!("{k}.")));
            ConfigError::Invalid {
                path: match set_by {
                    Some((_, var)) => PathBuf::from(format!("environment {var}")),
                    None => path.to_path_buf(),
                },
                key,
                message,
            }
        };
        let mut warnings = Vec::new();
        expand_vars(&mut value, &env, &mut String::new(), &mut warnings)
            .map_err(|(key, message)| invalid(key, message))?;
        let mut config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            invalid(key, one_line(&e.into_inner().to_string()))
        })?;
        config.store_url_from = store_url_from;
        // The edge checks first: they show URLs with their passwords redacted.
        config
            .validate_edge()
            .map_err(|(key, message)| invalid(key, message))?;
        config
            .validate(&mut warnings)
            .map_err(|(key, message)| invalid(key, message))?;
        config
            .encryption
            .load_keys(&env)
            .map_err(|(key, message)| invalid(key, message))?;
        Ok(Loaded { config, warnings })
    }

    /// Validates a configuration built or changed in code, as [`Config::from_toml`] validates
    /// text; returns the warnings. Errors name the key, the path being `<in code>`.
    pub fn check(&self) -> Result<Vec<String>, ConfigError> {
        let invalid = |(key, message)| ConfigError::Invalid {
            path: PathBuf::from("<in code>"),
            key,
            message,
        };
        self.validate_edge().map_err(invalid)?;
        let mut warnings = Vec::new();
        self.validate(&mut warnings).map_err(invalid)?;
        Ok(warnings)
    }

    /// The consumer with this name.
    pub fn consumer(&self, name: &str) -> Option<&ConsumerConfig> {
        self.consumers.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests;
