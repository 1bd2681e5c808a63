//! The rendezvous's bytes on the wire: the handshake every connection to a rank's listener
//! starts with, rank 0's table of addresses, and the frames of the collectives. Everything read
//! is bounded before it is allocated: a hello holds at most [`MAX_HELLO`] bytes, a reason
//! [`MAX_REASON`], a data part [`MAX_PAYLOAD`] (and grows as its bytes arrive, not as announced).
//! Plain `std`: the fuzz crate compiles this file as it is (`fuzz/fuzz_targets/rendezvous.rs`).
//!
//! ```text
//! listener  --challenge: MAGIC nonce[16]-->                                   connector
//!           <--hello: MAGIC to rank ranks port group(len u16, bytes) nonce[16] mac[32]--
//!           --answer: 0 proof[32] | 1 reason(len u16, bytes)-->
//! rank 0    --table: (ip(len u16, text) port u16) for ranks 1..ranks-->        every rank
//! any rank  --frame: arrive(1|2, seq u64) | abort(3, reason) | data(4, seq u64, len u32, bytes)-->
//! ```
//!
//! The hello's `mac` is HMAC-SHA256 under the group secret of the challenge's nonce and the
//! hello's bytes before it; the answer's `proof` the same of the challenge's nonce and the whole
//! hello (the crypto is in `door.rs`): the secret never crosses the wire, a hello recorded
//! once does not answer another challenge, and the connector learns that the listener knows the
//! secret too.

use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr};

/// The first bytes of a challenge and of a hello: the protocol and its version.
pub(crate) const MAGIC: &[u8; 5] = b"PTRV3";
/// Bytes of a nonce.
pub(crate) const NONCE: usize = 16;
/// Bytes of a MAC (HMAC-SHA256).
pub(crate) const MAC: usize = 32;
/// The longest group name a hello carries (`PHASETRACE_GROUP` is at most 64 bytes).
pub(crate) const MAX_GROUP: usize = 64;
/// The fixed part of a hello: magic, `to`, rank, ranks, port, the group's length.
const HELLO_HEAD: usize = 5 + 1 + 4 + 4 + 2 + 2;
/// The most bytes a hello takes.
pub(crate) const MAX_HELLO: usize = HELLO_HEAD + MAX_GROUP + NONCE + MAC;
/// The longest refusal or abort reason read.
pub(crate) const MAX_REASON: usize = 1024;
/// The longest address text of rank 0's table.
const MAX_IP_TEXT: usize = 64;
/// Most bytes one rank's part of an exchange may hold: a broken or hostile peer cannot make
/// a rank allocate more (the candle engine's largest partial, a prefill of 64 prompts of 768
/// tokens at width 4096, is 0.8 GB).
pub(crate) const MAX_PAYLOAD: u32 = 1 << 30;

/// A frame: a rank arrived at a meeting (and asks the group to stop).
pub(crate) const ARRIVE: u8 = 1;
/// A frame: arrived, and asks the group to stop.
pub(crate) const ARRIVE_STOP: u8 = 2;
/// A frame: a peer gave up (a peer of its died), with why.
pub(crate) const ABORT: u8 = 3;
/// A frame: one rank's part of an exchange.
pub(crate) const DATA: u8 = 4;

/// Whom a hello is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum To {
    /// Rank 0, to join the group.
    Root = 0,
    /// A rank above 0, to complete the mesh.
    Mesh = 1,
}

/// A connector's hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) to: To,
    pub(crate) rank: u32,
    pub(crate) ranks: u32,
    /// Where the connector listens for the ranks above it (0 in a hello to the mesh).
    pub(crate) port: u16,
    pub(crate) group: String,
    pub(crate) nonce: [u8; NONCE],
    pub(crate) mac: [u8; MAC],
}

impl Hello {
    /// The bytes the MAC covers: the hello up to its MAC.
    pub(crate) fn signed(&self) -> Vec<u8> {
        let group = &self.group.as_bytes()[..self.group.len().min(MAX_GROUP)];
        let mut out = Vec::with_capacity(MAX_HELLO);
        out.extend_from_slice(MAGIC);
        out.push(self.to as u8);
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.ranks.to_le_bytes());
        out.extend_from_slice(&self.port.to_le_bytes());
        out.extend_from_slice(&(group.len() as u16).to_le_bytes());
        out.extend_from_slice(group);
        out.extend_from_slice(&self.nonce);
        out
    }

    /// The whole hello.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = self.signed();
        out.extend_from_slice(&self.mac);
        out
    }
}

/// Reads a hello from the bytes received so far: `Ok(None)` while it is incomplete, an error
/// as soon as the bytes cannot be one (so that random bytes are closed at once, not when the
/// handshake times out); with the hello, how many bytes it took.
pub(crate) fn parse_hello(buf: &[u8]) -> Result<Option<(Hello, usize)>, String> {
    let n = buf.len().min(MAGIC.len());
    if buf[..n] != MAGIC[..n] {
        return Err("not the phasetrace rendezvous protocol (its first bytes differ)".into());
    }
    if buf.len() < HELLO_HEAD {
        if buf.len() > MAGIC.len() && buf[MAGIC.len()] > 1 {
            return Err(format!("a hello to {}, expected 0 or 1", buf[MAGIC.len()]));
        }
        return Ok(None);
    }
    let to = match buf[5] {
        0 => To::Root,
        1 => To::Mesh,
        other => return Err(format!("a hello to {other}, expected 0 or 1")),
    };
    let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let u16_at = |i: usize| u16::from_le_bytes([buf[i], buf[i + 1]]);
    let (rank, ranks, port) = (u32_at(6), u32_at(10), u16_at(14));
    let len = usize::from(u16_at(16));
    if len > MAX_GROUP {
        return Err(format!(
            "a group name of {len} bytes, expected at most {MAX_GROUP}"
        ));
    }
    let total = HELLO_HEAD + len + NONCE + MAC;
    if buf.len() < total {
        return Ok(None);
    }
    let group = std::str::from_utf8(&buf[HELLO_HEAD..HELLO_HEAD + len])
        .map_err(|_| "a group name that is not UTF-8".to_string())?
        .to_owned();
    let mut nonce = [0u8; NONCE];
    nonce.copy_from_slice(&buf[HELLO_HEAD + len..HELLO_HEAD + len + NONCE]);
    let mut mac = [0u8; MAC];
    mac.copy_from_slice(&buf[HELLO_HEAD + len + NONCE..total]);
    let hello = Hello {
        to,
        rank,
        ranks,
        port,
        group,
        nonce,
        mac,
    };
    Ok(Some((hello, total)))
}

/// A challenge: the magic and the listener's nonce.
pub(crate) fn challenge(nonce: &[u8; NONCE]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(nonce);
    out
}

fn invalid(m: String) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, m)
}

/// Reads a challenge: the listener's nonce.
pub(crate) fn read_challenge(r: &mut impl Read) -> std::io::Result<[u8; NONCE]> {
    let mut b = [0u8; 5 + NONCE];
    r.read_exact(&mut b)?;
    if &b[..5] != MAGIC {
        return Err(invalid(
            "it does not speak the phasetrace rendezvous protocol (version 3)".into(),
        ));
    }
    let mut nonce = [0u8; NONCE];
    nonce.copy_from_slice(&b[5..]);
    Ok(nonce)
}

/// A listener's answer to a hello.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Admitted, with the listener's proof that it knows the secret.
    Accepted([u8; MAC]),
    /// Refused, with why.
    Refused(String),
}

/// The bytes of an answer.
pub(crate) fn answer(a: &Answer) -> Vec<u8> {
    match a {
        Answer::Accepted(proof) => {
            let mut out = vec![0u8];
            out.extend_from_slice(proof);
            out
        }
        Answer::Refused(why) => {
            let mut out = vec![1u8];
            out.extend(text(why));
            out
        }
    }
}

/// Reads an answer.
pub(crate) fn read_answer(r: &mut impl Read) -> std::io::Result<Answer> {
    let mut status = [0u8; 1];
    r.read_exact(&mut status)?;
    match status[0] {
        0 => {
            let mut proof = [0u8; MAC];
            r.read_exact(&mut proof)?;
            Ok(Answer::Accepted(proof))
        }
        1 => Ok(Answer::Refused(read_text(r)?)),
        other => Err(invalid(format!("an answer {other}, expected 0 or 1"))),
    }
}

/// A text: its length (u16, cut at [`MAX_REASON`]) and its bytes.
pub(crate) fn text(t: &str) -> Vec<u8> {
    let mut end = t.len().min(MAX_REASON);
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    let t = &t.as_bytes()[..end];
    let mut out = (t.len() as u16).to_le_bytes().to_vec();
    out.extend_from_slice(t);
    out
}

/// Reads a text of at most [`MAX_REASON`] bytes (invalid UTF-8 replaced).
pub(crate) fn read_text(r: &mut impl Read) -> std::io::Result<String> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    let len = usize::from(u16::from_le_bytes(b));
    if len > MAX_REASON {
        return Err(invalid(format!(
            "a text of {len} bytes, expected at most {MAX_REASON}"
        )));
    }
    let mut t = vec![0u8; len];
    r.read_exact(&mut t)?;
    Ok(String::from_utf8_lossy(&t).into_owned())
}

/// The table rank 0 sends every rank: where ranks 1.. listen.
pub(crate) fn table(addrs: &[SocketAddr]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in addrs {
        out.extend(text(&a.ip().to_string()));
        out.extend_from_slice(&a.port().to_le_bytes());
    }
    out
}

/// Reads the table of `ranks` ranks (ranks 1 to `ranks - 1`).
pub(crate) fn read_table(r: &mut impl Read, ranks: u32) -> std::io::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for rank in 1..ranks {
        let mut b = [0u8; 2];
        r.read_exact(&mut b)?;
        let len = usize::from(u16::from_le_bytes(b));
        if len > MAX_IP_TEXT {
            return Err(invalid(format!(
                "an address of {len} bytes for rank {rank}, expected at most {MAX_IP_TEXT}"
            )));
        }
        let mut t = vec![0u8; len];
        r.read_exact(&mut t)?;
        let ip: IpAddr = std::str::from_utf8(&t)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| {
                invalid(format!(
                    "a bad address for rank {rank}: {:?}",
                    String::from_utf8_lossy(&t)
                ))
            })?;
        r.read_exact(&mut b)?;
        out.push(SocketAddr::new(ip, u16::from_le_bytes(b)));
    }
    Ok(out)
}

/// Reads one peer's part of exchange `seq`: its bytes, or `Err(why)` where the peer aborted
/// (a peer of its died); a message out of step or a part over [`MAX_PAYLOAD`] is an I/O error.
/// The part grows as its bytes arrive: a peer that announces a gigabyte and sends nothing
/// costs nothing.
pub(crate) fn read_data(r: &mut impl Read, seq: u64) -> std::io::Result<Result<Vec<u8>, String>> {
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind)?;
    if kind[0] == ABORT {
        return read_text(r).map(Err);
    }
    let mut b = [0u8; 12];
    r.read_exact(&mut b)?;
    let their = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if kind[0] != DATA || their != seq {
        return Err(invalid(format!(
            "out of step (message {} of collective {their}, expected data of {seq})",
            kind[0]
        )));
    }
    if len > MAX_PAYLOAD {
        return Err(invalid(format!(
            "a part of {len} bytes, expected at most {MAX_PAYLOAD}"
        )));
    }
    let mut bytes = Vec::with_capacity((len as usize).min(1 << 20));
    r.take(u64::from(len)).read_to_end(&mut bytes)?;
    if bytes.len() != len as usize {
        return Err(std::io::Error::new(
            ErrorKind::UnexpectedEof,
            format!("a part of {len} bytes ended after {}", bytes.len()),
        ));
    }
    Ok(Ok(bytes))
}

/// Reads one peer's arrival at meeting `seq`: whether it asks to stop, or `Err(why)` where
/// the peer aborted; a message out of step is an I/O error.
pub(crate) fn read_arrival(r: &mut impl Read, seq: u64) -> std::io::Result<Result<bool, String>> {
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind)?;
    if kind[0] == ABORT {
        return read_text(r).map(Err);
    }
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    let their = u64::from_le_bytes(b);
    if their != seq || !matches!(kind[0], ARRIVE | ARRIVE_STOP) {
        return Err(invalid(format!(
            "out of step (message {} of collective {their}, expected an arrival at {seq})",
            kind[0]
        )));
    }
    Ok(Ok(kind[0] == ARRIVE_STOP))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            to: To::Root,
            rank: 3,
            ranks: 4,
            port: 4242,
            group: "tp0".into(),
            nonce: [7; NONCE],
            mac: [9; MAC],
        }
    }

    #[test]
    fn a_hello_reads_back_only_once_whole() {
        let bytes = hello().encode();
        for cut in 0..bytes.len() {
            assert_eq!(parse_hello(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
        let mut more = bytes.clone();
        more.extend_from_slice(b"after");
        assert_eq!(parse_hello(&more), Ok(Some((hello(), bytes.len()))));
    }

    #[test]
    fn bytes_that_cannot_be_a_hello_are_refused_at_once() {
        assert!(parse_hello(b"GET / HTTP/1.1\r\n").is_err());
        assert!(parse_hello(b"P").unwrap().is_none());
        assert!(parse_hello(b"PX").is_err());
        assert!(parse_hello(b"PTRV3\x07").is_err());
        let mut long = hello().encode();
        long[16..18].copy_from_slice(&(MAX_GROUP as u16 + 1).to_le_bytes());
        let e = parse_hello(&long[..HELLO_HEAD]).unwrap_err();
        assert!(e.contains("65 bytes, expected at most 64"), "{e}");
    }

    #[test]
    fn an_announced_part_is_not_allocated_before_it_arrives() {
        let mut msg = vec![DATA];
        msg.extend_from_slice(&1u64.to_le_bytes());
        msg.extend_from_slice(&MAX_PAYLOAD.to_le_bytes());
        msg.extend_from_slice(b"only this");
        let e = read_data(&mut msg.as_slice(), 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "{e}");
        let mut msg = vec![DATA];
        msg.extend_from_slice(&1u64.to_le_bytes());
        msg.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = read_data(&mut msg.as_slice(), 1).unwrap_err().to_string();
        assert!(
            e.contains("4294967295 bytes") && e.contains("at most"),
            "{e}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// What the fuzz target `rendezvous` checks, on random bytes (a valid hello's prefix
        /// among them): no panic; a hello reads back from its encoding, every prefix of it is
        /// incomplete, and refused bytes stay refused whatever follows.
        #[test]
        fn any_bytes_read_as_the_fuzz_target_expects(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            cut in 0usize..200,
        ) {
            let mut data = data;
            if cut % 2 == 0 {
                let mut h = hello().encode();
                h.truncate(cut.min(h.len()));
                h.extend_from_slice(&data);
                data = h;
            }
            match parse_hello(&data) {
                Ok(Some((h, used))) => {
                    proptest::prop_assert!(used <= MAX_HELLO);
                    proptest::prop_assert_eq!(&h.encode()[..], &data[..used]);
                    for c in [0, used / 2, used - 1] {
                        proptest::prop_assert_eq!(parse_hello(&data[..c]), Ok(None));
                    }
                }
                Ok(None) => proptest::prop_assert!(data.len() < MAX_HELLO),
                Err(_) => {
                    let mut more = data.clone();
                    more.extend_from_slice(&[0u8; 128]);
                    proptest::prop_assert!(parse_hello(&more).is_err());
                }
            }
            let _ = read_challenge(&mut data.as_slice());
            let _ = read_answer(&mut data.as_slice());
            let _ = read_table(&mut data.as_slice(), 4);
            let _ = read_arrival(&mut data.as_slice(), 1);
            if let Ok(Ok(part)) = read_data(&mut data.as_slice(), 1) {
                proptest::prop_assert!(part.len() < data.len());
            }
        }
    }

    #[test]
    fn answers_tables_and_texts_read_back() {
        let a = Answer::Refused("wrong group secret".into());
        assert_eq!(read_answer(&mut answer(&a).as_slice()).unwrap(), a);
        let a = Answer::Accepted([5; MAC]);
        assert_eq!(read_answer(&mut answer(&a).as_slice()).unwrap(), a);
        let addrs: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().unwrap(),
            "[::1]:65535".parse().unwrap(),
        ];
        assert_eq!(read_table(&mut table(&addrs).as_slice(), 3).unwrap(), addrs);
        let long = "é".repeat(MAX_REASON);
        let t = read_text(&mut text(&long).as_slice()).unwrap();
        assert!(t.len() <= MAX_REASON && long.starts_with(&t));
    }
}
