//! The front door for a Rust service that embeds claimd.
//!
//! [`Worker::builder`] (or [`Worker::from_toml`]) takes a configuration, optionally an open
//! store and effects of the program's own, and [`WorkerBuilder::start`] runs everything
//! `claimd run` runs — HTTP intake and API, RabbitMQ consumers, the claimer, the sweeper and
//! retention — as tasks on the caller's Tokio runtime. The [`Worker`] it returns is the
//! handle: submit messages in process, read a claim, shut down. See `docs/library.md`.

use crate::config::{Config, ConfigError};
use crate::domain::claim::Claim;
use crate::engine::claimer::{Accepted, Delivery, SubmitError};
use crate::provider::effect::Effect;
use crate::service::app::{App, AppError, Supplied};
use crate::service::run::{RunError, Running};
use crate::store::{Store, StoreError};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Why a worker could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid (the message names the key).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not be opened or migrated, or an effect could not be built.
    #[error(transparent)]
    App(#[from] AppError),
    /// A listener, the scheduler or a status probe failed at start.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Builds a [`Worker`]: a configuration plus what the program supplies itself.
///
/// ```no_run
/// # async fn demo() -> Result<(), claimd::Error> {
/// let worker = claimd::Worker::from_toml(r#"
///     [store]
///     url = "sqlite://claims.db"
///     [[consumers]]
///     name = "payments"
///     source = "http"
///     [consumers.effect]
///     kind = "http"
///     url = "https://api.example.com/v1/payments"
/// "#)?
/// .start()
/// .await?;
/// println!("intake on http://{}", worker.http_addr());
/// worker.shutdown(std::time::Duration::from_secs(10)).await;
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `start`"]
pub struct WorkerBuilder {
    config: Config,
    supplied: Supplied,
    migrate: bool,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("consumers", &self.config.consumer_names())
            .field("effects", &self.supplied.effects.keys().collect::<Vec<_>>())
            .field("migrate", &self.migrate)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// Uses this open store instead of opening `[store] url` (to share a pool, or to open it
    /// with settings of your own). Build one with [`crate::open_store`].
    pub fn store(mut self, store: Store) -> Self {
        self.supplied.store = Some(store);
        self
    }

    /// The effect of the consumer `consumer`, whose configuration says `kind = "custom"`.
    /// Starting fails when a custom consumer has no effect, or an effect no custom consumer.
    pub fn effect(mut self, consumer: impl Into<String>, effect: impl Effect) -> Self {
        self.supplied
            .effects
            .insert(consumer.into(), Arc::new(effect));
        self
    }

    /// Supplies the database effect of a `kind = "custom"` consumer: its
    /// [`DatabaseEffect::apply`](crate::DatabaseEffect::apply) runs in the transaction that
    /// settles each claim (docs/library.md, "Database effects").
    pub fn database_effect(
        self,
        consumer: impl Into<String>,
        effect: impl crate::DatabaseEffect + 'static,
    ) -> Self {
        self.effect(
            consumer,
            crate::provider::effect::sql::InTransaction(effect),
        )
    }

    /// Whether [`WorkerBuilder::start`] applies the store's migrations first (default `true`).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Validates the configuration (logging its warnings at `warn`), opens the store, builds
    /// the consumers and starts every part of the worker as tasks on the current Tokio runtime
    /// (call it from inside one). Returns once the HTTP listener is bound and every status
    /// endpoint has been probed.
    pub async fn start(self) -> Result<Worker, Error> {
        for warning in self.config.check()? {
            tracing::warn!("{warning}");
        }
        let app = App::open_with(self.config, self.migrate, self.supplied).await?;
        let running = crate::service::run::start(app).await?;
        Ok(Worker { running })
    }
}

/// A running worker: the handle [`WorkerBuilder::start`] returns.
///
/// Dropping it leaves the tasks running until the runtime stops; call
/// [`Worker::shutdown`] to stop taking work and let calls in flight finish.
#[derive(Debug)]
pub struct Worker {
    running: Running,
}

impl Worker {
    /// A builder for this configuration (loaded with [`Config::load`], or built or changed in
    /// code: [`WorkerBuilder::start`] validates it as a file is validated).
    pub fn builder(config: Config) -> WorkerBuilder {
        WorkerBuilder {
            config,
            supplied: Supplied::default(),
            migrate: true,
        }
    }

    /// A builder for the configuration in `toml` (the format of `docs/operations.md`),
    /// validated as `claimd run` validates a file, with `${VAR}` and `CLAIMD__…` taken from
    /// the process environment.
    pub fn from_toml(toml: &str) -> Result<WorkerBuilder, Error> {
        let loaded = Config::from_toml(toml, Path::new("<embedded>"), std::env::vars())?;
        Ok(Self::builder(loaded.config))
    }

    /// Where the HTTP intake and API listen (`[http] listen`; port `0` picks a free one).
    pub fn http_addr(&self) -> SocketAddr {
        self.running.http_addr
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.running.app().config
    }

    /// The claim store.
    pub fn store(&self) -> &Store {
        &self.running.app().store
    }

    /// Submits a message in process, as HTTP intake would: no tenant, content type
    /// `application/json`. Returns once the claim is committed (or recognised as a duplicate);
    /// the effect then runs in the background. See [`Worker::submit_delivery`].
    pub async fn submit(
        &self,
        consumer: &str,
        message_id: &str,
        payload: impl Into<bytes::Bytes>,
    ) -> Result<Accepted, SubmitError> {
        self.submit_delivery(Delivery {
            consumer: consumer.to_string(),
            tenant: Vec::new(),
            message_id: message_id.as_bytes().to_vec(),
            payload: payload.into(),
            content_type: b"application/json".to_vec(),
            not_before: None,
            trace_parent: None,
            priority: 0,
        })
        .await
    }

    /// Submits a message with every field given (tenant, content type). Acknowledge the
    /// message to whatever delivered it only after this returns `Ok`.
    pub async fn submit_delivery(&self, delivery: Delivery) -> Result<Accepted, SubmitError> {
        self.running.app().claimer.submit(delivery).await
    }

    /// The claim for (`consumer`, `tenant`, `message_id`) as stored now (`tenant` is `""` for
    /// none), or `None`.
    pub async fn claim(
        &self,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> Result<Option<Claim>, StoreError> {
        self.store().get(consumer, tenant, message_id).await
    }

    /// Graceful stop: refuse new work, let calls in flight finish within `grace`, leave the
    /// rest `started` for the sweeper of this or another instance, stop every task. Returns
    /// how many calls were still in flight when `grace` ended.
    pub async fn shutdown(self, grace: Duration) -> usize {
        self.running.shutdown(grace).await
    }
}
