//! A sentence-embedding model run on the CPU with candle: the default provider.
//!
//! # Supported models
//!
//! A model directory in the sentence-transformers layout whose `config.json` has
//! `"model_type": "bert"` with absolute position embeddings and a `gelu`, `gelu_approximate`
//! or `relu` activation — the BERT family: all-MiniLM-L6-v2 / L12-v2 (the default),
//! paraphrase-multilingual-MiniLM-L12-v2, bge-small/base-en/zh (v1.5), e5-small/base (v2,
//! English), text2vec-base-chinese, and similar. The directory must hold:
//!
//! - `config.json` — the transformer's configuration (`hidden_size` is the vector dimension)
//! - `tokenizer.json` — a Hugging Face `tokenizers` file (WordPiece for BERT)
//! - `model.safetensors` — the weights (f32, f16 or bf16; computed in f32). PyTorch
//!   `pytorch_model.bin` files are not read.
//! - optional `sentence_bert_config.json` — `max_seq_length` (else 512, capped at
//!   `max_position_embeddings`)
//! - optional `1_Pooling/config.json` — mean pooling (the default) or CLS pooling
//!
//! Other architectures (RoBERTa / XLM-R, DistilBERT, MPNet, NomicBERT, JinaBERT, …) have
//! different weight layouts or position schemes and are rejected with
//! [`EmbedError::ModelLoad`] instead of producing wrong vectors.
//!
//! # Computation
//!
//! Exactly what sentence-transformers does for these models: tokenize (truncating at
//! `max_seq_length` tokens, special tokens included), run the encoder, pool the last hidden
//! state over the attention mask (mean, or the `[CLS]` token), L2-normalise. Texts of one call
//! are sorted by token length and run in sub-batches padded to the sub-batch's longest text,
//! so padding costs little; results return in input order.
//!
//! A sub-batch holds at most [`SUB_BATCH`] texts of the maximum length — more precisely at
//! most `SUB_BATCH × max_seq_length` padded tokens — and never more than
//! [`MAX_SUB_BATCH_TEXTS`] texts. This bounds the time of one uninterrupted step by that of
//! eight full-length texts, while short texts still run in batches large enough to keep the
//! CPU busy (batches of 8 short sentences run about 30% slower than batches of 32).
//!
//! # Timeout
//!
//! A model on this machine does not hang the way a remote endpoint can: it is slow when the
//! CPU is shared. So the timeout bounds a *stall*, not the whole call: a call fails with
//! [`EmbedError::Timeout`] only when one sub-batch took longer than the timeout and more
//! remain. A call that makes progress — every sub-batch within the timeout — runs to its end
//! however long it takes in total; a timeout applied to the whole call would throw away the
//! sub-batches it finished, and its retry would start again from the first text (on a loaded
//! 2-core machine, a batch of 32 full-length chunks could then time out on every attempt).
//!
//! Speed depends on the SIMD the build targets (see `.cargo/config.toml`): all-MiniLM-L6-v2 on
//! a 2-core x86-64-v3 server embeds about 150 short sentences/s in release builds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use serde::Deserialize;
use tokenizers::{Encoding, Tokenizer, TruncationParams};

use crate::{EmbedError, Embedder, ModelIdentity};

/// The identity's provider name.
pub const PROVIDER: &str = "local";
/// The default model's directory name.
pub const DEFAULT_MODEL: &str = "all-MiniLM-L6-v2";
/// The environment variable that points at a model directory.
pub const MODEL_DIR_ENV: &str = "CE_MODEL_DIR";
/// Full-length texts per sub-batch: a sub-batch holds at most `SUB_BATCH × max_seq_length`
/// padded tokens, so its run time is bounded by that of eight longest texts. The timeout
/// bounds one sub-batch (see the module docs).
pub const SUB_BATCH: usize = 8;
/// The most texts in one sub-batch, however short.
pub const MAX_SUB_BATCH_TEXTS: usize = 32;

/// Truncation length when the model directory does not say (BERT's position limit).
const DEFAULT_MAX_SEQ_LENGTH: usize = 512;

const FIX: &str = "run scripts/fetch-model.sh to install the default model, or set CE_MODEL_DIR \
                   (or index.embedding.model_dir) to a BERT-family sentence-transformers model \
                   directory";

/// Where the default model lives: `$CE_MODEL_DIR` if set, else
/// `$XDG_CACHE_HOME/contextengine/models/all-MiniLM-L6-v2` (`~/.cache/…` without
/// `XDG_CACHE_HOME`) — where `scripts/fetch-model.sh` installs it.
pub fn default_model_dir() -> PathBuf {
    match std::env::var_os(MODEL_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => models_root().join(DEFAULT_MODEL),
    }
}

/// The directory holding one subdirectory per installed model:
/// `$XDG_CACHE_HOME/contextengine/models` (else `~/.cache/contextengine/models`, else
/// `./.cache/contextengine/models` when there is no home directory).
pub fn models_root() -> PathBuf {
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => match std::env::var_os("HOME") {
            Some(h) if !h.is_empty() => PathBuf::from(h).join(".cache"),
            _ => PathBuf::from(".cache"),
        },
    };
    cache.join("contextengine").join("models")
}

/// How token states become one vector (`1_Pooling/config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    Mean,
    Cls,
}

#[derive(Deserialize)]
struct PoolingFile {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

#[derive(Deserialize)]
struct SentenceBertFile {
    max_seq_length: Option<usize>,
}

/// A BERT-family sentence-embedding model on the CPU (see the module docs for what loads).
pub struct LocalEmbedder {
    model: BertModel,
    tokenizer: Tokenizer,
    identity: ModelIdentity,
    pooling: Pooling,
    max_seq_length: usize,
    pad_id: u32,
    dir: PathBuf,
}

impl std::fmt::Debug for LocalEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEmbedder")
            .field("dir", &self.dir)
            .field("identity", &self.identity)
            .field("pooling", &self.pooling)
            .field("max_seq_length", &self.max_seq_length)
            .finish_non_exhaustive()
    }
}

fn load_err(path: &Path, reason: impl Into<String>) -> EmbedError {
    EmbedError::ModelLoad {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, EmbedError> {
    std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            load_err(path, format!("file not found; {FIX}"))
        } else {
            load_err(path, format!("cannot read: {e}"))
        }
    })
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, EmbedError> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes).map_err(|e| load_err(path, format!("invalid JSON ({e}); {FIX}")))
}

impl LocalEmbedder {
    /// Loads the model in `dir` (see the module docs for the files and architectures).
    ///
    /// Errors are [`EmbedError::ModelLoad`] naming the file and the fix: a missing directory
    /// or file asks to run `scripts/fetch-model.sh` or set `CE_MODEL_DIR`; an unsupported
    /// architecture or pooling names what was found.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        if !dir.is_dir() {
            return Err(load_err(dir, format!("model directory not found; {FIX}")));
        }

        // Architecture: only configurations candle's BertModel computes faithfully.
        let config_path = dir.join("config.json");
        let raw: serde_json::Value = read_json(&config_path)?;
        let model_type = raw.get("model_type").and_then(|v| v.as_str());
        if model_type != Some("bert") {
            return Err(load_err(
                &config_path,
                format!(
                    "model_type {} is not supported: only BERT-family models (model_type \
                     \"bert\", e.g. all-MiniLM-L6-v2, bge-small-en-v1.5) load",
                    model_type.map_or_else(|| "(missing)".to_owned(), |t| format!("{t:?}"))
                ),
            ));
        }
        let config: BertConfig = serde_json::from_value(raw)
            .map_err(|e| load_err(&config_path, format!("unsupported BERT configuration: {e}")))?;
        if config.hidden_size == 0 {
            return Err(load_err(&config_path, "hidden_size is 0"));
        }

        let pooling = read_pooling(dir)?;
        let sbert_path = dir.join("sentence_bert_config.json");
        let max_seq_length = if sbert_path.is_file() {
            read_json::<SentenceBertFile>(&sbert_path)?
                .max_seq_length
                .unwrap_or(DEFAULT_MAX_SEQ_LENGTH)
        } else {
            DEFAULT_MAX_SEQ_LENGTH
        }
        .clamp(2, config.max_position_embeddings.max(2));

        // Tokenizer: our own truncation; no padding (we pad per sub-batch).
        let tok_path = dir.join("tokenizer.json");
        let tok_bytes = read_file(&tok_path)?;
        let mut tokenizer = Tokenizer::from_bytes(&tok_bytes)
            .map_err(|e| load_err(&tok_path, format!("invalid tokenizer ({e}); {FIX}")))?;
        let pad_id = tokenizer
            .get_padding()
            .map(|p| p.pad_id)
            .or_else(|| tokenizer.token_to_id("[PAD]"))
            .unwrap_or(config.pad_token_id as u32);
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_length,
                ..TruncationParams::default()
            }))
            .map_err(|e| load_err(&tok_path, format!("cannot set truncation: {e}")))?;

        // Weights.
        let weights_path = dir.join("model.safetensors");
        if !weights_path.is_file() {
            let hint = if dir.join("pytorch_model.bin").is_file() {
                "only model.safetensors is read (convert pytorch_model.bin to safetensors)"
                    .to_owned()
            } else {
                format!("file not found; {FIX}")
            };
            return Err(load_err(&weights_path, hint));
        }
        let device = Device::Cpu;
        let tensors = candle_core::safetensors::load(&weights_path, &device)
            .map_err(|e| load_err(&weights_path, format!("invalid safetensors ({e}); {FIX}")))?;
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
        let model = BertModel::load(vb, &config).map_err(|e| {
            load_err(
                &weights_path,
                format!("weights do not match config.json ({e}); {FIX}"),
            )
        })?;

        let name = dir
            .canonicalize()
            .unwrap_or_else(|_| dir.to_path_buf())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| DEFAULT_MODEL.to_owned());
        Ok(LocalEmbedder {
            model,
            tokenizer,
            identity: ModelIdentity {
                provider: PROVIDER.to_owned(),
                model: name,
                dimension: config.hidden_size,
            },
            pooling,
            max_seq_length,
            pad_id,
            dir: dir.to_path_buf(),
        })
    }

    /// The directory the model was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Tokens per text after which input is truncated (special tokens included).
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    fn infer_err(&self, e: impl std::fmt::Display) -> EmbedError {
        // A failing forward pass on valid input is a defect, not a transient fault.
        EmbedError::Provider {
            status: None,
            message: format!("local model {} failed: {e}", self.identity.model),
            retryable: false,
        }
    }

    /// Runs one padded sub-batch; returns one unit vector per encoding.
    fn run(&self, encs: &[&Encoding]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let b = encs.len();
        let len = encs.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        if b == 0 || len == 0 {
            return Ok(vec![vec![0.0; self.identity.dimension]; b]);
        }
        let mut ids = vec![self.pad_id; b * len];
        let mut types = vec![0u32; b * len];
        let mut mask = vec![0u32; b * len];
        for (row, e) in encs.iter().enumerate() {
            let n = e.get_ids().len();
            let at = row * len;
            ids[at..at + n].copy_from_slice(e.get_ids());
            types[at..at + n].copy_from_slice(e.get_type_ids());
            mask[at..at + n].copy_from_slice(&e.get_attention_mask()[..n]);
        }
        let device = &self.model.device;
        let t = |v: Vec<u32>| Tensor::from_vec(v, (b, len), device);
        let ids = t(ids).map_err(|e| self.infer_err(e))?;
        let types = t(types).map_err(|e| self.infer_err(e))?;
        let mask = t(mask).map_err(|e| self.infer_err(e))?;
        let hidden = self
            .model
            .forward(&ids, &types, Some(&mask))
            .map_err(|e| self.infer_err(e))?;
        let pooled = match self.pooling {
            Pooling::Mean => mean_pool(&hidden, &mask),
            Pooling::Cls => hidden.narrow(1, 0, 1).and_then(|h| h.squeeze(1)),
        }
        .map_err(|e| self.infer_err(e))?;
        let mut out: Vec<Vec<f32>> = pooled.to_vec2().map_err(|e| self.infer_err(e))?;
        for v in &mut out {
            crate::normalize(v);
        }
        Ok(out)
    }
}

/// Splits texts sorted by ascending token length into consecutive sub-batches of at most
/// `token_budget` padded tokens (texts × longest) and [`MAX_SUB_BATCH_TEXTS`] texts; every
/// sub-batch has at least one text.
fn sub_batches(sorted_lengths: &[usize], token_budget: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &len) in sorted_lengths.iter().enumerate() {
        let texts = i - start + 1;
        if texts > 1 && (texts > MAX_SUB_BATCH_TEXTS || texts * len > token_budget) {
            out.push(start..i);
            start = i;
        }
    }
    if start < sorted_lengths.len() {
        out.push(start..sorted_lengths.len());
    }
    out
}

/// Mean of the token states where the attention mask is 1: `(b, len, h)` → `(b, h)`.
fn mean_pool(hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
    let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
    summed.broadcast_div(&counts)
}

fn read_pooling(dir: &Path) -> Result<Pooling, EmbedError> {
    let path = dir.join("1_Pooling").join("config.json");
    if !path.is_file() {
        return Ok(Pooling::Mean);
    }
    let p: PoolingFile = read_json(&path)?;
    let others = p.pooling_mode_max_tokens
        || p.pooling_mode_mean_sqrt_len_tokens
        || p.pooling_mode_weightedmean_tokens
        || p.pooling_mode_lasttoken;
    match (p.pooling_mode_mean_tokens, p.pooling_mode_cls_token, others) {
        (true, false, false) => Ok(Pooling::Mean),
        (false, true, false) => Ok(Pooling::Cls),
        _ => Err(load_err(
            &path,
            "unsupported pooling: exactly one of pooling_mode_mean_tokens or \
             pooling_mode_cls_token must be true",
        )),
    }
}

impl Embedder for LocalEmbedder {
    fn identity(&self) -> &ModelIdentity {
        &self.identity
    }

    /// Embeds `texts` in length-sorted sub-batches (see the module docs: at most
    /// [`SUB_BATCH`] full-length texts, [`MAX_SUB_BATCH_TEXTS`] short ones).
    ///
    /// `timeout` bounds a stall ([`run_sub_batches`]): the call returns
    /// [`EmbedError::Timeout`] only when one sub-batch took longer than `timeout` with more to
    /// run. A running sub-batch is not interrupted, and a call whose sub-batches each finish
    /// within `timeout` returns its vectors however long it took in all.
    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self
            .tokenizer
            .encode_batch_fast(texts.to_vec(), true)
            .map_err(|e| self.infer_err(format!("tokenizer: {e}")))?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());

        let lengths: Vec<usize> = order
            .iter()
            .map(|&i| encodings[i].get_ids().len())
            .collect();
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        let plan = sub_batches(&lengths, SUB_BATCH * self.max_seq_length);
        run_sub_batches(plan, timeout, |range| {
            let chunk = &order[range];
            let encs: Vec<&Encoding> = chunk.iter().map(|&i| &encodings[i]).collect();
            let vectors = self.run(&encs)?;
            for (&i, v) in chunk.iter().zip(vectors) {
                out[i] = v;
            }
            Ok(())
        })?;
        Ok(out)
    }
}

/// Runs `step` over every sub-batch of `plan` in order. `timeout` bounds a stall: when one
/// step took longer than `timeout` and steps remain, [`EmbedError::Timeout`]; a call whose
/// steps each finish within `timeout` runs to its end.
fn run_sub_batches(
    plan: Vec<std::ops::Range<usize>>,
    timeout: Duration,
    mut step: impl FnMut(std::ops::Range<usize>) -> Result<(), EmbedError>,
) -> Result<(), EmbedError> {
    let last = plan.len().saturating_sub(1);
    for (n, range) in plan.into_iter().enumerate() {
        let started = Instant::now();
        step(range)?;
        let took = started.elapsed();
        if n < last && took > timeout {
            return Err(EmbedError::Timeout { after: timeout });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_batches_bound_padded_tokens_and_texts() {
        let sizes = |lengths: &[usize]| -> Vec<usize> {
            sub_batches(lengths, SUB_BATCH * 256)
                .into_iter()
                .map(|r| r.len())
                .collect()
        };
        assert_eq!(sizes(&[256; 20]), [8, 8, 4]);
        assert_eq!(sizes(&[10; 100]), [32, 32, 32, 4]);
        assert_eq!(sizes(&[]), Vec::<usize>::new());
        assert_eq!(sizes(&[5000]), [1]);
        let mut mixed: Vec<usize> = (0..40).map(|_| 12).collect();
        mixed.extend([100; 30]);
        mixed.extend([256; 9]);
        // 32 short; 8 short + 12 of 100 tokens (20 × 100 ≤ 2048); 18 of 100; 8 long; 1 long.
        assert_eq!(sizes(&mixed), [32, 20, 18, 8, 1]);
    }

    #[test]
    fn the_timeout_bounds_one_sub_batch_not_the_call() {
        let plan = || sub_batches(&[256; 40], SUB_BATCH * 256);
        assert_eq!(plan().len(), 5);
        // Five steps of 150 ms: 750 ms in all, over a timeout of 500 ms, each within it.
        let mut ran = Vec::new();
        run_sub_batches(plan(), Duration::from_millis(500), |r| {
            std::thread::sleep(Duration::from_millis(150));
            ran.push(r);
            Ok(())
        })
        .expect("a call that makes progress is not timed out");
        assert_eq!(ran, plan());
        // A step longer than the timeout (a stall) with steps left: timed out, no more run.
        let stall = |at: usize| {
            let mut steps = 0;
            let out = run_sub_batches(plan(), Duration::from_millis(200), |_| {
                steps += 1;
                if steps == at {
                    std::thread::sleep(Duration::from_millis(400));
                }
                Ok(())
            });
            (out, steps)
        };
        let (out, steps) = stall(2);
        assert!(matches!(out, Err(EmbedError::Timeout { .. })), "{out:?}");
        assert_eq!(steps, 2);
        // A slow last step has finished the work: it is returned.
        let (out, steps) = stall(5);
        assert!(out.is_ok(), "{out:?}");
        assert_eq!(steps, 5);
    }

    #[test]
    fn missing_dir_names_the_fix() {
        let err = LocalEmbedder::load(Path::new("/nonexistent/ce-model")).expect_err("missing");
        let msg = err.to_string();
        assert!(matches!(err, EmbedError::ModelLoad { .. }));
        assert!(msg.contains("scripts/fetch-model.sh"), "{msg}");
        assert!(msg.contains("CE_MODEL_DIR"), "{msg}");
        assert!(msg.contains("/nonexistent/ce-model"), "{msg}");
    }

    #[test]
    fn non_bert_architectures_are_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"model_type":"xlm-roberta","hidden_size":384}"#,
        )
        .expect("write");
        let msg = LocalEmbedder::load(dir.path())
            .expect_err("roberta")
            .to_string();
        assert!(msg.contains("\"xlm-roberta\" is not supported"), "{msg}");
        assert!(msg.contains("config.json"), "{msg}");
    }

    #[test]
    fn missing_weights_name_the_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = default_model_dir();
        // Copy only the small files of a real model (or fabricate a config if absent).
        let cfg = std::fs::read(src.join("config.json")).unwrap_or_else(|_| {
            br#"{"model_type":"bert","vocab_size":10,"hidden_size":4,"num_hidden_layers":1,
                "num_attention_heads":1,"intermediate_size":4,"hidden_act":"gelu",
                "hidden_dropout_prob":0.1,"max_position_embeddings":16,"type_vocab_size":2,
                "initializer_range":0.02,"layer_norm_eps":1e-12,"pad_token_id":0}"#
                .to_vec()
        });
        std::fs::write(dir.path().join("config.json"), cfg).expect("write");
        let msg = LocalEmbedder::load(dir.path())
            .expect_err("no tokenizer")
            .to_string();
        assert!(msg.contains("tokenizer.json"), "{msg}");
        assert!(msg.contains("scripts/fetch-model.sh"), "{msg}");
    }

    #[test]
    fn broken_weights_name_the_fix() {
        let src = default_model_dir();
        let dir = tempfile::tempdir().expect("tempdir");
        for f in ["config.json", "tokenizer.json"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap_or_else(|e| {
                panic!("{e}: the model is required (run scripts/fetch-model.sh)")
            });
        }
        std::fs::write(
            dir.path().join("model.safetensors"),
            b"\x10\0\0\0\0\0\0\0{trunc",
        )
        .expect("write");
        let err = LocalEmbedder::load(dir.path()).expect_err("broken");
        let msg = err.to_string();
        assert!(msg.contains("model.safetensors"), "{msg}");
        assert!(msg.contains("invalid safetensors"), "{msg}");
        assert!(msg.contains("scripts/fetch-model.sh"), "{msg}");
    }

    #[test]
    fn unsupported_pooling_is_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("1_Pooling")).expect("mkdir");
        std::fs::write(
            dir.path().join("1_Pooling/config.json"),
            r#"{"pooling_mode_max_tokens":true}"#,
        )
        .expect("write");
        let msg = read_pooling(dir.path()).expect_err("max").to_string();
        assert!(msg.contains("unsupported pooling"), "{msg}");
    }
}
