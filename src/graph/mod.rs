//! Graph IR with symbolic dimensions, builder, ops, shape inference, processing order, and
//! memory dependencies.
//!
//! * [`ir`] — [`Graph`] (nodes by [`NodeId`], processing order by [`Position`]) and
//!   [`GraphBuilder`];
//! * [`ops`] — one type per op implementing [`OpDef`] (dtype rule, shape rule, CPU reference,
//!   host evaluation), gathered in [`Op`];
//! * [`reference`](mod@reference) — the CPU reference evaluator with its own index code;
//! * [`shape_data`] — the host evaluator of integer shape data, separate from the reference;
//! * [`deps`] — memory dependencies and lifetimes over processing positions;
//! * [`fuse`] — the rewrites that fold a linear's norm, gated activation and residual into
//!   one node (run by the runtime before it compiles a graph).
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
pub mod fuse;
pub mod ids;
pub mod ir;
pub mod ops;
pub mod reference;
pub mod shape_data;

pub use ids::{NodeId, Position, TensorId};
pub use ir::{Bindings, Dim, Graph, GraphBuilder, GraphError, InferredShapes, Node};
pub use ops::{BinaryOp, InferError, Op, OpDef, UnaryOp};
