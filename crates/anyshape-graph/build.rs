//! Rust types for ONNX's protobuf schema (`proto/onnx.proto`, Apache-2.0, from the ONNX
//! project), compiled with `protox` (pure Rust: no system `protoc`) and `prost-build`.
fn main() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let files = protox::compile(["proto/onnx.proto"], ["proto"]).expect("onnx.proto compiles");
    prost_build::Config::new()
        .compile_fds(files)
        .expect("prost generates the ONNX types");
}
