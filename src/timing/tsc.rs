//! The x86-64 time-stamp counter: reading it, and whether the CPU and the kernel vouch for it.
//!
//! This is the method of the `quanta` crate (`rdtsc`, invariant-TSC detection through CPUID),
//! written out here rather than depended on: `quanta` calibrates once, at its first clock, and
//! never again, and keeps its calibration private, so its scaled readings drift from the OS
//! monotonic clock and cannot be put on the process timeline that the sync, simulated and CUDA
//! clocks resolve to ([`super::now_ns`]). The timeline needs the raw counter and its own
//! calibration, refreshed ([`super::timeline`]); what is left of `quanta` for that is two
//! intrinsics from `core::arch` and two CPUID leaves, not worth `raw-cpuid`, `crossbeam-utils`
//! and `once_cell` in every engine that links phasetrace.

/// Why this machine's TSC cannot be used (the timeline says it as a
/// [`super::HostSourceReason`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unusable {
    /// Not an x86-64 CPU.
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    NotX86_64,
    /// No invariant TSC (CPUID `8000_0007h` EDX bit 8).
    NoInvariantTsc,
    /// The kernel's clocksource is this one, not `tsc`.
    KernelClocksource(String),
}

/// Reads the time-stamp counter: one `rdtsc`, no fence.
///
/// Unfenced, the read may move by a few dozen cycles against the instructions around it, which is
/// far below the microsecond-scale sections it brackets; a fence (or `rdtscp`) would double its
/// cost. Callers only construct a TSC reader after [`check`] found the counter usable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn read() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 CPU and has no preconditions; it is only an
    // `unsafe fn` on older toolchains.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

/// Not x86-64: there is no TSC. Never called: [`check`] refuses the TSC here, so the timeline
/// runs on the monotonic clock and neither a reader nor a calibration reads the counter.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn read() -> u64 {
    0
}

/// Whether the CPU reports an invariant TSC (constant rate in every P-, C- and T-state), and the
/// kernel has kept the TSC as its clocksource.
///
/// The kernel checks that the counters of all CPUs are synchronized and watches the TSC against
/// another clock, marking it unstable when it drifts (virtualized TSCs that hypervisors do not
/// keep steady are the usual case); a kernel that uses another clocksource has either found the
/// TSC wanting or been told not to trust it, and phasetrace follows it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn check() -> Result<(), Unusable> {
    use core::arch::x86_64::__cpuid;
    // SAFETY: CPUID exists on every x86-64 CPU; leaves above the maximum reported one are not
    // queried (checked first). `unsafe fn` on older toolchains only.
    #[allow(unused_unsafe)]
    let (has_tsc, invariant) = unsafe {
        let has_tsc = __cpuid(1).edx & (1 << 4) != 0;
        let max_ext = __cpuid(0x8000_0000).eax;
        let invariant = max_ext >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0;
        (has_tsc, invariant)
    };
    if !has_tsc || !invariant {
        return Err(Unusable::NoInvariantTsc);
    }
    match kernel_clocksource() {
        Some(cs) if cs != "tsc" => Err(Unusable::KernelClocksource(cs)),
        _ => Ok(()),
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn check() -> Result<(), Unusable> {
    Err(Unusable::NotX86_64)
}

/// The kernel's current clocksource (Linux), if it can be read.
#[cfg(target_arch = "x86_64")]
fn kernel_clocksource() -> Option<String> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
