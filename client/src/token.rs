//! Call credentials: every call carries `authorization: Bearer <token>`, the token read from a file
//! (in a cluster, the projected ServiceAccount token with the audience `clb`). The file is checked
//! on every call (one `stat`) and re-read when it changed (the kubelet rotates projected tokens by
//! replacing the file) or at least every [`REREAD_EVERY`], so a rotated token is used without a
//! restart. A file that cannot be read keeps the last token; with none yet, the call fails locally
//! with `UNAUTHENTICATED` naming the file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use clb_telemetry::TraceContextInterceptor;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;

/// Where the deploy/ manifests project the ServiceAccount token (audience `clb`); used when
/// `--token-file` is not given and this file exists.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/clb/token";

/// The token file is re-read at least this often even if it looks unchanged.
pub const REREAD_EVERY: Duration = Duration::from_secs(60);

/// `--token-file` if given, else [`DEFAULT_TOKEN_FILE`] if it exists (in a pod of deploy/), else
/// none (no token is sent: a server on loopback without authentication).
pub fn token_file_or_default(flag: Option<&Path>) -> Option<PathBuf> {
    match flag {
        Some(p) => Some(p.to_owned()),
        None => {
            let default = Path::new(DEFAULT_TOKEN_FILE);
            default.exists().then(|| default.to_owned())
        }
    }
}

/// What identifies a version of the file: a replaced file differs in one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    inode: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Stamp {
            modified: meta.modified().ok(),
            len: meta.len(),
            #[cfg(unix)]
            inode: std::os::unix::fs::MetadataExt::ino(meta),
        }
    }
}

#[derive(Debug, Default)]
struct Cached {
    header: Option<AsciiMetadataValue>,
    stamp: Option<Stamp>,
    read_at: Option<Instant>,
}

/// A bearer token kept in a file (cheap to clone; clones share the cached token).
#[derive(Debug, Clone)]
pub struct TokenFile {
    path: PathBuf,
    cached: Arc<Mutex<Cached>>,
}

impl TokenFile {
    /// The token in `path` (read at the first call).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cached: Arc::default(),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> Result<AsciiMetadataValue, String> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("cannot read the token file {}: {e}", self.path.display()))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(format!("the token file {} is empty", self.path.display()));
        }
        MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
            format!(
                "the token file {} holds characters a token cannot have",
                self.path.display()
            )
        })
    }

    /// The `authorization` metadata value (`Bearer <token>`), re-read if the file changed.
    pub fn header(&self) -> Result<AsciiMetadataValue, tonic::Status> {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let stamp = std::fs::metadata(&self.path).ok().map(|m| Stamp::of(&m));
        let stale = cached.header.is_none()
            || stamp.is_none()
            || stamp != cached.stamp
            || cached.read_at.is_none_or(|t| t.elapsed() >= REREAD_EVERY);
        if stale {
            match self.read() {
                Ok(header) => {
                    cached.header = Some(header);
                    cached.stamp = stamp;
                    cached.read_at = Some(Instant::now());
                }
                Err(e) if cached.header.is_some() => {
                    tracing::warn!(error = %e, "keeping the last token");
                }
                Err(e) => return Err(tonic::Status::unauthenticated(e)),
            }
        }
        Ok(cached.header.clone().expect("set above"))
    }
}

/// What every call of a client adds: the caller's trace context (`traceparent`) and, with a token
/// file, `authorization: Bearer <token>`.
#[derive(Debug, Clone, Default)]
pub struct CallInterceptor {
    token: Option<TokenFile>,
}

impl CallInterceptor {
    /// Sends the token of `token` (none: no `authorization`).
    pub fn new(token: Option<TokenFile>) -> Self {
        Self { token }
    }

    /// The token file, if any.
    pub fn token(&self) -> Option<&TokenFile> {
        self.token.as_ref()
    }
}

impl Interceptor for CallInterceptor {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let mut req = TraceContextInterceptor.call(req)?;
        if let Some(token) = &self.token {
            req.metadata_mut().insert("authorization", token.header()?);
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(t: &TokenFile) -> String {
        t.header().unwrap().to_str().unwrap().to_owned()
    }

    #[test]
    fn a_replaced_token_file_is_read_again() {
        let dir = std::env::temp_dir().join(format!("clb-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").unwrap();
        let t = TokenFile::new(&path);
        assert_eq!(bearer(&t), "Bearer first");
        assert_eq!(bearer(&t.clone()), "Bearer first");
        // The kubelet's way: write a new file, rename it over the old one.
        let next = dir.join("token.new");
        std::fs::write(&next, "second-token").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(bearer(&t), "Bearer second-token");
        // Gone: the last token is kept.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(bearer(&t), "Bearer second-token");
        let missing = TokenFile::new(dir.join("nope"));
        let e = missing.header().unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("nope"), "{}", e.message());
        std::fs::write(&path, " \n").unwrap();
        let empty = TokenFile::new(&path);
        assert!(empty.header().unwrap_err().message().contains("is empty"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_interceptor_adds_the_token() {
        let mut plain = CallInterceptor::default();
        let req = plain.call(tonic::Request::new(())).unwrap();
        assert!(req.metadata().get("authorization").is_none());
        let dir = std::env::temp_dir().join(format!("clb-token-i-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t"), "abc").unwrap();
        let mut with = CallInterceptor::new(Some(TokenFile::new(dir.join("t"))));
        let req = with.call(tonic::Request::new(())).unwrap();
        assert_eq!(req.metadata().get("authorization").unwrap(), "Bearer abc");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
