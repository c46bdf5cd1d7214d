//! `claimd claims erase`: a person's data erased on request — one message, or every claim of
//! a tenant — through [`crate::ops::erasure`], recorded in each claim's history with who did
//! it ([`operator_name`]).

use super::actor::operator_name;
use super::*;
use crate::ops::erasure::{self, Selection, Verdict};

/// What `claims erase` was asked.
pub(super) struct EraseArgs {
    pub consumer: Option<String>,
    pub message: Option<String>,
    pub tenant: String,
    pub note: String,
    pub dry_run: bool,
    pub format: Format,
}

pub(super) async fn erase(app: &App, a: EraseArgs) -> Output {
    let selection =
        match Selection::from_parts(a.consumer.as_deref(), a.message.as_deref(), &a.tenant) {
            Ok(s) => s,
            Err(why) => return Output::fail(2, why),
        };
    let actor = match operator_name() {
        Ok(a) => a,
        Err(why) => return Output::fail(2, why),
    };
    let report = match erasure::erase(
        app.store.as_ref(),
        &selection,
        &actor,
        a.note.trim(),
        a.dry_run,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return Output::store(app, &e),
    };
    if report.claims.is_empty() {
        let what = match &selection {
            Selection::Message {
                consumer,
                tenant,
                message_id,
            } => format!("no claim {consumer}/{message_id} (tenant {tenant:?})"),
            Selection::Tenant(t) => format!("no claims of tenant {t:?}"),
        };
        return Output::fail(1, what);
    }
    if a.format == Format::Json {
        return Output::ok(to_json(&report));
    }
    let mut t = Table::new(&["consumer", "tenant", "message_id", "state", "result", "why"]);
    for l in &report.claims {
        let result = match (l.verdict, report.dry_run) {
            (Verdict::Erased, true) => "would erase",
            (Verdict::Erased, false) => "erased",
            (Verdict::AlreadyErased, _) => "already erased",
            (Verdict::Open, _) => "not erased",
        };
        t.row(vec![
            l.consumer.clone(),
            l.tenant.clone(),
            l.message_id.clone(),
            l.state.to_string(),
            result.into(),
            l.why.clone().unwrap_or_default(),
        ]);
    }
    let (erased, open) = (report.count(Verdict::Erased), report.count(Verdict::Open));
    let mut s = if a.format == Format::Csv {
        t.csv()
    } else {
        t.text()
    };
    if a.format == Format::Table {
        let _ = writeln!(
            s,
            "\n{erased} {} by {actor}; {open} open (not erased: finish or resolve them, then erase again)",
            if report.dry_run {
                "would be erased"
            } else {
                "erased"
            }
        );
    }
    Output::ok(s)
}
