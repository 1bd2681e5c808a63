//! docs/moe.md: the engine reports one MoE layer's routing.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = phasetrace::Profiler::builder()
        .with_level(phasetrace::SectionLevel::Full)
        .with_expert_counter(true)
        .build()?;
    let rec = profiler.recorder();
    let layer = 3u32;
    let expert_ids: Vec<u32> = vec![0, 5, 5, 17, 63, 2, 9, 11];
    let _step = rec.step();
    // {snippet}
    Ok(())
}
