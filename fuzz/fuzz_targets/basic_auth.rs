//! `Authorization` header values through the Prometheus endpoint's basic auth (decoding, the
//! cache of verified credentials, bcrypt): no panic; only a right password is let in; the cache
//! answers only for credentials that verified before and never grows on a wrong password.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phasetrace::fuzzing::{AUTH_USERS, basic_auth};

fuzz_target!(|data: &[u8]| {
    let mut verified: Vec<(String, Vec<u8>)> = Vec::new();
    let mut last_len = 0;
    for step in basic_auth(data) {
        let right = step.credentials.as_ref().is_some_and(|(u, p)| {
            AUTH_USERS
                .iter()
                .any(|(user, pw)| u == user && p.as_slice() == pw.as_bytes())
        });
        assert_eq!(step.allowed, right, "{step:?}");
        if step.cached {
            let c = step.credentials.clone().expect("cached without credentials");
            assert!(verified.contains(&c), "cached before it verified: {step:?}");
        }
        if step.allowed && !step.cached {
            verified.extend(step.credentials.clone());
        }
        if !step.allowed {
            assert!(step.cache_len <= last_len, "a refusal grew the cache: {step:?}");
        }
        assert!(step.cache_len <= 4, "{step:?}");
        last_len = step.cache_len;
        // A decoded credential encodes back to a value that decodes the same.
        if let Some((u, p)) = &step.credentials {
            let mut raw = u.as_bytes().to_vec();
            raw.push(b':');
            raw.extend_from_slice(p);
            let again = format!("Basic {}", b64(&raw));
            let back = basic_auth(again.as_bytes());
            assert_eq!(back[0].credentials.as_ref(), Some(&(u.clone(), p.clone())));
        }
    }
});

/// Standard base64 with padding (the fuzz crate takes no dependency for it).
fn b64(raw: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in raw.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
