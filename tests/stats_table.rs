//! The statistics have one table: DeviceStats in crates/core/src/caching/stats.rs, whose declaration
//! gives POOLED_FAMILIES, SINGLE_FAMILIES, SCALARS (and STAT_FIELDS, STAT_TYPE_NAMES) and flat().
//! Every other list of them is generated from it (the Python package's ctypes mirror, from the
//! installed header) or checked here against it; a difference fails naming the names that differ.
//! (That the C conversion puts each value in its place is src/capi/stats.rs's unit test.)

use accalloc::caching::stats::{
    FLAT_KEY_COUNT, POOLED_FAMILIES, SCALARS, SINGLE_FAMILIES, STAT_FIELDS, STAT_TYPE_NAMES,
};
use std::path::Path;

const TABLE: &str = "the table of statistics (DeviceStats, crates/core/src/caching/stats.rs)";

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Fail unless `got` (what `what` lists) is `want` (the table's list), naming what is missing, what
/// is not in the table, or, with the same names, that the order differs.
fn assert_same<G: AsRef<str>, W: AsRef<str>>(what: &str, got: &[G], want: &[W]) {
    let got: Vec<&str> = got.iter().map(AsRef::as_ref).collect();
    let want: Vec<&str> = want.iter().map(AsRef::as_ref).collect();
    if got == want {
        return;
    }
    let missing: Vec<&str> = want.iter().filter(|w| !got.contains(w)).copied().collect();
    let extra: Vec<&str> = got.iter().filter(|g| !want.contains(g)).copied().collect();
    let how = if missing.is_empty() && extra.is_empty() {
        "the same names in another order (or twice)".to_string()
    } else {
        format!("missing {missing:?}, not in the table {extra:?}")
    };
    panic!("{what} differs from {TABLE}: {how}\n  {what}: {got:?}\n  the table: {want:?}");
}

/// The table's names in field order: the pooled families, the single families, the scalars.
fn all_names() -> Vec<&'static str> {
    [POOLED_FAMILIES, SINGLE_FAMILIES, SCALARS].concat()
}

/// The text from the line that starts with `start` to the first line after it that starts with
/// `end`.
fn section<'a>(source: &'a str, start: &str, end: &str, file: &str) -> &'a str {
    let from = source
        .find(start)
        .unwrap_or_else(|| panic!("{file} has no {start:?}"));
    let rest = &source[from..];
    let to = rest
        .find(end)
        .unwrap_or_else(|| panic!("{file}: no {end:?} after {start:?}"));
    &rest[..to]
}

/// The string literals ("...") of `text`, in order.
fn quoted(text: &str) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The identifier after each occurrence of `prefix` (starting a word) in `text`, in order.
fn after_each(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = text[at + prefix.len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
    }
    out
}

/// Each named list of the Python file `file` (its text `source`) is the table's.
fn assert_python_lists(file: &str, source: &str, lists: &[(&str, &[&str])]) {
    for &(name, want) in lists {
        assert_same(
            &format!("{file}'s {name}"),
            &python_list(source, name, file),
            want,
        );
    }
}

/// The strings of a Python list or tuple literal assigned at the top level: `NAME = [...]`.
fn python_list(source: &str, name: &str, file: &str) -> Vec<String> {
    let start = format!("\n{name} = ");
    let from = source
        .find(&start)
        .unwrap_or_else(|| panic!("{file} assigns no {name}"))
        + start.len();
    let rest = &source[from..];
    let close = match rest.chars().next() {
        Some('[') => ']',
        Some('(') => ')',
        _ => panic!("{file}: {name} is not a list or tuple literal"),
    };
    quoted(&rest[..rest.find(close).expect("closing bracket")])
}

/// The members of a `typedef struct NAME { ... } NAME;` of a C header, comments dropped, as
/// "TYPE MEMBER" or "TYPE MEMBER[N]".
fn c_struct(header: &str, name: &str, file: &str) -> Vec<String> {
    let body = section(
        header,
        &format!("typedef struct {name} {{"),
        &format!("}} {name};"),
        file,
    );
    let mut members = Vec::new();
    let mut in_comment = false;
    for line in body.lines().skip(1) {
        let line = line.trim();
        if in_comment || line.starts_with("/*") {
            in_comment = !line.ends_with("*/");
            continue;
        }
        if let Some(member) = line.strip_suffix(';') {
            members.push(member.split_whitespace().collect::<Vec<_>>().join(" "));
        } else if !line.is_empty() {
            panic!("{file}: struct {name} has a line this test cannot read: {line:?}");
        }
    }
    members
}

#[test]
fn the_table_has_pytorchs_122_keys() {
    assert_eq!(FLAT_KEY_COUNT, 122);
    assert_eq!(STAT_TYPE_NAMES, ["all", "small_pool", "large_pool"]);
}

#[test]
fn the_c_header_declares_the_tables_statistics_in_order() {
    let file = "include/accalloc.h";
    let header = read(file);
    let mut want = vec!["size_t struct_size".to_string()];
    want.extend(
        POOLED_FAMILIES
            .iter()
            .map(|f| format!("struct AccallocStat {f}[3]")),
    );
    want.extend(
        SINGLE_FAMILIES
            .iter()
            .map(|f| format!("struct AccallocStat {f}")),
    );
    want.extend(SCALARS.iter().map(|s| format!("int64_t {s}")));
    assert_same(
        &format!("{file}'s AccallocDeviceStats"),
        &c_struct(&header, "AccallocDeviceStats", file),
        &want,
    );
    let want: Vec<String> = STAT_FIELDS.iter().map(|f| format!("int64_t {f}")).collect();
    assert_same(
        &format!("{file}'s AccallocStat"),
        &c_struct(&header, "AccallocStat", file),
        &want,
    );
    for (index, pool) in STAT_TYPE_NAMES.iter().enumerate() {
        let define = format!("#define ACCALLOC_STAT_{} {index}\n", pool.to_uppercase());
        assert!(header.contains(&define), "{file} lacks {define:?}");
    }
}

#[test]
fn the_python_package_reads_the_statistics_from_the_header() {
    // python/accalloc/_library.py builds its ctypes mirror of AccallocDeviceStats (and FAMILIES,
    // SINGLE_FAMILIES, SCALARS) from the installed accalloc.h: it spells no statistic itself.
    let file = "python/accalloc/_library.py";
    let source = read(file);
    for name in all_names().into_iter().chain(STAT_FIELDS) {
        assert!(
            !source.contains(&format!("\"{name}\"")),
            "{file} spells the statistic {name:?}: it should read the statistics from the header"
        );
    }
    assert!(source.contains("_header_struct(\"AccallocDeviceStats\")"));
}

#[test]
fn the_ctypes_test_lists_the_tables_statistics() {
    let file = "c_tests/test_ctypes.py";
    let source = read(file);
    assert_python_lists(
        file,
        &source,
        &[
            ("FAMILIES", POOLED_FAMILIES),
            ("SINGLES", SINGLE_FAMILIES),
            ("SCALARS", SCALARS),
            ("POOLS", &STAT_TYPE_NAMES),
            ("FIELDS", &STAT_FIELDS),
        ],
    );
}

#[test]
fn the_pytorch_model_lists_the_tables_statistics() {
    let file = "scripts/pytorch_model.py";
    let source = read(file);
    assert_python_lists(
        file,
        &source,
        &[
            ("ARRAY_FAMILIES", POOLED_FAMILIES),
            ("SINGLE_FAMILIES", SINGLE_FAMILIES),
            ("POOLS", &STAT_TYPE_NAMES),
            ("FIELDS", &STAT_FIELDS),
        ],
    );
    // The scalars are the keys memory_stats() writes by name (the others by family).
    let body = section(
        &source,
        "    def memory_stats(self)",
        "        return ",
        file,
    );
    assert_same(
        &format!("{file}'s memory_stats() scalars"),
        &after_each(body, "out[\"")
            .into_iter()
            .filter(|k| !k.is_empty())
            .collect::<Vec<_>>(),
        SCALARS,
    );
}

#[test]
fn the_c_tests_list_the_tables_statistics() {
    let file = "c_tests/accalloc_test_util.h";
    let source = read(file);
    let names = |array: &str| {
        quoted(section(
            &source,
            &format!("static const char *const {array}["),
            "};",
            file,
        ))
    };
    assert_same(
        &format!("{file}'s ACCALLOC_FAMILY_NAMES"),
        &names("ACCALLOC_FAMILY_NAMES"),
        POOLED_FAMILIES,
    );
    assert_same(
        &format!("{file}'s ACCALLOC_FAMILY_OFFSETS"),
        &after_each(
            section(
                &source,
                "static const size_t ACCALLOC_FAMILY_OFFSETS[",
                "};",
                file,
            ),
            "offsetof(AccallocDeviceStats, ",
        ),
        POOLED_FAMILIES,
    );
    assert_same(
        &format!("{file}'s ACCALLOC_POOL_NAMES"),
        &names("ACCALLOC_POOL_NAMES"),
        &STAT_TYPE_NAMES,
    );
    assert_same(
        &format!("{file}'s ACCALLOC_FIELD_NAMES"),
        &names("ACCALLOC_FIELD_NAMES"),
        &STAT_FIELDS,
    );
    // accalloc_key: after the pooled families, the single families and the scalars, each a name
    // and the field it reads.
    let key = section(
        &source,
        "static inline int64_t *accalloc_key(",
        "\n}\n",
        file,
    );
    let rest = [SINGLE_FAMILIES, SCALARS].concat();
    let spelled: Vec<String> = quoted(key)
        .into_iter()
        .filter(|s| !s.contains('%'))
        .collect();
    assert_same(&format!("{file}'s accalloc_key names"), &spelled, &rest);
    assert_same(
        &format!("{file}'s accalloc_key fields"),
        &after_each(key, "&s->"),
        &rest,
    );
    for (define, value) in [
        ("ACCALLOC_N_FAMILIES", POOLED_FAMILIES.len()),
        ("ACCALLOC_N_KEYS", FLAT_KEY_COUNT),
    ] {
        let line = format!("#define {define} {value}\n");
        assert!(source.contains(&line), "{file} lacks {line:?}");
    }
}

#[test]
fn the_torch_conversion_copies_the_tables_statistics() {
    let file = "python/accalloc/include/accalloc/torch_device_allocator.h";
    let source = read(file);
    let body = section(
        &source,
        "inline c10::CachingDeviceAllocator::DeviceStats to_device_stats(",
        "  return out;",
        file,
    );
    let body = &body[body.find('{').expect("function body")..];
    let want = all_names();
    assert_same(
        &format!("{file}'s to_device_stats (c10 fields)"),
        &after_each(body, "out."),
        &want,
    );
    assert_same(
        &format!("{file}'s to_device_stats (accalloc fields)"),
        &after_each(body, "s."),
        &want,
    );
}
