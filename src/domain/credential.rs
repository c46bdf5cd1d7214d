//! Operator credentials: generated at random, kept only as a salted PBKDF2-HMAC-SHA256 hash
//! (ring's implementation), checked in constant time.
//!
//! A stored hash reads `pbkdf2-sha256$<iterations>$<salt, base64>$<hash, base64>`, so the
//! iteration count can rise later without invalidating hashes made before.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use ring::rand::{SecureRandom, SystemRandom};
use std::num::NonZeroU32;

/// Iterations for new hashes (OWASP's figure for PBKDF2-HMAC-SHA256).
pub const ITERATIONS: u32 = 600_000;

/// Shortest credential accepted (a generated one has 43 characters).
pub const MIN_CHARS: usize = 16;

/// Longest credential accepted.
pub const MAX_CHARS: usize = 256;

const SCHEME: &str = "pbkdf2-sha256";
const SALT_BYTES: usize = 16;
const HASH_BYTES: usize = 32;

/// Why a credential or a hash is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Too short or too long, or not printable ASCII.
    #[error(
        "a credential must be {MIN_CHARS}-{MAX_CHARS} printable ASCII characters without spaces (got {0} characters)"
    )]
    Shape(usize),
    /// The system's random source failed.
    #[error("the system's random source failed")]
    Random,
}

fn random(buf: &mut [u8]) -> Result<(), CredentialError> {
    SystemRandom::new()
        .fill(buf)
        .map_err(|_| CredentialError::Random)
}

/// A new random credential: 256 bits, base64url (43 characters).
pub fn generate() -> Result<String, CredentialError> {
    let mut b = [0u8; 32];
    random(&mut b)?;
    Ok(URL_SAFE_NO_PAD.encode(b))
}

/// Checks the shape of a credential a person chose.
pub fn check_shape(credential: &str) -> Result<(), CredentialError> {
    let n = credential.chars().count();
    let printable = credential.bytes().all(|b| b.is_ascii_graphic());
    if !(MIN_CHARS..=MAX_CHARS).contains(&n) || !printable {
        return Err(CredentialError::Shape(n));
    }
    Ok(())
}

/// The hash to store for `credential`, with a new random salt.
pub fn hash(credential: &str) -> Result<String, CredentialError> {
    let mut salt = [0u8; SALT_BYTES];
    random(&mut salt)?;
    Ok(hash_with(credential, &salt, ITERATIONS))
}

fn hash_with(credential: &str, salt: &[u8], iterations: u32) -> String {
    let mut out = [0u8; HASH_BYTES];
    let n = NonZeroU32::new(iterations.max(1)).unwrap_or(NonZeroU32::MIN);
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        n,
        salt,
        credential.as_bytes(),
        &mut out,
    );
    format!(
        "{SCHEME}${iterations}${}${}",
        STANDARD_NO_PAD.encode(salt),
        STANDARD_NO_PAD.encode(out)
    )
}

/// Whether `credential` is the one `stored` was made from. A stored value that is not such a
/// hash matches nothing.
pub fn verify(credential: &str, stored: &str) -> bool {
    let mut parts = stored.split('$');
    let (Some(SCHEME), Some(iter), Some(salt), Some(want), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let (Ok(iter), Ok(salt), Ok(want)) = (
        iter.parse::<u32>(),
        STANDARD_NO_PAD.decode(salt),
        STANDARD_NO_PAD.decode(want),
    ) else {
        return false;
    };
    let Some(iter) = NonZeroU32::new(iter) else {
        return false;
    };
    ring::pbkdf2::verify(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        iter,
        &salt,
        credential.as_bytes(),
        &want,
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_verifies_its_credential_only() {
        let h = hash_with("correct horse battery", b"0123456789abcdef", 1000);
        assert!(h.starts_with("pbkdf2-sha256$1000$"), "{h}");
        assert!(verify("correct horse battery", &h));
        assert!(!verify("correct horse batterY", &h));
        assert!(!verify("", &h));
    }

    #[test]
    fn the_same_credential_hashes_differently_each_time() {
        let a = hash("correct horse battery").unwrap();
        let b = hash("correct horse battery").unwrap();
        assert_ne!(a, b, "a new salt each time");
        assert!(a.starts_with(&format!("pbkdf2-sha256${ITERATIONS}$")));
        assert!(verify("correct horse battery", &a) && verify("correct horse battery", &b));
        assert!(!a.contains("correct"));
    }

    #[test]
    fn a_malformed_hash_matches_nothing() {
        for bad in [
            "",
            "plain",
            "pbkdf2-sha256$0$AAAA$AAAA",
            "pbkdf2-sha256$x$AAAA$AAAA",
            "pbkdf2-sha256$1000$!!$AAAA",
            "md5$1000$AAAA$AAAA",
            "pbkdf2-sha256$1000$AAAA$AAAA$extra",
        ] {
            assert!(!verify("anything", bad), "{bad}");
        }
    }

    #[test]
    fn generated_credentials_are_long_random_and_valid() {
        let a = generate().unwrap();
        assert_eq!(a.len(), 43);
        assert_ne!(a, generate().unwrap());
        assert_eq!(check_shape(&a), Ok(()));
        assert_eq!(check_shape("short"), Err(CredentialError::Shape(5)));
        assert!(check_shape("has a space in it ok").is_err());
        assert!(check_shape(&"x".repeat(MAX_CHARS + 1)).is_err());
    }
}
