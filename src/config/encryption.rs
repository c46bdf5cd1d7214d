//! `[encryption]`: encryption at rest of what claims carry (docs/operations.md, "Encryption at
//! rest"). Off by default. When on, the keys are read once, at load, from a file or an
//! environment variable, and every key named here must be among them: a configuration whose
//! keys cannot be used is refused like any other (exit code 2), naming the key.

use crate::domain::sealed::Keyring;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Largest keys file read (a key line is about 50 bytes).
const MAX_KEYS_BYTES: u64 = 64 * 1024;

/// `[encryption]`
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionConfig {
    /// Seal payloads, provider answers, errors and outcome event bodies (default `false`).
    #[serde(default)]
    pub enabled: bool,
    /// A file of keys, one `id=base64key` per line (32 bytes each; `#` starts a comment).
    #[serde(default)]
    pub keys_file: String,
    /// The environment variable holding the keys instead (`id=base64key`, entries separated
    /// by commas or new lines).
    #[serde(default)]
    pub keys_env: String,
    /// The id of the key that seals what is written; the others only open.
    #[serde(default)]
    pub active: String,
    /// The id of the key of the keyed fingerprints that find duplicates. It never rotates:
    /// changing it makes every repeat of an earlier message a payload mismatch.
    #[serde(default)]
    pub fingerprint_key: String,
    /// The keys, read at load when enabled. Not a key of the file.
    #[serde(skip)]
    pub keyring: Option<Arc<Keyring>>,
}

impl EncryptionConfig {
    /// Reads and checks the keys when enabled, taking `keys_env` from `env`. Errors are
    /// `(key, message)`, naming the keys' source and the key id at fault.
    pub(super) fn load_keys(
        &mut self,
        env: &BTreeMap<String, String>,
    ) -> Result<(), (String, String)> {
        if !self.enabled {
            return Ok(());
        }
        let (key, source, text) = match (self.keys_file.is_empty(), self.keys_env.is_empty()) {
            (false, true) => {
                let text = read_keys_file(&self.keys_file).map_err(|e| {
                    (
                        "encryption.keys_file".to_string(),
                        format!("{:?}: cannot read the keys: {e}", self.keys_file),
                    )
                })?;
                (
                    "encryption.keys_file",
                    format!("{:?}", self.keys_file),
                    text,
                )
            }
            (true, false) => {
                let text = env.get(&self.keys_env).cloned().ok_or_else(|| {
                    (
                        "encryption.keys_env".to_string(),
                        format!("the environment variable {} is not set", self.keys_env),
                    )
                })?;
                ("encryption.keys_env", self.keys_env.clone(), text)
            }
            _ => {
                return Err((
                    "encryption".into(),
                    "set exactly one of keys_file and keys_env".into(),
                ));
            }
        };
        for (name, value) in [
            ("active", &self.active),
            ("fingerprint_key", &self.fingerprint_key),
        ] {
            if value.is_empty() {
                return Err((
                    format!("encryption.{name}"),
                    "required when encryption is enabled: the id of a key among the keys".into(),
                ));
            }
        }
        let keys = Keyring::new(&text, &self.active, &self.fingerprint_key)
            .map_err(|e| (key.to_string(), format!("{source}: {e}")))?;
        self.keyring = Some(Arc::new(keys));
        Ok(())
    }
}

fn read_keys_file(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_KEYS_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &str = "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=,\
                        fp=QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";

    fn env(value: &str) -> BTreeMap<String, String> {
        [("CLAIMD_KEYS".to_string(), value.to_string())].into()
    }

    fn on() -> EncryptionConfig {
        EncryptionConfig {
            enabled: true,
            keys_env: "CLAIMD_KEYS".into(),
            active: "k1".into(),
            fingerprint_key: "fp".into(),
            ..Default::default()
        }
    }

    #[test]
    fn off_reads_nothing() {
        let mut c = EncryptionConfig::default();
        c.load_keys(&BTreeMap::new()).expect("off");
        assert!(c.keyring.is_none());
    }

    #[test]
    fn keys_from_the_environment_load() {
        let mut c = on();
        c.load_keys(&env(KEYS)).expect("keys");
        assert_eq!(c.keyring.expect("keyring").active(), "k1");
    }

    #[test]
    fn keys_from_a_file_load_and_a_missing_file_is_named() {
        let dir = std::env::temp_dir().join(format!("claimd-keys-{}", std::process::id()));
        std::fs::write(&dir, KEYS.replace(',', "\n")).expect("write");
        let mut c = EncryptionConfig {
            keys_env: String::new(),
            keys_file: dir.display().to_string(),
            ..on()
        };
        c.load_keys(&BTreeMap::new()).expect("file");
        assert!(c.keyring.is_some());
        std::fs::remove_file(&dir).expect("remove");
        let (key, message) = c.load_keys(&BTreeMap::new()).expect_err("missing");
        assert_eq!(key, "encryption.keys_file");
        assert!(message.contains("cannot read the keys"), "{message}");
    }

    #[test]
    fn a_short_key_or_an_unknown_active_id_is_refused_naming_it() {
        let (key, message) = on()
            .load_keys(&env(
                "k1=AAECAwQ=,fp=QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=",
            ))
            .expect_err("short");
        assert_eq!(key, "encryption.keys_env");
        assert!(
            message.contains("\"k1\"") && message.contains("5 bytes"),
            "{message}"
        );
        let (_, message) = EncryptionConfig {
            active: "k2".into(),
            ..on()
        }
        .load_keys(&env(KEYS))
        .expect_err("unknown");
        assert!(message.contains("active key \"k2\""), "{message}");
        let (key, _) = EncryptionConfig {
            fingerprint_key: String::new(),
            ..on()
        }
        .load_keys(&env(KEYS))
        .expect_err("no fingerprint key");
        assert_eq!(key, "encryption.fingerprint_key");
        let (key, _) = on().load_keys(&BTreeMap::new()).expect_err("unset");
        assert_eq!(key, "encryption.keys_env");
        let (key, _) = EncryptionConfig {
            keys_file: "/etc/claimd/keys".into(),
            ..on()
        }
        .load_keys(&env(KEYS))
        .expect_err("both");
        assert_eq!(key, "encryption");
    }
}
