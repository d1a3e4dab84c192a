//! Hostile and careless input, tried as an attacker would: files and paths built to hang,
//! exhaust or mislead dynrt (`io`), language models and chats (`llm`), ONNX graphs with huge
//! nodes and out-of-range indices (`onnx`), 4-bit `MatMulNBits` weights whose sizes lie
//! (`onnx_nbits`), safetensors headers that lie about lengths, offsets and types
//! (`safetensors`), and `dynrt serve` over HTTP (`serve`: each finding of the server probe of
//! issue 36). Each case must end in a typed error that says
//! what is wrong, or in the right behaviour, quickly and in bounded memory. One module per
//! area.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/server.rs"]
mod server;

mod io;
mod llm;
mod onnx;
mod onnx_nbits;
mod safetensors;
mod serve;
