//! A consumer's capacity at run time: how many provider calls may run ([`Consumer::slot`]),
//! how many deliveries may be claimed ahead of them, what an effect holds while it runs
//! ([`Slot`]), and the time budget of one attempt ([`Hold`]).

use crate::config::ConsumerConfig;
use crate::domain::claim::KeyTemplate;
use crate::domain::order_key::OrderKeyTemplate;
use crate::engine::destination::Destination;
use crate::engine::key_pace::{DEFAULT_KEYS, KeyPaces};
use crate::engine::policy;
use crate::provider::effect::Effect;
use crate::provider::provider_events::ProviderEvents;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A consumer at run time: its configuration, key template, effect and in-flight limit.
pub struct Consumer {
    /// `[[consumers]]` entry.
    pub config: ConsumerConfig,
    /// Parsed `key` template.
    pub template: KeyTemplate,
    /// The side effect.
    pub effect: Arc<dyn Effect>,
    /// The provider's health and pace: every call and lookup passes through it.
    pub destination: Arc<Destination>,
    /// The provider's signed events, when the consumer takes them.
    pub provider_events: Option<Arc<ProviderEvents>>,
    /// Parsed `order_key`, when the consumer orders its claims (docs/flow-control.md).
    pub order_key: Option<OrderKeyTemplate>,
    /// `effect.rate_limit_key`: each key's own pace (docs/flow-control.md).
    pub rate_key: Option<RateKey>,
    /// Wakes the consumer's pickup ([`crate::engine::enqueued`]): a claim joined a line, or
    /// one left the head of its line.
    pickup: Arc<Notify>,
    /// Provider calls in flight (`concurrency`).
    slots: Arc<Semaphore>,
    /// Deliveries being claimed, or claimed and waiting for a call slot (also `concurrency`):
    /// intake's bound, so the next claims commit while the current calls run.
    intake: Arc<Semaphore>,
    settling: Arc<AtomicUsize>,
}

/// A consumer's `effect.rate_limit_key`: the template and each key's pace.
#[derive(Debug)]
pub struct RateKey {
    /// The key template.
    pub template: OrderKeyTemplate,
    /// The keys' paces.
    pub paces: KeyPaces,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// Builds a consumer; the template must already have been validated by the config.
    pub fn new(config: ConsumerConfig, effect: Arc<dyn Effect>) -> Result<Self, String> {
        let template: KeyTemplate = config
            .key
            .parse()
            .map_err(|e| format!("consumer {}: key: {e}", config.name))?;
        let slots = Arc::new(Semaphore::new(config.concurrency as usize));
        let intake = Arc::new(Semaphore::new(config.concurrency as usize));
        let (ceiling, rate_key, rate_keys) = config.effect.rate_limits();
        // With a key template the ceiling is each key's, and the consumer's own pace only
        // learns from outages (a key's 429 slows that key alone).
        let rate_key = match (rate_key, ceiling) {
            (Some(t), Some(per_key)) => {
                let template: OrderKeyTemplate = t
                    .parse()
                    .map_err(|e| format!("consumer {}: effect.rate_limit_key: {e}", config.name))?;
                let paces = KeyPaces::new(per_key, rate_keys.unwrap_or(DEFAULT_KEYS));
                Some(RateKey {
                    template: template.for_setting("effect.rate_limit_key"),
                    paces,
                })
            }
            _ => None,
        };
        let ceiling = ceiling.filter(|_| rate_key.is_none());
        let provider_events = match &config.provider_events {
            Some(pe) => Some(Arc::new(ProviderEvents::new(pe.clone()).map_err(|e| {
                format!("consumer {}: provider_events.secrets: {e}", config.name)
            })?)),
            None => None,
        };
        let order_key = match &config.flow.order_key {
            Some(t) => Some(
                t.parse()
                    .map_err(|e| format!("consumer {}: order_key: {e}", config.name))?,
            ),
            None => None,
        };
        Ok(Consumer {
            destination: Arc::new(Destination::new(ceiling)),
            provider_events,
            order_key,
            rate_key,
            pickup: Arc::new(Notify::new()),
            config,
            template,
            effect,
            slots,
            intake,
            settling: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Wakes the consumer's pickup now (or its next wait, when it is taking).
    pub fn wake_pickup(&self) {
        self.pickup.notify_one();
    }

    /// What wakes the consumer's pickup.
    pub(crate) fn pickup_bell(&self) -> Arc<Notify> {
        self.pickup.clone()
    }

    /// Whether its pickup takes waiting claims in another order than oldest first: by their
    /// order keys' lines, or fairly across tenants.
    pub fn takes_in_order(&self) -> bool {
        self.order_key.is_some() || self.config.flow.fairness == crate::config::Fairness::Tenant
    }

    /// Waits for an in-flight slot (one provider call).
    pub async fn slot(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("consumer semaphore closed")
    }

    /// A free call slot, if one is free now.
    pub fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Waits for an intake place (one delivery being claimed or waiting for a call slot).
    pub(crate) async fn intake_place(&self) -> OwnedSemaphorePermit {
        self.intake
            .clone()
            .acquire_owned()
            .await
            .expect("consumer semaphore closed")
    }

    /// A free intake place, if one is free now (the pickup's claims taken ahead of a slot).
    pub(crate) fn try_intake_place(&self) -> Option<OwnedSemaphorePermit> {
        self.intake.clone().try_acquire_owned().ok()
    }

    /// Whether intake claims ahead of a free call slot ([`policy::claims_ahead`]).
    pub fn claims_ahead(&self) -> bool {
        policy::claims_ahead(self.config.on_unknown, self.effect.can_reconcile())
    }

    /// Deliveries being claimed or waiting for a call slot now.
    pub fn queued(&self) -> usize {
        self.config.concurrency as usize - self.intake.available_permits()
    }

    /// Effects in flight now.
    pub fn in_flight(&self) -> usize {
        self.config.concurrency as usize - self.slots.available_permits()
    }

    /// Effects whose provider call is over and whose outcome is being written.
    pub fn settling(&self) -> usize {
        self.settling.load(Ordering::SeqCst)
    }
}

/// What intake holds while it claims: an intake place (claims ahead) or the call slot itself.
pub(crate) enum Admission {
    Place(OwnedSemaphorePermit),
    Slot(OwnedSemaphorePermit),
}

/// An effect's hold on its consumer's capacity: the in-flight slot while the provider is
/// called, then a place in the consumer's settling count while the outcome
/// is written. The slot is handed back before the settle so that a slow commit does not keep
/// the next message from its call: `concurrency` bounds provider calls, as a handler that calls
/// the provider directly would be bounded; the settles waiting behind it are bounded by the
/// batcher and counted, so a graceful shutdown still waits for them.
pub struct Slot {
    /// The call slot, until the provider has answered.
    permit: Option<OwnedSemaphorePermit>,
    /// The consumer's settling count (`None` for a slot-less caller).
    settling: Option<Arc<AtomicUsize>>,
}

impl Slot {
    /// A slot taken at intake.
    pub fn held(permit: OwnedSemaphorePermit, consumer: &Consumer) -> Self {
        Slot {
            permit: Some(permit),
            settling: Some(consumer.settling.clone()),
        }
    }

    /// No slot of its own (the caller, e.g. the sweeper, bounds its work itself).
    pub fn none() -> Self {
        Slot {
            permit: None,
            settling: None,
        }
    }

    /// The provider call is over: free the slot, count the settle. The settle is counted
    /// exactly while `permit` is gone and `settling` is set.
    pub(crate) fn release_for_settle(&mut self) {
        if let Some(s) = &self.settling
            && self.permit.take().is_some()
        {
            s.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.permit.is_none()
            && let Some(s) = &self.settling
        {
            s.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A worker's hold on a claim: when its lease began, on this machine's monotonic clock
/// (taken before the statement that set the lease, so never later than the database's), and
/// how old the claim was then (database clock).
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    /// When the lease began, locally.
    pub since: Instant,
    /// The claim's age (since it was received) at `since`.
    pub age: Duration,
    /// The claim carries the "not called yet" marker whatever its consumer's policy (an
    /// enqueued claim): it is cleared, fenced, before the first call.
    pub not_called: bool,
}

impl Hold {
    /// A hold on a claim being made now.
    pub fn fresh() -> Self {
        Hold {
            since: Instant::now(),
            age: Duration::ZERO,
            not_called: false,
        }
    }

    /// A hold on an enqueued claim whose lease began `since` (taken before the statement),
    /// `age` after it was enqueued; `not_called`: it still carries the "not called yet"
    /// marker (the take did not clear it).
    pub fn enqueued(since: Instant, age: Duration, not_called: bool) -> Self {
        Hold {
            since,
            age,
            not_called,
        }
    }

    /// The claim's age now.
    pub fn age_now(&self) -> Duration {
        self.age + self.since.elapsed()
    }

    /// The last moment a call may start and still end before the lease does.
    pub fn call_deadline(&self, cfg: &ConsumerConfig) -> Instant {
        self.since + cfg.lease.0.saturating_sub(cfg.effect.timeout())
    }
}
