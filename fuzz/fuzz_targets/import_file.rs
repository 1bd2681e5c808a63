//! A whole log file (plain or gzip) through the importer and both writers: no panic, and
//! every line is accounted for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phasetrace_import::openmetrics::{OpenMetricsOptions, write_openmetrics};
use phasetrace_import::otlp::{self, OtlpOptions};
use phasetrace_import::{ImportOptions, import_reader};

fuzz_target!(|data: &[u8]| {
    let options = ImportOptions {
        start_unix_nanos: Some(1_790_769_600_000_000_000),
        // Small, so that the limit is exercised at the sizes libFuzzer makes.
        max_line_bytes: 256,
        ..ImportOptions::default()
    };
    let Ok(file) = import_reader(data, options) else {
        return;
    };
    let s = &file.summary;
    assert!(s.lines_skipped <= s.lines_read, "{s:?}");
    assert!(s.first_bad.len() <= 5, "{s:?}");
    let files = [file];
    let _ = write_openmetrics(&mut std::io::sink(), &files, &OpenMetricsOptions::default());
    let _ = otlp::metrics_requests(&files, &OtlpOptions::default(), |_, _| Ok(()));
    let _ = otlp::trace_requests(&files, &OtlpOptions::default(), |_, _| Ok(()));
});
