//! The bulk forms of `claimd claims resolve|redrive`: every parked claim of a consumer whose
//! reason starts with some text, selected as the operator page's bulk action selects them
//! ([`crate::ops::operator_action`]). Without `--yes` the command only lists what it would do and
//! how to apply it; with `--yes` it lists the claims it selects now and acts on exactly those,
//! one guarded store transition each, reporting per claim whether it changed or was skipped
//! because its state changed since it was listed.

use super::actor::operator_name;
use super::*;
use crate::domain::claim::Claim;
use crate::ops::audit::{AuditAction, AuditResult, claim_target};
use crate::ops::operator_action::{Action, BULK_LIMIT, Outcome, Target, act, select_parked};
use crate::ops::operator_command::OperatorCommands;

/// Runs a bulk form (`args.consumer` is set: clap requires it when no claim is named).
pub(super) async fn bulk(app: &App, args: &BulkArgs, action: Action, note: &str) -> Output {
    let Some(consumer) = args.consumer.as_deref() else {
        return Output::fail(
            2,
            "name a claim (CONSUMER MESSAGE_ID) or a --consumer to select",
        );
    };
    let reason = args.reason_prefix.as_deref().unwrap_or("");
    let selection = match select_parked(app.store.as_ref(), consumer, reason).await {
        Ok(s) => s,
        Err(e) => return Output::store(app, &e),
    };
    let which = if reason.is_empty() {
        format!("parked claims of {consumer} (any reason)")
    } else {
        format!("parked claims of {consumer} whose reason starts with {reason:?}")
    };
    if selection.claims.is_empty() {
        return Output::ok(format!("no {which}: nothing to do\n"));
    }
    let actor = match operator_name() {
        Ok(a) => a,
        Err(why) => return Output::fail(2, why),
    };
    let n = selection.claims.len();
    let verb = action.verb();
    let mut s = format!(
        "{}{verb} {n} {which}, recorded as {actor}{}:\n",
        if args.yes { "" } else { "would " },
        if note.is_empty() {
            String::new()
        } else {
            format!(" with the note {note:?}")
        }
    );
    let _ = writeln!(s, "  {}", action.describe());
    if selection.more {
        let _ = writeln!(
            s,
            "over {BULK_LIMIT} claims match: {} the {BULK_LIMIT} newest; run it again for the rest, or narrow --reason-prefix",
            if args.yes {
                "this acts on"
            } else {
                "this lists"
            }
        );
    }
    let commands = OperatorCommands::for_config(&app.config);
    if !args.yes {
        s.push_str(&table(&selection.claims, None).text());
        let _ = writeln!(
            s,
            "preview only: nothing changed. To apply, run the same command with --yes:\n  {}",
            commands.bulk(action, consumer, reason, note, true)
        );
        return Output::ok(s);
    }
    let mut results = Vec::with_capacity(n);
    let who = super::cli_audit::cli_who();
    for claim in &selection.claims {
        let outcome = act(app.store.as_ref(), action, &Target::of(claim), &actor, note).await;
        tracing::info!(actor = %actor, action = action.name(), claim = %Target::of(claim).label(), result = %outcome.describe(), "operator bulk action");
        if let Some(who) = &who {
            let result = if outcome.done() {
                AuditResult::Done
            } else {
                AuditResult::Refused(outcome.describe())
            };
            let what = match action {
                Action::Redrive => crate::domain::operator_role::Action::Redrive,
                _ => crate::domain::operator_role::Action::Resolve,
            };
            let target = claim_target(&claim.consumer, &claim.tenant, &claim.message_id);
            let detail = format!("{verb} in bulk; note: {note}");
            super::cli_audit::record_cli(
                app,
                who,
                AuditAction::Act(what),
                &target,
                result,
                &detail,
            )
            .await;
        }
        results.push(outcome);
    }
    s.push_str(&table(&selection.claims, Some(&results)).text());
    let done = results.iter().filter(|o| o.done()).count();
    let failed = results
        .iter()
        .filter(|o| matches!(o, Outcome::Failed(_)))
        .count();
    let _ = writeln!(
        s,
        "{done} done, {} skipped (their state changed since they were listed), {failed} store failures",
        n - done - failed
    );
    let mut out = Output::ok(s);
    if failed > 0 {
        out.code = 1;
        out.stderr = format!("claimd: {failed} claims not changed: the store failed\n");
    }
    out
}

/// One row per claim: where it is, its state and reason when listed, and what happened.
fn table(claims: &[Claim], results: Option<&[Outcome]>) -> Table {
    let mut header = vec!["consumer", "tenant", "message_id", "state", "reason"];
    if results.is_some() {
        header.push("result");
    }
    let mut t = Table::new(&header);
    for (i, c) in claims.iter().enumerate() {
        let mut row = vec![
            c.consumer.clone(),
            // An empty tenant is "none", not a blank that reads as a missing column.
            if c.tenant.is_empty() {
                "-".into()
            } else {
                c.tenant.clone()
            },
            c.message_id.clone(),
            c.state.to_string(),
            c.last_error.clone().unwrap_or_default(),
        ];
        if let Some(r) = results.and_then(|r| r.get(i)) {
            let word = match r {
                Outcome::Done(_) => "done",
                Outcome::Failed(_) => "failed",
                Outcome::Skipped(_) | Outcome::Changed { .. } | Outcome::Gone => "skipped",
            };
            row.push(format!("{word}: {}", r.describe()));
        }
        t.row(row);
    }
    t
}
