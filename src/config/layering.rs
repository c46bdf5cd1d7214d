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

/// An override is read as a TOML value when it is one (`64`, `true`), else as a string.
pub(super) fn parse_scalar(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// Expands `${VAR}` and `${VAR:-default}` inside every string value.
pub(super) fn expand_vars(
    value: &mut toml::Value,
    env: &BTreeMap<String, String>,
    at: &mut String,
    warnings: &mut Vec<String>,
) {
    match value {
        toml::Value::String(s) if s.contains("${") => {
            *s = expand_string(s, env, at, warnings);
        }
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                let len = at.len();
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(k);
                expand_vars(v, env, at, warnings);
                at.truncate(len);
            }
        }
        toml::Value::Array(a) => {
            for (i, v) in a.iter_mut().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                expand_vars(v, env, at, warnings);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

pub(super) fn expand_string(
    s: &str,
    env: &BTreeMap<String, String>,
    at: &str,
    warnings: &mut Vec<String>,
) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &rest[start + 2..start + end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (env.get(name), default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
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
    out
}
