//! `claimd schedules`: the configured `[[schedules]]` with their last and next slots.

use super::{Format, Output};
use crate::domain::table::Table;
use crate::service::app::App;

/// Runs `claimd schedules`.
pub(super) async fn schedules_cmd(app: &App, format: Format) -> Output {
    let now = match app.store.now().await {
        Ok(now) => now,
        Err(e) => return Output::store(app, &e),
    };
    let list = match crate::ops::periodic::list(app.store.as_ref(), &app.config, now).await {
        Ok(list) => list,
        Err(e) => return Output::store(app, &e),
    };
    if format == Format::Json {
        return Output::ok(super::to_json(&list));
    }
    if list.is_empty() && format == Format::Table {
        return Output::ok("no [[schedules]] configured\n".into());
    }
    let mut t = Table::new(&[
        "name",
        "cron",
        "consumer",
        "tenant",
        "catch_up",
        "last_slot_utc",
        "next_slot_utc",
    ]);
    for s in &list {
        t.row(vec![
            s.name.clone(),
            s.cron.clone(),
            s.consumer.clone(),
            if s.tenant.is_empty() {
                "-".into()
            } else {
                s.tenant.clone()
            },
            s.catch_up.clone(),
            slot_or(s.last_slot_utc, "not run yet"),
            slot_or(s.next_slot_utc, "none"),
        ]);
    }
    Output::ok(if format == Format::Csv {
        t.csv()
    } else {
        t.text()
    })
}

fn slot_or(slot: Option<chrono::DateTime<chrono::Utc>>, none: &str) -> String {
    slot.map(crate::domain::periodic::slot_text)
        .unwrap_or_else(|| none.to_string())
}
