//! Query-string parameters: strict (unknown or repeated keys are refused) and parsed by the
//! core types so bad values get typed errors.

use std::str::FromStr;

use ce_core::{CoreError, CtxUri, Level};

use crate::wire;

/// The `key=value` pairs of a query string.
#[derive(Debug, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    /// Checks the keys against `allowed` (each at most once).
    pub fn new(pairs: Vec<(String, String)>, allowed: &[&'static str]) -> Result<Self, CoreError> {
        for (i, (k, _)) in pairs.iter().enumerate() {
            if !allowed.contains(&k.as_str()) {
                return Err(CoreError::InvalidField {
                    field: "query",
                    reason: format!("unknown parameter {k:?}; expected one of {allowed:?}"),
                });
            }
            if pairs[..i].iter().any(|(k2, _)| k2 == k) {
                return Err(CoreError::InvalidField {
                    field: "query",
                    reason: format!("parameter {k:?} is given more than once"),
                });
            }
        }
        Ok(Params(pairs))
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A required URI.
    pub fn uri(&self, key: &'static str) -> Result<CtxUri, CoreError> {
        match self.get(key) {
            Some(v) => wire::uri(v),
            None => Err(CoreError::InvalidField {
                field: key,
                reason: "is required".into(),
            }),
        }
    }

    /// An optional URI with a default.
    pub fn uri_or(&self, key: &'static str, default: CtxUri) -> Result<CtxUri, CoreError> {
        self.get(key).map_or(Ok(default), wire::uri)
    }

    /// An optional value parsed with `FromStr` (its own error, e.g. an unknown status).
    pub fn parse<T: FromStr<Err = CoreError>>(&self, key: &str) -> Result<Option<T>, CoreError> {
        self.get(key).map(str::parse).transpose()
    }

    /// An optional number.
    pub fn number<T: FromStr>(&self, key: &'static str) -> Result<Option<T>, CoreError> {
        self.get(key)
            .map(|v| {
                v.parse().map_err(|_| CoreError::InvalidField {
                    field: key,
                    reason: format!("{v:?} is not a valid number"),
                })
            })
            .transpose()
    }

    /// An optional level (0, 1 or 2).
    pub fn level(&self, key: &'static str) -> Result<Option<Level>, CoreError> {
        self.number::<i64>(key)?.map(Level::from_i64).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)], allowed: &[&'static str]) -> Result<Params, CoreError> {
        Params::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            allowed,
        )
    }

    #[test]
    fn strict_keys_and_typed_values() {
        assert!(p(&[("x", "1")], &["uri"]).is_err());
        assert!(p(&[("uri", "a"), ("uri", "b")], &["uri"]).is_err());
        let ps = p(&[("uri", "ctx://a/b"), ("level", "7")], &["uri", "level"]).expect("keys");
        assert_eq!(ps.uri("uri").expect("uri").as_str(), "ctx://a/b");
        assert!(matches!(
            ps.level("level"),
            Err(CoreError::InvalidLevel { level: 7 })
        ));
        assert!(matches!(
            p(&[], &["uri"]).expect("empty").uri("uri"),
            Err(CoreError::InvalidField { .. })
        ));
        let ps = p(&[("uri", "ctx://a//b")], &["uri"]).expect("keys");
        assert!(matches!(ps.uri("uri"), Err(CoreError::InvalidUri(_))));
    }
}
