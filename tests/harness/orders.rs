//! Order lines, schedules and cancels in the run: a second HTTP consumer, `orders`, with
//! `order_key = "{order_id}"` and `order_hold = "hold"`, fed with several messages per order
//! id (a charge, then refunds and captures), some scheduled a little ahead (`Not-Before`), some
//! of those cancelled before their time. The messages of one order are sent one after the
//! other, each once the one before it is acknowledged, so claim ids follow the order's line.
//! Checked at the end from the sandbox's record of what it applied and when, and the store.

use super::*;
use claimd::domain::claim::{Claim, ClaimState};

/// One message of an order.
#[derive(Clone, Debug)]
pub(super) struct Step {
    pub(super) id: String,
    pub(super) body: String,
    /// Sent with `Not-Before` this far ahead of its first send.
    pub(super) delay: Option<Duration>,
    /// Cancelled this long after it was acknowledged (scheduled steps only).
    pub(super) cancel_after: Option<Duration>,
}

/// The messages of one order id of one tenant, in the order they are sent.
#[derive(Clone, Debug)]
pub(super) struct Order {
    /// `""` for none.
    pub(super) tenant: &'static str,
    pub(super) steps: Vec<Step>,
    /// Sends this step again (a duplicate) after the last one.
    pub(super) repeat: Option<usize>,
}

/// The orders of a run, from its seed: `n` order ids, each a charge and one to three
/// refunds or captures; about a third of the later messages scheduled 0.5–3 s ahead, and
/// about 40% of those cancelled before their time. One order in ten is also sent by a second
/// tenant (same order id, message ids and bodies: a line of its own); one in seven sends one
/// of its messages again at the end.
pub(super) fn plan(seed: u64, n: usize) -> Vec<Order> {
    let mut r = rng(seed ^ 0x04d3);
    let mut orders: Vec<Order> = Vec::new();
    for o in 0..n {
        let steps = {
            let order_id = format!("ord-{seed}-{o}");
            let mut steps = Vec::new();
            for k in 0..1 + r.usize(1..=3) {
                let op = match k {
                    0 => "charge",
                    k if k % 2 == 1 => "refund",
                    _ => "capture",
                };
                let delay =
                    (k > 0 && r.f64() < 0.35).then(|| Duration::from_millis(r.u64(500..3000)));
                let cancel_after = delay
                    .filter(|_| r.f64() < 0.4)
                    .map(|d| Duration::from_millis(r.u64(0..d.as_millis() as u64 / 2)));
                steps.push(Step {
                    id: format!("o{seed}-{o}-{k}"),
                    body: format!(
                        "{{\"order_id\":\"{order_id}\",\"op\":\"{op}\",\"amount\":{}}}",
                        r.u32(1..100_000)
                    ),
                    delay,
                    cancel_after,
                });
            }
            steps
        };
        let repeat = (r.f64() < 0.15).then(|| r.usize(0..steps.len()));
        let tenants: &[&'static str] = if r.f64() < 0.1 {
            &["acme", "globex"]
        } else {
            &[""]
        };
        for tenant in tenants {
            orders.push(Order {
                tenant,
                steps: steps.clone(),
                repeat,
            });
        }
    }
    // Orders of different ids interleave, as traffic arrives (seeded).
    r.shuffle(&mut orders);
    orders
}

/// What the order clients did.
#[derive(Default)]
pub(super) struct OrderSends {
    /// Messages sent (each acknowledged in the end).
    pub(super) messages: AtomicUsize,
    pub(super) scheduled: AtomicUsize,
    /// Messages sent again once acknowledged (each answered `200`, a duplicate).
    pub(super) repeats: AtomicUsize,
    /// Cancels answered `200` (tenant, message id), and `409` "too late".
    pub(super) cancelled: Mutex<HashSet<(String, String)>>,
    pub(super) too_late: AtomicUsize,
}

/// Sends every order over HTTP from `clients` tasks, paced so the orders spread over `span`;
/// acknowledged messages go into the ledger's `acked`. Returns once every message is
/// acknowledged and every cancel answered.
pub(super) async fn drive(
    orders: Vec<Order>,
    ports: Vec<u16>,
    ledger: Arc<Ledger>,
    clients: usize,
    span: Duration,
    share: LedgerShare,
) -> Arc<OrderSends> {
    let sent = Arc::new(OrderSends::default());
    let pace = span.mul_f64(clients as f64 / orders.len().max(1) as f64);
    let total = orders.len().max(1);
    let queue = Arc::new(Mutex::new(orders));
    let cancels: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..clients {
        let share = share.clone();
        let (queue, ports, ledger, sent, cancels) = (
            queue.clone(),
            ports.clone(),
            ledger.clone(),
            sent.clone(),
            cancels.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let c = claimd::provider::tls::http_client_builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let mut n = t;
            loop {
                let (order, left) = {
                    let mut q = queue.lock().unwrap();
                    (q.pop(), q.len())
                };
                let Some(order) = order else {
                    return;
                };
                tokio::time::sleep(pace).await;
                // In step with the ledger: a long run's orders spread over all of it.
                keep_pace(&share, (total - left - 1) as f64 / total as f64).await;
                let tenant = order.tenant;
                let mut times = Vec::new();
                for step in &order.steps {
                    n += 1;
                    // Fixed before the first send: a send again carries the same time.
                    let not_before = step.delay.map(|d| {
                        (chrono::Utc::now() + d)
                            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    });
                    let st =
                        post(&c, &ports, n, tenant, step, not_before.as_deref(), &ledger).await;
                    assert!(
                        st == 202 || st == 200,
                        "order message {tenant}/{}: {st}",
                        step.id
                    );
                    ledger
                        .acked
                        .lock()
                        .unwrap()
                        .insert((tenant.into(), step.id.clone()));
                    sent.messages.fetch_add(1, Ordering::Relaxed);
                    if not_before.is_some() {
                        sent.scheduled.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(after) = step.cancel_after {
                        let (c, ports, sent, id) =
                            (c.clone(), ports.clone(), sent.clone(), step.id.clone());
                        cancels.lock().unwrap().push(tokio::spawn(async move {
                            tokio::time::sleep(after).await;
                            cancel(&c, &ports, n, tenant, &id, &sent).await;
                        }));
                    }
                    times.push(not_before);
                }
                if let Some(k) = order.repeat {
                    // The same message again, as first sent: a duplicate, not a new place in
                    // the line.
                    let step = &order.steps[k];
                    let st = post(&c, &ports, n, tenant, step, times[k].as_deref(), &ledger).await;
                    assert_eq!(st, 200, "order message {tenant}/{} sent again", step.id);
                    sent.repeats.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let cancels: Vec<_> = std::mem::take(&mut *cancels.lock().unwrap());
    for c in cancels {
        c.await.unwrap();
    }
    sent
}

/// Posts one order message until a definite answer (connection errors and `503`s are sent
/// again to another worker).
async fn post(
    c: &reqwest::Client,
    ports: &[u16],
    start: usize,
    tenant: &str,
    step: &Step,
    not_before: Option<&str>,
    ledger: &Ledger,
) -> u16 {
    for i in start..start + 2000 {
        let port = ports[i % ports.len()];
        ledger.attempts.fetch_add(1, Ordering::Relaxed);
        let mut req = c
            .post(format!("http://127.0.0.1:{port}/v1/messages/orders"))
            .header("Idempotency-Key", &step.id)
            .header("Content-Type", "application/json")
            .body(step.body.clone());
        if let Some(t) = not_before {
            req = req.header("Not-Before", t);
        }
        if !tenant.is_empty() {
            req = req.header("Tenant-Id", tenant);
        }
        match req.send().await {
            Ok(r) if r.status().as_u16() == 503 => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(r) => return r.status().as_u16(),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("no definite answer for order message {}", step.id);
}

/// Cancels a scheduled order message (`POST /v1/claims/orders/{id}/cancel`): `200`
/// cancelled, `409` too late; anything else but a `404` is asked again of another worker.
async fn cancel(
    c: &reqwest::Client,
    ports: &[u16],
    start: usize,
    tenant: &str,
    id: &str,
    sent: &OrderSends,
) {
    for i in start..start + 2000 {
        let port = ports[i % ports.len()];
        let answer = c
            .post(format!(
                "http://127.0.0.1:{port}/v1/claims/orders/{id}/cancel"
            ))
            .json(&serde_json::json!({
                "reason": "the customer cancelled",
                "actor": "chaos",
                "tenant": tenant,
            }))
            .send()
            .await;
        match answer.map(|r| r.status().as_u16()) {
            Ok(200) => {
                sent.cancelled
                    .lock()
                    .unwrap()
                    .insert((tenant.to_string(), id.to_string()));
                return;
            }
            Ok(409) => {
                sent.too_late.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(404) => panic!("cancel of order message {id}: 404 after it was acknowledged"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("no definite answer to the cancel of order message {id}");
}

/// The order checks of a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct OrderCheck {
    /// Messages acknowledged; sent with `Not-Before`; cancels answered `200`; `409`.
    pub messages: usize,
    pub scheduled: usize,
    /// Messages sent again (duplicates).
    pub repeats: usize,
    pub cancelled: usize,
    pub too_late: usize,
    /// Applied before a claim ahead of it in its line (lower id, same order key) settled.
    pub out_of_line: usize,
    /// Applied before its `not_before`.
    pub early: usize,
    /// Cancelled claims (or cancels answered `200`) whose key the provider applied, or whose
    /// claim did not end cancelled.
    pub cancelled_sent: usize,
    /// Claims `completed` whose key the provider never applied.
    pub completed_unapplied: usize,
    /// Parked claims the harness resolved as an operator (each held its line).
    pub resolved: usize,
}

/// " (scheduled for …)" when the claim was sent with `Not-Before`.
fn scheduled(c: &Claim) -> String {
    c.not_before
        .map(|t| format!(" (scheduled for {t})"))
        .unwrap_or_default()
}

/// Whether the claim ended cancelled before its time.
fn is_cancelled(c: &Claim) -> bool {
    c.state == ClaimState::Failed
        && c.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("cancelled before its scheduled time"))
}

/// Checks the `orders` claims against what the provider applied and when; prints each claim
/// a check counts, with its history.
pub(super) async fn check(
    store: &Store,
    claims: &[Claim],
    effects: &[claimd::provider::sandbox::EffectRecord],
    sent: &OrderSends,
    timeline: &[Moment],
) -> OrderCheck {
    let applied: HashMap<&str, chrono::DateTime<chrono::Utc>> = effects
        .iter()
        .map(|e| (e.key.as_str(), e.first_applied_utc))
        .collect();
    let orders: Vec<&Claim> = claims.iter().filter(|c| c.consumer == "orders").collect();
    let mut bad: Vec<(i64, String)> = Vec::new();
    let mut lines: HashMap<(&str, &str), Vec<&Claim>> = HashMap::new();
    for c in &orders {
        lines
            .entry((c.tenant.as_str(), c.order_key.as_deref().unwrap_or("")))
            .or_default()
            .push(c);
    }
    let mut out_of_line = 0;
    for line in lines.values_mut() {
        line.sort_by_key(|c| c.id);
        for (i, c) in line.iter().enumerate() {
            let Some(at) = applied.get(c.idem_key.as_str()) else {
                continue;
            };
            // Every claim ahead of it must have settled before it was applied.
            if let Some(ahead) = line[..i]
                .iter()
                .find(|e| e.processed_utc.is_none_or(|p| p > *at))
            {
                out_of_line += 1;
                bad.push((
                    c.id,
                    format!(
                        "out of line: {}{} applied at {at} while {}{} ahead of it ({}) settled at {:?}",
                        c.message_id,
                        scheduled(c),
                        ahead.message_id,
                        scheduled(ahead),
                        ahead.state,
                        ahead.processed_utc
                    ),
                ));
                bad.push((ahead.id, format!("(the claim ahead of {})", c.message_id)));
            }
        }
    }
    let mut early = 0;
    for c in &orders {
        if let (Some(nb), Some(at)) = (c.not_before, applied.get(c.idem_key.as_str()))
            && *at < nb
        {
            early += 1;
            bad.push((
                c.id,
                format!("early: {} applied at {at}, not before {nb}", c.message_id),
            ));
        }
    }
    let said_cancelled = sent.cancelled.lock().unwrap().clone();
    let mut cancelled_sent = 0;
    for c in &orders {
        let cancelled = is_cancelled(c);
        let answered = said_cancelled.contains(&(c.tenant.clone(), c.message_id.clone()));
        if (cancelled || answered) && (applied.contains_key(c.idem_key.as_str()) || !cancelled) {
            cancelled_sent += 1;
            bad.push((
                c.id,
                format!(
                    "cancelled ({}) but {} ({}): {}",
                    if answered {
                        "cancel answered 200"
                    } else {
                        "in the store"
                    },
                    if applied.contains_key(c.idem_key.as_str()) {
                        "applied"
                    } else {
                        "not applied"
                    },
                    c.state,
                    c.last_error.as_deref().unwrap_or("")
                ),
            ));
        }
    }
    let unapplied: Vec<&&Claim> = orders
        .iter()
        .filter(|c| c.state == ClaimState::Completed && !applied.contains_key(c.idem_key.as_str()))
        .collect();
    for c in &unapplied {
        bad.push((c.id, format!("completed, never applied: {}", c.message_id)));
    }
    for (id, why) in bad.iter().take(40) {
        eprintln!("orders: claim {id}: {why}");
        let events = store.events(*id).await.unwrap_or_default();
        // When each process that acted on it was SIGKILLed, if it was.
        let actors: HashSet<&str> = events.iter().map(|e| e.actor.as_str()).collect();
        for (t, what) in timeline {
            if let Some(name) = what
                .strip_prefix("SIGKILL worker ")
                .and_then(|w| w.split_once(" (")?.1.strip_suffix(')'))
                && actors.contains(name)
            {
                eprintln!("    {t} {name} SIGKILLed");
            }
        }
        for e in events {
            eprintln!(
                "    {} attempt {} {} {} {}: {}",
                e.at_utc,
                e.attempt,
                e.actor,
                e.action,
                e.outcome,
                e.detail.as_deref().unwrap_or("")
            );
        }
    }
    OrderCheck {
        messages: sent.messages.load(Ordering::Relaxed),
        scheduled: sent.scheduled.load(Ordering::Relaxed),
        repeats: sent.repeats.load(Ordering::Relaxed),
        cancelled: orders.iter().filter(|c| is_cancelled(c)).count(),
        too_late: sent.too_late.load(Ordering::Relaxed),
        out_of_line,
        early,
        cancelled_sent,
        completed_unapplied: unapplied.len(),
        resolved: 0,
    }
}

/// The `orders` consumer of the workers' configuration.
pub(super) fn consumer_toml(provider: &str, s: &Scenario) -> String {
    format!(
        r#"[[consumers]]
name = "orders"
source = "http"
concurrency = 16
lease = "{lease_ms}ms"
max_attempts = 20
redrive_within = "1h"
on_unknown = "{on_unknown}"
key = "{{consumer}}:{{tenant}}:{{message_id}}"
order_key = "{{order_id}}"
order_hold = "hold"
fairness = "tenant"
[consumers.effect]
kind = "http"
url = "{provider}/v1/orders"
timeout = "1s"
status_url = "{provider}/v1/effects/{{key}}"
rate_limit = "50/s"
rate_limit_key = "{{order_id}}"
"#,
        lease_ms = WORKER_LEASE_MS,
        on_unknown = s.on_unknown,
    )
}

/// Waits until no claim is `started` or `pending`, acting as the operator for the orders:
/// under `order_hold = "hold"` a parked order claim (its sends' outcomes all unknown) holds
/// the claims behind it until a person resolves it, so each one is resolved (`POST
/// /v1/claims/orders/{id}/resolve`) by what the provider's record for its key says. Returns
/// whether everything settled, and how many claims were resolved.
pub(super) async fn settle_as_operator(
    store: &Store,
    ports: &[u16],
    sandbox: &Sandbox,
    within: Duration,
) -> (bool, usize) {
    let c = claimd::provider::tls::http_client_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let end = Instant::now() + within;
    let mut resolved = 0;
    while Instant::now() < end {
        if settled_now(store).await {
            return (true, resolved);
        }
        let parked = store
            .list(&ClaimFilter {
                consumer: Some("orders".into()),
                state: Some(ClaimState::NeedsAttention),
                limit: 10_000,
                ..Default::default()
            })
            .await
            .unwrap_or_default();
        let applied: HashSet<String> = sandbox.effects().into_iter().map(|e| e.key).collect();
        for (i, claim) in parked.iter().enumerate() {
            let (to, note) = match applied.contains(&claim.idem_key) {
                true => ("completed", "the provider's record shows its key applied"),
                false => ("failed", "the provider has no record of its key"),
            };
            let port = ports[i % ports.len()];
            let answer = c
                .post(format!(
                    "http://127.0.0.1:{port}/v1/claims/orders/{}/resolve",
                    claim.message_id
                ))
                .json(&serde_json::json!({
                    "to": to, "note": note, "tenant": claim.tenant, "actor": "chaos"
                }))
                .send()
                .await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                resolved += 1;
                eprintln!(
                    "orders: resolved {} {:?}/{} as {to}: {}",
                    claim.id,
                    claim.tenant,
                    claim.message_id,
                    claim.last_error.as_deref().unwrap_or("")
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (false, resolved)
}
