//! The benchmark's two-path rows (accalloc::replay::bench): the one-device shortcut and the general
//! path timed in turns on one device, the shortcut taken back after each general batch; then other
//! devices put in use, after which the shortcut is gone for good. A process of its own: it gives
//! the shortcut up.

use accalloc::replay::bench::{general_path, several_devices, DEVICES_IN_USE};

#[test]
fn the_general_path_is_timed_beside_the_shortcut_until_other_devices_hold_memory() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", "1");
    // Twice: the shortcut is back after the first comparison, or the second would find none.
    for _ in 0..2 {
        let (shortcut, general) = general_path(3, 200).expect("one device in use: the shortcut");
        assert!(shortcut > 0.0 && general > 0.0);
    }
    let rows = several_devices(3, 200);
    assert_eq!(
        rows.iter().map(|&(devices, _)| devices).collect::<Vec<_>>(),
        DEVICES_IN_USE.to_vec()
    );
    assert!(rows.iter().all(|&(_, ns)| ns > 0.0));
    assert!(
        general_path(3, 200).is_none(),
        "with other devices in use the shortcut is given up for good"
    );
}
