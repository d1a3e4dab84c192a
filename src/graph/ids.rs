//! Id newtypes shared by the graph, the dependency passes, the pool and the runtime: node ids
//! (insertion order), tensor ids, and positions in processing order.

use std::fmt;

/// A node of a graph, numbered in insertion order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct NodeId(pub u32);

/// A tensor (the output of one node) of a graph.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct TensorId(pub u32);

impl NodeId {
    /// The id as an index into per-node vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl TensorId {
    /// The id as an index into per-tensor vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// A position in a graph's processing order: the `k`-th node the runtime executes. Distinct
/// from [`NodeId`] (insertion order) so that the two numberings cannot be mixed up; the
/// memory-dependency passes, the pool and the runtime's per-node tables use positions, the
/// graph's node table uses ids ([`crate::graph::Graph::positions`] and [`crate::graph::Graph::at`] map one to the other).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Position(pub u32);

impl Position {
    /// The position as an index into per-position vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}
