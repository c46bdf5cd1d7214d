//! The shipped paging rules (docs/alerts.yml, `severity: page`) evaluated against a live
//! worker's `/metrics` about once a second during the send phase and the final drain. A rule
//! pages once its condition has held at every scrape for its `for:` duration (as Prometheus
//! does); each page is recorded with the scraped `claimd_stuck_claims` of its consumer. A page
//! about stuck or old claims while that consumer has no stuck claim is a false page.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What the alert scraper saw in one run.
#[derive(Debug, Clone, Default)]
pub struct AlertCheck {
    /// `/metrics` answers evaluated.
    pub scrapes: usize,
    /// Of those, answers with a `claimd_stuck_claims{consumer=...}` sample (the scraper reads
    /// what the rules read).
    pub readable: usize,
    /// Pages fired (an alert and consumer whose condition held for its `for:`), counted once
    /// per episode.
    pub pages: usize,
    /// Of those, pages about stuck or old claims while the consumer had no stuck claim.
    pub false_pages: usize,
    /// Scrapes at which a paging condition held (its `for:` not yet run out, or run out).
    pub held: usize,
    /// Each page: (alert, consumer, stuck claims, the scrape's values of the rule's metrics).
    pub fired: Vec<(String, String, f64, String)>,
}

/// One paging rule of the shape `max by (consumer) (metric) > n [and ...]`.
struct Rule {
    alert: String,
    parts: Vec<(String, f64)>,
    hold_for: Duration,
}

/// The value of each `name{consumer="..."} value` sample, by consumer.
fn by_consumer(metrics: &str, name: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix("{consumer=\""))
        .filter_map(|rest| {
            let (consumer, rest) = rest.split_once('"')?;
            let value = rest.rsplit(' ').next()?.parse().ok()?;
            Some((consumer.to_string(), value))
        })
        .collect()
}

/// `2m`, `5m`, `1h`, `30s` (the durations docs/alerts.yml uses).
fn duration(s: &str) -> Option<Duration> {
    let (n, unit) = s.split_at(s.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(Duration::from_secs(match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return None,
    }))
}

/// The paging rules of docs/alerts.yml whose expression is one or more
/// `max by (consumer) (metric) > n` joined by `and` (the claim rules). The sweeper rule
/// (`time() - ...`) has no consumer and says nothing about claims: it is left out.
fn paging_rules() -> Vec<Rule> {
    let rules =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/alerts.yml")).unwrap();
    // (alert, expression, severity, for) from the YAML's few shapes (`expr: ...` or `expr: |`).
    let mut parsed: Vec<(String, String, String, Duration)> = Vec::new();
    let mut in_expr = false;
    for line in rules.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert: ") {
            parsed.push((name.into(), String::new(), String::new(), Duration::ZERO));
            in_expr = false;
        } else if let Some(e) = t.strip_prefix("expr: ") {
            in_expr = e == "|";
            if !in_expr && let Some(r) = parsed.last_mut() {
                r.1 = e.to_string();
            }
        } else if let Some(s) = t.strip_prefix("severity: ") {
            in_expr = false;
            if let Some(r) = parsed.last_mut() {
                r.2 = s.to_string();
            }
        } else if let Some(d) = t.strip_prefix("for: ") {
            in_expr = false;
            if let Some(r) = parsed.last_mut() {
                r.3 = duration(d).unwrap_or_else(|| panic!("alerts.yml: bad `for: {d}`"));
            }
        } else if in_expr && line.starts_with("          ") {
            if let Some(r) = parsed.last_mut() {
                r.1.push(' ');
                r.1.push_str(t);
            }
        } else {
            in_expr = false;
        }
    }
    let mut out = Vec::new();
    for (alert, expr, severity, hold_for) in parsed {
        if severity != "page" {
            continue;
        }
        // Each part: `max by (consumer) (metric) > n`, in parentheses or not.
        let parts: Option<Vec<(String, f64)>> = expr
            .split(" and ")
            .map(|p| {
                let p = p.trim().trim_start_matches('(').trim_end_matches(')');
                let rest = p.strip_prefix("max by (consumer) (")?;
                let (metric, rest) = rest.split_once(')')?;
                let n = rest.trim().strip_prefix('>')?.trim().trim_end_matches(')');
                Some((metric.to_string(), n.parse().ok()?))
            })
            .collect();
        if let Some(parts) = parts {
            out.push(Rule {
                alert,
                parts,
                hold_for,
            });
        }
    }
    assert!(
        out.iter()
            .any(|r| r.parts.iter().any(|(m, _)| m == "claimd_stuck_claims")),
        "docs/alerts.yml has no paging rule on claimd_stuck_claims the scraper can read"
    );
    out
}

/// Scrapes one live worker (the first of `ports` that answers) about once a second until
/// `stop` is set, and evaluates the paging rules at each scrape.
pub(super) fn start(ports: Vec<u16>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<AlertCheck> {
    tokio::spawn(async move {
        let rules = paging_rules();
        let c = claimd::provider::tls::http_client_builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let mut out = AlertCheck::default();
        // Since when each (rule, consumer) condition has held; whether it has paged.
        let mut since: HashMap<(usize, String), (Instant, bool)> = HashMap::new();
        while !stop.load(Ordering::SeqCst) {
            let tick = Instant::now();
            let mut metrics = None;
            for p in &ports {
                let Ok(r) = c.get(format!("http://127.0.0.1:{p}/metrics")).send().await else {
                    continue;
                };
                if r.status().is_success()
                    && let Ok(t) = r.text().await
                {
                    metrics = Some(t);
                    break;
                }
            }
            // No worker answered (all restarting): the conditions' state carries over, as a
            // missed scrape does in Prometheus.
            if let Some(m) = metrics {
                out.scrapes += 1;
                evaluate(&rules, &m, &mut since, &mut out);
            }
            tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
        }
        out
    })
}

/// One evaluation: conditions that stopped holding reset; those that held for their `for:`
/// page once per episode.
fn evaluate(
    rules: &[Rule],
    metrics: &str,
    since: &mut HashMap<(usize, String), (Instant, bool)>,
    out: &mut AlertCheck,
) {
    let stuck = by_consumer(metrics, "claimd_stuck_claims");
    if !stuck.is_empty() {
        out.readable += 1;
    }
    let mut holding = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let values: Vec<BTreeMap<String, f64>> = rule
            .parts
            .iter()
            .map(|(m, _)| by_consumer(metrics, m))
            .collect();
        for consumer in values[0].keys() {
            let holds = rule
                .parts
                .iter()
                .zip(&values)
                .all(|((_, n), v)| v.get(consumer).is_some_and(|x| x > n));
            if !holds {
                continue;
            }
            out.held += 1;
            let key = (i, consumer.clone());
            holding.push(key.clone());
            let (from, paged) = since.entry(key).or_insert((Instant::now(), false));
            if !*paged && from.elapsed() >= rule.hold_for {
                *paged = true;
                let s = stuck.get(consumer).copied().unwrap_or(0.0);
                out.pages += 1;
                if s == 0.0 {
                    out.false_pages += 1;
                }
                let shown = rule
                    .parts
                    .iter()
                    .zip(&values)
                    .map(|((m, _), v)| format!("{m}={}", v.get(consumer).unwrap_or(&0.0)))
                    .collect::<Vec<_>>()
                    .join(" ");
                out.fired
                    .push((rule.alert.clone(), consumer.clone(), s, shown));
            }
        }
    }
    since.retain(|k, _| holding.contains(k));
}
