//! The end-of-run checks: the store, the provider, the SMTP sink and the dead-letter queues
//! against what was sent.

use super::*;

/// What the ledger sent, by kind.
pub(super) struct Sent {
    pub(super) total: usize,
    pub(super) duplicates: usize,
    pub(super) mismatches: usize,
    pub(super) bad: usize,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn check(
    s: &Scenario,
    store: &Store,
    db_url: &str,
    sandbox: &Sandbox,
    smtp: &SmtpSink,
    [provider_gate, smtp_gate]: [&Gate; 2],
    timeline: &[Moment],
    ledger: &Ledger,
    emails: &[String],
    two_tenant_ids: &[String],
    _settled: bool,
    sent: Sent,
    kills: usize,
    started: Instant,
    hostile: Option<(&hostile::HostileCounts, &lookalike::EventCounts)>,
) -> Outcome {
    let phase = Instant::now();
    let mut claims = store
        .list(&ClaimFilter {
            limit: 10_000_000,
            ..Default::default()
        })
        .await
        .unwrap();
    // The schedule's ticks and receipts are checked apart (periodic.rs): the schedule keeps
    // firing while these checks run.
    claims.retain(|c| !super::periodic::CONSUMERS.contains(&c.consumer.as_str()));
    // Payload retention erased the reasons of finished claims; the checks read a failure's
    // reason ("never sent"), which its history line keeps.
    for c in claims
        .iter_mut()
        .filter(|c| c.erased_utc.is_some() && c.state == claimd::domain::claim::ClaimState::Failed)
    {
        let history = store.events(c.id).await.unwrap();
        c.last_error = history
            .iter()
            .rev()
            .filter(|e| e.action != "erase")
            .find_map(|e| e.detail.clone());
    }
    eprintln!(
        "check: {} claims read in {:.1} s",
        claims.len(),
        phase.elapsed().as_secs_f64()
    );
    let by_id: HashMap<(&str, &str), &claimd::domain::claim::Claim> = claims
        .iter()
        .map(|c| ((c.tenant.as_str(), c.message_id.as_str()), c))
        .collect();
    let acked = ledger.acked.lock().unwrap().clone();
    let lost = acked
        .iter()
        .filter(|(t, id)| !by_id.contains_key(&(t.as_str(), id.as_str())))
        .count();
    let count =
        |st: claimd::domain::claim::ClaimState| claims.iter().filter(|c| c.state == st).count();
    // Why claims wait for a person, by consumer and reason (printed: a long run's table alone
    // does not say).
    let mut parked: HashMap<(String, String), usize> = HashMap::new();
    for c in claims
        .iter()
        .filter(|c| c.state == claimd::domain::claim::ClaimState::NeedsAttention)
    {
        let why: String = c
            .last_error
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(90)
            .collect();
        *parked.entry((c.consumer.clone(), why)).or_default() += 1;
    }
    for ((consumer, why), n) in &parked {
        eprintln!("needs_attention: {n} {consumer}: {why}");
    }
    let effects = sandbox.effects();
    let applied: HashMap<&str, u64> = effects
        .iter()
        .map(|e| (e.key.as_str(), e.applied))
        .collect();
    // Two tenants, one id: each (tenant, id) applied under a key of its own.
    let two_tenant_misapplied = two_tenant_ids
        .iter()
        .map(|id| {
            let mine = ["acme", "globex"].map(|t| by_id.get(&(t, id.as_str())));
            match mine {
                // A claim parked for a person is not misapplied: whether it was sent is the
                // "parked, never sent" check's business.
                [Some(a), Some(b)] if a.idem_key != b.idem_key => [a, b]
                    .iter()
                    .filter(|c| c.state != claimd::domain::claim::ClaimState::NeedsAttention)
                    // Failed as never sent: whether that is true is the "never sent, key
                    // held" check's business.
                    .filter(|c| !never_sent_failure(c))
                    .filter(|c| !applied.contains_key(c.idem_key.as_str()))
                    .count(),
                [Some(_), Some(_)] => 2, // one key for two payments
                [a, b] => a.is_none() as usize + b.is_none() as usize,
            }
        })
        .sum();
    let completed_unapplied = claims
        .iter()
        .filter(|c| {
            c.consumer == "payments" && c.state == claimd::domain::claim::ClaimState::Completed
        })
        .filter(|c| !applied.contains_key(c.idem_key.as_str()))
        .count();
    // Parked, and its key (payments) or recipient (emails) never reached the provider's door.
    let (keys_seen, rcpts_seen) = (provider_gate.seen(), smtp_gate.seen());
    let never_sent: Vec<&claimd::domain::claim::Claim> = claims
        .iter()
        .filter(|c| c.state == claimd::domain::claim::ClaimState::NeedsAttention)
        .filter(|c| {
            if c.consumer == "email" {
                // Email `e{seed}-{m}` goes to `user{m}@example.com` (list() carries no payloads).
                let m = c.message_id.rsplit('-').next().unwrap_or_default();
                !rcpts_seen.contains(&format!("user{m}@example.com"))
            } else {
                !keys_seen.contains(&c.idem_key)
            }
        })
        .collect();
    // A worker SIGKILLed between a claim's commit and its first byte to the provider leaves a
    // claim that nobody can know was never sent: parked under `park`, rightly. The sweeper's
    // takeover line names the process whose lease ran out ("attempt N was held by w{port}.{n}",
    // one name per process): the claim was parked at a kill when that very process was killed
    // after the claim arrived and before its lease could have run out. Anything else parked
    // unsent was orphaned while its worker lived.
    let killed_at: HashMap<&str, chrono::DateTime<chrono::Utc>> = timeline
        .iter()
        .filter_map(|(t, what)| {
            let name = what.strip_prefix("SIGKILL worker ")?.split_once(" (")?.1;
            Some((name.strip_suffix(')')?, *t))
        })
        .collect();
    // The process named by the last takeover, and when that takeover was written.
    let mut holder_of: HashMap<i64, (String, chrono::DateTime<chrono::Utc>)> = HashMap::new();
    for c in &never_sent {
        let events = store.events(c.id).await.unwrap_or_default();
        if let Some(holder) = events
            .iter()
            .rev()
            .filter(|e| e.action == "takeover")
            .find_map(|e| {
                let d = e.detail.as_deref()?;
                let rest = &d[d.find(" was held by ")? + " was held by ".len()..];
                Some((rest.split(';').next()?.to_string(), e.at_utc))
            })
        {
            holder_of.insert(c.id, holder);
        }
    }
    // At a kill: the holder was killed within its lease after the claim arrived (a first
    // attempt), or within the lease (and a sweep or two) before the takeover that found its
    // lease run out (a later attempt, after earlier kills or waits).
    let at_kill = |c: &claimd::domain::claim::Claim| {
        holder_of.get(&c.id).is_some_and(|(h, taken_over)| {
            killed_at.get(h.as_str()).is_some_and(|t| {
                let since_receipt = (*t - c.received_utc).num_milliseconds();
                let before_takeover = (*taken_over - *t).num_milliseconds();
                (-50..=WORKER_LEASE_MS + 250).contains(&since_receipt)
                    || (0..=WORKER_LEASE_MS + 2_000).contains(&before_takeover)
            })
        })
    };
    let parked_never_sent_at_kill = never_sent.iter().filter(|c| at_kill(c)).count();
    // Every unexplained one, then a few at a kill.
    let (at, orphaned): (Vec<&&claimd::domain::claim::Claim>, Vec<_>) =
        never_sent.iter().partition(|c| at_kill(c));
    for c in orphaned.into_iter().chain(at.into_iter().take(10)) {
        // The chaos around the moment it was received (database clock, same host).
        let near: Vec<String> = timeline
            .iter()
            .filter(|(t, what)| {
                let ms = (*t - c.received_utc).num_milliseconds();
                ms.abs() < 1000 || (what.ends_with(" down") && (-30_000..0).contains(&ms))
            })
            .map(|(t, what)| format!("{:+}ms {what}", (*t - c.received_utc).num_milliseconds()))
            .collect();
        let holder = holder_of
            .get(&c.id)
            .map_or("(no takeover)".to_string(), |(h, at)| {
                format!(
                    "last taken over from {h} at {:+}ms, {h} killed at {}",
                    (*at - c.received_utc).num_milliseconds(),
                    killed_at
                        .get(h.as_str())
                        .map_or("(never)".to_string(), |t| format!(
                            "{:+}ms",
                            (*t - c.received_utc).num_milliseconds()
                        ))
                )
            });
        eprintln!(
            "parked, never sent{}: {} {} attempt {} ({holder}): {}; chaos near its receipt: {}",
            if at_kill(c) { " (at a kill)" } else { "" },
            c.consumer,
            c.message_id,
            c.attempt,
            c.last_error.as_deref().unwrap_or(""),
            near.join(", ")
        );
    }
    let phase = Instant::now();
    let evidence = evidence_checks(db_url, &claims, &effects, hostile).await;
    eprintln!(
        "check: evidence checked in {:.1} s",
        phase.elapsed().as_secs_f64()
    );
    let counts = store.counts(None).await.unwrap();
    let total = |f: fn(&claimd::store::ConsumerCounts) -> i64| counts.iter().map(f).sum::<i64>();
    // The report counts the live table; claims the archive moved keep their counts there.
    let (archived_duplicates, archived_mismatches) = archived_repeats(db_url).await;
    // Emails: copies the sink received per Message-ID.
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in smtp.received() {
        if let Some(id) = r.message_id {
            *per_id.entry(id).or_default() += 1;
        }
    }
    let erasure = s.payload_retention.map(|_| super::outcome::ErasureCheck {
        erased: claims.iter().filter(|c| c.erased_utc.is_some()).count(),
        erased_open: claims
            .iter()
            .filter(|c| c.erased_utc.is_some() && !c.state.is_terminal())
            .count(),
    });
    if let Some(e) = erasure {
        eprintln!(
            "check: payload retention erased {} claims ({} of them open)",
            e.erased, e.erased_open
        );
    }
    Outcome {
        name: s.name.clone(),
        via_broker: s.intake == Intake::Amqp,
        sent: sent.total,
        acknowledged: acked.len(),
        completed: count(claimd::domain::claim::ClaimState::Completed),
        failed: count(claimd::domain::claim::ClaimState::Failed),
        needs_attention: count(claimd::domain::claim::ClaimState::NeedsAttention),
        needs_attention_emails: parked
            .iter()
            .filter(|((c, _), _)| c == "email")
            .map(|(_, n)| n)
            .sum(),
        max_applied_per_key: effects.iter().map(|e| e.applied).max().unwrap_or(0),
        keys_applied: effects.len(),
        lost,
        stuck_after_sweep: total(|c| c.started) as usize,
        duplicates_sent: sent.duplicates,
        duplicates_counted: total(|c| c.duplicates) + archived_duplicates,
        mismatches_sent: sent.mismatches,
        mismatches_counted: total(|c| c.payload_mismatches) + archived_mismatches,
        mismatches_refused: ledger.mismatch_refusals.load(Ordering::Relaxed),
        bad_refused: ledger.bad_refused.load(Ordering::Relaxed),
        bad_sent: sent.bad,
        dead_lettered: total(|c| c.dead_lettered),
        emails_acked: emails
            .iter()
            .filter(|id| acked.contains(&(String::new(), id.to_string())))
            .count(),
        emails_received: per_id.len(),
        emails_completed_unreceived: claims
            .iter()
            .filter(|c| {
                c.consumer == "email" && c.state == claimd::domain::claim::ClaimState::Completed
            })
            .filter(|c| !per_id.contains_key(&format!("<{}@chaos.claimd>", c.idem_key)))
            .count(),
        max_emails_per_id: per_id.values().copied().max().unwrap_or(0),
        hung_up: ledger.hung_up.load(Ordering::Relaxed),
        two_tenant_ids: two_tenant_ids.len(),
        two_tenant_misapplied,
        completed_unapplied,
        parked_never_sent: never_sent.len(),
        parked_never_sent_at_kill,
        events: None,
        hook_events: None,
        intakes: None,
        periodic: None,
        events_all_relayed: false,
        orders: None,
        terminated_backends: 0,
        terminated_in_effect: 0,
        pg_restarts: 0,
        alerts: None,
        erasure,
        db_effect: None,
        settled_by_other: evidence.settled_by_other,
        never_sent_held: evidence.never_sent_held,
        hostile: evidence.hostile,
        kills,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// A claim ended `failed` as never sent (`send_deadline` passed with every answer taken for
/// proof that nothing was applied).
fn never_sent_failure(c: &claimd::domain::claim::Claim) -> bool {
    c.state == claimd::domain::claim::ClaimState::Failed
        && c.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("never sent"))
}

/// The checks of "only the provider's own evidence about a claim decides it".
struct Evidence {
    settled_by_other: usize,
    never_sent_held: usize,
    hostile: Option<HostileCheck>,
}

/// **Settled by another object's evidence**: a payment whose provider id is not the object
/// the provider created for its key, or whose history shows a settle by an event about a
/// look-alike object. **Never sent, key held**: a payment `failed` as never sent whose key
/// the provider applied.
async fn evidence_checks(
    db_url: &str,
    claims: &[claimd::domain::claim::Claim],
    effects: &[claimd::provider::sandbox::EffectRecord],
    hostile: Option<(&hostile::HostileCounts, &lookalike::EventCounts)>,
) -> Evidence {
    let own: HashMap<&str, &str> = effects
        .iter()
        .filter_map(|e| Some((e.key.as_str(), e.response.get("id")?.as_str()?)))
        .collect();
    let payments = || claims.iter().filter(|c| c.consumer == "payments");
    let never_sent_held: Vec<_> = payments()
        .filter(|c| never_sent_failure(c) && own.contains_key(c.idem_key.as_str()))
        .collect();
    for c in never_sent_held.iter().take(10) {
        eprintln!(
            "never sent, key held: payments {:?}/{} attempt {}: {}",
            c.tenant,
            c.message_id,
            c.attempt,
            c.last_error.as_deref().unwrap_or("")
        );
    }
    let mut other: HashMap<i64, String> = HashMap::new();
    for c in payments() {
        if let Some(p) = &c.provider_id
            && own.get(c.idem_key.as_str()) != Some(&p.as_str())
        {
            other.insert(
                c.id,
                format!(
                    "provider id {p}, its own object {}",
                    own.get(c.idem_key.as_str()).unwrap_or(&"(none)")
                ),
            );
        }
    }
    let mut hostile_check = None;
    if let Some((proxy, sent)) = hostile {
        // One query for every settle by an event about a look-alike object, and the claims
        // by (tenant, message id) from the list already read: a long run has tens of
        // thousands of targets, and a query per target took longer than the run.
        let by_key: HashMap<(&str, &str), &claimd::domain::claim::Claim> = payments()
            .map(|c| ((c.tenant.as_str(), c.message_id.as_str()), c))
            .collect();
        let marker = format!("object {}", lookalike::LOOKALIKE_PREFIX);
        for (tenant, id, outcome, detail) in lookalike_settles(db_url).await {
            if !detail.contains(&marker) {
                continue;
            }
            if let Some(c) = by_key.get(&(tenant.as_str(), id.as_str())) {
                other
                    .entry(c.id)
                    .or_insert_with(|| format!("settled by {outcome}: {detail}"));
            }
        }
        let targets = sent.targets.lock().unwrap().clone();
        // The answer to a look-alike said it settled the claim.
        let answered = sent.settled.lock().unwrap().clone();
        for (tenant, id, what) in &answered {
            if let Some(c) = by_key.get(&(tenant.as_str(), id.as_str())) {
                other.entry(c.id).or_insert_with(|| what.clone());
            }
        }
        let results = sent.lookalike_results.lock().unwrap().clone();
        let mut results: Vec<_> = results.into_iter().collect();
        results.sort();
        eprintln!("look-alike events answered: {results:?}");
        hostile_check = Some(HostileCheck {
            applied_503: proxy.applied_503.load(Ordering::Relaxed),
            unforwarded_503: proxy.unforwarded_503.load(Ordering::Relaxed),
            in_flight_409: proxy.in_flight_409.load(Ordering::Relaxed),
            pending: proxy.pending.load(Ordering::Relaxed),
            genuine_events: sent.genuine.load(Ordering::Relaxed),
            lookalikes: sent.lookalikes.load(Ordering::Relaxed),
            lookalike_targets: targets.len(),
            undelivered: sent.undelivered.load(Ordering::Relaxed),
        });
    }
    for (id, why) in other.iter().take(10) {
        eprintln!("settled by another object's evidence: claim {id}: {why}");
    }
    Evidence {
        settled_by_other: other.len(),
        never_sent_held: never_sent_held.len(),
        hostile: hostile_check,
    }
}

/// The repeat deliveries and changed payloads counted on archived claims (PostgreSQL's
/// archive; none on SQLite).
async fn archived_repeats(db_url: &str) -> (i64, i64) {
    if !db_url.starts_with("postgres") {
        return (0, 0);
    }
    let pool = sqlx::PgPool::connect(db_url).await.unwrap();
    sqlx::query_as(
        "SELECT COALESCE(SUM(duplicate_count), 0)::bigint, \
         COALESCE(SUM(mismatch_count), 0)::bigint FROM claims_archive",
    )
    .fetch_one(&pool)
    .await
    .unwrap()
}

/// Every history line of a payment that an event settled (its outcome is the event's type,
/// `payment_intent.…`) and whose detail names a look-alike object: (tenant, message id,
/// outcome, detail). One query, on either store; on PostgreSQL archived claims' too.
async fn lookalike_settles(db_url: &str) -> Vec<(String, String, String, String)> {
    const SQL: &str = "SELECT c.tenant, c.message_id, e.outcome, e.detail \
        FROM claim_events e JOIN claims c ON c.id = e.claim_id \
        WHERE c.consumer = 'payments' AND e.action = 'event' \
        AND e.outcome LIKE 'payment_intent.%' AND e.detail LIKE '%object la%'";
    const ARCHIVED: &str = "SELECT a.tenant, a.message_id, e->>'outcome', e->>'detail' \
        FROM claims_archive a CROSS JOIN LATERAL jsonb_array_elements(a.history) e \
        WHERE a.consumer = 'payments' AND e->>'action' = 'event' \
        AND e->>'outcome' LIKE 'payment_intent.%' AND e->>'detail' LIKE '%object la%'";
    type Row = (String, String, String, Option<String>);
    let rows: Vec<Row> = if db_url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(db_url).await.unwrap();
        let mut rows: Vec<Row> = sqlx::query_as(SQL).fetch_all(&pool).await.unwrap();
        rows.extend(
            sqlx::query_as::<_, Row>(ARCHIVED)
                .fetch_all(&pool)
                .await
                .unwrap(),
        );
        rows
    } else {
        let pool = sqlx::SqlitePool::connect(db_url).await.unwrap();
        sqlx::query_as(SQL).fetch_all(&pool).await.unwrap()
    };
    rows.into_iter()
        .map(|(t, m, o, d)| (t, m, o, d.unwrap_or_default()))
        .collect()
}
