//! Server-side measurements (latency histograms, token counters) and the
//! Prometheus text exposition that also carries the engine's counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A cumulative histogram with fixed upper bounds (seconds).
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// Buckets for time to first token (prefill can take seconds on a CPU).
pub const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets for the time between two generated tokens.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Buckets for whole-request durations.
pub const DURATION_BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Generated tokens per second over a sliding window of one-second buckets.
#[derive(Debug)]
struct Rate {
    start: Instant,
    buckets: [(u64, u64); 10],
}

impl Rate {
    fn add(&mut self, now: Instant, n: u64) {
        let sec = now.duration_since(self.start).as_secs();
        let slot = &mut self.buckets[(sec % 10) as usize];
        if slot.0 != sec {
            *slot = (sec, 0);
        }
        slot.1 += n;
    }

    /// Tokens per second over the last 10 complete seconds.
    fn per_second(&self, now: Instant) -> f64 {
        let sec = now.duration_since(self.start).as_secs();
        let total: u64 = self
            .buckets
            .iter()
            .filter(|(s, _)| *s < sec && sec - *s <= 10)
            .map(|(_, n)| n)
            .sum();
        total as f64 / 10.0
    }
}

#[derive(Debug)]
struct Inner {
    ttft: Histogram,
    itl: Histogram,
    duration: Histogram,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
    finished: BTreeMap<String, u64>,
    http: BTreeMap<(String, u16), u64>,
    rate: Rate,
}

/// Everything the server measures itself. Cheap to update from handlers.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Metrics {
            inner: Mutex::new(Inner {
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                duration: Histogram::new(DURATION_BUCKETS),
                prompt_tokens: 0,
                cached_tokens: 0,
                completion_tokens: 0,
                finished: BTreeMap::new(),
                http: BTreeMap::new(),
                rate: Rate {
                    start: Instant::now(),
                    buckets: [(u64::MAX, 0); 10],
                },
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A first token arrived `d` after the request was received.
    pub fn first_token(&self, d: Duration) {
        tracing::info!(ttft_secs = d.as_secs_f64(), "first token");
        let mut m = self.lock();
        m.ttft.observe(d.as_secs_f64());
        m.rate.add(Instant::now(), 1);
    }

    /// A later token arrived `d` after the previous one.
    pub fn next_token(&self, d: Duration) {
        let mut m = self.lock();
        m.itl.observe(d.as_secs_f64());
        m.rate.add(Instant::now(), 1);
    }

    /// A request ended.
    pub fn finished(
        &self,
        reason: &str,
        prompt: usize,
        cached: usize,
        completion: usize,
        d: Duration,
    ) {
        tracing::info!(
            reason,
            prompt,
            cached,
            completion,
            secs = d.as_secs_f64(),
            "generation finished"
        );
        let mut m = self.lock();
        m.prompt_tokens += prompt as u64;
        m.cached_tokens += cached as u64;
        m.completion_tokens += completion as u64;
        *m.finished.entry(reason.to_string()).or_default() += 1;
        m.duration.observe(d.as_secs_f64());
    }

    /// An HTTP answer was sent for `route` with `status`.
    pub fn http(&self, route: &str, status: u16) {
        *self
            .lock()
            .http
            .entry((route.to_string(), status))
            .or_default() += 1;
    }

    /// Generated tokens per second over the last 10 seconds.
    pub fn tokens_per_second(&self) -> f64 {
        self.lock().rate.per_second(Instant::now())
    }

    /// Time-to-first-token observations so far.
    pub fn ttft_count(&self) -> u64 {
        self.lock().ttft.count()
    }

    /// The server's own metrics in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let m = self.lock();
        m.ttft.write(
            out,
            "tempo9_time_to_first_token_seconds",
            "Time from request arrival to the first generated token.",
        );
        m.itl.write(
            out,
            "tempo9_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
        );
        m.duration.write(
            out,
            "tempo9_request_duration_seconds",
            "Time from request arrival to its last token.",
        );
        counter(
            out,
            "tempo9_prompt_tokens_total",
            "Prompt tokens of finished requests.",
            m.prompt_tokens,
        );
        counter(
            out,
            "tempo9_cached_prompt_tokens_total",
            "Prompt tokens of finished requests served from the prefix cache.",
            m.cached_tokens,
        );
        counter(
            out,
            "tempo9_completion_tokens_total",
            "Generated tokens of finished requests.",
            m.completion_tokens,
        );
        let _ = writeln!(
            out,
            "# HELP tempo9_requests_finished_total Finished generation requests by reason.\n# TYPE tempo9_requests_finished_total counter"
        );
        for (r, n) in &m.finished {
            let _ = writeln!(out, "tempo9_requests_finished_total{{reason=\"{r}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP tempo9_http_requests_total HTTP answers by route and status.\n# TYPE tempo9_http_requests_total counter"
        );
        for ((route, code), n) in &m.http {
            let _ = writeln!(
                out,
                "tempo9_http_requests_total{{route=\"{route}\",code=\"{code}\"}} {n}"
            );
        }
        gauge(
            out,
            "tempo9_generation_tokens_per_second",
            "Generated tokens per second over the last 10 seconds.",
            m.rate.per_second(Instant::now()),
        );
    }
}

/// Writes one counter.
pub fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

/// Writes one counter with a fractional value (e.g. seconds).
pub fn counter_f64(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

/// Writes one gauge.
pub fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut s = String::new();
        h.write(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.1\"} 1\n"));
        assert!(s.contains("x_bucket{le=\"1\"} 2\n"));
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3\n"));
        assert!(s.contains("x_count 3\n"));
        assert!(s.contains("x_sum 5.55\n"));
    }

    #[test]
    fn counters_accumulate() {
        let m = Metrics::new();
        m.first_token(Duration::from_millis(30));
        m.next_token(Duration::from_millis(5));
        m.finished("stop", 100, 64, 2, Duration::from_millis(40));
        m.http("/v1/chat/completions", 200);
        let mut s = String::new();
        m.render(&mut s);
        assert!(s.contains("tempo9_prompt_tokens_total 100\n"));
        assert!(s.contains("tempo9_cached_prompt_tokens_total 64\n"));
        assert!(s.contains("tempo9_requests_finished_total{reason=\"stop\"} 1\n"));
        assert!(s.contains(
            "tempo9_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 1\n"
        ));
        assert!(s.contains("tempo9_time_to_first_token_seconds_count 1\n"));
        assert_eq!(m.ttft_count(), 1);
    }
}
