//! The memory provider (to be written).
