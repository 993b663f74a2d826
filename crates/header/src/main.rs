//! `cargo run -p accalloc-header`: writes include/accalloc.h from src/capi.
//! `cargo run -p accalloc-header -- --check`: fails, changing nothing, when the committed header is
//! not what src/capi generates.

use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some("-h" | "--help") => {
            println!("usage: accalloc-header [--check]\n  writes include/accalloc.h from src/capi; --check only compares");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!(
                "accalloc-header: unknown argument {other} (usage: accalloc-header [--check])"
            );
            return ExitCode::FAILURE;
        }
    };
    let root = accalloc_header::repository_root();
    let path = accalloc_header::committed_path(&root);
    let generated = match accalloc_header::generate(&root) {
        Ok(text) => text,
        Err(why) => {
            eprintln!("accalloc-header: {why}");
            return ExitCode::FAILURE;
        }
    };
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == generated {
        println!("include/accalloc.h is current");
        return ExitCode::SUCCESS;
    }
    if check {
        eprintln!(
            "include/accalloc.h is stale: run `cargo run -p accalloc-header` and commit the result"
        );
        return ExitCode::FAILURE;
    }
    if let Err(why) = std::fs::write(&path, generated) {
        eprintln!("accalloc-header: writing {}: {why}", path.display());
        return ExitCode::FAILURE;
    }
    println!("wrote include/accalloc.h");
    ExitCode::SUCCESS
}
