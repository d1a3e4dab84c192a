//! Memory dependencies over a DAG in processing order, and tensor lifetimes.
//!
//! Two nodes *conflict* (have a memory dependency) when their outputs must not share a buffer.
//! The passes follow the OpenVINO GPU plugin's memory dependencies (docs/design.md, "Memory
//! pool and static planner"):
//!
//! - [`basic_dependencies`] assumes an in-order queue: a node conflicts with its inputs, its
//!   users, and every earlier network output (outputs stay alive until the host reads them);
//! - [`out_of_order_dependencies`] assumes an out-of-order queue: two nodes conflict when
//!   neither can reach the other, so they may run at the same time.
//!
//! The passes work on a plain [`DepGraph`] (producer lists per node) so they do not depend on
//! the graph IR; the IR lowers itself to a `DepGraph` in processing order.

use crate::graph::ids::Position;
use std::collections::BTreeSet;

/// A DAG in processing order: node `i` is the `i`-th node the runtime executes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DepGraph {
    /// `inputs[i]` lists the producers of node `i`; every producer must come before `i`.
    pub inputs: Vec<Vec<Position>>,
    /// `is_output[i]` is true when node `i`'s output is a network output (read by the host).
    pub is_output: Vec<bool>,
}

/// Errors of the dependency passes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DepError {
    /// A node lists an input that does not come earlier in processing order.
    #[error(
        "position {node} reads position {input}, which does not come before it in processing order"
    )]
    InputNotEarlier {
        /// The reading node.
        node: Position,
        /// The offending producer.
        input: Position,
    },
    /// `inputs` and `is_output` describe different numbers of nodes.
    #[error("dependency graph has {inputs_len} input lists but {outputs_len} output flags")]
    LengthMismatch {
        /// `inputs.len()`.
        inputs_len: usize,
        /// `is_output.len()`.
        outputs_len: usize,
    },
    /// More nodes than a [`Position`] can number.
    #[error("dependency graph has {nodes} nodes, more than a position can number")]
    TooManyNodes {
        /// The node count.
        nodes: usize,
    },
}

/// The first and last processing positions at which a node's output is alive (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lifetime {
    /// Position of the producer.
    pub first: u32,
    /// Position of the last consumer; the last position of the graph for network outputs.
    pub last: u32,
}

impl DepGraph {
    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// Checks that lengths agree and that every input precedes its reader.
    ///
    /// # Errors
    /// [`DepError::LengthMismatch`], [`DepError::InputNotEarlier`] naming the node, or
    /// [`DepError::TooManyNodes`].
    pub fn validate(&self) -> Result<(), DepError> {
        if self.inputs.len() != self.is_output.len() {
            return Err(DepError::LengthMismatch {
                inputs_len: self.inputs.len(),
                outputs_len: self.is_output.len(),
            });
        }
        if u32::try_from(self.inputs.len()).is_err() {
            return Err(DepError::TooManyNodes {
                nodes: self.inputs.len(),
            });
        }
        for (i, ins) in self.inputs.iter().enumerate() {
            for &input in ins {
                if input.index() >= i {
                    return Err(DepError::InputNotEarlier {
                        node: Position(i as u32),
                        input,
                    });
                }
            }
        }
        Ok(())
    }

    /// `users[i]` = the nodes that read node `i`, ascending, without duplicates.
    fn users(&self) -> Vec<Vec<Position>> {
        let mut users: Vec<Vec<Position>> = vec![Vec::new(); self.len()];
        for (i, ins) in self.inputs.iter().enumerate() {
            for &input in ins {
                let u = &mut users[input.index()];
                if u.last() != Some(&Position(i as u32)) {
                    u.push(Position(i as u32));
                }
            }
        }
        users
    }
}

/// The in-order-queue pass: node `i` conflicts with its inputs, its users, and every network
/// output that comes before it. The result is symmetric (`j ∈ deps[i]` ⇔ `i ∈ deps[j]`) and a
/// node never lists itself.
///
/// # Errors
/// Whatever [`DepGraph::validate`] reports.
pub fn basic_dependencies(graph: &DepGraph) -> Result<Vec<BTreeSet<Position>>, DepError> {
    graph.validate()?;
    let n = graph.len();
    let mut deps = vec![BTreeSet::new(); n];
    let mut earlier_outputs: Vec<usize> = Vec::new();
    for i in 0..n {
        for &input in &graph.inputs[i] {
            deps[i].insert(input);
            deps[input.index()].insert(Position(i as u32));
        }
        // Outputs must survive until the host reads them after the whole network ran, so no
        // later node may overwrite them.
        for &o in &earlier_outputs {
            deps[i].insert(Position(o as u32));
            deps[o].insert(Position(i as u32));
        }
        if graph.is_output[i] {
            earlier_outputs.push(i);
        }
    }
    Ok(deps)
}

/// Reachability bitsets: bit `j` of row `i` is set when `j` is a (transitive) user of `i`.
struct Reach {
    words: usize,
    bits: Vec<u64>,
}

impl Reach {
    fn build(graph: &DepGraph) -> Reach {
        let n = graph.len();
        let words = n.div_ceil(64);
        let mut bits = vec![0u64; n * words];
        let users = graph.users();
        // Processing order is topological, so walking backwards sees every user complete.
        for i in (0..n).rev() {
            for &u in &users[i] {
                let u = u.index();
                let (head, tail) = bits.split_at_mut(u * words);
                let row_i = &mut head[i * words..(i + 1) * words];
                let row_u = &tail[..words];
                for (a, b) in row_i.iter_mut().zip(row_u) {
                    *a |= *b;
                }
                row_i[u / 64] |= 1u64 << (u % 64);
            }
        }
        Reach { words, bits }
    }

    fn reaches(&self, from: usize, to: usize) -> bool {
        self.bits[from * self.words + to / 64] >> (to % 64) & 1 == 1
    }
}

/// The out-of-order-queue pass: nodes `i` and `j` conflict when neither reaches the other
/// (they may run concurrently). Symmetric; a node never lists itself. Quadratic in the node
/// count in the worst case (the answer itself can be that large).
///
/// # Errors
/// Whatever [`DepGraph::validate`] reports.
pub fn out_of_order_dependencies(graph: &DepGraph) -> Result<Vec<BTreeSet<Position>>, DepError> {
    graph.validate()?;
    let n = graph.len();
    let reach = Reach::build(graph);
    let mut deps = vec![BTreeSet::new(); n];
    for i in 0..n {
        for j in (i + 1)..n {
            // j > i cannot reach i in a topological order, so one test suffices.
            if !reach.reaches(i, j) {
                deps[i].insert(Position(j as u32));
                deps[j].insert(Position(i as u32));
            }
        }
    }
    Ok(deps)
}

/// Lifetime of every node's output: produced at its own position, alive until its last user;
/// network outputs live to the last position of the graph.
///
/// # Errors
/// Whatever [`DepGraph::validate`] reports.
pub fn lifetimes(graph: &DepGraph) -> Result<Vec<Lifetime>, DepError> {
    graph.validate()?;
    let n = graph.len();
    let end = n.saturating_sub(1) as u32;
    let mut out: Vec<Lifetime> = (0..n as u32)
        .map(|i| Lifetime { first: i, last: i })
        .collect();
    for (i, ins) in graph.inputs.iter().enumerate() {
        for &input in ins {
            let l = &mut out[input.index()];
            l.last = l.last.max(i as u32);
        }
    }
    for (i, &o) in graph.is_output.iter().enumerate() {
        if o {
            out[i].last = end;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<Position> {
        v.iter().map(|&i| Position(i)).collect()
    }

    /// 0 -> 1 -> 3, 0 -> 2 -> 3, 3 output; 2 is also an output.
    fn diamond() -> DepGraph {
        DepGraph {
            inputs: vec![ids(&[]), ids(&[0]), ids(&[0]), ids(&[1, 2])],
            is_output: vec![false, false, true, true],
        }
    }

    #[test]
    fn basic_pass_links_inputs_users_and_earlier_outputs() {
        let d = basic_dependencies(&diamond()).unwrap();
        assert_eq!(d[0], ids(&[1, 2]).into_iter().collect());
        assert_eq!(d[1], ids(&[0, 3]).into_iter().collect());
        assert_eq!(d[3], ids(&[1, 2]).into_iter().collect());
        // 1 and 2 are not linked in-order: 2 is an output but comes after 1.
        assert!(!d[1].contains(&Position(2)));
    }

    #[test]
    fn out_of_order_pass_links_parallel_branches_only() {
        let d = out_of_order_dependencies(&diamond()).unwrap();
        assert_eq!(d[1], ids(&[2]).into_iter().collect());
        assert_eq!(d[2], ids(&[1]).into_iter().collect());
        assert!(d[0].is_empty() && d[3].is_empty());
    }

    #[test]
    fn lifetimes_run_to_last_user_or_end() {
        let l = lifetimes(&diamond()).unwrap();
        assert_eq!(l[0], Lifetime { first: 0, last: 2 });
        assert_eq!(l[1], Lifetime { first: 1, last: 3 });
        assert_eq!(l[2], Lifetime { first: 2, last: 3 });
        assert_eq!(l[3], Lifetime { first: 3, last: 3 });
    }

    #[test]
    fn input_after_reader_is_an_error_naming_the_node() {
        let g = DepGraph {
            inputs: vec![ids(&[1]), ids(&[])],
            is_output: vec![false, true],
        };
        let e = basic_dependencies(&g).unwrap_err();
        assert_eq!(
            e,
            DepError::InputNotEarlier {
                node: Position(0),
                input: Position(1)
            }
        );
        assert!(e.to_string().contains("p0"));
        let g = DepGraph {
            inputs: vec![ids(&[])],
            is_output: vec![],
        };
        assert!(matches!(
            lifetimes(&g),
            Err(DepError::LengthMismatch { .. })
        ));
    }
}
