//! `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` (or `with_otlp_gzip`): compressed OTLP bodies over gRPC
//! and HTTP/protobuf arrive intact at the real collector.

use crate::support;

use phasetrace::{Level, Profiler, Protocol, Section, Site};
use std::time::Duration;
use support::Rotel;

fn run(endpoint: &str, protocol: Protocol) -> Profiler {
    let p = Profiler::builder()
        .without_env()
        .with_level(Level::Full)
        .with_trace_every(1)
        .without_prometheus()
        .with_otlp_endpoint(Some(endpoint))
        .with_otlp_protocol(protocol)
        .with_otlp_gzip(true)
        .build()
        .expect("profiler");
    assert!(p.config().otlp.as_ref().is_some_and(|o| o.gzip));
    let rec = p.recorder();
    for _ in 0..4 {
        let _s = rec.step();
        let _k = rec.section(Section::MOE_EXPERTS, 3u32, Site::MLP);
    }
    drop(rec);
    p.flush();
    p
}

fn arrived(o: &support::ParsedOutput) -> bool {
    o.spans_named("decode.step").len() == 4
        && o.latest_point("phasetrace.section.duration", &[("bucket", "moe_experts")])
            .and_then(|p| p.count)
            == Some(4)
}

#[test]
fn gzip_over_grpc_arrives() {
    let rotel = Rotel::start();
    let p = run(&rotel.grpc_endpoint(), Protocol::Grpc);
    rotel.wait_for(arrived, Duration::from_secs(20));
    p.shutdown();
}

#[test]
fn gzip_over_http_arrives() {
    let rotel = Rotel::start();
    let p = run(&rotel.http_endpoint(), Protocol::HttpProtobuf);
    rotel.wait_for(arrived, Duration::from_secs(20));
    p.shutdown();
}
