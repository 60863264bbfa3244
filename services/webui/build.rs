//! Rebuilds the crate when the committed page (dist/) changes: rust-embed
//! includes each file, but a file added or removed is only seen by a rebuild.
fn main() {
    println!("cargo:rerun-if-changed=dist");
}
