//! The store's tables, read at each scrape on PostgreSQL ([`crate::store::storage_health`]):
//! live and dead rows, table and index bytes, and the oldest transaction holding back vacuum.
//! SQLite has no series.

use crate::store::{Store, StoreResult};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: String,
}

/// The store's storage series.
#[derive(Debug, Default)]
pub struct StorageMetrics {
    live_rows: Family<TableLabel, Gauge>,
    dead_rows: Family<TableLabel, Gauge>,
    table_bytes: Family<TableLabel, Gauge>,
    index_bytes: Family<TableLabel, Gauge>,
    index_fresh_bytes: Family<TableLabel, Gauge>,
    oldest_transaction: Gauge<f64, AtomicU64>,
    horizon_age: Gauge,
}

impl StorageMetrics {
    /// Registers the series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let tables = [
            (
                "store_live_rows",
                "Live rows of claimd's table (PostgreSQL's estimate)",
                &self.live_rows,
            ),
            (
                "store_dead_rows",
                "Dead rows of claimd's table not yet vacuumed: many, with a held-back vacuum, slow every take",
                &self.dead_rows,
            ),
            (
                "store_table_bytes",
                "Bytes of claimd's table on disk, TOAST included, indexes not",
                &self.table_bytes,
            ),
            (
                "store_index_bytes",
                "Bytes of the table's indexes on disk",
                &self.index_bytes,
            ),
            (
                "store_index_fresh_bytes",
                "Bytes a fresh build of the table's indexes would take (estimated; absent when unknown): store_index_bytes at twice this or more, run claimd reindex",
                &self.index_fresh_bytes,
            ),
        ];
        for (name, help, family) in tables {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "store_oldest_transaction_seconds",
            "How long the oldest open transaction in claimd's database has held back vacuum (0: none, or its start is not visible to claimd's role)",
            self.oldest_transaction.clone(),
        );
        registry.register(
            "store_vacuum_horizon_age_transactions",
            "How many transactions old the oldest snapshot vacuum must keep rows for is (a session, a replication slot or a prepared transaction)",
            self.horizon_age.clone(),
        );
    }

    /// Sets the series from one reading of the store; nothing on a store without vacuum.
    pub async fn read(&self, store: &Store) -> StoreResult<()> {
        let Some(health) = store.storage_health().await? else {
            return Ok(());
        };
        for t in &health.tables {
            let label = TableLabel {
                table: t.table.clone(),
            };
            self.live_rows.get_or_create(&label).set(t.live_rows);
            self.dead_rows.get_or_create(&label).set(t.dead_rows);
            self.table_bytes.get_or_create(&label).set(t.table_bytes);
            self.index_bytes.get_or_create(&label).set(t.index_bytes);
            if let Some(fresh) = t.index_fresh_bytes {
                self.index_fresh_bytes.get_or_create(&label).set(fresh);
            }
        }
        self.oldest_transaction
            .set(health.horizon.oldest_transaction_s.unwrap_or(0.0).max(0.0));
        self.horizon_age.set(health.horizon.age_transactions);
        Ok(())
    }
}
