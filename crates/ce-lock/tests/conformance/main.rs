//! Conformance of the lock providers, in one binary (STYLE.md): `suite` holds every case,
//! generic over a fixture factory; each provider file instantiates it with
//! `conformance_tests!`. The property test compares each provider with a model built on
//! `ce_lock::conflicts` (and so the providers with each other); `multiprocess` runs the
//! filesystem provider across processes (this binary re-executed as children).
//!
//! Randomized tests print their seed; `CE_SEED=<seed>` replays one, `CE_PROPTEST_CASES`
//! scales the number of property-test cases.

#[macro_use]
mod suite;

mod filesystem;
mod memory;
mod multiprocess;
mod redis;
