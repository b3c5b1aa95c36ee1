//! A loopback TCP proxy for network faults. This machine's kernel (and many
//! users') has no `netem`, and a proxy needs no root and works in front of
//! any deployment: each worker reaches each store node through one of its
//! own, which the harness switches between passing, delaying, holding and
//! cutting.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Rng;

/// Makes closing `s` reset its peer (a zero linger: a drop sends RST at
/// once; tokio deprecates `set_linger` for the non-zero lingers that block).
#[allow(deprecated)]
fn reset_on_close(s: &TcpStream) {
    let _ = s.set_linger(Some(Duration::ZERO));
}

/// What a link does with the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Forward each chunk `base` ± `jitter` later, in order.
    Delay { base: Duration, jitter: Duration },
    /// Keep every chunk until the mode changes, then deliver them in order.
    Hold,
    /// Reset every connection and refuse new ones.
    Cut,
}

/// One proxy: listens on a loopback port, forwards to `target`.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Ends the accept loop, and with its JoinSet every connection.
        self.task.abort();
    }
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) for connections to `target`
    /// (`host:port`).
    pub async fn start(target: String, seed: u64) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Mode::Pass);
        let task = tokio::spawn(accept(listener, target, watching, seed));
        Ok(Proxy { addr, mode, task })
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the link (every connection, current and new).
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

async fn accept(listener: TcpListener, target: String, mode: watch::Receiver<Mode>, seed: u64) {
    let mut connections = JoinSet::new();
    let mut n = 0u64;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // Finished connections leave the set as they go.
        while connections.try_join_next().is_some() {}
        if *mode.borrow() == Mode::Cut {
            // Refused: a reset, as from a host that is cut off.
            reset_on_close(&client);
            drop(client);
            continue;
        }
        n += 1;
        connections.spawn(connection(client, target.clone(), mode.clone(), seed ^ n));
    }
}

async fn connection(client: TcpStream, target: String, mode: watch::Receiver<Mode>, seed: u64) {
    let Ok(server) = TcpStream::connect(&target).await else {
        reset_on_close(&client);
        return;
    };
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        // A cut is abrupt: dropped sockets reset their peers.
        reset_on_close(s);
    }
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, mode.clone(), seed);
    let down = pump(
        server_read,
        client_write,
        mode.clone(),
        seed.rotate_left(17),
    );
    let mut cut = mode;
    tokio::select! {
        _ = async { tokio::try_join!(up, down) } => {}
        _ = cut.wait_for(|m| *m == Mode::Cut) => {}
    }
}

/// Carries one direction until its reader ends (then closes the writer),
/// applying the link's mode to each chunk.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    seed: u64,
) -> std::io::Result<()> {
    let (chunks, mut pending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading_mode = mode.clone();
    let read = async move {
        let mut rng = Rng::new(seed);
        let mut buf = vec![0u8; 16 * 1024];
        let mut last = Instant::now();
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            let now = Instant::now();
            let due = match *reading_mode.borrow() {
                Mode::Delay { base, jitter } => {
                    now + rng.between(base.saturating_sub(jitter), base + jitter)
                }
                _ => now,
            };
            // In order: a chunk never overtakes the one before it.
            last = due.max(last);
            if chunks.send((last, buf[..n].to_vec())).is_err() {
                return Ok(());
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = pending.recv().await {
            tokio::time::sleep_until(due).await;
            // Held bytes wait for the hold to end.
            loop {
                match *mode.borrow_and_update() {
                    Mode::Hold => {}
                    Mode::Cut => return Err(std::io::ErrorKind::ConnectionReset.into()),
                    _ => break,
                }
                if mode.changed().await.is_err() {
                    return Ok(());
                }
            }
            to.write_all(&bytes).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// A store URL's parts around its server list:
/// `SCHEME://[USERINFO@]HOST:PORT[,HOST:PORT…][/PATH][?QUERY][#FRAGMENT]`,
/// the shape of every backend with a network. Each server is checked to be
/// `host:port`.
struct Parts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    servers: Vec<&'a str>,
    tail: &'a str,
}

fn parts(url: &str) -> Result<Parts<'_>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("expected SCHEME://… in --store")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let servers: Vec<&str> = hosts.split(',').collect();
    if servers.iter().any(|s| {
        s.rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    }) {
        return Err(format!(
            "network faults need every server as host:port in --store (found {hosts:?})"
        ));
    }
    Ok(Parts {
        scheme,
        userinfo,
        servers,
        tail,
    })
}

/// The servers of a store URL, in order.
pub fn servers_of(url: &str) -> Result<Vec<String>, String> {
    Ok(parts(url)?
        .servers
        .into_iter()
        .map(str::to_string)
        .collect())
}

/// `url` with its servers replaced by `to` (as many, in order). A loopback
/// host name is kept, so that a certificate issued to it still matches.
pub fn with_servers(url: &str, to: &[SocketAddr]) -> Result<String, String> {
    let p = parts(url)?;
    if p.servers.len() != to.len() {
        return Err("one proxy per server".into());
    }
    let hosts: Vec<String> = p
        .servers
        .iter()
        .zip(to)
        .map(|(server, addr)| match server.rsplit_once(':') {
            Some(("localhost", _)) => format!("localhost:{}", addr.port()),
            _ => addr.to_string(),
        })
        .collect();
    let userinfo = p.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    Ok(format!(
        "{}://{userinfo}{}{}",
        p.scheme,
        hosts.join(","),
        p.tail
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lists_are_rewritten_and_the_rest_kept() {
        let a: SocketAddr = "127.0.0.1:1001".parse().expect("an address");
        let b: SocketAddr = "127.0.0.1:1002".parse().expect("an address");
        assert_eq!(
            with_servers("redis://:p%40w@127.0.0.1:6379/0?prefix=x", &[a]).as_deref(),
            Ok("redis://:p%40w@127.0.0.1:1001/0?prefix=x")
        );
        assert_eq!(
            with_servers("zk://localhost:2181,10.0.0.2:2182/tenure", &[a, b]).as_deref(),
            Ok("zk://localhost:1001,127.0.0.1:1002/tenure")
        );
        assert_eq!(
            servers_of("etcd://u:pw@h1:1,h2:2?layout=etcd"),
            Ok(vec!["h1:1".to_string(), "h2:2".to_string()])
        );
        assert!(servers_of("sqlite:///tmp/x.db").is_err());
        assert!(servers_of("redis://host/0").is_err());
        assert!(with_servers("redis://h:1", &[a, b]).is_err());
    }

    /// "ping" there and back: the stream again, and how long it took.
    async fn round_trip(mut s: TcpStream) -> std::io::Result<(TcpStream, Duration)> {
        let start = Instant::now();
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");
        Ok((s, start.elapsed()))
    }

    /// An echo server behind a proxy: bytes pass, come back late under a
    /// delay, wait out a hold and then arrive, and a cut resets the
    /// connection and refuses the next.
    #[tokio::test]
    async fn passes_delays_holds_and_cuts() {
        let echo = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let target = echo.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = Proxy::start(target, 7).await.expect("proxy");
        let s = TcpStream::connect(proxy.addr()).await.expect("connect");
        let limit = Duration::from_secs(5);
        let (s, fast) = tokio::time::timeout(limit, round_trip(s))
            .await
            .expect("in time")
            .expect("passes");
        assert!(fast < Duration::from_millis(100), "{fast:?}");
        proxy.set(Mode::Delay {
            base: Duration::from_millis(100),
            jitter: Duration::from_millis(20),
        });
        let (s, slow) = tokio::time::timeout(limit, round_trip(s))
            .await
            .expect("in time")
            .expect("passes late");
        // Each way is delayed: at least 2 × 80 ms.
        assert!(slow >= Duration::from_millis(160), "{slow:?}");
        proxy.set(Mode::Hold);
        let held = tokio::spawn(round_trip(s));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!held.is_finished(), "held bytes were delivered");
        proxy.set(Mode::Pass);
        let (mut s, took) = tokio::time::timeout(limit, held)
            .await
            .expect("delivered after the hold")
            .expect("task")
            .expect("passes");
        assert!(took >= Duration::from_millis(300), "{took:?}");
        proxy.set(Mode::Cut);
        let mut buf = [0u8; 4];
        let after_cut = tokio::time::timeout(limit, async {
            let _ = s.write_all(b"ping").await;
            s.read(&mut buf).await
        })
        .await
        .expect("in time");
        assert!(!matches!(after_cut, Ok(n) if n > 0), "{after_cut:?}");
        let mut again = TcpStream::connect(proxy.addr())
            .await
            .expect("accepted, then reset");
        let refused = tokio::time::timeout(limit, async {
            let _ = again.write_all(b"ping").await;
            again.read(&mut buf).await
        })
        .await
        .expect("in time");
        assert!(!matches!(refused, Ok(n) if n > 0), "{refused:?}");
        proxy.set(Mode::Pass);
        let fresh = TcpStream::connect(proxy.addr()).await.expect("connect");
        tokio::time::timeout(limit, round_trip(fresh))
            .await
            .expect("in time")
            .expect("passes once the cut ends");
    }
}
