//! The allocator configuration parser: any string either parses into settings that print back to a
//! string parsing to the same settings, or is a configuration error; it never panics.
#![no_main]

use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc::error::ErrorKind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match parse_settings(text, &CachingConfig::default()) {
        Ok(config) => {
            let printed = config.to_settings_string();
            let again = parse_settings(&printed, &CachingConfig::default()).expect("printed settings parse");
            assert_eq!(again, config, "{printed}");
        }
        Err(error) => assert_eq!(error.kind, ErrorKind::Config),
    }
});
