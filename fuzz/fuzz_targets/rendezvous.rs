//! The demo's rendezvous protocol (`cli/src/rendezvous/wire.rs`, compiled here as it is: the
//! command has no library to link): any bytes a stranger sends a rank's listener, and any bytes
//! a peer or a fake rank 0 sends back. No panic, nothing allocated beyond the protocol's
//! bounds; a hello read from any prefix reads the same from the whole input, and reads back
//! from its own encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../cli/src/rendezvous/wire.rs"]
mod wire;

fuzz_target!(|data: &[u8]| {
    // The listener's side, as bytes arrive: parse_hello on every prefix agrees with the whole.
    let whole = wire::parse_hello(data);
    if let Ok(Some((hello, used))) = &whole {
        assert!(*used <= data.len() && *used <= wire::MAX_HELLO);
        assert_eq!(&hello.encode()[..], &data[..*used]);
        for cut in [0, 1, 5, 6, used / 2, used - 1] {
            assert_eq!(wire::parse_hello(&data[..cut]), Ok(None), "cut at {cut}");
        }
    }
    if whole.is_err() {
        // Refused bytes stay refused whatever follows them.
        let mut more = data.to_vec();
        more.extend_from_slice(&[0u8; 128]);
        assert!(wire::parse_hello(&more).is_err());
    }
    // The connector's side: a challenge, an answer, a table; a peer's frames.
    let _ = wire::read_challenge(&mut &data[..]);
    let _ = wire::read_answer(&mut &data[..]);
    let ranks = 1 + u32::from(data.first().copied().unwrap_or(0) % 8);
    let _ = wire::read_table(&mut &data[..], ranks);
    let _ = wire::read_arrival(&mut &data[..], 1);
    if let Ok(Ok(part)) = wire::read_data(&mut &data[..], 1) {
        assert!(part.len() < data.len());
    }
});
