//! The delete-safety policy (DESIGN.md decision 11; spec `incremental-projection-cursors`,
//! "Delete Safety Policy"): the most dangerous bug of a derived index is to take an
//! incomplete source for a mass deletion. So a *derived* deletion — reconcile's orphan
//! deletes, later a re-import sync or a rebuild — is refused when it would remove
//!
//! - more than [`DeleteSafety::MAX_DELETES`] (1,000) records, or
//! - more than [`DeleteSafety::MAX_FRACTION`] (25 %) of its scope, when the scope (the
//!   records present before the deletion) holds at least [`DeleteSafety::MIN_SCOPE`] (20),
//!
//! unless the caller passes an explicit override after checking that the source is complete.
//! A user's own `rm` is authoritative and never goes through this check.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The policy; [`DeleteSafety::check`] is the one place its numbers are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteSafety;

impl DeleteSafety {
    /// More deletes than this are refused whatever the scope.
    pub const MAX_DELETES: u64 = 1_000;
    /// Scopes smaller than this are exempt from the fraction rule.
    pub const MIN_SCOPE: u64 = 20;
    /// The largest share of a scope (of at least [`Self::MIN_SCOPE`]) that may be deleted,
    /// as the fraction `NUM / DEN` (25 %).
    pub const MAX_FRACTION: (u64, u64) = (1, 4);

    /// Checks a derived deletion of `deletes` records out of a scope of `scope_size` records
    /// (what the scope held before): `Err` names the limit it passes.
    pub fn check(deletes: u64, scope_size: u64) -> Result<(), LargeDelete> {
        let (num, den) = Self::MAX_FRACTION;
        let limit = if deletes > Self::MAX_DELETES {
            Some(DeleteLimit::Count)
        } else if scope_size >= Self::MIN_SCOPE
            && u128::from(deletes) * u128::from(den) > u128::from(scope_size) * u128::from(num)
        {
            Some(DeleteLimit::Fraction)
        } else {
            None
        };
        match limit {
            None => Ok(()),
            Some(limit) => Err(LargeDelete {
                deletes,
                scope_size,
                limit,
            }),
        }
    }
}

/// Which limit of the policy a deletion passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeleteLimit {
    /// More than [`DeleteSafety::MAX_DELETES`] records.
    Count,
    /// More than [`DeleteSafety::MAX_FRACTION`] of a scope of at least
    /// [`DeleteSafety::MIN_SCOPE`].
    Fraction,
}

/// A derived deletion refused by [`DeleteSafety::check`].
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    thiserror::Error,
    schemars::JsonSchema,
)]
pub struct LargeDelete {
    /// Records it would delete.
    pub deletes: u64,
    /// Records in its scope before it.
    pub scope_size: u64,
    /// The limit it passes.
    pub limit: DeleteLimit,
}

impl fmt::Display for LargeDelete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = if self.scope_size == 0 {
            100.0
        } else {
            self.deletes as f64 * 100.0 / self.scope_size as f64
        };
        write!(
            f,
            "would delete {} of {} records ({pct:.0} %), ",
            self.deletes, self.scope_size
        )?;
        match self.limit {
            DeleteLimit::Count => write!(f, "more than {}", DeleteSafety::MAX_DELETES),
            DeleteLimit::Fraction => write!(
                f,
                "more than 25 % of a scope of at least {}",
                DeleteSafety::MIN_SCOPE
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(deletes: u64, scope: u64) -> Option<DeleteLimit> {
        DeleteSafety::check(deletes, scope).err().map(|e| e.limit)
    }

    #[test]
    fn the_count_limit_is_more_than_one_thousand() {
        // A scope large enough that 25 % is never the binding limit.
        assert_eq!(refused(1_000, 1_000_000), None);
        assert_eq!(refused(1_001, 1_000_000), Some(DeleteLimit::Count));
        // The count limit also binds where the fraction would (it is checked first).
        assert_eq!(refused(1_001, 1_001), Some(DeleteLimit::Count));
        assert_eq!(refused(u64::MAX, u64::MAX), Some(DeleteLimit::Count));
    }

    #[test]
    fn the_fraction_limit_is_more_than_a_quarter_of_a_scope_of_at_least_twenty() {
        // 25 % of 20 is 5: 5 passes, 6 does not.
        assert_eq!(refused(5, 20), None);
        assert_eq!(refused(6, 20), Some(DeleteLimit::Fraction));
        // A scope of 19 is exempt: even deleting all of it passes.
        assert_eq!(refused(19, 19), None);
        assert_eq!(refused(5, 19), None);
        // Exactly a quarter passes, one more does not.
        assert_eq!(refused(250, 1_000), None);
        assert_eq!(refused(251, 1_000), Some(DeleteLimit::Fraction));
        assert_eq!(refused(1_000, 4_000), None);
        assert_eq!(refused(1_000, 3_999), Some(DeleteLimit::Fraction));
        // Nothing to delete always passes; an empty scope is below the minimum.
        assert_eq!(refused(0, 0), None);
        assert_eq!(refused(0, 1_000_000), None);
    }

    #[test]
    fn the_refusal_says_what_and_which_limit() {
        let e = DeleteSafety::check(6, 20).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "would delete 6 of 20 records (30 %), more than 25 % of a scope of at least 20"
        );
        let e = DeleteSafety::check(1_001, 100_000).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "would delete 1001 of 100000 records (1 %), more than 1000"
        );
    }
}
