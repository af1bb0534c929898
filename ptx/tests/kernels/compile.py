#!/usr/bin/env python3
"""Compile the test kernels under this directory to PTX fixtures with NVRTC, then assemble each
fixture with ptxas to prove it is valid PTX.

NVRTC and ptxas come from the pip wheels nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc-cu12 and
nvidia-cuda-runtime-cu12 (for cuda_fp16.h / cuda_bf16.h), all 12.9.86. The `.ptx` files are
committed test data: `cargo test` of towerpack-ptx reads them and never needs NVRTC.

Usage: python3 ptx/tests/kernels/compile.py [FIXTURE ...]   (from anywhere; default: all)
The runtime wheel is only needed by the fixtures that include its headers (`half`).
"""
import ctypes
import os
import pathlib
import subprocess
import sys
import tempfile

import nvidia.cuda_nvcc
import nvidia.cuda_nvrtc

HERE = pathlib.Path(__file__).resolve().parent
ARCH = "compute_80"
PTXAS_ARCH = "sm_80"

# output fixture name -> (source file, extra NVRTC options)
FIXTURES = {
    "elementwise": ("elementwise.cu", []),
    "broadcast": ("broadcast.cu", []),
    "reduce": ("reduce.cu", []),
    "sgemm": ("sgemm.cu", []),
    "conv": ("conv.cu", []),
    "batchnorm": ("batchnorm.cu", []),
    "softmax_xent": ("softmax_xent.cu", []),
    "math": ("math.cu", []),
    "math_fast": ("math.cu", ["--use_fast_math"]),
    "half": ("half.cu", []),
    "grad_avg": ("grad_avg.cu", []),
    "broken": ("broken.cu", []),
    "warp": ("warp.cu", []),
    "split": ("split.cu", []),
    "tensor": ("tensor.cu", []),
}


def package_dir(module):
    return pathlib.Path(list(module.__path__)[0])


def load_nvrtc():
    lib = package_dir(nvidia.cuda_nvrtc) / "lib" / "libnvrtc.so.12"
    nvrtc = ctypes.CDLL(str(lib))
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    return nvrtc


def check(nvrtc, status, what):
    if status != 0:
        raise RuntimeError(f"{what}: {nvrtc.nvrtcGetErrorString(status).decode()}")


def compile_to_ptx(nvrtc, source_path, extra):
    source = source_path.read_bytes()
    prog = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, source_path.name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    options = [f"--gpu-architecture={ARCH}", "--std=c++17"] + extra
    try:
        import nvidia.cuda_runtime
        options.append(f"-I{package_dir(nvidia.cuda_runtime) / 'include'}")
    except ImportError:
        pass
    argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = nvrtc.nvrtcCompileProgram(prog, len(options), argv)
    log_size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if status != 0:
        raise RuntimeError(f"{source_path.name} failed to compile:\n{log.value.decode()}")
    size = ctypes.c_size_t()
    check(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    ptx = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def assemble(ptx_path):
    ptxas = package_dir(nvidia.cuda_nvcc) / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "out.cubin")
        result = subprocess.run([str(ptxas), f"-arch={PTXAS_ARCH}", str(ptx_path), "-o", cubin],
                                capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ptxas rejected {ptx_path.name}:\n{result.stderr}")


def main():
    nvrtc = load_nvrtc()
    wanted = sys.argv[1:] or list(FIXTURES)
    for name in wanted:
        source, extra = FIXTURES[name]
        ptx = compile_to_ptx(nvrtc, HERE / source, extra)
        out = HERE / f"{name}.ptx"
        out.write_text(ptx)
        assemble(out)
        print(f"{out.name}: {len(ptx.splitlines())} lines, ptxas {PTXAS_ARCH} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
