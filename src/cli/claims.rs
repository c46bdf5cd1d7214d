//! `claimd claims list|show|resolve|redrive|erase` (the bulk forms of resolve and redrive
//! are in `bulk.rs`, erasure in `erase.rs`).

use super::actor::operator_name;
use super::*;
use crate::domain::redaction::Exposure;
use crate::ops::claim_query::{ClaimQuery, PageError};
use crate::ops::exposure::{shown_claim, shown_claims};
use crate::ops::operator_action::Action;

pub(super) fn time_or_dash(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into())
}

/// Runs `claimd claims ...`, recording a resolve, redrive, cancel or erasure in the audit
/// with how it ended (bulk actions record each claim themselves).
pub(super) async fn audited_claims(app: &App, command: ClaimsCommand) -> Output {
    use crate::domain::operator_role::Action;
    use ClaimsCommand as C;
    let target = |c: &str, t: &str, m: &str| crate::ops::audit::claim_target(c, t, m);
    let single = match &command {
        C::Resolve {
            consumer: Some(c),
            message_id: Some(m),
            tenant,
            to,
            note,
            ..
        } => Some((
            Action::Resolve,
            target(c, tenant, m),
            format!("to {to}; note: {note}"),
        )),
        C::Redrive {
            consumer: Some(c),
            message_id: Some(m),
            tenant,
            note,
            ..
        } => Some((
            Action::Redrive,
            target(c, tenant, m),
            format!("note: {note}"),
        )),
        C::Erase {
            consumer,
            message,
            tenant,
            note,
            dry_run: false,
            ..
        } => Some((
            Action::Erase,
            crate::ops::erasure::Selection::from_parts(
                consumer.as_deref(),
                message.as_deref(),
                tenant,
            )
            .map_or_else(|_| format!("tenant {tenant}"), |s| s.audit_target()),
            format!("note: {note}"),
        )),
        C::Cancel {
            consumer,
            message_id,
            tenant,
            reason,
        } => Some((
            Action::Cancel,
            target(consumer, tenant, message_id),
            format!("reason: {reason}"),
        )),
        _ => None,
    };
    let out = claims(app, command).await;
    if let (Some((action, target, detail)), Ok(who)) = (single, super::cli_audit::cli_identity()) {
        let result = if out.code == 0 {
            crate::ops::audit::AuditResult::Done
        } else {
            let why = out.stderr.lines().next().unwrap_or("");
            crate::ops::audit::AuditResult::Refused(why.trim_start_matches("claimd: ").to_string())
        };
        super::cli_audit::record_cli(
            app,
            &who,
            crate::ops::audit::AuditAction::Act(action),
            &target,
            result,
            &detail,
        )
        .await;
    }
    out
}

pub(super) async fn claims(app: &App, command: ClaimsCommand) -> Output {
    let store = &app.store;
    match command {
        ClaimsCommand::List {
            state,
            stuck,
            consumer,
            tenant,
            search,
            since,
            until,
            cursor,
            limit,
            format,
        } => {
            let query = ClaimQuery {
                q: search,
                consumer,
                state: state.map(|s| s.to_string()),
                tenant,
                stuck: Some(stuck),
                since,
                until,
                cursor,
                limit: Some(limit),
            };
            // On the read replica when there is one ([store] read_url).
            let reader = match app.reads.reader().await {
                Ok(r) => r,
                Err(e) => return Output::store(app, &e),
            };
            let page = match query.page(reader.store.as_ref(), limit).await {
                Ok(p) => p,
                Err(PageError::Query(e)) => return Output::fail(2, e),
                Err(PageError::Store(e)) => return Output::read_store(app, &reader.from, &e),
            };
            let (now, mut list) = (page.now, page.claims);
            shown_claims(&app.config, &mut list, Exposure::Masked);
            let next = page.next.map(|c| c.encode());
            // Where it was read, on stderr: the listing itself stays clean for scripts.
            let read_from = reader
                .from
                .notice()
                .map(|n| format!("{n}\n"))
                .unwrap_or_default();
            if format == Format::Json {
                let mut body = serde_json::json!({ "claims": list, "next_cursor": next });
                if app.reads.has_replica() {
                    body["read_from"] = serde_json::json!(reader.from);
                }
                let mut out = Output::ok(to_json(&body));
                out.stderr = read_from;
                return out;
            }
            // CSV is for scripts (every field, exact times); the table for people.
            let csv = format == Format::Csv;
            let columns = [
                "consumer",
                "tenant",
                "message_id",
                "state",
                "attempt",
                "stuck",
                "received_utc",
                "processed_utc",
                "last_error",
            ];
            // The table shows stuck in the state column and leaves out the processed time.
            let header: Vec<&str> = columns
                .into_iter()
                .filter(|c| csv || !matches!(*c, "stuck" | "processed_utc"))
                .collect();
            let mut t = Table::new(&header);
            for c in &list {
                let stuck = c.is_stuck(now);
                let mut row = vec![c.consumer.clone(), c.tenant.clone(), c.message_id.clone()];
                if csv {
                    row.extend([
                        c.state.to_string(),
                        c.attempt.to_string(),
                        stuck.to_string(),
                        c.received_utc.to_rfc3339(),
                        time_or_dash(c.processed_utc),
                    ]);
                } else {
                    row.extend([
                        if stuck {
                            format!("{} (stuck)", c.state)
                        } else {
                            c.state.to_string()
                        },
                        c.attempt.to_string(),
                        c.received_utc.format("%Y-%m-%d %H:%M:%S").to_string(),
                    ]);
                }
                row.push(c.last_error.clone().unwrap_or_default());
                t.row(row);
            }
            let mut out = Output::ok(if csv { t.csv() } else { t.text() });
            // On stderr: the listing itself stays clean for scripts.
            out.stderr = read_from;
            if let Some(next) = next {
                out.stderr += &format!("more claims: add --cursor {next} for the next page\n");
            }
            out
        }
        ClaimsCommand::Show {
            consumer,
            message_id,
            tenant,
            format,
            reveal,
        } => {
            let mut claim = match store.find(&consumer, &tenant, &message_id).await {
                Ok(Some(c)) => c,
                Ok(None) => {
                    return Output::fail(
                        1,
                        format!("no claim {consumer}/{message_id} (tenant {tenant:?})"),
                    );
                }
                Err(e) => return Output::store(app, &e),
            };
            let mut history = match store.events(claim.id).await {
                Ok(h) => h,
                Err(e) => return Output::store(app, &e),
            };
            // A local operator may see everything (--reveal); masked otherwise.
            let exposure = if reveal {
                Exposure::Revealed
            } else {
                Exposure::Masked
            };
            let stored_bytes = claim.payload.len();
            shown_claim(&app.config, &mut claim, &mut history, exposure);
            let payload = match claim.erased_utc {
                Some(at) => format!("(erased {})", at.to_rfc3339()),
                None => String::from_utf8_lossy(&claim.payload).into_owned(),
            };
            let now = store.now().await;
            let behind = match store.waiting_behind(&claim).await {
                Ok(head) => head,
                Err(e) => return Output::store(app, &e),
            };
            let trace_id = claim.trace_id();
            let family = match store.family(claim.id).await {
                Ok(f) => f,
                Err(e) => return Output::store(app, &e),
            };
            let (parent, children) = crate::ops::claim_family::family_links(&family);
            if format == Format::Json {
                return Output::ok(to_json(&serde_json::json!({
                    "claim": claim, "payload": payload, "history": history,
                    "waiting_behind": behind, "trace_id": trace_id,
                    "parent": parent, "children": children
                })));
            }
            let mut s = String::new();
            let mut fields: Vec<(&str, String)> = vec![
                ("consumer", claim.consumer.clone()),
                ("tenant", claim.tenant.clone()),
                ("message_id", claim.message_id.clone()),
                ("idempotency key", claim.idem_key.clone()),
                ("state", claim.state.to_string()),
                ("attempt", claim.attempt.to_string()),
                ("version", claim.version.to_string()),
                (
                    "lease",
                    format!(
                        "{} until {}{}",
                        claim.lease_owner.clone().unwrap_or_else(|| "-".into()),
                        time_or_dash(claim.lease_until),
                        match (claim.lease_until, now.as_ref()) {
                            (Some(until), Ok(now)) if until < *now => " (expired)",
                            _ => "",
                        }
                    ),
                ),
                ("received", claim.received_utc.to_rfc3339()),
                ("started", claim.started_utc.to_rfc3339()),
                ("processed", time_or_dash(claim.processed_utc)),
                ("fingerprint", claim.fingerprint.clone()),
                ("content type", claim.content_type.clone()),
                ("payload bytes", stored_bytes.to_string()),
                ("payload", payload),
                ("duplicates", claim.duplicate_count.to_string()),
                ("mismatches", claim.mismatch_count.to_string()),
                ("re-sent", claim.resent_count.to_string()),
                ("reconciled", claim.reconciled.to_string()),
                (
                    "provider status",
                    claim
                        .provider_status
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
                (
                    "provider answer",
                    claim
                        .provider_response
                        .clone()
                        .unwrap_or_else(|| "-".into()),
                ),
                (
                    "last error",
                    claim.last_error.clone().unwrap_or_else(|| "-".into()),
                ),
            ];
            if let Some(at) = claim.not_before {
                let when = match claim.is_scheduled() {
                    true => format!("{} (scheduled: not sent before then)", at.to_rfc3339()),
                    false => at.to_rfc3339(),
                };
                fields.insert(7, ("not before", when));
            }
            if let Some(key) = &claim.order_key {
                fields.insert(7, ("order key", key.clone()));
            }
            if let Some(id) = trace_id {
                fields.push(("trace", id));
            }
            if let Some(p) = &parent {
                fields.push(("parent", p.to_string()));
            }
            for c in &children {
                fields.push(("child", c.to_string()));
            }
            if let Some(head) = &behind {
                let why = format!(
                    "{} ({}, attempt {})",
                    head.message_id, head.state, head.attempt
                );
                fields.insert(8, ("waiting behind", why));
            }
            // Values from clients and providers: one line each, nothing a terminal would act on.
            for (k, v) in fields {
                let _ = writeln!(s, "{k:<16} {}", escape_controls(&v));
            }
            s.push_str("\nhistory:\n");
            let mut t = Table::new(&[
                "at_utc", "attempt", "actor", "action", "outcome", "status", "detail",
            ]);
            for e in &history {
                t.row(vec![
                    e.at_utc.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                    e.attempt.to_string(),
                    e.actor.clone(),
                    e.action.clone(),
                    e.outcome.clone(),
                    e.provider_status.map(|s| s.to_string()).unwrap_or_default(),
                    e.detail.clone().unwrap_or_default(),
                ]);
            }
            s.push_str(&t.text());
            Output::ok(s)
        }
        ClaimsCommand::Erase {
            consumer,
            message,
            tenant,
            note,
            dry_run,
            format,
        } => {
            let args = super::erase::EraseArgs {
                consumer,
                message,
                tenant,
                note,
                dry_run,
                format,
            };
            super::erase::erase(app, args).await
        }
        ClaimsCommand::Resolve {
            consumer,
            message_id,
            to,
            note,
            tenant,
            bulk,
        } => {
            if note.trim().is_empty() {
                return Output::fail(2, "--note must say why");
            }
            let (Some(consumer), Some(message_id)) = (consumer, message_id) else {
                return super::bulk::bulk(app, &bulk, Action::resolve_as(to), note.trim()).await;
            };
            let actor = match operator_name() {
                Ok(a) => a,
                Err(why) => return Output::fail(2, why),
            };
            match store
                .resolve(&consumer, &tenant, &message_id, to, &actor, &note, None)
                .await
            {
                Ok(Some(Ok(c))) => Output::ok(format!(
                    "{}/{} is now {} (by {actor}: {note})\n",
                    c.consumer, c.message_id, c.state
                )),
                Ok(Some(Err(state))) => Output::fail(
                    1,
                    format!(
                        "{consumer}/{message_id} is {state}; only needs_attention or failed claims can be resolved{}",
                        if state == ClaimState::Started {
                            " (a started claim belongs to the worker and the sweeper)"
                        } else {
                            ""
                        }
                    ),
                ),
                Ok(None) => Output::fail(
                    1,
                    format!("no claim {consumer}/{message_id} (tenant {tenant:?})"),
                ),
                Err(e) => Output::store(app, &e),
            }
        }
        ClaimsCommand::Cancel {
            consumer,
            message_id,
            reason,
            tenant,
        } => {
            if reason.trim().is_empty() {
                return Output::fail(2, "--reason must say why");
            }
            let actor = match operator_name() {
                Ok(a) => a,
                Err(why) => return Output::fail(2, why),
            };
            let reason = reason.trim();
            match crate::ops::schedule::cancel(
                store,
                &consumer,
                &tenant,
                &message_id,
                &actor,
                reason,
            )
            .await
            {
                Ok(c) => Output::ok(format!(
                    "{}/{} is cancelled: {} (never sent)\n",
                    c.consumer, c.message_id, c.state
                )),
                Err(crate::ops::schedule::CancelError::Store(e)) => Output::store(app, &e),
                Err(e) => Output::fail(1, e.to_string()),
            }
        }
        ClaimsCommand::Redrive {
            consumer,
            message_id,
            note,
            tenant,
            bulk,
        } => {
            let note = note.trim();
            let (Some(consumer), Some(message_id)) = (consumer, message_id) else {
                return super::bulk::bulk(app, &bulk, Action::Redrive, note).await;
            };
            let actor = match operator_name() {
                Ok(a) => a,
                Err(why) => return Output::fail(2, why),
            };
            match store
                .redrive_noted(&consumer, &tenant, &message_id, &actor, note, None)
                .await
            {
                // The redrive started the attempt the sweep that takes it over performs.
                Ok(Some(Ok(c))) => Output::ok(format!(
                    "{}/{} is started again; the next sweep performs it as attempt {} with key {:?}\n",
                    c.consumer, c.message_id, c.attempt, c.idem_key
                )),
                Ok(Some(Err(state))) => Output::fail(
                    1,
                    format!(
                        "{consumer}/{message_id} is {state}; only needs_attention or failed claims can be redriven{}",
                        if state == ClaimState::Started {
                            " (a started claim is the sweeper's: once its lease has expired, `claimd sweep` sends it again now)"
                        } else {
                            ""
                        }
                    ),
                ),
                Ok(None) => Output::fail(
                    1,
                    format!("no claim {consumer}/{message_id} (tenant {tenant:?})"),
                ),
                Err(e @ crate::store::StoreError::Erased(_)) => Output::fail(1, e),
                Err(e) => Output::store(app, &e),
            }
        }
    }
}
