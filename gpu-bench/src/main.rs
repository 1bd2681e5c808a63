//! A decode loop of real CUDA kernels, timed by phasetrace's clocks, eagerly and as a CUDA graph.
//!
//! ```text
//! token:  step { layer x L: [spin 40µs] [spin 25µs] [spin 60µs] [spin 10µs] [GEMM up] [GEMM down] }
//!         then synchronize (the host reads the sampled token)
//! modes:  eager: unprofiled | host clock | sync clock | events clock
//!         graph: unprofiled | events clock (sections captured, timed at every replay read)
//! ```
//!
//! The spin kernels busy-wait on the GPU's `%globaltimer` for a known time (shipped as PTX, so
//! neither NVRTC nor a compiler is needed where this runs); the GEMMs are cuBLAS fp16 GEMMs of
//! decode shapes (8 tokens through a 4096 x 14336 MLP), used only where cuBLAS loads. One run
//! prints one table: tokens/s per mode and its ratio to unprofiled, graph replays read, and each
//! section's measured duration per clock against its known duration, with the goals
//! (events >= 0.99x unprofiled eagerly, >= 0.98x under graphs; sections within 5 % or 2 µs).
//!
//! Every row is a `FIGURE\t<name>\t<value>\t<goal>\t<verdict>` line on stdout, which
//! `scripts/gpu-check.sh` gathers into its table. Without a driver it exits with status 2 and one
//! clear line, before touching the GPU.

use cudarc::cublas::sys as blas;
use cudarc::driver::{CudaContext, CudaStream, result, sys};
use phasetrace::timing::Clock;
use phasetrace::timing::cuda::{self, CudaEventClock, CudaSyncClock, TimingError};
use phasetrace::{Profiler, Recorder, Section, SectionLevel, Site, Timing};
use std::collections::BTreeMap;
use std::ffi::{CString, c_void};
use std::process::ExitCode;
use std::ptr;
use std::sync::Arc;
use std::time::Instant;

/// A kernel that spins for `ns` nanoseconds of the GPU's global timer, on one thread.
const SPIN_PTX: &str = r#"
.version 6.0
.target sm_50
.address_size 64

.visible .entry spin(
    .param .u64 spin_param_0
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [spin_param_0];
    mov.u64 %rd2, %globaltimer;
$L_spin:
    mov.u64 %rd3, %globaltimer;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $L_spin;
    ret;
}
"#;

/// The spin sections of one layer and their known device time in µs.
const SPINS: [(Section, u64); 4] = [
    (Section::KDA_MIXER, 40),
    (Section::DSA_ATTEND, 25),
    (Section::MLP_DENSE, 60),
    (Section::REDUCE_ATTN, 10),
];
/// The GEMM section (no known duration: compared across clocks only).
const GEMM_SECTION: Section = Section::MOE_EXPERTS;
/// Decode GEMM shapes: `TOKENS` tokens through a `HIDDEN` x `FFN` MLP (up, then down), fp16.
const TOKENS: i32 = 8;
const HIDDEN: i32 = 4096;
const FFN: i32 = 14336;

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("{0}")]
    Cuda(#[from] TimingError),
    #[error("CUDA driver call {call} failed: {detail}")]
    Driver { call: &'static str, detail: String },
    #[error("cuBLAS call {call} failed: {status:?}")]
    Blas {
        call: &'static str,
        status: blas::cublasStatus_t,
    },
    #[error("{0}")]
    Profiler(#[from] phasetrace::Error),
    #[error(
        "{arg}: {why} (usage: phasetrace-gpu-bench [--probe] [--steps N] [--warmup N] [--layers N] [--no-gemm])"
    )]
    Args { arg: String, why: &'static str },
}

fn drv(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> BenchError {
    move |e| BenchError::Driver {
        call,
        detail: e.to_string(),
    }
}

fn check_blas(call: &'static str, status: blas::cublasStatus_t) -> Result<(), BenchError> {
    if status == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(BenchError::Blas { call, status })
    }
}

struct Args {
    /// Only check for a usable driver and device 0, print the device, and exit.
    probe: bool,
    steps: u32,
    warmup: u32,
    layers: u32,
    gemm: bool,
}

impl Args {
    fn parse() -> Result<Args, BenchError> {
        let mut a = Args {
            probe: false,
            steps: 300,
            warmup: 30,
            layers: 16,
            gemm: true,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut number = |arg: &str| -> Result<u32, BenchError> {
                it.next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or(BenchError::Args {
                        arg: arg.to_owned(),
                        why: "expected a whole number above 0",
                    })
            };
            match arg.as_str() {
                "--steps" => a.steps = number(&arg)?,
                "--warmup" => a.warmup = number(&arg)?,
                "--layers" => a.layers = number(&arg)?,
                "--no-gemm" => a.gemm = false,
                "--probe" => a.probe = true,
                _ => {
                    return Err(BenchError::Args {
                        arg,
                        why: "unknown argument",
                    });
                }
            }
        }
        Ok(a)
    }
}

/// Driver symbols this binary calls beyond the ones `cuda::probe` checks.
const BENCH_SYMBOLS: &[&str] = &[
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8Async",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuDeviceGetName",
];

/// The loaded spin kernel.
struct Spin {
    module: sys::CUmodule,
    func: sys::CUfunction,
}

impl Spin {
    fn load(ctx: &Arc<CudaContext>) -> Result<Spin, BenchError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let ptx = CString::new(SPIN_PTX).map_err(|_| BenchError::Driver {
            call: "cuModuleLoadData",
            detail: "the PTX contains a NUL byte".into(),
        })?;
        let mut module = ptr::null_mut();
        // SAFETY: `ptx` is a NUL-terminated PTX image; the context is current.
        unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) }
            .result()
            .map_err(drv("cuModuleLoadData"))?;
        let mut func = ptr::null_mut();
        // SAFETY: the module was just loaded and exports `spin`.
        let got = unsafe { sys::cuModuleGetFunction(&mut func, module, c"spin".as_ptr()) }.result();
        if let Err(e) = got {
            // SAFETY: unloads the module loaded above.
            let _ = unsafe { sys::cuModuleUnload(module) };
            return Err(drv("cuModuleGetFunction")(e));
        }
        Ok(Spin { module, func })
    }

    fn launch(&self, stream: &CudaStream, us: u64) -> Result<(), BenchError> {
        let mut ns: u64 = us * 1_000;
        let mut params = [(&mut ns as *mut u64).cast::<c_void>()];
        // SAFETY: `spin` takes one u64 parameter; the stream belongs to the module's context.
        unsafe {
            sys::cuLaunchKernel(
                self.func,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream.cu_stream(),
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        }
        .result()
        .map_err(drv("cuLaunchKernel"))
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        // SAFETY: loaded by `load`, unloaded once.
        let _ = unsafe { sys::cuModuleUnload(self.module) };
    }
}

/// A device buffer, freed on drop.
struct Buf(sys::CUdeviceptr);

impl Buf {
    fn zeroed(stream: &CudaStream, bytes: usize) -> Result<Buf, BenchError> {
        // SAFETY: plain allocation and memset in the stream's (current) context.
        unsafe {
            let p = result::malloc_sync(bytes).map_err(drv("cuMemAlloc"))?;
            let b = Buf(p);
            result::memset_d8_async(p, 0, bytes, stream.cu_stream())
                .map_err(drv("cuMemsetD8Async"))?;
            Ok(b)
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed`, freed once.
        let _ = unsafe { result::free_sync(self.0) };
    }
}

/// cuBLAS fp16 GEMMs of decode shapes on the engine stream.
struct Gemm {
    handle: blas::cublasHandle_t,
    w_up: Buf,
    w_down: Buf,
    x: Buf,
    h: Buf,
    y: Buf,
    _workspace: Buf,
}

impl Gemm {
    /// `None` when cuBLAS is not on the loader path (reported, not an error).
    fn new(stream: &CudaStream) -> Result<Option<Gemm>, BenchError> {
        // SAFETY: only tries to open the library.
        if !unsafe { blas::is_culib_present() } {
            return Ok(None);
        }
        // SAFETY: the library is present; looking symbols up does not call them.
        let lib = unsafe { blas::culib() };
        for name in [
            "cublasCreate_v2",
            "cublasDestroy_v2",
            "cublasSetStream_v2",
            "cublasSetWorkspace_v2",
            "cublasGemmEx",
        ] {
            // SAFETY: looked up only.
            if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
                return Ok(None);
            }
        }
        let half = 2usize;
        let (t, d, f) = (TOKENS as usize, HIDDEN as usize, FFN as usize);
        let w_up = Buf::zeroed(stream, d * f * half)?;
        let w_down = Buf::zeroed(stream, f * d * half)?;
        let x = Buf::zeroed(stream, t * d * half)?;
        let h = Buf::zeroed(stream, t * f * half)?;
        let y = Buf::zeroed(stream, t * d * half)?;
        // A fixed workspace keeps cuBLAS from allocating while the stream is captured.
        let workspace = Buf::zeroed(stream, 32 << 20)?;
        let mut handle = ptr::null_mut();
        // SAFETY: the symbols are present; `handle` is a valid out-pointer.
        unsafe {
            check_blas("cublasCreate_v2", blas::cublasCreate_v2(&mut handle))?;
            let g = Gemm {
                handle,
                w_up,
                w_down,
                x,
                h,
                y,
                _workspace: workspace,
            };
            check_blas(
                "cublasSetStream_v2",
                blas::cublasSetStream_v2(handle, stream.cu_stream().cast()),
            )?;
            check_blas(
                "cublasSetWorkspace_v2",
                blas::cublasSetWorkspace_v2(handle, g._workspace.0 as *mut c_void, 32 << 20),
            )?;
            Ok(Some(g))
        }
    }

    /// `out[m x n] = w[k x m]^T-free column-major GEMM: m x k times k x n`, fp16 in, fp32 compute.
    fn gemm(&self, m: i32, k: i32, w: &Buf, x: &Buf, out: &Buf) -> Result<(), BenchError> {
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: the buffers hold m*k, k*TOKENS and m*TOKENS fp16 values.
        let status = unsafe {
            blas::cublasGemmEx(
                self.handle,
                blas::cublasOperation_t::CUBLAS_OP_N,
                blas::cublasOperation_t::CUBLAS_OP_N,
                m,
                TOKENS,
                k,
                (&alpha as *const f32).cast(),
                w.0 as *const c_void,
                blas::cudaDataType::CUDA_R_16F,
                m,
                x.0 as *const c_void,
                blas::cudaDataType::CUDA_R_16F,
                k,
                (&beta as *const f32).cast(),
                out.0 as *mut c_void,
                blas::cudaDataType::CUDA_R_16F,
                m,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        check_blas("cublasGemmEx", status)
    }

    /// The MLP of one layer for the decode batch: up then down.
    fn mlp(&self) -> Result<(), BenchError> {
        self.gemm(FFN, HIDDEN, &self.w_up, &self.x, &self.h)?;
        self.gemm(HIDDEN, FFN, &self.w_down, &self.h, &self.y)
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { blas::cublasDestroy_v2(self.handle) };
    }
}

/// The engine: its stream, kernels and shape.
struct Engine {
    stream: Arc<CudaStream>,
    spin: Spin,
    gemm: Option<Gemm>,
    layers: u32,
}

impl Engine {
    /// The layers of one token, with sections on `rec` when given.
    fn layers(&self, rec: Option<&Recorder>) -> Result<(), BenchError> {
        for layer in 0..self.layers {
            for (section, us) in SPINS {
                let _s = rec.map(|r| r.section(section, layer, Site::ATTN));
                self.spin.launch(&self.stream, us)?;
            }
            if let Some(g) = &self.gemm {
                let _s = rec.map(|r| r.section(GEMM_SECTION, layer, Site::MLP));
                g.mlp()?;
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), BenchError> {
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ClockKind {
    None,
    Host,
    Sync,
    Events,
}

struct Mode {
    name: &'static str,
    clock: ClockKind,
    graph: bool,
}

const MODES: [Mode; 6] = [
    Mode {
        name: "eager unprofiled",
        clock: ClockKind::None,
        graph: false,
    },
    Mode {
        name: "eager host clock",
        clock: ClockKind::Host,
        graph: false,
    },
    Mode {
        name: "eager sync clock",
        clock: ClockKind::Sync,
        graph: false,
    },
    Mode {
        name: "eager events clock",
        clock: ClockKind::Events,
        graph: false,
    },
    Mode {
        name: "graph unprofiled",
        clock: ClockKind::None,
        graph: true,
    },
    Mode {
        name: "graph events clock",
        clock: ClockKind::Events,
        graph: true,
    },
];

/// What one mode measured.
struct Outcome {
    tokens_per_s: f64,
    /// µs per call by section name, from the profiler's summary.
    sections: BTreeMap<String, f64>,
    stats: phasetrace::Stats,
}

fn profiler(e: &Engine, kind: ClockKind) -> Result<Option<Profiler>, BenchError> {
    let b = Profiler::builder()
        .without_env()
        .with_level(SectionLevel::Full)
        .without_prometheus()
        .with_trace_every(0);
    let clock: Arc<dyn Clock> = match kind {
        ClockKind::None => return Ok(None),
        ClockKind::Host => return Ok(Some(b.with_timing(Timing::Host).build()?)),
        ClockKind::Sync => Arc::new(CudaSyncClock::new(e.stream.clone())?),
        ClockKind::Events => Arc::new(CudaEventClock::new(e.stream.clone())?),
    };
    let timing = if kind == ClockKind::Sync {
        Timing::Sync
    } else {
        Timing::Events
    };
    Ok(Some(b.with_timing(timing).with_clock(clock).build()?))
}

fn run_mode(e: &Engine, mode: &Mode, a: &Args) -> Result<Outcome, BenchError> {
    let p = profiler(e, mode.clock)?;
    let rec = p.as_ref().map(Profiler::recorder);
    let rec = rec.as_ref();
    let graph = if mode.graph {
        e.sync()?;
        e.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .map_err(drv("cuStreamBeginCapture"))?;
        let capture = rec.map(Recorder::begin_capture);
        let captured = e.layers(rec);
        let ended = e.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        match (captured, ended) {
            (Ok(()), Ok(Some(g))) => Some((g, capture.map(|c| c.finish()))),
            (Err(err), _) => return Err(err),
            (Ok(()), Ok(None)) => {
                return Err(BenchError::Driver {
                    call: "cuStreamEndCapture",
                    detail: "no graph was captured".into(),
                });
            }
            (Ok(()), Err(err)) => return Err(drv("cuStreamEndCapture")(err)),
        }
    } else {
        None
    };
    let token = |rec: Option<&Recorder>| -> Result<(), BenchError> {
        let _step = rec.map(Recorder::step);
        match &graph {
            Some((g, handle)) => {
                let replay = match (rec, handle) {
                    (Some(r), Some(h)) => Some(r.replay(h)),
                    _ => None,
                };
                g.launch().map_err(drv("cuGraphLaunch"))?;
                drop(replay);
            }
            None => e.layers(rec)?,
        }
        // The host reads the sampled token.
        e.sync()
    };
    for _ in 0..a.warmup {
        token(rec)?;
    }
    let t0 = Instant::now();
    for _ in 0..a.steps {
        token(rec)?;
    }
    let took = t0.elapsed();
    let (sections, stats) = match &p {
        Some(p) => {
            p.flush();
            (per_call_us(&p.summary()), p.stats())
        }
        None => (BTreeMap::new(), phasetrace::Stats::default()),
    };
    drop(graph);
    if let Some(p) = p {
        p.shutdown();
    }
    Ok(Outcome {
        tokens_per_s: f64::from(a.steps) / took.as_secs_f64().max(1e-9),
        sections,
        stats,
    })
}

/// `bucket -> µs/call` from the console summary table.
fn per_call_us(summary: &str) -> BTreeMap<String, f64> {
    summary
        .lines()
        .skip(2)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() == 5)
                .then(|| Some((cols[0].to_owned(), cols[4].parse().ok()?)))
                .flatten()
        })
        .collect()
}

fn figure(name: &str, value: String, goal: &str, verdict: &str) {
    println!("FIGURE\t{name}\t{value}\t{goal}\t{verdict}");
}

fn within(measured: f64, known: f64) -> bool {
    (measured - known).abs() <= (0.05 * known).max(2.0)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("phasetrace-gpu-bench: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), BenchError> {
    let a = Args::parse()?;
    cuda::probe()?;
    // SAFETY: the probe found the library; symbols are only looked up.
    let lib = unsafe { sys::culib() };
    for name in BENCH_SYMBOLS {
        // SAFETY: looked up only.
        if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
            return Err(TimingError::CudaUnavailable {
                detail: format!("the NVIDIA driver library lacks {name} (driver too old?)"),
            }
            .into());
        }
    }
    let ctx = cuda::open_device(0)?;
    let name = ctx.name().unwrap_or_else(|_| "unknown".into());
    if a.probe {
        println!("device 0: {name}");
        return Ok(());
    }
    let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
    let spin = Spin::load(&ctx)?;
    let gemm = if a.gemm { Gemm::new(&stream)? } else { None };
    let e = Engine {
        stream,
        spin,
        gemm,
        layers: a.layers,
    };
    e.sync()?;
    figure("device", name, "", "");
    figure(
        "decode loop",
        format!(
            "{} layers x ({} spin kernels{}), {} tokens after {} warm-up",
            a.layers,
            SPINS.len(),
            if e.gemm.is_some() {
                format!(", cuBLAS fp16 GEMMs {TOKENS}x{HIDDEN}x{FFN} up+down")
            } else if a.gemm {
                ", no cuBLAS on the loader path: GEMMs skipped".to_owned()
            } else {
                String::new()
            },
            a.steps,
            a.warmup
        ),
        "",
        "",
    );

    let started = Instant::now();
    let mut out = Vec::new();
    for mode in &MODES {
        out.push(run_mode(&e, mode, &a)?);
    }
    let by = |name: &str| MODES.iter().position(|m| m.name == name).map(|i| &out[i]);
    let (Some(eager), Some(graph)) = (by("eager unprofiled"), by("graph unprofiled")) else {
        unreachable!("both unprofiled modes are in MODES");
    };
    for (mode, o) in MODES.iter().zip(&out) {
        let base = if mode.graph { graph } else { eager };
        let ratio = o.tokens_per_s / base.tokens_per_s;
        let (goal, ok) = match (mode.clock, mode.graph) {
            (ClockKind::Events, false) => (">= 0.99x", ratio >= 0.99),
            (ClockKind::Events, true) => (">= 0.98x", ratio >= 0.98),
            _ => ("", true),
        };
        figure(
            &format!("tokens/s {}", mode.name),
            format!("{:.1} ({ratio:.3}x)", o.tokens_per_s),
            goal,
            if goal.is_empty() {
                ""
            } else if ok {
                "met"
            } else {
                "MISSED"
            },
        );
        if mode.graph && mode.clock == ClockKind::Events {
            let s = &o.stats;
            figure(
                "graph replays read / counted unreadable",
                format!(
                    "{} / {} of {} launches",
                    s.graph_replays,
                    s.dropped_graph_replays,
                    a.steps + a.warmup
                ),
                "",
                "",
            );
        }
    }
    let known: Vec<(String, Option<f64>)> = SPINS
        .iter()
        .map(|(s, us)| (s.as_str().to_owned(), Some(*us as f64)))
        .chain(
            e.gemm
                .as_ref()
                .map(|_| (GEMM_SECTION.as_str().to_owned(), None)),
        )
        .collect();
    for (section, k) in &known {
        for (mode, o) in MODES.iter().zip(&out) {
            if mode.clock == ClockKind::None {
                continue;
            }
            let measured = o.sections.get(section).copied();
            // The goal is the events clock's; the sync clock is shown beside for comparison.
            let judged = mode.clock == ClockKind::Events;
            let (goal, verdict) = match (k, measured, judged) {
                (Some(k), Some(m), true) => (
                    format!("{k:.1} µs ±5 % or 2 µs"),
                    if within(m, *k) { "met" } else { "MISSED" },
                ),
                (Some(k), None, true) => (format!("{k:.1} µs"), "MISSING"),
                (Some(k), _, false) if mode.clock == ClockKind::Host => {
                    (format!("known {k:.1} µs (host: enqueue time)"), "")
                }
                (Some(k), _, false) => (format!("known {k:.1} µs (for comparison)"), ""),
                (None, _, _) => ("(sync vs events)".to_owned(), ""),
            };
            figure(
                &format!("{section} µs/call, {}", mode.name),
                measured.map_or("-".into(), |m| format!("{m:.1}")),
                &goal,
                verdict,
            );
        }
    }
    figure(
        "benchmark wall time",
        format!("{:.1} s", started.elapsed().as_secs_f64()),
        "",
        "",
    );
    Ok(())
}
