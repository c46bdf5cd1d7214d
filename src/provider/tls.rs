//! The TLS crypto provider every client in claimd uses: ring.
//!
//! reqwest, lettre and lapin all speak TLS through rustls, which needs one crypto provider per
//! process. claimd compiles only ring (a small Rust and assembly build; aws-lc-rs's C build was
//! a third of a fresh release build), so reqwest finds no provider of its own and the process
//! default must be set before the first client is built: every client claimd builds comes from
//! [`http_client_builder`], which sets it once.

use std::sync::Once;

/// Makes ring the process's default rustls crypto provider, once. A provider the embedding
/// program installed first is kept.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Err means a provider is already installed (the embedder's): that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A reqwest client builder with the crypto provider in place.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_builds_with_the_ring_provider() {
        http_client_builder()
            .build()
            .expect("a client with ring as its provider");
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
