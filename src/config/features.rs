//! Settings that need a part of claimd this build left out (Cargo features `amqp`, `nats`, `smtp`, `otlp`):
//! refused when the file is loaded, naming the key and the feature, rather than failing later.

use super::{Config, EffectConfig, OutcomeKind};

/// The first setting of `config` that needs a feature this build does not have.
pub(super) fn check(config: &Config) -> Result<(), (String, String)> {
    if config.traces.is_on() && !cfg!(feature = "otlp") {
        return Err(("traces.endpoint".into(), needs("[traces] endpoint", "otlp")));
    }
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
        for (j, o) in c.outcomes.iter().enumerate() {
            let feature = match o.kind {
                OutcomeKind::Amqp if !cfg!(feature = "amqp") => "amqp",
                OutcomeKind::Nats if !cfg!(feature = "nats") => "nats",
                _ => continue,
            };
            let key = if c.outcomes.len() == 1 {
                format!("consumers[{i}].outcomes.kind")
            } else {
                format!("consumers[{i}].outcomes[{j}].kind")
            };
            return Err((key, needs(&format!("kind = \"{feature}\""), feature)));
        }
    }
    Ok(())
}

fn needs(setting: &str, feature: &str) -> String {
    format!(
        "{setting} needs claimd built with the `{feature}` Cargo feature (this build has it off): \
         `{}`, or `--features full` for every part",
        crate::domain::features::build_with(feature)
    )
}
