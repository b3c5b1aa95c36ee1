//! Who answers at a server's address when a store does not open: a server
//! of another kind (a `redis://` URL given PostgreSQL's port) is named as
//! such, where the client alone says "broken pipe" or "connect timed out".
//!
//! Each server store describes the first exchange of its protocol as data
//! (its [`Greeting`]); the registry sends it to every server of a URL that
//! failed to open, and only then, so a store that opens pays nothing.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The first exchange of a store's protocol.
pub(crate) struct Greeting {
    /// The protocol's name as users know it: "the server there does not
    /// speak {protocol}".
    pub(crate) protocol: &'static str,
    /// What a client says first (empty where the server speaks first).
    pub(crate) hello: &'static [u8],
    /// Whether the first bytes back are this protocol's.
    pub(crate) answers: fn(&[u8]) -> bool,
    /// The URL schemes that talk TLS from the first byte, where a plain
    /// greeting tells nothing.
    pub(crate) tls_schemes: &'static [&'static str],
}

/// How long the probe waits to connect, and then for an answer.
pub(crate) const WAIT: Duration = Duration::from_secs(1);

/// What is wrong with the server at `host:port`, when it is listening but
/// does not answer `greeting` as a server of its protocol would; `None`
/// when nothing listens there (the client's own error says so) or when it
/// does answer in the protocol.
pub(crate) async fn stranger(greeting: &'static Greeting, host: String, port: u16) -> Option<String> {
    tokio::task::spawn_blocking(move || stranger_now(greeting, &host, port))
        .await
        .ok()
        .flatten()
}

fn stranger_now(greeting: &Greeting, host: &str, port: u16) -> Option<String> {
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let mut stream = TcpStream::connect_timeout(&addr, WAIT).ok()?;
    stream.set_read_timeout(Some(WAIT)).ok()?;
    stream.set_write_timeout(Some(WAIT)).ok()?;
    let closed = || "it closed the connection at the greeting".to_string();
    if !greeting.hello.is_empty() && stream.write_all(greeting.hello).is_err() {
        return Some(closed());
    }
    let mut answer = [0u8; 64];
    match stream.read(&mut answer) {
        Ok(0) => Some(closed()),
        Ok(n) if (greeting.answers)(&answer[..n]) => None,
        Ok(n) => Some(format!("it answered \"{}\"", printable(&answer[..n]))),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Some(if greeting.hello.is_empty() {
                format!("it sent no greeting within {}s", WAIT.as_secs())
            } else {
                format!("it did not answer the greeting within {}s", WAIT.as_secs())
            })
        }
        Err(_) => Some(closed()),
    }
}

/// An answer's printable ASCII, other bytes as '.', at most 40 characters.
fn printable(bytes: &[u8]) -> String {
    let text: String = bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        })
        .take(40)
        .collect();
    text.trim_matches('.').trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    static ECHO: Greeting = Greeting {
        protocol: "Test",
        hello: b"hi\r\n",
        answers: |b| b.starts_with(b"+"),
        tls_schemes: &[],
    };

    fn server(reply: &'static [u8], close: bool) -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 16];
            let _ = s.read(&mut buf);
            let _ = s.write_all(reply);
            if !close {
                std::thread::sleep(Duration::from_secs(3));
            }
        });
        port
    }

    #[tokio::test]
    async fn names_what_answers() {
        let own = server(b"+OK\r\n", true);
        assert_eq!(stranger(&ECHO, "127.0.0.1".into(), own).await, None);
        let other = server(b"\x0a5.5.5-10.11.6-MariaDB\x00", true);
        assert_eq!(
            stranger(&ECHO, "127.0.0.1".into(), other).await.as_deref(),
            Some("it answered \"5.5.5-10.11.6-MariaDB\"")
        );
        let closing = server(b"", true);
        assert_eq!(
            stranger(&ECHO, "127.0.0.1".into(), closing).await.as_deref(),
            Some("it closed the connection at the greeting")
        );
        let silent = server(b"", false);
        assert_eq!(
            stranger(&ECHO, "127.0.0.1".into(), silent).await.as_deref(),
            Some("it did not answer the greeting within 1s")
        );
        let nobody = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert_eq!(stranger(&ECHO, "127.0.0.1".into(), nobody).await, None);
    }
}
