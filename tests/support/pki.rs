//! Test certificates, shared by the TLS tests of several packages: a throw-away CA, a server
//! certificate for `localhost` and 127.0.0.1 and a client certificate, generated with rcgen, as PEM
//! strings and as files in a directory of their own (removed on drop).
//!
//! A plain file, not a crate: tests that spawn a binary must live in that binary's package, so they
//! include it with `#[path = "../../tests/support/pki.rs"] mod pki;` (the including package needs
//! `rcgen` as a dev-dependency and `clb-state-server` for [`Pki::server_files`]).

// Each including test crate uses its own part of this file.
#![allow(dead_code)]

use std::path::PathBuf;

use clb_state_server::tls::TlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A test CA with a server and a client certificate it signed. The files in [`Pki::dir`] are
/// `ca.pem`, `server.pem`, `server.key`, `client.pem` and `client.key`.
pub struct Pki {
    /// The directory of the files (unique per process, package and `name`).
    pub dir: PathBuf,
    /// The CA certificate (PEM).
    pub ca: String,
    /// The server certificate for `localhost` and 127.0.0.1 (PEM).
    pub server_cert: String,
    /// The server certificate's private key (PEM).
    pub server_key: String,
    /// The client certificate, CN `clb-test-client` (PEM).
    pub client_cert: String,
    /// The client certificate's private key (PEM).
    pub client_key: String,
}

impl Pki {
    /// A new CA named after `name`, its two certificates, and their files.
    pub fn new(name: &str) -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("clb test CA {name}"));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(names.clone()).unwrap();
            p.distinguished_name.push(DnType::CommonName, &names[0]);
            p.extended_key_usages = vec![usage];
            p.use_authority_key_identifier_extension = true;
            (
                p.signed_by(&key, &issuer).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(
            vec!["clb-test-client".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        // Test binaries of several packages run at the same time: the package is in the name.
        let dir = std::env::temp_dir().join(format!(
            "clb-tls-{}-{}-{name}",
            env!("CARGO_PKG_NAME"),
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Self {
            dir,
            ca: ca_cert.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
        };
        for (file, pem) in [
            ("ca.pem", &pki.ca),
            ("server.pem", &pki.server_cert),
            ("server.key", &pki.server_key),
            ("client.pem", &pki.client_cert),
            ("client.key", &pki.client_key),
        ] {
            std::fs::write(pki.dir.join(file), pem).unwrap();
        }
        pki
    }

    /// The path of `file` in the directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// [`Pki::path`] as a string (for command-line flags).
    pub fn path_str(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    /// Writes `content` to `file` in the directory and returns its path.
    pub fn write(&self, file: &str, content: &str) -> PathBuf {
        let p = self.path(file);
        std::fs::write(&p, content).unwrap();
        p
    }

    /// The state server's files: its certificate and key, and with `mutual` the CA as client CA.
    pub fn server_files(&self, mutual: bool) -> TlsFiles {
        TlsFiles {
            cert: self.path("server.pem"),
            key: self.path("server.key"),
            client_ca: mutual.then(|| self.path("ca.pem")),
        }
    }

    /// The client certificate and key (PEM bytes), as a TLS identity.
    pub fn client_identity(&self) -> (Vec<u8>, Vec<u8>) {
        (
            self.client_cert.clone().into_bytes(),
            self.client_key.clone().into_bytes(),
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
