//! `dynrt info --json` on each backend: the chosen adapter, its limits and the kind table.

use dynrt::gpu::testing;
use std::process::Command;

#[test]
fn info_json_reports_adapter_limits_and_kind_table() {
    for gpu in testing::gpus_or_skip("info_json_reports_adapter_limits_and_kind_table") {
        let backend = match gpu.backend() {
            dynrt::gpu::wgpu::Backend::Vulkan => "vulkan",
            dynrt::gpu::wgpu::Backend::Gl => "gl",
            other => panic!("no WGPU_BACKEND name for {other:?} in this test"),
        };
        let out = Command::new(crate::common::dynrt_bin())
            .args(["info", "--json"])
            .env("WGPU_BACKEND", backend)
            .env("DYNRT_MEMORY_BUDGET", "123456789")
            .env_remove("WGPU_ADAPTER_NAME")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{backend}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["chosen"]["name"], gpu.adapter_info().name.as_str());
        assert_eq!(v["chosen"]["backend"], format!("{:?}", gpu.backend()));
        assert!(!v["adapters"].as_array().unwrap().is_empty());
        assert_eq!(v["limits"]["max_buffer_size"], gpu.limits().max_buffer_size);
        assert_eq!(v["memory_budget_bytes"], 123456789u64);
        let kinds = v["kinds"].as_array().unwrap();
        let names: Vec<_> = kinds.iter().map(|k| k["kind"].as_str().unwrap()).collect();
        assert_eq!(names, ["usm_device", "usm_host", "usm_shared", "cl_mem"]);
        assert_eq!(kinds[2]["supported"], gpu.supports_shared());
        assert_eq!(
            v["features"]["mappable_primary_buffers"],
            gpu.supports_shared()
        );
        assert_eq!(kinds[1]["bindable"], false);
        // The software adapters here share the host's memory.
        assert_eq!(v["adapter_class"], gpu.adapter_class().name());
        assert_eq!(v["adapter_class"], "unified");
        assert!(v["io_rule"].as_str().is_some_and(|r| !r.is_empty()));
        assert_eq!(kinds[0]["usages"], "COPY_SRC | COPY_DST | STORAGE");
    }
}

#[test]
fn info_without_a_matching_adapter_fails_with_the_reason() {
    let out = Command::new(crate::common::dynrt_bin())
        .arg("info")
        .env("WGPU_ADAPTER_NAME", "no-such-adapter-xyz")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no adapter name contains `no-such-adapter-xyz`"),
        "{stderr}"
    );
}
