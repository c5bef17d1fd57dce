//! Upgrade with no gap: a new server process takes every new connection on the port while the
//! old one keeps every packet of its own connections until they end.
//!
//! The mechanism (see docs/operations.md for the reasoning against the alternatives): the
//! port's reuseport group has an eBPF program ([`udpx::generations`]) that picks a socket by
//! the generation and worker bytes of the connection ID ([`crate::cid`]). The old process
//! listens on a Unix socket (the *handover socket*, mode 0600); a new process started with
//! [`Handover::take_over`] connects, gets the program's maps, the old generation's number and
//! the service keys (so tokens, tickets and resets stay good), joins the port as the next
//! generation, publishes itself as the newest (new Initials go to it from that instant),
//! says so, and takes the handover socket's path over for the next upgrade. The old process
//! then drains ([`crate::host::DrainSignal::hand_over`]): GOAWAY, every response under way
//! finished, exit. Neither process ever unbinds the port, so no client sees a reset or an
//! ICMP error.
//!
//! ```text
//!  new ──connect──► old          "udpx-upgrade 2"
//!      ◄──────────────           generation g, workers, keys, n  + 4 + n descriptors (SCM_RIGHTS)
//!      bind g+1                  (the n: listening sockets passed on, its HTTPS-over-TCP one)
//!      ───────────────►          "ready"
//!      ◄──────────────           "go"     (the old one commits: it no longer times out alone)
//!      publish g+1
//!      ───────────────►          "taken"
//!      ◄──────────────           "ok"     → old drains
//!      ───────────────►          "live"   (the exchange stays open: the old one watches it)
//!      rename its own socket over the path
//!      ...
//!      ───────────────►          "bye"    (a drain or stop on purpose), or an end without it: a death
//! ```
//!
//! Exactly one generation takes new connections whatever fails. The old one answers "go" only
//! within its wait (`exchange_timeout`, 10 s): a successor slower than that finds the
//! exchange closed and never publishes. If anything fails after "go" (the successor dies, or
//! its "taken" does not come in time), the old one publishes itself again and serves on as if
//! nothing happened; a successor that gets no "ok" publishes the old generation again itself
//! before it gives up. The successor's handover socket is bound beside the path and renamed
//! over it only once it took over, so a failed upgrade leaves the path the old server's.
//!
//! A successor that dies after "ok" (killed, crashed, or its start failed after it took over):
//! it keeps the exchange open for its life ([`Predecessor`]) and says "bye" before it drains or
//! stops on purpose, so the old process, which watches the exchange while it drains, takes an
//! end without "bye" for a death. If the dead successor's generation is still the newest, the
//! old one calls its drain off ([`crate::host::DrainSignal::cancel`]: its shards admit again,
//! its HTTPS-over-TCP listener, kept open but not accepting through a handover's drain, accepts
//! again), publishes itself, puts a new handover socket at the path, and serves on; the
//! connections it had already told to go (GOAWAY) still go, and come back to it. This holds
//! while the old process still drains: its shards end together, no sooner than the handover's
//! admission grace ([`ADMIT_GRACE`]) and not before its last connection is done; a successor
//! that dies later leaves nobody (a supervisor's restart is the answer).
//!
//! Protocol 1 (an older udpx, on either side): no listeners, no "ready"/"go"/"ok". A successor
//! of this version that finds a protocol-1 server (it closes on the protocol-2 hello) asks
//! again in protocol 1, unless it has listeners to take.
//!
//! **Listening sockets passed on** ([`PassOn`]): a server may hand a listening socket of its
//! own over with the UDP steering (the HTTPS-over-TCP listener of `udpx h3 serve`): the very
//! socket, so one accept queue serves both processes and a connection waiting in it is
//! accepted by whichever process accepts next; the old process then closes its copy (never
//! `shutdown()`, which would end the queue for both). Only protocol 2 carries them: a server
//! with a socket to pass on refuses a protocol-1 successor (an older udpx, or one started
//! without that listener) with a message that says so, and a protocol-2 successor that finds
//! a protocol-1 server is told the same.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use udpx::generations::{recv_fds, send_fds, Generations};

use crate::token::{ServiceKeys, HANDOVER_LEN};
use crate::Error;

/// What a new process says first: protocol 1 (the UDP steering and the keys, "taken") ...
const HELLO_1: &[u8] = b"udpx-upgrade 1\n";
/// ... or 2 ("ready", "go", "taken", "ok"), taking no listening socket ...
const HELLO_2: &[u8] = b"udpx-upgrade 2\n";
/// ... or taking the listening sockets the old one passes on.
const HELLO_2L: &[u8] = b"udpx-upgrade 2L";
/// Which hello a new process says: the protocol, and whether it takes listening sockets over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hello {
    /// Protocol 1 ([`HELLO_1`]), which takes no listening socket.
    V1,
    /// Protocol 2, taking no listening socket ([`HELLO_2`]).
    V2,
    /// Protocol 2, taking the listening sockets the old process passes on ([`HELLO_2L`]).
    V2Listeners,
}

impl Hello {
    fn bytes(self) -> &'static [u8] {
        match self {
            Hello::V1 => HELLO_1,
            Hello::V2 => HELLO_2,
            Hello::V2Listeners => HELLO_2L,
        }
    }

    fn parse(bytes: &[u8]) -> Option<Hello> {
        [Hello::V1, Hello::V2, Hello::V2Listeners].into_iter().find(|h| h.bytes() == bytes)
    }

    fn protocol2(self) -> bool {
        self != Hello::V1
    }

    fn listeners(self) -> bool {
        self == Hello::V2Listeners
    }
}

/// Listening sockets one handover carries at most.
pub const MAX_PASSED: usize = 4;
/// What it says once it took new connections over.
const TAKEN: &[u8] = b"taken\n";
/// Protocol 2: the successor is bound and asks to go ...
const READY: &[u8] = b"ready\n";
/// ... the old one commits ...
const GO: &[u8] = b"go\n";
/// ... and acknowledges the takeover.
const OK: &[u8] = b"ok\n";
/// The successor keeps the exchange open for its life, and says so (an older successor
/// closes it instead) ...
const LIVE: &[u8] = b"live\n";
/// ... and says this before it ends on purpose (a drain, a stop): an end without it is a death.
const BYE: &[u8] = b"bye\n";
/// How often a watching predecessor looks at its stop flag.
const WATCH_TICK: Duration = Duration::from_millis(200);
/// How long either side waits for the other during a handover, by default.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an old process still admits the Initials that reach it after a handover (the
/// steering sends it only continuations of its own handshakes: retransmitted Initials, the
/// answer to a Retry it sent).
pub const ADMIT_GRACE: Duration = Duration::from_secs(3);

/// A server's part in upgrades.
#[derive(Debug, Clone)]
pub struct Handover {
    /// The handover socket: where this server listens for its successor, and (with
    /// `take_over`) where it finds its predecessor.
    pub path: PathBuf,
    /// Start as the upgrade of the server listening at `path`.
    pub take_over: bool,
    /// How long this server drains once a successor took over.
    pub drain_timeout: Duration,
    /// How long either side of a handover waits for the other ([`EXCHANGE_TIMEOUT`]).
    pub exchange_timeout: Duration,
}

impl Handover {
    /// A handover at `path` (`take_over`: start as the upgrade of the server there), draining
    /// for `drain_timeout` once taken over, the default exchange timeout.
    pub fn new(path: PathBuf, take_over: bool, drain_timeout: Duration) -> Handover {
        Handover { path, take_over, drain_timeout, exchange_timeout: EXCHANGE_TIMEOUT }
    }
}

impl Handover {
    /// The handover socket's path for a server on `listen` when none is given: under
    /// `/run/udpx` for root, else `$XDG_RUNTIME_DIR/udpx` or `/tmp/udpx-<uid>`.
    pub fn default_path(listen: std::net::SocketAddr, euid: u32, runtime_dir: Option<&Path>) -> PathBuf {
        let dir = match (euid, runtime_dir) {
            (0, _) => PathBuf::from("/run/udpx"),
            (_, Some(d)) => d.join("udpx"),
            (uid, None) => PathBuf::from(format!("/tmp/udpx-{uid}")),
        };
        dir.join(format!("h3-{}-{}.sock", listen.ip(), listen.port()))
    }
}

/// Listening sockets a server passes on to its successor with the UDP steering (see the
/// module docs), with what each is (for messages). Shared: the listener's owner withdraws
/// them when it stops listening (a drain), so a successor then binds its own.
#[derive(Debug, Clone, Default)]
pub struct PassOn(Arc<Mutex<Vec<(OwnedFd, String)>>>);

impl PassOn {
    /// Passes `fd` (a listening socket; a copy of the owner's descriptor) on, described as
    /// `what` ("HTTPS over TCP on 0.0.0.0:443"). At most [`MAX_PASSED`].
    pub fn put(&self, fd: OwnedFd, what: String) -> Result<(), Error> {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() >= MAX_PASSED {
            return Err(Error::Config(format!("upgrade: at most {MAX_PASSED} listening sockets are passed on")));
        }
        v.push((fd, what));
        Ok(())
    }

    /// Closes the copies: nothing is passed on any more.
    pub fn withdraw(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// What is passed on, if anything ("A and B").
    fn describe(&self) -> Option<String> {
        let v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (!v.is_empty()).then(|| v.iter().map(|(_, w)| w.as_str()).collect::<Vec<_>>().join(" and "))
    }
}

/// What the old process handed over, before the new one confirmed.
#[derive(Debug)]
pub(crate) struct Offer {
    /// The old process's generation.
    pub generation: u8,
    /// The service keys in force there.
    pub keys: ServiceKeys,
    /// The listening sockets it passed on (protocol 2).
    pub passed: Vec<OwnedFd>,
    /// Its workers (to publish it again if the takeover fails after it committed).
    workers: u16,
    /// Protocol 2 ("ready", "go", "ok"); 1: "taken" alone.
    protocol2: bool,
    stream: UnixStream,
}

impl Offer {
    /// Takes new connections over for `generation` (`workers` shards): the old process
    /// commits, `generation` is published, the old one is told and acknowledges. On a failure
    /// after the publish the old generation is published again: one generation takes new
    /// connections either way.
    pub(crate) fn take_over(mut self, gens: &Generations, generation: u8, workers: u16) -> Result<Predecessor, Error> {
        let mut said = [0u8; 6];
        if self.protocol2 {
            self.stream.write_all(READY).map_err(|e| handover_err("say ready", e))?;
            let go = self.stream.read_exact(&mut said[..GO.len()]);
            if go.is_err() || &said[..GO.len()] != GO {
                return Err(Error::Config(
                    "upgrade: the running server gave up waiting for this one (it serves on, nothing was taken \
                     over); start the upgrade again"
                        .into(),
                ));
            }
        }
        gens.publish(generation, workers).map_err(Error::Socket)?;
        let acked = self.stream.write_all(TAKEN).and_then(|()| {
            if self.protocol2 {
                self.stream.read_exact(&mut said[..OK.len()])?;
                if &said[..OK.len()] != OK {
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not an acknowledgement"));
                }
            }
            Ok(())
        });
        acked.map_err(|e| {
            // The old one may have given up and published itself: make sure it serves.
            let _ = gens.publish(self.generation, self.workers);
            handover_err("hear the old server take note of the takeover (it serves on)", e)
        })?;
        if !self.protocol2 {
            return Ok(Predecessor::default());
        }
        // Kept open for this process's life: the predecessor, while it drains, takes its end
        // (without a "bye") for this process's death, and serves on.
        let _ = self.stream.write_all(LIVE);
        let _ = self.stream.set_write_timeout(Some(Duration::from_secs(1)));
        Ok(Predecessor(Arc::new(Mutex::new(Some(self.stream)))))
    }
}

/// A successor's open exchange with the predecessor it took over from (see the module docs):
/// closed with a "bye" when this server drains or stops on purpose, closed without one (a
/// death: the process killed, or the server dropped after a failure) when it does not.
#[derive(Debug, Clone, Default)]
pub struct Predecessor(Arc<Mutex<Option<UnixStream>>>);

impl Predecessor {
    /// Tells the predecessor that this server ends on purpose (once; later calls do nothing).
    pub fn bye(&self) {
        if let Some(mut s) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.write_all(BYE);
        }
    }
}

fn handover_err(what: &str, e: std::io::Error) -> Error {
    Error::Config(format!("upgrade: {what}: {e}"))
}

/// Whether the handover socket's directory `dir` is one only this user (or root) can change:
/// a directory, not a link, owned by `euid` or root, writable by nobody else. Whoever can
/// write there can put a socket of their own in the server's place, and the process that
/// connects to it would take their maps and keys (or hand ours over). A directory this server
/// had to create is made 0700.
fn check_handover_dir(dir: &Path, euid: u32) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| handover_err(&format!("create {}", dir.display()), e))?;
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| handover_err(&format!("look at {}", dir.display()), e))?;
    let why = if !m.is_dir() {
        Some("is not a directory (a link, or a file)".to_string())
    } else if m.uid() != euid && m.uid() != 0 {
        Some(format!("belongs to user {}, not to this one ({euid}) or root", m.uid()))
    } else if m.mode() & 0o022 != 0 {
        Some(format!("is writable by others (mode {:o})", m.mode() & 0o7777))
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Error::Config(format!(
            "upgrade: the handover socket's directory {} {why}: another user could put a socket of theirs \
             there; give --upgrade-socket a path in a directory only you can write (e.g. under \
             $XDG_RUNTIME_DIR), or remove {} and let the server create it",
            dir.display(),
            dir.display()
        ))),
    }
}

/// Asks the server at `path` to hand over (the new process's side), waiting `timeout` for
/// each answer; `listeners`: whether this process takes listening sockets over. Speaks
/// protocol 2, and protocol 1 to a server that closes on it when it takes no listeners.
pub(crate) fn ask(path: &Path, listeners: bool, timeout: Duration) -> Result<(Offer, Generations), Error> {
    let hello = if listeners { Hello::V2Listeners } else { Hello::V2 };
    match ask_in(path, hello, timeout) {
        Err(Unanswered) if !listeners => ask_in(path, Hello::V1, timeout).unwrap_or_else(|Unanswered| {
            Err(Error::Config(format!("upgrade: the server at {} closed the handover unanswered", path.display())))
        }),
        Err(Unanswered) => Err(Error::Config(format!(
            "upgrade: the server at {} closed the handover unanswered: an older udpx (upgrade protocol 1) \
             cannot pass its HTTPS-over-TCP listener on; stop it and start this one without --upgrade, or \
             upgrade without --alt-svc-tcp",
            path.display()
        ))),
        Ok(r) => r,
    }
}

/// A server that closed on the hello without a word.
struct Unanswered;

fn ask_in(path: &Path, hello: Hello, timeout: Duration) -> Result<Result<(Offer, Generations), Error>, Unanswered> {
    let (protocol2, listeners) = (hello.protocol2(), hello.listeners());
    let r = (|| {
        if let Some(dir) = path.parent().filter(|d| d.exists()) {
            check_handover_dir(dir, nix::unistd::geteuid().as_raw())?;
        }
        let mut stream = UnixStream::connect(path).map_err(|e| {
            Error::Config(format!(
                "upgrade: no server to take over at {}: {e}; start without --upgrade, or give the running \
                 server's --upgrade-socket",
                path.display()
            ))
        })?;
        stream.set_read_timeout(Some(timeout)).map_err(Error::Io)?;
        stream.set_write_timeout(Some(timeout)).map_err(Error::Io)?;
        stream.write_all(hello.bytes()).map_err(|e| handover_err("say hello", e))?;
        let mut buf = [0u8; 5 + HANDOVER_LEN + 512];
        let (n, fds) = recv_fds(&stream, &mut buf).map_err(|e| handover_err("receive the handover", e))?;
        Ok((stream, buf, n, fds))
    })();
    let (stream, buf, n, mut fds) = match r {
        Ok(x) => x,
        Err(e) => return Ok(Err(e)),
    };
    let at = path.display();
    if n == 0 && protocol2 {
        return Err(Unanswered);
    }
    if n > 0 && buf[0] == b'R' {
        let why = String::from_utf8_lossy(&buf[1..n]);
        return Ok(Err(Error::Config(format!("upgrade: the server at {at} refused: {why}"))));
    }
    let want = if protocol2 { 5 + HANDOVER_LEN } else { 4 + HANDOVER_LEN };
    if n != want || buf[0] != b'G' {
        return Ok(Err(Error::Config(format!(
            "upgrade: the server at {at} answered {n} bytes, not a handover (another udpx version?)"
        ))));
    }
    let Some(keys) = ServiceKeys::from_handover(&buf[4..4 + HANDOVER_LEN]) else {
        return Ok(Err(Error::Config("upgrade: the handover's keys do not parse".into())));
    };
    let passed_n = if protocol2 { usize::from(buf[4 + HANDOVER_LEN]) } else { 0 };
    if passed_n > MAX_PASSED || fds.len() != 4 + passed_n || (passed_n > 0 && !listeners) {
        return Ok(Err(Error::Config(format!(
            "upgrade: the handover carries {} descriptors for {passed_n} listening sockets",
            fds.len()
        ))));
    }
    let passed = fds.split_off(4);
    let gens = match Generations::from_fds(fds) {
        Ok(g) => g,
        Err(e) => return Ok(Err(Error::Socket(e))),
    };
    let workers = u16::from_le_bytes([buf[2], buf[3]]);
    Ok(Ok((Offer { generation: buf[1], keys, passed, workers, protocol2, stream }, gens)))
}

/// The old process's side: answers upgrades at its handover socket until one takes over.
#[derive(Debug)]
pub(crate) struct Listening {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
    /// Where the socket is bound until [`Listening::take_path`] puts it at `path`.
    tmp: Option<PathBuf>,
    /// The inode of the socket this server put at `path` (a revival puts a new one there).
    ino: Arc<std::sync::atomic::AtomicU64>,
    taken: Arc<AtomicBool>,
}

/// What the old process does when a successor took over, and when that successor dies while
/// the old one still drains.
pub(crate) struct OnHandover {
    /// Starts the drain.
    pub taken: Box<dyn Fn() + Send>,
    /// Calls the drain off ([`crate::host::DrainSignal::cancel`]): whether it could (false:
    /// the loops are ending).
    pub revive: Box<dyn Fn() -> bool + Send>,
}

/// Binds a private Unix socket at `tmp` (mode 0600, bound under umask 077: no moment in which
/// it is open to others), non-blocking.
fn bind_private(tmp: &Path) -> Result<UnixListener, Error> {
    let _ = std::fs::remove_file(tmp);
    // (The umask is the process's; the window is one bind, and it only narrows what another
    // thread creates meanwhile.)
    let before = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let bound = UnixListener::bind(tmp);
    nix::sys::stat::umask(before);
    let listener = bound.map_err(|e| handover_err(&format!("bind {}", tmp.display()), e))?;
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        handover_err(&format!("make {} private", tmp.display()), e)
    })?;
    listener.set_nonblocking(true).map_err(Error::Io)?;
    Ok(listener)
}

/// Puts the socket bound at `tmp` at `path` (atomically replacing what is there); its inode.
fn put_at(tmp: &Path, path: &Path) -> Result<u64, Error> {
    std::fs::rename(tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        handover_err(&format!("put the handover socket at {}", path.display()), e)
    })?;
    Ok(std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0))
}

/// How a successor's exchange ended, as its predecessor watched it.
#[derive(Debug, PartialEq, Eq)]
enum Watched {
    /// It said "bye": it ends on purpose.
    Bye,
    /// It closed without a word, or the stream failed: it died.
    Died,
    /// It never said "live" (an older udpx closes the exchange after "ok"): not watched.
    Unwatched,
    /// This server stops.
    Stopped,
}

/// Watches a successor's exchange after "ok" (see [`Predecessor`]).
fn watch(mut stream: UnixStream, stop: &AtomicBool, timeout: Duration) -> Watched {
    let mut word = [0u8; 5];
    let _ = stream.set_read_timeout(Some(timeout));
    match stream.read_exact(&mut word[..LIVE.len()]) {
        Ok(()) if word[..LIVE.len()] == *LIVE => {}
        _ => return Watched::Unwatched,
    }
    if stream.set_read_timeout(Some(WATCH_TICK)).is_err() {
        return Watched::Unwatched;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 16];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => return Watched::Died,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.starts_with(BYE) {
                    return Watched::Bye;
                }
                if got.len() >= BYE.len() {
                    return Watched::Died; // not a word of this exchange: treated as its end
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Watched::Died,
        }
    }
    Watched::Stopped
}

/// Binds the handover socket beside `path` and answers upgrades in a thread ([`Listening::take_path`]
/// puts it at `path`, replacing a predecessor's atomically). `on.taken` runs when a successor
/// confirmed; this server then watches the successor while it drains, and if the successor dies
/// while still the newest generation, calls the drain off (`on.revive`), publishes itself
/// again, puts a new handover socket at `path` and answers upgrades again.
pub(crate) fn listen(path: &Path, serving: Serving, timeout: Duration, on: OnHandover) -> Result<Listening, Error> {
    if let Some(dir) = path.parent() {
        check_handover_dir(dir, nix::unistd::geteuid().as_raw())?;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let mut listener = bind_private(&tmp)?;
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicBool::new(false));
    let ino = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop2, taken2, ino2, path2, tmp2) =
        (stop.clone(), taken.clone(), ino.clone(), path.to_path_buf(), tmp.clone());
    let generation = serving.generation;
    let thread = std::thread::Builder::new()
        .name("udpx-handover".into())
        .spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => match answer(stream, &serving, timeout) {
                        Ok(stream) => {
                            taken2.store(true, Ordering::Release);
                            log::info!("udpx-quic: generation {generation} handed over to its upgrade");
                            (on.taken)();
                            let Some(stream) = stream else { return };
                            let successor = generation.wrapping_add(1);
                            match watch(stream, &stop2, timeout) {
                                Watched::Died => {}
                                w => {
                                    log::debug!("udpx-quic: the successor's exchange ended: {w:?}");
                                    return;
                                }
                            }
                            if serving.gens.newest().0 != successor {
                                log::info!("udpx-quic: generation {successor} ended after a newer one took over");
                                return;
                            }
                            if !(on.revive)() {
                                log::warn!(
                                    "udpx-quic: generation {successor} (the upgrade) died, and this server's \
                                     drain is over: nobody takes new connections until a server starts"
                                );
                                return;
                            }
                            let _ = serving.gens.publish(generation, serving.workers);
                            taken2.store(false, Ordering::Release);
                            match bind_private(&tmp2).and_then(|l| Ok((l, put_at(&tmp2, &path2)?))) {
                                Ok((l, i)) => {
                                    listener = l;
                                    ino2.store(i, Ordering::Release);
                                }
                                Err(e) => log::warn!("udpx-quic: handover socket: {e}; no upgrade possible"),
                            }
                            log::warn!(
                                "udpx-quic: generation {successor} (the upgrade) died after it took over: \
                                 generation {generation} serves again"
                            );
                        }
                        Err(e) => {
                            // The successor failed: new connections come here again.
                            let _ = serving.gens.publish(generation, serving.workers);
                            log::warn!("udpx-quic: an upgrade did not complete ({e}); still serving");
                        }
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => {
                        log::warn!("udpx-quic: handover socket: {e}");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
        })
        .map_err(Error::Io)?;
    Ok(Listening { stop, thread: Some(thread), path: path.to_path_buf(), tmp: Some(tmp), ino, taken })
}

/// What a server offers its successor: its steering, generation and workers, keys, and the
/// listening sockets it passes on.
pub(crate) struct Serving {
    pub gens: Arc<Generations>,
    pub generation: u8,
    pub workers: u16,
    pub keys: ServiceKeys,
    pub pass_on: PassOn,
}

/// One upgrade's exchange; Ok when the successor confirmed, with the exchange to watch
/// (protocol 2).
fn answer(mut stream: UnixStream, serving: &Serving, timeout: Duration) -> std::io::Result<Option<UnixStream>> {
    let Serving { gens, generation, workers, keys, pass_on } = serving;
    let (generation, workers) = (*generation, *workers);
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut hello = [0u8; 15];
    stream.read_exact(&mut hello)?;
    let Some(hello) = Hello::parse(&hello) else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not an upgrade's hello"));
    };
    let (protocol2, listeners) = (hello.protocol2(), hello.listeners());
    if let Some(what) = pass_on.describe().filter(|_| !listeners) {
        let why = format!(
            "this server passes {what} on, which a successor without it (or an older udpx, upgrade \
             protocol 1) cannot take; start the upgrade with the same listener (--alt-svc-tcp)"
        );
        let _ = stream.write_all(format!("R{why}").as_bytes());
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
    }
    let w = workers.to_le_bytes();
    let mut msg = vec![b'G', generation, w[0], w[1]];
    msg.extend_from_slice(&keys.to_handover());
    {
        // Locked while the message goes: a withdrawal meanwhile waits, so no copy is closed
        // under it.
        let passed = pass_on.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut fds: Vec<_> = gens.fds().into();
        if protocol2 {
            msg.push(passed.len() as u8);
            fds.extend(passed.iter().map(|(fd, _)| fd.as_fd()));
        }
        send_fds(&stream, &msg, &fds)?;
    }
    let expect = |stream: &mut UnixStream, what: &[u8]| -> std::io::Result<()> {
        let mut got = [0u8; 6];
        stream.read_exact(&mut got[..what.len()])?;
        if &got[..what.len()] != what {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not the exchange's next word"));
        }
        Ok(())
    };
    if protocol2 {
        // Within the wait: committed from here on (a failure below publishes this one again).
        expect(&mut stream, READY)?;
        stream.write_all(GO)?;
    }
    expect(&mut stream, TAKEN)?;
    if protocol2 {
        stream.write_all(OK)?;
        return Ok(Some(stream));
    }
    Ok(None)
}

impl Listening {
    /// Puts the handover socket at its path (replacing a predecessor's, atomically): from now
    /// on an upgrade finds this server there. Called once this server took over (or, first
    /// in its line, serves).
    pub(crate) fn take_path(&mut self) -> Result<(), Error> {
        if let Some(tmp) = self.tmp.take() {
            self.ino.store(put_at(&tmp, &self.path)?, Ordering::Release);
        }
        Ok(())
    }

    /// Whether a successor took over.
    pub(crate) fn taken(&self) -> bool {
        self.taken.load(Ordering::Acquire)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp);
        }
        // The path is ours to remove only while it is still our socket (a successor's
        // replaced it).
        let ino = self.ino.load(Ordering::Acquire);
        if self.tmp.is_none() && std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handover_directories_others_can_write_are_refused() {
        let base = std::env::temp_dir().join(format!("udpx-handover-dir-{}", std::process::id()));
        let euid = nix::unistd::geteuid().as_raw();
        let mine = base.join("mine");
        check_handover_dir(&mine, euid).expect("a directory it creates");
        assert_eq!(std::fs::metadata(&mine).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_handover_dir(&mine, euid).unwrap_err().to_string();
        assert!(e.contains("writable by others") && e.contains("--upgrade-socket"), "{e}");
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_handover_dir(&mine, euid).expect("0755, its own");
        // Another user's (as root: made another's; else: judged as if this were another user).
        let e = if euid == 0 {
            std::os::unix::fs::chown(&mine, Some(4242), None).unwrap();
            check_handover_dir(&mine, euid)
        } else {
            check_handover_dir(&mine, euid + 1)
        };
        let e = e.unwrap_err().to_string();
        assert!(e.contains("belongs to user"), "{e}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        let e = check_handover_dir(&link, euid).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A server of upgrade protocol 1 (an older udpx) closes on a protocol-2 hello: a successor
    /// that would take its HTTPS-over-TCP listener is told why, not "another version?".
    #[test]
    fn a_protocol_1_server_is_named_to_a_successor_that_takes_listeners() {
        let dir = std::env::temp_dir().join(format!("udpx-handover-v1-{}", std::process::id()));
        check_handover_dir(&dir, nix::unistd::geteuid().as_raw()).unwrap();
        let path = dir.join("old.sock");
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let old = std::thread::spawn(move || {
            // What a protocol-1 server does with any other hello: closes.
            let (mut s, _) = l.accept().unwrap();
            let mut hello = [0u8; 15];
            s.read_exact(&mut hello).unwrap();
            hello
        });
        let e = ask(&path, true, EXCHANGE_TIMEOUT).unwrap_err().to_string();
        assert_eq!(old.join().unwrap(), HELLO_2L);
        assert!(e.contains("upgrade protocol 1") && e.contains("--alt-svc-tcp"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_paths() {
        let a: std::net::SocketAddr = "0.0.0.0:443".parse().unwrap();
        assert_eq!(Handover::default_path(a, 0, None), PathBuf::from("/run/udpx/h3-0.0.0.0-443.sock"));
        assert_eq!(
            Handover::default_path(a, 1000, Some(Path::new("/run/user/1000"))),
            PathBuf::from("/run/user/1000/udpx/h3-0.0.0.0-443.sock")
        );
        let b: std::net::SocketAddr = "[::1]:8443".parse().unwrap();
        assert_eq!(Handover::default_path(b, 7, None), PathBuf::from("/tmp/udpx-7/h3-::1-8443.sock"));
    }
}
