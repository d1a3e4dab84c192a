//! The configuration read from tiny models' metadata, and its errors.

use super::*;
use crate::gguf::{Gguf, GgufBuilder, GgufError, MetaValue, TinyLlama};

#[test]
fn tiny_llama_config_and_tensors() {
    let bytes = TinyLlama::default().build(1).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let c = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(
        (
            c.num_layers,
            c.embedding_len,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.ffn_len
        ),
        (2, 64, 4, 2, 16, 96)
    );
    assert_eq!(
        (c.rope_base, c.rms_eps, c.context_len),
        (100_000.0, 1e-5, 256)
    );
    assert_eq!(c.vocab_size as usize, TinyLlama::tokens().len());
    assert!(c.tied_output);
    assert_eq!((c.group_size(), c.q_len(), c.kv_len()), (2, 64, 32));
    assert_eq!(c.expected_tensors().len(), 2 + 2 * 9);
    for t in g.tensors() {
        let v = g.dequantize_tensor(&bytes, t.name()).unwrap();
        assert_eq!(v.len() as u64, t.num_elements());
        assert!(v.iter().all(|x| x.is_finite()));
    }
    let rows = g
        .dequantize_rows(&bytes, "token_embd.weight", 3..5)
        .unwrap();
    let all = g.dequantize_tensor(&bytes, "token_embd.weight").unwrap();
    assert_eq!(rows, all[3 * 64..5 * 64]);
    assert!(matches!(
        g.dequantize_rows(&bytes, "token_embd.weight", 0..100_000),
        Err(GgufError::ValueOutOfRange { .. })
    ));

    let untied = TinyLlama {
        untied_output: true,
        head_dim: 32,
        ..TinyLlama::default()
    };
    let g = Gguf::parse(&untied.build(2).unwrap()).unwrap();
    let c = ModelConfig::from_gguf(&g).unwrap();
    assert!(!c.tied_output);
    assert_eq!((c.head_dim, c.q_len()), (32, 128));
}

/// The tiny model with one key replaced (or removed when `value` is `None`).
fn tiny_with(key: &str, value: Option<MetaValue>) -> Result<ModelConfig, GgufError> {
    let g = Gguf::parse(&TinyLlama::default().build(3).unwrap()).unwrap();
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata() {
        if k != key {
            b = b.metadata(k, v.clone());
        }
    }
    if let Some(v) = value {
        b = b.metadata(key, v);
    }
    let bytes = TinyLlama::default().build(3).unwrap();
    for t in g.tensors() {
        let data = g.tensor_bytes(&bytes, t.name()).unwrap().to_vec();
        b = b.tensor(t.name(), t.ggml_type(), t.dims(), data);
    }
    ModelConfig::from_gguf(&Gguf::parse(&b.build().unwrap()).unwrap())
}

#[test]
fn llama_config_errors_name_the_key() {
    assert!(tiny_with("general.name", None).is_ok());
    assert!(matches!(
        tiny_with("llama.block_count", None),
        Err(GgufError::MissingKey { ref key }) if key == "llama.block_count"
    ));
    assert!(matches!(
        tiny_with("llama.attention.head_count_kv", Some(MetaValue::U32(3))),
        Err(GgufError::Inconsistent { .. })
    ));
    assert!(matches!(
        tiny_with("llama.embedding_length", Some(MetaValue::U32(0))),
        Err(GgufError::ValueOutOfRange { .. })
    ));
    assert!(matches!(
        tiny_with("llama.feed_forward_length", Some(MetaValue::U32(128))),
        Err(GgufError::TensorShape { ref tensor, .. }) if tensor == "blk.0.ffn_gate.weight"
    ));
    assert!(matches!(
        tiny_with("llama.block_count", Some(MetaValue::U32(3))),
        Err(GgufError::MissingTensor { ref tensor }) if tensor == "blk.2.attn_norm.weight"
    ));
    assert!(matches!(
        tiny_with("llama.vocab_size", Some(MetaValue::U32(7))),
        Err(GgufError::Inconsistent { .. })
    ));
    let e = tiny_with("general.architecture", Some(MetaValue::Str("gpt2".into()))).unwrap_err();
    assert!(
        matches!(e, GgufError::UnsupportedArchitecture { ref architecture, .. } if architecture == "gpt2")
    );
    assert_eq!(
        e.to_string(),
        "architecture `gpt2` is not supported (supported: llama, qwen2, qwen3, gemma3)"
    );
    assert!(matches!(
        tiny_with(
            "llama.rope.scaling.type",
            Some(MetaValue::Str("yarn".into()))
        ),
        Err(GgufError::ValueOutOfRange { .. })
    ));
    assert!(matches!(
        tiny_with("llama.rope.dimension_count", Some(MetaValue::U32(15))),
        Err(GgufError::ValueOutOfRange { .. })
    ));
    assert!(matches!(
        tiny_with(
            "llama.attention.layer_norm_rms_epsilon",
            Some(MetaValue::Str("x".into()))
        ),
        Err(GgufError::WrongType { .. })
    ));
}

#[test]
fn gemma3_config_has_its_window_pattern_and_norms() {
    let t = TinyLlama {
        architecture: "gemma3",
        num_layers: 7,
        sliding_window: 4,
        ..TinyLlama::default()
    };
    let g = Gguf::parse(&t.build(4).unwrap()).unwrap();
    let c = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(c.arch, &GEMMA3);
    assert_eq!((c.sliding_window, c.swa_pattern), (4, 6));
    assert_eq!((c.rope_base, c.rope_base_swa), (100_000.0, 10_000.0));
    // Five local layers, the sixth global, then local again.
    let local: Vec<bool> = (0..7).map(|l| c.is_local(l)).collect();
    assert_eq!(local, [true, true, true, true, true, false, true]);
    assert_eq!((c.window_of(0), c.window_of(5)), (4, 0));
    // Nine tensors per block plus the Q/K norms and the two post-norms.
    assert_eq!(c.expected_tensors().len(), 2 + 7 * 13);
    assert!(c
        .expected_tensors()
        .iter()
        .any(|(n, d)| n == "blk.6.attn_k_norm.weight" && d == &[16]));

    // A file without the post-norm of one block is refused, naming the tensor.
    let mut b = GgufBuilder::new();
    for (k, v) in g.metadata() {
        b = b.metadata(k, v.clone());
    }
    let bytes = t.build(4).unwrap();
    for info in g.tensors() {
        if info.name() != "blk.3.post_ffw_norm.weight" {
            let data = g.tensor_bytes(&bytes, info.name()).unwrap().to_vec();
            b = b.tensor(info.name(), info.ggml_type(), info.dims(), data);
        }
    }
    let g = Gguf::parse(&b.build().unwrap()).unwrap();
    let e = ModelConfig::from_gguf(&g).unwrap_err();
    assert!(e.to_string().contains("blk.3.post_ffw_norm.weight"), "{e}");
}
