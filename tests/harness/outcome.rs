//! What a scenario ends with: the end-of-run checks (`Outcome`, one table row each) and the
//! invariants every scenario must hold (`assert_invariants`).

/// The end-of-run checks.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub name: String,
    /// The ledger went through RabbitMQ (bad input is dead-lettered, not answered).
    pub via_broker: bool,
    pub sent: usize,
    pub acknowledged: usize,
    pub completed: usize,
    pub failed: usize,
    pub needs_attention: usize,
    /// Of those, emails (SMTP has no status endpoint: an interrupted send is parked).
    pub needs_attention_emails: usize,
    pub max_applied_per_key: u64,
    pub keys_applied: usize,
    pub lost: usize,
    pub stuck_after_sweep: usize,
    pub duplicates_sent: usize,
    pub duplicates_counted: i64,
    pub mismatches_sent: usize,
    pub mismatches_counted: i64,
    pub bad_refused: usize,
    pub bad_sent: usize,
    /// Changed payloads refused (HTTP 422, or dead-lettered as a mismatch).
    pub mismatches_refused: usize,
    /// Messages the workers dead-lettered, by the store's count (RabbitMQ only).
    pub dead_lettered: i64,
    /// Emails acknowledged; received by the SMTP sink (distinct Message-IDs); most copies of
    /// one Message-ID the sink received.
    pub emails_acked: usize,
    pub emails_received: usize,
    /// Emails settled `completed` that the sink never received (must be 0).
    pub emails_completed_unreceived: usize,
    pub max_emails_per_id: usize,
    /// HTTP sends whose client hung up (each sent again until acknowledged).
    pub hung_up: usize,
    /// Payment ids sent by two tenants; of those (tenant, id) pairs, how many were not
    /// applied under a key of their own (a claim missing, two tenants' claims sharing one
    /// key, or its key never applied).
    pub two_tenant_ids: usize,
    pub two_tenant_misapplied: usize,
    /// Payment claims settled `completed` whose key the provider never applied.
    pub completed_unapplied: usize,
    /// Claims parked for a person whose key (HTTP) or recipient (SMTP) never reached the
    /// provider's door: parked although never sent.
    pub parked_never_sent: usize,
    /// Of those, claims whose holder (the process the sweeper's takeover line names) was
    /// SIGKILLed after the claim arrived and before its lease could run out: the worker died
    /// between the commit and the call, and nobody can know the call was never made (parking
    /// them is right). The others were orphaned while their worker lived.
    pub parked_never_sent_at_kill: usize,
    /// Payments whose provider id is not the object the provider created for their key, or
    /// that an event about a look-alike object settled (must be 0).
    pub settled_by_other: usize,
    /// Payments `failed` as "never sent" whose key the provider applied (must be 0).
    pub never_sent_held: usize,
    /// What the hostile provider did (when the scenario has it on).
    pub hostile: Option<HostileCheck>,
    /// The outcome-event stream against the store (when the scenario publishes events).
    pub events: Option<super::events::EventCheck>,
    /// The same stream as received by the second destination, a webhook that was down for the
    /// first half of the send phase (when the scenario has it).
    pub hook_events: Option<super::events::EventCheck>,
    /// NATS, CloudEvents and producers' enqueues (when the scenario sends them).
    pub intakes: Option<super::intakes::IntakeCheck>,
    /// The schedule's ticks and their follow-up receipts (with the other intakes).
    pub periodic: Option<super::periodic::PeriodicCheck>,
    /// Every event row was sent before the stream was read.
    pub events_all_relayed: bool,
    /// The order lines, schedules and cancels (when the scenario sends orders).
    pub orders: Option<super::orders::OrderCheck>,
    /// The database effect's rows and counter against its claims (when the scenario has it).
    pub db_effect: Option<super::dbeffect::DbEffectCheck>,
    /// Worker backends ended with `pg_terminate_backend`.
    pub terminated_backends: usize,
    /// Of those, backends running a database effect's statement.
    pub terminated_in_effect: usize,
    /// Fast restarts of the real PostgreSQL server (`57P01` to every connection).
    pub pg_restarts: usize,
    /// The paging rules against `/metrics` during the run (when the scenario has them on).
    pub alerts: Option<super::alerts::AlertCheck>,
    /// Claims erased by payload retention, and of those any not finished (when the scenario
    /// erases).
    pub erasure: Option<ErasureCheck>,
    pub kills: usize,
    pub seconds: f64,
}

/// What the hostile provider did in a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostileCheck {
    /// `503`s answered after the sandbox got the request (applied or replayed).
    pub applied_503: usize,
    /// `503`s answered without forwarding.
    pub unforwarded_503: usize,
    /// `409`s answered while the key was in flight through the proxy.
    pub in_flight_409: usize,
    /// Payments answered `processing`.
    pub pending: usize,
    /// Their genuine `succeeded` events delivered.
    pub genuine_events: usize,
    /// Look-alike events delivered, to how many pending claims.
    pub lookalikes: usize,
    pub lookalike_targets: usize,
    /// Events no worker answered `2xx` within two minutes.
    pub undelivered: usize,
}

impl Outcome {
    pub fn header() -> String {
        "| scenario | sent | acked | completed | failed | attention (never sent/at a kill) | max applied/key | lost | stuck | completed unapplied | dups sent/counted | mismatches sent/counted/refused | bad refused/sent | dead-lettered | emails acked/received/max per id | hung up | two-tenant ids/misapplied | events published/missing/invented/repeats | hostile: 503 after apply/503/409/pending/events/look-alikes (claims) | settled by another object's evidence | never sent, key held | orders: messages/scheduled/cancelled/too late/sent again/parked and resolved | orders: out of line/early/cancelled sent/completed unapplied | database effect: completed/rows/counter/not completed/row without claim/claim without row/doubled | webhook events published/missing/invented/repeats | NATS/CloudEvents/enqueued/abandoned (NATS restarts) | other intakes: not completed/doubled/completed unapplied/unacknowledged applied/row without claim/claim without row | terminated backends (in a database effect) | PostgreSQL fast restarts | pages (false) | kills | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|".into()
    }
    pub fn row(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} ({} emails; {}/{}) | {} | {} | {} | {} | {}/{} | {}/{}/{} | {}/{} | {} | {}/{}/{} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {:.0} |",
            self.name,
            self.sent,
            self.acknowledged,
            self.completed,
            self.failed,
            self.needs_attention,
            self.needs_attention_emails,
            self.parked_never_sent,
            self.parked_never_sent_at_kill,
            self.max_applied_per_key,
            self.lost,
            self.stuck_after_sweep,
            self.completed_unapplied,
            self.duplicates_sent,
            self.duplicates_counted,
            self.mismatches_sent,
            self.mismatches_counted,
            self.mismatches_refused,
            self.bad_refused,
            self.bad_sent,
            self.dead_lettered,
            self.emails_acked,
            self.emails_received,
            self.max_emails_per_id,
            self.hung_up,
            self.two_tenant_ids,
            self.two_tenant_misapplied,
            match self.events {
                Some(e) => format!("{}/{}/{}/{}", e.published, e.missing, e.invented, e.repeats),
                None => "-".into(),
            },
            match self.hostile {
                Some(h) => format!(
                    "{}/{}/{}/{}/{}/{} ({})",
                    h.applied_503,
                    h.unforwarded_503,
                    h.in_flight_409,
                    h.pending,
                    h.genuine_events,
                    h.lookalikes,
                    h.lookalike_targets
                ),
                None => "-".into(),
            },
            self.settled_by_other,
            self.never_sent_held,
            match self.orders {
                Some(o) => format!(
                    "{}/{}/{}/{}/{}/{}",
                    o.messages, o.scheduled, o.cancelled, o.too_late, o.repeats, o.resolved
                ),
                None => "-".into(),
            },
            match self.orders {
                Some(o) => format!(
                    "{}/{}/{}/{}",
                    o.out_of_line, o.early, o.cancelled_sent, o.completed_unapplied
                ),
                None => "-".into(),
            },
            match self.db_effect {
                Some(d) => format!(
                    "{}/{}/{}/{}/{}/{}/{}",
                    d.completed,
                    d.rows,
                    d.counter,
                    d.not_completed,
                    d.row_without_claim,
                    d.claim_without_row,
                    d.doubled
                ),
                None => "-".into(),
            },
            match self.hook_events {
                Some(e) => format!("{}/{}/{}/{}", e.published, e.missing, e.invented, e.repeats),
                None => "-".into(),
            },
            match self.intakes {
                Some(i) => format!(
                    "{}/{}/{}/{} ({})",
                    i.nats, i.cloudevents, i.enqueued, i.abandoned, i.nats_restarts
                ),
                None => "-".into(),
            },
            match self.intakes {
                Some(i) => format!(
                    "{}/{}/{}/{}/{}/{}",
                    i.not_completed,
                    i.doubled,
                    i.completed_unapplied,
                    i.unacked_applied,
                    i.row_without_claim,
                    i.claim_without_row
                ),
                None => "-".into(),
            },
            self.terminated_backends,
            self.terminated_in_effect,
            self.pg_restarts,
            match &self.alerts {
                Some(a) => format!("{} ({}) in {} scrapes", a.pages, a.false_pages, a.scrapes),
                None => "-".into(),
            },
            self.kills,
            self.seconds
        )
    }
}

/// The invariants every scenario must hold (at a provider that honours keys).
/// What payload retention erased during a run.
#[derive(Debug, Clone, Copy)]
pub struct ErasureCheck {
    /// Claims erased.
    pub erased: usize,
    /// Erased claims that are not `completed` or `failed` (must be none).
    pub erased_open: usize,
}

pub fn assert_invariants(o: &Outcome, honours_keys: bool) {
    if let Some(p) = &o.periodic {
        super::periodic::assert_held(p);
    }
    if let Some(e) = o.erasure {
        assert_eq!(e.erased_open, 0, "an open claim was erased: {o:?}");
        assert!(e.erased > 0, "payload retention erased nothing: {o:?}");
    }
    assert_eq!(o.lost, 0, "acknowledged messages without a claim: {o:?}");
    assert_eq!(
        o.two_tenant_misapplied, 0,
        "a (tenant, id) sent by two tenants was not applied under a key of its own: {o:?}"
    );
    assert_eq!(
        o.completed_unapplied, 0,
        "a payment settled completed that the provider never applied: {o:?}"
    );
    assert_eq!(
        o.parked_never_sent - o.parked_never_sent_at_kill,
        0,
        "claims parked for a person that never reached the provider, their worker alive: {o:?}"
    );
    assert_eq!(
        o.stuck_after_sweep, 0,
        "claims still started after the final sweeps: {o:?}"
    );
    if honours_keys {
        assert!(o.max_applied_per_key <= 1, "a key was applied twice: {o:?}");
    }
    assert_eq!(
        o.settled_by_other, 0,
        "a payment settled by evidence about another object (its provider id is not its own, or a look-alike's event settled it): {o:?}"
    );
    assert_eq!(
        o.never_sent_held, 0,
        "a payment failed as \"never sent\" although the provider applied its key: {o:?}"
    );
    if let Some(h) = o.hostile {
        assert_eq!(h.undelivered, 0, "provider events no worker took: {o:?}");
    }
    assert_eq!(
        o.completed + o.failed + o.needs_attention,
        o.acknowledged,
        "every acknowledged message ends in a state: {o:?}"
    );
    assert!(
        o.duplicates_counted as usize >= o.duplicates_sent,
        "every duplicate sent was recognised: {o:?}"
    );
    assert!(
        o.mismatches_counted as usize >= o.mismatches_sent,
        "every changed payload was counted: {o:?}"
    );
    assert_eq!(
        o.bad_refused, o.bad_sent,
        "every bad input refused with its status (HTTP) or dead-lettered (RabbitMQ): {o:?}"
    );
    assert_eq!(
        o.mismatches_refused, o.mismatches_sent,
        "every changed payload refused: {o:?}"
    );
    assert!(
        !o.via_broker || o.dead_lettered as usize >= o.bad_sent + o.mismatches_sent,
        "the store counted every dead letter: {o:?}"
    );
    assert_eq!(
        o.emails_completed_unreceived, 0,
        "an email settled completed that the SMTP server never received: {o:?}"
    );
    assert!(
        o.max_emails_per_id <= 1,
        "an email was delivered twice under one Message-ID: {o:?}"
    );
    assert!(
        o.emails_received <= o.emails_acked,
        "the sink received an email nobody sent: {o:?}"
    );
    if let Some(c) = o.orders {
        assert_eq!(
            c.out_of_line, 0,
            "an order message applied before a claim ahead of it in its line settled: {o:?}"
        );
        assert_eq!(
            c.early, 0,
            "a scheduled send applied before its time: {o:?}"
        );
        assert_eq!(
            c.cancelled_sent, 0,
            "a cancelled send applied, or a cancel answered 200 that did not hold: {o:?}"
        );
        assert_eq!(
            c.completed_unapplied, 0,
            "an order message settled completed that the provider never applied: {o:?}"
        );
    }
    if let Some(d) = o.db_effect {
        assert_eq!(
            (d.row_without_claim, d.claim_without_row, d.doubled),
            (0, 0, 0),
            "database effect: a row without its completed claim, a completed claim without its row, or two rows for one message: {o:?}"
        );
        assert_eq!(
            d.counter as usize, d.completed,
            "database effect: the counter is not the number of completed claims: {o:?}"
        );
        assert_eq!(
            d.not_completed, 0,
            "database effect: a valid write ended failed or parked (a fault claimd should survive): {o:?}"
        );
    }
    if let Some(a) = &o.alerts {
        assert!(
            a.scrapes > 0,
            "no worker's /metrics answered the alert scraper: {o:?}"
        );
        assert_eq!(
            a.false_pages, 0,
            "a paging rule about stuck or old claims fired while its consumer had no stuck claim (alert, consumer, stuck, values): {:?}",
            a.fired
        );
    }
    if let Some(i) = o.intakes {
        assert_eq!(
            (
                i.not_completed,
                i.doubled,
                i.completed_unapplied,
                i.unacked_applied
            ),
            (0, 0, 0, 0),
            "NATS, CloudEvents or enqueue: an acknowledged message not completed, a key applied twice, a completed claim never applied, or an abandoned enqueue applied: {o:?}"
        );
        assert_eq!(
            (i.row_without_claim, i.claim_without_row),
            (0, 0),
            "enqueue: a producer's row without its claim or a claim without its row: {o:?}"
        );
        assert!(
            i.nats_restarts > 0,
            "the NATS server was never restarted: {o:?}"
        );
    }
    if let Some(e) = o.hook_events {
        assert_eq!(
            (e.missing, e.invented, e.changed_repeats),
            (0, 0, 0),
            "the webhook destination: a settled claim without its event, an invented event, or a changed repeat: {o:?}"
        );
        assert_eq!(
            Some(e.published),
            o.events.map(|b| b.published),
            "the two destinations did not get the same events: {o:?}"
        );
    }
    if let Some(e) = o.events {
        assert!(o.events_all_relayed, "outcome events left unsent: {o:?}");
        assert_eq!(
            e.missing, 0,
            "a settled claim without its outcome event: {o:?}"
        );
        assert_eq!(
            e.invented, 0,
            "an outcome event for a claim that did not settle: {o:?}"
        );
        assert_eq!(
            e.changed_repeats, 0,
            "a repeated event id with another body: {o:?}"
        );
    }
}
