//! dynrt on a device an application created (`Gpu::from_device`): the engine works on it
//! and keeps to the budget the app gives it, a device without what dynrt or the app's
//! workload needs is refused with a typed error naming it, dynrt's error scopes leave the
//! app's handler and scopes alone, and a generation thread shares the device with a render
//! thread. On Vulkan (lavapipe) and GL (llvmpipe); `DYNRT_REQUIRE_GPU=1` turns a missing
//! backend into a failure.

use dynrt::gpu::testing::{app_device_or_skip, require_gpu, TEST_BACKENDS};
use dynrt::gpu::wgpu;
use dynrt::gpu::{
    required_limits, AllocError, BufferDesc, EmbedOptions, Engine, FillPipeline, Gpu, GpuError,
};
use dynrt::memory::AllocKind;
use std::sync::{Arc, Mutex};

const MIB: u64 = 1 << 20;

/// One app device per test backend, with WebGPU's default limits (what egui asks for on
/// Vulkan) and no features.
fn app_devices(test: &str) -> Vec<(wgpu::Device, wgpu::Queue)> {
    TEST_BACKENDS
        .iter()
        .filter_map(|&b| {
            app_device_or_skip(test, b, wgpu::Limits::default(), wgpu::Features::empty())
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(bytes)
}

#[test]
fn engine_on_a_device_the_app_created_runs_kernels() {
    let devices = app_devices("engine_on_a_device_the_app_created_runs_kernels");
    for (device, queue) in &devices {
        let gpu = Gpu::from_device(device, queue, EmbedOptions::new(64 * MIB)).unwrap();
        assert!(gpu.is_shared());
        assert_eq!(gpu.adapter_info().name, device.adapter_info().name);
        assert_eq!(gpu.limits(), &device.limits());
        let engine = Engine::new(gpu.clone());
        assert_eq!(engine.memory_budget_bytes(), 64 * MIB);
        let buf = engine
            .allocate(&BufferDesc {
                label: "ramp",
                size_bytes: 4096 * 4,
                kind: AllocKind::UsmDevice,
            })
            .unwrap();
        FillPipeline::new(&gpu)
            .unwrap()
            .dispatch(&engine, &buf, 4096, 0.5, -3.0)
            .unwrap();
        let got = f32s(&engine.read_blocking(&buf, 0, 4096 * 4).unwrap());
        let want: Vec<f32> = (0..4096).map(|i| 0.5 * i as f32 - 3.0).collect();
        assert_eq!(got, want, "on {:?}", gpu.backend());
        assert_eq!(engine.device_bytes_in_use(), 4096 * 4);
        drop(buf);
        assert_eq!(engine.device_bytes_in_use(), 0);
        assert!(gpu.uncaptured_errors().is_empty());
    }
}

#[test]
fn the_budget_the_app_gives_is_enforced() {
    let devices = app_devices("the_budget_the_app_gives_is_enforced");
    for (device, queue) in &devices {
        let engine = Engine::new(Gpu::from_device(device, queue, EmbedOptions::new(MIB)).unwrap());
        let desc = |size_bytes| BufferDesc {
            label: "share",
            size_bytes,
            kind: AllocKind::UsmDevice,
        };
        let first = engine.allocate(&desc(768 << 10)).unwrap();
        let err = engine.allocate(&desc(512 << 10)).unwrap_err();
        assert_eq!(
            err,
            AllocError::OverBudget {
                requested_bytes: 512 << 10,
                in_use_bytes: 768 << 10,
                budget_bytes: MIB,
            }
        );
        // Nothing was left allocated by the refusal; staging (usm_host) is not the app's
        // device share and does not count.
        assert_eq!(engine.device_bytes_in_use(), 768 << 10);
        engine.write(&first, 0, &[7u8; 768 << 10]).unwrap();
        drop(first);
        let second = engine.allocate(&desc(MIB)).unwrap();
        assert_eq!(engine.device_bytes_in_use(), MIB);
        drop(second);
    }
    if devices.is_empty() && require_gpu() {
        panic!("no device");
    }
}

#[test]
fn a_device_without_what_dynrt_needs_is_refused_by_name() {
    let test = "a_device_without_what_dynrt_needs_is_refused_by_name";
    for &backend in &TEST_BACKENDS {
        // A feature the app's workload asks for (usm_shared buffers) that its device lacks.
        if let Some((device, queue)) = app_device_or_skip(
            test,
            backend,
            wgpu::Limits::default(),
            wgpu::Features::empty(),
        ) {
            let opts = EmbedOptions::new(MIB)
                .with_required_features(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
            match Gpu::from_device(&device, &queue, opts) {
                Err(GpuError::MissingFeatures { adapter, missing }) => {
                    assert_eq!(missing, wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
                    assert_eq!(adapter, device.adapter_info().name);
                }
                other => panic!("{backend:?}: expected MissingFeatures, got {other:?}"),
            }
            let zero = Gpu::from_device(&device, &queue, EmbedOptions::new(0));
            assert!(matches!(zero, Err(GpuError::BadBudget { budget_bytes: 0 })));
        }
        // A device made with WebGL2's limits (what egui requests on GL) has no compute.
        if let Some((device, queue)) = app_device_or_skip(
            test,
            backend,
            wgpu::Limits::downlevel_webgl2_defaults(),
            wgpu::Features::empty(),
        ) {
            let err = Gpu::from_device(&device, &queue, EmbedOptions::new(MIB)).unwrap_err();
            let GpuError::LimitsTooLow { shortfalls, .. } = &err else {
                panic!("{backend:?}: expected LimitsTooLow, got {err:?}");
            };
            let storage = shortfalls
                .iter()
                .find(|s| s.limit == "max_storage_buffers_per_shader_stage")
                .unwrap_or_else(|| panic!("{backend:?}: {err}"));
            assert_eq!((storage.required, storage.available), (8, 0));
            assert!(err
                .to_string()
                .contains("max_compute_invocations_per_workgroup is 0 but dynrt needs 256"));
        }
        // The same adapter with dynrt's limits merged into the app's request is accepted.
        if let Some((device, queue)) = app_device_or_skip(
            test,
            backend,
            wgpu::Limits::downlevel_webgl2_defaults().or_better_values_from(&required_limits()),
            wgpu::Features::empty(),
        ) {
            Gpu::from_device(&device, &queue, EmbedOptions::new(MIB)).unwrap();
        }
    }
}

#[test]
fn errors_reach_the_app_handler_and_dynrt_scopes_stay_its_own() {
    let devices = app_devices("errors_reach_the_app_handler_and_dynrt_scopes_stay_its_own");
    for (device, queue) in &devices {
        // The app's handler, installed before dynrt arrives.
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = seen.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock().unwrap().push(e.to_string());
        }));
        let gpu = Gpu::from_device(device, queue, EmbedOptions::new(MIB)).unwrap();

        // dynrt's failure inside a scope the app has open: dynrt's own inner scope takes
        // it (a typed error), and the app's scope pops empty.
        let app_scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bad = gpu.compile_compute("not wgsl", "fn (", "main");
        assert!(matches!(bad, Err(GpuError::Shader { .. })), "{bad:?}");
        assert!(pollster::block_on(app_scope.pop()).is_none());

        // The app's own mistake outside any scope goes to the app's handler, still
        // installed after dynrt's arrival; dynrt records nothing.
        let _invalid = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("app bug"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE,
            mapped_at_creation: false,
        });
        let got = seen.lock().unwrap().clone();
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains("app bug"), "{got:?}");
        assert!(gpu.uncaptured_errors().is_empty());
    }
}

/// The desktop example's threading: an engine moved to a generation thread works while the
/// app's thread keeps submitting and presenting-like work on the same queue.
#[test]
fn a_generation_thread_shares_the_device_with_the_render_thread() {
    fn assert_send<T: Send + 'static>() {}
    assert_send::<Engine>();
    assert_send::<dynrt::llm::Model>();
    assert_send::<dynrt::llm::Session>();

    let devices = app_devices("a_generation_thread_shares_the_device_with_the_render_thread");
    for (device, queue) in &devices {
        let gpu = Gpu::from_device(device, queue, EmbedOptions::new(64 * MIB)).unwrap();
        let engine = Engine::new(gpu.clone());
        let worker = std::thread::spawn(move || {
            let fill = FillPipeline::new(engine.gpu())?;
            let buf = engine.allocate(&BufferDesc {
                label: "worker",
                size_bytes: 1 << 16,
                kind: AllocKind::UsmDevice,
            })?;
            let mut sums = Vec::new();
            for step in 0..20 {
                fill.dispatch(&engine, &buf, 1 << 14, 1.0, step as f32)
                    .map_err(|e| GpuError::Shader {
                        label: "fill".into(),
                        message: e.to_string(),
                    })?;
                let v = f32s(&engine.read_blocking(&buf, 0, 16).unwrap());
                sums.push(v[3]);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(sums)
        });
        // The render thread: its own buffers, copies and destroys (which take the device
        // lock a blocking poll would hold) on the same queue, meanwhile.
        let src = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("app src"),
            size: 1 << 16,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        for _ in 0..20 {
            let dst = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("app frame"),
                size: 1 << 16,
                usage: wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut enc = device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, 1 << 16);
            queue.submit([enc.finish()]);
            dst.destroy();
            device.poll(wgpu::PollType::Poll).unwrap();
        }
        let sums = worker.join().unwrap().unwrap();
        let want: Vec<f32> = (0..20).map(|s| 3.0 + s as f32).collect();
        assert_eq!(sums, want);
        assert!(gpu.uncaptured_errors().is_empty());
    }
}

/// A forward pass cut into slices (the shared-device default, here one dispatch per slice
/// once the first slice is timed) gives the tokens of the same pass submitted whole.
#[test]
fn sliced_forward_passes_give_the_tokens_of_whole_ones() {
    use dynrt::llm::{GenerateParams, Model, ModelOptions};
    use dynrt::memory::predictor::Policy;
    use dynrt::runtime::RunOptions;
    let test = "sliced_forward_passes_give_the_tokens_of_whole_ones";
    let Some(path) = dynrt::fetch::model_or_skip(test) else {
        return;
    };
    let Some((device, queue)) = app_device_or_skip(
        test,
        wgpu::Backend::Vulkan,
        wgpu::Limits::default(),
        wgpu::Features::empty(),
    ) else {
        return;
    };
    let tokens = |max_slice: Option<std::time::Duration>| {
        let mut options = EmbedOptions::new(1024 * MIB);
        options.max_slice = max_slice;
        let engine = Engine::new(Gpu::from_device(&device, &queue, options).unwrap());
        let model = Model::load(&engine, &path, ModelOptions::default()).unwrap();
        let mut session = model.session(RunOptions::new(Policy::Adaptive));
        let params = GenerateParams {
            max_tokens: 6,
            ..GenerateParams::default()
        };
        let g = session
            .chat_blocking("What is the capital of France?", &params, &mut |_| {})
            .unwrap();
        assert!(engine.gpu().uncaptured_errors().is_empty());
        g.tokens
    };
    let whole = tokens(None);
    assert_eq!(whole.len(), 6);
    assert_eq!(tokens(Some(std::time::Duration::ZERO)), whole);
}
