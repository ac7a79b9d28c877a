//! The redis provider (to be written).
