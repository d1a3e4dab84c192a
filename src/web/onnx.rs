//! An ONNX model on the page's device ([`WebOnnxSession`], `OnnxSession` in JavaScript).

use wasm_bindgen::prelude::*;

/// An ONNX model on the page's WebGPU device ([`crate::onnx::OnnxSession`]): the protocol
/// `web/peer/peer.js` drives (see `scripts/bench_peer.sh`). Tensors cross as `.npy` bytes.
#[wasm_bindgen(js_name = OnnxSession)]
pub struct WebOnnxSession {
    // Rc<RefCell>: each run's promise holds the session across awaits ('static futures).
    session: std::rc::Rc<std::cell::RefCell<crate::onnx::OnnxSession>>,
    /// The pasts the previous run said to carry (they may be left out of the next run).
    carried: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
}

#[wasm_bindgen(js_class = OnnxSession)]
impl WebOnnxSession {
    /// Opens the WebGPU device, decodes `model` (its external data files given as
    /// `external_names[i]` → `external_bytes[i]`, the names as the model writes them),
    /// imports and compiles it. Every `past → Concat → present` cache can be carried.
    ///
    /// # Errors
    /// Rejects with the loader's, the importer's or the runtime's error (the unsupported
    /// nodes all listed), or when the two arrays differ in length.
    pub async fn create(
        model: Vec<u8>,
        external_names: Vec<String>,
        external_bytes: Vec<js_sys::Uint8Array>,
    ) -> Result<WebOnnxSession, JsError> {
        if external_names.len() != external_bytes.len() {
            return Err(JsError::new(&format!(
                "{} external names but {} byte arrays",
                external_names.len(),
                external_bytes.len()
            )));
        }
        let mut resolver = crate::onnx::external::BytesResolver::new();
        for (name, bytes) in external_names.into_iter().zip(external_bytes) {
            resolver.insert(name, bytes::Bytes::from(bytes.to_vec()));
        }
        let gpu = crate::gpu::Gpu::new(crate::gpu::GpuOptions::default())
            .await
            .map_err(|e| JsError::new(&e.to_string()))?;
        let engine = crate::gpu::Engine::new(gpu);
        let session = crate::onnx::OnnxSession::from_bytes(
            &engine,
            bytes::Bytes::from(model),
            &resolver,
            &crate::onnx::SessionOptions::default(),
        )
        .map_err(|e| JsError::new(&e.to_string()))?;
        Ok(WebOnnxSession {
            session: std::rc::Rc::new(std::cell::RefCell::new(session)),
            carried: std::rc::Rc::default(),
        })
    }

    /// Runs the model once with the inputs `feed_names[i]` = `feeds[i]` (`.npy` bytes; a past
    /// carried by the previous run may be left out, or given to replace it) and resolves, when
    /// the run is complete on the device, to the outputs named in `fetch` as `.npy` bytes.
    /// `carry` holds `[output, input]` pairs: after this run each output becomes that input of
    /// the next run without leaving the device (each must be a cache the session appends in
    /// place: an output that concatenates the input with new rows).
    ///
    /// # Errors
    /// Rejects on malformed `.npy` bytes, inputs that do not fit the model (named), a carry
    /// pair that is not such a cache, a runtime error, or a run started before the previous
    /// one resolved.
    // The borrow is held across the run's awaits on purpose: it is the lock that makes a
    // second run before the first resolves an error (try_borrow_mut), never a panic.
    #[allow(clippy::await_holding_refcell_ref)]
    pub fn run(
        &self,
        feed_names: Vec<String>,
        feeds: Vec<js_sys::Uint8Array>,
        fetch: Vec<String>,
        carry: js_sys::Array,
    ) -> js_sys::Promise {
        let session = self.session.clone();
        let carried = self.carried.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let err = |e: String| JsValue::from(JsError::new(&e));
            let mut s = session
                .try_borrow_mut()
                .map_err(|_| err("a run is already going: await it first".into()))?;
            if feed_names.len() != feeds.len() {
                return Err(err(format!(
                    "{} feed names but {} feeds",
                    feed_names.len(),
                    feeds.len()
                )));
            }
            let mut tensors = Vec::with_capacity(feeds.len());
            for (name, bytes) in feed_names.iter().zip(&feeds) {
                let t = crate::npy::read_npy(&bytes.to_vec())
                    .map_err(|e| err(format!("feed `{name}`: {e}")))?;
                tensors.push(t);
            }
            let mut next: Vec<String> = Vec::new();
            for pair in carry.iter() {
                let pair = js_sys::Array::from(&pair);
                let (out, inp) = (pair.get(0).as_string(), pair.get(1).as_string());
                let (Some(out), Some(inp)) = (out, inp) else {
                    return Err(err("carry: each entry is [output, input]".into()));
                };
                if !s
                    .states()
                    .iter()
                    .any(|st| st.present == out && st.past == inp)
                {
                    return Err(err(format!(
                        "carry `{out}` -> `{inp}`: not a cache this session appends in place"
                    )));
                }
                next.push(inp);
            }
            let refs: Vec<(&str, &crate::onnx::HostTensor)> = feed_names
                .iter()
                .map(String::as_str)
                .zip(&tensors)
                .collect();
            let allowed = carried.borrow().clone();
            let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
            s.run_carried(&refs, &allowed)
                .await
                .map_err(|e| err(e.to_string()))?;
            *carried.borrow_mut() = next;
            let out = js_sys::Array::new();
            for name in &fetch {
                let t = s.read(name).await.map_err(|e| err(e.to_string()))?;
                let npy = crate::npy::write_npy(&t).map_err(|e| err(format!("{name}: {e}")))?;
                out.push(&js_sys::Uint8Array::from(npy.as_slice()));
            }
            if fetch.is_empty() {
                s.engine().gpu().idle().await;
            }
            Ok(out.into())
        })
    }

    /// Keeps the inputs `names[i]` = `feeds[i]` (`.npy` bytes) on the device
    /// ([`crate::onnx::OnnxSession::keep_input`]): later runs may leave them out, and their
    /// bytes are written once, by the next run, instead of at every run — what a page gets
    /// from ONNX Runtime Web by feeding GPU tensors.
    ///
    /// # Errors
    /// Malformed `.npy` bytes, an input the model does not have or that does not fit (named),
    /// a carried past, a run still going, or arrays of different lengths. The inputs before
    /// the failing one stay kept.
    pub fn keep(&self, names: Vec<String>, feeds: Vec<js_sys::Uint8Array>) -> Result<(), JsError> {
        if names.len() != feeds.len() {
            return Err(JsError::new(&format!(
                "{} names but {} feeds",
                names.len(),
                feeds.len()
            )));
        }
        let mut s = self
            .session
            .try_borrow_mut()
            .map_err(|_| JsError::new("a run is going: await it first"))?;
        for (name, bytes) in names.iter().zip(&feeds) {
            let t = crate::npy::read_npy(&bytes.to_vec())
                .map_err(|e| JsError::new(&format!("feed `{name}`: {e}")))?;
            s.keep_input(name, &t)
                .map_err(|e| JsError::new(&e.to_string()))?;
        }
        Ok(())
    }
}
