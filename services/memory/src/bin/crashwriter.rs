//! A writer that never stops, for the kill -9 test: saves, updates and keyed
//! saves in a loop and prints the number of committed writes after each one,
//! so the test knows writes were in flight when it kills the process.

use omicos_memory::{MemoryStore, NewMemory};
use std::io::Write;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(scope)) = (args.next(), args.next()) else {
        eprintln!("usage: omicos-memory-crashwriter STORE_URL SCOPE");
        std::process::exit(2);
    };
    let store = match MemoryStore::open(&url).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("crashwriter: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout();
    let mut n: u64 = 0;
    loop {
        let m = store
            .save(
                &scope,
                NewMemory {
                    content: format!(
                        "crash test note {n} {}",
                        "padding ".repeat((n % 50) as usize)
                    ),
                    category: "project".into(),
                    tags: vec![format!("t{}", n % 7)],
                    key: Some(format!("k{}", n % 13)),
                },
            )
            .await;
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                eprintln!("crashwriter: {e}");
                std::process::exit(1);
            }
        };
        if n.is_multiple_of(3)
            && store
                .update(&scope, m.id, &format!("updated note {n}"))
                .await
                .is_err()
        {
            std::process::exit(1);
        }
        n += 1;
        let _ = writeln!(out, "{n}");
        let _ = out.flush();
    }
}
