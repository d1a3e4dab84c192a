//! `dynrt serve`'s latency histograms and answer counts, in Prometheus' text format (beside
//! the scheduler's gauges and the time-to-first-token histogram of `serve_api`).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Upper bounds of the histograms of request-scale times (queue, whole request), seconds.
const REQUEST_BOUNDS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Upper bounds of the inter-token latency histogram, seconds.
const TOKEN_BOUNDS: [f64; 12] = [
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];

/// A Prometheus histogram over fixed bounds.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    /// Observations at most each bound (cumulative, as Prometheus writes them).
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        for (c, &b) in self.counts.iter_mut().zip(self.bounds) {
            if seconds <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            out.push_str(&format!("{name}_bucket{{le=\"{b}\"}} {c}\n"));
        }
        out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {}\n", self.count));
        out.push_str(&format!(
            "{name}_sum {:.6}\n{name}_count {}\n",
            self.sum, self.count
        ));
    }
}

#[derive(Debug)]
struct Inner {
    inter_token: Histogram,
    queue: Histogram,
    request: Histogram,
    /// Answers by HTTP status.
    responses: BTreeMap<u16, u64>,
}

/// The server's own measurements (shared by every handler).
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            inner: Mutex::new(Inner {
                inter_token: Histogram::new(&TOKEN_BOUNDS),
                queue: Histogram::new(&REQUEST_BOUNDS),
                request: Histogram::new(&REQUEST_BOUNDS),
                responses: BTreeMap::new(),
            }),
        }
    }
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Seconds between two tokens of one request.
    pub fn inter_token(&self, seconds: f64) {
        self.with(|m| m.inter_token.observe(seconds));
    }

    /// Seconds from a request's arrival to its start (tokenizing and the queue).
    pub fn queued(&self, seconds: f64) {
        self.with(|m| m.queue.observe(seconds));
    }

    /// Seconds from a generation request's arrival to its end, whatever the end.
    pub fn request(&self, seconds: f64) {
        self.with(|m| m.request.observe(seconds));
    }

    /// An answer with `status` (counted when its head is sent).
    pub fn response(&self, status: u16) {
        self.with(|m| *m.responses.entry(status).or_default() += 1);
    }

    /// The Prometheus text of these measurements.
    pub fn text(&self) -> String {
        let m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        m.inter_token.write(
            &mut out,
            "dynrt_inter_token_latency_seconds",
            "Seconds between two consecutive tokens of a request.",
        );
        m.queue.write(
            &mut out,
            "dynrt_queue_time_seconds",
            "Seconds from a request's arrival to its start (tokenizing and the queue).",
        );
        m.request.write(
            &mut out,
            "dynrt_request_duration_seconds",
            "Seconds from a generation request's arrival to its end (end to end).",
        );
        out.push_str(
            "# HELP dynrt_http_responses_total HTTP answers by status.\n\
             # TYPE dynrt_http_responses_total counter\n",
        );
        for (status, n) in &m.responses {
            out.push_str(&format!(
                "dynrt_http_responses_total{{status=\"{status}\"}} {n}\n"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_count_every_observation() {
        let m = Metrics::default();
        m.inter_token(0.004);
        m.inter_token(0.03);
        m.inter_token(100.0);
        m.response(200);
        m.response(429);
        m.response(200);
        let t = m.text();
        assert!(
            t.contains("dynrt_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("dynrt_inter_token_latency_seconds_bucket{le=\"0.05\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("dynrt_inter_token_latency_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("dynrt_inter_token_latency_seconds_count 3\n"),
            "{t}"
        );
        assert!(t.contains("dynrt_queue_time_seconds_count 0\n"), "{t}");
        assert!(
            t.contains("dynrt_http_responses_total{status=\"200\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("dynrt_http_responses_total{status=\"429\"} 1\n"),
            "{t}"
        );
    }
}
