//! Settings that need a part of claimd this build left out (Cargo features `amqp`, `nats`, `smtp`):
//! refused when the file is loaded, naming the key and the feature, rather than failing later.

use super::{Config, EffectConfig, OutcomeKind};

/// The first setting of `config` that needs a feature this build does not have.
pub(super) fn check(config: &Config) -> Result<(), (String, String)> {
    for (i, c) in config.consumers.iter().enumerate() {
        if c.amqp().is_some() && !cfg!(feature = "amqp") {
            return Err((
                format!("consumers[{i}].source"),
                needs("source = \"amqp\"", "amqp"),
            ));
        }
        if c.nats().is_some() && !cfg!(feature = "nats") {
            return Err((
                format!("consumers[{i}].source"),
                needs("source = \"nats\"", "nats"),
            ));
        }
        if matches!(c.effect, EffectConfig::Smtp(_)) && !cfg!(feature = "smtp") {
            return Err((
                format!("consumers[{i}].effect.kind"),
                needs("kind = \"smtp\"", "smtp"),
            ));
        }
        let amqp_outcomes = c
            .outcomes
            .as_ref()
            .is_some_and(|o| o.kind == OutcomeKind::Amqp);
        if amqp_outcomes && !cfg!(feature = "amqp") {
            return Err((
                format!("consumers[{i}].outcomes.kind"),
                needs("kind = \"amqp\"", "amqp"),
            ));
        }
    }
    Ok(())
}

fn needs(setting: &str, feature: &str) -> String {
    format!(
        "{setting} needs claimd built with the `{feature}` Cargo feature (this build has it off)"
    )
}
