//! The host's header-map serialisation, parsed on every request: malformed
//! buffers are None, never a panic; a well-formed one gives back its method.
#![no_main]

use adaptive_hedge::header_pairs::scan;
use adaptive_hedge::headers::{CONTROL_HEADERS, ENDPOINT_HEADER, FIRST_BYTE_MARKER};
use adaptive_hedge::pairs::serialise;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = scan(data, ENDPOINT_HEADER.as_bytes());
    // Reading the bytes as text pairs: what serialise writes, scan reads.
    let text = String::from_utf8_lossy(data);
    let pairs: Vec<(&str, &str)> = text
        .split('\n')
        .filter_map(|line| line.split_once('='))
        .collect();
    let buffer = serialise(&pairs);
    let found = scan(&buffer, ENDPOINT_HEADER.as_bytes()).expect("a serialised map scans");
    let method = pairs
        .iter()
        .rev()
        .find(|(n, _)| *n == ":method")
        .map(|(_, v)| v.as_bytes());
    assert_eq!(found.method, method.unwrap_or_default());
    let control = pairs.iter().any(|(n, _)| CONTROL_HEADERS.contains(n));
    assert_eq!(found.client_controls, control);
    let marker = pairs.iter().any(|(n, _)| *n == FIRST_BYTE_MARKER);
    assert_eq!(found.client_marker, marker);
    let endpoint = pairs.iter().any(|(n, _)| *n == ENDPOINT_HEADER);
    assert_eq!(found.client_endpoint, endpoint);
    assert_eq!(found.upgrade, pairs.iter().any(|(n, _)| *n == "upgrade"));
});
