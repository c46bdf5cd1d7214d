//! Driving real provider APIs safely: secrets that must be set, request shaping, status checks
//! that read the answer and the cap on re-sends, against the sandbox and a user's provider.

mod common;

use common::*;

/// An unset `${VAR}` in a provider header stops `claimd run` with exit 2 naming the key; with
/// the default written out it starts.
#[test]
fn an_unset_provider_secret_refuses_to_start() {
    let store = TestStore::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let toml = config_toml(
        &store.url(),
        &consumer_toml("payments", "http://127.0.0.1:9", ""),
    )
    .replace(
        "Bearer provider-secret-token",
        "Bearer ${CLAIMD_TEST_UNSET_SECRET_7C1}",
    );
    std::fs::write(&cfg, &toml).unwrap();
    let (code, _out, err) = cli(&["migrate", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("consumers[0].effect.headers.Authorization")
            && err.contains("CLAIMD_TEST_UNSET_SECRET_7C1"),
        "{err}"
    );
    std::fs::write(&cfg, toml.replace("SECRET_7C1}", "SECRET_7C1:-}")).unwrap();
    let (code, _out, err) = cli(&["migrate", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}
