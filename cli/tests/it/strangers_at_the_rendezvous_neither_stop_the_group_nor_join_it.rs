//! A group of `phasetrace demo --engine candle --rank R --rendezvous HOST:PORT` processes with a
//! group secret forms while strangers beset rank 0: 200 idle connections, a connection sending
//! random bytes, a handshake sent one byte a second, and a rank started with a wrong secret.
//! The wrong-secret rank exits non-zero saying so; the group still forms and generates what
//! rank threads generate (the same checksum), and rank 0 counts the strangers in one line.

use crate::cli::{self, Finished};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The model and run: 2 ranks, dense and MoE layers, a few steps.
const RUN: &[&str] = &[
    "demo",
    "--engine",
    "candle",
    "--ranks",
    "2",
    "--layers",
    "2",
    "--hidden",
    "128",
    "--experts",
    "8",
    "--top-k",
    "2",
    "--steps",
    "6",
    "--prometheus",
    "off",
    "--trace-every",
    "0",
];

fn checksum(f: &Finished, who: &str) -> String {
    assert_eq!(f.code, Some(0), "{who}: {f}");
    let last = f.stdout.lines().last().unwrap_or("");
    assert!(last.contains("checksum"), "{who}: last line {last:?}\n{f}");
    last.split_whitespace()
        .find(|w| w.len() == 16 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("{who}: a hex digest in {last:?}"))
        .to_owned()
}

fn rank(r: u32, rendezvous: &str, secret: &Path) -> Command {
    let mut cmd = cli::command();
    cmd.args(RUN).args([
        "--rank",
        &r.to_string(),
        "--rendezvous",
        rendezvous,
        "--rendezvous-timeout",
        "60",
        "--rendezvous-secret-file",
    ]);
    cmd.arg(secret);
    cmd
}

/// Connects once rank 0 listens.
fn connect(at: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match TcpStream::connect(at) {
            Ok(s) => return s,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "rank 0 never listened at {at}: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// What rank `r`'s formation line says: seconds from its start to the group formed.
fn formed_in(f: &Finished, r: u32) -> f64 {
    let prefix = format!("phasetrace: rendezvous: rank {r} of 2: the group formed in ");
    f.stderr
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.strip_suffix('s')?.parse().ok())
        .unwrap_or_else(|| panic!("rank {r}'s formation line: {f}"))
}

#[test]
fn strangers_at_rank_0_neither_stop_the_group_nor_join_it() {
    let dir = std::env::temp_dir().join(format!("phasetrace-strangers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let (right, wrong) = (dir.join("secret"), dir.join("wrong"));
    std::fs::write(&right, "the group's secret, 32 bytes....\n").expect("the secret file");
    std::fs::write(&wrong, "not the group's secret, at all..\n").expect("the wrong one");
    let at: SocketAddr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address")
    };
    let addr = at.to_string();

    let root = {
        let cmd = rank(0, &addr, &right);
        std::thread::spawn(move || cli::run(cmd, Duration::from_secs(300)))
    };
    // 200 idle connections: more than rank 0 keeps pending (the oldest are evicted).
    let idle: Vec<TcpStream> = (0..200).map(|_| connect(at)).collect();
    // Random bytes (a fixed xorshift, so that a failure reproduces).
    let mut junk = connect(at);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let bytes: Vec<u8> = (0..64)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    junk.write_all(&bytes).expect("the random bytes");
    // A hello that starts right, one byte a second.
    let slow = std::thread::spawn(move || {
        let mut s = connect(at);
        let mut challenge = [0u8; 21];
        s.read_exact(&mut challenge).expect("rank 0's challenge");
        let mut hello = b"PTRV3\x00".to_vec();
        hello.extend_from_slice(&1u32.to_le_bytes());
        hello.extend_from_slice(&2u32.to_le_bytes());
        hello.extend_from_slice(&[0; 2 + 2 + 16 + 32]);
        let mut sent = 0;
        for b in hello {
            if s.write_all(&[b]).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_secs(1));
        }
        sent
    });

    let intruder = cli::run(rank(1, &addr, &wrong), Duration::from_secs(120));
    assert_ne!(intruder.code, Some(0), "the wrong-secret rank: {intruder}");
    let refused = format!("rank 0 at {addr} refused to form the group: wrong group secret");
    assert!(intruder.stderr.contains(&refused), "{intruder}");
    assert!(
        !intruder.all().contains("32 bytes") && !intruder.all().contains("at all.."),
        "a secret printed: {intruder}"
    );

    let member = cli::run(rank(1, &addr, &right), Duration::from_secs(300));
    let root = root.join().expect("rank 0's runner");
    let expected = {
        let mut cmd = cli::command();
        cmd.args(RUN);
        checksum(&cli::run(cmd, Duration::from_secs(300)), "rank threads")
    };
    assert_eq!(checksum(&root, "rank 0"), expected, "rank 0");
    assert_eq!(checksum(&member, "rank 1"), expected, "rank 1");
    let took = formed_in(&member, 1);
    eprintln!("rank 1 joined the group in {took:.3}s beside the strangers");
    // Far below the 60 s rendezvous timeout that a stranger holding the door would cost.
    assert!(took < 30.0, "rank 1 took {took}s to join: {member}");

    // Rank 0 says what it closed, in one line.
    let line = root
        .stderr
        .lines()
        .find(|l| l.contains("connections that were not ranks of this group"))
        .unwrap_or_else(|| panic!("rank 0's strangers line: {root}"));
    eprintln!("rank 0: {line}");
    for part in [
        "1 wrong group secret",
        "not the protocol",
        "evicted for newer connections",
    ] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    let closed: u64 = line
        .split_whitespace()
        .nth(5)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count in {line}"));
    assert!(closed >= 203, "{line}");
    assert_eq!(
        root.stderr
            .lines()
            .filter(|l| l.contains("not ranks of this group"))
            .count(),
        1,
        "{root}"
    );
    // The slow handshake was cut off at rank 0's handshake timeout, long before it was whole.
    let sent = slow.join().expect("the slow handshake");
    assert!(sent < 60, "{sent} bytes sent one a second");
    drop((idle, junk));
    let _ = std::fs::remove_dir_all(&dir);
}
