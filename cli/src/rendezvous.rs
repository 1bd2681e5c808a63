//! The demo's all-reduce rendezvous when each rank is its own process (`--rank R --rendezvous
//! HOST:PORT`): rank 0 listens there and hands every rank the others' addresses, the ranks
//! connect into a full mesh, and every collective is a barrier over it: each rank tells every
//! other it has arrived, then waits to hear the same from all of them. Every rank's wait is
//! symmetric (no rank is a hub that learns of the last arrival first, which would make it look
//! like a straggler), and a peer that dies is seen by every other rank on its own connection.
//! Nothing waits forever: every read and write has the rendezvous timeout.
//!
//! Every connection to a rank's listener starts with a handshake (`rendezvous/door.rs`, the
//! bytes in `rendezvous/wire.rs`): the connector proves it knows the group secret
//! (`PHASETRACE_RENDEZVOUS_SECRET`, or a file: [`group_secret`]) by an HMAC of the listener's
//! challenge, and the listener proves it back. Handshakes are served concurrently, each with a
//! short timeout of its own: a stranger (random bytes, silence, a wrong secret) is closed and
//! counted, never fatal, and cannot hold the door while the group forms.
//!
//! ```text
//! rank r --knock(hello: rank, ranks, listen port, group)--> rank 0 --admitted | refused(why)
//!        rank 0, once all joined --table: addresses of all ranks--> every rank
//! rank r --knock(hello: rank)--> each lower rank s > 0 (the higher ones knock on r)
//! meet:  rank r --arrive(seq, stop?)--> every other rank; reads arrive(seq) from every other
//!        rank (or abort(why) from one that saw a peer die)
//! exchange: rank r --data(seq, len, bytes)--> every other rank (on a writer thread); reads
//!        data(seq) from every other rank: the candle engine's all-reduce of partial outputs
//! ```

mod door;
mod wire;

pub(crate) use door::GroupKey;
use door::{Door, Knocked};
#[cfg_attr(not(feature = "candle"), allow(unused_imports))]
use wire::{ABORT, ARRIVE, ARRIVE_STOP, DATA, Hello, MAC, MAX_PAYLOAD, To};

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

/// Pause between connection attempts while a peer is not listening yet (or was busy).
const RETRY: Duration = Duration::from_millis(100);
/// The variable holding the group secret itself.
pub(crate) const SECRET_VAR: &str = "PHASETRACE_RENDEZVOUS_SECRET";
/// The variable naming a file that holds the group secret (`--rendezvous-secret-file`).
pub(crate) const SECRET_FILE_VAR: &str = "PHASETRACE_RENDEZVOUS_SECRET_FILE";
/// The shortest group secret accepted.
pub(crate) const MIN_SECRET: usize = 16;
/// The largest secret file read.
const MAX_SECRET_FILE: u64 = 64 * 1024;
/// What a rank refused for a wrong secret adds to its error.
const SECRET_HINT: &str = "every rank of a group needs the same PHASETRACE_RENDEZVOUS_SECRET, \
     PHASETRACE_RENDEZVOUS_SECRET_FILE or --rendezvous-secret-file";

/// The group secret: `--rendezvous-secret-file` (`file`), else the file that
/// `PHASETRACE_RENDEZVOUS_SECRET_FILE` names, else `PHASETRACE_RENDEZVOUS_SECRET`; `None` when
/// none is set. A file's trailing line break is not part of it. The error names the input and
/// what was expected, never the secret.
pub(crate) fn group_secret(file: Option<&Path>) -> Result<Option<Vec<u8>>, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let (value, file_var) = (var(SECRET_VAR), var(SECRET_FILE_VAR));
    let (secret, from) = match (file, file_var, value) {
        (Some(f), ..) => (
            read_secret(f, "--rendezvous-secret-file")?,
            "--rendezvous-secret-file",
        ),
        (None, Some(_), Some(_)) => {
            return Err(format!(
                "{SECRET_VAR} and {SECRET_FILE_VAR} are both set: expected one of them"
            ));
        }
        (None, Some(f), None) => (
            read_secret(Path::new(&f), SECRET_FILE_VAR)?,
            SECRET_FILE_VAR,
        ),
        (None, None, Some(v)) => {
            let v = v
                .into_string()
                .map_err(|_| format!("{SECRET_VAR} (masked): expected UTF-8 text"))?;
            (v.into_bytes(), SECRET_VAR)
        }
        (None, None, None) => return Ok(None),
    };
    if secret.len() < MIN_SECRET {
        return Err(format!(
            "{from} (masked): a group secret of {} bytes, expected at least {MIN_SECRET}",
            secret.len()
        ));
    }
    Ok(Some(secret))
}

fn read_secret(path: &Path, input: &str) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| {
            format!(
                "{input} {shown}: cannot read it ({e}); expected a file holding the group secret"
            )
        })?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        return Err(format!(
            "{input} {shown}: over {MAX_SECRET_FILE} bytes; expected a file holding the group secret"
        ));
    }
    for end in [&b"\r\n"[..], b"\n"] {
        if bytes.ends_with(end) {
            bytes.truncate(bytes.len() - end.len());
            break;
        }
    }
    Ok(bytes)
}

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

/// Knocks on the listener at `at` until admitted, refused, or `deadline`: a connection closed
/// before its challenge (a listener evicting handshakes under a flood) is retried. `hello`
/// gives the port this rank listens on (`listen` is called once, with the address the first
/// connection came from) and gets a fresh nonce each time.
fn knock_until(
    at: SocketAddr,
    key: &GroupKey,
    deadline: Instant,
    mut listen: impl FnMut(SocketAddr) -> Result<u16, String>,
    hello: impl Fn(u16, [u8; wire::NONCE]) -> Hello,
) -> Result<TcpStream, Knocked> {
    loop {
        let stream = connect_until(at, deadline).map_err(Knocked::Closed)?;
        let local = stream
            .local_addr()
            .map_err(|e| Knocked::Failed(e.to_string()))?;
        let port = listen(local).map_err(Knocked::Failed)?;
        let nonce = door::nonce().map_err(|e| Knocked::Failed(e.to_string()))?;
        match door::knock(stream, hello(port, nonce), key) {
            Knocked::Admitted(s) => return Ok(s),
            Knocked::Closed(_) if Instant::now() + RETRY < deadline => std::thread::sleep(RETRY),
            other => return Err(other),
        }
    }
}

/// What a knock that failed says, from the rank that knocked.
fn knock_failed(k: Knocked, whom: &str, at: SocketAddr, timeout: Duration) -> String {
    match k {
        Knocked::Admitted(_) => format!("{whom} at {at} admitted this rank"),
        Knocked::Refused(why) if why == door::WRONG_SECRET => {
            format!("{whom} at {at} refused to form the group: {why} ({SECRET_HINT})")
        }
        Knocked::Refused(why) => format!("{whom} at {at} refused to form the group: {why}"),
        Knocked::Closed(e) => format!(
            "cannot reach {whom} at {at} within {}s ({})",
            timeout.as_secs_f64(),
            describe(&e, timeout)
        ),
        Knocked::Failed(m) => format!("{whom} at {at}: {m}"),
    }
}

/// Closes a listener, saying in one line what it closed (nothing when it closed nothing).
fn summarise(door: Door) {
    let at = door
        .local_addr()
        .map_or_else(|_| "its listener".to_owned(), |a| a.to_string());
    if let Some(line) = door.close().summary() {
        eprintln!("phasetrace: rendezvous at {at}: {line}");
    }
}

impl TcpRendezvous {
    /// Forms the group: rank 0 listens at `addr` and waits for the other `ranks - 1`; any other
    /// rank connects to it (retrying while rank 0 is not up yet), then to the ranks below it,
    /// and accepts the ranks above it. Every connection proves `key`. Everyone gives up after
    /// `timeout`.
    pub(crate) fn join(
        addr: &str,
        rank: u32,
        ranks: u32,
        group: &str,
        key: &GroupKey,
        timeout: Duration,
    ) -> Result<TcpRendezvous, RendezvousError> {
        let at = resolve(addr)?;
        let began = Instant::now();
        let deadline = began + timeout;
        let peers = if rank == 0 {
            Self::host(at, ranks, group, key, timeout, deadline)?
        } else {
            Self::member(at, rank, ranks, group, key, timeout, deadline)?
        };
        eprintln!(
            "phasetrace: rendezvous: rank {rank} of {ranks}: the group formed in {:.3}s",
            began.elapsed().as_secs_f64()
        );
        Ok(TcpRendezvous {
            peers,
            seq: 0,
            timeout,
        })
    }

    /// Rank 0: admits every other rank, then tells each where the others listen. A hello that
    /// does not match this group is fatal when a secret is set (a member started wrong: the
    /// whole group fails at once, naming both sides); without one anyone can send it, so it is
    /// refused and the wait goes on.
    fn host(
        at: SocketAddr,
        ranks: u32,
        group: &str,
        key: &GroupKey,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<Peer>, RendezvousError> {
        let listener = TcpListener::bind(at).map_err(|e| {
            RendezvousError::Address(format!(
                "--rendezvous {at}: rank 0 cannot listen there ({e}); expected a free local address"
            ))
        })?;
        if !key.is_set() && !at.ip().is_loopback() {
            eprintln!(
                "phasetrace: rendezvous at {at}: no group secret ({SECRET_VAR} or \
                 {SECRET_FILE_VAR}): any process that reaches this address can join the group"
            );
        }
        let setup = |m: String| RendezvousError::Setup(format!("rendezvous at {at}: {m}"));
        let mut door = Door::new(listener).map_err(|e| setup(e.to_string()))?;
        // (peer, the port it listens on for the ranks above it)
        let mut joined: Vec<(Peer, u16)> = Vec::new();
        let mut refusals: Vec<String> = Vec::new();
        let formed = loop {
            if joined.len() + 1 >= ranks as usize {
                break Ok(());
            }
            let Some(k) = door.next(key, deadline) else {
                let missing: Vec<String> = (1..ranks)
                    .filter(|r| !joined.iter().any(|(p, _)| p.rank == *r))
                    .map(|r| r.to_string())
                    .collect();
                let refused = match refusals.last() {
                    Some(last) => format!("; refused {} (the last: {last})", refusals.len()),
                    None => String::new(),
                };
                break Err(setup(format!(
                    "only {} of {} ranks joined within {}s (missing ranks {}){refused}",
                    joined.len() + 1,
                    ranks,
                    timeout.as_secs_f64(),
                    missing.join(", ")
                )));
            };
            let (h, addr) = (&k.hello, k.addr);
            let why = if h.to != To::Root {
                Some(format!("{addr} sent rank 0 a hello for another rank"))
            } else if h.ranks != ranks {
                Some(format!(
                    "rank {} at {addr} was started with --ranks {}, rank 0 with --ranks {ranks}",
                    h.rank, h.ranks
                ))
            } else if h.group != group {
                Some(format!(
                    "rank {} at {addr} is in group {:?}, rank 0 in group {group:?}",
                    h.rank, h.group
                ))
            } else if h.rank == 0 || h.rank >= ranks {
                Some(format!(
                    "a rank at {addr} says it is rank {}; expected 1 to {}",
                    h.rank,
                    ranks - 1
                ))
            } else if let Some((p, _)) = joined.iter().find(|(p, _)| p.rank == h.rank) {
                Some(format!(
                    "rank {} joined twice (from {} and {addr})",
                    h.rank, p.addr
                ))
            } else {
                None
            };
            match why {
                Some(why) if key.is_set() => {
                    k.refuse(&why);
                    break Err(setup(why));
                }
                Some(why) => {
                    door.refused(k, &why);
                    refusals.push(why);
                }
                None => {
                    let (rank, port) = (h.rank, h.port);
                    // A rank that vanished between its hello and the answer knocks again.
                    match k
                        .admit(key)
                        .and_then(|s| configure(&s, timeout).map(|()| s))
                    {
                        Ok(stream) => joined.push((Peer { rank, addr, stream }, port)),
                        Err(_) => door.strangers.left += 1,
                    }
                }
            }
        };
        summarise(door);
        formed?;
        joined.sort_by_key(|(p, _)| p.rank);
        // Every rank learns where every other listens: the address rank 0 sees it at.
        let addrs: Vec<SocketAddr> = joined
            .iter()
            .map(|(p, port)| SocketAddr::new(p.addr.ip(), *port))
            .collect();
        let table = wire::table(&addrs);
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
        key: &GroupKey,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<Peer>, RendezvousError> {
        let setup = |m: String| RendezvousError::Setup(format!("rank {rank}: {m}"));
        if rank >= ranks {
            return Err(setup(format!("expected a rank below --ranks {ranks}")));
        }
        // Listen where rank 0 reached us: the ranks above us come the same way.
        let mut door: Option<Door> = None;
        let listen = |local: SocketAddr| -> Result<u16, String> {
            if door.is_none() {
                let l = TcpListener::bind((local.ip(), 0)).map_err(|e| {
                    format!("cannot listen on {} for the other ranks ({e})", local.ip())
                })?;
                door = Some(Door::new(l).map_err(|e| e.to_string())?);
            }
            let d = door.as_ref().ok_or("no listener")?;
            d.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
        };
        let hello = |to, port, nonce| Hello {
            to,
            rank,
            ranks,
            port,
            group: group.to_owned(),
            nonce,
            mac: [0; MAC],
        };
        let mut root = knock_until(at, key, deadline, listen, |port, n| {
            hello(To::Root, port, n)
        })
        .map_err(|k| setup(knock_failed(k, "rank 0", at, timeout)))?;
        let Some(mut door) = door else {
            return Err(setup("no listener for the other ranks".into()));
        };
        configure(&root, timeout).map_err(|e| setup(e.to_string()))?;
        let table = wire::read_table(&mut root, ranks).map_err(|e| {
            RendezvousError::LostPeer(format!("rank 0 ({at}): {}", describe(&e, timeout)))
        })?;
        let mut peers = vec![Peer {
            rank: 0,
            addr: at,
            stream: root,
        }];
        for s in 1..rank {
            let addr = table[s as usize - 1];
            let whom = format!("rank {s}");
            let stream = knock_until(addr, key, deadline, |_| Ok(0), |_, n| hello(To::Mesh, 0, n))
                .map_err(|k| setup(knock_failed(k, &whom, addr, timeout)))?;
            configure(&stream, timeout).map_err(|e| setup(e.to_string()))?;
            peers.push(Peer {
                rank: s,
                addr,
                stream,
            });
        }
        let formed = Self::admit_above(
            &mut door, &mut peers, rank, ranks, group, key, &table, deadline, timeout,
        );
        summarise(door);
        formed.map_err(setup)?;
        peers.sort_by_key(|p| p.rank);
        Ok(peers)
    }

    /// Rank r > 0 admits the ranks above it, refusing (not failing on) anything else.
    #[allow(clippy::too_many_arguments)]
    fn admit_above(
        door: &mut Door,
        peers: &mut Vec<Peer>,
        rank: u32,
        ranks: u32,
        group: &str,
        key: &GroupKey,
        table: &[SocketAddr],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), String> {
        while peers.len() < ranks as usize - 1 {
            let Some(k) = door.next(key, deadline) else {
                let missing: Vec<String> = (rank + 1..ranks)
                    .filter(|r| !peers.iter().any(|p| p.rank == *r))
                    .map(|r| r.to_string())
                    .collect();
                return Err(format!(
                    "ranks {} did not connect within {}s",
                    missing.join(", "),
                    timeout.as_secs_f64()
                ));
            };
            let h = &k.hello;
            let r = h.rank;
            if h.to != To::Mesh
                || h.ranks != ranks
                || h.group != group
                || r <= rank
                || r >= ranks
                || peers.iter().any(|p| p.rank == r)
            {
                let why = format!(
                    "rank {rank} expected a hello from one of ranks {} to {}",
                    rank + 1,
                    ranks - 1
                );
                door.refused(k, &why);
                continue;
            }
            // Where it listens (not the ephemeral port it came from), for messages.
            let addr = SocketAddr::new(k.addr.ip(), table[r as usize - 1].port());
            match k
                .admit(key)
                .and_then(|s| configure(&s, timeout).map(|()| s))
            {
                Ok(stream) => peers.push(Peer {
                    rank: r,
                    addr,
                    stream,
                }),
                Err(_) => door.strangers.left += 1,
            }
        }
        Ok(())
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
                match wire::read_arrival(&mut p.stream, seq) {
                    Ok(Ok(stop)) => decision |= stop,
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
                match wire::read_data(&mut p.stream, seq) {
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
        msg.extend(wire::text(why));
        for p in &mut self.peers {
            let _ = p.stream.write_all(&msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> GroupKey {
        GroupKey::new(None)
    }

    fn secret() -> GroupKey {
        GroupKey::new(Some(b"sixteen bytes or more"))
    }

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
                    let mut rv = TcpRendezvous::join(&addr, r, 3, "g", &none(), t).unwrap();
                    let mut n = 0;
                    // Rank 2 asks to stop at its fifth meeting; everyone stops there.
                    while !rv.meet(r == 2 && n == 4).unwrap() {
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut root = TcpRendezvous::join(&addr, 0, 3, "g", &none(), t).unwrap();
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
                    let mut rv = TcpRendezvous::join(&addr, r, 4, "g", &none(), t).unwrap();
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
            let mut rv = TcpRendezvous::join(&a, 1, 3, "g", &none(), t).unwrap();
            loop {
                if let Err(e) = rv.meet(false) {
                    return e.to_string();
                }
            }
        });
        let a = addr.clone();
        let doomed = std::thread::spawn(move || {
            let mut rv = TcpRendezvous::join(&a, 2, 3, "g", &none(), t).unwrap();
            rv.meet(false).unwrap();
            // Dropping the connection stands in for the process dying.
        });
        let mut root = TcpRendezvous::join(&addr, 0, 3, "g", &none(), t).unwrap();
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
            TcpRendezvous::join(&a, 1, 2, "tp1", &secret(), t)
                .err()
                .map(|e| e.to_string())
        });
        let err = TcpRendezvous::join(&addr, 0, 2, "tp0", &secret(), t)
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
    fn without_a_secret_a_mismatched_hello_is_refused_and_the_group_still_forms() {
        let addr = free_addr();
        let t = Duration::from_secs(20);
        let a = addr.clone();
        let stranger = std::thread::spawn(move || {
            TcpRendezvous::join(&a, 1, 2, "other", &none(), t)
                .err()
                .map(|e| e.to_string())
        });
        let a = addr.clone();
        let member = std::thread::spawn(move || {
            // After the stranger's refusal, or beside it: either way rank 0 admits it.
            std::thread::sleep(Duration::from_millis(300));
            TcpRendezvous::join(&a, 1, 2, "g", &none(), t).map(|_| ())
        });
        let root = TcpRendezvous::join(&addr, 0, 2, "g", &none(), t);
        assert!(root.is_ok(), "{:?}", root.err());
        member.join().unwrap().unwrap();
        let theirs = stranger.join().unwrap().unwrap();
        assert!(
            theirs.contains("refused to form the group: rank 1 at 127.0.0.1:"),
            "{theirs}"
        );
    }

    #[test]
    fn a_wrong_secret_is_refused_on_both_sides_and_the_group_forms() {
        let addr = free_addr();
        let t = Duration::from_secs(20);
        let a = addr.clone();
        let wrong = std::thread::spawn(move || {
            let key = GroupKey::new(Some(b"not the group's secret"));
            TcpRendezvous::join(&a, 1, 2, "g", &key, t)
                .err()
                .map(|e| e.to_string())
        });
        let a = addr.clone();
        let member = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            TcpRendezvous::join(&a, 1, 2, "g", &secret(), t).map(|_| ())
        });
        let root = TcpRendezvous::join(&addr, 0, 2, "g", &secret(), t);
        assert!(root.is_ok(), "{:?}", root.err());
        member.join().unwrap().unwrap();
        let theirs = wrong.join().unwrap().unwrap();
        assert!(
            theirs.contains("rank 0 at 127.0.0.1:")
                && theirs.contains("refused to form the group: wrong group secret")
                && theirs.contains("PHASETRACE_RENDEZVOUS_SECRET"),
            "{theirs}"
        );
        // A rank with a secret refuses a rank 0 without one.
        let addr = free_addr();
        let a = addr.clone();
        let member = std::thread::spawn(move || {
            TcpRendezvous::join(&a, 1, 2, "g", &secret(), Duration::from_secs(3))
                .err()
                .map(|e| e.to_string())
        });
        let root = TcpRendezvous::join(&addr, 0, 2, "g", &none(), Duration::from_secs(3));
        assert!(root.is_err());
        let theirs = member.join().unwrap().unwrap();
        assert!(theirs.contains("wrong group secret"), "{theirs}");
    }

    #[test]
    fn strangers_at_rank_0_do_not_stop_the_group() {
        // Silent connections and random bytes at rank 0 before the ranks come.
        let addr = free_addr();
        let t = Duration::from_secs(30);
        let at: SocketAddr = addr.parse().unwrap();
        let a = addr.clone();
        let root = std::thread::spawn(move || {
            let mut rv = TcpRendezvous::join(&a, 0, 3, "g", &secret(), t).unwrap();
            rv.meet(false).unwrap()
        });
        let connect = || loop {
            match TcpStream::connect(at) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut strangers: Vec<TcpStream> = (0..20).map(|_| connect()).collect();
        let mut junk = connect();
        junk.write_all(&[0xff; 64]).unwrap();
        strangers.push(junk);
        let ranks: Vec<_> = (1..3u32)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut rv = TcpRendezvous::join(&addr, r, 3, "g", &secret(), t).unwrap();
                    rv.meet(false).unwrap()
                })
            })
            .collect();
        assert!(!root.join().unwrap());
        for r in ranks {
            assert!(!r.join().unwrap());
        }
        drop(strangers);
    }

    #[test]
    fn the_secret_comes_from_a_file_without_its_line_break_and_never_prints() {
        let dir = std::env::temp_dir().join(format!("phasetrace-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("secret");
        std::fs::write(&f, "a secret of some length\n").unwrap();
        assert_eq!(
            group_secret(Some(&f)).unwrap().unwrap(),
            b"a secret of some length"
        );
        std::fs::write(&f, "short\n").unwrap();
        let e = group_secret(Some(&f)).unwrap_err();
        assert!(
            e.contains(
                "--rendezvous-secret-file (masked): a group secret of 5 bytes, expected at least 16"
            ) && !e.contains("short"),
            "{e}"
        );
        let missing = dir.join("missing");
        let e = group_secret(Some(&missing)).unwrap_err();
        assert!(e.contains("cannot read it") && e.contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nobody_waits_forever_for_a_missing_rank() {
        let addr = free_addr();
        let err = TcpRendezvous::join(&addr, 0, 2, "g", &none(), Duration::from_millis(300))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("only 1 of 2 ranks joined within 0.3s (missing ranks 1)"),
            "{err}"
        );
        let err = TcpRendezvous::join(&addr, 1, 2, "g", &none(), Duration::from_millis(300))
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
                    let mut rv = TcpRendezvous::join(&addr, r, 3, "g", &none(), t).unwrap();
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
}
