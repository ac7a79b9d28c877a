//! The filesystem provider (to be written).
