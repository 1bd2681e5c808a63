//! The demo's all-reduce rendezvous when each rank is its own process (`--rank R --rendezvous
//! HOST:PORT`): rank 0 listens, the others connect, and every collective is a star barrier over
//! TCP. A peer that dies or stops answering makes every other rank fail naming it; nothing
//! waits forever (every read and write has the rendezvous timeout).
//!
//! ```text
//! member --hello(rank, ranks, group)--> rank 0 --welcome | refusal-->
//! member --arrive(seq, stop?)--------> rank 0   (rank 0 reads every member's arrival)
//! member <-------go(seq, stop) | abort(why)--   (then answers all of them)
//! ```

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 5] = b"PTRV1";
const ARRIVE: u8 = 1;
const ARRIVE_STOP: u8 = 2;
const GO: u8 = 1;
const GO_STOP: u8 = 2;
const ABORT: u8 = 3;
/// Pause between connection attempts while rank 0 is not listening yet.
const RETRY: Duration = Duration::from_millis(100);

/// Why a rank cannot go on.
#[derive(Debug)]
pub(crate) enum RendezvousError {
    /// The address does not resolve or cannot be listened on.
    Address(String),
    /// The group could not be formed in time (ranks missing, refused, mismatched).
    Setup(String),
    /// A peer died, closed its connection, or did not arrive in time.
    LostPeer(String),
}

impl fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousError::Address(m) | RendezvousError::Setup(m) => f.write_str(m),
            RendezvousError::LostPeer(m) => write!(f, "lost peer {m}"),
        }
    }
}

struct Peer {
    rank: u32,
    addr: SocketAddr,
    stream: TcpStream,
}

enum Role {
    Root { peers: Vec<Peer> },
    Member { root: TcpStream, addr: SocketAddr },
}

/// One rank's end of the rendezvous.
pub(crate) struct TcpRendezvous {
    role: Role,
    seq: u64,
    timeout: Duration,
}

fn resolve(addr: &str) -> Result<SocketAddr, RendezvousError> {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            RendezvousError::Address(format!(
                "--rendezvous {addr}: expected HOST:PORT that resolves to an address"
            ))
        })
}

fn describe(e: &std::io::Error, timeout: Duration) -> String {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            format!("no answer within {}s", timeout.as_secs_f64())
        }
        ErrorKind::UnexpectedEof => "connection closed (the process exited or was killed)".into(),
        _ => e.to_string(),
    }
}

fn configure(s: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))
}

impl TcpRendezvous {
    /// Forms the group: rank 0 listens at `addr` and waits for the other `ranks - 1`; any other
    /// rank connects to it (retrying while rank 0 is not up yet). Both give up after `timeout`.
    pub(crate) fn join(
        addr: &str,
        rank: u32,
        ranks: u32,
        group: &str,
        timeout: Duration,
    ) -> Result<TcpRendezvous, RendezvousError> {
        let at = resolve(addr)?;
        let role = if rank == 0 {
            Self::listen(at, ranks, group, timeout)?
        } else {
            Self::connect(at, rank, ranks, group, timeout)?
        };
        Ok(TcpRendezvous {
            role,
            seq: 0,
            timeout,
        })
    }

    fn listen(
        at: SocketAddr,
        ranks: u32,
        group: &str,
        timeout: Duration,
    ) -> Result<Role, RendezvousError> {
        let listener = TcpListener::bind(at).map_err(|e| {
            RendezvousError::Address(format!(
                "--rendezvous {at}: rank 0 cannot listen there ({e}); expected a free local address"
            ))
        })?;
        let setup = |m: String| RendezvousError::Setup(format!("rendezvous at {at}: {m}"));
        listener
            .set_nonblocking(true)
            .map_err(|e| setup(e.to_string()))?;
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Peer> = Vec::new();
        while peers.len() + 1 < ranks as usize {
            let (mut stream, addr) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = (1..ranks)
                            .filter(|r| !peers.iter().any(|p| p.rank == *r))
                            .map(|r| r.to_string())
                            .collect();
                        return Err(setup(format!(
                            "only {} of {} ranks joined within {}s (missing ranks {})",
                            peers.len() + 1,
                            ranks,
                            timeout.as_secs_f64(),
                            missing.join(", ")
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(setup(format!("accept failed: {e}"))),
            };
            let ready = stream
                .set_nonblocking(false)
                .and_then(|()| configure(&stream, timeout));
            if let Err(e) = ready {
                return Err(setup(format!("{addr}: {e}")));
            }
            let mut hello = [0u8; 14];
            if let Err(e) = stream.read_exact(&mut hello) {
                eprintln!(
                    "phasetrace: rendezvous: ignoring a connection from {addr} ({})",
                    describe(&e, timeout)
                );
                continue;
            }
            let mut name = vec![0u8; usize::from(hello[13])];
            let read_name = stream.read_exact(&mut name);
            let their_rank = u32::from_le_bytes([hello[5], hello[6], hello[7], hello[8]]);
            let their_ranks = u32::from_le_bytes([hello[9], hello[10], hello[11], hello[12]]);
            let their_group = String::from_utf8_lossy(&name).into_owned();
            let refusal = if &hello[..5] != MAGIC || read_name.is_err() {
                Some(format!("{addr} is not a phasetrace demo rank"))
            } else if their_ranks != ranks {
                Some(format!(
                    "rank {their_rank} at {addr} was started with --ranks {their_ranks}, rank 0 with --ranks {ranks}"
                ))
            } else if their_group != group {
                Some(format!(
                    "rank {their_rank} at {addr} is in group {their_group:?}, rank 0 in group {group:?}"
                ))
            } else if their_rank == 0 || their_rank >= ranks {
                Some(format!(
                    "a rank at {addr} says it is rank {their_rank}; expected 1 to {}",
                    ranks - 1
                ))
            } else if let Some(p) = peers.iter().find(|p| p.rank == their_rank) {
                Some(format!(
                    "rank {their_rank} joined twice (from {} and {addr})",
                    p.addr
                ))
            } else {
                None
            };
            match refusal {
                None => {
                    stream
                        .write_all(&[0])
                        .map_err(|e| setup(format!("rank {their_rank} at {addr}: {e}")))?;
                    peers.push(Peer {
                        rank: their_rank,
                        addr,
                        stream,
                    });
                }
                Some(why) => {
                    let mut msg = vec![1u8];
                    msg.extend_from_slice(&(why.len() as u16).to_le_bytes());
                    msg.extend_from_slice(why.as_bytes());
                    let _ = stream.write_all(&msg);
                    return Err(setup(why));
                }
            }
        }
        peers.sort_by_key(|p| p.rank);
        Ok(Role::Root { peers })
    }

    fn connect(
        at: SocketAddr,
        rank: u32,
        ranks: u32,
        group: &str,
        timeout: Duration,
    ) -> Result<Role, RendezvousError> {
        let setup = |m: String| RendezvousError::Setup(format!("rank {rank}: {m}"));
        if rank >= ranks {
            return Err(setup(format!("expected a rank below --ranks {ranks}")));
        }
        let deadline = Instant::now() + timeout;
        let mut stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&at, left.clamp(Duration::from_millis(1), RETRY * 10))
            {
                Ok(s) => break s,
                Err(e) if Instant::now() + RETRY < deadline => {
                    let _ = e;
                    std::thread::sleep(RETRY);
                }
                Err(e) => {
                    return Err(setup(format!(
                        "cannot reach rank 0 at {at} within {}s ({e})",
                        timeout.as_secs_f64()
                    )));
                }
            }
        };
        configure(&stream, timeout).map_err(|e| setup(e.to_string()))?;
        let name = group.as_bytes();
        let mut hello = Vec::with_capacity(14 + name.len());
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&rank.to_le_bytes());
        hello.extend_from_slice(&ranks.to_le_bytes());
        // Group names are at most 64 bytes (the library checks them).
        hello.push(name.len().min(255) as u8);
        hello.extend_from_slice(&name[..name.len().min(255)]);
        let lost = |e: std::io::Error| {
            RendezvousError::LostPeer(format!("rank 0 ({at}): {}", describe(&e, timeout)))
        };
        stream.write_all(&hello).map_err(lost)?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).map_err(lost)?;
        if answer[0] != 0 {
            let why = read_text(&mut stream).unwrap_or_else(|_| "no reason given".into());
            return Err(setup(format!(
                "rank 0 at {at} refused to form the group: {why}"
            )));
        }
        Ok(Role::Member {
            root: stream,
            addr: at,
        })
    }

    /// One rendezvous of the whole group: returns once every rank has arrived. `stop` asks the
    /// group to stop; the answer is the group's decision (rank 0's, or any rank's request).
    pub(crate) fn meet(&mut self, stop: bool) -> Result<bool, RendezvousError> {
        self.seq += 1;
        let seq = self.seq;
        let timeout = self.timeout;
        match &mut self.role {
            Role::Member { root, addr } => {
                let lost = |e: std::io::Error| {
                    RendezvousError::LostPeer(format!("rank 0 ({addr}): {}", describe(&e, timeout)))
                };
                let mut msg = [0u8; 9];
                msg[0] = if stop { ARRIVE_STOP } else { ARRIVE };
                msg[1..].copy_from_slice(&seq.to_le_bytes());
                root.write_all(&msg).map_err(lost)?;
                let mut kind = [0u8; 1];
                root.read_exact(&mut kind).map_err(lost)?;
                if kind[0] == ABORT {
                    let why = read_text(root).map_err(lost)?;
                    return Err(RendezvousError::LostPeer(format!(
                        "{why} (reported by rank 0)"
                    )));
                }
                let mut got = [0u8; 8];
                root.read_exact(&mut got).map_err(lost)?;
                let got = u64::from_le_bytes(got);
                if got != seq || !matches!(kind[0], GO | GO_STOP) {
                    return Err(RendezvousError::LostPeer(format!(
                        "rank 0 ({addr}): out of step (collective {got}, expected {seq})"
                    )));
                }
                Ok(kind[0] == GO_STOP)
            }
            Role::Root { peers } => {
                let mut decision = stop;
                let mut failed = None;
                for (i, p) in peers.iter_mut().enumerate() {
                    let mut msg = [0u8; 9];
                    match p.stream.read_exact(&mut msg) {
                        Ok(()) => {
                            let got = u64::from_le_bytes(msg[1..].try_into().unwrap_or_default());
                            if got != seq || !matches!(msg[0], ARRIVE | ARRIVE_STOP) {
                                failed = Some((
                                    i,
                                    format!(
                                        "rank {} ({}): out of step (collective {got}, expected {seq})",
                                        p.rank, p.addr
                                    ),
                                ));
                                break;
                            }
                            decision |= msg[0] == ARRIVE_STOP;
                        }
                        Err(e) => {
                            failed = Some((
                                i,
                                format!("rank {} ({}): {}", p.rank, p.addr, describe(&e, timeout)),
                            ));
                            break;
                        }
                    }
                }
                if let Some((bad, why)) = failed {
                    // Tell the others who is gone, so they name it rather than rank 0.
                    let mut msg = vec![ABORT];
                    msg.extend_from_slice(&(why.len() as u16).to_le_bytes());
                    msg.extend_from_slice(why.as_bytes());
                    for (i, p) in peers.iter_mut().enumerate() {
                        if i != bad {
                            let _ = p.stream.write_all(&msg);
                        }
                    }
                    return Err(RendezvousError::LostPeer(why));
                }
                let mut msg = [0u8; 9];
                msg[0] = if decision { GO_STOP } else { GO };
                msg[1..].copy_from_slice(&seq.to_le_bytes());
                for p in peers.iter_mut() {
                    if let Err(e) = p.stream.write_all(&msg) {
                        return Err(RendezvousError::LostPeer(format!(
                            "rank {} ({}): {}",
                            p.rank,
                            p.addr,
                            describe(&e, timeout)
                        )));
                    }
                }
                Ok(decision)
            }
        }
    }
}

fn read_text(s: &mut TcpStream) -> std::io::Result<String> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut text = vec![0u8; usize::from(u16::from_le_bytes(len))];
    s.read_exact(&mut text)?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    #[test]
    fn ranks_meet_and_share_the_stop_decision() {
        let addr = free_addr();
        let t = Duration::from_secs(10);
        let members: Vec<_> = (1..3)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut rv = TcpRendezvous::join(&addr, r, 3, "g", t).unwrap();
                    let mut n = 0;
                    // Rank 2 asks to stop at its fifth meeting; everyone stops there.
                    while !rv.meet(r == 2 && n == 4).unwrap() {
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut root = TcpRendezvous::join(&addr, 0, 3, "g", t).unwrap();
        let mut n = 0;
        while !root.meet(false).unwrap() {
            n += 1;
        }
        assert_eq!(n, 4);
        for m in members {
            assert_eq!(m.join().unwrap(), 4);
        }
    }

    #[test]
    fn a_dead_peer_is_named_by_everyone_left() {
        let addr = free_addr();
        let t = Duration::from_secs(10);
        let a = addr.clone();
        let survivor = std::thread::spawn(move || {
            let mut rv = TcpRendezvous::join(&a, 1, 3, "g", t).unwrap();
            loop {
                if let Err(e) = rv.meet(false) {
                    return e.to_string();
                }
            }
        });
        let a = addr.clone();
        let doomed = std::thread::spawn(move || {
            let mut rv = TcpRendezvous::join(&a, 2, 3, "g", t).unwrap();
            rv.meet(false).unwrap();
            // Dropping the connection stands in for the process dying.
        });
        let mut root = TcpRendezvous::join(&addr, 0, 3, "g", t).unwrap();
        root.meet(false).unwrap();
        doomed.join().unwrap();
        let err = root.meet(false).unwrap_err().to_string();
        assert!(err.starts_with("lost peer rank 2 (127.0.0.1:"), "{err}");
        assert!(err.contains("connection closed"), "{err}");
        let theirs = survivor.join().unwrap();
        assert!(
            theirs.starts_with("lost peer rank 2 (127.0.0.1:")
                && theirs.ends_with("(reported by rank 0)"),
            "{theirs}"
        );
    }

    #[test]
    fn a_mismatched_group_is_refused_naming_both() {
        let addr = free_addr();
        let t = Duration::from_secs(10);
        let a = addr.clone();
        let member = std::thread::spawn(move || {
            TcpRendezvous::join(&a, 1, 2, "tp1", t)
                .err()
                .map(|e| e.to_string())
        });
        let err = TcpRendezvous::join(&addr, 0, 2, "tp0", t)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("rank 1 at 127.0.0.1:")
                && err.contains("group \"tp1\", rank 0 in group \"tp0\""),
            "{err}"
        );
        let theirs = member.join().unwrap().unwrap();
        assert!(theirs.contains("refused to form the group"), "{theirs}");
    }

    #[test]
    fn nobody_waits_forever_for_a_missing_rank() {
        let addr = free_addr();
        let err = TcpRendezvous::join(&addr, 0, 2, "g", Duration::from_millis(300))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("only 1 of 2 ranks joined within 0.3s (missing ranks 1)"),
            "{err}"
        );
        let err = TcpRendezvous::join(&addr, 1, 2, "g", Duration::from_millis(300))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("cannot reach rank 0 at"), "{err}");
    }
}
