//! The committed header declares what the library exports, with the package's version (that it is
//! exactly what src/capi generates is crates/header's test).

#[test]
fn header_versions_match_the_package() {
    let header = include_str!("../include/accalloc.h");
    for (name, value) in [
        ("ACCALLOC_VERSION_MAJOR", env!("CARGO_PKG_VERSION_MAJOR")),
        ("ACCALLOC_VERSION_MINOR", env!("CARGO_PKG_VERSION_MINOR")),
        ("ACCALLOC_VERSION_PATCH", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        assert!(
            header.contains(&format!("#define {name} {value}\n")),
            "{name} should be {value}"
        );
    }
}

#[test]
fn header_declares_every_exported_function() {
    let header = include_str!("../include/accalloc.h");
    let capi = concat!(env!("CARGO_MANIFEST_DIR"), "/src/capi");
    let sources: Vec<String> = std::fs::read_dir(capi)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    let mut count = 0;
    for source in &sources {
        for line in source
            .lines()
            .filter(|l| l.contains("extern \"C\" fn accalloc_"))
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
        "accalloc_malloc",
        "accalloc_empty_cache",
        "accalloc_get_device_stats",
        "accalloc_memory_allocated",
        "accalloc_max_memory_allocated",
        "accalloc_memory_reserved",
        "accalloc_max_memory_reserved",
        "accalloc_reset_accumulated_memory_stats",
        "accalloc_reset_peak_memory_stats",
        "accalloc_memory_stat",
        "accalloc_memory_stats_json",
        "accalloc_mem_get_info",
        "accalloc_set_memory_fraction",
        "accalloc_get_memory_fraction",
        "accalloc_device_count",
        "accalloc_current_device",
        "accalloc_set_device",
        "accalloc_set_allocator_settings",
        "accalloc_get_allocator_settings",
        "accalloc_memory_summary",
        "accalloc_memory_snapshot_json",
        "accalloc_record_memory_history",
        "accalloc_host_malloc",
        "accalloc_host_empty_cache",
        "accalloc_host_memory_stats_json",
        "accalloc_host_memory_stat",
        "accalloc_host_reset_accumulated_memory_stats",
        "accalloc_host_reset_peak_memory_stats",
        "accalloc_pool_create",
        "accalloc_pool_begin",
        "accalloc_pool_end",
        "accalloc_pool_release",
        "accalloc_pool_empty_cache",
        "accalloc_pool_info",
        "accalloc_pool_reserved_bytes",
        "accalloc_pool_create_with_allocator",
        "accalloc_pool_retain",
        "accalloc_pool_set_flags",
        "accalloc_pool_begin_filtered",
        "accalloc_pool_create_with_functions",
        "accalloc_pool_set_sleepable",
        "accalloc_pool_pause",
        "accalloc_pool_resume",
        "accalloc_pool_paused_bytes",
        "accalloc_planner_stats",
        "accalloc_pool_paused_at",
        "accalloc_pool_live_allocations",
        "accalloc_pool_checkpoint",
    ];
    // Functions that do not depend on the accelerator.
    let global = [
        "accalloc_segment_observer_add",
        "accalloc_segment_observer_remove",
        "accalloc_oom_observer_add",
        "accalloc_oom_observer_remove",
        "accalloc_free",
        "accalloc_record_stream",
        "accalloc_current_accelerator",
        "accalloc_set_accelerator",
        "accalloc_device_type_name",
        "accalloc_register_backend",
        "accalloc_last_error_message",
        "accalloc_version",
        "accalloc_abi_version",
        "accalloc_status_name",
        "accalloc_check_abi",
        "accalloc_pluggable_malloc",
        "accalloc_pluggable_free",
        "accalloc_pluggable_init",
        "accalloc_pluggable_empty_cache",
        "accalloc_pluggable_set_memory_fraction",
        "accalloc_pluggable_record_stream",
        "accalloc_ort_allocator_create",
        "accalloc_ort_allocator_destroy",
        "accalloc_host_free",
        "accalloc_host_record_stream",
        "accalloc_host_is_pinned",
        // A pointer knows its owner.
        "accalloc_allocation_info",
        // A checkpoint knows its accelerator.
        "accalloc_pool_checkpoint_allocations",
        "accalloc_pool_checkpoint_restore",
        "accalloc_pool_checkpoint_destroy",
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
