//! A picture of a plan: time on x, address on y (0 at the bottom), one rectangle per buffer,
//! with the lower bound and the capacity drawn as horizontal lines.
//!
//! Large plans (tens of thousands of buffers) would give SVGs of many megabytes that browsers
//! struggle with, so above [`SvgOptions::max_rects`] buffers the picture is rasterised onto a
//! grid of cells and each row's occupied runs become one rectangle: the size stays bounded
//! and the shape stays readable.

use super::PlanBuffer;
use std::fmt::Write;

/// Options of [`to_svg`].
#[derive(Debug, Clone)]
pub struct SvgOptions {
    /// Title printed at the top.
    pub title: String,
    /// Lower bound line (bytes), if any.
    pub lower_bound: Option<u64>,
    /// Capacity line (bytes), if any.
    pub capacity: Option<u64>,
    /// Above this many buffers the picture is rasterised.
    pub max_rects: usize,
}

impl Default for SvgOptions {
    fn default() -> Self {
        SvgOptions {
            title: String::new(),
            lower_bound: None,
            capacity: None,
            max_rects: 5000,
        }
    }
}

const W: f64 = 1000.0;
const H: f64 = 600.0;
const MARGIN_L: f64 = 90.0;
const MARGIN_T: f64 = 40.0;
const MARGIN_B: f64 = 40.0;
const MARGIN_R: f64 = 20.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Draws `buffers` at `offsets` (same length; extra entries on either side are ignored).
pub fn to_svg(buffers: &[PlanBuffer], offsets: &[u64], opts: &SvgOptions) -> String {
    let n = buffers.len().min(offsets.len());
    let t0 = buffers.iter().map(|b| b.lower).min().unwrap_or(0);
    let t1 = buffers
        .iter()
        .map(|b| b.upper)
        .max()
        .unwrap_or(1)
        .max(t0 + 1);
    let height = (0..n)
        .map(|i| offsets[i].saturating_add(buffers[i].size_bytes))
        .max()
        .unwrap_or(0);
    let ymax = height
        .max(opts.capacity.unwrap_or(0))
        .max(opts.lower_bound.unwrap_or(0))
        .max(1) as f64;
    let (pw, ph) = (W - MARGIN_L - MARGIN_R, H - MARGIN_T - MARGIN_B);
    let x = |t: u64| MARGIN_L + (t - t0) as f64 / (t1 - t0) as f64 * pw;
    let y = |a: u64| MARGIN_T + ph - a as f64 / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{MARGIN_L}" y="20" font-size="14">{} ({} buffers, height {})</text>"#,
        escape(&opts.title),
        n,
        height
    );
    if n <= opts.max_rects {
        for i in 0..n {
            let b = &buffers[i];
            if b.size_bytes == 0 {
                continue;
            }
            let (x0, x1) = (x(b.lower), x(b.upper));
            let (ya, yb) = (y(offsets[i] + b.size_bytes), y(offsets[i]));
            // A stable colour per buffer so neighbours are told apart.
            let hue = (i as u64).wrapping_mul(137) % 360;
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.2}" y="{ya:.2}" width="{:.2}" height="{:.2}" fill="hsl({hue},60%,65%)" stroke="black" stroke-width="0.3"><title>{} [{}, {}) size {} offset {}</title></rect>"#,
                (x1 - x0).max(0.3),
                (yb - ya).max(0.3),
                escape(&b.id),
                b.lower,
                b.upper,
                b.size_bytes,
                offsets[i]
            );
        }
    } else {
        let (cols, rows) = (pw as usize, ph as usize / 2);
        let mut grid = vec![false; cols * rows];
        for i in 0..n {
            let b = &buffers[i];
            if b.size_bytes == 0 {
                continue;
            }
            // Float rounding may land on the last edge: keep the start inside the grid.
            let c0 =
                (((b.lower - t0) as f64 / (t1 - t0) as f64 * cols as f64) as usize).min(cols - 1);
            let c1 = (((b.upper - t0) as f64 / (t1 - t0) as f64 * cols as f64).ceil() as usize)
                .clamp(c0 + 1, cols);
            let r0 = ((offsets[i] as f64 / ymax * rows as f64) as usize).min(rows - 1);
            let r1 = (((offsets[i] + b.size_bytes) as f64 / ymax * rows as f64).ceil() as usize)
                .clamp(r0 + 1, rows);
            for r in r0..r1 {
                grid[r * cols + c0..r * cols + c1]
                    .iter_mut()
                    .for_each(|g| *g = true);
            }
        }
        let (cw, rh) = (pw / cols as f64, ph / rows as f64);
        for r in 0..rows {
            let mut c = 0;
            while c < cols {
                if !grid[r * cols + c] {
                    c += 1;
                    continue;
                }
                let start = c;
                while c < cols && grid[r * cols + c] {
                    c += 1;
                }
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="steelblue"/>"#,
                    MARGIN_L + start as f64 * cw,
                    MARGIN_T + ph - (r + 1) as f64 * rh,
                    (c - start) as f64 * cw,
                    rh
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<text x="{MARGIN_L}" y="{}" fill="gray">{} buffers: occupancy drawn on a {}x{} grid</text>"#,
            H - 5.0,
            n,
            cols,
            rows
        );
    }
    // Axes.
    let _ = writeln!(
        s,
        r#"<line x1="{MARGIN_L}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        MARGIN_T + ph,
        MARGIN_L + pw,
        MARGIN_T + ph
    );
    let _ = writeln!(
        s,
        r#"<line x1="{MARGIN_L}" y1="{MARGIN_T}" x2="{MARGIN_L}" y2="{}" stroke="black"/>"#,
        MARGIN_T + ph
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">time {}..{}</text>"#,
        MARGIN_L + pw / 2.0,
        H - 20.0,
        t0,
        t1
    );
    let _ = writeln!(s, r#"<text x="5" y="{}">0</text>"#, MARGIN_T + ph);
    let mut line = |value: u64, label: &str, colour: &str| {
        let yy = y(value);
        let _ = writeln!(
            s,
            r#"<line x1="{MARGIN_L}" y1="{yy:.2}" x2="{}" y2="{yy:.2}" stroke="{colour}" stroke-dasharray="6,3" stroke-width="1.5"/>"#,
            MARGIN_L + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="5" y="{:.2}" fill="{colour}">{label}</text>"#,
            yy + 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="5" y="{:.2}" fill="{colour}" font-size="10">{value}</text>"#,
            yy + 16.0
        );
    };
    if let Some(lb) = opts.lower_bound {
        line(lb, "lower bound", "green");
    }
    if let Some(cap) = opts.capacity {
        line(cap, "capacity", "red");
    }
    line(height, "height", "black");
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_one_rect_per_buffer_and_the_lines() {
        let b = vec![
            PlanBuffer {
                id: "a<1>".into(),
                lower: 0,
                upper: 2,
                size_bytes: 4,
                align_bytes: 1,
            },
            PlanBuffer {
                id: "b".into(),
                lower: 1,
                upper: 3,
                size_bytes: 4,
                align_bytes: 1,
            },
        ];
        let svg = to_svg(
            &b,
            &[0, 4],
            &SvgOptions {
                lower_bound: Some(8),
                capacity: Some(10),
                ..SvgOptions::default()
            },
        );
        assert_eq!(svg.matches("<title>").count(), 2);
        assert!(
            svg.contains("a&lt;1&gt;") && svg.contains("capacity") && svg.contains("lower bound")
        );
        let raster = to_svg(
            &b,
            &[0, 4],
            &SvgOptions {
                max_rects: 1,
                ..SvgOptions::default()
            },
        );
        assert!(raster.contains("grid") && !raster.contains("<title>"));
    }
}
