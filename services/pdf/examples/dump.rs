//! Prints what `pdf__read` returns for a file: `cargo run -p omicos-pdf --example dump -- FILE [PAGES]`.
use omicos_pdf::PdfProvider;
use omicos_toolkit::{CallCtx, Provider};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(file) = args.get(1) else {
        eprintln!("usage: dump FILE [PAGES]");
        std::process::exit(2);
    };
    let path = std::path::Path::new(file)
        .canonicalize()
        .expect("file exists");
    let dir = path.parent().expect("has a folder").to_path_buf();
    let mut a = serde_json::json!({"path": path.file_name().unwrap().to_str().unwrap(), "max_chars": 200000});
    if let Some(p) = args.get(2) {
        a["pages"] = p.clone().into();
    }
    match PdfProvider::default()
        .call("pdf__read", a, CallCtx::for_test(dir, "dump"))
        .await
    {
        Ok(v) => println!("{}", v.as_str().unwrap_or_default()),
        Err(e) => eprintln!("error: {e}"),
    }
}
