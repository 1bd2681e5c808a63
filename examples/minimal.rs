// The README's integration snippet, as a program: `cargo run --example minimal`.
use phasetrace::{Phase, Profiler, Section, SectionLevel, Site, SpecLevel, VerifyPart};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Defaults, then the environment (PHASETRACE_*, OTEL_*), then code: code wins, so the
    // levels set here hold whatever PHASETRACE_LEVEL and PHASETRACE_SPEC_LEVEL say (`off`
    // included). Leave a setter out to let the environment decide it.
    // Both levels are off by default: say what to record.
    let profiler = Profiler::builder()
        .with_level(SectionLevel::Full)
        .with_spec_level(SpecLevel::VerifySplit)
        .with_expert_counter(true) // tokens per (layer, expert): opt-in
        .build()?;
    let rec = profiler.recorder(); // one per engine thread

    for _token in 0..4 {
        let _step = rec.step(); // one decoded token: it ends when `_step` drops
        for layer in 0..8 {
            {
                let _mixer = rec.section(Section::KDA_MIXER, layer, Site::ATTN);
                let _recur = rec.section(Section::KDA_RECUR, layer, Site::ATTN); // nests
            }
            {
                let _probe = rec.section(Section::REDUCE_ATTN_BAR, layer, Site::ATTN); // arrival wait
            }
            {
                let _enq = rec.host_section(Section::REDUCE_ATTN_ENQ, layer, Site::ATTN); // never syncs
            }
            rec.moe_route(layer, &[3, 17, 42, 101]);
        }
    }

    // Speculative decoding: mark each phase as it ends, then the accepted count.
    let round = rec.round(4);
    round.phase(Phase::Draft);
    {
        let _kda = rec.verify_part(round.as_ref(), VerifyPart::Kda); // inside verify
    }
    round.phase(Phase::Verify);
    round.phase(Phase::Accept);
    round.end(3);

    profiler.flush(); // everything recorded so far is now on the endpoint
    if let Some(addr) = profiler.prometheus_addr() {
        println!("metrics at http://{addr}/metrics (press Enter to stop)");
        std::io::stdin().read_line(&mut String::new())?;
    }
    print!("{}", profiler.summary());
    profiler.shutdown(); // flushes and stops the exporters, bounded by a timeout
    Ok(())
}
