//! Graph IR with symbolic dimensions, builder, ops, shape inference, processing order, and
//! memory dependencies.
//!
//! ```
//! use dynrt::graph::{Bindings, Dim, GraphBuilder};
//! use dynrt::shape::{DType, Shape};
//! let mut b = GraphBuilder::new();
//! let x = b.input("x", &[Dim::sym("seq"), Dim::Fixed(4)], DType::F32);
//! let w = b.constant("w", Shape::new(vec![4, 2]), vec![0.5; 8]);
//! let y = b.matmul("y", x, w, false);
//! let y = b.relu("relu", y);
//! b.output(y);
//! let g = b.build().unwrap();
//! let shapes = g.infer_shapes(&Bindings::from([("seq".to_string(), 3)])).unwrap();
//! assert_eq!(shapes.shapes[y.index()], Shape::new(vec![3, 2]));
//! ```

pub mod deps;
pub mod ids;
pub mod ir;
pub mod ops;
pub mod reference;

pub use ids::{NodeId, TensorId};
pub use ir::{Bindings, Dim, Graph, GraphBuilder, GraphError, InferredShapes, Node};
pub use ops::{BinaryOp, InferError, Op, UnaryOp};
