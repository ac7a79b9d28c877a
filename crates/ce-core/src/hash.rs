//! Stable record ids (spec §2.1.1, DESIGN.md decision 5) and content hashes.

use md5::{Digest as _, Md5};
use sha2::Sha256;

/// The id schema version mixed into every stable id.
pub const ID_SCHEMA_VERSION: &str = "v1";

/// Returns `md5_hex("v1|" + key + "|" + level)`.
///
/// `key` is a canonical URI for context records (see [`crate::canonicalize_uri`]) or
/// `from|to|type` for relation records. Node version, text and attributes never take part,
/// so an update overwrites the same record.
pub fn stable_hash(key: &str, level: u8) -> String {
    let mut h = Md5::new();
    h.update(ID_SCHEMA_VERSION.as_bytes());
    h.update(b"|");
    h.update(key.as_bytes());
    h.update(b"|");
    h.update(level.to_string().as_bytes());
    hex::encode(h.finalize())
}

/// Returns `"sha256:" + hex(sha256(text))`, the content hash format of spec §2.2.2.
pub fn sha256_tagged(text: &str) -> String {
    format!("sha256:{}", sha256_hex(text.as_bytes()))
}

/// Returns the lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_the_normative_formula() {
        let uri = "ctx://acc1/users/u1/memories/preferences/theme";
        assert_eq!(stable_hash(uri, 0), "d5aa186f739ba399ff7f59feb6c680cf");
        assert_eq!(stable_hash(uri, 0), stable_hash(uri, 0));
        assert_ne!(stable_hash(uri, 0), stable_hash(uri, 1));
        let id = stable_hash(uri, 2);
        assert_eq!(id.len(), 32);
        assert!(
            id.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn content_hash_is_tagged_sha256() {
        assert_eq!(
            sha256_tagged(""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(1000)))]
        #[test]
        fn distinct_levels_give_distinct_ids(path in "[a-z0-9/]{0,30}") {
            let uri = format!("ctx://a/{path}");
            let ids = [stable_hash(&uri, 0), stable_hash(&uri, 1), stable_hash(&uri, 2)];
            prop_assert_ne!(&ids[0], &ids[1]);
            prop_assert_ne!(&ids[1], &ids[2]);
            prop_assert_ne!(&ids[0], &ids[2]);
        }
    }
}
