//! Compiles proto/omicos/v1 with protox (no system protoc) and writes the
//! file descriptor set for gRPC reflection.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // At run time, not env!(): the compiled script is shared by worktrees on one target dir.
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest).join("../../proto");
    let files = [
        "common.proto",
        "orchestrator.proto",
        "tool_runner.proto",
        "provider.proto",
    ]
    .map(|f| root.join("omicos/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    // Worktrees sharing one CARGO_TARGET_DIR share this script's OUT_DIR, and
    // the paths above are the last builder's: rerun when built from elsewhere.
    println!("cargo:rerun-if-env-changed=PWD");
    let fds = protox::compile(&files, [&root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("omicos_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::StrictCodec")
        .compile_fds(fds)?;
    Ok(())
}
