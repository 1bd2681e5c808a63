//! A web configuration file, read at start and as a reload: no panic, and no error or
//! description echoes a bcrypt hash or a password of the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("phasetrace-fuzz-web-{}.yml", std::process::id()));
    let mut f = std::fs::File::create(&path).expect("temp file");
    f.write_all(data).expect("write");
    drop(f);
    let text = String::from_utf8_lossy(data);
    for out in phasetrace::fuzzing::web_config(&path) {
        let shown = match out {
            Ok(s) | Err(s) => s,
        };
        // A bcrypt hash is 60 characters from `$2`: none may be echoed.
        for (i, _) in text.match_indices("$2") {
            if let Some(hash) = text.get(i..i + 60)
                && hash
                    .bytes()
                    .skip(7)
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
            {
                assert!(!shown.contains(hash), "a hash echoed: {shown}");
            }
        }
    }
});
