//! What a sentence-transformers folder says about its model: the BERT shape and the
//! pipeline after it.

use super::SentenceError;

/// The largest width, layer count and sequence accepted from a config (far above any BERT
/// that fits a device, far below what would overflow a size).
const MAX_HIDDEN: u64 = 1 << 16;
const MAX_LAYERS: u64 = 1024;
const MAX_POSITIONS: u64 = 1 << 20;
const MAX_VOCAB: u64 = 1 << 24;

fn config_err(file: &str, reason: impl Into<String>) -> SentenceError {
    SentenceError::Config {
        file: file.to_string(),
        reason: reason.into(),
    }
}

/// How the token vectors become one sentence vector (`1_Pooling/config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's vector (`[CLS]`).
    Cls,
    /// The mean over the sentence's tokens (padding left out).
    Mean,
    /// The elementwise maximum over the sentence's tokens.
    Max,
}

impl Pooling {
    /// `cls`, `mean` or `max`.
    pub fn parse(name: &str) -> Option<Pooling> {
        match name {
            "cls" => Some(Pooling::Cls),
            "mean" => Some(Pooling::Mean),
            "max" => Some(Pooling::Max),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::Max => "max",
        }
    }
}

/// The steps after the transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pipeline {
    /// The pooling.
    pub pooling: Pooling,
    /// Whether the pooled vector is L2-normalized (a `Normalize` module).
    pub normalize: bool,
    /// The most tokens per sentence, special tokens included.
    pub max_seq_length: usize,
}

impl Pipeline {
    /// The pipeline of a sentence-transformers folder from the texts of `modules.json`,
    /// `1_Pooling/config.json` (or the pooling module's folder as `modules.json` names it)
    /// and `sentence_bert_config.json`; `max_positions` bounds the length.
    ///
    /// # Errors
    /// [`SentenceError::Config`] for modules other than Transformer, Pooling and Normalize
    /// (in that order), a pooling mode dynrt does not implement, or malformed JSON.
    pub fn from_folder(
        modules_json: &str,
        pooling_json: &str,
        sentence_bert_json: Option<&str>,
        max_positions: usize,
    ) -> Result<Pipeline, SentenceError> {
        let modules: serde_json::Value = serde_json::from_str(modules_json)
            .map_err(|e| config_err("modules.json", e.to_string()))?;
        let kinds: Vec<&str> = modules
            .as_array()
            .ok_or_else(|| config_err("modules.json", "not a list"))?
            .iter()
            .map(|m| {
                m.get("type")
                    .and_then(|t| t.as_str())
                    .and_then(|t| t.rsplit('.').next())
                    .unwrap_or("")
            })
            .collect();
        let normalize = match kinds.as_slice() {
            ["Transformer", "Pooling"] => false,
            ["Transformer", "Pooling", "Normalize"] => true,
            other => {
                return Err(config_err(
                    "modules.json",
                    format!("modules {other:?}: Transformer, Pooling and an optional Normalize are supported"),
                ))
            }
        };
        let p: serde_json::Value = serde_json::from_str(pooling_json)
            .map_err(|e| config_err("1_Pooling/config.json", e.to_string()))?;
        let on = |k: &str| p.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
        let modes: Vec<Pooling> = [
            ("pooling_mode_cls_token", Pooling::Cls),
            ("pooling_mode_mean_tokens", Pooling::Mean),
            ("pooling_mode_max_tokens", Pooling::Max),
        ]
        .iter()
        .filter(|(k, _)| on(k))
        .map(|&(_, m)| m)
        .collect();
        for unsupported in [
            "pooling_mode_mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens",
            "pooling_mode_lasttoken",
        ] {
            if on(unsupported) {
                return Err(config_err(
                    "1_Pooling/config.json",
                    format!("{unsupported} is not supported (cls, mean and max are)"),
                ));
            }
        }
        let [pooling] = modes.as_slice() else {
            return Err(config_err(
                "1_Pooling/config.json",
                format!(
                    "{} pooling modes on: exactly one of cls, mean and max is supported",
                    modes.len()
                ),
            ));
        };
        let mut max_seq_length = max_positions;
        if let Some(text) = sentence_bert_json {
            let v: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| config_err("sentence_bert_config.json", e.to_string()))?;
            if let Some(m) = v.get("max_seq_length").and_then(|m| m.as_u64()) {
                max_seq_length = (m as usize).min(max_positions);
            }
        }
        Ok(Pipeline {
            pooling: *pooling,
            normalize,
            max_seq_length,
        })
    }
}

/// The shape of a BERT encoder (`config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BertConfig {
    /// Vocabulary entries.
    pub vocab_size: usize,
    /// Width of the hidden state.
    pub hidden_size: usize,
    /// Transformer layers.
    pub num_layers: usize,
    /// Attention heads (dividing the width).
    pub num_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Rows of the position table: the longest sequence.
    pub max_positions: usize,
    /// Rows of the token-type table.
    pub type_vocab_size: usize,
    /// The layer norms' epsilon.
    pub layer_norm_eps: f32,
    /// `gelu` (erf) when true, `gelu_new` (tanh) when false.
    pub gelu_erf: bool,
}

impl BertConfig {
    /// Reads `config.json`.
    ///
    /// # Errors
    /// [`SentenceError::Config`] naming the field that is missing, out of range or not
    /// supported (another model type, another activation, relative positions).
    pub fn from_json(text: &str) -> Result<BertConfig, SentenceError> {
        let f = "config.json";
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| config_err(f, e.to_string()))?;
        let model_type = v.get("model_type").and_then(|m| m.as_str()).unwrap_or("");
        if model_type != "bert" {
            return Err(config_err(
                f,
                format!("model_type `{model_type}`: only bert is supported"),
            ));
        }
        let int = |key: &str, max: u64| -> Result<usize, SentenceError> {
            v.get(key)
                .and_then(|x| x.as_u64())
                .filter(|&x| x >= 1 && x <= max)
                .map(|x| x as usize)
                .ok_or_else(|| config_err(f, format!("`{key}` must be an integer from 1 to {max}")))
        };
        let hidden_size = int("hidden_size", MAX_HIDDEN)?;
        let num_heads = int("num_attention_heads", MAX_HIDDEN)?;
        if hidden_size % num_heads != 0 {
            return Err(config_err(
                f,
                format!("hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}"),
            ));
        }
        let gelu_erf = match v.get("hidden_act").and_then(|a| a.as_str()) {
            Some("gelu") => true,
            Some("gelu_new") | Some("gelu_pytorch_tanh") => false,
            other => {
                return Err(config_err(
                    f,
                    format!("hidden_act {other:?}: gelu and gelu_new are supported"),
                ))
            }
        };
        match v.get("position_embedding_type").and_then(|p| p.as_str()) {
            None | Some("absolute") => {}
            Some(other) => {
                return Err(config_err(
                    f,
                    format!("position_embedding_type `{other}`: only absolute is supported"),
                ))
            }
        }
        let eps = v
            .get("layer_norm_eps")
            .and_then(|e| e.as_f64())
            .unwrap_or(1e-12);
        if !(eps > 0.0 && eps < 1.0) {
            return Err(config_err(
                f,
                format!("layer_norm_eps {eps} is not in (0, 1)"),
            ));
        }
        Ok(BertConfig {
            vocab_size: int("vocab_size", MAX_VOCAB)?,
            hidden_size,
            num_layers: int("num_hidden_layers", MAX_LAYERS)?,
            num_heads,
            intermediate_size: int("intermediate_size", MAX_HIDDEN * 8)?,
            max_positions: int("max_position_embeddings", MAX_POSITIONS)?,
            type_vocab_size: int("type_vocab_size", 1024)?,
            layer_norm_eps: eps as f32,
            gelu_erf,
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_follows_the_modules() {
        let modules = r#"[{"type":"sentence_transformers.models.Transformer"},
            {"type":"sentence_transformers.models.Pooling"},
            {"type":"sentence_transformers.models.Normalize"}]"#;
        let pooling = r#"{"pooling_mode_mean_tokens": true}"#;
        let p = Pipeline::from_folder(modules, pooling, Some(r#"{"max_seq_length":256}"#), 512)
            .unwrap();
        assert_eq!(
            p,
            Pipeline {
                pooling: Pooling::Mean,
                normalize: true,
                max_seq_length: 256
            }
        );
        let two = r#"[{"type":"x.Transformer"},{"type":"x.Pooling"}]"#;
        let p =
            Pipeline::from_folder(two, r#"{"pooling_mode_cls_token":true}"#, None, 128).unwrap();
        assert_eq!(
            (p.pooling, p.normalize, p.max_seq_length),
            (Pooling::Cls, false, 128)
        );
        for (m, pool) in [
            (r#"[{"type":"x.Transformer"},{"type":"x.Dense"}]"#, pooling),
            (
                two,
                r#"{"pooling_mode_cls_token":true,"pooling_mode_max_tokens":true}"#,
            ),
            (two, r#"{"pooling_mode_mean_sqrt_len_tokens":true}"#),
            (two, "{}"),
        ] {
            assert!(
                Pipeline::from_folder(m, pool, None, 8).is_err(),
                "{m} {pool}"
            );
        }
    }

    #[test]
    fn configs_out_of_range_are_refused() {
        let ok = r#"{"model_type":"bert","hidden_size":384,"num_attention_heads":12,
            "num_hidden_layers":6,"intermediate_size":1536,"max_position_embeddings":512,
            "type_vocab_size":2,"vocab_size":30522,"hidden_act":"gelu","layer_norm_eps":1e-12}"#;
        let c = BertConfig::from_json(ok).unwrap();
        assert_eq!((c.head_dim(), c.num_layers, c.gelu_erf), (32, 6, true));
        for (from, to) in [
            ("\"hidden_size\":384", "\"hidden_size\":385"),
            ("\"num_hidden_layers\":6", "\"num_hidden_layers\":0"),
            ("\"vocab_size\":30522", "\"vocab_size\":1e30"),
            ("\"gelu\"", "\"relu\""),
            ("\"bert\"", "\"gpt2\""),
        ] {
            let bad = ok.replace(from, to);
            assert!(BertConfig::from_json(&bad).is_err(), "{to}");
        }
    }
}
