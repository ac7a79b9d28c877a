//! The store and the pgvector index classify a PostgreSQL failure the same way
//! (`ce_store::postgres::PgFailure`, docs/postgres.md "Errors"): real errors from a real
//! server, one per row of the table, raised with `RAISE … USING ERRCODE`.

use ce_core::Classify;
use ce_index::IndexError;
use ce_store::StoreError;
use ce_store::postgres::PgFailure;
use ce_testkit::pg::{TestDb, connect};

#[test]
fn store_and_index_classify_every_sqlstate_class_alike() {
    let db = TestDb::create("pg_errors");
    let mut client = connect(db.url());
    let cases = [
        ("08006", PgFailure::Unavailable),
        ("40001", PgFailure::Unavailable),
        ("53300", PgFailure::Unavailable),
        ("57014", PgFailure::Unavailable),
        ("58030", PgFailure::Unavailable),
        ("55P03", PgFailure::Unavailable),
        ("55006", PgFailure::Unavailable),
        ("23505", PgFailure::Raced),
        ("22012", PgFailure::Corrupt),
        ("XX001", PgFailure::Corrupt),
        ("42P01", PgFailure::Permanent),
        ("55000", PgFailure::Permanent),
    ];
    for (code, class) in cases {
        let sql = format!("DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{code}'; END $$");
        let e = client.batch_execute(&sql).expect_err("raises");
        assert_eq!(PgFailure::of(&e), class, "{code}");
        let retryable = class.is_retryable();
        let store = StoreError::from(client.batch_execute(&sql).expect_err("raises"));
        let index = IndexError::from(e);
        assert_eq!(store.is_retryable(), retryable, "{code}: store {store}");
        assert_eq!(index.is_retryable(), retryable, "{code}: index {index}");
        assert_eq!(
            store.code() == ce_core::ErrorCode::Unavailable,
            class == PgFailure::Unavailable,
            "{code}: store {store}"
        );
        assert_eq!(
            index.code() == ce_core::ErrorCode::Unavailable,
            class == PgFailure::Unavailable,
            "{code}: index {index}"
        );
    }
    // A real data exception and a real missing table, not raised by hand.
    let e = client
        .query("SELECT 1 / 0", &[])
        .expect_err("division by zero");
    assert_eq!(PgFailure::of(&e), PgFailure::Corrupt);
    let e = client
        .query("SELECT * FROM no_such_table", &[])
        .expect_err("missing table");
    assert!(!StoreError::from(e).is_retryable());
    // An error raised in the client (a column read as the wrong type) repeats: permanent.
    let row = client.query_one("SELECT 'text'::text", &[]).expect("row");
    let e = row.try_get::<_, i64>(0).expect_err("not an integer");
    assert_eq!(PgFailure::of(&e), PgFailure::Permanent);
    assert!(!IndexError::from(e).is_retryable());
}
