//! The CUDA backend's kernels compile: every hand-written and generated kernel of the example
//! training programs (MLP, ResNet-20, a small convnet; and ResNet-20 at batch 128 as the CUDA
//! trainer lowers it, with batch-norm reductions in convolution epilogues, rendered for an H100)
//! and of an op-coverage graph is rendered, compiled by NVRTC for compute_80 and
//! compute_90, assembled by ptxas for sm_80 and sm_90 with zero spills (registers and shared
//! memory snapshotted), loaded by the emulated device (its PTX whitelist), and its parameter
//! struct matches the signature NVRTC emitted. Every GEMM tile is also forced through ptxas and
//! the emulated device. Needs NVRTC and ptxas (CI installs both); a
//! missing one fails these tests with a message saying so.

use crate::cuda_common::{self, Report, assemble};

use std::collections::BTreeMap;
use std::sync::OnceLock;
use towerpack::backend::cuda::nvrtc::{Arch, Compiler};
use towerpack::backend::cuda::render::{self, KernelPlan, RenderedKernel};
use towerpack::lower::{LowerOptions, Precision, Program};

fn compiler() -> &'static Compiler {
    static C: OnceLock<Compiler> = OnceLock::new();
    C.get_or_init(|| {
        cuda_common::require_nvrtc();
        Compiler::new(None).expect("NVRTC")
    })
}

fn programs() -> &'static Vec<(&'static str, Program)> {
    static P: OnceLock<Vec<(&'static str, Program)>> = OnceLock::new();
    P.get_or_init(|| {
        let mut v: Vec<(&'static str, Program)> = cuda_common::example_programs()
            .into_iter()
            .map(|(name, _, p)| (name, p))
            .collect();
        v.push(("ops", cuda_common::ops_program().1));
        v.push(("resnet20_b128", resnet20_b128()));
        v
    })
}

/// ResNet-20's training step at batch 128 as the CUDA trainer lowers it (batch-norm statistics
/// and gradient sums in convolution epilogues).
fn resnet20_b128() -> Program {
    let tg = cuda_common::resnet20();
    let options = towerpack::lower::LowerOptions {
        epilogue_reductions: true,
        ..towerpack::backend::cuda::CudaOptions::default().lowering()
    };
    towerpack::lower::lower(&tg.graph, &tg.step, 128, &options).expect("lower")
}

/// The distinct kernel sources of a program: source → (rendered kernel, indices using it).
fn distinct(p: &Program) -> BTreeMap<String, (RenderedKernel, Vec<usize>)> {
    let mut out: BTreeMap<String, (RenderedKernel, Vec<usize>)> = BTreeMap::new();
    for i in 0..p.kernels.len() {
        match render::render_kernel(p, i).expect("render") {
            KernelPlan::Launch(r) => out.entry(r.source()).or_insert((r, Vec::new())).1.push(i),
            KernelPlan::AllReduce { .. } | KernelPlan::Empty => {}
        }
    }
    out
}

fn label(p: &Program, ids: &[usize]) -> String {
    let k = &p.kernels[ids[0]];
    let more = if ids.len() > 1 {
        let rest: Vec<String> = ids[1..].iter().map(|i| format!("k{i}")).collect();
        format!(" (also {})", rest.join(" "))
    } else {
        String::new()
    };
    format!("k{} {} `{}`{more}", ids[0], k.kind.name(), k.name)
}

#[test]
fn generated_kernel_text_of_the_example_programs() {
    for (name, p) in programs() {
        // One entry per distinct generated part, in kernel order.
        let mut groups: Vec<(String, Vec<usize>, RenderedKernel)> = Vec::new();
        for i in 0..p.kernels.len() {
            let KernelPlan::Launch(r) = render::render_kernel(p, i).expect("render") else {
                continue;
            };
            let key = format!("{}\n{}", r.body.file(), r.generated);
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push(i),
                None => groups.push((key, vec![i], r)),
            }
        }
        let mut text = format!(
            "{} kernels, {} distinct generated parts\n",
            p.kernels.len(),
            groups.len()
        );
        for (_, ids, r) in &groups {
            text.push_str(&format!(
                "\n## {} -> kernels/{}, grid {:?}\n{}",
                label(p, ids),
                r.body.file(),
                r.launch.grid,
                r.generated
            ));
        }
        insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!(format!("cuda_generated_{name}"), text);
        });
    }
}

/// Kernel `ids[0]` of `p` (its `source`) compiled by NVRTC and assembled by ptxas for `arch`:
/// ptxas's report, and whether it spilled registers or used a stack.
fn assembled(p: &Program, ids: &[usize], source: &str, arch: Arch) -> (Report, bool) {
    let ptx = compiler()
        .compile(&p.kernels[ids[0]].name, source, arch)
        .unwrap_or_else(|e| panic!("{e}"));
    let rep = assemble(&ptx, arch);
    let spilled = rep.spill_stores + rep.spill_loads + rep.stack > 0;
    (rep, spilled)
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_without_spills() {
    for (name, p) in programs() {
        let mut table = String::from("kernel | body | sm_80 regs, smem | sm_90 regs, smem\n");
        let mut spills = Vec::new();
        let mut rows = Vec::new();
        for (source, (r, ids)) in distinct(p) {
            let mut cells = Vec::new();
            for arch in [Arch(80), Arch(90)] {
                let (rep, spilled) = assembled(p, &ids, &source, arch);
                if spilled {
                    spills.push(format!("{} on {}: {rep:?}", label(p, &ids), arch.sm()));
                }
                cells.push(format!("{}, {} B", rep.registers, rep.shared));
            }
            rows.push((
                ids[0],
                format!(
                    "{} | {} | {}\n",
                    label(p, &ids),
                    r.body.file(),
                    cells.join(" | ")
                ),
            ));
        }
        assert!(
            spills.is_empty(),
            "register spills or stack use:\n{}",
            spills.join("\n")
        );
        rows.sort();
        for (_, row) in rows {
            table.push_str(&row);
        }
        insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!(format!("cuda_registers_{name}"), table);
        });
    }
}

/// The convolutions with prologues of ResNet-20's b128 training step (`CudaOptions::
/// conv_prologues`, off by default), in f32 (SIMT tiles) and bf16 (the tensor cores, the 16
/// forward windows and 19 filter-gradient windows), assemble for sm_80 and sm_90 without
/// spills: their loaders hold where each slot came from and the prologue's operands, so their
/// launch bounds give them 3 blocks where the others take 4 (`render/fixed.rs min_blocks`).
#[test]
fn every_prologue_kernel_of_resnet20_b128_assembles_without_spills() {
    let mut spills = Vec::new();
    for precision in [Precision::Fp32, Precision::Bf16] {
        let tg = cuda_common::resnet20();
        let options = towerpack::backend::cuda::CudaOptions {
            conv_prologues: true,
            lower: LowerOptions {
                precision,
                ..LowerOptions::default()
            },
            ..Default::default()
        };
        let p =
            towerpack::lower::lower(&tg.graph, &tg.step, 128, &options.lowering()).expect("lower");
        let kernels: Vec<_> = distinct(&p)
            .into_iter()
            .filter(|(_, (r, _))| r.generated.contains("#define TP_PROLOGUE 1"))
            .collect();
        let launches: usize = kernels.iter().map(|(_, (_, ids))| ids.len()).sum();
        assert_eq!(
            launches, 38,
            "{precision}: 19 forward convolutions, 19 filter gradients"
        );
        for (source, (_, ids)) in &kernels {
            for arch in [Arch(80), Arch(90)] {
                let (rep, spilled) = assembled(&p, ids, source, arch);
                if spilled {
                    spills.push(format!(
                        "{precision}: {} on {}: {rep:?}",
                        label(&p, ids),
                        arch.sm()
                    ));
                }
            }
        }
    }
    assert!(
        spills.is_empty(),
        "register spills or stack use:\n{}",
        spills.join("\n")
    );
}

/// The GEMM-family kernels (convolutions and matrix products) of ResNet-20's b128 training
/// step in TF32, BF16 and FP16, as rendered for an H100 — tensor-core bodies, split K with
/// epilogue reductions — assemble for sm_80 and sm_90 without spills: the launch bounds that
/// give them 3 or 4 blocks per SM hold in every precision, not only in fp32. Among them the
/// stride-1 convolutions that read their input through windows: the 12 stage-1 forward and
/// input-gradient launches in every precision, and in bf16/fp16 the 10 of stage 2 too, whose
/// launches split K (TF32's 32-channel f32 window is over 48 KB), and the 5 stride-1 forward
/// convolutions of stage 3, on tiles of one 8×8 image by all 64 channels, K split in 4.
#[test]
fn every_tensor_core_gemm_of_resnet20_b128_assembles_without_spills() {
    let mut spills = Vec::new();
    for precision in [Precision::Tf32, Precision::Bf16, Precision::Fp16] {
        let tg = cuda_common::resnet20();
        let options = towerpack::lower::LowerOptions {
            epilogue_reductions: true,
            precision,
            ..towerpack::backend::cuda::CudaOptions::default().lowering()
        };
        let p = towerpack::lower::lower(&tg.graph, &tg.step, 128, &options).expect("lower");
        let kernels = distinct(&p);
        let launches_where = |what: &dyn Fn(&str) -> bool| -> usize {
            kernels
                .values()
                .filter(|(r, _)| what(&r.generated))
                .map(|(_, ids)| ids.len())
                .sum()
        };
        let windows = launches_where(&|g| g.contains("#define TP_WINDOW 1"));
        let split_windows = launches_where(&|g| {
            g.contains("#define TP_WINDOW 1") && !g.lines().any(|l| l == "#define TP_SPLIT_K 1")
        });
        let (want_windows, want_split) = if precision == Precision::Tf32 {
            (12, 0)
        } else {
            (27, 15)
        };
        assert_eq!(
            (windows, split_windows),
            (want_windows, want_split),
            "{precision}: window launches (all, with K split)"
        );
        let mut gemms = 0;
        for (source, (r, ids)) in kernels {
            let file = r.body.file();
            if !(file.starts_with("conv2d") || file == "matmul.cu") {
                continue;
            }
            gemms += 1;
            for arch in [Arch(80), Arch(90)] {
                let (rep, spilled) = assembled(&p, &ids, &source, arch);
                if spilled {
                    let what = label(&p, &ids);
                    spills.push(format!("{precision} {what} on {}: {rep:?}", arch.sm()));
                }
            }
        }
        assert!(gemms >= 10, "{precision}: {gemms} GEMM kernels");
    }
    assert!(
        spills.is_empty(),
        "register spills or stack use:\n{}",
        spills.join("\n")
    );
}

#[test]
fn every_kernel_passes_the_emulator_whitelist_and_matches_its_param_struct() {
    let dev = towerpack_ptx::Device::new(0);
    let mut failures = Vec::new();
    for (_, p) in programs() {
        for (source, (r, ids)) in distinct(p) {
            let ptx = compiler()
                .compile(&p.kernels[ids[0]].name, &source, Arch::EMULATED)
                .unwrap_or_else(|e| panic!("{e}"));
            let module = match dev.load_module(&ptx) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{}: {e}", label(p, &ids)));
                    continue;
                }
            };
            let kernel = module.kernel(r.body.entry()).expect("entry point");
            let params = kernel.params();
            let (_, size, align) = r.params.layout();
            assert_eq!(params.len(), 1, "{}: one struct parameter", label(p, &ids));
            assert_eq!(
                (params[0].size, params[0].align),
                (size, align),
                "{}: the descriptor's struct layout differs from NVRTC's",
                label(p, &ids)
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Packs random parameter structs, runs a kernel that echoes every field back on the emulated
/// device, and checks each value arrives: the host packing and NVRTC's struct layout agree for
/// any order of field sizes (the luminal bug: launch arguments not matching the signature).
#[test]
fn packed_parameters_arrive_field_by_field() {
    use rand::{Rng, SeedableRng};
    use towerpack::backend::cuda::bodies::COMMON;
    use towerpack::backend::cuda::render::{AddressOf, FieldKind, ParamStruct};
    use towerpack::lower::BufferId;
    use towerpack::tensor::DType;
    use towerpack_ptx::{Device, DevicePtr, KernelArgs, LaunchConfig};

    struct Addresses(u64);
    impl AddressOf for Addresses {
        fn buffer(&self, b: BufferId) -> u64 {
            self.0 + 0x100 * u64::from(b.0)
        }
        fn status(&self) -> u64 {
            0x5151_0000
        }
        fn workspace(&self) -> u64 {
            0x7171_0000
        }
    }
    let dev = Device::new(0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for case in 0..6 {
        let fields = rng.random_range(1..12);
        let out = dev.alloc(8 * (fields + 1)).expect("alloc");
        let mut p = ParamStruct::default();
        let mut expected = Vec::new();
        let mut body = String::new();
        for f in 0..fields {
            let name = format!("f{f}");
            let (kind, value, echo) = match rng.random_range(0..5) {
                0 => {
                    let v: i32 = rng.random();
                    (
                        FieldKind::I32(v),
                        u64::from(v as u32),
                        format!("(unsigned int)p.{name}"),
                    )
                }
                1 => {
                    let v: i64 = rng.random();
                    (
                        FieldKind::I64(v),
                        v as u64,
                        format!("(unsigned long long)p.{name}"),
                    )
                }
                2 => {
                    let v: f32 = rng.random();
                    let bits = u64::from(v.to_bits());
                    (
                        FieldKind::F32(v),
                        bits,
                        format!("__float_as_uint(p.{name})"),
                    )
                }
                3 => (
                    FieldKind::Status,
                    0x5151_0000,
                    format!("(unsigned long long)p.{name}"),
                ),
                _ => {
                    let (b, off) = (rng.random_range(0..4u32), rng.random_range(0..16usize));
                    let kind = FieldKind::Buffer {
                        buffer: BufferId(b),
                        offset: off,
                        dtype: DType::F32,
                        writable: false,
                    };
                    let addr = 0x1000_0000 + 0x100 * u64::from(b) + 4 * off as u64;
                    (kind, addr, format!("(unsigned long long)p.{name}"))
                }
            };
            p.push(name, kind);
            expected.push(value);
            body.push_str(&format!("    out[{f}] = {echo};\n"));
        }
        p.push(
            "out",
            FieldKind::Buffer {
                buffer: BufferId(0),
                offset: 0,
                dtype: DType::I64,
                writable: true,
            },
        );
        let source = format!(
            "{COMMON}\n{}extern \"C\" __global__ void tp_echo(const tp_params p) {{\n    \
             unsigned long long* out = (unsigned long long*)p.out;\n{body}}}\n",
            p.declaration()
        );
        let ptx = compiler()
            .compile("echo", &source, Arch::EMULATED)
            .unwrap_or_else(|e| panic!("{e}"));
        let module = dev.load_module(&ptx).expect("load");
        // Buffer 0 is the output; other buffer fields only carry their addresses.
        // Buffer fields echo made-up addresses; the last field is the real output.
        let mut packed = p.pack(&Addresses(0x1000_0000));
        let (offsets, _, _) = p.layout();
        packed[offsets[fields]..offsets[fields] + 8].copy_from_slice(&out.0.to_le_bytes());
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
        };
        dev.launch(&module, "tp_echo", cfg, KernelArgs::Packed(&packed))
            .expect("launch");
        let mut host = vec![0u8; 8 * fields];
        dev.copy_dtoh(&mut host, DevicePtr(out.0))
            .expect("read back");
        for (f, want) in expected.iter().enumerate() {
            let got = u64::from_le_bytes(host[8 * f..8 * f + 8].try_into().expect("8 bytes"));
            assert_eq!(got, *want, "case {case}, field {f}:\n{}", p.declaration());
        }
    }
}

#[test]
fn compile_errors_carry_the_generated_source_and_the_nvrtc_log() {
    let source = "extern \"C\" __global__ void broken() { undeclared_name = 1; }\n";
    let err = compiler()
        .compile("layer/broken", source, Arch::EMULATED)
        .expect_err("does not compile");
    let text = err.to_string();
    assert!(text.contains("kernel `layer/broken`"), "{text}");
    assert!(text.contains("undeclared_name"), "{text}");
    assert!(text.contains("error"), "NVRTC's log: {text}");
    assert!(
        text.contains("    1 | extern \"C\""),
        "numbered source: {text}"
    );
}

#[test]
fn compiled_ptx_is_cached_on_disk_by_source_and_arch() {
    cuda_common::require_nvrtc();
    let dir = tempfile::tempdir().expect("tempdir");
    let source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n";
    let first = Compiler::new(Some(dir.path().to_path_buf())).expect("nvrtc");
    let a = first.compile("k", source, Arch(80)).expect("compile");
    first.compile("k", source, Arch(80)).expect("memory hit");
    assert_eq!(first.compilations(), 1);
    first.compile("k", source, Arch(90)).expect("other arch");
    assert_eq!(
        first.compilations(),
        2,
        "the architecture is part of the key"
    );
    let files = std::fs::read_dir(dir.path()).expect("cache dir").count();
    assert_eq!(files, 2);
    let second = Compiler::new(Some(dir.path().to_path_buf())).expect("nvrtc");
    let b = second.compile("k", source, Arch(80)).expect("disk hit");
    assert_eq!(second.compilations(), 0, "served from disk");
    assert_eq!(a, b);
    assert!(b.contains(".target sm_80"));
}

/// Work of a launch in lane-iterations: points of elementwise kernels and reductions (points
/// folded), multiply-adds of the GEMM family, window reads of pooling.
fn work(p: &Program, k: &towerpack::lower::Kernel) -> usize {
    use towerpack::lower::KernelKind as K;
    let out: usize = k
        .outputs
        .iter()
        .map(|&b| p.buffer(b).len())
        .max()
        .unwrap_or(0);
    match &k.kind {
        K::Elementwise { shape, .. } | K::Reduce { shape, .. } => shape.iter().product(),
        K::MatMul(g, _) => g.batch * g.m * g.n * g.k,
        K::Conv2d(g, ..) => g.n * g.oh * g.ow * g.o * g.kh * g.kw * g.c / g.groups.max(1),
        K::Conv2dBackpropInput(g, _) => g.n * g.h * g.w * g.c * g.kh * g.kw * g.o / g.groups.max(1),
        K::Conv2dBackpropFilter(g, ..) => {
            g.n * g.oh * g.ow * g.o * g.kh * g.kw * g.c / g.groups.max(1)
        }
        K::Pool(g) | K::MaxPoolGrad(g) | K::AvgPoolGrad(g) => {
            g.n * g.h * g.w * g.c * g.window[0] * g.window[1]
        }
        _ => out,
    }
}

/// ResNet-20's training step at batch 128 as the CUDA trainer lowers it (batch-norm statistics
/// and gradient sums in convolution epilogues), rendered for an H100 (132 SMs): no kernel with
/// more than a million lane-iterations of work runs on fewer blocks than the GPU has SMs. The
/// per-launch table (`--nocapture`) is the one in `kernels/README.md`.
#[test]
fn resnet20_at_batch_128_fills_an_h100() {
    use towerpack::backend::cuda::render::Target;
    let p = resnet20_b128();
    let h100 = Target::default();
    let mut idle = Vec::new();
    let mut table = String::from("k | kernel | grid | blocks | block | work | workspace B\n");
    for (i, k) in p.kernels.iter().enumerate() {
        let KernelPlan::Launch(r) = render::render_kernel_for(&p, i, &h100).expect("render") else {
            continue;
        };
        let blocks: u64 = r.launch.grid.iter().map(|&g| u64::from(g)).product();
        let w = work(&p, k);
        table.push_str(&format!(
            "k{i} | {} `{}` | {:?} | {blocks} | {} | {w} | {}\n",
            k.kind.name(),
            k.name,
            r.launch.grid,
            r.launch.block[0],
            r.workspace_bytes
        ));
        if w > 1_000_000 && blocks < u64::from(h100.multiprocessors) {
            idle.push(format!(
                "k{i} {} `{}`: {blocks} blocks for {w}",
                k.kind.name(),
                k.name
            ));
        }
    }
    println!("{table}");
    assert!(
        idle.is_empty(),
        "launches leaving the GPU idle:\n{}",
        idle.join("\n")
    );
    let in_epilogues: usize = p
        .kernels
        .iter()
        .filter_map(|k| k.kind.epilogue())
        .map(|e| e.reductions.len())
        .sum();
    assert!(
        in_epilogues > 0,
        "batch-norm reductions are in convolution epilogues"
    );
}

/// Every GEMM tile of `render::launch::TILES`, forced on a matrix product: it assembles for
/// sm_80 and sm_90 without spills, and multiplies correctly on the emulated device — edges that
/// are not multiples of the tile with 4-float loads on one operand only, and a long K split
/// across blocks with 4-float loads on both.
#[test]
fn every_gemm_tile_assembles_without_spills_and_multiplies_on_the_emulated_device() {
    use rand::{Rng, SeedableRng};
    use towerpack::backend::Step;
    use towerpack::backend::cuda::render::launch::TILES;
    use towerpack::backend::cuda::render::{AddressOf, Target};
    use towerpack::ir::{Graph, Op, Shape, TensorType, Value};
    use towerpack::lower::BufferId;
    use towerpack_ptx::{Device, DevicePtr, KernelArgs, LaunchConfig};

    struct Addresses(std::collections::HashMap<BufferId, u64>, u64);
    impl AddressOf for Addresses {
        fn buffer(&self, b: BufferId) -> u64 {
            self.0[&b]
        }
        fn status(&self) -> u64 {
            0
        }
        fn workspace(&self) -> u64 {
            self.1
        }
    }
    let dev = Device::new(0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut failures = Vec::new();
    let mut table =
        String::from("tile bm x bn (tm x tn) | m x n x k | sm_80 regs, smem | sm_90 regs, smem\n");
    for (m, n, k) in [(100usize, 70usize, 40usize), (64, 36, 1000)] {
        let mut g = Graph::new();
        let input = |g: &mut Graph, name: &str, ty| {
            let op = Op::Input {
                name: name.into(),
                ty,
            };
            Value::first(g.add_node(name, op, &[]).expect("input"))
        };
        let a = input(&mut g, "a", TensorType::f32(Shape::batched(&[k])));
        let b = input(&mut g, "b", TensorType::f32(Shape::fixed(&[k, n])));
        let op = Op::MatMul {
            transpose_a: false,
            transpose_b: false,
        };
        let c = Value::first(g.add_node("c", op, &[a, b]).expect("matmul"));
        let step = Step::new(vec![c], Vec::new());
        let p = towerpack::lower::lower(
            &g,
            &step,
            m,
            &towerpack::backend::cuda::CudaOptions::default().lowering(),
        )
        .expect("lower");
        let index = p
            .kernels
            .iter()
            .position(|k| matches!(k.kind, towerpack::lower::KernelKind::MatMul(..)))
            .expect("a matmul kernel");
        let kernel = &p.kernels[index];
        let av: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let want: Vec<f64> = (0..m * n)
            .map(|i| {
                let (r, col) = (i / n, i % n);
                (0..k)
                    .map(|j| f64::from(av[r * k + j]) * f64::from(bv[j * n + col]))
                    .sum()
            })
            .collect();
        for tile in TILES {
            let target = Target {
                tile: Some(tile),
                ..Target::default()
            };
            let KernelPlan::Launch(r) =
                render::render_kernel_for(&p, index, &target).expect("render")
            else {
                panic!("a launch")
            };
            assert!(
                r.generated
                    .contains(&format!("#define TP_BM ((int){})", tile.bm))
            );
            let source = r.source();
            let mut cells = Vec::new();
            for arch in [Arch(80), Arch(90)] {
                let ptx = compiler()
                    .compile("tile", &source, arch)
                    .unwrap_or_else(|e| panic!("{e}"));
                let rep = assemble(&ptx, arch);
                if rep.spill_stores + rep.spill_loads + rep.stack > 0 {
                    failures.push(format!("{tile:?} on {}: {rep:?}", arch.sm()));
                }
                cells.push(format!("{}, {} B", rep.registers, rep.shared));
            }
            table.push_str(&format!(
                "{}x{} ({}x{}) | {m}x{n}x{k} | {}\n",
                tile.bm,
                tile.bn,
                tile.tm,
                tile.tn,
                cells.join(" | ")
            ));
            let ptx = compiler()
                .compile("tile", &source, Arch::EMULATED)
                .unwrap_or_else(|e| panic!("{e}"));
            let module = dev.load_module(&ptx).expect("load");
            let mut at = std::collections::HashMap::new();
            let upload = |values: &[f32]| {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let ptr = dev.alloc(bytes.len().max(4)).expect("alloc");
                dev.copy_htod(ptr, &bytes).expect("upload");
                ptr.0
            };
            at.insert(kernel.inputs[0].buffer, upload(&av));
            at.insert(kernel.inputs[1].buffer, upload(&bv));
            at.insert(kernel.outputs[0], upload(&vec![f32::NAN; m * n]));
            let ws = dev.alloc(r.workspace_bytes.max(4)).expect("workspace").0;
            let packed = r.params.pack(&Addresses(at.clone(), ws));
            let cfg = LaunchConfig {
                grid: r.launch.grid,
                block: r.launch.block,
                shared_bytes: 0,
            };
            // Twice: the second launch reuses the workspace the first left ready.
            let mut results = Vec::new();
            for _ in 0..2 {
                dev.launch(&module, "tp_matmul", cfg, KernelArgs::Packed(&packed))
                    .expect("launch");
                let mut bytes = vec![0u8; m * n * 4];
                dev.copy_dtoh(&mut bytes, DevicePtr(at[&kernel.outputs[0]]))
                    .expect("read back");
                results.push(bytes);
            }
            assert_eq!(results[0], results[1], "{tile:?}: bitwise repeatable");
            let got: Vec<f32> = results[0]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let scale = want.iter().fold(1.0f64, |s, v| s.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (f64::from(*g) - w).abs() / scale)
                .fold(
                    0.0f64,
                    |e, x| if x.is_nan() { f64::INFINITY } else { e.max(x) },
                );
            if err > 1e-5 {
                failures.push(format!("{tile:?} on {m}x{n}x{k}: error {err:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("cuda_registers_gemm_tiles", table);
    });
}

/// Convolution prologues (`LowerOptions::conv_prologues`, the CPU's default) render for CUDA:
/// the forward convolutions and filter gradients of ResNet-20 in f32, bf16 and TF32 — TF32's on
/// the SIMT tiles, since its tensor-core tiles copy x with `cp.async` and cannot compute it on
/// the way. The CUDA session lowers with them only where `CudaOptions::conv_prologues` asks,
/// and never under TF32.
#[test]
fn convolution_prologues_render_and_tf32_s_on_the_simt_tiles() {
    let tg = cuda_common::resnet20();
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Tf32] {
        // f32 activations, as the CUDA kernels read them.
        let options = LowerOptions {
            precision,
            half_activations: false,
            ..LowerOptions::default()
        };
        let p = towerpack::lower::lower(&tg.graph, &tg.step, 2, &options).expect("lower");
        let ks: Vec<usize> = (0..p.kernels.len())
            .filter(|&i| p.kernels[i].kind.prologue().is_some())
            .collect();
        assert_eq!(
            ks.len(),
            38,
            "ResNet-20: 19 convolutions, forward and filter gradient"
        );
        for i in ks {
            let name = &p.kernels[i].name;
            let generated = match render::render_kernel(&p, i) {
                Ok(KernelPlan::Launch(r)) => r.generated,
                Ok(_) => panic!("{precision:?}: {name}: not a launch"),
                Err(e) => panic!("{precision:?}: {name}: {e}"),
            };
            assert!(
                generated.contains("#define TP_PROLOGUE 1") && generated.contains("tp_prologue("),
                "{precision:?}: {name}: no prologue hook"
            );
            let tensor = generated.contains("#define TP_TF32 1");
            let want = precision == Precision::Bf16;
            assert_eq!(
                tensor, want,
                "{precision:?}: {name}: tensor-core tiles {tensor}"
            );
        }
    }
    let session = |conv_prologues, precision| {
        let options = towerpack::backend::cuda::CudaOptions {
            conv_prologues,
            lower: LowerOptions {
                precision,
                ..LowerOptions::default()
            },
            ..Default::default()
        };
        let p =
            towerpack::lower::lower(&tg.graph, &tg.step, 2, &options.lowering()).expect("lower");
        p.kernels
            .iter()
            .filter(|k| k.kind.prologue().is_some())
            .count()
    };
    assert_eq!(session(false, Precision::Bf16), 0, "off by default");
    assert_eq!(session(true, Precision::Bf16), 38);
    assert_eq!(session(true, Precision::Tf32), 0, "never under TF32");
}
