//! Layering: `CLAIMD__SECTION__KEY` environment overrides on the parsed TOML, then `${VAR}`
//! expansion inside string values.

use std::collections::BTreeMap;

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `SECTION__KEY` (or `CONSUMERS__0__EFFECT__TIMEOUT`) = raw value.
pub(super) fn apply_override(root: &mut toml::Value, path: &str, raw: &str) -> Result<(), String> {
    let segments: Vec<String> = path.split("__").map(|s| s.to_ascii_lowercase()).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err("empty path segment".into());
    }
    let mut node = root;
    for (n, seg) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        node = match node {
            toml::Value::Table(t) => {
                if last {
                    t.insert(seg.clone(), parse_scalar(raw));
                    return Ok(());
                }
                // A list entry cannot be made up from the environment: its index must exist.
                let next_is_index = segments
                    .get(n + 1)
                    .is_some_and(|s| s.parse::<usize>().is_ok());
                if next_is_index && !t.contains_key(seg) {
                    return Err(format!(
                        "there is no {seg}[{}] in the file to override (entries of a list come from the file)",
                        segments[n + 1]
                    ));
                }
                t.entry(seg.clone())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            }
            toml::Value::Array(a) => {
                let idx: usize = seg
                    .parse()
                    .map_err(|_| format!("{seg:?} is not an index into a list"))?;
                let len = a.len();
                let slot = a
                    .get_mut(idx)
                    .ok_or_else(|| format!("index {idx} is past the {len} entries"))?;
                if last {
                    *slot = parse_scalar(raw);
                    return Ok(());
                }
                slot
            }
            _ => return Err(format!("{seg:?} is inside a value that is not a table")),
        };
    }
    Ok(())
}

/// The dotted key an override sets, as configuration errors name it:
/// `CONSUMERS__0__LEASE` → `consumers[0].lease`.
pub(super) fn key_of(path: &str) -> String {
    let mut key = String::new();
    for seg in path.split("__").map(str::to_ascii_lowercase) {
        if seg.parse::<usize>().is_ok() {
            key.push_str(&format!("[{seg}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(&seg);
        }
    }
    key
}

/// An override is read as a TOML value when it is one (`64`, `true`), else as a string.
pub(super) fn parse_scalar(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// Expands `${VAR}` and `${VAR:-default}` inside every string value. In a provider's URL or
/// header (see [`must_be_set`]) a `${VAR}` without a default that is unset or empty is an error
/// (the first one is returned as `(key, message)`): it would send `Bearer ` with nothing after
/// it to a payments provider. Elsewhere it only warns (an empty admin token is a valid choice).
pub(super) fn expand_vars(
    value: &mut toml::Value,
    env: &BTreeMap<String, String>,
    at: &mut String,
    warnings: &mut Vec<String>,
) -> Result<(), (String, String)> {
    match value {
        toml::Value::String(s) if s.contains("${") => {
            *s = expand_string(s, env, at, warnings)?;
        }
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                let len = at.len();
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(k);
                let expanded = expand_vars(v, env, at, warnings);
                at.truncate(len);
                expanded?;
            }
        }
        toml::Value::Array(a) => {
            for (i, v) in a.iter_mut().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                let expanded = expand_vars(v, env, at, warnings);
                at.truncate(len);
                expanded?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether the value at dotted key `at` goes to a provider in a URL or a header
/// (`consumers[0].effect.url`, `.status_url`, `.ledger.url`, `.headers.Authorization`), where an unset
/// secret must stop the start instead of being sent empty.
pub(super) fn must_be_set(at: &str) -> bool {
    let Some((_, rest)) = at.split_once("].effect.") else {
        return false;
    };
    at.starts_with("consumers[")
        && (rest == "url"
            || rest == "status_url"
            || rest == "ledger.url"
            || rest.starts_with("headers."))
}

/// Whether the value at dotted key `at` is a signing secret (a provider event's
/// `consumers[0].provider_events.secrets[0]`, an outcome webhook's `consumers[0].outcomes.secret`):
/// needed only by the commands that receive or send those.
pub(super) fn is_signing_secret(at: &str) -> bool {
    let Some((_, rest)) = at.split_once("].") else {
        return false;
    };
    at.starts_with("consumers[")
        && (rest.starts_with("provider_events.secrets[")
            || rest == "outcomes.secret"
            || (rest.starts_with("outcomes[") && rest.ends_with("].secret")))
}

/// What stands in for an unset signing secret in a command that uses none: valid for every
/// scheme (`whsec_` + base64) and different for each key, so the checks that refuse a shared
/// or malformed secret pass without a value that would ever be used.
fn placeholder_secret(at: &str) -> String {
    use base64::Engine as _;
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(format!("claimd-unset:{at}"))
    )
}

/// The environment variables `[store] url` comes from, after the overrides: the
/// `CLAIMD__...` one that set it, and each `${VAR}` of its text that is set (one not set
/// leaves the URL to its default, which a variable in another shell would change).
pub(super) fn store_url_vars(
    value: &toml::Value,
    from_env: &[(String, String)],
    env: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut names: Vec<String> = from_env
        .iter()
        .filter(|(key, _)| key == "store.url" || key == "store")
        .map(|(_, var)| var.clone())
        .collect();
    let url = value
        .get("store")
        .and_then(|s| s.get("url"))
        .and_then(toml::Value::as_str)
        .unwrap_or("");
    let mut rest = url;
    while let Some(start) = rest.find("${") {
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        let inner = &rest[start + 2..start + end];
        let name = inner.split_once(":-").map_or(inner, |(n, _)| n);
        if env.get(name).is_some_and(|v| !v.is_empty()) && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        rest = &rest[start + end + 1..];
    }
    names
}

/// A pseudo variable (no real one can hold a NUL) in the environment given to
/// [`expand_string`]: the command calls no provider, so an unset provider secret is no error.
pub(super) const NO_PROVIDER_CALLS: &str = "\0claimd:no-provider-calls";

pub(super) fn expand_string(
    s: &str,
    env: &BTreeMap<String, String>,
    at: &str,
    warnings: &mut Vec<String>,
) -> Result<String, (String, String)> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let inner = &rest[start + 2..start + end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (env.get(name).filter(|v| !v.is_empty()), default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
            // A command that calls no provider (report, claims ...): the value goes nowhere.
            (None, None) if must_be_set(at) && env.contains_key(NO_PROVIDER_CALLS) => {
                out.push_str("unset");
            }
            (None, None) if is_signing_secret(at) && env.contains_key(NO_PROVIDER_CALLS) => {
                out.push_str(&placeholder_secret(at));
            }
            (None, None) if must_be_set(at) => {
                return Err((
                    at.to_string(),
                    format!(
                        "${{{name}}} is not set (or empty): the provider would get an empty value; set {name}, or write a default explicitly (${{{name}:-}} for an empty one)"
                    ),
                ));
            }
            (None, None) => {
                // An empty admin token is a valid "no auth" choice, so only warn.
                warnings.push(format!(
                    "{at}: ${{{name}}} is not set; using an empty value"
                ));
            }
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    const STRIPE: &str = include_str!("../../config/examples/stripe.toml");

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_command_calling_no_provider_reads_the_stripe_example_without_its_secrets() {
        let path = Path::new("stripe.toml");
        let read_only = env(&[(NO_PROVIDER_CALLS, "")]);
        let loaded = Config::from_toml(STRIPE, path, read_only).expect("loads without secrets");
        let pe = loaded.config.consumers[0].provider_events.as_ref().unwrap();
        // A stand-in that is no one's secret, never an empty one.
        assert!(pe.secrets[0].starts_with("whsec_"), "{:?}", pe.secrets);
        // Without the marker, the missing webhook secret still stops the start.
        let e = Config::from_toml(STRIPE, path, env(&[("STRIPE_SECRET_KEY", "sk")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("provider_events.secrets"), "{e}");
        let e = Config::from_toml(STRIPE, path, env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("STRIPE_SECRET_KEY"), "{e}");
    }

    #[test]
    fn signing_secrets_are_told_apart_from_other_values() {
        assert!(is_signing_secret("consumers[0].provider_events.secrets[1]"));
        assert!(is_signing_secret("consumers[2].outcomes.secret"));
        assert!(is_signing_secret("consumers[2].outcomes[1].secret"));
        assert!(!is_signing_secret("http.admin_token"));
        assert!(!is_signing_secret("consumers[0].effect.url"));
        assert_ne!(
            placeholder_secret("consumers[0].provider_events.secrets[0]"),
            placeholder_secret("consumers[1].provider_events.secrets[0]")
        );
    }

    #[test]
    fn the_store_url_names_the_variables_it_came_from() {
        let path = Path::new("c.toml");
        let text = "[store]\nurl = \"${DB_URL:-sqlite://a.db}\"\n";
        let from = |pairs: &[(&str, &str)]| {
            Config::from_toml(text, path, env(pairs))
                .unwrap()
                .config
                .store_url_from
        };
        assert!(from(&[]).is_empty(), "the default: nothing to carry");
        assert_eq!(from(&[("DB_URL", "sqlite://b.db")]), ["DB_URL"]);
        assert_eq!(
            from(&[("CLAIMD__STORE__URL", "sqlite://c.db")]),
            ["CLAIMD__STORE__URL"]
        );
    }
}
