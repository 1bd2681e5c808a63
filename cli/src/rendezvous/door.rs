//! A rank's listener, and the handshake both ends of a connection run: the group secret's
//! challenge and response (`wire.rs` has the bytes). A listener serves every pending handshake
//! at once (non-blocking sockets, polled): each has [`HANDSHAKE_TIMEOUT`] of its own and at most
//! [`MAX_HELLO`] bytes, and at most [`MAX_PENDING`] wait at a time (a new connection closes the
//! oldest beyond that), so no connection holds the door. A connection that does not speak the
//! protocol, stays silent, or does not prove the secret is closed and counted in [`Strangers`],
//! never fatal: its caller prints the counts in one line.
//!
//! ```text
//! accept -> challenge(nonce) -> poll: bytes -> parse_hello -> verify mac -> Knock (to the caller)
//!                                       '-> not the protocol, silent past its deadline, or a
//!                                           wrong secret: closed, counted in Strangers
//! ```

use super::wire::{self, Answer, Hello, MAC, MAX_HELLO, NONCE};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long a connection has, from its accept, to send a whole hello.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most handshakes pending at once on one listener.
pub(crate) const MAX_PENDING: usize = 128;
/// The listener's poll period.
const POLL: Duration = Duration::from_millis(5);

/// The reason a listener gives a hello whose MAC is not the group secret's.
pub(crate) const WRONG_SECRET: &str = "wrong group secret";

const HELLO_LABEL: &[u8] = b"phasetrace rendezvous hello\0";
const ANSWER_LABEL: &[u8] = b"phasetrace rendezvous answer\0";

/// The group's key: HMAC-SHA256 under the group secret (empty when none is set, which anyone
/// can compute: the handshake then proves nothing).
pub(crate) struct GroupKey {
    key: hmac::Key,
    set: bool,
}

impl GroupKey {
    pub(crate) fn new(secret: Option<&[u8]>) -> GroupKey {
        GroupKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret.unwrap_or_default()),
            set: secret.is_some(),
        }
    }

    /// Whether a secret is set.
    pub(crate) fn is_set(&self) -> bool {
        self.set
    }

    fn sign(&self, label: &[u8], challenge: &[u8; NONCE], msg: &[u8]) -> [u8; MAC] {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(label);
        ctx.update(challenge);
        ctx.update(msg);
        let mut out = [0u8; MAC];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    fn verify(&self, label: &[u8], challenge: &[u8; NONCE], msg: &[u8], mac: &[u8]) -> bool {
        let mut m = Vec::with_capacity(label.len() + NONCE + msg.len());
        m.extend_from_slice(label);
        m.extend_from_slice(challenge);
        m.extend_from_slice(msg);
        // Constant time in the MAC compared.
        hmac::verify(&self.key, &m, mac).is_ok()
    }

    /// Signs a hello answering `challenge`.
    pub(crate) fn seal(&self, hello: &mut Hello, challenge: &[u8; NONCE]) {
        hello.mac = self.sign(HELLO_LABEL, challenge, &hello.signed());
    }

    fn hello_is_genuine(&self, hello: &Hello, challenge: &[u8; NONCE]) -> bool {
        self.verify(HELLO_LABEL, challenge, &hello.signed(), &hello.mac)
    }

    fn proof(&self, hello: &Hello, challenge: &[u8; NONCE]) -> [u8; MAC] {
        self.sign(ANSWER_LABEL, challenge, &hello.encode())
    }

    /// Whether the listener's `proof` shows it knows the secret.
    pub(crate) fn proof_is_genuine(
        &self,
        hello: &Hello,
        challenge: &[u8; NONCE],
        proof: &[u8; MAC],
    ) -> bool {
        self.verify(ANSWER_LABEL, challenge, &hello.encode(), proof)
    }
}

/// A fresh nonce.
pub(crate) fn nonce() -> std::io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    SystemRandom::new()
        .fill(&mut n)
        .map_err(|_| std::io::Error::other("the system's random source failed"))?;
    Ok(n)
}

/// Connections a listener closed, by why.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Strangers {
    /// Sent bytes that are not the protocol.
    pub(crate) not_protocol: u64,
    /// Sent no whole hello within [`HANDSHAKE_TIMEOUT`].
    pub(crate) silent: u64,
    /// Closed the connection (or it failed) before a whole hello.
    pub(crate) left: u64,
    /// Closed, the oldest pending, to make room for a new one.
    pub(crate) evicted: u64,
    /// Did not prove the group secret.
    pub(crate) wrong_secret: u64,
    /// Proved it but was refused (a hello not for this rank, or not matching the group).
    pub(crate) refused: u64,
    /// Still pending when the group formed.
    pub(crate) pending_at_end: u64,
    /// Accepts that failed (out of descriptors, say).
    pub(crate) accept_errors: u64,
}

impl Strangers {
    /// All connections closed.
    pub(crate) fn total(&self) -> u64 {
        self.not_protocol
            + self.silent
            + self.left
            + self.evicted
            + self.wrong_secret
            + self.refused
            + self.pending_at_end
    }

    /// One line: how many, by why; `None` when there were none.
    pub(crate) fn summary(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.not_protocol, "not the protocol"),
            (self.silent, "silent past the handshake timeout"),
            (self.left, "closed before a hello"),
            (self.evicted, "evicted for newer connections"),
            (self.wrong_secret, "wrong group secret"),
            (self.refused, "refused"),
            (self.pending_at_end, "still pending when the group formed"),
            (self.accept_errors, "failed accepts"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        (!parts.is_empty()).then(|| {
            format!(
                "closed {} connections that were not ranks of this group ({})",
                self.total(),
                parts.join(", ")
            )
        })
    }
}

struct Pending {
    stream: TcpStream,
    addr: SocketAddr,
    challenge: [u8; NONCE],
    got: Vec<u8>,
    until: Instant,
}

/// A connection whose hello proved the secret: its caller admits or refuses it.
pub(crate) struct Knock {
    pub(crate) hello: Hello,
    pub(crate) addr: SocketAddr,
    stream: TcpStream,
    challenge: [u8; NONCE],
}

impl Knock {
    /// Admits it: answers with the listener's proof; the stream is blocking from here on.
    pub(crate) fn admit(mut self, key: &GroupKey) -> std::io::Result<TcpStream> {
        self.stream.set_nonblocking(false)?;
        self.stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let proof = key.proof(&self.hello, &self.challenge);
        self.stream
            .write_all(&wire::answer(&Answer::Accepted(proof)))?;
        Ok(self.stream)
    }

    /// Refuses it, telling it why.
    pub(crate) fn refuse(self, why: &str) {
        refuse(self.stream, why);
    }
}

fn refuse(stream: TcpStream, why: &str) {
    // Best effort: the answer is small, and the connection closes either way.
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let _ = (&stream).write_all(&wire::answer(&Answer::Refused(why.into())));
}

/// A rank's listener and its pending handshakes.
pub(crate) struct Door {
    listener: TcpListener,
    pending: VecDeque<Pending>,
    pub(crate) strangers: Strangers,
    handshake: Duration,
}

impl Door {
    /// Serves handshakes on `listener` (made non-blocking).
    pub(crate) fn new(listener: TcpListener) -> std::io::Result<Door> {
        listener.set_nonblocking(true)?;
        Ok(Door {
            listener,
            pending: VecDeque::new(),
            strangers: Strangers::default(),
            handshake: HANDSHAKE_TIMEOUT,
        })
    }

    #[cfg(test)]
    fn with_handshake(mut self, t: Duration) -> Door {
        self.handshake = t;
        self
    }

    /// Where it listens.
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection that proves the secret, or `None` at `deadline`.
    pub(crate) fn next(&mut self, key: &GroupKey, deadline: Instant) -> Option<Knock> {
        loop {
            self.accept_all(deadline);
            let mut i = 0;
            while i < self.pending.len() {
                match self.progress(i) {
                    None => i += 1,
                    Some(Err(counter)) => {
                        *counter(&mut self.strangers) += 1;
                        self.pending.remove(i);
                    }
                    Some(Ok(hello)) => {
                        let Some(p) = self.pending.remove(i) else {
                            continue;
                        };
                        if !key.hello_is_genuine(&hello, &p.challenge) {
                            self.strangers.wrong_secret += 1;
                            refuse(p.stream, WRONG_SECRET);
                            continue;
                        }
                        return Some(Knock {
                            hello,
                            addr: p.addr,
                            stream: p.stream,
                            challenge: p.challenge,
                        });
                    }
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Counts a refusal of a knock its caller made.
    pub(crate) fn refused(&mut self, k: Knock, why: &str) {
        self.strangers.refused += 1;
        k.refuse(why);
    }

    /// The counts, with the handshakes still pending closed.
    pub(crate) fn close(mut self) -> Strangers {
        self.strangers.pending_at_end += self.pending.len() as u64;
        self.pending.clear();
        self.strangers
    }

    fn accept_all(&mut self, deadline: Instant) {
        loop {
            match self.listener.accept() {
                Ok((stream, addr)) => {
                    let Ok(challenge) = nonce() else {
                        self.strangers.accept_errors += 1;
                        continue;
                    };
                    let sent = stream
                        .set_nonblocking(true)
                        .and_then(|()| stream.set_nodelay(true))
                        .and_then(|()| (&stream).write(&wire::challenge(&challenge)));
                    // 21 bytes into a fresh socket's empty buffer: all or nothing.
                    if !matches!(sent, Ok(n) if n == 5 + NONCE) {
                        self.strangers.left += 1;
                        continue;
                    }
                    if self.pending.len() >= MAX_PENDING {
                        self.pending.pop_front();
                        self.strangers.evicted += 1;
                    }
                    self.pending.push_back(Pending {
                        stream,
                        addr,
                        challenge,
                        got: Vec::new(),
                        until: (Instant::now() + self.handshake).min(deadline),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    // Out of descriptors, or a connection reset before it was accepted:
                    // the pending ones time out and free their descriptors.
                    self.strangers.accept_errors += 1;
                    return;
                }
            }
        }
    }

    /// Reads what pending handshake `i` sent: its hello when whole, a counter to bump when it is
    /// closed, `None` while it may still come.
    #[allow(clippy::type_complexity)]
    fn progress(&mut self, i: usize) -> Option<Result<Hello, fn(&mut Strangers) -> &mut u64>> {
        let p = self.pending.get_mut(i)?;
        let mut buf = [0u8; MAX_HELLO];
        loop {
            let room = MAX_HELLO.saturating_sub(p.got.len()).max(1);
            match p.stream.read(&mut buf[..room]) {
                Ok(0) => return Some(Err(|s| &mut s.left)),
                Ok(n) => {
                    p.got.extend_from_slice(&buf[..n]);
                    match wire::parse_hello(&p.got) {
                        Err(_) => return Some(Err(|s| &mut s.not_protocol)),
                        Ok(Some((hello, _))) => return Some(Ok(hello)),
                        // A hello is at most MAX_HELLO bytes: parse_hello refuses more first.
                        Ok(None) => {}
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Some(Err(|s| &mut s.left)),
            }
        }
        (Instant::now() >= p.until).then_some(Err(|s| &mut s.silent))
    }
}

/// What became of a knock on another rank's door.
#[derive(Debug)]
pub(crate) enum Knocked {
    /// Admitted: the stream, blocking.
    Admitted(TcpStream),
    /// Refused, with the listener's reason.
    Refused(String),
    /// Closed before a challenge came: the listener was busy, retry.
    Closed(std::io::Error),
    /// Anything else: an I/O error, or a listener that did not prove the secret.
    Failed(String),
}

/// Runs the connector's side of the handshake on a fresh `stream`: reads the challenge, sends
/// `hello` sealed under `key`, reads the answer and checks the listener's proof.
pub(crate) fn knock(mut stream: TcpStream, mut hello: Hello, key: &GroupKey) -> Knocked {
    let configured = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)))
        .and_then(|()| stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT)));
    if let Err(e) = configured {
        return Knocked::Failed(e.to_string());
    }
    let challenge = match wire::read_challenge(&mut stream) {
        Ok(c) => c,
        Err(e) if e.kind() == ErrorKind::InvalidData => return Knocked::Failed(e.to_string()),
        Err(e) => return Knocked::Closed(e),
    };
    key.seal(&mut hello, &challenge);
    if let Err(e) = stream.write_all(&hello.encode()) {
        return Knocked::Failed(e.to_string());
    }
    match wire::read_answer(&mut stream) {
        Ok(Answer::Refused(why)) => Knocked::Refused(why),
        Ok(Answer::Accepted(proof)) if key.proof_is_genuine(&hello, &challenge, &proof) => {
            Knocked::Admitted(stream)
        }
        Ok(Answer::Accepted(_)) => {
            Knocked::Failed("it admitted this rank without proving the group secret".into())
        }
        Err(e) => Knocked::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::To;
    use super::*;

    fn hello(rank: u32) -> Hello {
        Hello {
            to: To::Root,
            rank,
            ranks: 2,
            port: 1,
            group: "g".into(),
            nonce: [0; NONCE],
            mac: [0; MAC],
        }
    }

    fn door(handshake: Duration) -> (Door, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        (Door::new(l).unwrap().with_handshake(handshake), at)
    }

    #[test]
    fn a_rank_with_the_secret_gets_past_strangers_and_a_wrong_secret_does_not() {
        let (mut door, at) = door(Duration::from_secs(1));
        let key = GroupKey::new(Some(b"the group's secret"));
        // Strangers first: random bytes, silence, a closed connection, a wrong secret.
        let mut junk = TcpStream::connect(at).unwrap();
        junk.write_all(b"\x00\x01garbage").unwrap();
        let _silent = TcpStream::connect(at).unwrap();
        drop(TcpStream::connect(at).unwrap());
        let wrong = std::thread::spawn(move || {
            let s = TcpStream::connect(at).unwrap();
            knock(s, hello(1), &GroupKey::new(Some(b"another secret")))
        });
        let right = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let s = TcpStream::connect(at).unwrap();
            knock(s, hello(1), &GroupKey::new(Some(b"the group's secret")))
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let k = door.next(&key, deadline).expect("the rank's knock");
        assert_eq!(k.hello.rank, 1);
        let _stream = k.admit(&key).unwrap();
        assert!(matches!(right.join().unwrap(), Knocked::Admitted(_)));
        // The silent one times out (1 s here) while the door waits on.
        assert!(
            door.next(&key, Instant::now() + Duration::from_secs(2))
                .is_none()
        );
        match wrong.join().unwrap() {
            Knocked::Refused(why) => assert_eq!(why, WRONG_SECRET),
            other => panic!("{other:?}"),
        }
        let s = door.close();
        assert_eq!(
            (s.not_protocol, s.wrong_secret, s.silent, s.left),
            (1, 1, 1, 1),
            "{s:?}"
        );
        let line = s.summary().unwrap();
        assert!(line.starts_with("closed 4 connections"), "{line}");
    }

    #[test]
    fn a_listener_without_the_secret_cannot_admit_a_rank_that_has_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        // A fake listener: challenges, then admits whatever comes with a made-up proof.
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(&wire::challenge(&[1; NONCE])).unwrap();
            let mut got = vec![0u8; 256];
            let _ = s.read(&mut got).unwrap();
            s.write_all(&wire::answer(&Answer::Accepted([0; MAC])))
                .unwrap();
            s
        });
        let s = TcpStream::connect(at).unwrap();
        let r = knock(s, hello(1), &GroupKey::new(Some(b"secret")));
        let _ = fake.join();
        assert!(
            matches!(&r, Knocked::Failed(m) if m.contains("without proving the group secret")),
            "{r:?}"
        );
    }

    #[test]
    fn a_full_door_evicts_its_oldest_handshake_for_a_new_one() {
        // Long enough that none of the idle ones times out before the rank comes.
        let (mut door, at) = door(Duration::from_secs(30));
        let key = GroupKey::new(None);
        // The idle ones connect while the door serves (a backlog holds only so many), then
        // the rank.
        let rank = std::thread::spawn(move || {
            let idle: Vec<TcpStream> = (0..MAX_PENDING + 10)
                .map(|_| TcpStream::connect(at).unwrap())
                .collect();
            let r = knock(
                TcpStream::connect(at).unwrap(),
                hello(1),
                &GroupKey::new(None),
            );
            (r, idle)
        });
        let k = door.next(&key, Instant::now() + Duration::from_secs(20));
        let _stream = k.expect("the rank").admit(&key).unwrap();
        let (r, _idle) = rank.join().unwrap();
        assert!(matches!(r, Knocked::Admitted(_)), "{r:?}");
        let s = door.close();
        assert!(s.evicted >= 10, "{s:?}");
    }
}
