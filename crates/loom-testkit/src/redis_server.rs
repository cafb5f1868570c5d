//! A real `redis-server` (Debian's) for tests: started on a free port of
//! 127.0.0.1 in a directory of its own, with its append-only file on, and
//! killed when dropped; or also on a unix socket, behind a password.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    password: Option<String>,
}

/// Why no server could be started.
#[derive(Debug)]
pub struct NoRedis(pub String);

impl std::fmt::Display for NoRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot start redis-server ({}); install it: apt-get install -y redis-server",
            self.0
        )
    }
}

impl RedisServer {
    /// Starts a server whose files are in `dir` (`appendonly yes`,
    /// `appendfsync always`: every acknowledged write is on disk).
    pub fn start(dir: &Path) -> Result<Self, NoRedis> {
        Self::start_with(dir, None)
    }

    /// Like [`RedisServer::start`], also listening on a unix socket
    /// ([`RedisServer::socket`]), and answering only clients that give
    /// `password`.
    pub fn start_with_password(dir: &Path, password: &str) -> Result<Self, NoRedis> {
        Self::start_with(dir, Some(password.to_string()))
    }

    fn start_with(dir: &Path, password: Option<String>) -> Result<Self, NoRedis> {
        let port = free_port().map_err(|err| NoRedis(format!("no free port: {err}")))?;
        let child = spawn(dir, port, password.as_deref())?;
        let mut server = Self {
            child,
            port,
            dir: dir.to_path_buf(),
            password,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Kills the server (SIGKILL, as a crash would) and starts it again on
    /// the same port and files: it comes back with what its append-only
    /// file holds.
    pub fn restart(&mut self) -> Result<(), NoRedis> {
        self.kill();
        self.child = spawn(&self.dir, self.port, self.password.as_deref())?;
        self.wait_ready()
    }

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `redis://127.0.0.1:PORT/DB`.
    pub fn url(&self, db: u8) -> String {
        format!("redis://127.0.0.1:{}/{db}", self.port)
    }

    /// The unix socket of a server started with a password.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    /// Its process id (for its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The directory of its files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn wait_ready(&mut self) -> Result<(), NoRedis> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(NoRedis(format!("it exited: {status}")));
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(NoRedis("it did not answer within 10 s".into()))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-server` on `port`, its files in `dir`; with a password, on the
/// socket `dir`/redis.sock too.
fn spawn(dir: &Path, port: u16, password: Option<&str>) -> Result<Child, NoRedis> {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--dir", &dir.display().to_string()])
        .args(["--appendonly", "yes", "--appendfsync", "always", "--save", ""])
        .args(["--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning"]);
    if let Some(password) = password {
        command
            .args(["--requirepass", password])
            .args(["--unixsocket", &dir.join("redis.sock").display().to_string()])
            .args(["--unixsocketperm", "700"]);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| NoRedis(err.to_string()))
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether a server answers `PING` on `port` (RESP by hand: the testkit
/// has no Redis client, and one line is all it takes); one behind a
/// password answers `-NOAUTH`, which is an answer too.
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}
