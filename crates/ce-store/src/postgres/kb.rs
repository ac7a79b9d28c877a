//! The knowledge-base tables on PostgreSQL ([`KbTx`]); the SQL mirrors `sqlite/kb.rs`, what
//! the ops mean is `crate::kb::logic`'s.

use postgres::Row;

use super::PgStore;
use super::rows::PgTx;
use crate::error::Result;
use crate::kb::rows::{
    BASE_COLUMNS, ITEM_COLUMNS, KbTx, STATUS_COUNTS_SQL, base_from, base_settings, error_columns,
    item_from, recent_failures_sql,
};
use crate::kb::{BaseStatus, ItemStatus, KbItem, KnowledgeBase};

type Params<'a> = &'a [&'a (dyn postgres::types::ToSql + Sync)];

impl PgTx<'_, '_> {
    fn kb_rows<T>(
        &mut self,
        sql: &str,
        p: Params<'_>,
        decode: fn(&Row) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.tx.query(sql, p)?.iter().map(decode).collect()
    }
}

fn base_row(r: &Row) -> Result<KnowledgeBase> {
    base_from(r)
}

fn item_row(r: &Row) -> Result<KbItem> {
    item_from(r)
}

impl KbTx for PgTx<'_, '_> {
    fn kb_insert_base(&mut self, b: &KnowledgeBase) -> Result<bool> {
        let n = self.tx.execute(
            &format!(
                "INSERT INTO knowledge_bases ({BASE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT DO NOTHING"
            ),
            &[
                &b.name,
                &b.root.as_str(),
                &base_settings(b)?,
                &b.status.as_str(),
                &b.created_at_ms,
                &b.updated_at_ms,
            ],
        )?;
        Ok(n == 1)
    }

    fn kb_base(&mut self, name: &str) -> Result<Option<KnowledgeBase>> {
        Ok(self
            .kb_rows(
                &format!("SELECT {BASE_COLUMNS} FROM knowledge_bases WHERE name = $1"),
                &[&name],
                base_row,
            )?
            .pop())
    }

    fn kb_bases(&mut self) -> Result<Vec<KnowledgeBase>> {
        self.kb_rows(
            &format!("SELECT {BASE_COLUMNS} FROM knowledge_bases ORDER BY name"),
            &[],
            base_row,
        )
    }

    fn kb_set_base_status(&mut self, name: &str, status: BaseStatus, now: i64) -> Result<()> {
        self.tx.execute(
            "UPDATE knowledge_bases SET status = $2, updated_at = $3 WHERE name = $1",
            &[&name, &status.as_str(), &now],
        )?;
        Ok(())
    }

    fn kb_delete_base(&mut self, name: &str) -> Result<()> {
        self.tx
            .execute("DELETE FROM knowledge_bases WHERE name = $1", &[&name])?;
        Ok(())
    }

    fn kb_insert_item(&mut self, i: &KbItem) -> Result<bool> {
        let (code, message) = error_columns(i);
        let n = self.tx.execute(
            &format!(
                "INSERT INTO kb_items ({ITEM_COLUMNS})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                 ON CONFLICT DO NOTHING"
            ),
            &[
                &i.base,
                &i.id,
                &i.parent_id,
                &i.kind.as_str(),
                &i.source,
                &i.node_uri.as_str(),
                &i.status.as_str(),
                &code,
                &message,
                &i.through_seq,
                &i.created_at_ms,
                &i.updated_at_ms,
                &i.fingerprint,
            ],
        )?;
        Ok(n == 1)
    }

    fn kb_item(&mut self, base: &str, id: &str) -> Result<Option<KbItem>> {
        Ok(self
            .kb_rows(
                &format!("SELECT {ITEM_COLUMNS} FROM kb_items WHERE base = $1 AND id = $2"),
                &[&base, &id],
                item_row,
            )?
            .pop())
    }

    fn kb_items(&mut self, base: &str) -> Result<Vec<KbItem>> {
        self.kb_rows(
            &format!("SELECT {ITEM_COLUMNS} FROM kb_items WHERE base = $1 ORDER BY id"),
            &[&base],
            item_row,
        )
    }

    fn kb_children(&mut self, base: &str, parent: &str) -> Result<Vec<KbItem>> {
        self.kb_rows(
            &format!(
                "SELECT {ITEM_COLUMNS} FROM kb_items WHERE base = $1 AND parent_id = $2 ORDER BY id"
            ),
            &[&base, &parent],
            item_row,
        )
    }

    fn kb_in_status(&mut self, status: ItemStatus) -> Result<Vec<KbItem>> {
        self.kb_rows(
            &format!("SELECT {ITEM_COLUMNS} FROM kb_items WHERE status = $1 ORDER BY base, id"),
            &[&status.as_str()],
            item_row,
        )
    }

    fn kb_update_item(&mut self, i: &KbItem) -> Result<()> {
        let (code, message) = error_columns(i);
        self.tx.execute(
            "UPDATE kb_items SET status = $3, error_code = $4, error_message = $5,
             through_seq = $6, updated_at = $7, fingerprint = $8 WHERE base = $1 AND id = $2",
            &[
                &i.base,
                &i.id,
                &i.status.as_str(),
                &code,
                &message,
                &i.through_seq,
                &i.updated_at_ms,
                &i.fingerprint,
            ],
        )?;
        Ok(())
    }

    fn kb_delete_item(&mut self, base: &str, id: &str) -> Result<()> {
        self.tx.execute(
            "DELETE FROM kb_items WHERE base = $1 AND id = $2",
            &[&base, &id],
        )?;
        Ok(())
    }

    fn kb_max_seq(&mut self) -> Result<i64> {
        Ok(self
            .tx
            .query_one("SELECT coalesce(max(seq), 0) FROM events", &[])?
            .try_get(0)?)
    }

    fn kb_status_counts(&mut self) -> Result<Vec<(String, String, i64)>> {
        self.kb_rows(STATUS_COUNTS_SQL, &[], |r| {
            Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
        })
    }

    fn kb_recent_failures(&mut self, per_base: i64) -> Result<Vec<KbItem>> {
        self.kb_rows(&recent_failures_sql("$1"), &[&per_base], item_row)
    }
}

impl PgStore {
    /// A read snapshot of the knowledge-base tables.
    fn read_kb<T>(&self, f: impl FnOnce(&mut dyn KbTx) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.read(|tx| f(&mut PgTx::new(tx, consumers)))
    }
}

crate::kb::logic::impl_kb_store!(PgStore);
