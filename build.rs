//! Generates the ONNX protobuf messages (`$OUT_DIR/onnx.rs`) from the vendored
//! `src/export/onnx/onnx.proto`: protox compiles the schema in pure Rust (no `protoc` needed) and
//! prost-build writes the Rust types that `towerpack::export::onnx` encodes with `prost`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "src/export/onnx";
    let proto = "src/export/onnx/onnx.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=build.rs");
    let descriptors = protox::compile([proto], [dir])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
