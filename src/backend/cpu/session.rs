//! `CpuSession`: the fast CPU backend behind the [`Session`] interface.
//!
//! Each distinct (step, batch size) is lowered once and cached as a [`Prepared`] program; a run
//! copies the feeds in, runs the kernels on a private rayon pool, applies the write-backs and
//! copies the fetches out. Variables live in per-device state arenas laid out by
//! [`StateLayout`], shared by every program of the session. A program spread over several
//! logical devices runs one thread per logical device, on the worker pool of the CPU
//! [`Device`] its [`Placement`] gives it (the cores are split between the workers).

use super::exec::Prepared;
use super::kernels::simd::{SimdLevel, with_level};
use super::memory::{Arena, RawBuf};
use crate::backend::binding::{self, ProgramCache};
use crate::backend::poison::PoisonScratch;
use crate::backend::{BackendError, Collective, Device, Feed, Placement, Session, Step};
use crate::ir::{Graph, Op, VarId, verify};
use crate::lower::{LowerOptions, Precision, StateLayout, lower};
use crate::tensor::HostTensor;

/// Options of the CPU backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuOptions {
    /// Worker threads (0: one per core).
    pub threads: usize,
    pub lower: LowerOptions,
    /// Time every kernel (see [`CpuSession::profile_report`]); also on when the environment
    /// variable `TOWERPACK_PROFILE` is set.
    pub profile: bool,
    /// When the scratch arenas are filled with signalling NaNs (see
    /// [`crate::backend::poison`]): at allocation, or also before every step.
    pub poison_scratch: PoisonScratch,
    /// The SIMD level this session's kernels run at (`None`: [`SimdLevel::max`], the detected
    /// level capped by `TOWERPACK_SIMD`); a level above that is capped, never an error
    /// ([`CpuSession::simd_level`] says which runs). Sessions of one process may run different
    /// levels side by side. GEMMs follow it too, through the `gemm` crate's own AVX2 and scalar
    /// drivers (the crate's API cannot cap its choice; see `kernels::gemm`).
    pub simd: Option<SimdLevel>,
    /// Whether bf16 convolutions may run on AMX tiles where the CPU has them
    /// (`kernels::conv::amx`; `TOWERPACK_AMX=0` turns them off for the whole process). Off,
    /// they multiply the same bf16-rounded operands on the vector units.
    pub amx: AmxUse,
    /// Whether f32 3×3 stride-1 convolutions may run Winograd F(4×4, 3×3)
    /// (`kernels::conv::winograd`: fewer multiplications, ~10× the rounding error of the direct
    /// kernels; `TOWERPACK_WINOGRAD=0` turns it off for the whole process). bf16 and fp16
    /// programs never do: their convolutions sum exact products of 16-bit operands.
    pub winograd: WinogradUse,
}

/// Whether a session's f32 convolutions may run Winograd ([`CpuOptions::winograd`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WinogradUse {
    /// Where it runs and pays off (3×3, stride 1, 16 channels or more in and out).
    #[default]
    Auto,
    /// Never: every convolution on the direct kernels (or im2col + GEMM).
    Off,
}

/// Whether a session's bf16 convolutions may use AMX tiles ([`CpuOptions::amx`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AmxUse {
    /// Where the CPU has AMX-BF16 and the SIMD level in force is `avx512`.
    #[default]
    Auto,
    /// Never: bf16 convolutions run on the vector units.
    Off,
}

/// The warning for asking more worker threads than the machine has cores (each step then pays
/// for the threads' contention, which can make it many times slower); `None` when `threads`
/// fits in `cores`.
pub fn oversubscription_warning(threads: usize, cores: usize) -> Option<String> {
    (threads > cores).then(|| {
        format!(
            "{threads} CPU worker threads asked for, but this machine has {cores} cores: \
             oversubscribed threads make every step slower (0 means one per core)"
        )
    })
}

/// The warning for training in a precision that is slower than fp32 on the CPU: fp16 (the
/// convolutions round their operands to f16 and multiply in f32 on the vector units), and bf16
/// without AMX tiles (`tiles`: the CPU has AMX-BF16, the session may use it and runs at
/// `avx512`) — measured on ResNet-20 at batch 128: fp16 0.93–0.95× fp32, bf16 without tiles
/// 0.91× (0.68× on an AMD EPYC Zen 4 since fp32 runs its 3×3 convolutions as Winograd, which
/// bf16 does not take: 606 against 887 img/s, 2026-11-29), bf16 on tiles 1.35–1.37×
/// (1.18–1.23× since fp32 runs Winograd). `None` for fp32, TF32 (f32 arithmetic on a CPU)
/// and bf16 on tiles.
pub fn precision_warning(precision: Precision, tiles: bool) -> Option<String> {
    match precision {
        Precision::Fp16 => Some(
            "fp16 on the CPU rounds the matrix products' and convolutions' operands to f16 and \
             multiplies them in f32: expect it to be slower than fp32 (it shows fp16's \
             numerics; bf16 on a CPU with AMX is the fast 16-bit precision)"
                .to_string(),
        ),
        Precision::Bf16 if !tiles => Some(
            "bf16 without AMX tiles (this CPU lacks AMX-BF16, TOWERPACK_AMX=0, \
             CpuOptions::amx or a SIMD level below avx512): the convolutions multiply \
             bf16-rounded operands in f32 on the vector units, without fp32's Winograd: \
             expect it to be slower than fp32 (ResNet-20: 0.68x on an AMD EPYC Zen 4)"
                .to_string(),
        ),
        _ => None,
    }
}

/// A graph bound to CPU memory.
pub struct CpuSession {
    graph: Graph,
    layout: StateLayout,
    state: Vec<Arena>,
    /// Prepared programs by (step, batch).
    programs: ProgramCache<Prepared>,
    pool: rayon::ThreadPool,
    threads: usize,
    options: CpuOptions,
    /// The distributed job this session takes part in, if any (carries out all-reduces).
    collective: Option<std::sync::Arc<dyn Collective>>,
    /// Where each logical device runs (all CPU devices).
    placement: Placement,
    /// One worker pool per CPU device in use, made when a program first spans several logical
    /// devices (the cores are split between them).
    device_pools: Vec<(Device, rayon::ThreadPool)>,
}

impl CpuSession {
    /// Binds `graph` (verified first) to fresh, zeroed variables. Errors when `TOWERPACK_SIMD`
    /// is set to something other than a SIMD level.
    pub fn new(graph: Graph, options: CpuOptions) -> Result<CpuSession, BackendError> {
        verify(&graph)?;
        SimdLevel::from_env().map_err(|e| BackendError::Unavailable {
            backend: "cpu".into(),
            reason: e.to_string(),
        })?;
        if options.lower.half_gradients && options.lower.stores_half() {
            return Err(BackendError::Unavailable {
                backend: "cpu".into(),
                reason: "LowerOptions::half_gradients is on, and the CPU convolutions read `dy` \
                         in f32 only (leave it off: the CUDA backend sets it for itself)"
                    .into(),
            });
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if options.threads == 0 {
            cores
        } else {
            options.threads
        };
        if let Some(message) = oversubscription_warning(threads, cores) {
            log::warn!(target: "towerpack", "{message}");
        }
        let level = options.simd.unwrap_or_else(SimdLevel::max).capped();
        let tiles = options.amx == AmxUse::Auto
            && level == SimdLevel::Avx512
            && super::kernels::conv::amx::available();
        if let Some(message) = precision_warning(options.lower.precision, tiles) {
            // Once per process: a trainer opens several sessions (training, inference).
            static WARNED: std::sync::Mutex<Vec<Precision>> = std::sync::Mutex::new(Vec::new());
            let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
            if !warned.contains(&options.lower.precision) {
                warned.push(options.lower.precision);
                log::warn!(target: "towerpack", "{message}");
            }
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| BackendError::Unavailable {
                backend: "cpu".into(),
                reason: format!("cannot start {threads} worker threads: {e}"),
            })?;
        let layout = StateLayout::new(&graph);
        let state = layout.arena_bytes.iter().map(|&b| Arena::new(b)).collect();
        Ok(CpuSession {
            graph,
            layout,
            state,
            programs: ProgramCache::default(),
            pool,
            threads,
            options,
            collective: None,
            placement: Placement::default(),
            device_pools: Vec::new(),
        })
    }

    /// Runs logical device `i` on `placement`'s device `i` (by default `Device::Cpu(i)`).
    /// Logical devices placed on the same device share its worker pool. Errors, naming the
    /// device, when one is not a CPU device.
    pub fn place(&mut self, placement: &Placement) -> Result<(), BackendError> {
        if let Some(d) = placement.devices.iter().flatten().find(|d| !d.is_cpu()) {
            return Err(BackendError::Unavailable {
                backend: "cpu".into(),
                reason: format!(
                    "device {d} is not a CPU device (the CPU backend runs cpu:N and host)"
                ),
            });
        }
        self.placement = placement.clone();
        self.device_pools.clear();
        Ok(())
    }

    /// The CPU device logical device `logical` runs on.
    pub fn device_of(&self, logical: usize) -> Device {
        self.placement.device(logical, Device::Cpu)
    }

    /// Makes sure every CPU device of logical devices `0..devices` has a worker pool; the
    /// cores are split evenly between the devices of the placement (at least one thread each).
    fn ensure_device_pools(&mut self, devices: usize) -> Result<(), BackendError> {
        let placed = devices.max(self.placement.devices.len());
        let mut wanted: Vec<Device> = (0..placed).map(|d| self.device_of(d)).collect();
        wanted.sort();
        wanted.dedup();
        if wanted
            .iter()
            .all(|d| self.device_pools.iter().any(|(p, _)| p == d))
        {
            return Ok(());
        }
        let per = (self.threads / wanted.len()).max(1);
        self.device_pools = wanted
            .into_iter()
            .map(|device| {
                let name = device.to_string();
                rayon::ThreadPoolBuilder::new()
                    .num_threads(per)
                    .thread_name(move |i| format!("towerpack-{name}-{i}"))
                    .build()
                    .map(|pool| (device, pool))
            })
            .collect::<Result<_, _>>()
            .map_err(|e| BackendError::Unavailable {
                backend: "cpu".into(),
                reason: format!("cannot start device worker threads: {e}"),
            })?;
        Ok(())
    }

    /// Where time went, when profiling: one line per kernel (all programs), slowest first, then
    /// totals per kernel kind.
    pub fn profile_report(&self) -> String {
        use std::collections::BTreeMap;
        use std::fmt::Write as _;
        let mut rows: Vec<(std::time::Duration, u64, String, &'static str)> = Vec::new();
        let mut kinds: BTreeMap<&'static str, std::time::Duration> = BTreeMap::new();
        for p in self.programs.iter() {
            let Some(t) = p.timings() else { continue };
            for (k, &(d, n)) in p.program.kernels.iter().zip(t) {
                rows.push((d, n, k.name.clone(), k.kind.name()));
                *kinds.entry(k.kind.name()).or_default() += d;
            }
        }
        rows.sort_by_key(|r| std::cmp::Reverse(r.0));
        let total: std::time::Duration = rows.iter().map(|r| r.0).sum();
        let mut out = String::new();
        let _ = writeln!(out, "kernel time {:.3} s; by kind:", total.as_secs_f64());
        let mut by_kind: Vec<_> = kinds.into_iter().collect();
        by_kind.sort_by_key(|k| std::cmp::Reverse(k.1));
        for (kind, d) in by_kind {
            let share = 100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-12);
            let _ = writeln!(out, "  {kind:<26} {:>9.3} s {share:5.1}%", d.as_secs_f64());
        }
        let _ = writeln!(out, "slowest kernels:");
        for (d, n, name, kind) in rows.iter().take(25) {
            let per = d.as_secs_f64() * 1e3 / (*n).max(1) as f64;
            let _ = writeln!(out, "  {per:9.3} ms x{n:<6} {kind:<24} {name}");
        }
        out
    }

    /// Joins a distributed job: `Op::AllReduce` kernels reduce across its participants.
    pub fn set_collective(&mut self, collective: std::sync::Arc<dyn Collective>) {
        self.collective = Some(collective);
    }

    /// The number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The SIMD level this session's kernels run at: [`CpuOptions::simd`] (or
    /// [`SimdLevel::max`]) capped by what this CPU and `TOWERPACK_SIMD` allow.
    pub fn simd_level(&self) -> SimdLevel {
        self.options.simd.unwrap_or_else(SimdLevel::max).capped()
    }

    /// The lowered program of `step` for `batch`, compiling it on first use.
    pub fn program(
        &mut self,
        step: &Step,
        batch: usize,
    ) -> Result<&crate::lower::Program, BackendError> {
        self.prepared(step, batch).map(|p| &p.program)
    }

    fn prepared(&mut self, step: &Step, batch: usize) -> Result<&mut Prepared, BackendError> {
        if self.programs.get(step, batch).is_none() {
            let program =
                lower(&self.graph, step, batch, &self.options.lower).map_err(BackendError::from)?;
            let mut prepared = Prepared::new(program)?;
            prepared.set_profiling(
                self.options.profile || std::env::var_os("TOWERPACK_PROFILE").is_some(),
            );
            prepared.set_bf16_tiles(self.options.amx == AmxUse::Auto);
            prepared.set_winograd(self.options.winograd == WinogradUse::Auto);
            self.programs.insert(step, batch, prepared);
        }
        self.programs
            .get_mut(step, batch)
            .ok_or_else(|| BackendError::Unavailable {
                backend: "cpu".into(),
                reason: "program cache lost an entry".into(),
            })
    }
}

fn state_raw(
    state: &mut [Arena],
    layout: &StateLayout,
    var: VarId,
    dtype: crate::tensor::DType,
) -> Option<RawBuf> {
    let slot = layout.slots.get(var.0 as usize)?;
    let arena = state.get_mut(usize::from(slot.device))?;
    Some(RawBuf {
        ptr: arena.ptr().wrapping_add(slot.offset),
        dtype,
        len: slot.bytes / dtype.size_bytes(),
    })
}

impl Session for CpuSession {
    fn join_collective(
        &mut self,
        collective: std::sync::Arc<dyn Collective>,
    ) -> Result<(), BackendError> {
        self.set_collective(collective);
        Ok(())
    }

    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn run(&mut self, step: &Step, feeds: &[Feed]) -> Result<Vec<HostTensor>, BackendError> {
        let batch = binding::bind_feeds(&self.graph, feeds)?;
        let devices = self.prepared(step, batch)?.program.devices();
        if devices > 1 {
            self.ensure_device_pools(devices)?;
        }
        let placed: Vec<Device> = (0..devices)
            .filter(|_| devices > 1)
            .map(|d| self.device_of(d))
            .collect();
        let device_pools: Vec<&rayon::ThreadPool> = placed
            .into_iter()
            .map(|device| {
                self.device_pools
                    .iter()
                    .find(|(p, _)| *p == device)
                    .map(|(_, pool)| pool)
                    .ok_or_else(|| BackendError::Unavailable {
                        backend: "cpu".into(),
                        reason: format!("no worker pool for device {device}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        let threads = self.threads;
        // Split borrows: the graph, pool and state are used while the program is borrowed.
        let graph = &self.graph;
        let pool = &self.pool;
        let layout = &self.layout;
        let state = &mut self.state;
        let prepared = self
            .programs
            .get_mut(step, batch)
            .ok_or_else(|| BackendError::UnknownValue("program".into()))?;
        if self.options.poison_scratch == PoisonScratch::EveryStep {
            prepared.poison_scratch();
        }
        for i in 0..prepared.program.feeds.len() {
            let (node, b) = prepared.program.feeds[i];
            let value = feeds
                .iter()
                .find(|(n, _)| *n == node)
                .map(|(_, t)| t)
                .ok_or_else(|| BackendError::MissingFeed {
                    input: match &graph.node(node).op {
                        Op::Input { name, .. } => name.clone(),
                        _ => graph.node(node).name.clone(),
                    },
                })?;
            let raw = prepared.raw(state, b)?;
            // SAFETY: the feed's shape was checked against the input, whose buffer has exactly
            // that many elements for this batch size.
            unsafe { raw.write_host(0, value) };
        }
        let collective = self.collective.as_deref();
        // The kernels run at the session's level on whichever thread runs them (the device
        // threads and the kernels' parallel tasks carry it along).
        let level = self.options.simd.unwrap_or_else(SimdLevel::max).capped();
        if devices > 1 {
            prepared.run_kernels_on_devices(state, &device_pools, collective, level)?;
        } else if prepared.is_small() {
            with_level(level, || prepared.run_kernels(state, 1, collective))?;
        } else {
            pool.install(|| {
                with_level(level, || prepared.run_kernels(state, threads, collective))
            })?;
        }
        // Fetches first: a fetched variable read must see the value the step began with, and
        // write-backs overwrite it.
        let mut out = Vec::with_capacity(prepared.program.fetches.len());
        for i in 0..prepared.program.fetches.len() {
            let region = &prepared.program.fetches[i];
            let (buffer, offset, shape) = (region.buffer, region.offset, region.shape.clone());
            let raw = prepared.raw(state, buffer)?;
            // SAFETY: the region lies in its buffer (lowering).
            out.push(unsafe { raw.to_host(offset, &shape) });
        }
        for i in 0..prepared.program.writebacks.len() {
            let (region, var) = prepared.program.writebacks[i].clone();
            let src = prepared.raw(state, region.buffer)?;
            let def = graph.variable(var);
            let dst = state_raw(state, layout, var, def.ty.dtype)
                .ok_or(BackendError::UnknownVariable(var.0))?;
            let n: usize = region.shape.iter().product();
            // SAFETY: the region lies in its buffer (lowering) and has the variable's type, so it
            // fits the variable's slot; a write-back never copies a slot onto itself.
            unsafe { dst.copy_from(0, &src, region.offset, n) };
        }
        Ok(out)
    }

    fn read_variable(&self, var: VarId) -> Result<HostTensor, BackendError> {
        let (def, shape) = binding::variable(&self.graph, var, None)?;
        let slot = self.layout.slot(var);
        let bytes =
            &self.state[usize::from(slot.device)].bytes()[slot.offset..slot.offset + slot.bytes];
        binding::variable_from_bytes(def, &shape, bytes)
    }

    fn write_variable(&mut self, var: VarId, value: &HostTensor) -> Result<(), BackendError> {
        binding::variable(&self.graph, var, Some(value))?;
        let slot = self.layout.slot(var);
        let bytes = value.to_le_bytes();
        self.state[usize::from(slot.device)].bytes_mut()[slot.offset..slot.offset + slot.bytes]
            .copy_from_slice(&bytes);
        Ok(())
    }
}
