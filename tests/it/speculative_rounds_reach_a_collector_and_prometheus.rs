//! Speculative rounds end to end: round spans with phase and verify-part children and the spec
//! histograms and counters arrive at a real collector (rotel), and the verify share and the
//! acceptance rate computed by Prometheus over a workload of known phase times match.

use crate::support;

use crate::manual_clock::Manual;
use phasetrace::{Phase, Profiler, RecorderOptions, SectionLevel, SpecLevel, VerifyPart};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Prometheus, Rotel};

const US: u64 = 1_000;

/// One round of k=4 with known times: draft 100 µs, verify 300 µs (kda 120 with scan 40,
/// mla 60, ffn 90), accept 50, rollback 30 (when not all accepted), maint 20.
fn round(rec: &phasetrace::Recorder, clock: &Manual, t0: u64, accepted: u32) -> u64 {
    clock.set(t0);
    let r = rec.round(4);
    clock.set(t0 + 100 * US);
    r.phase(Phase::Draft);
    {
        let _k = rec.verify_part(r.as_ref(), VerifyPart::Kda);
        clock.set(t0 + 120 * US);
        {
            let _s = rec.verify_part(r.as_ref(), VerifyPart::KdaScan);
            clock.set(t0 + 160 * US);
        }
        clock.set(t0 + 220 * US);
    }
    {
        let _m = rec.verify_part(r.as_ref(), VerifyPart::Mla);
        clock.set(t0 + 280 * US);
    }
    {
        let _f = rec.verify_part(r.as_ref(), VerifyPart::Ffn);
        clock.set(t0 + 370 * US);
    }
    clock.set(t0 + 400 * US);
    r.phase(Phase::Verify);
    clock.set(t0 + 450 * US);
    r.phase(Phase::Accept);
    let mut t = t0 + 450 * US;
    if accepted < 4 {
        t += 30 * US;
        clock.set(t);
        r.phase(Phase::Rollback);
    }
    t += 20 * US;
    clock.set(t);
    r.phase(Phase::Maint);
    r.end(accepted);
    t
}

#[test]
fn round_spans_and_spec_metrics_arrive_at_rotel() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Off)
        .with_spec_level(SpecLevel::VerifySplit)
        .with_trace_every(1)
        .without_prometheus()
        .with_otlp_endpoint(Some(&rotel.grpc_endpoint()))
        .with_service_name("spec-e2e")
        .with_spec_k_max(4)
        .build()
        .expect("profiler");
    let clock = Arc::new(Manual::default());
    let rec = p.recorder_with(RecorderOptions::new().rank(2).clock(clock.clone()));
    let start = phasetrace::timing::now_ns();
    let mut t = start;
    for accepted in [1, 3, 4] {
        t = round(&rec, &clock, t, accepted) + 10 * US;
    }
    p.flush();
    let out = rotel.wait_for(
        |o| {
            o.spans_named("spec.round").len() == 3
                && o.latest_point("phasetrace.spec.rounds", &[("rank", "2")])
                    .and_then(|pt| pt.value)
                    == Some(3.0)
        },
        Duration::from_secs(20),
    );
    let rounds = out.spans_named("spec.round");
    let accepted: Vec<&str> = rounds.iter().filter_map(|s| s.attr("accepted")).collect();
    assert_eq!(accepted, ["1", "3", "4"]);
    assert!(rounds.iter().all(|s| s.attr("k") == Some("4")));
    assert!(rounds.iter().all(|s| s.attr("rank") == Some("2")));
    assert_eq!(
        rounds[0].resource.get("service.name").map(String::as_str),
        Some("spec-e2e")
    );
    // Phase children, in order; the fully accepted round has no rollback.
    for (i, r) in rounds.iter().enumerate() {
        let mut kids: Vec<&support::ReceivedSpan> = out.children_of(r);
        kids.sort_by_key(|s| s.start_unix_nanos);
        let names: Vec<&str> = kids.iter().map(|s| s.name.as_str()).collect();
        if i == 2 {
            assert_eq!(names, ["draft", "verify", "accept", "maint"]);
        } else {
            assert_eq!(names, ["draft", "verify", "accept", "rollback", "maint"]);
        }
        assert_eq!(kids[1].duration_nanos(), 300 * US);
        let mut parts: Vec<String> = out
            .children_of(kids[1])
            .iter()
            .map(|s| s.name.clone())
            .collect();
        parts.sort();
        assert_eq!(parts, ["ffn", "kda", "kda_scan", "mla"]);
    }
    let phase = |ph: &str| {
        out.latest_point(
            "phasetrace.spec.phase.duration",
            &[("phase", ph), ("rank", "2")],
        )
        .cloned()
        .unwrap_or_else(|| panic!("no {ph} point"))
    };
    assert_eq!(phase("verify").count, Some(3));
    assert!((phase("verify").sum.unwrap() - 3.0 * 300e-6).abs() < 1e-9);
    assert_eq!(phase("rollback").count, Some(2));
    let part = |pt: &str| {
        out.latest_point("phasetrace.spec.verify.part.duration", &[("part", pt)])
            .and_then(|p| p.sum)
            .unwrap_or_else(|| panic!("no {pt} point"))
    };
    assert!((part("kda") - 3.0 * 120e-6).abs() < 1e-9);
    assert!((part("kda_scan") - 3.0 * 40e-6).abs() < 1e-9);
    assert!((part("mla") - 3.0 * 60e-6).abs() < 1e-9);
    assert!((part("ffn") - 3.0 * 90e-6).abs() < 1e-9);
    assert!(
        (part("rest") - 3.0 * 120e-6).abs() < 1e-9,
        "rest = verify - kda - mla"
    );
    let sum = |name: &str| {
        out.latest_point(name, &[("rank", "2")])
            .and_then(|p| p.value)
    };
    assert_eq!(sum("phasetrace.spec.draft_tokens"), Some(12.0));
    assert_eq!(sum("phasetrace.spec.accepted_tokens"), Some(8.0));
    let len = out
        .latest_point("phasetrace.spec.accepted_length", &[("rank", "2")])
        .expect("accepted length");
    assert_eq!(len.explicit_bounds, vec![0.0, 1.0, 2.0, 3.0, 4.0]);
    assert_eq!(len.bucket_counts, vec![0, 1, 0, 1, 1, 0]);
    p.shutdown();
}

#[test]
fn prometheus_computes_the_verify_share_and_acceptance_rate() {
    support::require_tools!(Prometheus);
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Off)
        .with_spec_level(SpecLevel::Phases)
        .with_trace_every(0)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()
        .expect("profiler");
    let addr = p.prometheus_addr().expect("prometheus endpoint");
    let prom = Prometheus::builder()
        .job("engine", &addr.to_string())
        .scrape_interval("1s")
        .start();
    prom.wait_for_up(Duration::from_secs(20));
    let clock = Arc::new(Manual::default());
    let rec = p.recorder_with(RecorderOptions::new().clock(clock.clone()));
    // Rounds keep coming while Prometheus scrapes, so rate() sees them increase.
    let mut t = phasetrace::timing::now_ns();
    let began = Instant::now();
    let mut n = 0u32;
    let verify_share = "sum(rate(phasetrace_spec_phase_duration_seconds_sum{phase=\"verify\"}[1m])) / sum(rate(phasetrace_spec_phase_duration_seconds_sum[1m]))";
    let acceptance = "sum(rate(phasetrace_spec_accepted_tokens_total[1m])) / sum(rate(phasetrace_spec_draft_tokens_total[1m]))";
    let mut got = None;
    while began.elapsed() < Duration::from_secs(40) {
        for _ in 0..50 {
            // Alternate 1 and 3 accepted of 4: acceptance 0.5.
            t = round(&rec, &clock, t, if n.is_multiple_of(2) { 1 } else { 3 }) + 10 * US;
            n += 1;
        }
        p.drain();
        std::thread::sleep(Duration::from_millis(100));
        if began.elapsed() > Duration::from_secs(4)
            && let (Some(s), Some(a)) = (
                prom.query_scalar(verify_share),
                prom.query_scalar(acceptance),
            )
            && s.is_finite()
            && a.is_finite()
        {
            got = Some((s, a));
            break;
        }
    }
    let (share, acc) = got.expect("Prometheus never computed the verify share");
    // verify = 300 of draft 100 + verify 300 + accept 50 + rollback 30 + maint 20 = 500 µs
    assert!((share - 0.6).abs() < 0.02, "verify share {share}");
    assert!((acc - 0.5).abs() < 0.02, "acceptance rate {acc}");
    p.shutdown();
}
