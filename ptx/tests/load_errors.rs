//! Unsupported or malformed PTX fails at load time with the kernel name, PTX line and text.

use towerpack_ptx::{LoadError, Module};

fn kernel(body: &str) -> String {
    format!(
        ".version 8.8\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n\
         .reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n.reg .pred %p<2>;\n{body}\nret;\n}}\n"
    )
}

fn load_err(body: &str) -> LoadError {
    Module::load(&kernel(body)).expect_err(body)
}

#[test]
fn unsupported_instruction_names_kernel_line_and_text() {
    let e = load_err("mov.u32 %r1, 1;\nwmma.load.a.sync.aligned.row.m16n16k16.f16 {%r1}, [%rd1];");
    assert_eq!(e.kernel.as_deref(), Some("k"));
    assert_eq!(e.line, 10);
    assert!(e.text.starts_with("wmma.load"), "{e}");
    assert!(e.to_string().contains("kernel `k`, PTX line 10"), "{e}");
}

#[test]
fn every_rejection_carries_a_line() {
    let cases = [
        ("add.cc.u32 %r1, %r2, %r3;", "modifier"),
        ("shfl.down.b32 %r1, %r2, 1, 31;", "shfl.sync"),
        ("bra $missing;", "undefined label"),
        ("add.u32 %r1, %r9, %r2;", "undeclared"),
        ("add.u32 %r1, %rd1, %r2;", "not a 32-bit"),
        ("div.f32 %r1, %r2, %r3;", "div.f32"),
        ("bar.sync 0, 64;", "thread count"),
        ("call foo;", "unsupported instruction"),
        ("ld.const.f32 %r1, [%rd1];", "modifier"),
        ("cvt.f32.s32 %r1, %r2;", "needs .rn"),
        ("cvt.rn.s32.f32 %r1, %r2;", "needs .rni"),
        ("atom.global.inc.u64 %rd1, [%rd2], %rd3;", "32-bit only"),
        (
            "tex.2d.v4.f32.f32 {%r1, %r2, %r3, %r0}, [%rd1, {%r1, %r2}];",
            "unsupported",
        ),
    ];
    for (body, needle) in cases {
        let e = load_err(body);
        assert_eq!(e.line, 9, "{body}: {e}");
        assert_eq!(e.kernel.as_deref(), Some("k"), "{body}");
        assert!(e.to_string().contains(needle), "{body}: {e}");
    }
}

#[test]
fn cache_hints_and_qualified_state_spaces_are_accepted() {
    let m = Module::load(&kernel(
        "ld.global.nc.L1::no_allocate.L2::128B.u32 %r1, [%rd1];\n\
         ld.shared::cta.u32 %r2, [%rd1];\nst.global.L1::evict_last.u32 [%rd1], %r1;",
    ));
    assert!(m.is_ok(), "{m:?}");
}

#[test]
fn syntax_errors_have_lines_too() {
    let e = Module::load(".version 8.8\n.target sm_80\n.address_size 64\n.visible .entry k(\n.param .u64 p\n{\nret;\n}").unwrap_err();
    assert_eq!(e.line, 6, "{e}");
    let e = Module::load(".version 8.8\n.global .f32 g;\n").unwrap_err();
    assert!(e.to_string().contains("module-scope"), "{e}");
    let e = Module::load(".version 8.8\n.address_size 32\n").unwrap_err();
    assert_eq!(e.line, 2, "{e}");
}

#[test]
fn unsupported_tensor_core_forms_name_what_is_missing() {
    let cases = [
        (
            "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%r1,%r2}, {%r1,%r2,%r3,%r0}, \
             {%r1,%r2}, {%r1,%r2};",
            "f32 is",
        ),
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.tf32.tf32.f32 {%r1,%r2,%r3,%r0}, \
             {%r1,%r2,%r3,%r0}, {%r1,%r2}, {%r1,%r2,%r3,%r0};",
            "tf32 mma has shapes",
        ),
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%r1,%r2,%r3,%r0}, \
             {%r1,%r2}, {%r1,%r2}, {%r1,%r2,%r3,%r0};",
            "takes 4 registers",
        ),
        (
            "mma.m16n8k16.row.col.f32.bf16.bf16.f32 {%r1,%r2,%r3,%r0}, {%r1,%r2,%r3,%r0}, \
             {%r1,%r2}, {%r1,%r2,%r3,%r0};",
            ".sync.aligned",
        ),
        (
            "ldmatrix.sync.aligned.m16n16.x1.shared.b8 {%r1}, [%r2];",
            "m8n8 is supported",
        ),
        (
            "cp.async.cg.shared.global [%r1], [%rd1], 8;",
            "cp.async.cg copies 16 bytes",
        ),
        (
            "cp.async.ca.shared.global [%r1], [%rd1], 12;",
            "4, 8 or 16 bytes",
        ),
        (
            "cp.async.bulk.shared::cluster.global [%r1], [%rd1], 16, [%rd2];",
            "unsupported cp.async form",
        ),
        (
            "cvt.rna.relu.tf32.f32 %r1, %r2;",
            "unsupported cvt to .tf32",
        ),
        ("cvt.rna.f16.f32 %r1, %r2;", ".rna is only defined"),
    ];
    for (body, needle) in cases {
        let e = load_err(body);
        assert_eq!(e.line, 9, "{body}: {e}");
        assert_eq!(e.kernel.as_deref(), Some("k"), "{body}");
        assert!(e.to_string().contains(needle), "{body}: {e}");
    }
}

#[test]
fn tensor_core_forms_nvrtc_and_cutlass_emit_are_accepted() {
    let m = Module::load(&kernel(
        "cp.async.cg.shared.global.L2::cache_hint [%r1], [%rd1], 16, %rd2;\n\
         cp.async.ca.shared.global [%r1], [%rd1], 16, 8;\n\
         cp.async.ca.shared.global [%r1], [%rd1], 4, %p1;\n\
         cp.async.ca.shared.global [%r1], [%rd1], 8, !%p1;\n\
         cp.async.commit_group;\ncp.async.wait_group 0;\ncp.async.wait_all;\n\
         ldmatrix.sync.aligned.m8n8.x2.trans.b16 {%r1, %r2}, [%rd1];\n\
         cvt.rn.relu.satfinite.tf32.f32 %r1, %r2;\ncvt.rz.tf32.f32 %r1, %r2;",
    ));
    assert!(m.is_ok(), "{m:?}");
}
