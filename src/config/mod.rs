//! Configuration: TOML, then `CLAIMD__SECTION__KEY` environment overrides, then `${VAR}`
//! expansion in string values, then validation.
//!
//! Every error names the file and the key (`consumers[0].lease: ...`) on one line; `main` turns
//! it into exit code 2. Unknown keys are errors, never ignored.

mod http_effect;
mod layering;
mod log;
mod schema;
mod validate;

pub use http_effect::*;
pub use log::{LogConfig, LogFormat};
pub use schema::*;
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

    /// Reads `path`, applies the process environment and validates.
    pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut loaded = Self::from_toml(&text, path, std::env::vars())?;
        // Absolute, so a suggested command works from any directory.
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
                message: one_line(&e.to_string()),
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
        let config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            invalid(key, one_line(&e.into_inner().to_string()))
        })?;
        // The edge checks first: they show URLs with their passwords redacted.
        config
            .validate_edge()
            .map_err(|(key, message)| invalid(key, message))?;
        config
            .validate(&mut warnings)
            .map_err(|(key, message)| invalid(key, message))?;
        Ok(Loaded { config, warnings })
    }

    /// The consumer with this name.
    pub fn consumer(&self, name: &str) -> Option<&ConsumerConfig> {
        self.consumers.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests;
