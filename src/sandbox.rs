//! Placeholder until the sandbox module lands (replaced by the real simulator).
#![allow(missing_docs)]
use std::time::Duration;
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    pub latency: Duration,
    pub fail_rate: f64,
    pub ambiguous_rate: f64,
    pub ignore_keys: bool,
}
#[derive(Clone)]
pub struct Sandbox;
impl Sandbox {
    pub fn new(_o: SandboxOptions) -> Self {
        Sandbox
    }
    pub async fn serve(
        self,
        _l: tokio::net::TcpListener,
        s: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        s.await;
        Ok(())
    }
}
