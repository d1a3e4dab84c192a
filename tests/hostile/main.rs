//! Hostile and careless input, tried as an attacker would: each module covers one class of
//! input (files and paths, ONNX graphs, language models and chats) with generated cases
//! that must end in a typed error or the right behaviour, quickly and in bounded memory.

#[path = "../common/mod.rs"]
mod common;

mod llm;
