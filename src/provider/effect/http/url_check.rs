//! What a message may put into the HTTP effect's URLs, checked at intake
//! ([`crate::provider::effect::Effect::check_message`]), again before each call (a claim stored before
//! the check existed) and before each lookup: no value may make a path segment `.`, `..` or
//! empty ([`url_segments`](crate::provider::effect::http_template::url_segments)).

use super::{RequestShape, SAMPLE};
use crate::provider::effect::http_template::url_segments::PathFields;
use crate::provider::effect::http_template::{Template, Vars, encode_path_segment, parse_payload};
use crate::provider::effect::{Incoming, Unusable};
use serde_json::Value;

/// The path segments of `effect.url` and `effect.status_url` that hold fields.
#[derive(Debug, Clone, Default)]
pub(super) struct UrlPaths {
    url: PathFields,
    status: PathFields,
}

/// Where `template`'s fields stand; `Err((key, why))` names the setting (`url`, `status_url`)
/// when one stands outside a path segment or a query value.
pub(super) fn paths_of(
    key: &'static str,
    template: &Template,
) -> Result<PathFields, (&'static str, String)> {
    PathFields::of(template).map_err(|e| (key, e.to_string()))
}

impl UrlPaths {
    /// Both URLs' path fields; `status` was checked with [`paths_of`] already.
    pub(super) fn new(url: PathFields, status: Option<&Template>) -> UrlPaths {
        UrlPaths {
            url,
            status: status
                .and_then(|t| PathFields::of(t).ok())
                .unwrap_or_default(),
        }
    }

    /// Both URLs' segments that hold fields, for the registry of enqueued messages.
    pub(super) fn registry(&self) -> Value {
        Value::Array(
            self.url
                .registry()
                .into_iter()
                .chain(self.status.registry())
                .collect(),
        )
    }

    /// Checks the call's URL before it is built; `Err` says why it is not sent.
    pub(super) fn check_url(&self, vars: &Vars<'_>) -> Result<(), String> {
        self.url.check(vars).map_err(|e| e.to_string())
    }

    /// The lookup's URL for `vars`, unless a value would send the lookup to another path
    /// (where a "found" would settle a claim by someone else's object).
    pub(super) fn status_url(
        &self,
        template: &Template,
        vars: &Vars<'_>,
    ) -> Result<String, String> {
        self.status
            .check(vars)
            .map_err(|e| format!("{e}; not asked"))?;
        template
            .render(vars, encode_path_segment)
            .map_err(|e| e.to_string())
    }
}

/// The payload parsed, when a template names payload fields, after rendering every template
/// with it (a missing field, a list where text is needed); `Err` is a sentence.
pub(super) fn payload_fields(
    shape: &RequestShape,
    payload: &[u8],
) -> Result<Option<Value>, String> {
    if !shape.needs_payload() {
        return Ok(None);
    }
    // Each key once: what an upstream validator checked is what is sent.
    let json = parse_payload(payload).map_err(|e| {
        format!(
            "the payload must be a JSON object with the fields the request template names, each key once ({e})"
        )
    })?;
    let vars = Vars {
        payload: Some(&json),
        ..SAMPLE
    };
    for t in shape.templates() {
        t.render(&vars, |s| s.to_string())
            .map_err(|e| e.to_string())?;
    }
    Ok(Some(json))
}

/// Intake's check of a message: its payload, then the path segments its ids and fields make
/// in the URL and the status URL.
pub(super) fn check_message(shape: &RequestShape, m: &Incoming<'_>) -> Result<(), Unusable> {
    let json = payload_fields(shape, m.payload).map_err(Unusable::Payload)?;
    let vars = Vars {
        key: m.key,
        message_id: m.message_id,
        tenant: m.tenant,
        consumer: m.consumer,
        payload: json.as_ref(),
    };
    shape.paths.url.check(&vars)?;
    shape.paths.status.check(&vars)?;
    Ok(())
}
