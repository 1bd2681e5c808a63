//! A small test engine drives the public recording API into a real OTLP collector (rotel), once
//! over gRPC and once over HTTP/protobuf. What arrives must be exactly what was recorded: span
//! names, the `decode.step -> layer -> section` tree (nested sections under their parent
//! section), attributes, the `moe.route` span event, and the metric counts.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use phasetrace::{Profiler, Protocol, Section, SectionLevel, Site};
use phasetrace_names::{attr, metric, resource, span};
use support::{MetricKind, ParsedOutput, ReceivedSpan, Rotel};

const WAIT: Duration = Duration::from_secs(20);
const STEPS: u64 = 4;
const LAYERS: u32 = 2;
/// One step in two gets spans: steps 0 and 2.
const TRACE_EVERY: u64 = 2;
const SAMPLED: [u64; 2] = [0, 2];
const RANK: u32 = 3;
/// The collective group: on every span and series.
const GROUP: &str = "tp-a";
/// Routed expert ids per layer: five ids travel as two records and arrive as one event.
const EXPERTS: [u32; 5] = [3, 17, 42, 101, 7];
/// Sections per layer in [`drive`].
const SECTIONS_PER_LAYER: u64 = 6;
/// An explicitly measured rendezvous wait per layer and step (site `mlp`).
const EXPLICIT_WAIT: Duration = Duration::from_micros(250);

/// The test engine: `STEPS` decode steps of `LAYERS` layers, each layer a KDA mixer with two
/// nested sections, an attention all-reduce probe, its host-side enqueue, routed experts and an
/// explicitly measured MLP wait.
fn drive(profiler: &Profiler) {
    let rec = profiler.recorder();
    assert_eq!(rec.rank(), RANK);
    for _ in 0..STEPS {
        let _step = rec.step();
        for layer in 0..LAYERS {
            {
                let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
                {
                    let _front = rec.section(Section::KDA_FRONT, layer, Site::ATTN);
                    std::hint::black_box(layer);
                }
                let _recur = rec.section(Section::KDA_RECUR, layer, Site::ATTN);
            }
            {
                let _probe = rec.section(Section::REDUCE_ATTN_BAR, layer, Site::ATTN);
            }
            {
                let _enq = rec.host_section(Section::REDUCE_ATTN_ENQ, layer, Site::ATTN);
            }
            rec.moe_route(layer, &EXPERTS);
            {
                let _experts = rec.section(Section::MOE_EXPERTS, layer, Site::MLP);
            }
            rec.collective_wait(Site::MLP, layer, EXPLICIT_WAIT);
        }
    }
}

fn profiler(endpoint: String, protocol: Protocol, service: &str) -> Profiler {
    Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_trace_every(TRACE_EVERY)
        .with_rank(RANK)
        .with_group(GROUP)
        .with_service_name(service)
        .without_prometheus()
        .with_otlp_endpoint(Some(&endpoint))
        .with_otlp_protocol(protocol)
        .with_metric_export_interval(Duration::from_millis(500))
        .build()
        .expect("building the profiler")
}

fn spans_per_sampled_step() -> usize {
    1 + LAYERS as usize + LAYERS as usize * SECTIONS_PER_LAYER as usize
}

/// Everything has arrived once every span is there and the last metric exports carry the
/// final counts.
fn complete(p: &ParsedOutput) -> bool {
    let steps_done = p
        .latest_point(metric::STEPS, &[])
        .and_then(|pt| pt.value)
        .is_some_and(|v| v == STEPS as f64);
    let sections_done = p
        .latest_point(
            metric::SECTION_LAYER_CALLS,
            &[(attr::BUCKET, "moe_experts"), (attr::LAYER, "1")],
        )
        .and_then(|pt| pt.value)
        == Some(STEPS as f64);
    steps_done && sections_done && p.spans.len() >= SAMPLED.len() * spans_per_sampled_step()
}

fn child<'a>(p: &'a ParsedOutput, parent: &ReceivedSpan, name: &str) -> Vec<&'a ReceivedSpan> {
    p.children_of(parent)
        .into_iter()
        .filter(|s| s.name == name)
        .collect()
}

fn assert_within(parent: &ReceivedSpan, child: &ReceivedSpan) {
    assert!(
        child.start_unix_nanos >= parent.start_unix_nanos
            && child.end_unix_nanos <= parent.end_unix_nanos,
        "{} [{}, {}] is not within {} [{}, {}]",
        child.name,
        child.start_unix_nanos,
        child.end_unix_nanos,
        parent.name,
        parent.start_unix_nanos,
        parent.end_unix_nanos
    );
}

fn assert_section(
    p: &ParsedOutput,
    parent: &ReceivedSpan,
    name: &str,
    layer: u32,
    site: &str,
) -> ReceivedSpan {
    let found = child(p, parent, name);
    assert_eq!(
        found.len(),
        1,
        "expected one {name} under {} (layer {layer}); got {found:#?}",
        parent.name
    );
    let s = found[0];
    let mut expected: BTreeMap<String, String> = [
        (attr::BUCKET, name.to_string()),
        (attr::LAYER, layer.to_string()),
        (attr::SITE, site.to_string()),
        (attr::RANK, RANK.to_string()),
        (attr::GROUP, GROUP.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // The rendezvous probe carries the route trace of its layer: the expert ids routed there.
    if name == "reduce_attn_bar" {
        let ids: Vec<String> = EXPERTS.iter().map(|e| format!("Int({e})")).collect();
        expected.insert(
            attr::EXPERT_IDS.to_owned(),
            format!("Slice({})", ids.join(", ")),
        );
        expected.insert(attr::EXPERT_IDS_COUNT.to_owned(), EXPERTS.len().to_string());
    }
    assert_eq!(s.attributes, expected, "{s:#?}");
    assert_within(parent, s);
    s.clone()
}

fn assert_received(rotel: &Rotel, profiler: &Profiler, service: &str) {
    let p = rotel.wait_for(complete, WAIT);
    let context = || format!("rotel output:\n{}", rotel.output());

    // Exactly the sampled steps got spans, and nothing else was built.
    let per_step = spans_per_sampled_step();
    assert_eq!(p.spans.len(), SAMPLED.len() * per_step, "{}", context());
    assert_eq!(
        profiler.stats().spans,
        (SAMPLED.len() * per_step) as u64,
        "{:?}",
        profiler.stats()
    );
    let mut steps = p.spans_named(span::STEP);
    steps.sort_by_key(|s| s.attr(attr::STEP).map(str::to_owned));
    assert_eq!(steps.len(), SAMPLED.len(), "{}", context());

    for (step, number) in steps.iter().zip(SAMPLED) {
        assert!(step.is_root(), "{step:#?}");
        assert_eq!(step.kind, "SPAN_KIND_INTERNAL");
        assert_eq!(step.scope_name, "phasetrace");
        assert_eq!(step.attr(attr::STEP), Some(number.to_string().as_str()));
        assert_eq!(step.attr(attr::RANK), Some(RANK.to_string().as_str()));
        assert_eq!(step.attr(attr::TIMING), Some("host"));
        assert_eq!(step.attr(attr::GROUP), Some(GROUP));
        assert_eq!(
            step.resource.get("service.name").map(String::as_str),
            Some(service)
        );
        // The SDK keeps its own name; phasetrace names itself as the distribution.
        assert_eq!(
            step.resource.get("telemetry.sdk.name").map(String::as_str),
            Some("opentelemetry")
        );
        assert_eq!(
            step.resource
                .get(resource::TELEMETRY_DISTRO_NAME)
                .map(String::as_str),
            Some(resource::DISTRO)
        );
        assert_eq!(
            step.resource
                .get(resource::TELEMETRY_DISTRO_VERSION)
                .map(String::as_str),
            Some(env!("CARGO_PKG_VERSION"))
        );
        // Every span of the step is in the step's trace.
        let in_trace = p
            .spans
            .iter()
            .filter(|s| s.trace_id == step.trace_id)
            .count();
        assert_eq!(in_trace, per_step, "{step:#?}");

        // One moe.route event per layer with all five expert ids, in layer order.
        assert_eq!(step.events.len(), LAYERS as usize, "{step:#?}");
        for (layer, event) in step.events.iter().enumerate() {
            assert_eq!(event.name, span::MOE_ROUTE_EVENT);
            assert_eq!(
                event.attributes.get(attr::LAYER).map(String::as_str),
                Some(layer.to_string().as_str()),
                "{event:#?}"
            );
            let ids = event
                .attributes
                .get(attr::EXPERT_IDS)
                .unwrap_or_else(|| panic!("no {} on {event:#?}", attr::EXPERT_IDS));
            assert!(ids.starts_with("Slice("), "an array of ints: {ids}");
            let printed: Vec<u32> = ids
                .split("Int(")
                .skip(1)
                .map(|s| s.split(')').next().unwrap().parse().unwrap())
                .collect();
            assert_eq!(printed, EXPERTS, "{ids}");
            assert!(
                event.time_unix_nanos >= step.start_unix_nanos
                    && event.time_unix_nanos <= step.end_unix_nanos,
                "{event:#?} outside {step:#?}"
            );
        }

        // decode.step -> layer (one per layer) -> sections.
        let mut layers = child(&p, step, span::LAYER);
        layers.sort_by_key(|l| l.attr(attr::LAYER).map(str::to_owned));
        assert_eq!(layers.len(), LAYERS as usize, "{}", context());
        assert_eq!(p.children_of(step).len(), LAYERS as usize);
        for (layer, layer_span) in (0..LAYERS).zip(layers) {
            assert_eq!(
                layer_span.attr(attr::LAYER),
                Some(layer.to_string().as_str())
            );
            assert_eq!(layer_span.attr(attr::GROUP), Some(GROUP));
            assert_within(step, layer_span);
            let mixer = assert_section(&p, layer_span, "kda_mixer", layer, "attn");
            assert_section(&p, layer_span, "reduce_attn_bar", layer, "attn");
            assert_section(&p, layer_span, "reduce_attn_enq", layer, "attn");
            assert_section(&p, layer_span, "moe_experts", layer, "mlp");
            assert_eq!(p.children_of(layer_span).len(), 4, "{layer_span:#?}");
            // Nested sections are children of the section they ran in, not of the layer.
            let front = assert_section(&p, &mixer, "kda_front", layer, "attn");
            let recur = assert_section(&p, &mixer, "kda_recur", layer, "attn");
            assert_eq!(p.children_of(&mixer).len(), 2);
            assert!(front.end_unix_nanos <= recur.start_unix_nanos);
            assert!(p.children_of(&front).is_empty());
        }
    }

    // Metrics: every section of every step (sampled or not), per bucket and layer.
    let sections = p
        .last_metric(metric::SECTION_DURATION)
        .unwrap_or_else(|| panic!("no section histogram; {}", context()));
    assert_eq!(sections.kind, MetricKind::Histogram);
    assert_eq!(sections.unit, metric::UNIT_SECONDS);
    assert!(sections.is_cumulative());
    assert_eq!(
        sections.resource.get("service.name").map(String::as_str),
        Some(service)
    );
    let bounds: Vec<f64> = metric::DURATION_BOUNDARIES.to_vec();
    for (bucket, site) in [
        ("kda_mixer", "attn"),
        ("kda_front", "attn"),
        ("kda_recur", "attn"),
        ("reduce_attn_bar", "attn"),
        ("reduce_attn_enq", "attn"),
        ("moe_experts", "mlp"),
    ] {
        // The histogram: per (bucket, site, rank), every layer together.
        let labels = [
            (attr::BUCKET, bucket),
            (attr::SITE, site),
            (attr::RANK, "3"),
        ];
        let pt = sections
            .point(&labels)
            .unwrap_or_else(|| panic!("no point {labels:?}; {}", context()));
        assert_eq!(pt.attributes.len(), 4, "no layer on the histogram: {pt:#?}");
        assert_eq!(
            pt.count,
            Some(STEPS * u64::from(LAYERS)),
            "{labels:?}: {pt:#?}"
        );
        assert_eq!(pt.explicit_bounds, bounds);
        assert_eq!(
            pt.bucket_counts.iter().sum::<u64>(),
            STEPS * u64::from(LAYERS),
            "{pt:#?}"
        );
        // The per-layer detail: time and calls per (bucket, layer, site, rank).
        let mut total = 0.0;
        let mut time = 0.0;
        for layer in 0..LAYERS {
            let layer = layer.to_string();
            let labels = [
                (attr::BUCKET, bucket),
                (attr::LAYER, layer.as_str()),
                (attr::SITE, site),
                (attr::RANK, "3"),
                (attr::GROUP, GROUP),
            ];
            let calls = p
                .latest_point(metric::SECTION_LAYER_CALLS, &labels)
                .unwrap_or_else(|| panic!("no calls {labels:?}; {}", context()));
            assert_eq!(calls.attributes.len(), 5, "{calls:#?}");
            assert_eq!(calls.value, Some(STEPS as f64), "{labels:?}: {calls:#?}");
            total += calls.value.unwrap();
            time += p
                .latest_point(metric::SECTION_LAYER_TIME, &labels)
                .and_then(|t| t.value)
                .unwrap_or_else(|| panic!("no time {labels:?}; {}", context()));
        }
        assert_eq!(total, (STEPS * u64::from(LAYERS)) as f64, "{bucket}");
        let sum = pt.sum.unwrap_or_default();
        assert!(
            (time - sum).abs() <= 1e-9 * STEPS as f64,
            "{bucket}: per-layer time {time} vs histogram sum {sum}"
        );
    }
    let buckets: std::collections::BTreeSet<&str> = sections
        .points
        .iter()
        .filter_map(|pt| pt.attr(attr::BUCKET))
        .collect();
    assert_eq!(buckets.len(), SECTIONS_PER_LAYER as usize, "{buckets:?}");
    let all: u64 = sections.points.iter().filter_map(|pt| pt.count).sum();
    assert_eq!(all, STEPS * u64::from(LAYERS) * SECTIONS_PER_LAYER);
    assert_eq!(profiler.stats().sections, all);

    // Steps: counter and duration histogram.
    let steps_counter = p.last_metric(metric::STEPS).unwrap();
    assert_eq!(steps_counter.monotonic, Some(true));
    let pt = p.latest_point(metric::STEPS, &[(attr::RANK, "3")]).unwrap();
    assert_eq!(pt.value, Some(STEPS as f64));
    let pt = p
        .latest_point(metric::STEP_DURATION, &[(attr::RANK, "3")])
        .unwrap();
    assert_eq!(pt.count, Some(STEPS));

    // Collective waits: one per probe section (site attn) and one per explicit wait (site mlp).
    let waits = p.last_metric(metric::COLLECTIVE_WAIT).unwrap();
    let probe = waits
        .point(&[(attr::SITE, "attn")])
        .unwrap_or_else(|| panic!("no attn wait point; {}", context()));
    assert_eq!(probe.count, Some(STEPS * u64::from(LAYERS)), "{probe:#?}");
    assert_eq!(probe.attr(attr::RANK), Some("3"));
    assert_eq!(probe.attr(attr::LAYER), None, "{probe:#?}");
    let explicit = waits
        .point(&[(attr::SITE, "mlp")])
        .unwrap_or_else(|| panic!("no mlp wait point; {}", context()));
    assert_eq!(
        explicit.count,
        Some(STEPS * u64::from(LAYERS)),
        "{explicit:#?}"
    );
    let sum = explicit.sum.unwrap();
    let expected = EXPLICIT_WAIT.as_secs_f64() * (STEPS * u64::from(LAYERS)) as f64;
    assert!((sum - expected).abs() < 1e-12, "{sum} != {expected}");
    assert_eq!(explicit.min, Some(EXPLICIT_WAIT.as_secs_f64()));
    assert_eq!(explicit.max, Some(EXPLICIT_WAIT.as_secs_f64()));
    for layer in 0..LAYERS {
        let layer = layer.to_string();
        for site in ["attn", "mlp"] {
            let labels = [
                (attr::SITE, site),
                (attr::LAYER, layer.as_str()),
                (attr::RANK, "3"),
            ];
            let calls = p
                .latest_point(metric::COLLECTIVE_LAYER_WAIT_CALLS, &labels)
                .unwrap_or_else(|| panic!("no per-layer waits {labels:?}; {}", context()));
            assert_eq!(calls.value, Some(STEPS as f64), "{calls:#?}");
        }
        let time = p
            .latest_point(
                metric::COLLECTIVE_LAYER_WAIT_TIME,
                &[(attr::SITE, "mlp"), (attr::LAYER, layer.as_str())],
            )
            .and_then(|t| t.value)
            .expect("per-layer wait time");
        let expected = EXPLICIT_WAIT.as_secs_f64() * STEPS as f64;
        assert!((time - expected).abs() < 1e-12, "{time} != {expected}");
    }
    let probes: u64 = waits.points.iter().filter_map(|pt| pt.count).sum();
    assert_eq!(probes, 2 * STEPS * u64::from(LAYERS));

    // The per-step wait total: one point per step, summing every probe and explicit wait.
    let pt = p
        .latest_point(
            metric::STEP_COLLECTIVE_WAIT,
            &[(attr::RANK, "3"), (attr::GROUP, GROUP)],
        )
        .unwrap_or_else(|| panic!("no per-step wait; {}", context()));
    assert_eq!(pt.count, Some(STEPS), "{pt:#?}");
    let per_probe: f64 = waits.points.iter().filter_map(|pt| pt.sum).sum();
    let per_step = pt.sum.unwrap_or(f64::NAN);
    assert!(
        (per_step - per_probe).abs() <= 1e-9 * per_probe.max(1e-9),
        "per-step wait total {per_step} != the probes' {per_probe}"
    );

    // Nothing was dropped, and every reason has its series, at 0, from the start.
    let dropped = p
        .last_metric(metric::RECORDS_DROPPED)
        .unwrap_or_else(|| panic!("no {}; {}", metric::RECORDS_DROPPED, context()));
    for reason in phasetrace::DropReason::ALL {
        let point = dropped
            .points
            .iter()
            .find(|pt| pt.attr(attr::REASON) == Some(reason.as_str()))
            .unwrap_or_else(|| panic!("no {reason} series: {dropped:#?}"));
        assert_eq!(point.value, Some(0.0), "{reason}: {point:#?}");
    }
}

#[test]
fn sections_arrive_over_grpc() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let profiler = profiler(rotel.grpc_endpoint(), Protocol::Grpc, "sections-grpc");
    drive(&profiler);
    profiler.flush();
    assert_received(&rotel, &profiler, "sections-grpc");
    profiler.shutdown();
}

#[test]
fn sections_arrive_over_http_protobuf() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let profiler = profiler(
        rotel.http_endpoint(),
        Protocol::HttpProtobuf,
        "sections-http",
    );
    drive(&profiler);
    profiler.flush();
    assert_received(&rotel, &profiler, "sections-http");
    profiler.shutdown();
}
