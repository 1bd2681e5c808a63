//! Sections with exactly known durations (a scripted [`Clock`] the test advances by hand) are
//! served on the embedded Prometheus endpoint and scraped by a real Prometheus. PromQL's
//! `histogram_quantile` over the section histogram must agree with the recorded distribution
//! (to within the bucket it falls in, and exactly with Prometheus' linear interpolation), and
//! `_count` / `_sum` must be exact.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use phasetrace::timing::{Clock, Resolved, Token};
use phasetrace::{Profiler, Section, SectionLevel, Site, Timing};
use support::Prometheus;

const WAIT: Duration = Duration::from_secs(30);

/// A clock whose time is whatever the test says: `mark` returns the shared "now" in
/// nanoseconds, and the test advances it between boundaries.
struct ScriptedClock {
    now: Arc<AtomicU64>,
}

impl Clock for ScriptedClock {
    fn mark(&self) -> Option<Token> {
        Some(Token(self.now.load(Ordering::SeqCst)))
    }

    fn resolve(&self, token: Token) -> Resolved {
        Resolved::At(token.0)
    }

    fn timing(&self) -> phasetrace::Timing {
        phasetrace::Timing::Host
    }
}

/// `(bucket, [(duration in µs, how many)])`: kda_front has 60 sections of 30 µs and 40 of
/// 300 µs; kda_recur 25 of 1.5 ms and 75 of 7 ms. Each of the 100 steps runs one of each.
const STEPS: usize = 100;

fn durations_us(bucket: &str) -> Vec<u64> {
    let runs: &[(u64, usize)] = match bucket {
        "kda_front" => &[(30, 60), (300, 40)],
        "kda_recur" => &[(1_500, 25), (7_000, 75)],
        other => panic!("no script for {other}"),
    };
    runs.iter()
        .flat_map(|&(us, n)| std::iter::repeat_n(us, n))
        .collect()
}

/// Prometheus' `histogram_quantile` on a histogram with the contract's boundaries, computed the
/// way Prometheus does: find the bucket holding rank `q * count` and interpolate linearly.
fn expected_quantile(q: f64, values_s: &[f64]) -> f64 {
    let bounds = phasetrace_names::metric::DURATION_BOUNDARIES;
    let cumulative: Vec<f64> = bounds
        .iter()
        .map(|b| values_s.iter().filter(|v| **v <= *b).count() as f64)
        .collect();
    let total = values_s.len() as f64;
    let rank = q * total;
    let i = cumulative.iter().position(|c| *c >= rank).unwrap();
    let (start, below) = if i == 0 {
        (0.0, 0.0)
    } else {
        (bounds[i - 1], cumulative[i - 1])
    };
    start + (bounds[i] - start) * (rank - below) / (cumulative[i] - below)
}

/// The bucket `(lower, upper]` that holds `v`.
fn bucket_of(v: f64) -> (f64, f64) {
    let bounds = phasetrace_names::metric::DURATION_BOUNDARIES;
    let i = bounds.iter().position(|b| v <= *b).unwrap();
    (if i == 0 { 0.0 } else { bounds[i - 1] }, bounds[i])
}

/// The exact q-quantile of the recorded values (nearest rank).
fn true_quantile(q: f64, values_s: &[f64]) -> f64 {
    let mut v = values_s.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn by_bucket(samples: Vec<(BTreeMap<String, String>, f64)>) -> BTreeMap<String, f64> {
    samples
        .into_iter()
        .map(|(labels, v)| (labels.get("bucket").cloned().unwrap_or_default(), v))
        .collect()
}

#[test]
fn histogram_quantile_count_and_sum_match_the_scripted_durations() {
    support::require_tools!(Prometheus);
    let now = Arc::new(AtomicU64::new(1_000_000_000));
    let profiler = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        // A clock of the host backend that is not `HostClock`: the recorder must ask it for
        // every time rather than read the host clock itself.
        .with_timing(Timing::Host)
        .with_clock(Arc::new(ScriptedClock { now: now.clone() }))
        .with_trace_every(0)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("building the profiler");
    let addr = profiler
        .prometheus_addr()
        .expect("the Prometheus endpoint runs");
    assert_ne!(addr.port(), 0);
    let prometheus = Prometheus::builder()
        .job("phasetrace", &addr.to_string())
        .scrape_interval("1s")
        .start();

    let front = durations_us("kda_front");
    let recur = durations_us("kda_recur");
    assert_eq!((front.len(), recur.len()), (STEPS, STEPS));
    let advance = |us: u64| now.fetch_add(us * 1_000, Ordering::SeqCst);
    let rec = profiler.recorder();
    for i in 0..STEPS {
        let _step = rec.step();
        let layer = (i % 2) as u32;
        {
            let _s = rec.section(Section::KDA_FRONT, layer, Site::ATTN);
            advance(front[i]);
        }
        advance(5);
        {
            let _s = rec.section(Section::KDA_RECUR, layer, Site::ATTN);
            advance(recur[i]);
        }
    }
    drop(rec);
    profiler.flush();
    assert_eq!(profiler.stats().sections, 2 * STEPS as u64);
    assert_eq!(profiler.stats().steps, STEPS as u64);

    // Wait until Prometheus has scraped everything.
    prometheus.wait_for_query(
        "sum by (bucket) (phasetrace_section_duration_seconds_count)",
        |s| s.len() == 2 && s.iter().all(|(_, v)| *v == STEPS as f64),
        WAIT,
    );

    let counts = by_bucket(
        prometheus.query_vector("sum by (bucket) (phasetrace_section_duration_seconds_count)"),
    );
    assert_eq!(
        counts,
        BTreeMap::from([
            ("kda_front".to_string(), STEPS as f64),
            ("kda_recur".to_string(), STEPS as f64)
        ])
    );
    // One histogram series per bucket (no layer); the rank label is the profiler's (0).
    let series = prometheus.query_vector("phasetrace_section_duration_seconds_count");
    assert_eq!(series.len(), 2, "{series:?}");
    for (labels, v) in &series {
        assert_eq!(
            labels.get("rank").map(String::as_str),
            Some("0"),
            "{labels:?}"
        );
        assert_eq!(labels.get("site").map(String::as_str), Some("attn"));
        assert_eq!(labels.get("layer"), None, "{labels:?}");
        assert_eq!(*v, STEPS as f64, "{labels:?}");
    }
    // Two layers: the per-layer calls, one series per (bucket, layer).
    let per_layer = prometheus.query_vector("phasetrace_section_layer_calls_total");
    assert_eq!(per_layer.len(), 4, "{per_layer:?}");
    for (labels, v) in &per_layer {
        assert_eq!(*v, (STEPS / 2) as f64, "{labels:?}");
    }

    let sums = by_bucket(
        prometheus.query_vector("sum by (bucket) (phasetrace_section_duration_seconds_sum)"),
    );
    for (bucket, script) in [("kda_front", &front), ("kda_recur", &recur)] {
        let expected: f64 = script.iter().map(|us| *us as f64 * 1e-6).sum();
        let got = sums[bucket];
        assert!(
            (got - expected).abs() < 1e-12,
            "{bucket}: _sum {got} != {expected}"
        );
    }

    let quantile = |q: f64| {
        by_bucket(prometheus.query_vector(&format!(
            "histogram_quantile({q}, sum by (le, bucket) (phasetrace_section_duration_seconds_bucket))"
        )))
    };
    for q in [0.5, 0.9, 0.99] {
        let got = quantile(q);
        assert_eq!(got.len(), 2, "{got:?}");
        for (bucket, script) in [("kda_front", &front), ("kda_recur", &recur)] {
            let values: Vec<f64> = script.iter().map(|us| *us as f64 * 1e-6).collect();
            let truth = true_quantile(q, &values);
            let (lower, upper) = bucket_of(truth);
            let v = got[bucket];
            assert!(
                v > lower && v <= upper,
                "{bucket} q{q}: Prometheus says {v}, the recorded quantile {truth} lies in ({lower}, {upper}]"
            );
            let interpolated = expected_quantile(q, &values);
            assert!(
                (v - interpolated).abs() <= 1e-9 * interpolated,
                "{bucket} q{q}: Prometheus says {v}, interpolation in the recorded buckets gives {interpolated}"
            );
        }
    }
    // Spot-check the interpolation by hand: 50th of 100 falls in (20 µs, 50 µs] holding 60.
    let median_front = quantile(0.5)["kda_front"];
    assert!((median_front - 45e-6).abs() < 1e-12, "{median_front}");
    // ... and in (5 ms, 10 ms] holding 75 after 25 below: 5 ms + 5 ms * 25/75.
    let median_recur = quantile(0.5)["kda_recur"];
    assert!(
        (median_recur - (5e-3 + 5e-3 / 3.0)).abs() < 1e-12,
        "{median_recur}"
    );

    // Steps: the counter and the step histogram (each step is front + 5 µs + recur).
    assert_eq!(
        prometheus.query_scalar("sum(phasetrace_steps_total)"),
        Some(STEPS as f64)
    );
    let step_sum = prometheus
        .query_scalar("sum(phasetrace_step_duration_seconds_sum)")
        .unwrap();
    let expected: f64 = front
        .iter()
        .zip(&recur)
        .map(|(f, r)| (f + 5 + r) as f64 * 1e-6)
        .sum();
    assert!(
        (step_sum - expected).abs() < 1e-12,
        "{step_sum} != {expected}"
    );

    profiler.shutdown();
}
