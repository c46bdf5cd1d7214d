//! Scale of work (issue 16 §4): claimd-pg on a table that already holds millions of claims
//! (`BENCH_PREFILL`), and several claimd processes on one database (`BENCH_INSTANCES`), each
//! with the summary table that compares it with the smallest case.

use super::*;

/// The database the table-size runs share, filled once and grown between sizes.
pub(crate) const PREFILL_DB: &str = "claimd_bench_prefill";

/// The kept table-size database and how many bulk claims it holds.
pub(crate) struct Prefill {
    pool: sqlx::PgPool,
    filled: i64,
    largest: i64,
}

impl Prefill {
    /// Opens the table-size database: reused with its bulk claims when a run with
    /// `BENCH_KEEP=1` left it, else created and migrated. `largest` is the size the received
    /// times are spread for (the largest of `BENCH_PREFILL`).
    pub(crate) async fn open(pg: &Pg, largest: i64) -> Self {
        let mut admin = sqlx::PgConnection::connect(&pg.admin).await.unwrap();
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(PREFILL_DB)
                .fetch_one(&mut admin)
                .await
                .unwrap();
        if !exists {
            pg.create(PREFILL_DB).await;
        }
        let url = pg.url(PREFILL_DB);
        migrate(&url).await;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS bench_meta (bulk BIGINT NOT NULL, largest BIGINT NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let kept: Option<(i64, i64)> = sqlx::query_as("SELECT bulk, largest FROM bench_meta")
            .fetch_optional(&pool)
            .await
            .unwrap();
        let (filled, largest) = match kept {
            Some(k) if k.1 == largest => k,
            // Spread for another size: start again.
            _ => {
                sqlx::query("TRUNCATE claims CASCADE")
                    .execute(&pool)
                    .await
                    .unwrap();
                sqlx::query("DELETE FROM bench_meta")
                    .execute(&pool)
                    .await
                    .unwrap();
                sqlx::query("INSERT INTO bench_meta VALUES (0, $1)")
                    .bind(largest)
                    .execute(&pool)
                    .await
                    .unwrap();
                (0, largest)
            }
        };
        Prefill {
            pool,
            filled,
            largest,
        }
    }

    /// Adds the bulk claims missing for `size` and analyses the table; returns the seconds it
    /// took (0 when it already held them).
    pub(crate) async fn grow(&mut self, size: i64) -> f64 {
        if self.filled == size {
            return 0.0;
        }
        let t = Instant::now();
        if self.filled > size {
            // A kept table larger than asked for (BENCH_KEEP=1 after a larger run): start again.
            sqlx::query("TRUNCATE claims CASCADE")
                .execute(&self.pool)
                .await
                .unwrap();
            self.filled = 0;
        }
        support::fill::fill_bulk(&self.pool, self.filled + 1, size, self.largest).await;
        support::fill::vacuum_analyze(&self.pool).await;
        sqlx::query("UPDATE bench_meta SET bulk = $1")
            .bind(size)
            .execute(&self.pool)
            .await
            .unwrap();
        self.filled = size;
        t.elapsed().as_secs_f64()
    }
}

/// One finished run, kept for the summary tables.
pub(crate) struct Done {
    pub(crate) run: Run,
    pub(crate) row: Row,
    /// Seconds spent filling the table before this run (table-size runs).
    pub(crate) fill_s: f64,
}

/// The table-size and instance summaries, when those runs were made.
pub(crate) fn print_scale_tables(done: &[Done]) {
    let sized: Vec<&Done> = done.iter().filter(|d| d.run.prefill.is_some()).collect();
    if !sized.is_empty() {
        println!(
            "\nThroughput against table size (claimd-pg, bulk claims already in the table; ratio to the empty table at the same latency)\n"
        );
        println!(
            "| claims in table | fill s | provider latency ms | posts | msgs/s | of empty table | ack p50/p99 ms | settled p50/p99 ms | PG xacts/msg | load1 before→after |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for d in &sized {
            let base = sized
                .iter()
                .find(|b| b.run.prefill == Some(0) && b.run.latency_ms == d.run.latency_ms)
                .map(|b| b.row.msgs_per_s);
            let ratio = base.map_or("-".into(), |b| {
                format!("{:.0}%", 100.0 * d.row.msgs_per_s / b)
            });
            println!(
                "| {} | {:.0} | {} | {} | {:.0} | {ratio} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {:.2}→{:.2} |",
                thousands(d.run.prefill.unwrap_or(0)),
                d.fill_s,
                d.run.latency_ms,
                d.run.n,
                d.row.msgs_per_s,
                d.row.ack_p50,
                d.row.ack_p99,
                d.row.settled_p50,
                d.row.settled_p99,
                d.row
                    .xacts_per_msg
                    .map_or("-".into(), |x| format!("{x:.2}")),
                d.row.load_before,
                d.row.load_after
            );
        }
    }
    let spread: Vec<&Done> = done
        .iter()
        .filter(|d| d.run.prefill.is_none() && d.run.design == "claimd-pg" && d.run.instances >= 1)
        .filter(|d| {
            done.iter()
                .any(|o| o.run.instances > 1 && o.run.latency_ms == d.run.latency_ms)
        })
        .collect();
    if !spread.is_empty() {
        println!(
            "\nThroughput against instances (claimd-pg processes on one database, the same client connections spread over them; ratio to one instance at the same latency)\n"
        );
        println!(
            "| instances | provider latency ms | posts | client connections | msgs/s | of 1 instance | peak RSS MiB per instance | peak in flight per instance | applied exactly once | PG xacts/msg | load1 before→after |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for d in &spread {
            let base = spread
                .iter()
                .find(|b| b.run.instances == 1 && b.run.latency_ms == d.run.latency_ms)
                .map(|b| b.row.msgs_per_s);
            let ratio = base.map_or("-".into(), |b| {
                format!("{:.0}%", 100.0 * d.row.msgs_per_s / b)
            });
            let rss: Vec<String> = d.row.rss_each.iter().map(|r| format!("{r:.1}")).collect();
            let peak: Vec<String> = d.row.peak_each.iter().map(|p| p.to_string()).collect();
            println!(
                "| {} | {} | {} | {} | {:.0} | {ratio} | {} | {} | {} / {} | {} | {:.2}→{:.2} |",
                d.run.instances,
                d.run.latency_ms,
                d.run.n,
                d.run.clients,
                d.row.msgs_per_s,
                rss.join(" / "),
                peak.join(" / "),
                d.row.applied_once.1,
                d.row.applied_once.0,
                d.row
                    .xacts_per_msg
                    .map_or("-".into(), |x| format!("{x:.2}")),
                d.row.load_before,
                d.row.load_after
            );
        }
    }
}
