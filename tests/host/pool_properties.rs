//! Property tests of the memory pool over random DAGs: the pool never hands a record to a
//! requester that conflicts with one of the record's users, and releasing everything returns
//! the bytes in use to zero.

use crate::common;
use dynrt::graph::deps::{basic_dependencies, lifetimes, out_of_order_dependencies, DepGraph};
use dynrt::graph::Position;
use dynrt::memory::pool::{acquire_descending, HostStorage, MemoryPool, NetworkId, PoolRequest};
use dynrt::memory::AllocKind;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// A random DAG in processing order: each node reads up to 3 earlier nodes.
fn dag() -> impl Strategy<Value = (DepGraph, Vec<u64>, Vec<bool>)> {
    (2usize..40).prop_flat_map(|n| {
        (
            prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 0..4), n),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(1u64..5000, n),
            prop::collection::vec(any::<bool>(), n),
        )
            .prop_map(move |(ins, outs, sizes, dynamic)| {
                let inputs: Vec<Vec<Position>> = ins
                    .into_iter()
                    .enumerate()
                    .map(|(i, picks)| {
                        if i == 0 {
                            return Vec::new();
                        }
                        let mut v: Vec<Position> =
                            picks.iter().map(|p| Position(p.index(i) as u32)).collect();
                        v.sort();
                        v.dedup();
                        v
                    })
                    .collect();
                // Only nodes nobody reads, plus a few random ones, are outputs.
                let mut is_output = outs;
                is_output[n - 1] = true;
                (DepGraph { inputs, is_output }, sizes, dynamic)
            })
    })
}

fn check_no_conflicting_users(
    pool: &MemoryPool<HostStorage>,
    record: dynrt::memory::pool::RecordId,
    deps: &[BTreeSet<Position>],
) -> Result<(), TestCaseError> {
    let users = pool.users(record);
    for &a in &users {
        for &b in &users {
            prop_assert!(
                a == b || !deps[a.index()].contains(&b),
                "record {:?} shared by conflicting {} and {}",
                record,
                a,
                b
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::proptest_config(96))]

    #[test]
    fn pool_respects_dependencies_while_running((g, sizes, dynamic) in dag(), ooo in any::<bool>()) {
        let deps = if ooo { out_of_order_dependencies(&g).unwrap() } else { basic_dependencies(&g).unwrap() };
        for (i, d) in deps.iter().enumerate() {
            for j in d {
                prop_assert!(deps[j.index()].contains(&Position(i as u32)), "dependencies must be symmetric");
            }
        }
        let life = lifetimes(&g).unwrap();
        let mut pool = MemoryPool::new(HostStorage::new());
        let net = NetworkId(0);
        for i in 0..g.len() {
            let req = PoolRequest { size_bytes: sizes[i], kind: AllocKind::UsmDevice, network: net, requester: Position(i as u32), restrictions: &deps[i], dynamic: dynamic[i] };
            let view = pool.acquire(&req).unwrap();
            prop_assert!(view.size_bytes == sizes[i]);
            check_no_conflicting_users(&pool, view.record, &deps)?;
            // Release the outputs whose last reader just ran (not network outputs).
            for (j, l) in life.iter().enumerate().take(i + 1) {
                if l.last as usize == i && !g.is_output[j] {
                    pool.release(net, Position(j as u32));
                }
            }
        }
        prop_assert!(pool.storage().bytes_in_use() > 0);
        for i in 0..g.len() {
            pool.release(net, Position(i as u32));
        }
        let r = pool.report();
        prop_assert_eq!((r.records, r.bytes_reserved, r.bytes_in_use), (0, 0, 0));
        prop_assert_eq!(pool.storage().bytes_in_use(), 0);
    }

    #[test]
    fn build_time_allocation_respects_dependencies((g, sizes, _dynamic) in dag()) {
        let deps = basic_dependencies(&g).unwrap();
        let mut pool = MemoryPool::new(HostStorage::new());
        let reqs: Vec<PoolRequest> = (0..g.len())
            .map(|i| PoolRequest { size_bytes: sizes[i], kind: AllocKind::UsmDevice, network: NetworkId(3), requester: Position(i as u32), restrictions: &deps[i], dynamic: false })
            .collect();
        let views = acquire_descending(&mut pool, &reqs).unwrap();
        prop_assert_eq!(views.len(), g.len());
        for v in &views {
            check_no_conflicting_users(&pool, v.record, &deps)?;
        }
        // Sharing must save memory whenever some record has two users.
        let total: u64 = sizes.iter().sum();
        let r = pool.report();
        prop_assert!(r.bytes_reserved <= total);
        if r.reuse_hits > 0 {
            prop_assert!(r.records < g.len());
        }
        prop_assert_eq!(pool.clear_network(NetworkId(3)), r.bytes_reserved);
        prop_assert_eq!(pool.storage().bytes_in_use(), 0);
    }
}
