//! Every file path the documentation names exists in the repository. The docs (README.md, docs/,
//! the READMEs of c_tests/, cuda_model/, scripts/ and python/) and the comments of the sources and
//! scripts send readers to files by relative path: `scripts/test-ort.sh`, `crates/core/src/caching/policy.rs`,
//! `docs/ARCHITECTURE.md`. A path that starts with one of the repository's folders (ROOTS) must name
//! a file or folder that is there, found from the repository's root or from the folder of the file
//! that names it (cuda_model/README.md's `src/lib.rs` is cuda_model/src/lib.rs); a path that climbs
//! out with `../` must stay inside the repository, so nothing sends readers to a folder they do not
//! have (`../shared/docs`). Each failure names the file, the line and the path.
//!
//! Not checked: what builds and runs make (build/, any target/ folder, MADE_BY_RUNS), globs and
//! placeholders (`examples/traces/*.jsonl`, `scripts/<name>.sh`, `examples/traces/NAME.jsonl`,
//! `src/...`), and paths inside URLs.

use std::path::{Component, Path, PathBuf};

/// The repository's folders a path in the docs starts with. `shared` is no folder of ours: it is
/// here so that a path into the workspace's shared/ folder, which users do not have, is caught.
const ROOTS: [&str; 12] = [
    "c_tests",
    "crates",
    "cuda_model",
    "docs",
    "examples",
    "fuzz",
    "include",
    "python",
    "scripts",
    "shared",
    "src",
    "tests",
];

/// Characters that end a path in running text.
fn ends_path(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '`' | '"' | '\'' | '(' | ')' | '[' | ']' | ',' | ';' | '|' | ':' | '=' | '\\'
        )
}

/// Whether a path may start right after `c`: not inside a longer word, path or URL.
fn starts_after(c: Option<char>) -> bool {
    match c {
        None => true,
        Some(c) => {
            !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '$' | '~' | '@' | '%'))
        }
    }
}

/// The candidate repository paths of one line of text: ROOT/... and ../...
fn paths_in(line: &str) -> Vec<String> {
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (at, _) = chars[i];
        let before = if i == 0 { None } else { Some(chars[i - 1].1) };
        let rest = &line[at..];
        let starts = starts_after(before)
            && (rest.starts_with("../")
                || ROOTS
                    .iter()
                    .any(|root| rest.starts_with(root) && rest[root.len()..].starts_with('/')));
        if !starts {
            i += 1;
            continue;
        }
        let end = rest.find(ends_path).unwrap_or(rest.len());
        let token = &rest[..end];
        found.push(token.to_string());
        i += token.chars().count().max(1);
    }
    found
}

/// The path a candidate names, or None when it is a glob, a placeholder or an elision.
fn clean(token: &str) -> Option<&str> {
    let token = token.split('#').next().unwrap_or("");
    if token.contains("...") || token.contains('…') {
        return None; // src/..., an elision
    }
    // Sentence punctuation, or Markdown's bold, after a path.
    let token = token.trim_end_matches(['.', '!', '?']);
    let token = token.strip_suffix("**").unwrap_or(token);
    let body = token.trim_start_matches("../");
    let placeholder = body.contains("//")
        || body
            .chars()
            .any(|c| matches!(c, '*' | '?' | '<' | '>' | '{' | '}' | '$' | '%' | '+'));
    (!placeholder && !body.is_empty()).then_some(token)
}

/// Lexically resolved `base/path`, or None when it climbs above the filesystem root.
fn join(base: &Path, path: &str) -> Option<PathBuf> {
    let mut out = base.to_path_buf();
    for part in Path::new(path).components() {
        match part {
            // The guard climbs one level; above the root there is none to climb.
            Component::ParentDir if !out.pop() => return None,
            Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    Some(out)
}

/// Paths that runs make, not the repository holds, and which writes each: named in the docs as
/// where to look after a run. Any path through a `target` folder (cargo's) is skipped as well.
const MADE_BY_RUNS: [(&str, &str); 2] = [
    ("docs/gpu-results.md", "scripts/gpu-check.sh"),
    ("fuzz/artifacts", "cargo fuzz, for a crash"),
];

/// Upper-case words that stand for a name in a path: `examples/traces/NAME.jsonl`.
const PLACEHOLDERS: [&str; 6] = ["NAME", "TRACE", "FILE", "PATH", "DIR", "N"];

/// Why `path`, named in `file` (relative to the repository `root`), is not a path of the
/// repository; None when it is.
fn problem(root: &Path, file: &Path, path: &str) -> Option<String> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let made = MADE_BY_RUNS
        .iter()
        .any(|(made, _)| path.trim_end_matches('/') == *made);
    let placeholder = Path::new(path).components().any(|part| {
        let part = part.as_os_str().to_string_lossy();
        part == "target" || PLACEHOLDERS.contains(&part.split('.').next().unwrap_or(""))
    });
    if made || placeholder {
        return None;
    }
    let shared = "is in the workspace's shared/ folder, outside the repository";
    if path.starts_with("../") {
        return match join(&root.join(dir), path) {
            Some(target) if target.starts_with(root.join("shared")) => Some(shared.to_string()),
            Some(target) if target.starts_with(root) && target.exists() => None,
            Some(target) if target.starts_with(root) => Some("does not exist".to_string()),
            _ => Some("is outside the repository".to_string()),
        };
    }
    if path.starts_with("shared/") {
        return Some(shared.to_string());
    }
    let exists = |base: &Path| join(base, path).is_some_and(|p| p.exists());
    if exists(root) || exists(&root.join(dir)) {
        None
    } else {
        Some("does not exist".to_string())
    }
}

/// Which lines of a file are read: a document's all of them, a source's only its comments, a
/// script's all of them (their paths in code are checked as well as those in comments).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Document,
    RustComments,
    WholeScript,
}

fn text_of(line: &str, kind: Kind) -> &str {
    match kind {
        Kind::Document | Kind::WholeScript => line,
        Kind::RustComments => line.find("//").map_or("", |at| &line[at..]),
    }
}

/// Every failure in one file: "file:line: `path` reason".
fn check_file(root: &Path, file: &Path, kind: Kind) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut failures = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for token in paths_in(text_of(line, kind)) {
            let Some(path) = clean(&token) else { continue };
            if let Some(why) = problem(root, file, path) {
                failures.push(format!("{}:{}: `{path}` {why}", file.display(), number + 1));
            }
        }
    }
    failures
}

/// The files under `dir` (relative to `root`) whose names end in one of `extensions`, skipping
/// what builds and installs leave there.
fn files_under(root: &Path, dir: &str, extensions: &[&str], recursive: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return out;
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = Path::new(dir).join(&name);
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let generated = name.starts_with('.')
                || matches!(name.as_str(), "target" | "build" | "dist" | "__pycache__")
                || name.ends_with(".egg-info");
            if recursive && !generated {
                out.extend(files_under(
                    root,
                    relative.to_str().unwrap(),
                    extensions,
                    true,
                ));
            }
        } else if extensions.iter().any(|ext| name.ends_with(ext)) {
            out.push(relative);
        }
    }
    out
}

fn checked_files(root: &Path) -> Vec<(PathBuf, Kind)> {
    let mut files: Vec<(PathBuf, Kind)> =
        ["README.md", "c_tests/README.md", "cuda_model/README.md"]
            .iter()
            .map(|f| (PathBuf::from(f), Kind::Document))
            .collect();
    for (dir, recursive) in [("docs", true), ("scripts", true), ("python", true)] {
        for file in files_under(root, dir, &[".md"], recursive) {
            files.push((file, Kind::Document));
        }
    }
    for dir in ["src", "tests", "cuda_model/src", "crates"] {
        for file in files_under(root, dir, &[".rs"], true) {
            // This file names missing paths on purpose, as examples.
            if file != Path::new("tests/docs_paths.rs") {
                files.push((file, Kind::RustComments));
            }
        }
    }
    for file in files_under(root, "scripts", &[".sh", ".py"], true) {
        files.push((file, Kind::WholeScript));
    }
    for file in files_under(root, "c_tests", &[".c", ".cpp", ".h"], false) {
        files.push((file, Kind::WholeScript));
    }
    files
}

#[test]
fn every_path_the_docs_name_exists_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = checked_files(root);
    assert!(
        files.len() > 20,
        "the docs and sources were not found: {files:?}"
    );
    let failures: Vec<String> = files
        .iter()
        .flat_map(|(file, kind)| check_file(root, file, *kind))
        .collect();
    assert!(
        failures.is_empty(),
        "{} paths in the docs name nothing in the repository:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The scanner itself: what it takes for a path, what it leaves alone.
#[test]
fn the_scanner_finds_repository_paths_and_leaves_the_rest() {
    let found = |line: &str| -> Vec<String> {
        paths_in(line)
            .iter()
            .filter_map(|t| clean(t).map(str::to_string))
            .collect()
    };
    assert_eq!(
        found("see `scripts/test-ort.sh`, and docs/ARCHITECTURE.md."),
        ["scripts/test-ort.sh", "docs/ARCHITECTURE.md"]
    );
    assert_eq!(
        found(
            "[the design](../shared/docs/DESIGN.md#layers) and (crates/core/src/caching/policy.rs)"
        ),
        [
            "../shared/docs/DESIGN.md",
            "crates/core/src/caching/policy.rs"
        ]
    );
    assert_eq!(
        found("crates/tools/tests/cli.rs's model tests; src/lib.rs:12"),
        ["crates/tools/tests/cli.rs", "src/lib.rs"]
    );
    // URLs, other projects' paths, words that end in a root's name, globs and placeholders.
    for line in [
        "https://github.com/pytorch/pytorch/blob/main/docs/source/notes.rst",
        "c10/cuda/CUDACachingAllocator.cpp and cuda_model/src/lib.rs's twin libsrc/x",
        "examples/traces/*.jsonl, scripts/<name>.sh, src/..., docs/{a,b}.md",
        "$HOME/src/accalloc and ~/docs/x and build/logs/ort.log and target/release/accalloc",
    ] {
        let got = found(line);
        assert!(
            got.iter().all(|p| p == "cuda_model/src/lib.rs"),
            "{line}: {got:?}"
        );
    }

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = Path::new("README.md");
    let nested = Path::new("cuda_model/README.md");
    assert_eq!(problem(root, readme, "scripts/test-ort.sh"), None);
    assert_eq!(problem(root, readme, "crates/core/src/caching/"), None);
    assert_eq!(
        problem(root, nested, "src/lib.rs"),
        None,
        "from the file's folder"
    );
    assert_eq!(
        problem(root, Path::new("docs/ORT.md"), "../README.md"),
        None
    );
    assert!(problem(root, readme, "examples/accalloc_torch.py").is_some());
    assert!(problem(root, readme, "../shared/docs/DESIGN.md").is_some());
    assert!(problem(root, readme, "shared/docs/REFERENCE.md").is_some());
    assert!(problem(root, Path::new("docs/x.md"), "../../elsewhere").is_some());
    assert!(problem(root, readme, "docs/DESIGN.md").is_some());
    // Placeholders, build output and what runs write are not the repository's to hold.
    assert_eq!(problem(root, readme, "examples/traces/NAME.jsonl"), None);
    assert_eq!(
        problem(root, readme, "cuda_model/target/release/libcuda.so"),
        None
    );
    assert_eq!(problem(root, readme, "docs/gpu-results.md"), None);
}
