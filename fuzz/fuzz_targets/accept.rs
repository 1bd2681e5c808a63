//! `Accept` and `Accept-Encoding` negotiation: no panic, and a header that only adds elements
//! that are not acceptable (`q=0`) after the others never changes the format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = std::str::from_utf8(data) else {
        return;
    };
    let format = phasetrace::fuzzing::accept(header);
    let _ = phasetrace::fuzzing::accept_gzip(header);
    // Closed quotes only: an unclosed quote would swallow what follows.
    if header.matches('"').count() % 2 == 0 && !header.contains('\\') {
        let more = format!("{header}, application/openmetrics-text;q=0");
        assert_eq!(phasetrace::fuzzing::accept(&more), format, "{header:?}");
    }
});
