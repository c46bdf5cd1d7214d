//! `claimd report` and `claimd reconcile`.

use super::*;
use crate::ops::operator_command::OperatorCommands;

pub(super) async fn report_cmd(
    app: &App,
    consumer: Option<String>,
    window: Window,
    format: Format,
    check: bool,
) -> Output {
    // On the read replica when there is one ([store] read_url).
    let reader = match app.reads.reader().await {
        Ok(r) => r,
        Err(e) => return Output::store(app, &e),
    };
    let r = match report::build(
        &reader.store,
        &app.consumer_names(),
        consumer.as_deref(),
        window,
        app.sweep_period(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return Output::read_store(app, &reader.from, &e),
    };
    let stdout = match format {
        Format::Table => report::render_table(&r),
        Format::Json if app.reads.has_replica() => {
            let mut v = serde_json::json!(r);
            v["read_from"] = serde_json::json!(reader.from);
            to_json(&v)
        }
        Format::Json => to_json(&r),
        Format::Csv => report::render_csv(&r),
    };
    let code = if check && r.has_problems() { 3 } else { 0 };
    Output {
        stdout,
        code,
        stderr: read_from_line(&reader.from),
    }
}

pub(super) async fn reconcile_cmd(
    app: &App,
    consumer: Option<String>,
    since: Option<Dur>,
    format: Format,
) -> Output {
    let since = match since_utc(app, since).await {
        Ok(s) => s,
        Err(o) => return o,
    };
    let audit = match reconcile::audit(
        &app.claimer,
        &OperatorCommands::for_config(&app.config),
        consumer.as_deref(),
        since,
    )
    .await
    {
        Ok(a) => a,
        Err(e) => return Output::fail(1, e),
    };
    // One table for the CSV: the mismatches, then each undecided claim as kind "undecided"
    // with its reason (the text output lists those in a table of their own).
    let columns = [
        "kind",
        "consumer",
        "tenant",
        "message_id",
        "state",
        "provider",
        "suggestion",
    ];
    let mut mismatches = Table::new(&columns);
    for m in &audit.mismatches {
        let kind = serde_json::to_value(m.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        mismatches.row(vec![
            kind,
            m.consumer.clone(),
            m.tenant.clone(),
            m.message_id.clone(),
            m.state.clone(),
            m.provider.clone(),
            m.suggestion.clone(),
        ]);
    }
    let mut undecided = Table::new(&["consumer", "tenant", "message_id", "state", "reason"]);
    for u in &audit.undecided_claims {
        undecided.row(vec![
            u.consumer.clone(),
            u.tenant.clone(),
            u.message_id.clone(),
            u.state.clone(),
            u.reason.clone(),
        ]);
    }
    let stdout = match format {
        Format::Json => to_json(&audit),
        Format::Csv => {
            let mut all = mismatches.clone();
            for u in &audit.undecided_claims {
                all.row(vec![
                    "undecided".into(),
                    u.consumer.clone(),
                    u.tenant.clone(),
                    u.message_id.clone(),
                    u.state.clone(),
                    u.reason.clone(),
                    String::new(),
                ]);
            }
            all.csv()
        }
        Format::Table => {
            let mut s = format!(
                "checked {} claims, {} undecided, {}{} mismatch{}{}\n",
                audit.checked,
                audit.undecided,
                if audit.too_recent > 0 {
                    format!(
                        "{} too recent to judge (not found sooner than not_found_after after they settled), ",
                        audit.too_recent
                    )
                } else {
                    String::new()
                },
                audit.mismatches.len(),
                if audit.mismatches.len() == 1 {
                    ""
                } else {
                    "es"
                },
                if audit.truncated {
                    " (window truncated: narrow --since)"
                } else {
                    ""
                }
            );
            for c in &audit.skipped_consumers {
                let _ = writeln!(s, "consumer {c}: no status endpoint; not auditable");
            }
            if !mismatches.is_empty() {
                s.push_str(&mismatches.text());
            }
            if !undecided.is_empty() {
                let listed = audit.undecided_claims.len() as u64;
                let _ = writeln!(
                    s,
                    "\nundecided (the provider's answer decided nothing{}):",
                    if listed < audit.undecided {
                        format!("; {listed} of {} listed", audit.undecided)
                    } else {
                        String::new()
                    }
                );
                s.push_str(&undecided.text());
            }
            if !audit.unmatched_events.is_empty() {
                let _ = writeln!(
                    s,
                    "\n{} provider event(s) about objects claimd has no claim for:",
                    audit.unmatched_events.len()
                );
                let mut events = Table::new(&[
                    "consumer",
                    "event_id",
                    "event_type",
                    "object_id",
                    "received_utc",
                ]);
                for e in &audit.unmatched_events {
                    events.row(vec![
                        e.consumer.clone(),
                        e.event_id.clone(),
                        e.event_type.clone(),
                        e.object_id.clone().unwrap_or_default(),
                        e.received_utc.to_rfc3339(),
                    ]);
                }
                s.push_str(&events.text());
            }
            s
        }
    };
    // Nothing decided (the provider down, every lookup unknown) is a failure to check, not a
    // clean audit: a cron check must not stay green on it.
    if audit.nothing_decided() {
        return Output {
            stdout,
            stderr: format!(
                "claimd: reconcile could not check any claim: {} undecided (the status endpoint gave no usable answer{}; each claim's reason is listed)\n",
                audit.undecided,
                audit
                    .undecided_claims
                    .first()
                    .map(|u| format!(", e.g. {}", escape_controls(&u.reason)))
                    .unwrap_or_default()
            ),
            code: 1,
        };
    }
    // Asked to audit only consumers that cannot be audited: nothing was audited, which a cron
    // job must not read as a clean audit.
    let names = app.consumer_names();
    let audited = names
        .iter()
        .any(|n| consumer.as_ref().is_none_or(|c| c == n) && !audit.skipped_consumers.contains(n));
    if !audited && !audit.skipped_consumers.is_empty() {
        return Output {
            stdout,
            stderr: format!(
                "claimd: reconcile audited nothing: {} {} no effect.status_url (not auditable); use `claimd reconcile --ledger` where the provider lists its objects, or audit by hand\n",
                audit.skipped_consumers.join(", "),
                if audit.skipped_consumers.len() == 1 {
                    "has"
                } else {
                    "have"
                }
            ),
            code: NOT_AUDITABLE,
        };
    }
    let code = if audit.mismatches.is_empty() { 0 } else { 3 };
    Output {
        stdout,
        code,
        ..Default::default()
    }
}

/// `claimd reconcile`'s exit code when every consumer it was asked to audit has no status
/// endpoint: nothing was audited.
pub(super) const NOT_AUDITABLE: i32 = 4;

/// `claimd reconcile --ledger`: the window is `--from .. --to`, else the last `--since`
/// (default 24h) up to the database's now.
pub(super) async fn ledger_cmd(
    app: &App,
    consumer: Option<String>,
    since: Option<Dur>,
    between: Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>,
    format: Format,
) -> Output {
    let (from, to) = match between {
        Some((from, to)) if from >= to => {
            return Output::fail(2, "--from must be before --to");
        }
        Some(w) => w,
        None => {
            let now = match app.store.now().await {
                Ok(n) => n,
                Err(e) => return Output::store(app, &e),
            };
            let since = since.unwrap_or(Dur(std::time::Duration::from_secs(24 * 3600)));
            (
                since.before(now).unwrap_or(chrono::DateTime::UNIX_EPOCH),
                now,
            )
        }
    };
    // The claims from the read replica when there is one ([store] read_url); the run's
    // summary is kept on the primary.
    let reader = match app.reads.reader().await {
        Ok(r) => r,
        Err(e) => return Output::store(app, &e),
    };
    let run = match crate::ops::ledger::run_reading(
        &app.store,
        &reader.store,
        app.claimer.consumers(),
        &OperatorCommands::for_config(&app.config),
        consumer.as_deref(),
        from,
        to,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return Output::fail(1, e),
    };
    if run.consumers.is_empty() {
        return Output {
            stdout: crate::ops::ledger::render::text(&run),
            stderr:
                "claimd: no consumer has [consumers.effect.ledger]: nothing to reconcile against\n"
                    .into(),
            code: 2,
        };
    }
    let stdout = match format {
        Format::Json => to_json(&run),
        Format::Csv => crate::ops::ledger::render::csv(&run),
        Format::Table => crate::ops::ledger::render::text(&run),
    };
    Output {
        stdout,
        code: if run.disagrees() { 3 } else { 0 },
        stderr: read_from_line(&reader.from),
    }
}

/// Where a command's reads ran, as a line for stderr (nothing without a read replica).
fn read_from_line(from: &crate::store::read_replica::ReadFrom) -> String {
    from.notice()
        .map(|n| format!("claimd: {n}\n"))
        .unwrap_or_default()
}

/// What `claimd prune` did (or, on a dry run, would do), a line per kind of record.
pub(super) fn prune_summary(
    r: &crate::store::PruneResult,
    config: &crate::config::RetentionConfig,
    dry_run: bool,
) -> String {
    let w = config.windows();
    let (erase, archive, delete) = if dry_run {
        ("would erase", "would archive", "would delete")
    } else {
        ("erased", "archived", "deleted")
    };
    let age = |d: std::time::Duration| crate::domain::duration::Dur(d).to_string();
    let mut out = String::new();
    if r.erased > 0 {
        out += &format!(
            "{erase} the payloads of {} finished claims (payload_retention)\n",
            r.erased
        );
    }
    if let Some(after) = w.archive_after {
        out += &format!(
            "{archive} {} finished claims older than {}\n",
            r.archived,
            age(after)
        );
    }
    if let Some(e) = &r.archive_error {
        out += &format!("the archive's part did not finish (tried again at the next run): {e}\n");
    }
    if r.archive_months_dropped > 0 {
        out += &format!(
            "dropped {} months of the archive, their retention over\n",
            r.archive_months_dropped
        );
    }
    out += &format!(
        "{delete} {} completed claims older than {} and {} failed claims older than {}",
        r.deleted_completed,
        age(w.completed),
        r.deleted_failed,
        age(w.failed)
    );
    if !dry_run {
        out += &format!(" in {} batches", r.batches);
    }
    out += &format!(
        "\n{delete} {} dead-letter records older than {}\n",
        r.dead_letters_deleted,
        age(w.dead_letters)
    );
    out
}
