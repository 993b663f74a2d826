//! The summary, the snapshot and the history through the C ABI.

use accalloc::capi::inspect::{
    accalloc_memory_snapshot_json, accalloc_memory_summary, accalloc_record_memory_history,
};
use accalloc::capi::memory::{accalloc_free, accalloc_malloc, accalloc_record_stream};
use accalloc::capi::AccallocStatus;
use std::ffi::{c_char, c_void, CStr};

fn read(call: impl Fn(*mut c_char, usize, *mut usize) -> AccallocStatus) -> String {
    let mut len = 0;
    assert_eq!(
        call(std::ptr::null_mut(), 0, &mut len),
        AccallocStatus::ACCALLOC_OK
    );
    let mut buf = vec![0 as c_char; len];
    assert_eq!(
        call(buf.as_mut_ptr(), len, &mut len),
        AccallocStatus::ACCALLOC_OK
    );
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn summary_snapshot_and_history() {
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "1GiB");
    std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    assert_eq!(
        accalloc_record_memory_history(1, 0),
        AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        accalloc_record_memory_history(1, 1000),
        AccallocStatus::ACCALLOC_OK
    );
    let (mut small, mut large): (*mut c_void, *mut c_void) =
        (std::ptr::null_mut(), std::ptr::null_mut());
    unsafe {
        assert_eq!(
            accalloc_malloc(&mut small, 1000, 0, std::ptr::null_mut()),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(
            accalloc_malloc(&mut large, 5 << 20, 0, 0x30 as *mut c_void),
            AccallocStatus::ACCALLOC_OK
        );
    }

    let summary = read(|b, c, l| unsafe { accalloc_memory_summary(-1, 0, b, c, l) });
    assert!(
        summary.contains("accalloc host memory summary, device ID 0"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "| Allocated memory      |   5121 KiB |   5121 KiB |   5121 KiB |      0 B   |"
        ),
        "{summary}"
    );
    assert!(
        summary.contains("| Reserved segments     |       2    |"),
        "{summary}"
    );
    let short = read(|b, c, l| unsafe { accalloc_memory_summary(1, 1, b, c, l) });
    assert!(short.contains("device ID 1") && !short.contains("from small pool"));
    let mut len = 0;
    assert_eq!(
        unsafe { accalloc_memory_summary(7, 0, std::ptr::null_mut(), 0, &mut len) },
        AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE
    );

    let snapshot: serde_json::Value = serde_json::from_str(&read(|b, c, l| unsafe {
        accalloc_memory_snapshot_json(b, c, l)
    }))
    .unwrap();
    let segments = snapshot["segments"].as_array().unwrap();
    assert_eq!(segments.len(), 2);
    let large_segment = segments
        .iter()
        .find(|s| s["segment_type"] == "large")
        .unwrap();
    assert_eq!(large_segment["total_size"], 20 << 20);
    assert_eq!(large_segment["allocated_size"], 5 << 20);
    assert_eq!(large_segment["stream"], 0x30);
    assert_eq!(large_segment["is_expandable"], false);
    assert_eq!(large_segment["blocks"][0]["state"], "active_allocated");
    assert_eq!(large_segment["blocks"][0]["address"], large as usize);
    assert_eq!(large_segment["blocks"][1]["state"], "inactive");
    let traces = snapshot["device_traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2, "one trace list per device");
    let actions: Vec<&str> = traces[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["segment_alloc", "alloc", "segment_alloc", "alloc"]
    );
    assert!(traces[0][0]["time_us"].as_u64().unwrap() > 0);
    assert_eq!(snapshot["allocator_settings"]["max_split_size"], -1);

    unsafe {
        assert_eq!(
            accalloc_record_stream(small, 0x40 as *mut c_void),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(accalloc_free(small), AccallocStatus::ACCALLOC_OK);
        assert_eq!(accalloc_free(large), AccallocStatus::ACCALLOC_OK);
    }
    assert_eq!(
        accalloc_record_memory_history(0, 0),
        AccallocStatus::ACCALLOC_OK
    );
    let snapshot: serde_json::Value = serde_json::from_str(&read(|b, c, l| unsafe {
        accalloc_memory_snapshot_json(b, c, l)
    }))
    .unwrap();
    assert_eq!(
        snapshot["device_traces"][0].as_array().unwrap().len(),
        0,
        "recording off"
    );
    let small_segment = snapshot["segments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["segment_type"] == "small")
        .unwrap()
        .clone();
    assert_eq!(
        small_segment["blocks"][0]["state"], "active_pending_free",
        "host events complete at the next malloc"
    );
}
