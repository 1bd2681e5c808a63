// Timing an engine's CUDA stream through cudarc: give the profiler the stream and let
// `PHASETRACE_TIMING` pick the backend (`events` here, set in code: CUDA events recorded on
// the stream and resolved off the hot path). The work between boundaries is device memsets.
//
// Without an NVIDIA driver this prints why and exits with status 1; it never panics.
//
// `cargo run --example cuda_stream --features cuda`

use phasetrace::timing::cuda;
use phasetrace::{Profiler, Section, SectionLevel, Site, Timing};

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda_stream: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = cuda::open_device(0)?; // a clear error without a driver or a GPU
    let stream = ctx.new_stream()?;
    let profiler = Profiler::builder()
        .with_level(SectionLevel::Full)
        .with_timing(Timing::Events)
        .with_stream(stream.clone())
        .with_prometheus_at(([127, 0, 0, 1], 0))
        .build()?;
    let rec = profiler.recorder();
    let mut buf = stream.alloc_zeros::<u8>(64 << 20)?;
    for _token in 0..10 {
        let _step = rec.step();
        for layer in 0..4 {
            let _s = rec.section(Section::MOE_EXPERTS, layer, Site::MLP);
            stream.memset_zeros(&mut buf)?; // enqueued: the section times it on the device
        }
    }
    stream.synchronize()?;
    profiler.flush();
    print!("{}", profiler.summary());
    let stats = profiler.stats();
    println!("{} sections timed on the device", stats.sections);
    profiler.shutdown();
    Ok(())
}
