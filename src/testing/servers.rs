//! Real PostgreSQL, etcd (one member or a cluster) and Redis servers for
//! tests: started on free loopback ports in temporary directories, stopped
//! on drop.
//!
//! Tests never assume a running server. They call [`PostgresServer::start`]
//! or [`EtcdServer::start`], which start one from the installed binaries
//! (Debian's `postgresql` gives `initdb` and `postgres`, `etcd-server`
//! gives `etcd`; [`RedisServer::start`] needs `redis-server`), or use
//! `CALM_POSTGRES_URL` / `CALM_ETCD_ENDPOINTS` / `CALM_REDIS_URL` when
//! those are set. When the binaries are missing, [`ServerError::Missing`]
//! is returned; [`skip_or_fail`] turns that into a loud skip, or a failure
//! when `CALM_REQUIRE_SERVERS=1` (as CI sets).
//!
//! A server is a child process, so fault tests can pause it
//! ([`ServerProcess::signal`]), kill it and restart it on the same data and
//! port.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why a server could not be provided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The server's binary is not installed.
    #[error("{binary} not found (install Debian's {package}, or set {env})")]
    Missing {
        /// The binary looked for.
        binary: &'static str,
        /// The Debian package that provides it.
        package: &'static str,
        /// The environment variable that points at an existing server.
        env: &'static str,
    },
    /// Starting or preparing the server failed.
    #[error("starting {what} failed: {source}")]
    Start {
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The server did not accept connections in time.
    #[error("{what} did not become ready within {0:?}", .timeout)]
    NotReady {
        /// Which server.
        what: &'static str,
        /// How long we waited.
        timeout: Duration,
    },
    /// The server process ended before it accepted connections (most
    /// often because its port, free when picked, was taken meanwhile).
    #[error("{what} exited before it was ready ({status})")]
    Exited {
        /// Which server.
        what: &'static str,
        /// How it ended.
        status: std::process::ExitStatus,
    },
}

/// Most starts on fresh ports before a server that does not come up is
/// reported.
const STARTS: usize = 3;

/// Calls `start` until it does not fail with [`ServerError::Exited`] or
/// [`ServerError::NotReady`], at most [`STARTS`] times, calling `repick`
/// (fresh ports) before each retry: a port that was free when picked may
/// be taken by the time the server binds it (by another server, or a
/// client's outgoing connection). `repick` kills what the failed start
/// left running (a server too slow to come up) first.
fn start_retrying<S>(
    server: &mut S,
    mut start: impl FnMut(&mut S) -> Result<(), ServerError>,
    mut repick: impl FnMut(&mut S) -> Result<(), ServerError>,
) -> Result<(), ServerError> {
    let mut tries = 1;
    loop {
        match start(server) {
            Err(ServerError::Exited { .. } | ServerError::NotReady { .. }) if tries < STARTS => {
                tries += 1;
                repick(server)?;
            }
            done => return done,
        }
    }
}

/// Whether tests must fail, not skip, when a server is unavailable.
pub fn servers_required() -> bool {
    std::env::var("CALM_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// Turns a missing server into a loud skip (`None`), or a panic when
/// servers are required; other errors always panic.
///
/// # Panics
///
/// When the server cannot be provided and `CALM_REQUIRE_SERVERS=1`, or
/// when it exists but fails to start.
#[track_caller]
pub fn skip_or_fail<T>(r: Result<T, ServerError>) -> Option<T> {
    match r {
        Ok(t) => Some(t),
        Err(e @ ServerError::Missing { .. }) if !servers_required() => {
            eprintln!("SKIPPED (server unavailable): {e}");
            None
        }
        Err(e) => panic!("server unavailable: {e}"),
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it
/// next, which can race with another process but rarely does).
fn free_port() -> Result<u16, ServerError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|source| ServerError::Start {
        what: "finding a free port",
        source,
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|source| ServerError::Start {
            what: "finding a free port",
            source,
        })
}

/// A fresh directory under the system temp dir.
fn temp_dir(tag: &str) -> Result<PathBuf, ServerError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "calm-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|source| ServerError::Start {
        what: "creating a temp dir",
        source,
    })?;
    Ok(dir)
}

/// Finds a binary on `PATH` or in the given extra directories.
fn find(binary: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().cloned())
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
}

/// Waits until `port` accepts TCP connections, or `process` (the server
/// that is to open it) ends.
fn wait_port(
    mut process: Option<&mut ServerProcess>,
    port: u16,
    what: &'static str,
    timeout: Duration,
) -> Result<(), ServerError> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Some(status) = process.as_deref_mut().and_then(ServerProcess::exited) {
            return Err(ServerError::Exited { what, status });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(ServerError::NotReady { what, timeout })
}

/// A server running as a child process.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
}

impl ServerProcess {
    /// How the process ended, if it has: reaped, it is forgotten, as its
    /// pid may be given to another process, never to be signalled.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    /// The child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to the server process.
    ///
    /// # Errors
    ///
    /// The error of the `kill(2)` call.
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        match self.pid() {
            Some(pid) => send_signal(pid, signal),
            None => Ok(()),
        }
    }

    /// Sends `signal` to the server process and to the processes it
    /// started (PostgreSQL's backends are processes of their own, so
    /// freezing the whole server means stopping each of them). The parent
    /// is signalled first, so it starts no new child meanwhile.
    ///
    /// # Errors
    ///
    /// The error of the `kill(2)` call on the server process (its children
    /// may exit on their own at any time; their errors are ignored).
    pub fn signal_all(&self, signal: Signal) -> std::io::Result<()> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        send_signal(pid, signal)?;
        for child in children_of(pid) {
            let _ = send_signal(child, signal);
        }
        Ok(())
    }

    /// Kills the process and the processes it started (SIGKILL, as a crash
    /// of the server's machine would), and reaps it. PostgreSQL's backends
    /// put themselves in sessions of their own, so they are found by parent
    /// pid, before the postmaster dies and they are re-parented.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let children = children_of(c.id());
            let _ = c.kill();
            for pid in children {
                let _ = send_signal(pid, Signal::Kill);
            }
            let _ = c.wait();
        }
    }
}

/// A signal a fault test sends to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// SIGSTOP: freeze the process, as a long GC pause or a descheduled VM.
    Stop,
    /// SIGCONT: let a frozen process run again.
    Cont,
    /// SIGKILL: end the process at once.
    Kill,
}

/// Sends `signal` to the single process `pid` (never a process group: a
/// pid that does not fit a positive `pid_t` is refused).
///
/// # Errors
///
/// `InvalidInput` for such a pid, else the error of the `kill(2)` call.
pub fn send_signal(pid: u32, signal: Signal) -> std::io::Result<()> {
    use rustix::process::{Pid, Signal as Sig, kill_process};
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad pid"))?;
    let sig = match signal {
        Signal::Stop => Sig::STOP,
        Signal::Cont => Sig::CONT,
        Signal::Kill => Sig::KILL,
    };
    kill_process(pid, sig).map_err(std::io::Error::from)
}

/// The pids whose parent is `parent`, from `/proc` (empty where there is
/// no `/proc`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // The fourth field of /proc/<pid>/stat, after the parenthesised
            // command name (which may itself hold spaces), is the ppid.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The uid and gid to run PostgreSQL as when we are root (it refuses to
/// run as root): the `postgres` user Debian's package creates, else
/// `nobody`.
fn unprivileged_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let find_user = |name: &str| {
        passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name))
                .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
        })
    };
    find_user("postgres").or_else(|| find_user("nobody"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> Result<(), ServerError> {
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .status()
        .map_err(|source| ServerError::Start {
            what: "chown",
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(ServerError::Start {
            what: "chown",
            source: std::io::Error::other("chown failed"),
        })
    }
}

/// A PostgreSQL server for tests.
#[derive(Debug)]
pub struct PostgresServer {
    /// `None` when `CALM_POSTGRES_URL` points at an existing server.
    process: Option<ServerProcess>,
    dir: Option<PathBuf>,
    port: u16,
    url: String,
    binary: Option<PathBuf>,
    ids: Option<(u32, u32)>,
    /// Whether commits wait for the disk (`fsync`, full-page writes).
    durable: bool,
}

impl PostgresServer {
    /// Starts a fresh server (or uses `CALM_POSTGRES_URL`).
    ///
    /// It runs without `fsync`: the OS keeps written pages when the server
    /// process is killed, which is the fault tests inject, so only a
    /// machine crash could lose data, and tests run faster.
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] if PostgreSQL is not installed, or an error
    /// starting it.
    pub fn start() -> Result<Self, ServerError> {
        Self::start_as(false)
    }

    /// Starts a fresh server configured as a production one: every commit
    /// waits for its WAL to reach the disk (`fsync` and full-page writes
    /// on, PostgreSQL's defaults). For measuring what a write costs where
    /// users run it. Uses `CALM_POSTGRES_URL` instead when it is set.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_durable() -> Result<Self, ServerError> {
        Self::start_as(true)
    }

    fn start_as(durable: bool) -> Result<Self, ServerError> {
        if let Ok(url) = std::env::var("CALM_POSTGRES_URL") {
            return Ok(Self {
                process: None,
                dir: None,
                port: 0,
                url,
                binary: None,
                ids: None,
                durable,
            });
        }
        let versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.path().join("bin"))
                    .collect()
            })
            .unwrap_or_default();
        let missing = ServerError::Missing {
            binary: "initdb/postgres",
            package: "postgresql",
            env: "CALM_POSTGRES_URL",
        };
        let initdb = find("initdb", &versions).ok_or(missing)?;
        let postgres = initdb.with_file_name("postgres");
        let dir = temp_dir("pg")?;
        let ids = if is_root() { unprivileged_ids() } else { None };
        if let Some((uid, gid)) = ids {
            chown_tree(&dir, uid, gid)?;
        }
        let mut init = Command::new(&initdb);
        init.args(["-D"])
            .arg(dir.join("data"))
            .args(["-U", "calm", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_user(&mut init, ids);
        let out = init.output().map_err(|source| ServerError::Start {
            what: "initdb",
            source,
        })?;
        if !out.status.success() {
            return Err(ServerError::Start {
                what: "initdb",
                source: std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
            });
        }
        let port = free_port()?;
        let mut server = Self {
            process: None,
            url: format!("host=127.0.0.1 port={port} user=calm dbname=postgres connect_timeout=5"),
            dir: Some(dir),
            port,
            binary: Some(postgres),
            ids,
            durable,
        };
        start_retrying(&mut server, Self::launch, |server| {
            server.kill();
            server.port = free_port()?;
            server.url = format!(
                "host=127.0.0.1 port={} user=calm dbname=postgres connect_timeout=5",
                server.port
            );
            Ok(())
        })?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), ServerError> {
        let (Some(dir), Some(bin)) = (&self.dir, &self.binary) else {
            return Ok(());
        };
        let mut cmd = Command::new(bin);
        cmd.arg("-D")
            .arg(dir.join("data"))
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(dir)
            .args(["-c", "max_connections=200"]);
        if !self.durable {
            cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        as_user(&mut cmd, self.ids);
        let child = cmd.spawn().map_err(|source| ServerError::Start {
            what: "postgres",
            source,
        })?;
        wait_port(
            Some(self.process.insert(ServerProcess { child: Some(child) })),
            self.port,
            "postgres",
            Duration::from_secs(30),
        )?;
        // The port opens a moment before the server accepts queries.
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    }

    /// The connection string.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server process (`None` for an external server).
    pub fn process(&self) -> Option<&ServerProcess> {
        self.process.as_ref()
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(p) = &mut self.process {
            p.kill();
        }
    }

    /// Makes the server accept TLS connections only: writes a self-signed
    /// certificate for 127.0.0.1 (with the `openssl` command), turns
    /// `ssl` on, allows only `hostssl` logins, and restarts it. Returns
    /// the certificate (PEM) for the client to trust.
    ///
    /// # Errors
    ///
    /// For a server from `CALM_POSTGRES_URL` (its TLS is its own), or an
    /// error writing the files or restarting.
    pub fn require_tls(&mut self) -> Result<Vec<u8>, ServerError> {
        let io = |what: &'static str| move |source| ServerError::Start { what, source };
        let Some(dir) = self.dir.clone() else {
            return Err(ServerError::Start {
                what: "enabling TLS",
                source: std::io::Error::other(
                    "an external server's TLS is configured by its owner",
                ),
            });
        };
        let data = dir.join("data");
        self_signed(&data, self.ids)?;
        let conf = data.join("postgresql.conf");
        let mut settings = std::fs::read_to_string(&conf).map_err(io("reading postgresql.conf"))?;
        settings.push_str("\nssl = on\n");
        std::fs::write(&conf, settings).map_err(io("writing postgresql.conf"))?;
        let hba = data.join("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).map_err(io("reading pg_hba.conf"))?;
        let rules: String = rules
            .lines()
            .map(|l| match l.strip_prefix("host ") {
                Some(rest) => format!("hostssl {rest}\n"),
                None => format!("{l}\n"),
            })
            .collect();
        std::fs::write(&hba, rules).map_err(io("writing pg_hba.conf"))?;
        self.restart()?;
        std::fs::read(data.join("server.crt")).map_err(io("reading the certificate"))
    }

    /// Starts the server again on the same data and port.
    ///
    /// # Errors
    ///
    /// An error starting it.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.kill();
        // A killed postmaster leaves its pid file; remove it so the new one
        // starts (its children die with it).
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(dir.join("data").join("postmaster.pid"));
        }
        self.launch()
    }
}

/// Writes `server.crt` and `server.key` into `dir`: a self-signed server
/// certificate for 127.0.0.1 (made with the `openssl` command, as the
/// user `ids` when given), the key readable by its owner only.
fn self_signed(dir: &Path, ids: Option<(u32, u32)>) -> Result<(), ServerError> {
    let mut openssl = Command::new("openssl");
    openssl
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            // A server certificate, not a CA: rustls refuses a CA as the
            // server's own certificate.
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ])
        .arg("-keyout")
        .arg(dir.join("server.key"))
        .arg("-out")
        .arg(dir.join("server.crt"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    as_user(&mut openssl, ids);
    let out = openssl.output().map_err(|source| ServerError::Start {
        what: "running openssl",
        source,
    })?;
    if !out.status.success() {
        return Err(ServerError::Start {
            what: "openssl",
            source: std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        });
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .map_err(|source| ServerError::Start {
        what: "protecting the key",
        source,
    })
}

fn as_user(cmd: &mut Command, ids: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = ids {
        cmd.uid(uid).gid(gid);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// An etcd server for tests.
#[derive(Debug)]
pub struct EtcdServer {
    process: Option<ServerProcess>,
    dir: Option<PathBuf>,
    endpoints: Vec<String>,
    ports: (u16, u16),
    binary: Option<PathBuf>,
    /// Clients must use TLS (`server.crt` and `server.key` in `dir`).
    tls: bool,
}

impl EtcdServer {
    /// Starts a fresh single-node server (or uses `CALM_ETCD_ENDPOINTS`,
    /// comma-separated).
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] if etcd is not installed, or an error
    /// starting it.
    pub fn start() -> Result<Self, ServerError> {
        if let Ok(eps) = std::env::var("CALM_ETCD_ENDPOINTS") {
            return Ok(Self {
                process: None,
                dir: None,
                endpoints: eps.split(',').map(str::to_owned).collect(),
                ports: (0, 0),
                binary: None,
                tls: false,
            });
        }
        Self::start_own(false)
    }

    /// Starts a fresh single-node server that serves clients over TLS
    /// only (`https://` endpoints), with a self-signed certificate for
    /// 127.0.0.1 made by the `openssl` command; returns it with the
    /// certificate (PEM) for the client to trust. Never an external server.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), or an error making the certificate.
    pub fn start_tls() -> Result<(Self, Vec<u8>), ServerError> {
        let server = Self::start_own(true)?;
        let dir = server.dir.as_deref().unwrap_or(Path::new("."));
        let pem = std::fs::read(dir.join("server.crt")).map_err(|source| ServerError::Start {
            what: "reading the certificate",
            source,
        })?;
        Ok((server, pem))
    }

    fn start_own(tls: bool) -> Result<Self, ServerError> {
        let binary = find("etcd", &[]).ok_or(ServerError::Missing {
            binary: "etcd",
            package: "etcd-server",
            env: "CALM_ETCD_ENDPOINTS",
        })?;
        let dir = temp_dir("etcd")?;
        if tls {
            self_signed(&dir, None)?;
        }
        let ports = (free_port()?, free_port()?);
        let scheme = if tls { "https" } else { "http" };
        let mut server = Self {
            process: None,
            dir: Some(dir),
            endpoints: vec![format!("{scheme}://127.0.0.1:{}", ports.0)],
            ports,
            binary: Some(binary),
            tls,
        };
        start_retrying(&mut server, Self::launch, |server| {
            server.kill();
            server.ports = (free_port()?, free_port()?);
            server.endpoints = vec![format!("{scheme}://127.0.0.1:{}", server.ports.0)];
            // A start that got far enough may have recorded its peer port.
            if let Some(dir) = &server.dir {
                let _ = std::fs::remove_dir_all(dir.join("data"));
            }
            Ok(())
        })?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), ServerError> {
        let (Some(dir), Some(bin)) = (&self.dir, &self.binary) else {
            return Ok(());
        };
        let scheme = if self.tls { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.ports.0);
        let peer = format!("http://127.0.0.1:{}", self.ports.1);
        let mut cmd = etcd_command(bin, &dir.join("data"), "calm", &client, &peer);
        if self.tls {
            cmd.arg("--cert-file")
                .arg(dir.join("server.crt"))
                .arg("--key-file")
                .arg(dir.join("server.key"));
        }
        let child = cmd
            .args(["--initial-cluster", &format!("calm={peer}")])
            .spawn()
            .map_err(|source| ServerError::Start {
                what: "etcd",
                source,
            })?;
        wait_port(
            Some(self.process.insert(ServerProcess { child: Some(child) })),
            self.ports.0,
            "etcd",
            Duration::from_secs(30),
        )?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    }

    /// The client endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The server process (`None` for an external server).
    pub fn process(&self) -> Option<&ServerProcess> {
        self.process.as_ref()
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(p) = &mut self.process {
            p.kill();
        }
    }

    /// Starts the server again on the same data and ports.
    ///
    /// # Errors
    ///
    /// An error starting it.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.kill();
        self.launch()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The `etcd` command for member `name` with its data in `data`, serving
/// clients at `client` and peers at `peer` (both on 127.0.0.1); the caller
/// adds `--initial-cluster` and TLS flags.
fn etcd_command(bin: &Path, data: &Path, name: &str, client: &str, peer: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("--data-dir")
        .arg(data)
        .args(["--name", name])
        .args([
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
        ])
        .args([
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// Sends `body` (JSON) to `path` of the JSON gateway of the etcd at
/// `endpoint` (`http://host:port`); returns the whole HTTP reply, status
/// line included.
///
/// # Errors
///
/// The I/O error of the connection.
pub fn etcd_gateway(endpoint: &str, path: &str, body: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let host = endpoint.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(host)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    Ok(reply)
}

/// A three-member (or larger) etcd cluster for tests, every member a
/// process of its own on loopback ports, so a test can freeze or kill the
/// raft leader or a follower and restart it on its data. Never an
/// external cluster (one could not be frozen).
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<ClusterMember>,
    dir: PathBuf,
    binary: PathBuf,
    initial_cluster: String,
}

#[derive(Debug)]
struct ClusterMember {
    name: String,
    /// Client URL and its port.
    client: (String, u16),
    peer: String,
    process: Option<ServerProcess>,
    /// Stopped with SIGSTOP and not resumed: asking it would hang.
    frozen: bool,
}

impl EtcdCluster {
    /// Starts a fresh cluster of `members` members (at least 1) and waits
    /// until it has a leader.
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] if etcd is not installed, or an error
    /// starting it.
    pub fn start(members: usize) -> Result<Self, ServerError> {
        let binary = find("etcd", &[]).ok_or(ServerError::Missing {
            binary: "etcd",
            package: "etcd-server",
            env: "(none: a cluster is always started here)",
        })?;
        let dir = temp_dir("etcd-cluster")?;
        let mut list = Vec::new();
        for i in 0..members.max(1) {
            let port = free_port()?;
            list.push(ClusterMember {
                name: format!("m{i}"),
                client: (format!("http://127.0.0.1:{port}"), port),
                peer: format!("http://127.0.0.1:{}", free_port()?),
                process: None,
                frozen: false,
            });
        }
        let initial_cluster = list
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            members: list,
            dir,
            binary,
            initial_cluster,
        };
        // Every member must be up before any can elect a leader.
        for i in 0..cluster.members.len() {
            cluster.spawn(i)?;
        }
        for m in &mut cluster.members {
            wait_port(
                m.process.as_mut(),
                m.client.1,
                "etcd member",
                Duration::from_secs(30),
            )?;
        }
        cluster.wait_for_leader(Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), ServerError> {
        let m = &self.members[i];
        // On a restart the data directory already holds the membership,
        // and etcd ignores the initial-cluster flags.
        let child = etcd_command(
            &self.binary,
            &self.dir.join(&m.name),
            &m.name,
            &m.client.0,
            &m.peer,
        )
        .args(["--initial-cluster", &self.initial_cluster])
        .args(["--initial-cluster-state", "new"])
        .args(["--initial-cluster-token", "calm-test-cluster"])
        .spawn()
        .map_err(|source| ServerError::Start {
            what: "etcd member",
            source,
        })?;
        self.members[i].process = Some(ServerProcess { child: Some(child) });
        self.members[i].frozen = false;
        Ok(())
    }

    /// Every member's client endpoint, for a client that balances over
    /// them.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client.0.clone()).collect()
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no member (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s process (`None` while it is killed).
    pub fn process(&self, i: usize) -> Option<&ServerProcess> {
        self.members.get(i)?.process.as_ref()
    }

    /// Sends `signal` to member `i` (a killed member is left alone).
    ///
    /// # Errors
    ///
    /// The error of the `kill(2)` call.
    pub fn signal(&mut self, i: usize, signal: Signal) -> std::io::Result<()> {
        let Some(m) = self.members.get_mut(i) else {
            return Ok(());
        };
        if let Some(p) = &m.process {
            p.signal(signal)?;
            m.frozen = signal == Signal::Stop;
        }
        Ok(())
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(m) = self.members.get_mut(i)
            && let Some(mut p) = m.process.take()
        {
            p.kill();
        }
    }

    /// Kills member `i` if it runs, and starts it again on its data and
    /// ports.
    ///
    /// # Errors
    ///
    /// An error starting it.
    pub fn restart(&mut self, i: usize) -> Result<(), ServerError> {
        self.kill(i);
        self.spawn(i)?;
        let m = &mut self.members[i];
        wait_port(
            m.process.as_mut(),
            m.client.1,
            "etcd member",
            Duration::from_secs(30),
        )
    }

    /// The index of the member that is raft leader now, as the running
    /// members report it (`None`: no running member knows one; frozen
    /// members are not asked).
    pub fn leader(&self) -> Option<usize> {
        let ids: Vec<Option<(String, String)>> = self
            .members
            .iter()
            .map(|m| {
                if m.process.is_none() || m.frozen {
                    return None;
                }
                let reply = etcd_gateway(&m.client.0, "/v3/maintenance/status", "{}").ok()?;
                let body = reply.split("\r\n\r\n").nth(1)?;
                let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
                let own = v["header"]["member_id"].as_str()?.to_owned();
                let leader = v["leader"].as_str()?.to_owned();
                Some((own, leader))
            })
            .collect();
        let leader = ids.iter().flatten().map(|(_, l)| l).find(|l| *l != "0")?;
        ids.iter()
            .position(|m| m.as_ref().is_some_and(|(own, _)| own == leader))
    }

    /// Waits until a running member reports a leader.
    ///
    /// # Errors
    ///
    /// [`ServerError::NotReady`] if none does within `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ServerError> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(ServerError::NotReady {
            what: "an etcd cluster leader",
            timeout,
        })
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            let _ = self.signal(i, Signal::Cont);
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis server for tests: `redis-server` with persistence off (no RDB
/// snapshots, no append-only file), so a kill loses every key, as the
/// fault tests want.
#[derive(Debug)]
pub struct RedisServer {
    /// `None` when `CALM_REDIS_URL` points at an existing server.
    process: Option<ServerProcess>,
    dir: Option<PathBuf>,
    port: u16,
    url: String,
    binary: Option<PathBuf>,
}

impl RedisServer {
    /// Starts a fresh server (or uses `CALM_REDIS_URL`).
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] if `redis-server` is not installed, or an
    /// error starting it.
    pub fn start() -> Result<Self, ServerError> {
        if let Ok(url) = std::env::var("CALM_REDIS_URL") {
            return Ok(Self {
                process: None,
                dir: None,
                port: 0,
                url,
                binary: None,
            });
        }
        Self::start_own()
    }

    /// Starts a fresh server of this process's own, ignoring
    /// `CALM_REDIS_URL` (tests that need several independent servers,
    /// or to freeze and kill one).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_own() -> Result<Self, ServerError> {
        let binary = find("redis-server", &[]).ok_or(ServerError::Missing {
            binary: "redis-server",
            package: "redis-server",
            env: "CALM_REDIS_URL",
        })?;
        let dir = temp_dir("redis")?;
        let port = free_port()?;
        let mut server = Self {
            process: None,
            dir: Some(dir),
            port,
            url: format!("redis://127.0.0.1:{port}/"),
            binary: Some(binary),
        };
        start_retrying(&mut server, Self::launch, |server| {
            server.kill();
            server.port = free_port()?;
            server.url = format!("redis://127.0.0.1:{}/", server.port);
            Ok(())
        })?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), ServerError> {
        let (Some(dir), Some(bin)) = (&self.dir, &self.binary) else {
            return Ok(());
        };
        let child = Command::new(bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ServerError::Start {
                what: "redis-server",
                source,
            })?;
        wait_port(
            Some(self.process.insert(ServerProcess { child: Some(child) })),
            self.port,
            "redis-server",
            Duration::from_secs(30),
        )
    }

    /// The connection URL (`redis://127.0.0.1:<port>/`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server process (`None` for an external server).
    pub fn process(&self) -> Option<&ServerProcess> {
        self.process.as_ref()
    }

    /// Sends `signal` to the server (SIGSTOP freezes it, SIGCONT resumes
    /// it). An external server is left alone.
    ///
    /// # Errors
    ///
    /// The error of the `kill(2)` call.
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        match &self.process {
            Some(p) => p.signal(signal),
            None => Ok(()),
        }
    }

    /// Kills the server with SIGKILL (every key is lost: no persistence).
    pub fn kill(&mut self) {
        if let Some(p) = &mut self.process {
            p.kill();
        }
    }

    /// Starts the server again, empty, on the same port.
    ///
    /// # Errors
    ///
    /// An error starting it.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.kill();
        self.launch()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server process that ends before its port opens is reported at
    /// once, not after the whole timeout, and is not signalled after.
    #[test]
    fn an_early_exit_is_reported_at_once() {
        let child = Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .expect("sh runs");
        let mut process = ServerProcess { child: Some(child) };
        let port = free_port().expect("a free port");
        let began = Instant::now();
        let r = wait_port(Some(&mut process), port, "sh", Duration::from_secs(30));
        assert!(
            matches!(r, Err(ServerError::Exited { status, .. }) if status.code() == Some(3)),
            "{r:?}"
        );
        assert!(began.elapsed() < Duration::from_secs(10));
        assert_eq!(process.pid(), None, "a reaped process is forgotten");
    }

    /// Starts that exit early or time out are retried on fresh ports, at
    /// most `STARTS` times in all; other errors are not retried.
    #[test]
    fn early_exits_are_retried_on_fresh_ports() {
        let exited = || {
            let mut sh = Command::new("sh")
                .args(["-c", "exit 1"])
                .spawn()
                .expect("sh runs");
            ServerError::Exited {
                what: "test",
                status: sh.wait().expect("sh ends"),
            }
        };
        for fails in 0..=STARTS {
            let (mut starts, mut repicks) = (0, 0);
            let r = start_retrying(
                &mut (),
                |()| {
                    starts += 1;
                    if starts <= fails {
                        Err(exited())
                    } else {
                        Ok(())
                    }
                },
                |()| {
                    repicks += 1;
                    Ok(())
                },
            );
            assert_eq!(r.is_ok(), fails < STARTS, "{fails} early exits");
            assert_eq!(starts, (fails + 1).min(STARTS));
            assert_eq!(repicks, starts - 1);
        }
        // How many starts an error that never goes away gets.
        let starts_on = |error: fn() -> ServerError| {
            let mut starts = 0;
            let r = start_retrying(
                &mut (),
                |()| {
                    starts += 1;
                    Err(error())
                },
                |()| Ok(()),
            );
            assert!(r.is_err());
            starts
        };
        let timeout = || ServerError::NotReady {
            what: "test",
            timeout: Duration::ZERO,
        };
        assert_eq!(starts_on(timeout), STARTS);
        let failed = || ServerError::Start {
            what: "test",
            source: std::io::Error::other("no"),
        };
        assert_eq!(starts_on(failed), 1);
    }
}
