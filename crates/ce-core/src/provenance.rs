//! Where a node's L0 and L1 came from (DESIGN.md §8, docs/derive.md): written by a client,
//! derived by a generator, due to be derived, or neither.
//!
//! The rules every writer follows (the store applies them in the write transaction):
//! - a client's text for a layer makes it [`LayerOrigin::User`], and nothing derived ever
//!   replaces it;
//! - a layer without user text on a node whose context type is derived is
//!   [`LayerOrigin::Pending`] until the `derive` consumer writes it back as
//!   [`LayerOrigin::Derived`] (or [`LayerOrigin::Failed`] when the generator cannot);
//! - the index projector gives a pending layer no record: its fallback text would be
//!   replaced minutes later, so it is not embedded meanwhile.

use serde::{Deserialize, Deserializer, Serialize, de};

use crate::clock::Millis;
use crate::node::Level;

/// A derived layer's record of how it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Derivation {
    /// The generator's identity key, `generator:version[:model]` (e.g. `extractive:1`).
    pub generator: String,
    /// Hash of everything the derivation read (the generator, its limits and its input):
    /// an unchanged hash means an unchanged result.
    pub input_hash: String,
    /// Model tokens read for this node's derivation (0 without a model).
    pub tokens_in: u64,
    /// Model tokens written (0 without a model).
    pub tokens_out: u64,
    /// When it was derived.
    pub at_ms: Millis,
}

/// Why a layer could not be derived: the generator refused the input for good (an unusable
/// answer, a refusal). The projector's fallback applies to the layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeriveFailure {
    /// The generator's identity key.
    pub generator: String,
    /// Hash of the input that failed (the same input is not tried again).
    pub input_hash: String,
    /// The error code.
    pub code: String,
    /// The generator's message.
    pub message: String,
    /// When it failed.
    pub at_ms: Millis,
}

/// The origin of one layer.
///
/// Stored and shown tagged: `{"origin": "derived", "generator": …}`. It is read by hand, in
/// one pass over the fields (serde's derived reader of a tagged enum buffers the whole object
/// first: that was half the cost of decoding a node's row, read 10,000 times when a folder of
/// 10,000 children is rolled up); the tests check it accepts and refuses what the derived
/// reader does.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, schemars::JsonSchema)]
#[serde(tag = "origin", rename_all = "snake_case")]
pub enum LayerOrigin {
    /// No client text and no derivation asked for (the node's type is not derived, or
    /// derivation is off): the projector's fallback applies.
    #[default]
    None,
    /// Written by a client; never overwritten by a derivation.
    User,
    /// Due to be derived: the `derive` consumer has it queued. Holds the previous derived
    /// text meanwhile, if any.
    Pending,
    /// Derived by a generator.
    Derived(Derivation),
    /// The generator could not derive it; the fallback applies.
    Failed(DeriveFailure),
}

impl<'de> Deserialize<'de> for LayerOrigin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "snake_case")]
        enum Tag {
            None,
            User,
            Pending,
            Derived,
            Failed,
        }
        /// Every field of every origin.
        #[derive(Deserialize)]
        struct Fields {
            origin: Tag,
            generator: Option<String>,
            input_hash: Option<String>,
            tokens_in: Option<u64>,
            tokens_out: Option<u64>,
            at_ms: Option<Millis>,
            code: Option<String>,
            message: Option<String>,
        }
        fn need<T, E: de::Error>(v: Option<T>, field: &'static str) -> Result<T, E> {
            v.ok_or_else(|| E::missing_field(field))
        }
        let f = Fields::deserialize(d)?;
        Ok(match f.origin {
            Tag::None => LayerOrigin::None,
            Tag::User => LayerOrigin::User,
            Tag::Pending => LayerOrigin::Pending,
            Tag::Derived => LayerOrigin::Derived(Derivation {
                generator: need(f.generator, "generator")?,
                input_hash: need(f.input_hash, "input_hash")?,
                tokens_in: need(f.tokens_in, "tokens_in")?,
                tokens_out: need(f.tokens_out, "tokens_out")?,
                at_ms: need(f.at_ms, "at_ms")?,
            }),
            Tag::Failed => LayerOrigin::Failed(DeriveFailure {
                generator: need(f.generator, "generator")?,
                input_hash: need(f.input_hash, "input_hash")?,
                code: need(f.code, "code")?,
                message: need(f.message, "message")?,
                at_ms: need(f.at_ms, "at_ms")?,
            }),
        })
    }
}

impl LayerOrigin {
    /// Whether a client wrote the layer.
    pub fn is_user(&self) -> bool {
        matches!(self, LayerOrigin::User)
    }

    /// Whether a derivation of the layer is due.
    pub fn is_pending(&self) -> bool {
        matches!(self, LayerOrigin::Pending)
    }

    /// The input hash of the derivation (or failure) that made the layer, if any.
    pub fn input_hash(&self) -> Option<&str> {
        match self {
            LayerOrigin::Derived(d) => Some(&d.input_hash),
            LayerOrigin::Failed(f) => Some(&f.input_hash),
            LayerOrigin::None | LayerOrigin::User | LayerOrigin::Pending => None,
        }
    }

    /// Its name: `none`, `user`, `pending`, `derived` or `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LayerOrigin::None => "none",
            LayerOrigin::User => "user",
            LayerOrigin::Pending => "pending",
            LayerOrigin::Derived(_) => "derived",
            LayerOrigin::Failed(_) => "failed",
        }
    }
}

/// The origins of a node's L0 and L1 (L2 is always the client's).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Provenance {
    /// L0's origin.
    #[serde(rename = "abstract", default)]
    pub abstract_origin: LayerOrigin,
    /// L1's origin.
    #[serde(rename = "overview", default)]
    pub overview_origin: LayerOrigin,
}

impl Provenance {
    /// The origin of `level` (`None` for L2, which is never derived).
    pub fn get(&self, level: Level) -> Option<&LayerOrigin> {
        match level {
            Level::L0 => Some(&self.abstract_origin),
            Level::L1 => Some(&self.overview_origin),
            Level::L2 => None,
        }
    }

    /// The origin of `level`, mutably (`None` for L2).
    pub fn get_mut(&mut self, level: Level) -> Option<&mut LayerOrigin> {
        match level {
            Level::L0 => Some(&mut self.abstract_origin),
            Level::L1 => Some(&mut self.overview_origin),
            Level::L2 => None,
        }
    }

    /// Whether a layer is waiting for a derivation.
    pub fn any_pending(&self) -> bool {
        self.abstract_origin.is_pending() || self.overview_origin.is_pending()
    }

    /// Whether every layer no client wrote was derived (or refused) from the input whose
    /// hash is `input_hash` already.
    pub fn derived_from(&self, input_hash: &str) -> bool {
        [&self.abstract_origin, &self.overview_origin]
            .iter()
            .all(|o| o.is_user() || o.input_hash() == Some(input_hash))
    }

    /// Whether both derivable layers are the client's (nothing to derive).
    pub fn all_user(&self) -> bool {
        self.abstract_origin.is_user() && self.overview_origin.is_user()
    }

    /// The provenance of a row stored before provenance existed: a layer with text was
    /// the client's, an empty one has none.
    pub fn legacy(abstract_text: &str, overview: &str) -> Self {
        let of = |t: &str| {
            if t.is_empty() {
                LayerOrigin::None
            } else {
                LayerOrigin::User
            }
        };
        Provenance {
            abstract_origin: of(abstract_text),
            overview_origin: of(overview),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_serialise_tagged_and_legacy_rows_read_as_user_or_none() {
        let p = Provenance {
            abstract_origin: LayerOrigin::Derived(Derivation {
                generator: "extractive:1".into(),
                input_hash: "sha256:x".into(),
                tokens_in: 0,
                tokens_out: 0,
                at_ms: 5,
            }),
            overview_origin: LayerOrigin::Pending,
        };
        let json = serde_json::to_value(&p).expect("json");
        assert_eq!(json["abstract"]["origin"], "derived");
        assert_eq!(json["abstract"]["generator"], "extractive:1");
        assert_eq!(json["overview"], serde_json::json!({"origin": "pending"}));
        let back: Provenance = serde_json::from_value(json).expect("back");
        assert_eq!(back, p);
        let legacy = Provenance::legacy("a", "");
        assert!(legacy.abstract_origin.is_user());
        assert_eq!(legacy.overview_origin, LayerOrigin::None);
        assert!(p.any_pending() && !legacy.any_pending());
        assert_eq!(p.get(Level::L2), None);
    }

    #[test]
    fn derived_from_needs_every_layer_no_client_wrote_derived_from_that_input() {
        let derived = |hash: &str| {
            LayerOrigin::Derived(Derivation {
                generator: "extractive:2".into(),
                input_hash: hash.into(),
                tokens_in: 0,
                tokens_out: 0,
                at_ms: 5,
            })
        };
        let both = Provenance {
            abstract_origin: derived("h"),
            overview_origin: derived("h"),
        };
        assert!(both.derived_from("h") && !both.derived_from("g"));
        let mixed = Provenance {
            abstract_origin: LayerOrigin::User,
            overview_origin: derived("h"),
        };
        assert!(mixed.derived_from("h") && !mixed.derived_from("g"));
        let stale = Provenance {
            abstract_origin: derived("h"),
            overview_origin: derived("g"),
        };
        assert!(!stale.derived_from("h") && !stale.derived_from("g"));
        let pending = Provenance {
            abstract_origin: derived("h"),
            overview_origin: LayerOrigin::Pending,
        };
        assert!(!pending.derived_from("h"));
    }

    /// What serde derives for the tagged enum: the reference the hand-written reader
    /// must agree with.
    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(tag = "origin", rename_all = "snake_case")]
    enum Reference {
        None,
        User,
        Pending,
        Derived(Derivation),
        Failed(DeriveFailure),
    }

    impl From<Reference> for LayerOrigin {
        fn from(r: Reference) -> Self {
            match r {
                Reference::None => LayerOrigin::None,
                Reference::User => LayerOrigin::User,
                Reference::Pending => LayerOrigin::Pending,
                Reference::Derived(d) => LayerOrigin::Derived(d),
                Reference::Failed(f) => LayerOrigin::Failed(f),
            }
        }
    }

    proptest::proptest! {
        /// On any object of well-typed fields (some missing, an unknown one, an unknown
        /// origin, no origin), the reader accepts what the derived reader accepts, with the
        /// same value, and refuses what it refuses.
        #[test]
        fn the_reader_agrees_with_the_derived_one(
            origin in proptest::option::of(proptest::sample::select(
                vec!["none", "user", "pending", "derived", "failed", "other"],
            )),
            strings in proptest::collection::vec(proptest::option::of("[a-z:0-9]{0,6}"), 4),
            numbers in proptest::collection::vec(proptest::option::of(0_u32..1000), 3),
            extra in proptest::bool::ANY,
        ) {
            let mut o = serde_json::Map::new();
            if let Some(origin) = origin {
                o.insert("origin".into(), origin.into());
            }
            for (k, v) in ["generator", "input_hash", "code", "message"].iter().zip(&strings) {
                if let Some(v) = v {
                    o.insert((*k).into(), v.as_str().into());
                }
            }
            for (k, v) in ["tokens_in", "tokens_out", "at_ms"].iter().zip(&numbers) {
                if let Some(v) = v {
                    o.insert((*k).into(), (*v).into());
                }
            }
            if extra {
                o.insert("note".into(), "x".into());
            }
            let json = serde_json::Value::Object(o).to_string();
            let ours = serde_json::from_str::<LayerOrigin>(&json).ok();
            let reference = serde_json::from_str::<Reference>(&json).ok().map(LayerOrigin::from);
            proptest::prop_assert_eq!(ours, reference, "{}", json);
        }
    }
}
