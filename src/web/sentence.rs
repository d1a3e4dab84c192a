//! A sentence-embedding model on the page's device ([`WebEmbedder`], `Embedder` in
//! JavaScript): all-MiniLM-L6-v2's sentence-transformers folder given as bytes.

use wasm_bindgen::prelude::*;

/// A sentence model on the page's WebGPU device ([`crate::sentence::SentenceModel`]).
#[wasm_bindgen(js_name = Embedder)]
pub struct WebEmbedder {
    // Rc<RefCell>: each call's promise holds the model across awaits ('static futures).
    model: std::rc::Rc<std::cell::RefCell<crate::sentence::SentenceModel>>,
    dim: usize,
}

#[wasm_bindgen(js_class = Embedder)]
impl WebEmbedder {
    /// Opens the WebGPU device and compiles the BERT of a sentence-transformers folder:
    /// the texts of `config.json`, `tokenizer.json`, `modules.json`, `1_Pooling/config.json`
    /// and `sentence_bert_config.json` (empty when the folder has none), and the bytes of
    /// `model.safetensors` (copied into WebAssembly memory once; the constants point into
    /// them).
    ///
    /// # Errors
    /// Rejects with the reader's, the tokenizer's or the runtime's error.
    pub async fn create(
        config: String,
        tokenizer: String,
        modules: String,
        pooling: String,
        sentence_bert: String,
        safetensors: Vec<u8>,
    ) -> Result<WebEmbedder, JsError> {
        let err = |e: &dyn std::fmt::Display| JsError::new(&e.to_string());
        let index = crate::safetensors::SafeTensors::parse(&safetensors).map_err(|e| err(&e))?;
        let backing: crate::tensor::Backing = std::sync::Arc::new(safetensors);
        let gpu = crate::gpu::Gpu::new(crate::gpu::GpuOptions::default())
            .await
            .map_err(|e| err(&e))?;
        let engine = crate::gpu::Engine::new(gpu);
        let texts = crate::sentence::FolderTexts {
            config: &config,
            tokenizer: &tokenizer,
            modules: &modules,
            pooling: &pooling,
            sentence_bert: (!sentence_bert.is_empty()).then_some(sentence_bert.as_str()),
        };
        let model = crate::sentence::SentenceModel::from_bert(
            &engine,
            texts,
            &index,
            backing,
            crate::sentence::EmbedOptions::default(),
        )
        .map_err(|e| err(&e))?;
        let dim = model.dim();
        Ok(WebEmbedder {
            model: std::rc::Rc::new(std::cell::RefCell::new(model)),
            dim,
        })
    }

    /// Width of the vectors.
    #[wasm_bindgen(getter)]
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Resolves to the vectors of `texts`, `texts.length x dim` values row by row (a
    /// `Float32Array`).
    ///
    /// # Errors
    /// Rejects on a runtime error, or a call started before the previous one resolved.
    // The borrow is held across the awaits on purpose: it makes a second call before the
    // first resolves an error (try_borrow_mut), never a panic.
    #[allow(clippy::await_holding_refcell_ref)]
    pub fn embed(&self, texts: Vec<String>) -> js_sys::Promise {
        let model = self.model.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let mut m = model
                .try_borrow_mut()
                .map_err(|_| super::js_error("an embedding is already running"))?;
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let out = m
                .embed(&refs)
                .await
                .map_err(|e| super::js_error(&e.to_string()))?;
            Ok(js_sys::Float32Array::from(out.values.as_slice()).into())
        })
    }
}
