//! The command-line tests: the built `dynrt` and `dynrt-bench` binaries (`CARGO_BIN_EXE_dynrt`,
//! `CARGO_BIN_EXE_dynrt-bench`) end to end, and the desktop example under Xvfb. One binary, so
//! that `cargo test` links dynrt once for all of them rather than once per file.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/server.rs"]
mod server;

mod binaries;
mod desktop_chat;
mod generate;
mod info;
mod onnx;
mod plan;
mod predict;
mod serve;
mod serve_embed;
