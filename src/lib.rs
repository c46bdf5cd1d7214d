//! claimd makes external side effects (payments, emails, webhooks) happen exactly once in
//! effect, although the messages asking for them arrive at least once.
//!
//! A message is claimed (a row committed alone, unique on consumer, tenant and message id),
//! acknowledged, then performed with the message's idempotency key and settled. A sweeper
//! finishes what a crash or a timeout left `started`.
//!
//! # Embedding claimd
//!
//! [`Worker`] runs everything `claimd run` runs inside the caller's Tokio runtime, with
//! effects of the program's own ([`Effect`]) next to the configured HTTP and SMTP effects:
//!
//! ```no_run
//! use claimd::{Claim, Effect, Lookup, Outcome, Worker, async_trait};
//!
//! struct Audit;
//!
//! #[async_trait]
//! impl Effect for Audit {
//!     async fn perform(&self, claim: &Claim) -> Outcome {
//!         // Write somewhere that makes a second write of `claim.idem_key` a no-op.
//!         Outcome::Applied { status: 200, response: format!("audited {}", claim.idem_key) }
//!     }
//!     async fn lookup(&self, _claim: &Claim) -> Option<Lookup> {
//!         None // nothing to ask: unknown outcomes follow `on_unknown`
//!     }
//!     fn can_reconcile(&self) -> bool {
//!         false
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let worker = Worker::from_toml(
//!         r#"
//!         [store]
//!         url = "sqlite://claims.db"
//!         [[consumers]]
//!         name = "audit"
//!         source = "http"
//!         on_unknown = "park"
//!         [consumers.effect]
//!         kind = "custom"
//!         "#,
//!     )?
//!     .effect("audit", Audit)
//!     .start()
//!     .await?;
//!     worker.submit("audit", "event-1", r#"{"who":"ada"}"#).await?;
//!     worker.shutdown(std::time::Duration::from_secs(10)).await;
//!     Ok(())
//! }
//! ```
//!
//! The public API is what the crate root exports; `docs/library.md` lists it and explains
//! writing an effect. The layers below it (`domain`, `store`, `provider`, `config`, `engine`,
//! `ops`, `edge`, `service`, `cli`; `docs/architecture.md`) are public for claimd's own binary,
//! tests and benches, without a stability promise.

#![warn(missing_docs)]

#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
compile_error!(
    "claimd needs a store: enable the `postgres` feature, the `sqlite` feature, or both"
);

#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
pub mod domain;
pub mod edge;
pub mod engine;
pub mod ops;
pub mod provider;
pub mod service;
pub mod store;

pub use async_trait::async_trait;
pub use config::Config;
pub use domain::claim::{Claim, ClaimState, IdError};
pub use engine::claimer::{Accepted, Delivery, SubmitError};
pub use provider::effect::{Effect, Lookup, Outcome};
pub use service::worker::{Error, Worker, WorkerBuilder};
pub use store::db_effect::{DatabaseEffect, DbTx};
pub use store::enqueue::{Enqueue, EnqueueConn, EnqueueError, Enqueued, enqueue};
pub use store::{Store, StoreError, open as open_store};
