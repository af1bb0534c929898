"""Checks and runs an exported ONNX model with the `onnx` and `onnxruntime` packages, for
tests/examples/export_onnx.rs (which spawns it; `cargo xtask test` brings both packages).

Usage: python3 tests/onnx_runtime.py REQUEST.json

REQUEST names the model, a report file and runs: each run maps input names to raw
little-endian files with a dtype and shape, and names a directory for the outputs. The script
  * runs `onnx.checker.check_model(model, full_check=True)` (full_check adds shape inference);
  * writes to the report the opset imports, the IR version and the graph's inputs and outputs
    with their dimensions (a symbolic dimension as its name, e.g. "N");
  * runs every run with onnxruntime's CPU provider and writes each output, cast to float32, as
    `<out_dir>/<index>.bin`, with its shape in the report.
Exit status 2 with one line when the packages are missing.
"""

import json
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:  # pragma: no cover - the message is the point
    print(f"missing Python package: {e.name} (pip install onnx onnxruntime, or run the tests with `cargo xtask test`)")
    sys.exit(2)


def dims(value_info):
    out = []
    for d in value_info.type.tensor_type.shape.dim:
        out.append(d.dim_param if d.HasField("dim_param") else d.dim_value)
    return out


def main():
    with open(sys.argv[1]) as f:
        request = json.load(f)
    model = onnx.load(request["model"])
    onnx.checker.check_model(model, full_check=True)
    report = {
        "ir_version": model.ir_version,
        "opsets": {op.domain: op.version for op in model.opset_import},
        "inputs": {i.name: dims(i) for i in model.graph.input},
        "outputs": {o.name: dims(o) for o in model.graph.output},
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "runs": [],
    }
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(
        request["model"], options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    for run in request["runs"]:
        feeds = {
            name: np.fromfile(spec["file"], dtype=spec["dtype"]).reshape(spec["shape"])
            for name, spec in run["inputs"].items()
        }
        results = session.run(names, feeds)
        shapes = []
        for index, value in enumerate(results):
            np.ascontiguousarray(value, dtype=np.float32).tofile(f"{run['out_dir']}/{index}.bin")
            shapes.append(list(value.shape))
        report["runs"].append({"outputs": names, "shapes": shapes})
    with open(request["report"], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
