//! Graph IR with symbolic dimensions, builder, ops, shape inference, processing order, and
//! memory dependencies (in progress).

pub mod deps;
pub mod ids;

pub use ids::{NodeId, TensorId};
