//! The limits of `[consumers.provider_events]` checked at load: how old a signed delivery may
//! be (`tolerance`, bounded so a recorded event id always outlives the window in which its
//! delivery can be replayed) and how large its body (`max_body_bytes`, within the
//! `[http] provider_event_budget_bytes` all event bodies share).

use super::{Config, HttpConfig, ProviderEventsConfig};
use crate::domain::duration::Dur;
use std::time::Duration;

/// The longest `provider_events.tolerance` accepted: providers sign at delivery time (Stripe's
/// libraries default to 5 minutes), so more only widens the window for a captured delivery.
pub const MAX_EVENT_TOLERANCE: Duration = Duration::from_secs(3600);

impl ProviderEventsConfig {
    /// The largest event body taken: `max_body_bytes`, within `[http] max_body_bytes` (which the
    /// listener enforces on every request first).
    pub fn body_limit(&self, http: &HttpConfig) -> usize {
        self.max_body_bytes.min(http.max_body_bytes)
    }
}

/// The signing secret the shipped configuration gives the sandbox's events when
/// `CLAIMD_SANDBOX_WEBHOOK_SECRET` is not set; refused for a provider elsewhere.
pub const SANDBOX_WEBHOOK_SECRET: &str = "sandbox-only-not-a-secret";

/// Whether an effect calls an HTTP provider on a loopback address.
fn calls_loopback(effect: &crate::provider::effect::settings::EffectConfig) -> bool {
    let crate::provider::effect::settings::EffectConfig::Http(http) = effect else {
        return false;
    };
    let Some(host) = reqwest::Url::parse(&http.url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
    else {
        return false;
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Checks consumer `i`'s `pe` against the rest of `config`: `Err((key, why))`.
pub(super) fn check_event_limits(
    i: usize,
    pe: &ProviderEventsConfig,
    config: &Config,
) -> Result<(), (String, String)> {
    let key = |k: &str| format!("consumers[{i}].provider_events.{k}");
    let tolerance = pe.tolerance.0;
    if tolerance < Duration::from_secs(1) {
        return Err((key("tolerance"), "must be at least 1s".into()));
    }
    if tolerance > MAX_EVENT_TOLERANCE {
        return Err((
            key("tolerance"),
            format!(
                "{} is over the bound of {}: a captured delivery could be replayed that long after it was signed",
                pe.tolerance,
                Dur(MAX_EVENT_TOLERANCE)
            ),
        ));
    }
    // A delivery is taken from `tolerance` before its timestamp to `tolerance` after it, so a
    // replay can come up to twice the tolerance after the first delivery recorded its id;
    // retention prunes recorded ids after `keep_terminal_for`.
    let keep = config.retention.keep_terminal_for;
    if keep.0 <= tolerance.saturating_mul(2) {
        return Err((
            key("tolerance"),
            format!(
                "{} needs retention.keep_terminal_for ({keep}) to be more than twice it ({}): recorded event ids are pruned after keep_terminal_for, and a replay is taken up to twice the tolerance after the first delivery; it would be applied again",
                pe.tolerance,
                Dur(tolerance.saturating_mul(2))
            ),
        ));
    }
    // The default configuration's secret is written in it for the sandbox: anyone could sign
    // with it. Taken only for a provider on this machine.
    if pe.secrets.iter().any(|s| s == SANDBOX_WEBHOOK_SECRET)
        && !calls_loopback(&config.consumers[i].effect)
    {
        return Err((
            key("secrets"),
            format!(
                "{SANDBOX_WEBHOOK_SECRET:?} is the sandbox's published secret and this consumer calls a provider that is not on this machine: anyone could sign events with it; set the provider's own signing secret"
            ),
        ));
    }
    if pe.max_body_bytes == 0 {
        return Err((key("max_body_bytes"), "must be at least 1".into()));
    }
    let budget = config.http.provider_event_budget_bytes;
    let limit = pe.body_limit(&config.http);
    if budget < limit {
        return Err((
            "http.provider_event_budget_bytes".into(),
            format!(
                "{budget} is smaller than {} {limit}: an event of the largest allowed size could never be admitted",
                key("max_body_bytes")
            ),
        ));
    }
    Ok(())
}
