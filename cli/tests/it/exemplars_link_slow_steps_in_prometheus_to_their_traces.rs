//! Exemplars end to end: a real Prometheus with exemplar storage scrapes the demo (a periodic
//! straggler, tail tracing at its default `p99`), `/api/v1/query_exemplars` returns exemplars for
//! the step-duration histogram, and each trace id it returns reached a real collector (rotel)
//! in the same run as the slow step's trace: the `decode.step` span the exemplar names, with
//! its duration, its rank, and its layers and sections.

use crate::cli;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use phasetrace_names::{attr, span};
use phasetrace_testkit::{Prometheus, Rotel, free_port, poll, url_encode};

const WAIT: Duration = Duration::from_secs(60);
const LAYERS: usize = 4;

/// (series labels, exemplar labels, value) of every exemplar of `query`.
type Found = Vec<(serde_json::Value, serde_json::Value, f64)>;

fn exemplars(prometheus: &Prometheus, query: &str) -> Found {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let path = format!(
        "/api/v1/query_exemplars?query={}&start={}&end={}",
        url_encode(query),
        now - 600.0,
        now + 60.0
    );
    let Ok(v) = prometheus.get_json(&path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for series in v["data"].as_array().cloned().unwrap_or_default() {
        for e in series["exemplars"].as_array().cloned().unwrap_or_default() {
            let value = e["value"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(f64::NAN);
            out.push((series["seriesLabels"].clone(), e["labels"].clone(), value));
        }
    }
    out
}

#[test]
fn exemplars_of_the_step_histogram_name_traces_the_collector_received() {
    crate::support::require_tools!(Prometheus);
    let rotel = Rotel::start();
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let prometheus = Prometheus::builder()
        .job("demo", &target)
        .scrape_interval("1s")
        .arg("--enable-feature=exemplar-storage")
        .start();
    let endpoint = rotel.grpc_endpoint();
    let mut demo = cli::Demo::spawn(
        &[
            // No requests: only slow and one-in-N steps are traced.
            "--request-rate",
            "0",
            "--duration",
            "20",
            "--ranks",
            "2",
            "--layers",
            &LAYERS.to_string(),
            "--straggler-period",
            "4",
            "--straggler-factor",
            "6",
            "--prometheus",
            &target,
            "--linger",
            "30",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            // Spans over OTLP, metrics (with exemplars) on the embedded endpoint.
            ("OTEL_METRICS_EXPORTER", "prometheus"),
            ("PHASETRACE_TRACE_EVERY", "0"),
        ],
    );
    assert_eq!(demo.prometheus_addr(WAIT), target);

    let found = poll(WAIT, || {
        let e = exemplars(&prometheus, "phasetrace_step_duration_seconds_bucket");
        (e.len() >= 3).then_some(e)
    })
    .unwrap_or_else(|| {
        panic!(
            "no step-duration exemplars in Prometheus; demo output:\n{}\nprometheus:\n{}",
            demo.output(),
            prometheus.output()
        )
    });
    let ids: Vec<(String, String)> = found
        .iter()
        .map(|(_, l, _)| {
            (
                l["trace_id"].as_str().unwrap_or_default().to_owned(),
                l["span_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let p = rotel.wait_for(
        |p| {
            ids.iter()
                .all(|(t, s)| p.span_by_id(s).is_some_and(|sp| &sp.trace_id == t))
        },
        WAIT,
    );
    for ((series, labels, value), (trace_id, span_id)) in found.iter().zip(&ids) {
        assert_eq!(trace_id.len(), 32, "{labels}");
        let step = p.span_by_id(span_id).unwrap();
        assert_eq!(step.name, span::STEP, "{step:#?}");
        assert_eq!(&step.trace_id, trace_id);
        assert_eq!(step.attr(attr::SAMPLED), Some("tail"), "{step:#?}");
        assert_eq!(
            step.attr(attr::RANK),
            series["rank"].as_str(),
            "{series} {step:#?}"
        );
        let secs = step.duration_nanos() as f64 * 1e-9;
        assert!(
            (secs - value).abs() < 1e-6,
            "exemplar {value} s, span {secs} s"
        );
        let le: f64 = series["le"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap_or(f64::INFINITY);
        assert!(*value <= le, "exemplar {value} above its bucket le={le}");
        // The slow step's trace: its layers, each with its sections.
        let layers: Vec<_> = p
            .children_of(step)
            .into_iter()
            .filter(|s| s.name == span::LAYER)
            .collect();
        assert_eq!(layers.len(), LAYERS, "{step:#?}");
        assert!(layers.iter().all(|l| !p.children_of(l).is_empty()));
    }
    // The section and collective-wait histograms carry exemplars too.
    for query in [
        "phasetrace_section_duration_seconds_bucket",
        "phasetrace_collective_wait_seconds_bucket",
    ] {
        let e = poll(WAIT, || {
            let e = exemplars(&prometheus, query);
            (!e.is_empty()).then_some(e)
        })
        .unwrap_or_else(|| panic!("no exemplars for {query}"));
        let (_, labels, _) = &e[0];
        let span_id = labels["span_id"].as_str().unwrap();
        let p = rotel.wait_for(|p| p.span_by_id(span_id).is_some(), WAIT);
        let s = p.span_by_id(span_id).unwrap();
        assert_eq!(Some(s.trace_id.as_str()), labels["trace_id"].as_str());
    }
    let status = demo.interrupt_and_wait(WAIT);
    assert!(status.success(), "{status}; output:\n{}", demo.output());
}
