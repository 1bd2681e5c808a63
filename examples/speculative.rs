// Speculative decoding: one round per verified draft, each phase marked as it ends, the verify
// walk split into parts (level `verify`), and the accepted count at the end. The console line
// every 10 rounds shows the acceptance rate and the phase split.
//
// `cargo run --example speculative`

use phasetrace::{Phase, Profiler, Section, SectionLevel, Site, SpecLevel, VerifyPart};
use std::time::{Duration, Instant};

const K: u32 = 4;
const ROUNDS: u32 = 30;

fn work(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = Profiler::builder()
        .with_level(SectionLevel::Full)
        // Off by default: `phases` records rounds and phases, `verify` adds the verify parts.
        .with_spec_level(SpecLevel::VerifySplit)
        .with_spec_summary_every(10)
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()?;
    let rec = profiler.recorder();
    for n in 0..ROUNDS {
        let round = rec.round(K);
        work(Duration::from_micros(80)); // the draft model proposes K tokens
        round.phase(Phase::Draft);
        {
            let _kda = rec.verify_part(round.as_ref(), VerifyPart::Kda);
            let _scan = rec.verify_part(round.as_ref(), VerifyPart::KdaScan); // inside kda
            work(Duration::from_micros(120));
        }
        {
            let _mla = rec.verify_part(round.as_ref(), VerifyPart::Mla);
            work(Duration::from_micros(60));
        }
        {
            let _ffn = rec.verify_part(round.as_ref(), VerifyPart::Ffn);
            work(Duration::from_micros(40));
        }
        round.phase(Phase::Verify);
        let accepted = [4, 3, 2, 4, 1][n as usize % 5];
        {
            // Sections of the target model's step still work inside a round.
            let _step = rec.step();
            let _s = rec.section(Section::MOE_EXPERTS, 0u32, Site::MLP);
        }
        round.phase(Phase::Accept);
        if accepted < K {
            round.phase(Phase::Rollback);
        }
        round.end(accepted);
    }
    profiler.flush();
    let stats = profiler.stats();
    println!("{} rounds recorded", stats.rounds);
    profiler.shutdown();
    Ok(())
}
