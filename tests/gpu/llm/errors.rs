//! Bad model files and bad prompts or parameters with `dynrt::llm`: typed errors, nothing left
//! allocated after a failed load, and the session usable after a refused request.

use super::*;

/// Bytes in use on the engine, every kind.
fn device_bytes(engine: &Engine) -> u64 {
    let s = engine.stats();
    dynrt::memory::AllocKind::ALL
        .iter()
        .map(|&k| s.current_bytes(k))
        .sum()
}

/// Where tensor `name`'s info sits in a GGUF: the offset of its type id (the u64 tensor
/// offset follows). A 2-D tensor's info is its name, n_dims, two u64 dims, type, offset.
fn tensor_info_type_at(file: &[u8], name: &str) -> usize {
    let needle = name.as_bytes();
    let at = file
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{name} not in the file"));
    let n_dims = u32::from_le_bytes(file[at + needle.len()..][..4].try_into().unwrap());
    assert_eq!(n_dims, 2, "{name}");
    at + needle.len() + 4 + 16
}

#[test]
fn bad_model_files_are_typed_errors_and_leave_nothing_allocated() {
    let test = "bad_model_files_are_typed_errors_and_leave_nothing_allocated";
    let Some(engine) = engine(test) else { return };
    let good = TinyLlama::default().build(5).unwrap();
    let before = device_bytes(&engine);
    let load = |bytes: Vec<u8>| {
        let r = Model::from_backing(&engine, Arc::new(bytes), ModelOptions::default());
        assert_eq!(
            device_bytes(&engine),
            before,
            "bytes in use after a failed load"
        );
        r.expect_err("the load must fail")
    };
    // Truncated: in the header, in the tensor infos, in the data.
    for cut in [10, 400, good.len() - 1] {
        match load(good[..cut].to_vec()) {
            LlmError::Gguf(GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }) => {}
            e => panic!("cut at {cut}: {e}"),
        }
    }
    let mut magic = good.clone();
    magic[..4].copy_from_slice(b"GGML");
    assert!(matches!(
        load(magic),
        LlmError::Gguf(GgufError::BadMagic { .. })
    ));
    // A tensor whose data lies past the end of the file.
    let mut past = good.clone();
    let at = tensor_info_type_at(&past, "blk.1.ffn_down.weight") + 4;
    past[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    match load(past) {
        LlmError::Gguf(GgufError::TensorOutOfBounds { tensor, .. }) => {
            assert_eq!(tensor, "blk.1.ffn_down.weight")
        }
        e => panic!("{e}"),
    }
    // A type id GGUF does not define.
    let mut unknown = good.clone();
    let at = tensor_info_type_at(&unknown, "blk.0.attn_q.weight");
    unknown[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    match load(unknown) {
        LlmError::Gguf(GgufError::UnknownTensorType { tensor, type_id }) => {
            assert_eq!((tensor.as_str(), type_id), ("blk.0.attn_q.weight", 99))
        }
        e => panic!("{e}"),
    }
    // A type GGUF defines but dynrt does not run: f16 projections relabelled i16 (the
    // same bytes per element, so the file itself stays valid).
    let mut i16_file = TinyLlama {
        projection_type: GgmlType::F16,
        ..TinyLlama::default()
    }
    .build(5)
    .unwrap();
    let at = tensor_info_type_at(&i16_file, "blk.0.attn_k.weight");
    i16_file[at..at + 4].copy_from_slice(&GgmlType::I16.id().to_le_bytes());
    match load(i16_file) {
        e @ LlmError::UnsupportedWeight { .. } => {
            let LlmError::UnsupportedWeight { tensor, ggml_type } = &e else {
                unreachable!()
            };
            assert_eq!(
                (tensor.as_str(), *ggml_type),
                ("blk.0.attn_k.weight", "I16")
            );
            // The message lists what dynrt does run, from the format table.
            let text = e.to_string();
            assert!(
                text.contains("I16") && text.contains("Q4_K, Q5_K, Q6_K"),
                "{text}"
            );
        }
        e => panic!("{e}"),
    }
    // A valid file on an engine whose budget cannot hold the weights (about 58 KiB): the
    // data region is refused and nothing stays.
    let small = Engine::with_memory_budget(engine.gpu().clone(), 32 * 1024);
    let r = Model::from_backing(&small, Arc::new(good.clone()), ModelOptions::default());
    match r {
        Err(LlmError::Run(RunError::Alloc { what, .. })) => assert_eq!(what, "data region"),
        other => panic!("{other:?}"),
    }
    assert_eq!(device_bytes(&small), 0);
    // A budget that holds the weights but not a session's activations: generation fails
    // with a typed error naming a node, and dropping the session gives everything back.
    let weights = Model::from_backing(&engine, Arc::new(good.clone()), ModelOptions::default())
        .unwrap()
        .weight_bytes();
    let tight = Engine::with_memory_budget(engine.gpu().clone(), weights + 16 * 1024);
    let model =
        Model::from_backing(&tight, Arc::new(good.clone()), ModelOptions::default()).unwrap();
    let loaded = device_bytes(&tight);
    let mut session = model.session(RunOptions::new(Policy::Adaptive));
    let prompt: Vec<u32> = (3..200).collect();
    match session.generate_ids_blocking(&prompt, &greedy(4), &mut |_| {}) {
        Err(LlmError::Run(RunError::OutOfMemory { node, .. })) => assert!(!node.is_empty()),
        other => panic!("{other:?}"),
    }
    drop(session);
    // What stays is the network's pool of free input/output slots for the next session
    // (placeholders region): no activation and no KV cache.
    let regions = tight.stats().regions;
    assert_eq!(regions[2].current_bytes, 0, "internal region");
    assert_eq!(
        device_bytes(&tight),
        loaded + regions[1].current_bytes,
        "only placeholders stay"
    );
    drop(model);
    assert_eq!(device_bytes(&tight), 0);
    // And the good file loads.
    assert!(Model::from_backing(&engine, Arc::new(good), ModelOptions::default()).is_ok());
}

#[test]
fn bad_prompts_and_parameters_are_typed_errors_and_the_session_goes_on() {
    let test = "bad_prompts_and_parameters_are_typed_errors_and_the_session_goes_on";
    let Some(engine) = engine(test) else { return };
    let tiny = TinyLlama::default();
    let bytes = tiny.build(5).unwrap();
    let model = Model::from_backing(&engine, Arc::new(bytes), ModelOptions::default()).unwrap();
    let mut session = model.session(RunOptions::new(Policy::Adaptive));
    let context = tiny.context_len as usize;
    let long: Vec<u32> = (0..context as u32 + 1).map(|i| 3 + i % 200).collect();
    match session.generate_ids_blocking(&long, &greedy(4), &mut |_| {}) {
        Err(LlmError::ContextFull {
            past_tokens: 0,
            new_tokens,
            context_len,
        }) => assert_eq!((new_tokens, context_len as usize), (context + 1, context)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        session.generate_ids_blocking(&[5, 100_000], &greedy(4), &mut |_| {}),
        Err(LlmError::UnknownToken { id: 100_000, .. })
    ));
    assert!(matches!(
        session.generate_ids_blocking(&[], &greedy(4), &mut |_| {}),
        Err(LlmError::EmptyPrompt)
    ));
    let mut bad = greedy(4);
    bad.sampling.top_p = 0.0;
    assert!(matches!(
        session.generate_ids_blocking(&[5, 6], &bad, &mut |_| {}),
        Err(LlmError::BadParameter { name: "top_p", .. })
    ));
    bad = greedy(0);
    assert!(matches!(
        session.generate_ids_blocking(&[5, 6], &bad, &mut |_| {}),
        Err(LlmError::BadParameter {
            name: "max_tokens",
            ..
        })
    ));
    assert!(session.cached_tokens().is_empty(), "nothing ran");
    // The session still works, and a prompt that fills the context stops there.
    let g = session
        .generate_ids_blocking(&long[..context - 3], &greedy(10), &mut |_| {})
        .unwrap();
    assert_eq!(g.stop, StopReason::ContextFull);
    assert_eq!(g.tokens.len(), 4);
    assert_eq!(session.cached_tokens().len(), context);
}
