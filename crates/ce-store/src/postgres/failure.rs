//! One classification of PostgreSQL failures, shared by the store and the indexes that use
//! the same pool (pgvector): what a SQLSTATE (or its absence) means to the caller. The table
//! is in docs/postgres.md ("Errors"); [`PgFailure::of_sqlstate`] is its code.

/// What a PostgreSQL failure means to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgFailure {
    /// The server cannot be reached, dropped the connection, or refuses work for now: retry.
    Unavailable,
    /// A concurrent writer got there first (integrity violation, class 23): a retry reads the
    /// new state.
    Raced,
    /// Bad data, stored or sent (class 22), or the server's own internal error (XX): never
    /// retried.
    Corrupt,
    /// Anything else: a permanent condition or a bug (a missing table or privilege, a syntax
    /// error, a value the client cannot convert): never retried.
    Permanent,
}

impl PgFailure {
    /// The class of `e`. Without a SQLSTATE, a closed connection or an I/O error is
    /// unavailable, and an error raised in the client (a type that does not convert) is
    /// permanent: it would repeat.
    pub fn of(e: &postgres::Error) -> Self {
        let Some(code) = e.code() else {
            let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
            return if e.is_closed() || io {
                PgFailure::Unavailable
            } else {
                PgFailure::Permanent
            };
        };
        // "cached plan must not change result type" (0A000, like every unsupported feature):
        // the connection is dropped, so a retry prepares the statement afresh.
        let stale_plan = e
            .as_db_error()
            .is_some_and(|db| db.routine() == Some("RevalidateCachedQuery"));
        if stale_plan {
            return PgFailure::Unavailable;
        }
        Self::of_sqlstate(code.code())
    }

    /// The class of a SQLSTATE sent by the server.
    pub fn of_sqlstate(code: &str) -> Self {
        match code.get(..2).unwrap_or("") {
            // Connection exceptions, transaction rollbacks (serialization failures,
            // deadlocks), insufficient resources, operator intervention (shutdown, a
            // terminated backend, a cancelled statement), system errors (I/O at the server).
            "08" | "40" | "53" | "57" | "58" => PgFailure::Unavailable,
            // Lock not available, object in use.
            "55" if matches!(code, "55P03" | "55006") => PgFailure::Unavailable,
            "23" => PgFailure::Raced,
            "22" | "XX" => PgFailure::Corrupt,
            _ => PgFailure::Permanent,
        }
    }

    /// Whether the failed operation may succeed when retried.
    pub fn is_retryable(self) -> bool {
        match self {
            PgFailure::Unavailable | PgFailure::Raced => true,
            PgFailure::Corrupt | PgFailure::Permanent => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PgFailure;

    #[test]
    fn each_sqlstate_class_is_decided_once() {
        let table = [
            ("08006", PgFailure::Unavailable),
            ("40001", PgFailure::Unavailable),
            ("40P01", PgFailure::Unavailable),
            ("53300", PgFailure::Unavailable),
            ("57014", PgFailure::Unavailable),
            ("57P01", PgFailure::Unavailable),
            ("58030", PgFailure::Unavailable),
            ("55P03", PgFailure::Unavailable),
            ("55006", PgFailure::Unavailable),
            ("55000", PgFailure::Permanent),
            ("23505", PgFailure::Raced),
            ("23503", PgFailure::Raced),
            ("22012", PgFailure::Corrupt),
            ("XX001", PgFailure::Corrupt),
            ("42P01", PgFailure::Permanent),
            ("42501", PgFailure::Permanent),
            ("3F000", PgFailure::Permanent),
            ("0A000", PgFailure::Permanent),
            ("", PgFailure::Permanent),
        ];
        for (code, class) in table {
            assert_eq!(PgFailure::of_sqlstate(code), class, "{code}");
        }
        assert!(PgFailure::Unavailable.is_retryable() && PgFailure::Raced.is_retryable());
        assert!(!PgFailure::Corrupt.is_retryable() && !PgFailure::Permanent.is_retryable());
    }
}
