//! Expert load at the scale of the largest MoE models: a DeepSeek-V3-shaped demo (61 layers, 3
//! dense, 256 experts, top-8) and a Kimi-K2-shaped one (60 MoE layers of 384 experts, 2 ranks),
//! both with `--expert-counter on`, export no overflow series on `/metrics` nor over OTLP (to a
//! real collector), stay within 1,000 expert series per rank, and their totals add up: every
//! MoE layer of every rank routed exactly steps x top-k tokens, which is the demo's routing.

use crate::cli;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cli::{parse_exposition, sum_samples};
use support::{Rotel, free_port, http_get};

const RUN: Duration = Duration::from_secs(180);
/// The budget: expert-load series per rank at 384 experts x 60 layers.
const EXPERT_SERIES_PER_RANK: usize = 1_000;
const TOP_K: u32 = 8;

struct Model {
    group: &'static str,
    ranks: u32,
    layers: u32,
    dense: u32,
    experts: &'static str,
}

#[test]
fn deepseek_and_kimi_shaped_models_export_no_overflow_and_route_steps_times_top_k() {
    support::require_tools!(Rotel);
    let rotel = Rotel::start();
    let models = [
        Model {
            group: "moe256",
            ranks: 1,
            layers: 61,
            dense: 3,
            experts: "256",
        },
        Model {
            group: "moe384",
            ranks: 2,
            layers: 63,
            dense: 3,
            experts: "384",
        },
    ];
    let mut demos = Vec::new();
    for m in &models {
        let target = format!("127.0.0.1:{}", free_port());
        let (ranks, layers, dense) = (
            m.ranks.to_string(),
            m.layers.to_string(),
            m.dense.to_string(),
        );
        let top_k = TOP_K.to_string();
        let demo = cli::Demo::spawn(
            &[
                "--group",
                m.group,
                "--ranks",
                &ranks,
                "--layers",
                &layers,
                "--dense-layers",
                &dense,
                "--experts",
                m.experts,
                "--top-k",
                &top_k,
                "--expert-counter",
                "on",
                "--expert-window",
                "16",
                "--steps",
                "40",
                "--time-scale",
                "0.05",
                "--spin-us",
                "0",
                "--trace-every",
                "0",
                "--prometheus",
                &target,
                "--linger",
                "60",
            ],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &rotel.grpc_endpoint()),
                ("OTEL_METRICS_EXPORTER", "otlp,prometheus"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
            ],
        );
        demos.push((demo, target));
    }
    for (m, (demo, target)) in models.iter().zip(&mut demos) {
        assert_eq!(demo.prometheus_addr(RUN), *target);
        demo.wait_for_run_end(RUN);
        let (status, body) = http_get(&format!("http://{target}/metrics")).expect("scrape");
        assert_eq!(status, 200);
        assert!(
            !body.contains("otel_metric_overflow"),
            "{}: an overflow series on /metrics",
            m.group
        );
        let samples = parse_exposition(&body);
        let label = |l: &[(String, String)], k: &str| {
            l.iter()
                .find(|(lk, _)| lk == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let mut per_rank: BTreeMap<String, BTreeMap<&str, usize>> = BTreeMap::new();
        for (name, l, _) in &samples {
            if name.starts_with("phasetrace_moe_") {
                *per_rank
                    .entry(label(l, "rank"))
                    .or_default()
                    .entry(name.as_str())
                    .or_default() += 1;
            }
        }
        let moe_layers = (m.layers - m.dense) as usize;
        eprintln!("{}: expert series per rank {per_rank:#?}", m.group);
        assert_eq!(per_rank.len(), m.ranks as usize, "{per_rank:?}");
        for (rank, by_name) in &per_rank {
            let total: usize = by_name.values().sum();
            assert!(
                total <= EXPERT_SERIES_PER_RANK,
                "{} rank {rank}: {total} expert series",
                m.group
            );
            assert_eq!(by_name["phasetrace_moe_layer_tokens_total"], moe_layers);
            assert_eq!(by_name["phasetrace_moe_expert_load_imbalance"], moe_layers);
            assert_eq!(by_name["phasetrace_moe_expert_load_cv"], moe_layers);
            // The default 4 hot experts a layer (a 16-step window routes 128 tokens).
            assert_eq!(by_name["phasetrace_moe_hot_expert_share"], 4 * moe_layers);
            // Conservation: each MoE layer routed steps x top-k tokens, the dense ones none.
            let steps = sum_samples(&samples, "phasetrace_steps_total", &[("rank", rank)]);
            assert!(steps >= 40.0, "{} rank {rank}: {steps} steps", m.group);
            for layer in 0..m.layers {
                let layer_s = layer.to_string();
                let tokens = sum_samples(
                    &samples,
                    "phasetrace_moe_layer_tokens_total",
                    &[("rank", rank), ("layer", &layer_s)],
                );
                let want = if layer < m.dense {
                    0.0
                } else {
                    steps * f64::from(TOP_K)
                };
                assert_eq!(tokens, want, "{} rank {rank} layer {layer}", m.group);
            }
            let imbalance: Vec<f64> = samples
                .iter()
                .filter(|(n, l, _)| {
                    n == "phasetrace_moe_expert_load_imbalance" && label(l, "rank") == *rank
                })
                .map(|s| s.2)
                .collect();
            // 128 tokens over 256 or 384 experts: some expert got at least 2, so max/mean > 1;
            // never more than the number of experts.
            let experts: f64 = m.experts.parse().unwrap();
            assert!(
                imbalance.iter().all(|&i| i > 1.0 && i <= experts),
                "{imbalance:?}"
            );
        }
    }

    // OTLP: no instrument overflows, and the per-layer token counters arrive per rank.
    let parsed = rotel.wait_for(
        |p| {
            p.metrics_named(phasetrace_names::metric::MOE_LAYER_TOKENS)
                .iter()
                .flat_map(|m| &m.points)
                .filter_map(|pt| pt.attr("group"))
                .collect::<BTreeSet<_>>()
                .len()
                == 2
        },
        RUN,
    );
    for m in &parsed.metrics {
        for pt in &m.points {
            assert!(
                pt.attr("otel.metric.overflow").is_none(),
                "{} overflowed over OTLP",
                m.name
            );
        }
    }
    let layers_384: BTreeSet<(&str, &str)> = parsed
        .metrics_named(phasetrace_names::metric::MOE_LAYER_TOKENS)
        .iter()
        .flat_map(|m| &m.points)
        .filter(|pt| pt.attr("group") == Some("moe384"))
        .filter_map(|pt| Some((pt.attr("rank")?, pt.attr("layer")?)))
        .collect();
    assert_eq!(layers_384.len(), 2 * 60, "{layers_384:?}");
    for (demo, _) in &mut demos {
        let _ = demo.interrupt_and_wait(RUN);
    }
}
