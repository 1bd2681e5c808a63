//! docs/moe.md: reading the expert load in process.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = phasetrace::Profiler::builder()
        .with_level(phasetrace::SectionLevel::Full)
        .with_expert_counter(true)
        .build()?;
    // {snippet}
    Ok(())
}
