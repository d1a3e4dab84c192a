//! Engine integration tests on real adapters: every backend the machine offers (Vulkan on
//! lavapipe, GL on llvmpipe), skipped with a printed reason only when DYNRT_REQUIRE_GPU is unset.

use dynrt::gpu::{testing, AllocError, BufferDesc, Engine, Gpu, KindRequest, MapAccess};
use dynrt::memory::accounting::{check_history, AllocEvent, AllocOp};
use dynrt::memory::AllocKind;
use dynrt::rng::SplitMix64;

fn desc(label: &str, size_bytes: u64, kind: AllocKind) -> BufferDesc<'_> {
    BufferDesc {
        label,
        size_bytes,
        kind,
    }
}

fn random_bytes(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// Every wgpu error must have been turned into a Result (error scopes), none left uncaptured.
fn assert_no_uncaptured(gpu: &Gpu) {
    let errors = gpu.uncaptured_errors();
    assert!(
        errors.is_empty(),
        "{}: uncaptured wgpu errors: {errors:?}",
        name(gpu)
    );
}

fn name(gpu: &Gpu) -> String {
    format!("{:?}/{}", gpu.backend(), gpu.adapter_info().name)
}

#[test]
fn every_kind_round_trips_and_frees() {
    let gpus = testing::gpus_or_skip("every_kind_round_trips_and_frees");
    for gpu in gpus {
        let engine = Engine::new(gpu.clone());
        engine.record_history(1 << 16);
        let mut rng = SplitMix64::new(42);
        for kind in AllocKind::ALL {
            let size = 4 * rng.range(1, 5000);
            let r = engine.allocate(&desc("round trip", size, kind));
            if kind == AllocKind::UsmShared && !gpu.supports_shared() {
                // Documented fallback: unsupported, and preferred_kind answers usm_host.
                assert!(
                    matches!(
                        r,
                        Err(AllocError::Unsupported {
                            kind: AllocKind::UsmShared,
                            ..
                        })
                    ),
                    "{}: {r:?}",
                    name(&gpu)
                );
                assert_eq!(
                    engine.preferred_kind(&KindRequest {
                        host_access: true,
                        kernel_access: false,
                        kernel_io_bytes: 0
                    }),
                    AllocKind::UsmHost
                );
                // Memory a kernel binds cannot be usm_host on wgpu: device memory with staging.
                assert_eq!(
                    engine.preferred_kind(&KindRequest {
                        host_access: true,
                        kernel_access: true,
                        kernel_io_bytes: 0
                    }),
                    AllocKind::UsmDevice
                );
                assert_eq!(engine.stats().kind(kind).allocations, 0);
                continue;
            }
            let buf = r.unwrap_or_else(|e| panic!("{}: allocate {kind}: {e}", name(&gpu)));
            assert_eq!((buf.kind(), buf.size_bytes()), (kind, size));
            assert_eq!(engine.stats().current_bytes(kind), size);
            // Fresh buffers are zero (WebGPU zero-initialises).
            assert!(engine
                .read_blocking(&buf, 0, size)
                .unwrap()
                .iter()
                .all(|b| *b == 0));
            let data = random_bytes(&mut rng, size as usize);
            engine.write(&buf, 0, &data).unwrap();
            let back = engine.read_blocking(&buf, 0, size).unwrap();
            assert!(
                back == data,
                "{}: {kind} full round trip differs",
                name(&gpu)
            );
            // A partial write at an aligned offset, then an unaligned partial read.
            let patch = random_bytes(&mut rng, 8);
            engine.write(&buf, 4, &patch).unwrap();
            let mut want = data.clone();
            want[4..12].copy_from_slice(&patch);
            let part = engine.read_blocking(&buf, 3, 10).unwrap();
            assert_eq!(part, want[3..13], "{}: {kind} partial read", name(&gpu));
            drop(buf);
            assert_eq!(
                engine.stats().current_bytes(kind),
                0,
                "{kind} bytes after drop"
            );
        }
        // allocate_init on every supported kind, with contents shorter than the buffer.
        for kind in AllocKind::ALL.into_iter().filter(|k| gpu.supports_kind(*k)) {
            let contents = random_bytes(&mut rng, 10);
            let buf = engine
                .allocate_init(&desc("init", 16, kind), &contents)
                .unwrap();
            let back = engine.read_blocking(&buf, 0, 16).unwrap();
            assert_eq!(&back[..10], &contents[..]);
            assert!(back[10..].iter().all(|b| *b == 0));
        }
        let stats = engine.stats();
        assert!(
            stats.total_current_bytes() == 0,
            "{}: {stats:?}",
            name(&gpu)
        );
        let history = engine.history();
        assert!(history.len() > 8);
        check_history(&history).unwrap();
        // Every Allocate was matched by a Free.
        let allocs = history.iter().filter(|e| e.op == AllocOp::Allocate).count();
        assert_eq!(allocs * 2, history.len());
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn sizes_round_up_to_copy_alignment() {
    for gpu in testing::gpus_or_skip("sizes_round_up_to_copy_alignment") {
        let engine = Engine::new(gpu.clone());
        for (asked, real) in [(0u64, 4u64), (1, 4), (5, 8), (8, 8)] {
            let b = engine
                .allocate(&desc("odd", asked, AllocKind::UsmDevice))
                .unwrap();
            assert_eq!(b.size_bytes(), real);
            assert_eq!(engine.stats().current_bytes(AllocKind::UsmDevice), real);
        }
        assert_eq!(engine.stats().current_bytes(AllocKind::UsmDevice), 0);
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn peak_is_the_true_peak() {
    for gpu in testing::gpus_or_skip("peak_is_the_true_peak") {
        let engine = Engine::new(gpu.clone());
        engine.record_history(1 << 16);
        let k = AllocKind::UsmDevice;
        let a = engine.allocate(&desc("a", 1000, k)).unwrap();
        let b = engine.allocate(&desc("b", 2000, k)).unwrap();
        assert_eq!(engine.stats().peak_bytes(k), 3000);
        drop(a);
        let c = engine.allocate(&desc("c", 500, k)).unwrap();
        // 2500 now; the peak stays at 3000, not the sum of all sizes (3500) nor current.
        assert_eq!(engine.stats().current_bytes(k), 2500);
        assert_eq!(engine.stats().peak_bytes(k), 3000);
        let d = engine.allocate(&desc("d", 1000, k)).unwrap();
        assert_eq!(engine.stats().peak_bytes(k), 3500);
        drop((b, c, d));
        let s = engine.stats().kind(k);
        assert_eq!(
            (s.current_bytes, s.peak_bytes, s.allocations, s.frees),
            (0, 3500, 4, 4)
        );
        // Other kinds untouched.
        assert_eq!(engine.stats().peak_bytes(AllocKind::ClMem), 0);
        check_history(&engine.history()).unwrap();
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn limits_and_misuse_are_typed_errors_and_the_engine_recovers() {
    for gpu in testing::gpus_or_skip("limits_and_misuse_are_typed_errors") {
        let budget = 64 * 1024;
        let engine = Engine::with_memory_budget(gpu.clone(), budget);
        engine.record_history(1 << 16);
        let max = engine.max_buffer_size();
        assert!(max > 0);

        // 1. One buffer over max_buffer_size.
        let e = engine
            .allocate(&desc("huge", max + 1, AllocKind::UsmHost))
            .unwrap_err();
        assert_eq!(
            e,
            AllocError::TooLarge {
                requested_bytes: max + 1,
                max_bytes: max
            }
        );
        let e = engine
            .allocate(&desc("overflow", u64::MAX, AllocKind::UsmDevice))
            .unwrap_err();
        assert!(matches!(e, AllocError::TooLarge { .. }), "{e:?}");
        let ok = engine
            .allocate(&desc("after too large", 256, AllocKind::UsmDevice))
            .unwrap();
        assert_eq!(engine.device_bytes_in_use(), 256);

        // 2. Over the budget (device kinds only); usm_host is not counted against it.
        let big = engine
            .allocate(&desc("most of budget", budget - 512, AllocKind::ClMem))
            .unwrap();
        let e = engine
            .allocate(&desc("over", 1024, AllocKind::UsmDevice))
            .unwrap_err();
        assert_eq!(
            e,
            AllocError::OverBudget {
                requested_bytes: 1024,
                in_use_bytes: budget - 256,
                budget_bytes: budget
            }
        );
        engine
            .allocate(&desc(
                "host is outside the budget",
                4096,
                AllocKind::UsmHost,
            ))
            .unwrap();
        let fits = engine
            .allocate(&desc("exactly fits", 256, AllocKind::UsmDevice))
            .unwrap();
        assert_eq!(engine.device_bytes_in_use(), budget);
        drop((big, fits));
        let again = engine
            .allocate(&desc("after over budget", 1024, AllocKind::UsmDevice))
            .unwrap();
        assert_eq!(engine.device_bytes_in_use(), 256 + 1024);

        // 3. Kind misuse.
        let host = engine
            .allocate(&desc("host", 64, AllocKind::UsmHost))
            .unwrap();
        assert_eq!(
            host.binding().unwrap_err(),
            AllocError::NotBindable {
                kind: AllocKind::UsmHost
            }
        );
        assert!(ok.binding().is_ok());
        let e = pollster::block_on(engine.read_mapped(&ok, 0, 4)).unwrap_err();
        assert_eq!(
            e,
            AllocError::NotMappable {
                kind: AllocKind::UsmDevice,
                access: MapAccess::Read
            }
        );
        let cl = engine.allocate(&desc("cl", 64, AllocKind::ClMem)).unwrap();
        let e = pollster::block_on(engine.write_mapped(&cl, 0, &[0; 4])).unwrap_err();
        assert_eq!(
            e,
            AllocError::NotMappable {
                kind: AllocKind::ClMem,
                access: MapAccess::Write
            }
        );
        let e = pollster::block_on(engine.read_mapped(&host, 0, 4)).unwrap_err();
        assert!(
            matches!(
                e,
                AllocError::NotMappable {
                    kind: AllocKind::UsmHost,
                    ..
                }
            ),
            "{e:?}"
        );

        // 4. Ranges and alignment.
        assert!(matches!(
            engine.write(&ok, 2, &[0; 4]),
            Err(AllocError::Misaligned { .. })
        ));
        assert!(matches!(
            engine.write(&ok, 0, &[0; 3]),
            Err(AllocError::Misaligned { .. })
        ));
        assert!(matches!(
            engine.write(&ok, 256, &[0; 4]),
            Err(AllocError::OutOfBounds { .. })
        ));
        assert!(matches!(
            engine.read_blocking(&ok, 250, 7),
            Err(AllocError::OutOfBounds { .. })
        ));
        assert!(matches!(
            engine.read_blocking(&ok, u64::MAX, 2),
            Err(AllocError::OutOfBounds { .. })
        ));
        let e = engine
            .allocate_init(&desc("small", 4, AllocKind::ClMem), &[1; 8])
            .unwrap_err();
        assert_eq!(
            e,
            AllocError::ContentsTooLarge {
                data_bytes: 8,
                size_bytes: 4
            }
        );

        // 5. A shader error is a Result too.
        let e = gpu.compile_compute(
            "broken",
            "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }",
            "main",
        );
        assert!(e.is_err());

        // After all of that the counters are exactly what is alive, and data still flows.
        let s = engine.stats();
        assert_eq!(engine.device_bytes_in_use(), 256 + 1024 + 64);
        assert_eq!(s.current_bytes(AllocKind::UsmHost), 64);
        engine.write(&again, 0, &[7; 1024]).unwrap();
        assert_eq!(
            engine.read_blocking(&again, 0, 1024).unwrap(),
            vec![7; 1024]
        );
        drop((ok, again, host, cl));
        assert_eq!(engine.stats().total_current_bytes(), 0);
        check_history(&engine.history()).unwrap();
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn preallocation_rule_and_kind_choice_follow_the_reference() {
    for gpu in testing::gpus_or_skip("preallocation_rule_and_kind_choice") {
        let engine = Engine::with_memory_budget(gpu.clone(), 10_000);
        // size <= max buffer size && in_use + size < 90% of budget.
        assert!(engine.can_preallocate(8_996));
        assert!(!engine.can_preallocate(9_000));
        assert!(!engine.can_preallocate(engine.max_buffer_size() + 1));
        let held = engine
            .allocate(&desc("held", 4_000, AllocKind::UsmDevice))
            .unwrap();
        assert!(engine.can_preallocate(4_996));
        assert!(!engine.can_preallocate(5_000));

        let host_kind = if gpu.supports_shared() {
            AllocKind::UsmShared
        } else {
            AllocKind::UsmHost
        };
        let pick = |host_access, kernel_io_bytes| {
            engine.preferred_kind(&KindRequest {
                host_access,
                kernel_access: false,
                kernel_io_bytes,
            })
        };
        assert_eq!(pick(false, 0), AllocKind::UsmDevice);
        assert_eq!(pick(false, 6_000), AllocKind::UsmDevice); // exactly what is left
        assert_eq!(pick(false, 6_001), host_kind); // would not fit: host-reachable memory
        assert_eq!(pick(true, 0), host_kind);
        let bindable_host = if gpu.supports_shared() {
            AllocKind::UsmShared
        } else {
            AllocKind::UsmDevice
        };
        let io = engine.preferred_kind(&KindRequest {
            host_access: true,
            kernel_access: true,
            kernel_io_bytes: 0,
        });
        assert_eq!(io, bindable_host);
        drop(held);
        assert_eq!(pick(false, 6_001), AllocKind::UsmDevice);
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn fill_kernel_writes_preallocated_device_memory() {
    for gpu in testing::gpus_or_skip("fill_kernel_writes_preallocated_device_memory") {
        let engine = Engine::new(gpu.clone());
        let fill = dynrt::gpu::FillPipeline::new(&gpu).unwrap();
        let mut rng = SplitMix64::new(9);
        // Lengths around the workgroup size and one past 65535 workgroups (2-D grid).
        for len in [1u32, 63, 64, 65, 1000, 65_535 * 64 + 7] {
            let bytes = u64::from(len) * 4;
            if bytes > gpu.limits().max_storage_buffer_binding_size {
                continue;
            }
            let out = engine
                .allocate(&desc("fill out", bytes + 8, AllocKind::UsmDevice))
                .unwrap();
            engine.write(&out, bytes, &[0xAB; 8]).unwrap();
            let (scale, bias) = (rng.uniform(-2.0, 2.0), rng.uniform(-10.0, 10.0));
            fill.dispatch(&engine, &out, len, scale, bias).unwrap();
            let got: Vec<f32> =
                bytemuck::pod_collect_to_vec(&engine.read_blocking(&out, 0, bytes).unwrap());
            for (i, v) in got.iter().enumerate() {
                let want = scale * i as f32 + bias;
                assert!(
                    (v - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{} len {len} i {i}: {v} vs {want}",
                    name(&gpu)
                );
            }
            // Bytes past `len` are untouched.
            assert_eq!(engine.read_blocking(&out, bytes, 8).unwrap(), vec![0xAB; 8]);
        }
        let small = engine
            .allocate(&desc("small", 16, AllocKind::UsmDevice))
            .unwrap();
        assert!(matches!(
            fill.dispatch(&engine, &small, 5, 1.0, 0.0),
            Err(AllocError::OutOfBounds { .. })
        ));
        let host = engine
            .allocate(&desc("host", 16, AllocKind::UsmHost))
            .unwrap();
        assert!(matches!(
            fill.dispatch(&engine, &host, 4, 1.0, 0.0),
            Err(AllocError::NotBindable { .. })
        ));
        drop((small, host));
        assert_eq!(engine.stats().total_current_bytes(), 0);
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn usm_shared_maps_the_buffer_itself_where_supported() {
    for gpu in testing::gpus_or_skip("usm_shared_maps_the_buffer_itself") {
        let engine = Engine::new(gpu.clone());
        if !gpu.supports_shared() {
            // GL / web: the documented fallback is "unsupported", never a silent emulation.
            assert_ne!(
                gpu.backend(),
                dynrt::gpu::wgpu::Backend::Vulkan,
                "lavapipe offers MAPPABLE_PRIMARY_BUFFERS"
            );
            let e = engine
                .allocate(&desc("s", 64, AllocKind::UsmShared))
                .unwrap_err();
            assert!(matches!(
                e,
                AllocError::Unsupported {
                    kind: AllocKind::UsmShared,
                    ..
                }
            ));
            continue;
        }
        let s = engine
            .allocate(&desc("shared", 64, AllocKind::UsmShared))
            .unwrap();
        pollster::block_on(engine.write_mapped(&s, 8, &[5; 16])).unwrap();
        let before = engine.stats().kind(AllocKind::UsmHost).allocations;
        let got = pollster::block_on(engine.read_mapped(&s, 8, 16)).unwrap();
        assert_eq!(got, vec![5; 16]);
        // Direct mapping allocates no staging buffer.
        assert_eq!(engine.stats().kind(AllocKind::UsmHost).allocations, before);
        // And the same buffer binds to a kernel.
        let fill = dynrt::gpu::FillPipeline::new(&gpu).unwrap();
        fill.dispatch(&engine, &s, 16, 1.0, 0.0).unwrap();
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&engine.read_blocking(&s, 0, 64).unwrap());
        assert_eq!(got, (0..16).map(|i| i as f32).collect::<Vec<_>>());
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn binding_ranges_and_copies_are_checked() {
    for gpu in testing::gpus_or_skip("binding_ranges_and_copies_are_checked") {
        let engine = Engine::new(gpu.clone());
        let align = u64::from(gpu.limits().min_storage_buffer_offset_alignment);
        let a = engine
            .allocate(&desc("a", 4 * align, AllocKind::UsmDevice))
            .unwrap();
        let r = a.binding_range(align, 16).unwrap();
        assert_eq!((r.offset, r.size.map(|s| s.get())), (align, Some(16)));
        assert!(matches!(
            a.binding_range(4, 16),
            Err(AllocError::Misaligned { .. })
        ));
        assert!(matches!(
            a.binding_range(align, 4 * align),
            Err(AllocError::OutOfBounds { .. })
        ));
        assert!(matches!(
            a.binding_range(0, 0),
            Err(AllocError::OutOfBounds { .. })
        ));
        let host = engine
            .allocate(&desc("host", 64, AllocKind::UsmHost))
            .unwrap();
        assert!(matches!(
            host.binding_range(0, 16),
            Err(AllocError::NotBindable { .. })
        ));
        // A binding range is a view: nothing was allocated for it.
        assert_eq!(engine.stats().kind(AllocKind::UsmDevice).allocations, 1);

        // Copies: within one buffer (non-overlapping), across kinds, and the misuse errors.
        let data: Vec<u8> = (0..64u8).collect();
        engine.write(&a, 0, &data).unwrap();
        assert!(matches!(
            engine.copy(&a, 0, &a, 64, 64),
            Err(AllocError::SameBufferCopy { .. })
        ));
        let cl = engine.allocate(&desc("cl", 64, AllocKind::ClMem)).unwrap();
        engine.copy(&a, 8, &cl, 0, 32).unwrap();
        assert_eq!(engine.read_blocking(&cl, 0, 32).unwrap(), data[8..40]);
        assert!(matches!(
            engine.copy(&a, 2, &cl, 0, 4),
            Err(AllocError::Misaligned { .. })
        ));
        assert!(matches!(
            engine.copy(&a, 0, &cl, 32, 64),
            Err(AllocError::OutOfBounds { .. })
        ));
        assert!(matches!(
            engine.copy(&a, 0, &host, 0, 4),
            Err(AllocError::Unsupported { .. })
        ));
        // usm_host is a fine copy source.
        engine.write(&host, 0, &data).unwrap();
        engine.copy(&host, 0, &cl, 0, 64).unwrap();
        assert_eq!(engine.read_blocking(&cl, 0, 64).unwrap(), data);
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn large_writes_stage_in_chunks_and_async_allocation_works() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
    assert_send_sync::<dynrt::gpu::Buffer>();
    for gpu in testing::gpus_or_skip("large_writes_stage_in_chunks") {
        let engine = Engine::new(gpu.clone());
        engine.record_history(1 << 16);
        let chunk = dynrt::gpu::UPLOAD_CHUNK_BYTES;
        let size = 2 * chunk + 1024;
        let mut rng = SplitMix64::new(5);
        let data = random_bytes(&mut rng, size as usize);
        let buf = engine
            .allocate(&desc("big", size, AllocKind::UsmDevice))
            .unwrap();
        let before = engine.stats().kind(AllocKind::UsmHost);
        engine.write(&buf, 0, &data).unwrap();
        let after = engine.stats().kind(AllocKind::UsmHost);
        assert_eq!(
            after.allocations - before.allocations,
            3,
            "three staging chunks"
        );
        assert_eq!(
            after.peak_bytes, chunk,
            "staging never held more than one chunk"
        );
        assert!(engine.read_blocking(&buf, 0, size).unwrap() == data);
        drop(buf);

        // allocate_async awaits the error scopes (the path the web needs).
        let b = pollster::block_on(engine.allocate_async(&desc("async", 64, AllocKind::ClMem)))
            .unwrap();
        engine.write(&b, 0, &[3; 64]).unwrap();
        assert_eq!(engine.read_blocking(&b, 0, 64).unwrap(), vec![3; 64]);
        let max = engine.max_buffer_size();
        let e = pollster::block_on(engine.allocate_async(&desc(
            "too big",
            max + 1,
            AllocKind::UsmDevice,
        )));
        assert!(matches!(e, Err(AllocError::TooLarge { .. })));
        drop(b);
        assert_eq!(engine.stats().total_current_bytes(), 0);
        check_history(&engine.history()).unwrap();
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn concurrent_allocations_never_exceed_the_budget() {
    for gpu in testing::gpus_or_skip("concurrent_allocations_never_exceed_the_budget") {
        let budget = 40 * 1024;
        let engine = Engine::with_memory_budget(gpu.clone(), budget);
        engine.record_history(1 << 16);
        let over = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (engine, over) = (&engine, &over);
                s.spawn(move || {
                    let mut rng = SplitMix64::new(100 + t);
                    let mut held = Vec::new();
                    for _ in 0..60 {
                        let size = 4 * rng.range(256, 2048);
                        match engine.allocate(&desc("threaded", size, AllocKind::UsmDevice)) {
                            Ok(b) => held.push(b),
                            Err(AllocError::OverBudget { .. }) => {
                                over.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                held.clear();
                            }
                            Err(e) => panic!("unexpected {e}"),
                        }
                        assert!(engine.device_bytes_in_use() <= budget);
                    }
                });
            }
        });
        // Precondition: the budget was actually contended.
        assert!(over.into_inner() > 0);
        let history = engine.history();
        check_history(&history).unwrap();
        assert!(history.iter().all(|e| e.current_bytes <= budget));
        assert_eq!(engine.device_bytes_in_use(), 0);
        assert_no_uncaptured(&gpu);
    }
}

#[test]
fn ten_thousand_allocate_free_pairs_keep_the_history_bounded() {
    for gpu in testing::gpus_or_skip("bounded_history") {
        let engine = Engine::new(gpu.clone());
        // Counters always; no events kept without a recorder.
        for _ in 0..10_000 {
            drop(
                engine
                    .allocate(&desc("pair", 256, AllocKind::UsmDevice))
                    .unwrap(),
            );
        }
        assert!(engine.history().is_empty());
        assert_eq!(engine.history_heap_bytes(), 0);
        let k = engine.stats().kind(AllocKind::UsmDevice);
        assert_eq!(
            (k.allocations, k.frees, k.current_bytes),
            (10_000, 10_000, 0)
        );
        // A bounded recorder keeps the last events and drops the rest.
        engine.record_history(128);
        for _ in 0..10_000 {
            drop(
                engine
                    .allocate(&desc("pair", 256, AllocKind::UsmDevice))
                    .unwrap(),
            );
        }
        let h = engine.history();
        assert_eq!(h.len(), 128);
        assert_eq!(engine.history_dropped(), 20_000 - 128);
        assert!(
            engine.history_heap_bytes() <= 256 * std::mem::size_of::<AllocEvent>(),
            "{} bytes",
            engine.history_heap_bytes()
        );
        check_history_tail(&h);
        assert_no_uncaptured(&gpu);
    }
}

/// The tail of a history: alternating allocate/free of one size, current back to 0 after
/// each free.
fn check_history_tail(h: &[AllocEvent]) {
    for pair in h.chunks(2) {
        assert_eq!(pair[0].op, AllocOp::Allocate);
        assert_eq!(pair[1].op, AllocOp::Free);
        assert_eq!(pair[1].current_bytes, pair[0].current_bytes - 256);
    }
}

#[test]
fn the_adapter_class_decides_mapped_device_memory() {
    use dynrt::gpu::{wgpu, AdapterClass};
    for gpu in testing::gpus_or_skip("the_adapter_class_decides_mapped_device_memory") {
        let info = gpu.adapter_info();
        let class = gpu.adapter_class();
        assert_eq!(class, AdapterClass::of(info));
        let mapped = gpu
            .features()
            .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        match class {
            // lavapipe and llvmpipe are CPU adapters: one memory, the feature where offered
            // (Vulkan), so usm_shared is real there and absent on GL.
            AdapterClass::Unified => {
                assert_eq!(info.device_type, wgpu::DeviceType::Cpu, "{}", name(&gpu));
                assert_eq!(gpu.supports_shared(), mapped, "{}", name(&gpu));
                assert_eq!(
                    mapped,
                    gpu.backend() == wgpu::Backend::Vulkan,
                    "{}",
                    name(&gpu)
                );
            }
            // A discrete GPU never gets the feature from dynrt, nor usm_shared.
            AdapterClass::Discrete => {
                assert!(!mapped, "{}", name(&gpu));
                assert!(!gpu.supports_shared());
            }
        }
        let engine = Engine::new(gpu.clone());
        let io = engine.preferred_kind(&KindRequest {
            host_access: true,
            kernel_access: true,
            kernel_io_bytes: 0,
        });
        let expect = if gpu.supports_shared() {
            AllocKind::UsmShared
        } else {
            AllocKind::UsmDevice
        };
        assert_eq!(io, expect, "{}", name(&gpu));
        assert_eq!(
            gpu.kind_support(AllocKind::UsmShared).supported,
            gpu.supports_shared()
        );
    }
}
