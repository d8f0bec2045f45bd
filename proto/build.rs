//! Generates the Rust code of the `clb.v1` gRPC contract with the vendored `protoc`, so that
//! building the crate needs no system-wide protobuf installation.

use std::path::PathBuf;

/// The contract's files, relative to the crate root.
const PROTOS: &[&str] = &[
    "proto/clb/v1/types.proto",
    "proto/clb/v1/writer.proto",
    "proto/clb/v1/worker.proto",
    "proto/clb/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    // The vendored binary is passed to prost through its config rather than through the
    // `PROTOC` environment variable: mutating the environment is `unsafe` in edition 2024.
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    let protos: Vec<PathBuf> = PROTOS.iter().map(PathBuf::from).collect();
    let includes = [PathBuf::from("proto"), protoc_bin_vendored::include_path()?];

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Small call buffers: a server holds thousands of mostly idle streams (src/codec.rs).
        .codec_path("crate::codec::LeanCodec")
        .file_descriptor_set_path(out_dir.join("clb_v1_descriptor.bin"))
        .compile_with_config(config, &protos, &includes)?;
    Ok(())
}
