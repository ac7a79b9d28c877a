//! Integration tests of ce-index, in one binary (STYLE.md).
//!
//! Randomized tests print their seed; `CE_SEED=<seed>` replays one, `CE_PROPTEST_CASES`
//! scales the number of property-test cases.

mod common;
mod convergence;
mod keyword;
mod keyword_bulk;
mod pg_errors;
mod relation;
mod repair;
mod vector_contract;
mod vector_crash;
mod vector_fresh;
mod vector_model;
mod vector_persist;
mod vector_recall;
