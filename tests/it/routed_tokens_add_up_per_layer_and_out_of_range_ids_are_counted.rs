//! Conservation of routed tokens: with the expert telemetry on, every id a recorder routes is
//! either in `Profiler::expert_load()` and in `phasetrace_moe_layer_tokens_total` on
//! `/metrics` (tokens x top-k per layer), or counted under `reason="out_of_range"` (an id at
//! or above `PHASETRACE_MOE_EXPERTS`, above 65535, or a layer with no index). The window's
//! imbalance and hot experts read what a known routing gives, and an expert that is only a
//! little hotter than a hot one does not take its place.

use crate::support;

use phasetrace::{DropReason, Layer, Profiler, SectionLevel};

/// The value of the one sample `name{labels...}` on the page (labels in any order).
fn sample(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn routed_tokens_add_up_per_layer_and_out_of_range_ids_are_counted() {
    const EXPERTS: u32 = 16;
    const STEPS: u32 = 8;
    let p = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .with_expert_counter(true)
        .with_moe_experts(EXPERTS)
        .with_expert_window(STEPS)
        .with_expert_top(2)
        .with_expert_parallel(4)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .with_summary_every(0)
        .build()
        .expect("profiler");
    let rec = p.recorder();
    for step in 0..STEPS {
        let _s = rec.step();
        // Layer 1: top-4, expert 3 in every token, the others spread evenly.
        rec.moe_route(
            1u32,
            &[3, step % 8 + 8, (step + 1) % 8 + 8, (step + 2) % 8 + 8],
        );
        // Layer 2: perfectly balanced over its 16 experts, two tokens of top-4 a step.
        for t in 0..2 {
            let b = (step * 8 + t * 4) % EXPERTS;
            rec.moe_route(2u32, &[b, b + 1, b + 2, b + 3]);
        }
        // Lost to the record format or to the configured number of experts: counted.
        rec.moe_route(2u32, &[EXPERTS, 70_000]);
        rec.moe_route(Layer::NONE, &[0]);
    }
    p.flush();

    let load = p.expert_load();
    let l1 = load.layer(0, 1).expect("layer 1");
    let l2 = load.layer(0, 2).expect("layer 2");
    assert_eq!(l1.tokens.len(), EXPERTS as usize);
    assert_eq!(l1.total(), u64::from(STEPS * 4));
    assert_eq!(l1.tokens[3], u64::from(STEPS));
    assert_eq!(l2.total(), u64::from(STEPS * 2 * 4));
    assert!(l2.tokens.iter().all(|&t| t == 4), "{:?}", l2.tokens);
    assert_eq!(
        p.stats().dropped[DropReason::OutOfRange],
        u64::from(STEPS * 3),
        "per step: id 16 (>= 16 experts), id 70000 (> 65535), a route without a layer"
    );
    assert_eq!(load.hottest(1), vec![(0, 1, 3, u64::from(STEPS))]);

    let url = format!("http://{}/metrics", p.prometheus_addr().expect("endpoint"));
    let (code, body) = support::http_get(&url).expect("scrape");
    assert_eq!(code, 200, "{body}");
    let layer = |l: &'static str| [("layer", l), ("rank", "0")];
    assert_eq!(
        sample(&body, "phasetrace_moe_layer_tokens_total", &layer("1")),
        Some(f64::from(STEPS * 4)),
        "{body}"
    );
    assert_eq!(
        sample(&body, "phasetrace_moe_layer_tokens_total", &layer("2")),
        Some(f64::from(STEPS * 2 * 4))
    );
    assert_eq!(
        sample(
            &body,
            "phasetrace_records_dropped_total",
            &[("reason", "out_of_range")]
        ),
        Some(f64::from(STEPS * 3))
    );
    // Layer 2 is balanced: max / mean = 1, cv = 0. Layer 1: expert 3 got 8 of 32 tokens, the
    // mean over 16 experts is 2: imbalance 4.
    let imb = |l| sample(&body, "phasetrace_moe_expert_load_imbalance", &layer(l));
    assert_eq!(imb("2"), Some(1.0), "{body}");
    assert_eq!(imb("1"), Some(4.0));
    assert_eq!(
        sample(&body, "phasetrace_moe_expert_load_cv", &layer("2")),
        Some(0.0)
    );
    // Hot experts of layer 1: expert 3 (a quarter of the tokens) on EP rank 0 of 4 (experts
    // 0-3), then the hottest of the rest.
    let hot: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("phasetrace_moe_hot_expert_share{") && l.contains("layer=\"1\""))
        .collect();
    assert_eq!(hot.len(), 2, "{body}");
    assert!(
        hot.iter().any(|l| l.contains("expert=\"3\"")
            && l.contains("ep_rank=\"0\"")
            && l.ends_with(" 0.25")),
        "{hot:?}"
    );

    // The hot set of layer 1 is {3, 8} (8: the lowest id of the 3-token ties). In the next
    // window 3 and 8 get 16 tokens each and 9 gets 20: hotter, but not more than 1.25 x, so
    // the set stays; in the one after, 9 gets 24 (1.5 x) and takes 8's place.
    let hot_of = |body: &str| -> Vec<String> {
        let mut v: Vec<String> = body
            .lines()
            .filter(|l| {
                l.starts_with("phasetrace_moe_hot_expert_share{") && l.contains("layer=\"1\"")
            })
            .filter_map(|l| Some(l.split("expert=\"").nth(1)?.split('"').next()?.to_owned()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(hot_of(&body), ["3", "8"], "{body}");
    for extra in [4, 8] {
        for step in 0..STEPS {
            let _s = rec.step();
            rec.moe_route(1u32, &[3, 3, 8, 8]);
            rec.moe_route(1u32, &[9, 9, 1, 2]);
            if step < extra {
                rec.moe_route(1u32, &[9]);
            }
        }
        p.flush();
        let (_, body) = support::http_get(&url).expect("scrape");
        let want = if extra == 4 { ["3", "8"] } else { ["3", "9"] };
        assert_eq!(hot_of(&body), want, "9 got {} tokens: {body}", 16 + extra);
    }
    p.shutdown();
}
