//! Compiles proto/omicos/v1 and A2A 1.0's proto/lf/a2a/v1 with protox (no
//! system protoc) and writes their file descriptor sets for gRPC reflection.
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
    let a2a = root.join("lf/a2a/v1/a2a.proto");
    for f in files.iter().chain([&a2a]) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    println!("cargo:rerun-if-changed={}", root.join("google").display());
    // Worktrees sharing one CARGO_TARGET_DIR share this script's OUT_DIR, and
    // the paths above are the last builder's: rerun when built from elsewhere.
    println!("cargo:rerun-if-env-changed=PWD");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(&files, [&root])?;
    std::fs::write(out.join("omicos_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::StrictCodec")
        .compile_fds(fds)?;

    // A2A: the whole set (with google/api's annotations) for the guard's test; the
    // code only for lf.a2a.v1 (google.api's types are options, read by no one;
    // google.protobuf's are prost-types, which codegen must still see).
    // Encoded by protox itself: prost's types would drop the custom options.
    let mut compiler = protox::Compiler::new([&root])?;
    compiler.include_imports(true).open_file(&a2a)?;
    std::fs::write(
        out.join("a2a_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    let mut fds = compiler.file_descriptor_set();
    fds.file
        .retain(|f| matches!(f.package(), "lf.a2a.v1" | "google.protobuf"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::StrictCodec")
        .compile_fds(fds)?;
    Ok(())
}
