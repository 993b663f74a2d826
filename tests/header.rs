//! The committed header must be exactly what build.rs generates from src/capi.

#[test]
fn committed_header_is_current() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/accalloc.h"));
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/accalloc.h"))
            .expect("include/accalloc.h is missing");
    assert!(
        generated == committed,
        "include/accalloc.h is stale: run `cargo build` outside CI to regenerate it, then commit it"
    );
}

#[test]
fn header_versions_match_the_package() {
    let header = include_str!(concat!(env!("OUT_DIR"), "/accalloc.h"));
    for (name, value) in [
        ("ACC_VERSION_MAJOR", env!("CARGO_PKG_VERSION_MAJOR")),
        ("ACC_VERSION_MINOR", env!("CARGO_PKG_VERSION_MINOR")),
        ("ACC_VERSION_PATCH", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        assert!(
            header.contains(&format!("#define {name} {value}\n")),
            "{name} should be {value}"
        );
    }
}

#[test]
fn header_declares_every_exported_function() {
    let header = include_str!(concat!(env!("OUT_DIR"), "/accalloc.h"));
    let capi = concat!(env!("CARGO_MANIFEST_DIR"), "/src/capi");
    let sources: Vec<String> = std::fs::read_dir(capi)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    let mut count = 0;
    for source in &sources {
        for line in source
            .lines()
            .filter(|l| l.contains("extern \"C\" fn acc_"))
        {
            let name = line.split("fn ").nth(1).unwrap().split('(').next().unwrap();
            let declared = [" ", "*"]
                .iter()
                .any(|before| header.contains(&format!("{before}{name}(")));
            assert!(declared, "{name} is not declared in the header");
            count += 1;
        }
    }
    // Functions that act on one accelerator: each also has an `_on` form taking a device type.
    let per_accelerator = [
        "acc_malloc",
        "acc_empty_cache",
        "acc_get_device_stats",
        "acc_memory_allocated",
        "acc_max_memory_allocated",
        "acc_memory_reserved",
        "acc_max_memory_reserved",
        "acc_reset_accumulated_memory_stats",
        "acc_reset_peak_memory_stats",
        "acc_memory_stat",
        "acc_memory_stats_json",
        "acc_mem_get_info",
        "acc_set_memory_fraction",
        "acc_device_count",
        "acc_current_device",
        "acc_set_device",
        "acc_set_allocator_settings",
        "acc_get_allocator_settings",
        "acc_memory_summary",
        "acc_memory_snapshot_json",
        "acc_record_memory_history",
    ];
    // Functions that do not depend on the accelerator.
    let global = [
        "acc_free",
        "acc_record_stream",
        "acc_current_accelerator",
        "acc_set_accelerator",
        "acc_device_type_name",
        "acc_register_backend",
        "acc_last_error_message",
        "acc_version",
        "acc_abi_version",
        "acc_status_name",
        "acc_check_abi",
        "acc_pluggable_malloc",
        "acc_pluggable_free",
        "acc_pluggable_init",
        "acc_pluggable_empty_cache",
        "acc_pluggable_set_memory_fraction",
        "acc_pluggable_record_stream",
    ];
    let mut required: Vec<String> = global.iter().map(|s| s.to_string()).collect();
    for name in per_accelerator {
        required.push(name.to_string());
        required.push(format!("{name}_on"));
    }
    for name in &required {
        assert!(
            header.contains(&format!("{name}(")),
            "{name} is missing from the API"
        );
    }
    assert_eq!(
        count,
        required.len(),
        "exported functions and the required list differ"
    );
}
