//! Throughput of the `phasetrace import` parser over a generated log of about 50 MB held in
//! memory, beside a baseline that only splits the same bytes into lines.
//!
//! The log mixes the four formats with unrelated lines in roughly the proportions of a profiled
//! GLM server with route tracing on: most lines are `tracing` output that is not a candidate,
//! a quarter are `GLMTRACE` lines, and every eighth step prints a decode-profile table.
//!
//! Run: `cargo bench -p phasetrace-import --bench import_parse`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use phasetrace_import::{ImportOptions, Importer};

const TARGET_BYTES: usize = 50 << 20;

fn timestamp(ms: u64) -> String {
    // 2026-09-30T12:00:00Z plus `ms`, within one day.
    let s = ms / 1000;
    format!(
        "2026-09-30T{:02}:{:02}:{:02}.{:06}Z",
        12 + s / 3600 % 12,
        s / 60 % 60,
        s % 60,
        ms % 1000 * 1000
    )
}

fn generate() -> Vec<u8> {
    const TARGET: &str = "metrale_model_arch::glm5next_layer::profile";
    const BUCKETS: [(&str, u64); 8] = [
        ("moe_experts", 60),
        ("kda_mixer", 45),
        ("dsa_attend", 15),
        ("reduce_mlp", 78),
        ("reduce_attn", 78),
        ("moe_router", 60),
        ("mhc", 78),
        ("norm", 156),
    ];
    let mut out = String::with_capacity(TARGET_BYTES + (1 << 20));
    let mut ms = 0u64;
    let mut step = 0u64;
    while out.len() < TARGET_BYTES {
        ms += 7;
        let ts = timestamp(ms);
        for i in 0..6 {
            out += &format!(
                "{ts}  INFO metrale_server::http: POST /v1/completions 200 request_id={:08x} latency_ms={}.{}\n",
                step * 6 + i,
                step % 97,
                i
            );
        }
        out += &format!(
            "{ts} DEBUG metrale_engine::sched: batch size 4, kv blocks {}/4096\n",
            step % 4096
        );
        for layer in 0..2 {
            for site in ["attn", "mlp"] {
                out += &format!(
                    "{ts}  WARN {TARGET}: GLMTRACE step={step} site={site} L={layer} moe={layer} bar_us={}.{} ids=3,17,42,101,7,88,250,12\n",
                    10 + step % 50,
                    step % 10
                );
            }
        }
        step += 1;
        if step.is_multiple_of(8) {
            out += &format!(
                "{ts}  WARN {TARGET}: GLM decode profile after {step} steps — 5.82 ms/token measured under profiling\n"
            );
            for (name, calls) in BUCKETS {
                out += &format!(
                    "  {name:<13} {:>8.2} ms/tok  {:>6.1}%  {calls:>5} calls/tok  {:>7.1} us/call\n",
                    0.73, 12.5, 9.3
                );
            }
            out += "\n";
            out += "[glm5-phase] rounds=16 k=4 total=42.92ms | draft=6.60 verify=33.63 accept=1.58 roll=0.73 maint=0.38 | per-round ms: draft=0.412 verify=2.102 accept=0.099 roll=0.046 maint=0.023 total=2.682\n";
            out += "[glm5-phase-v] rounds=16 k=4 | per-round ms: vkda=0.801 (scan=0.123) vmla=0.402 vrest=0.898 (vffn=0.612)\n";
        }
    }
    out.into_bytes()
}

fn parse(c: &mut Criterion) {
    let data = generate();
    let mut group = c.benchmark_group("import_parse");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);
    group.bench_function("baseline_split_lines", |b| {
        b.iter(|| black_box(&data).split(|&b| b == b'\n').count())
    });
    group.bench_function("importer_mixed_50mb", |b| {
        b.iter(|| {
            let options = ImportOptions {
                start_unix_nanos: Some(0),
                ..ImportOptions::default()
            };
            let importer = match Importer::new(black_box(&data[..]), options) {
                Ok(importer) => importer,
                Err(e) => panic!("in-memory input: {e}"),
            };
            importer.filter(Result::is_ok).count()
        })
    });
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
