//! The demo's all-reduce rendezvous when each rank is its own process (`--rank R --rendezvous
//! HOST:PORT`): rank 0 listens there and hands every rank the others' addresses, the ranks
//! connect into a full mesh, and every collective is a barrier over it: each rank tells every
//! other it has arrived, then waits to hear the same from all of them. Every rank's wait is
//! symmetric (no rank is a hub that learns of the last arrival first, which would make it look
//! like a straggler), and a peer that dies is seen by every other rank on its own connection.
//! Nothing waits forever: every read and write has the rendezvous timeout.
//!
//! ```text
//! rank r --hello(rank, ranks, listen port, group)--> rank 0 --addresses of all ranks | refusal
//! rank r --join(rank)--> each lower rank s > 0 (the higher ones join r)
//! meet:  rank r --arrive(seq, stop?)--> every other rank; reads arrive(seq) from every other
//!        rank (or abort(why) from one that saw a peer die)
//! exchange: rank r --data(seq, len, bytes)--> every other rank (on a writer thread); reads
//!        data(seq) from every other rank: the candle engine's all-reduce of partial outputs
//! ```

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 5] = b"PTRV2";
const ARRIVE: u8 = 1;
const ARRIVE_STOP: u8 = 2;
const ABORT: u8 = 3;
#[cfg_attr(not(feature = "candle"), allow(dead_code))]
const DATA: u8 = 4;
/// Most bytes one rank's part of an exchange may hold: a broken or hostile peer cannot make
/// a rank allocate more (the candle engine's largest partial, a prefill of 64 prompts of 768
/// tokens at width 4096, is 0.8 GB).
#[cfg_attr(not(feature = "candle"), allow(dead_code))]
pub(crate) const MAX_PAYLOAD: u32 = 1 << 30;
/// Pause between connection attempts while a peer is not listening yet.
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

/// One rank's end of the rendezvous: a connection to every other rank.
pub(crate) struct TcpRendezvous {
    peers: Vec<Peer>,
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
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            "connection closed (the process exited or was killed)".into()
        }
        _ => e.to_string(),
    }
}

fn configure(s: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))
}

fn read_u32(s: &mut TcpStream) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u16(s: &mut TcpStream) -> std::io::Result<u16> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_le_bytes(b))
}

fn read_text(s: &mut TcpStream) -> std::io::Result<String> {
    let len = read_u16(s)?;
    let mut text = vec![0u8; usize::from(len)];
    s.read_exact(&mut text)?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

fn text(t: &str) -> Vec<u8> {
    let t = &t.as_bytes()[..t.len().min(usize::from(u16::MAX))];
    let mut out = (t.len() as u16).to_le_bytes().to_vec();
    out.extend_from_slice(t);
    out
}

/// Accepts one connection before `deadline` (the listener is non-blocking).
fn accept_until(
    listener: &TcpListener,
    deadline: Instant,
) -> std::io::Result<Option<(TcpStream, SocketAddr)>> {
    loop {
        match listener.accept() {
            Ok(c) => return Ok(Some(c)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Connects to `at`, retrying until `deadline` while nothing listens there yet.
fn connect_until(at: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&at, left.clamp(Duration::from_millis(1), RETRY * 10)) {
            Ok(s) => return Ok(s),
            Err(_) if Instant::now() + RETRY < deadline => std::thread::sleep(RETRY),
            Err(e) => return Err(e),
        }
    }
}

impl TcpRendezvous {
    /// Forms the group: rank 0 listens at `addr` and waits for the other `ranks - 1`; any other
    /// rank connects to it (retrying while rank 0 is not up yet), then to the ranks below it,
    /// and accepts the ranks above it. Everyone gives up after `timeout`.
    pub(crate) fn join(
        addr: &str,
        rank: u32,
        ranks: u32,
        group: &str,
        timeout: Duration,
    ) -> Result<TcpRendezvous, RendezvousError> {
        let at = resolve(addr)?;
        let deadline = Instant::now() + timeout;
        let peers = if rank == 0 {
            Self::host(at, ranks, group, timeout, deadline)?
        } else {
            Self::member(at, rank, ranks, group, timeout, deadline)?
        };
        Ok(TcpRendezvous {
            peers,
            seq: 0,
            timeout,
        })
    }

    /// Rank 0: admits every other rank, then tells each where the others listen.
    fn host(
        at: SocketAddr,
        ranks: u32,
        group: &str,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<Peer>, RendezvousError> {
        let listener = TcpListener::bind(at).map_err(|e| {
            RendezvousError::Address(format!(
                "--rendezvous {at}: rank 0 cannot listen there ({e}); expected a free local address"
            ))
        })?;
        let setup = |m: String| RendezvousError::Setup(format!("rendezvous at {at}: {m}"));
        listener
            .set_nonblocking(true)
            .map_err(|e| setup(e.to_string()))?;
        // (peer, the port it listens on for the ranks above it)
        let mut joined: Vec<(Peer, u16)> = Vec::new();
        while joined.len() + 1 < ranks as usize {
            let Some((mut stream, addr)) =
                accept_until(&listener, deadline).map_err(|e| setup(format!("accept: {e}")))?
            else {
                let missing: Vec<String> = (1..ranks)
                    .filter(|r| !joined.iter().any(|(p, _)| p.rank == *r))
                    .map(|r| r.to_string())
                    .collect();
                return Err(setup(format!(
                    "only {} of {} ranks joined within {}s (missing ranks {})",
                    joined.len() + 1,
                    ranks,
                    timeout.as_secs_f64(),
                    missing.join(", ")
                )));
            };
            configure(&stream, timeout).map_err(|e| setup(format!("{addr}: {e}")))?;
            let hello = (|| -> std::io::Result<(bool, u32, u32, u16, String)> {
                let mut magic = [0u8; 5];
                stream.read_exact(&mut magic)?;
                let (r, n, port) = (
                    read_u32(&mut stream)?,
                    read_u32(&mut stream)?,
                    read_u16(&mut stream)?,
                );
                let g = read_text(&mut stream)?;
                Ok((&magic == MAGIC, r, n, port, g))
            })();
            let (their_rank, port, refusal) = match hello {
                Err(e) => {
                    eprintln!(
                        "phasetrace: rendezvous: ignoring a connection from {addr} ({})",
                        describe(&e, timeout)
                    );
                    continue;
                }
                Ok((false, ..)) => (0, 0, Some(format!("{addr} is not a phasetrace demo rank"))),
                Ok((true, r, n, port, g)) => {
                    let why = if n != ranks {
                        Some(format!(
                            "rank {r} at {addr} was started with --ranks {n}, rank 0 with --ranks {ranks}"
                        ))
                    } else if g != group {
                        Some(format!(
                            "rank {r} at {addr} is in group {g:?}, rank 0 in group {group:?}"
                        ))
                    } else if r == 0 || r >= ranks {
                        Some(format!(
                            "a rank at {addr} says it is rank {r}; expected 1 to {}",
                            ranks - 1
                        ))
                    } else if let Some((p, _)) = joined.iter().find(|(p, _)| p.rank == r) {
                        Some(format!(
                            "rank {r} joined twice (from {} and {addr})",
                            p.addr
                        ))
                    } else {
                        None
                    };
                    (r, port, why)
                }
            };
            if let Some(why) = refusal {
                let mut msg = vec![1u8];
                msg.extend(text(&why));
                let _ = stream.write_all(&msg);
                return Err(setup(why));
            }
            joined.push((
                Peer {
                    rank: their_rank,
                    addr,
                    stream,
                },
                port,
            ));
        }
        joined.sort_by_key(|(p, _)| p.rank);
        // Every rank learns where every other listens: the address rank 0 sees it at.
        let mut table = vec![0u8];
        for (p, port) in &joined {
            table.extend(text(&p.addr.ip().to_string()));
            table.extend_from_slice(&port.to_le_bytes());
        }
        let mut peers = Vec::new();
        for (mut p, _) in joined {
            p.stream.write_all(&table).map_err(|e| {
                RendezvousError::LostPeer(format!(
                    "rank {} ({}): {}",
                    p.rank,
                    p.addr,
                    describe(&e, timeout)
                ))
            })?;
            peers.push(p);
        }
        Ok(peers)
    }

    /// Rank r > 0: joins rank 0, then the ranks below it, and admits the ranks above it.
    fn member(
        at: SocketAddr,
        rank: u32,
        ranks: u32,
        group: &str,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<Peer>, RendezvousError> {
        let setup = |m: String| RendezvousError::Setup(format!("rank {rank}: {m}"));
        if rank >= ranks {
            return Err(setup(format!("expected a rank below --ranks {ranks}")));
        }
        let mut root = connect_until(at, deadline).map_err(|e| {
            setup(format!(
                "cannot reach rank 0 at {at} within {}s ({e})",
                timeout.as_secs_f64()
            ))
        })?;
        configure(&root, timeout).map_err(|e| setup(e.to_string()))?;
        // Listen where rank 0 reached us: the ranks above us come the same way.
        let local = root.local_addr().map_err(|e| setup(e.to_string()))?;
        let listener = TcpListener::bind((local.ip(), 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| {
                setup(format!(
                    "cannot listen on {} for the other ranks ({e})",
                    local.ip()
                ))
            })?;
        let port = listener
            .local_addr()
            .map_err(|e| setup(e.to_string()))?
            .port();
        let lost0 = |e: std::io::Error| {
            RendezvousError::LostPeer(format!("rank 0 ({at}): {}", describe(&e, timeout)))
        };
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&rank.to_le_bytes());
        hello.extend_from_slice(&ranks.to_le_bytes());
        hello.extend_from_slice(&port.to_le_bytes());
        hello.extend(text(group));
        root.write_all(&hello).map_err(lost0)?;
        let mut answer = [0u8; 1];
        root.read_exact(&mut answer).map_err(lost0)?;
        if answer[0] != 0 {
            let why = read_text(&mut root).unwrap_or_else(|_| "no reason given".into());
            return Err(setup(format!(
                "rank 0 at {at} refused to form the group: {why}"
            )));
        }
        let mut table = Vec::new();
        for r in 1..ranks {
            let ip = read_text(&mut root).map_err(lost0)?;
            let port = read_u16(&mut root).map_err(lost0)?;
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| setup(format!("rank 0 sent a bad address for rank {r}: {ip:?}")))?;
            table.push(SocketAddr::new(ip, port));
        }
        let mut peers = vec![Peer {
            rank: 0,
            addr: at,
            stream: root,
        }];
        for s in 1..rank {
            let addr = table[s as usize - 1];
            let mut stream = connect_until(addr, deadline)
                .map_err(|e| setup(format!("cannot reach rank {s} at {addr} ({e})")))?;
            configure(&stream, timeout).map_err(|e| setup(e.to_string()))?;
            let mut join = MAGIC.to_vec();
            join.extend_from_slice(&rank.to_le_bytes());
            stream.write_all(&join).map_err(|e| {
                RendezvousError::LostPeer(format!("rank {s} ({addr}): {}", describe(&e, timeout)))
            })?;
            peers.push(Peer {
                rank: s,
                addr,
                stream,
            });
        }
        while peers.len() < ranks as usize - 1 {
            let Some((mut stream, addr)) =
                accept_until(&listener, deadline).map_err(|e| setup(format!("accept: {e}")))?
            else {
                let missing: Vec<String> = (rank + 1..ranks)
                    .filter(|r| !peers.iter().any(|p| p.rank == *r))
                    .map(|r| r.to_string())
                    .collect();
                return Err(setup(format!(
                    "ranks {} did not connect within {}s",
                    missing.join(", "),
                    timeout.as_secs_f64()
                )));
            };
            configure(&stream, timeout).map_err(|e| setup(e.to_string()))?;
            let mut magic = [0u8; 5];
            let r = stream
                .read_exact(&mut magic)
                .and_then(|()| read_u32(&mut stream));
            match r {
                Ok(r)
                    if &magic == MAGIC
                        && r > rank
                        && r < ranks
                        && !peers.iter().any(|p| p.rank == r) =>
                {
                    // Where it listens (not the ephemeral port it came from), for messages.
                    let addr = SocketAddr::new(addr.ip(), table[r as usize - 1].port());
                    peers.push(Peer {
                        rank: r,
                        addr,
                        stream,
                    });
                }
                _ => eprintln!("phasetrace: rendezvous: ignoring a connection from {addr}"),
            }
        }
        peers.sort_by_key(|p| p.rank);
        Ok(peers)
    }

    /// One rendezvous of the whole group: returns once every rank has arrived. `stop` asks the
    /// group to stop; the answer is the group's decision (any rank's request), the same on
    /// every rank.
    pub(crate) fn meet(&mut self, stop: bool) -> Result<bool, RendezvousError> {
        self.seq += 1;
        let seq = self.seq;
        let timeout = self.timeout;
        let mut msg = [0u8; 9];
        msg[0] = if stop { ARRIVE_STOP } else { ARRIVE };
        msg[1..].copy_from_slice(&seq.to_le_bytes());
        let mut failed = None;
        for p in &mut self.peers {
            if let Err(e) = p.stream.write_all(&msg) {
                failed = Some(format!(
                    "rank {} ({}): {}",
                    p.rank,
                    p.addr,
                    describe(&e, timeout)
                ));
                break;
            }
        }
        let mut decision = stop;
        if failed.is_none() {
            for p in &mut self.peers {
                let mut kind = [0u8; 1];
                let got = p.stream.read_exact(&mut kind).and_then(|()| {
                    if kind[0] == ABORT {
                        return read_text(&mut p.stream).map(Err);
                    }
                    let mut b = [0u8; 8];
                    p.stream.read_exact(&mut b)?;
                    Ok(Ok(u64::from_le_bytes(b)))
                });
                match got {
                    Ok(Ok(s)) if s == seq && matches!(kind[0], ARRIVE | ARRIVE_STOP) => {
                        decision |= kind[0] == ARRIVE_STOP;
                    }
                    Ok(Ok(s)) => {
                        failed = Some(format!(
                            "rank {} ({}): out of step (collective {s}, expected {seq})",
                            p.rank, p.addr
                        ));
                        break;
                    }
                    Ok(Err(why)) => {
                        let why = format!("{why} (reported by rank {})", p.rank);
                        self.abort(&why);
                        return Err(RendezvousError::LostPeer(why));
                    }
                    Err(e) => {
                        failed = Some(format!(
                            "rank {} ({}): {}",
                            p.rank,
                            p.addr,
                            describe(&e, timeout)
                        ));
                        break;
                    }
                }
            }
        }
        match failed {
            None => Ok(decision),
            Some(why) => {
                // Tell the others who is gone, so that none blames this rank when it leaves.
                self.abort(&why);
                Err(RendezvousError::LostPeer(why))
            }
        }
    }

    /// One exchange of the whole group: sends `payload` to every other rank and returns every
    /// rank's payload in rank order (this rank's own in its place). The writes run on a thread
    /// beside the reads: with every rank writing first, payloads larger than the sockets'
    /// buffers would otherwise leave every rank blocked in a write.
    #[cfg_attr(not(feature = "candle"), allow(dead_code))]
    pub(crate) fn exchange(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>, RendezvousError> {
        self.seq += 1;
        let (seq, timeout) = (self.seq, self.timeout);
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&n| n <= MAX_PAYLOAD)
            .ok_or_else(|| {
                RendezvousError::Setup(format!(
                    "an all-reduce of {} bytes: expected at most {MAX_PAYLOAD}",
                    payload.len()
                ))
            })?;
        let mut header = [0u8; 13];
        header[0] = DATA;
        header[1..9].copy_from_slice(&seq.to_le_bytes());
        header[9..].copy_from_slice(&len.to_le_bytes());
        let lost = |p: &Peer, why: String| format!("rank {} ({}): {why}", p.rank, p.addr);
        let mut writers = Vec::with_capacity(self.peers.len());
        for p in &self.peers {
            let w = p
                .stream
                .try_clone()
                .map_err(|e| RendezvousError::LostPeer(lost(p, e.to_string())))?;
            writers.push((p.rank, p.addr, w));
        }
        let mut parts: Vec<(u32, Vec<u8>)> = Vec::with_capacity(self.peers.len() + 1);
        let (wrote, read) = std::thread::scope(|s| {
            let writer = s.spawn(move || -> Result<(), String> {
                for (rank, addr, w) in &mut writers {
                    w.write_all(&header)
                        .and_then(|()| w.write_all(payload))
                        .map_err(|e| format!("rank {rank} ({addr}): {}", describe(&e, timeout)))?;
                }
                Ok(())
            });
            let mut read = Ok(());
            for p in &mut self.peers {
                match read_data(&mut p.stream, seq) {
                    Ok(Ok(bytes)) => parts.push((p.rank, bytes)),
                    Ok(Err(why)) => {
                        read = Err((why, true));
                        break;
                    }
                    Err(e) => {
                        read = Err((lost(p, describe(&e, timeout)), false));
                        break;
                    }
                }
            }
            let wrote = writer
                .join()
                .unwrap_or_else(|_| Err("the writer thread panicked".into()));
            (wrote, read)
        });
        match (wrote, read) {
            (_, Err((why, true))) => {
                let why = format!("{why} (reported by a peer)");
                self.abort(&why);
                Err(RendezvousError::LostPeer(why))
            }
            (_, Err((why, false))) | (Err(why), Ok(())) => {
                self.abort(&why);
                Err(RendezvousError::LostPeer(why))
            }
            (Ok(()), Ok(())) => {
                let me = (0..=self.peers.len() as u32)
                    .find(|r| !parts.iter().any(|(p, _)| p == r))
                    .unwrap_or(0);
                parts.push((me, payload.to_vec()));
                parts.sort_by_key(|(r, _)| *r);
                Ok(parts.into_iter().map(|(_, b)| b).collect())
            }
        }
    }

    fn abort(&mut self, why: &str) {
        let mut msg = vec![ABORT];
        msg.extend(text(why));
        for p in &mut self.peers {
            let _ = p.stream.write_all(&msg);
        }
    }
}

/// Reads one peer's part of exchange `seq`: its bytes, or `Err(why)` where the peer aborted
/// (a peer of its died); an I/O error, a message out of step or a part over [`MAX_PAYLOAD`] is
/// an I/O error.
#[cfg_attr(not(feature = "candle"), allow(dead_code))]
fn read_data(s: &mut TcpStream, seq: u64) -> std::io::Result<Result<Vec<u8>, String>> {
    let bad = |m: String| std::io::Error::new(ErrorKind::InvalidData, m);
    let mut kind = [0u8; 1];
    s.read_exact(&mut kind)?;
    if kind[0] == ABORT {
        return read_text(s).map(Err);
    }
    let mut b = [0u8; 12];
    s.read_exact(&mut b)?;
    let their = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(b[8..].try_into().unwrap_or_default());
    if kind[0] != DATA || their != seq {
        return Err(bad(format!(
            "out of step (message {} of collective {their}, expected data of {seq})",
            kind[0]
        )));
    }
    if len > MAX_PAYLOAD {
        return Err(bad(format!(
            "a part of {len} bytes, expected at most {MAX_PAYLOAD}"
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    s.read_exact(&mut bytes)?;
    Ok(Ok(bytes))
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
    fn every_rank_but_the_straggler_waits_alike() {
        // Rank 2 arrives 3 ms late at each of 50 meetings: the others each wait about 150 ms
        // in all, rank 0 included (no hub learns of the last arrival first), rank 2 about 0.
        let addr = free_addr();
        let t = Duration::from_secs(20);
        let ranks: Vec<_> = (0..4)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut rv = TcpRendezvous::join(&addr, r, 4, "g", t).unwrap();
                    rv.meet(false).unwrap();
                    let mut waited = Duration::ZERO;
                    for _ in 0..50 {
                        if r == 2 {
                            std::thread::sleep(Duration::from_millis(3));
                        }
                        let at = Instant::now();
                        rv.meet(false).unwrap();
                        waited += at.elapsed();
                    }
                    waited.as_secs_f64()
                })
            })
            .collect();
        let w: Vec<f64> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        let others = [w[0], w[1], w[3]];
        let (lo, hi) = others
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        assert!(lo > 0.12, "{w:?}");
        assert!(hi - lo < 0.5 * lo, "the waiting ranks differ: {w:?}");
        assert!(
            w[2] < 0.3 * lo,
            "the straggler waits as much as the others: {w:?}"
        );
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
        // The survivor sees the dead peer on its own connection, or hears it from rank 0.
        let theirs = survivor.join().unwrap();
        assert!(
            theirs.starts_with("lost peer rank 2 (127.0.0.1:")
                && theirs.contains("connection closed"),
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

    #[test]
    fn ranks_exchange_payloads_larger_than_the_socket_buffers() {
        // 4 MiB each way: written before read by every rank, this fills the buffers and
        // blocks; the writer thread keeps it moving.
        let addr = free_addr();
        let t = Duration::from_secs(20);
        let ranks: Vec<_> = (0..3u32)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut rv = TcpRendezvous::join(&addr, r, 3, "g", t).unwrap();
                    let mut got = Vec::new();
                    for round in 0..3u8 {
                        let mine = vec![r as u8 * 10 + round; 4 << 20];
                        got.push(rv.exchange(&mine).unwrap());
                        // meetings and exchanges interleave in step
                        assert!(!rv.meet(false).unwrap());
                    }
                    got
                })
            })
            .collect();
        for h in ranks {
            let got = h.join().unwrap();
            for (round, parts) in got.iter().enumerate() {
                assert_eq!(parts.len(), 3);
                for (r, p) in parts.iter().enumerate() {
                    assert_eq!(p.len(), 4 << 20);
                    assert!(p.iter().all(|&b| b == r as u8 * 10 + round as u8));
                }
            }
        }
    }

    #[test]
    fn a_peer_that_announces_an_oversized_part_is_refused_without_allocating_it() {
        let (mut a, mut b) = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            (l.accept().unwrap().0, c)
        };
        let mut msg = vec![DATA];
        msg.extend_from_slice(&1u64.to_le_bytes());
        msg.extend_from_slice(&u32::MAX.to_le_bytes());
        b.write_all(&msg).unwrap();
        let e = read_data(&mut a, 1).unwrap_err().to_string();
        assert!(
            e.contains("4294967295 bytes") && e.contains("at most"),
            "{e}"
        );
    }
}
