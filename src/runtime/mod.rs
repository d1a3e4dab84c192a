//! Runtime (in progress)
