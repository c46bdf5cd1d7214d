//! Encryption at rest of what a claim carries (payloads, provider answers, errors, outcome
//! event bodies): the keys ([`Keyring`]), the sealed envelope each record is stored as, and the
//! keyed fingerprint that finds duplicates without a plain hash of the payload. Pure: the keys
//! are handed in as text, and the store decides which columns go through [`Keyring::seal`].
//!
//! # The envelope
//!
//! A sealed value is ASCII text, so one format serves the `BLOB`/`bytea` payload and the text
//! columns alike:
//!
//! ```text
//! $claimd$v1$<key id>$<base64 (standard, no padding) of nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)>
//! ```
//!
//! AES-256-GCM with a random 96-bit nonce per record and no associated data (the outbox copies
//! a claim's sealed answer and error into its events as they are). A value without the
//! [`PREFIX`] is clear text written before encryption was turned on (or by the SQL enqueue
//! path); an empty value is an erased one: both are read as they are.
//!
//! # Fingerprints
//!
//! With a keyring, a payload's fingerprint is [`KEYED_PREFIX`] followed by the hex HMAC-SHA256
//! of the payload under the fingerprint key, a key of its own that never rotates (rotating the
//! encryption key changes no fingerprint). A stored fingerprint without the prefix is the plain
//! SHA-256 of [`fingerprint`](crate::domain::claim::fingerprint); [`Keyring::fingerprint_matches`]
//! compares a payload with either kind.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::collections::BTreeMap;
use std::fmt;

/// How every sealed value starts (then the key id, `$`, and the base64 body).
pub const PREFIX: &str = "$claimd$v1$";

/// How a keyed fingerprint starts (then 64 hex digits).
pub const KEYED_PREFIX: &str = "hmac-sha256:";

/// Bytes of every key (AES-256 and the fingerprint's HMAC-SHA256 alike).
pub const KEY_LEN: usize = 32;

/// Bytes of the GCM tag after the ciphertext.
const TAG_LEN: usize = 16;

/// Why keys could not be loaded or a value could not be opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    /// A line of the keys is not `id=base64key`.
    #[error("keys line {line}: expected `id=base64key`, got {got:?}")]
    BadLine {
        /// 1-based line (or comma-separated entry) number.
        line: usize,
        /// The line, with its key cut off.
        got: String,
    },
    /// A key id with characters other than letters, digits, `_` and `-` (or empty, or long).
    #[error("key id {0:?}: use 1 to 32 letters, digits, `_` or `-`")]
    BadId(String),
    /// A key that is not base64 of 32 bytes.
    #[error("key {id:?}: {why}")]
    BadKey {
        /// The key's id.
        id: String,
        /// What is wrong with it.
        why: String,
    },
    /// The same id twice.
    #[error("key {0:?} is given twice")]
    DuplicateId(String),
    /// A named key (active or fingerprint) that the keys do not hold.
    #[error("the {role} key {id:?} is not among the keys ({known})")]
    UnknownKey {
        /// `active` or `fingerprint`.
        role: &'static str,
        /// The id asked for.
        id: String,
        /// The ids the keys hold.
        known: String,
    },
    /// A sealed value whose key was retired (removed from the keys).
    #[error("sealed with key {0:?}, which is not among the keys")]
    MissingKey(String),
    /// A value that starts as a sealed one but does not open (damaged, or another key).
    #[error(
        "sealed value (key {0:?}) does not open: damaged, or sealed under another key of that id"
    )]
    Damaged(String),
}

/// The keys of one instance: every key that may open a value, the active one that seals, and
/// the fingerprint key. Its `Debug` shows ids only.
pub struct Keyring {
    keys: BTreeMap<String, LessSafeKey>,
    active: String,
    fingerprint: hmac::Key,
    fingerprint_id: String,
    rng: SystemRandom,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("ids", &self.ids())
            .field("active", &self.active)
            .field("fingerprint", &self.fingerprint_id)
            .finish()
    }
}

/// Parses keys text: one `id=base64key` per line or comma-separated entry; blank lines and
/// lines starting with `#` are skipped. Returns (id, 32 key bytes) in order.
pub fn parse_keys(text: &str) -> Result<Vec<(String, Vec<u8>)>, SealError> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let entries = text.split(['\n', ',']).map(str::trim);
    for (n, entry) in entries.enumerate() {
        if entry.is_empty() || entry.starts_with('#') {
            continue;
        }
        let Some((id, key)) = entry.split_once('=') else {
            let shown: String = entry.chars().take(12).collect();
            return Err(SealError::BadLine {
                line: n + 1,
                got: format!("{shown}…"),
            });
        };
        let id = id.trim();
        if !valid_id(id) {
            return Err(SealError::BadId(id.to_string()));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(key.trim())
            .map_err(|e| SealError::BadKey {
                id: id.to_string(),
                why: format!("not base64 ({e})"),
            })?;
        if bytes.len() != KEY_LEN {
            return Err(SealError::BadKey {
                id: id.to_string(),
                why: format!(
                    "{} bytes, a key is {KEY_LEN} bytes (make one with `openssl rand -base64 32`)",
                    bytes.len()
                ),
            });
        }
        if out.iter().any(|(known, _)| known == id) {
            return Err(SealError::DuplicateId(id.to_string()));
        }
        out.push((id.to_string(), bytes));
    }
    Ok(out)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Keyring {
    /// The keyring of `keys` (see [`parse_keys`]), sealing with `active` and fingerprinting
    /// with `fingerprint`; both must be among the keys.
    pub fn new(keys: &str, active: &str, fingerprint: &str) -> Result<Self, SealError> {
        let parsed = parse_keys(keys)?;
        let known = || {
            let ids: Vec<&str> = parsed.iter().map(|(id, _)| id.as_str()).collect();
            if ids.is_empty() {
                "none".to_string()
            } else {
                ids.join(", ")
            }
        };
        let find = |role: &'static str, id: &str| {
            parsed
                .iter()
                .find(|(k, _)| k == id)
                .map(|(_, b)| b.clone())
                .ok_or_else(|| SealError::UnknownKey {
                    role,
                    id: id.to_string(),
                    known: known(),
                })
        };
        find("active", active)?;
        let fp = find("fingerprint", fingerprint)?;
        let keys = parsed
            .iter()
            .map(|(id, bytes)| {
                let key = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SealError::BadKey {
                    id: id.clone(),
                    why: "not an AES-256 key".into(),
                })?;
                Ok((id.clone(), LessSafeKey::new(key)))
            })
            .collect::<Result<_, SealError>>()?;
        Ok(Keyring {
            keys,
            active: active.to_string(),
            fingerprint: hmac::Key::new(hmac::HMAC_SHA256, &fp),
            fingerprint_id: fingerprint.to_string(),
            rng: SystemRandom::new(),
        })
    }

    /// The ids of every key, in order.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.keys().map(String::as_str).collect()
    }

    /// The id of the key that seals.
    pub fn active(&self) -> &str {
        &self.active
    }

    /// `plain` sealed under the active key (see the module). Empty stays empty (an erased
    /// value has nothing to seal).
    pub fn seal(&self, plain: &[u8]) -> Vec<u8> {
        if plain.is_empty() {
            return Vec::new();
        }
        let key = &self.keys[&self.active];
        let mut nonce = [0u8; NONCE_LEN];
        // The system's random source failing is not something a worker can go on without.
        self.rng
            .fill(&mut nonce)
            .expect("the system random source answers");
        let mut body = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
        body.extend_from_slice(&nonce);
        body.extend_from_slice(plain);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut body[NONCE_LEN..],
            )
            .expect("AES-GCM seals any length a claim can hold");
        body.extend_from_slice(tag.as_ref());
        let mut out =
            String::with_capacity(PREFIX.len() + self.active.len() + 1 + body.len() * 4 / 3 + 4);
        out.push_str(PREFIX);
        out.push_str(&self.active);
        out.push('$');
        STANDARD_NO_PAD.encode_string(&body, &mut out);
        out.into_bytes()
    }

    /// `plain` sealed, as text (for the text columns).
    pub fn seal_text(&self, plain: &str) -> String {
        // The envelope is ASCII.
        String::from_utf8(self.seal(plain.as_bytes())).unwrap_or_default()
    }

    /// The clear bytes of a stored value: a sealed one opened, a clear or empty one as it is.
    pub fn open(&self, stored: &[u8]) -> Result<Vec<u8>, SealError> {
        let Some((id, body)) = split_envelope(stored) else {
            return Ok(stored.to_vec());
        };
        let key = self
            .keys
            .get(id)
            .ok_or_else(|| SealError::MissingKey(id.to_string()))?;
        let damaged = || SealError::Damaged(id.to_string());
        // SQL may append a clear note to a sealed history line (a fenced-out write's
        // "(claim was ...)"): the base64 run is the sealed part, the rest stays as it is.
        let end = body
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/'))
            .unwrap_or(body.len());
        let (body, suffix) = body.split_at(end);
        let mut bytes = STANDARD_NO_PAD.decode(body).map_err(|_| damaged())?;
        if bytes.len() < NONCE_LEN + TAG_LEN {
            return Err(damaged());
        }
        let nonce = Nonce::try_assume_unique_for_key(&bytes[..NONCE_LEN]).map_err(|_| damaged())?;
        let plain_len = key
            .open_in_place(nonce, Aad::empty(), &mut bytes[NONCE_LEN..])
            .map_err(|_| damaged())?
            .len();
        bytes.drain(..NONCE_LEN);
        bytes.truncate(plain_len);
        bytes.extend_from_slice(suffix);
        Ok(bytes)
    }

    /// The clear text of a stored text value (see [`open`](Keyring::open)).
    pub fn open_text(&self, stored: &str) -> Result<String, SealError> {
        let bytes = self.open(stored.as_bytes())?;
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Whether `stored` needs sealing again under the active key: clear (not empty) or sealed
    /// under another key.
    pub fn needs_reseal(&self, stored: &[u8]) -> bool {
        match key_id(stored) {
            Some(id) => id != self.active,
            None => !stored.is_empty(),
        }
    }

    /// The keyed fingerprint of `payload` (see the module).
    pub fn fingerprint(&self, payload: &[u8]) -> String {
        let tag = hmac::sign(&self.fingerprint, payload);
        format!("{KEYED_PREFIX}{}", hex::encode(tag.as_ref()))
    }

    /// Whether `payload` is the payload a stored fingerprint of either kind was taken of.
    pub fn fingerprint_matches(&self, stored: &str, payload: &[u8]) -> bool {
        fingerprint_matches(Some(self), stored, payload)
    }
}

/// Whether `payload` is the payload `stored` (a plain or keyed fingerprint) was taken of; a
/// keyed fingerprint without a keyring never matches.
pub fn fingerprint_matches(keys: Option<&Keyring>, stored: &str, payload: &[u8]) -> bool {
    let fresh = match (stored.starts_with(KEYED_PREFIX), keys) {
        (true, Some(k)) => k.fingerprint(payload),
        (true, None) => return false,
        (false, _) => crate::domain::claim::fingerprint(payload),
    };
    crate::domain::constant_time::constant_time_eq(fresh.as_bytes(), stored.as_bytes())
}

/// The key id of a sealed value; `None` for a clear or empty one.
pub fn key_id(stored: &[u8]) -> Option<&str> {
    split_envelope(stored).map(|(id, _)| id)
}

/// Whether a stored value is sealed (starts with [`PREFIX`]).
pub fn is_sealed(stored: &[u8]) -> bool {
    stored.starts_with(PREFIX.as_bytes())
}

fn split_envelope(stored: &[u8]) -> Option<(&str, &[u8])> {
    let rest = stored.strip_prefix(PREFIX.as_bytes())?;
    let at = rest.iter().position(|&b| b == b'$')?;
    let id = std::str::from_utf8(&rest[..at]).ok()?;
    Some((id, &rest[at + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const K2: &str = "k2=HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4=";
    const FP: &str = "fp=QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";

    fn ring(keys: &[&str], active: &str) -> Keyring {
        Keyring::new(&keys.join("\n"), active, "fp").expect("keys")
    }

    #[test]
    fn a_sealed_value_opens_to_what_was_sealed_and_shows_nothing_of_it() {
        let k = ring(&[K1, K2, FP], "k2");
        let plain = br#"{"card":"tok_visa_4242","email":"ann@example.com"}"#;
        let sealed = k.seal(plain);
        let text = String::from_utf8(sealed.clone()).expect("ascii");
        assert!(text.starts_with("$claimd$v1$k2$"), "{text}");
        assert!(!text.contains("tok_visa"), "{text}");
        assert_eq!(key_id(&sealed), Some("k2"));
        assert_eq!(k.open(&sealed).expect("opens"), plain);
        assert_ne!(k.seal(plain), sealed, "a fresh nonce per record");
        assert_eq!(k.open_text(&k.seal_text("déjà")).expect("opens"), "déjà");
        let noted = format!("{} (claim was completed@v3)", k.seal_text("timeout"));
        assert_eq!(
            k.open_text(&noted).expect("opens"),
            "timeout (claim was completed@v3)"
        );
    }

    #[test]
    fn clear_and_erased_values_are_read_as_they_are() {
        let k = ring(&[K1, FP], "k1");
        assert_eq!(k.open(b"").expect("empty"), b"");
        assert_eq!(k.seal(b""), b"");
        assert_eq!(k.open(b"{\"a\":1}").expect("clear"), b"{\"a\":1}");
        assert!(!k.needs_reseal(b""));
        assert!(k.needs_reseal(b"{\"a\":1}"));
    }

    #[test]
    fn an_old_key_opens_after_rotation_and_a_retired_one_is_named() {
        let old = ring(&[K1, FP], "k1");
        let sealed = old.seal(b"amount=12");
        let rotated = ring(&[K1, K2, FP], "k2");
        assert_eq!(rotated.open(&sealed).expect("old key"), b"amount=12");
        assert!(rotated.needs_reseal(&sealed));
        assert!(!rotated.needs_reseal(&rotated.seal(b"x")));
        let retired = ring(&[K2, FP], "k2");
        assert_eq!(
            retired.open(&sealed),
            Err(SealError::MissingKey("k1".into()))
        );
    }

    #[test]
    fn a_damaged_value_or_one_under_another_key_of_the_same_id_does_not_open() {
        let k = ring(&[K1, FP], "k1");
        let mut sealed = k.seal(b"hello");
        let last = sealed.len() - 2;
        sealed[last] = if sealed[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(k.open(&sealed), Err(SealError::Damaged("k1".into())));
        let impostor = Keyring::new(&format!("k1={}\n{FP}", &K2[3..]), "k1", "fp").expect("keys");
        assert_eq!(
            impostor.open(&k.seal(b"hello")),
            Err(SealError::Damaged("k1".into()))
        );
    }

    #[test]
    fn the_keyed_fingerprint_survives_rotation_and_tells_payloads_apart() {
        let before = ring(&[K1, FP], "k1");
        let after = ring(&[K1, K2, FP], "k2");
        let print = before.fingerprint(b"{\"amount\":10}");
        assert!(print.starts_with(KEYED_PREFIX));
        assert!(!print.contains(&crate::domain::claim::fingerprint(b"{\"amount\":10}")));
        assert_eq!(after.fingerprint(b"{\"amount\":10}"), print);
        assert!(after.fingerprint_matches(&print, b"{\"amount\":10}"));
        assert!(!after.fingerprint_matches(&print, b"{\"amount\":11}"));
        // A plain fingerprint written before encryption was turned on still matches.
        let plain = crate::domain::claim::fingerprint(b"{\"amount\":10}");
        assert!(after.fingerprint_matches(&plain, b"{\"amount\":10}"));
        assert!(!after.fingerprint_matches(&plain, b"{\"amount\":11}"));
        assert!(!fingerprint_matches(None, &print, b"{\"amount\":10}"));
        assert!(fingerprint_matches(None, &plain, b"{\"amount\":10}"));
    }

    #[test]
    fn keys_parse_from_lines_or_commas_with_comments() {
        let text = format!("# claimd keys\n{K1}\n\n {K2} \n{FP}");
        let keys = parse_keys(&text).expect("keys");
        assert_eq!(keys.len(), 3);
        assert_eq!(keys[1].0, "k2");
        assert_eq!(parse_keys(&format!("{K1},{FP}")).expect("commas").len(), 2);
    }

    #[test]
    fn bad_keys_are_refused_naming_the_key() {
        let short = parse_keys("k1=AAEC").expect_err("short");
        assert!(short.to_string().contains("\"k1\""), "{short}");
        assert!(short.to_string().contains("3 bytes"), "{short}");
        let not_b64 = parse_keys("k9=not base64!").expect_err("base64");
        assert!(not_b64.to_string().contains("\"k9\""), "{not_b64}");
        assert!(matches!(
            parse_keys("just-a-key").expect_err("line"),
            SealError::BadLine { line: 1, .. }
        ));
        assert_eq!(
            parse_keys(&format!("{K1}\n{K1}")),
            Err(SealError::DuplicateId("k1".into()))
        );
        assert!(matches!(parse_keys("k 1=AA"), Err(SealError::BadId(_))));
        let unknown = Keyring::new(&format!("{K1}\n{FP}"), "k7", "fp").expect_err("active");
        assert_eq!(
            unknown.to_string(),
            "the active key \"k7\" is not among the keys (k1, fp)"
        );
        let no_fp = Keyring::new(K1, "k1", "fp").expect_err("fingerprint");
        assert!(
            no_fp.to_string().contains("fingerprint key \"fp\""),
            "{no_fp}"
        );
    }

    #[test]
    fn debug_shows_ids_only() {
        let k = ring(&[K1, FP], "k1");
        let shown = format!("{k:?}");
        assert!(shown.contains("k1") && !shown.contains("AAECAw"), "{shown}");
    }
}
