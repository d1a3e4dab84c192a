//! What a decode run reports: the per-step memory trace, the summary object printed by
//! `dynrt demo --json`, and the SVG picture of bytes in use per kind over the steps.
//!
//! Device-free: the runtime fills a [`MemoryTrace`]; this module only formats it, so the
//! picture and the JSON are unit-tested without a GPU.

use crate::memory::accounting::{MemoryStats, COUNTED_REGIONS};
use crate::memory::AllocKind;
use std::fmt::Write as _;

/// Bytes in use per allocation kind, indexed by [`AllocKind::index`].
pub type BytesPerKind = [u64; 4];

/// Bytes per device region, indexed like [`COUNTED_REGIONS`] (constants, placeholders,
/// internal).
pub type BytesPerRegion = [u64; 3];

/// One sample of the memory trace: taken after a step's work was submitted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TraceSample {
    /// Step number (0 is the prefill).
    pub step: u32,
    /// Bytes in use per kind after the step, as the engine counts them.
    pub bytes_in_use: BytesPerKind,
    /// Bytes per device region after the step.
    pub region_bytes: BytesPerRegion,
    /// Real allocations made during the step (reallocations of node outputs, KV growth,
    /// internal buffers; the first step also counts the network's build-time allocations).
    pub reallocations: u32,
}

/// The per-step memory trace of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryTrace {
    /// Samples in step order.
    pub samples: Vec<TraceSample>,
}

/// Peak bytes per kind, serialised with the reference kind names as keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeakBytes {
    /// Peak bytes of `usm_device`.
    pub usm_device: u64,
    /// Peak bytes of `usm_host`.
    pub usm_host: u64,
    /// Peak bytes of `usm_shared`.
    pub usm_shared: u64,
    /// Peak bytes of `cl_mem`.
    pub cl_mem: u64,
}

impl PeakBytes {
    /// From an array indexed by [`AllocKind::index`].
    pub fn from_array(a: BytesPerKind) -> Self {
        PeakBytes {
            usm_device: a[AllocKind::UsmDevice.index()],
            usm_host: a[AllocKind::UsmHost.index()],
            usm_shared: a[AllocKind::UsmShared.index()],
            cl_mem: a[AllocKind::ClMem.index()],
        }
    }
}

/// Pipeline cache counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheCounts {
    /// Lookups that found a compiled pipeline.
    pub hits: u64,
    /// Lookups that had to build one.
    pub misses: u64,
}

/// What the requests' sizer decided over a run: replaying the run's shape trace
/// (`dynrt demo --trace-out`) with `dynrt-bench predict` gives the same numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SizingCounts {
    /// Sizing decisions (trace rows).
    pub rows: u64,
    /// Decisions that (re)allocated a buffer, first allocations included.
    pub reallocations: u64,
    /// Of those, reclaims (shrinks).
    pub reclaims: u64,
    /// Largest sum of the sized buffers, bytes.
    pub peak_reserved_bytes: u64,
    /// Largest sum of what their shapes needed, bytes.
    pub peak_needed_bytes: u64,
}

/// One device region in the report: what it holds at the end of the run and its peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionCounts {
    /// Bytes held at the end of the run.
    pub bytes: u64,
    /// Buffers (or ranges of a shared buffer) held at the end of the run.
    pub buffers: u64,
    /// Largest bytes held at once.
    pub peak_bytes: u64,
}

/// The device regions (docs/design.md) as the runtime used them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionReport {
    /// Weights and other constants: once per loaded network, read-only.
    pub constants: RegionCounts,
    /// Network inputs and outputs (pooled per network) and the KV-cache in-outs.
    pub placeholders: RegionCounts,
    /// Activations (the planner's arena and the pool), host values, uniform slots.
    pub internal: RegionCounts,
}

impl RegionReport {
    /// From the engine's counters.
    pub fn from_stats(stats: &MemoryStats) -> Self {
        let c = |i: usize| RegionCounts {
            bytes: stats.regions[i].current_bytes,
            buffers: stats.regions[i].buffers,
            peak_bytes: stats.regions[i].peak_bytes,
        };
        RegionReport {
            constants: c(0),
            placeholders: c(1),
            internal: c(2),
        }
    }
}

/// The object `dynrt demo --json` prints (field names and order are the issue's contract).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DemoSummary {
    /// Adapter name.
    pub adapter: String,
    /// Backend name (`vulkan`, `gl`, `browser_webgpu`, ...).
    pub backend: String,
    /// Preallocation policy (`none`, `reference`, `adaptive`).
    pub policy: String,
    /// Decode steps run (the prefill not counted).
    pub steps: u32,
    /// Generated token ids, one per decode step.
    pub tokens: Vec<u32>,
    /// Largest absolute difference between GPU and CPU-reference logits over checked steps.
    pub max_abs_err: f32,
    /// Real allocations over the run (engine count, build time included).
    pub allocations: u64,
    /// Allocations made after the first step because a buffer was too small.
    pub reallocations: u64,
    /// Sum of the sizes of every real allocation, bytes.
    pub bytes_allocated_total: u64,
    /// Peak bytes in use per kind.
    pub peak_bytes: PeakBytes,
    /// Pipeline cache counters.
    pub pipeline_cache: CacheCounts,
    /// Node shape updates skipped because no input shape changed.
    pub shape_updates_skipped: u64,
    /// Wall-clock milliseconds per decode step (host and device, readback included; the CPU
    /// check excluded).
    pub ms_per_step: f64,
    /// The sizer's decisions over the run.
    pub sizing: SizingCounts,
    /// Bytes, buffers and peak per device region.
    pub regions: RegionReport,
}

/// Colours of the four kinds in the picture (same order as [`AllocKind::ALL`]).
const KIND_COLOURS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"];
/// Colours of the regions (dashed), same order as [`COUNTED_REGIONS`].
const REGION_COLOURS: [&str; 3] = ["#555555", "#8c564b", "#17becf"];

/// Draws bytes in use per kind over the steps, one polyline per kind that was ever used,
/// with a red tick at every step that reallocated (its count above it). `title` is printed
/// at the top (escaped).
pub fn render_svg(trace: &MemoryTrace, title: &str) -> String {
    let (w, h) = (900.0f64, 420.0f64);
    let (left, right, top, bottom) = (90.0f64, 140.0f64, 40.0f64, 50.0f64);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let n = trace.samples.len();
    let max_step = trace.samples.last().map(|s| s.step).unwrap_or(0).max(1) as f64;
    let max_bytes = trace
        .samples
        .iter()
        .flat_map(|s| s.bytes_in_use.iter().chain(s.region_bytes.iter()).copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let x = |step: u32| left + plot_w * step as f64 / max_step;
    let y = |bytes: u64| top + plot_h * (1.0 - bytes as f64 / max_bytes);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="15">{}</text>"#,
        escape(title)
    );
    // Axes and a few gridlines with byte labels.
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        top + plot_h,
        top + plot_h,
        left + plot_w,
        top + plot_h
    );
    for i in 0..=4u32 {
        let bytes = (max_bytes * i as f64 / 4.0) as u64;
        let yy = y(bytes);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + plot_w,
            left - 6.0,
            yy + 4.0,
            human_bytes(bytes)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">step (0 = prefill)</text><text x="{left}" y="{:.1}" text-anchor="middle">0</text><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + plot_w / 2.0,
        h - 12.0,
        top + plot_h + 16.0,
        left + plot_w,
        top + plot_h + 16.0,
        max_step as u64
    );
    // Reallocation marks first, so the lines draw over them.
    for sample in trace.samples.iter().filter(|s| s.reallocations > 0) {
        let xx = x(sample.step);
        let _ = writeln!(
            s,
            r#"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="red" stroke-opacity="0.35"><title>step {}: {} reallocation(s)</title></line>"#,
            top + plot_h,
            sample.step,
            sample.reallocations
        );
    }
    // One `x,y` point per sample of the series `value`.
    let points_of = |value: &dyn Fn(&TraceSample) -> u64| {
        let mut points = String::new();
        for sample in &trace.samples {
            let _ = write!(points, "{:.1},{:.1} ", x(sample.step), y(value(sample)));
        }
        points
    };
    let mut legend_y = top + 10.0;
    for kind in AllocKind::ALL {
        let k = kind.index();
        if trace.samples.iter().all(|s| s.bytes_in_use[k] == 0) {
            continue;
        }
        let points = points_of(&|s: &TraceSample| s.bytes_in_use[k]);
        let colour = KIND_COLOURS[k];
        // A single sample still shows as a dot.
        if n == 1 {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"#,
                x(trace.samples[0].step),
                y(trace.samples[0].bytes_in_use[k])
            );
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.trim_end()
        );
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{colour}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + plot_w + 12.0,
            legend_y,
            left + plot_w + 30.0,
            legend_y + 10.0,
            kind.name()
        );
        legend_y += 20.0;
    }
    // Regions: dashed, in colours of their own.
    for (i, region) in COUNTED_REGIONS.iter().enumerate() {
        if trace.samples.iter().all(|s| s.region_bytes[i] == 0) {
            continue;
        }
        let points = points_of(&|s: &TraceSample| s.region_bytes[i]);
        let colour = REGION_COLOURS[i];
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="6,4" points="{}"/>"#,
            points.trim_end()
        );
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2" stroke-dasharray="4,2"/><text x="{:.1}" y="{:.1}">region {}</text>"#,
            left + plot_w + 12.0,
            legend_y + 6.0,
            left + plot_w + 24.0,
            legend_y + 6.0,
            left + plot_w + 30.0,
            legend_y + 10.0,
            region.name()
        );
        legend_y += 20.0;
    }
    let reallocs: u32 = trace.samples.iter().map(|s| s.reallocations).sum();
    let _ = writeln!(
        s,
        r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="red" stroke-opacity="0.5"/><text x="{:.1}" y="{:.1}">step with real allocations ({reallocs} incl. prefill)</text>"#,
        left + plot_w + 18.0,
        legend_y,
        left + plot_w + 18.0,
        legend_y + 12.0,
        left + plot_w + 30.0,
        legend_y + 10.0
    );
    s.push_str("</svg>\n");
    s
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> MemoryTrace {
        MemoryTrace {
            samples: (0..20)
                .map(|i| TraceSample {
                    step: i,
                    bytes_in_use: [1000 + 100 * i as u64, 0, 64, 0],
                    region_bytes: [500, 64, 500 + 100 * i as u64],
                    reallocations: u32::from(i % 10 == 0),
                })
                .collect(),
        }
    }

    #[test]
    fn svg_has_one_line_per_used_kind_and_one_mark_per_reallocating_step() {
        let svg = render_svg(&trace(), "a <b> run");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<polyline").count() - svg.matches("stroke-dasharray=\"6,4\"").count(),
            2,
            "kinds: usm_device and usm_shared only"
        );
        assert_eq!(svg.matches("reallocation(s)").count(), 2, "steps 0 and 10");
        assert_eq!(
            svg.matches("stroke-dasharray=\"6,4\"").count(),
            3,
            "three regions"
        );
        assert!(svg.contains(">region constants<") && svg.contains(">region internal<"));
        assert!(svg.contains("a &lt;b&gt; run"));
        assert!(svg.contains(">usm_device<") && !svg.contains(">usm_host<"));
    }

    #[test]
    fn svg_of_an_empty_trace_is_still_a_picture() {
        let svg = render_svg(&MemoryTrace::default(), "empty");
        assert!(svg.contains("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 0);
    }

    #[test]
    fn summary_serialises_with_the_contract_field_order() {
        let s = DemoSummary {
            adapter: "a".into(),
            backend: "vulkan".into(),
            policy: "adaptive".into(),
            steps: 2,
            tokens: vec![1, 2],
            max_abs_err: 0.5,
            allocations: 3,
            reallocations: 1,
            bytes_allocated_total: 10,
            peak_bytes: PeakBytes::from_array([1, 2, 3, 4]),
            pipeline_cache: CacheCounts { hits: 5, misses: 6 },
            shape_updates_skipped: 7,
            ms_per_step: 1.25,
            sizing: SizingCounts {
                rows: 8,
                reallocations: 9,
                reclaims: 1,
                peak_reserved_bytes: 10,
                peak_needed_bytes: 11,
            },
            regions: RegionReport {
                constants: RegionCounts {
                    bytes: 12,
                    buffers: 1,
                    peak_bytes: 12,
                },
                ..RegionReport::default()
            },
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"adapter":"a","backend":"vulkan","policy":"adaptive","steps":2,"tokens":[1,2],"max_abs_err":0.5,"allocations":3,"reallocations":1,"bytes_allocated_total":10,"peak_bytes":{"usm_device":1,"usm_host":2,"usm_shared":3,"cl_mem":4},"pipeline_cache":{"hits":5,"misses":6},"shape_updates_skipped":7,"ms_per_step":1.25,"sizing":{"rows":8,"reallocations":9,"reclaims":1,"peak_reserved_bytes":10,"peak_needed_bytes":11},"regions":{"constants":{"bytes":12,"buffers":1,"peak_bytes":12},"placeholders":{"bytes":0,"buffers":0,"peak_bytes":0},"internal":{"bytes":0,"buffers":0,"peak_bytes":0}}}"#
        );
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12), "12 B");
    }
}
