//! Wiring: from a loaded configuration to a store, consumers with their effects, and a claimer.
//! Every command starts here; `claimd run` then starts the long-running parts (see [`crate::service::run`]).

use crate::config::{Config, EffectConfig};
use crate::engine::claimer::{Claimer, Consumer};
use crate::engine::sweeper::schedule_period;
use crate::engine::traces::{Traces, TracesSettings};
use crate::provider::effect::Effect;
use crate::provider::effect::http::HttpEffect;
#[cfg(feature = "smtp")]
use crate::provider::effect::smtp::SmtpEffect;
use crate::store::read_replica::Reads;
use crate::store::{self, Store, StoreError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Why the application could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A consumer's effect could not be built from its configuration.
    #[error("consumer {consumer}: effect: {message}")]
    Effect {
        /// Consumer name.
        consumer: String,
        /// What is wrong.
        message: String,
    },
    /// `[traces]` could not be started.
    #[error("{0}")]
    Traces(String),
    /// `[encryption]`'s keys could not be put in use.
    #[error("encryption: {0}")]
    Encryption(String),
}

/// The assembled application.
#[derive(Clone)]
pub struct App {
    /// Configuration in force.
    pub config: Arc<Config>,
    /// The claim store.
    pub store: Store,
    /// Where operators' searches, reports and ledger reads run: the primary, or the read
    /// replica of `[store] read_url`.
    pub reads: Reads,
    /// The claimer, holding the consumers.
    pub claimer: Arc<Claimer>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("claimer", &self.claimer)
            .finish_non_exhaustive()
    }
}

/// This instance's name: `[run] instance`, else `host-pid`.
pub fn instance_name(config: &Config) -> String {
    if !config.run.instance.is_empty() {
        return config.run.instance.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "claimd".into());
    format!("{host}-{}", std::process::id())
}

/// Builds the effect a consumer's configuration describes.
pub fn build_effect(consumer: &str, effect: &EffectConfig) -> Result<Arc<dyn Effect>, AppError> {
    let bad = |message: String| AppError::Effect {
        consumer: consumer.to_string(),
        message,
    };
    match effect {
        EffectConfig::Http(h) => Ok(Arc::new(
            HttpEffect::new(h).map_err(|e| bad(e.to_string()))?,
        )),
        #[cfg(feature = "smtp")]
        EffectConfig::Smtp(s) => Ok(Arc::new(
            SmtpEffect::new(s).map_err(|e| bad(e.to_string()))?,
        )),
        // Refused at load without the `smtp` feature (config::features).
        #[cfg(not(feature = "smtp"))]
        EffectConfig::Smtp(_) => Err(bad(crate::domain::features::missing("smtp"))),
        EffectConfig::Sql(q) => Ok(Arc::new(crate::provider::effect::sql::InTransaction(
            crate::provider::effect::sql::SqlEffect::new(q).map_err(|e| bad(e.to_string()))?,
        ))),
        EffectConfig::Custom(_) => Err(bad(
            "kind = \"custom\" needs the effect from the program that embeds claimd (WorkerBuilder::effect); `claimd run` has none".into(),
        )),
    }
}

/// What the embedding program gives instead of what the configuration describes.
#[derive(Default)]
pub struct Supplied {
    /// An open store, instead of opening `[store] url`.
    pub store: Option<Store>,
    /// Effects by consumer name, for consumers with `kind = "custom"`.
    pub effects: HashMap<String, Arc<dyn Effect>>,
}

impl App {
    /// Opens the store, applies migrations when `migrate`, and builds the consumers.
    pub async fn open(config: Config, migrate: bool) -> Result<App, AppError> {
        Self::open_with(config, migrate, Supplied::default()).await
    }

    /// [`App::open`], with a store and effects the embedding program supplies. Every
    /// `kind = "custom"` consumer needs an effect, and every effect a custom consumer.
    pub async fn open_with(
        config: Config,
        migrate: bool,
        mut supplied: Supplied,
    ) -> Result<App, AppError> {
        let unmatched = supplied.effects.keys().find(|name| {
            !matches!(config.consumer(name), Some(c) if matches!(c.effect, EffectConfig::Custom(_)))
        });
        if let Some(name) = unmatched {
            return Err(AppError::Effect {
                consumer: name.clone(),
                message:
                    "an effect was given for it, but no consumer of that name has kind = \"custom\""
                        .into(),
            });
        }
        if let Some(keys) = &config.encryption.keyring {
            crate::store::sealing::install(keys.clone()).map_err(AppError::Encryption)?;
        }
        let store = match supplied.store.take() {
            Some(store) => store,
            None => {
                store::open_through(
                    &config.store.url,
                    config.store.max_connections,
                    config.store.batch_writes,
                    config.store.pooler,
                )
                .await?
            }
        };
        if migrate {
            store.migrate().await?;
        }
        let reads = if config.store.read_url.is_empty() {
            Reads::primary(store.clone())
        } else {
            Reads::with_replica(
                store.clone(),
                &config.store.read_url,
                config.store.read_max_connections,
                config.store.read_fallback,
                config.store.pooler,
            )?
        };
        // Settles of consumers with an outcome destination write outcome events.
        store.set_outcome_destinations(
            config
                .consumers
                .iter()
                .flat_map(|c| {
                    c.outcomes
                        .iter()
                        .map(|o| (c.name.clone(), o.name().to_string()))
                })
                .collect(),
        );
        let traces = if config.traces.is_on() {
            Traces::start(&TracesSettings {
                endpoint: config.traces.endpoint.clone(),
                service_name: config.traces.service_name.clone(),
                instance: instance_name(&config),
                export_every: config.traces.export_every.0,
            })
            .map_err(|e| AppError::Traces(e.to_string()))?
        } else {
            Traces::off()
        };
        let mut consumers = Vec::new();
        for c in &config.consumers {
            let effect = match supplied.effects.remove(&c.name) {
                Some(effect) => effect,
                None => build_effect(&c.name, &c.effect)?,
            };
            let consumer =
                Consumer::new(c.clone(), effect).map_err(|message| AppError::Effect {
                    consumer: c.name.clone(),
                    message,
                })?;
            consumers.push(Arc::new(consumer));
        }
        let claimer = Arc::new(Claimer::new(
            store.clone(),
            consumers,
            instance_name(&config),
            config.http.intake_wait.0,
            traces,
        ));
        claimer
            .replication()
            .require_synchronous(config.store.require_synchronous_standby);
        Ok(App {
            config: Arc::new(config),
            store,
            reads,
            claimer,
        })
    }

    /// The sweeper's schedule period (readiness allows three).
    pub fn sweep_period(&self) -> Duration {
        schedule_period(&self.config.sweeper.schedule).unwrap_or(Duration::from_secs(10))
    }

    /// Names of the configured consumers.
    pub fn consumer_names(&self) -> Vec<String> {
        self.config.consumer_names()
    }
}
