//! The test CA and server certificates for the TLS variants.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::missing;
use crate::process::find;

/// A test CA and a server certificate it signed, for `127.0.0.1` and
/// `localhost`, made with the `openssl` command.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA's certificate (PEM): what clients trust.
    pub ca: PathBuf,
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// The server's private key (PEM).
    pub key: PathBuf,
}

impl TlsFiles {
    /// Makes them in `dir`, or `None` (after [`missing`]) without `openssl`.
    pub fn make(dir: &Path) -> Option<TlsFiles> {
        if find("openssl", &["/usr/bin/openssl"]).is_none() {
            missing("openssl", "openssl");
            return None;
        }
        let files = TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        let ca_key = dir.join("ca.key");
        let csr = dir.join("server.csr");
        let ext = dir.join("san.ext");
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("write ext");
        let run = |args: &[&std::ffi::OsStr]| {
            let status = Command::new("openssl")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run openssl");
            assert!(status.success(), "openssl {args:?} failed");
        };
        let os = |s: &str| std::ffi::OsString::from(s);
        run(&[
            &os("req"),
            &os("-x509"),
            &os("-newkey"),
            &os("rsa:2048"),
            &os("-nodes"),
            &os("-keyout"),
            ca_key.as_os_str(),
            &os("-out"),
            files.ca.as_os_str(),
            &os("-days"),
            &os("2"),
            &os("-subj"),
            &os("/CN=tenure test CA"),
        ]);
        run(&[
            &os("req"),
            &os("-newkey"),
            &os("rsa:2048"),
            &os("-nodes"),
            &os("-keyout"),
            files.key.as_os_str(),
            &os("-out"),
            csr.as_os_str(),
            &os("-subj"),
            &os("/CN=localhost"),
        ]);
        run(&[
            &os("x509"),
            &os("-req"),
            &os("-in"),
            csr.as_os_str(),
            &os("-CA"),
            files.ca.as_os_str(),
            &os("-CAkey"),
            ca_key.as_os_str(),
            &os("-CAcreateserial"),
            &os("-out"),
            files.cert.as_os_str(),
            &os("-days"),
            &os("2"),
            &os("-extfile"),
            ext.as_os_str(),
        ]);
        Some(files)
    }
}
