//! The token file of a server authorized by an operator (`agentloop mcp login`): the
//! client it was authorized as, and its tokens, which the gateway refreshes and writes
//! back (an authorization server may rotate the refresh token).
//!
//! The file is the secret: it is written with mode 0600, through a temporary file in the
//! same folder and a rename, so a reader never sees half of it and a crash never leaves
//! it empty. One gateway process uses one file: two processes refreshing the same
//! rotating refresh token would each invalidate the other's.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rmcp::transport::auth::{AuthError, CredentialStore, StoredCredentials};
use serde::{Deserialize, Serialize};

/// Largest token file read, in bytes.
const MAX_FILE_BYTES: u64 = 256 * 1024;
/// The format's version: readers refuse others.
const VERSION: u32 = 1;

/// Who the gateway is at the authorization server: fixed at login.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Client {
    pub(crate) client_id: String,
    /// A confidential client's secret (pre-registered, or issued by registration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_secret: Option<String>,
    /// The redirect URI the code was sent to, which a refresh must not change.
    pub(crate) redirect_uri: String,
}

#[derive(Serialize, Deserialize)]
struct Document {
    version: u32,
    client: Client,
    credentials: StoredCredentials,
}

/// rmcp's credential store over the token file.
#[derive(Clone)]
pub(crate) struct TokenFile {
    path: PathBuf,
    client: Arc<Client>,
    /// What was last read or written, so a token's age is known without a read.
    last: Arc<Mutex<Option<StoredCredentials>>>,
}

impl TokenFile {
    /// For login: the client is set before the first save.
    pub(crate) fn create(path: PathBuf, client: Client) -> TokenFile {
        TokenFile {
            path,
            client: Arc::new(client),
            last: Arc::new(Mutex::new(None)),
        }
    }

    /// For the gateway: the file a login wrote.
    pub(crate) fn open(path: PathBuf) -> Result<(TokenFile, Client), AuthError> {
        let document = read(&path)?;
        let file = TokenFile {
            path,
            client: Arc::new(document.client.clone()),
            last: Arc::new(Mutex::new(Some(document.credentials))),
        };
        Ok((file, document.client))
    }

    /// The credentials last read or written.
    pub(crate) fn last(&self) -> Option<StoredCredentials> {
        lock(&self.last).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the value is whole.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn failed(path: &Path, what: &str, reason: impl std::fmt::Display) -> AuthError {
    AuthError::InternalError(format!(
        "the token file {}: {what}: {reason}",
        path.display()
    ))
}

fn read(path: &Path) -> Result<Document, AuthError> {
    let file = std::fs::File::open(path).map_err(|e| failed(path, "cannot read it", e))?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
        &mut text,
    )
    .map_err(|e| failed(path, "cannot read it", e))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(failed(
            path,
            "too large",
            format!("over {MAX_FILE_BYTES} bytes"),
        ));
    }
    // serde's message names the field, never a value.
    let document: Document =
        serde_json::from_str(&text).map_err(|e| failed(path, "not a token file", e))?;
    if document.version != VERSION {
        return Err(failed(
            path,
            "written by another version",
            format!("version {}", document.version),
        ));
    }
    Ok(document)
}

fn write(path: &Path, document: &Document) -> Result<(), AuthError> {
    let text = serde_json::to_vec_pretty(document).map_err(|e| failed(path, "cannot encode", e))?;
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temporary = tempfile_in(folder, path)?;
    temporary
        .1
        .write_all(&text)
        .and_then(|()| temporary.1.sync_all())
        .map_err(|e| failed(path, "cannot write it", e))?;
    std::fs::rename(&temporary.0, path).map_err(|e| failed(path, "cannot replace it", e))?;
    Ok(())
}

/// A new file beside `path`, readable by its owner only.
fn tempfile_in(folder: &Path, path: &Path) -> Result<(PathBuf, std::fs::File), AuthError> {
    let name = format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("token"),
        uuid::Uuid::new_v4().simple()
    );
    let temporary = folder.join(name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options
        .open(&temporary)
        .map_err(|e| failed(path, "cannot create it", e))?;
    Ok((temporary, file))
}

#[async_trait::async_trait]
impl CredentialStore for TokenFile {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        Ok(self.last())
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let path = self.path.clone();
        let document = Document {
            version: VERSION,
            client: Client::clone(&self.client),
            credentials: credentials.clone(),
        };
        tokio::task::spawn_blocking(move || write(&path, &document))
            .await
            .map_err(|e| failed(&self.path, "cannot write it", e))??;
        *lock(&self.last) = Some(credentials);
        Ok(())
    }

    async fn clear(&self) -> Result<(), AuthError> {
        *lock(&self.last) = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(client_id: &str) -> StoredCredentials {
        StoredCredentials::new(client_id.to_owned(), None, vec!["a".to_owned()], Some(7))
    }

    #[tokio::test]
    async fn what_login_saves_the_gateway_opens_and_a_refresh_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crm.json");
        let client = Client {
            client_id: "c1".to_owned(),
            client_secret: Some("s3cret".to_owned()),
            redirect_uri: "http://127.0.0.1:1/callback".to_owned(),
        };
        let login = TokenFile::create(path.clone(), client);
        login.save(credentials("c1")).await.unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (gateway, client) = TokenFile::open(path.clone()).unwrap();
        assert_eq!(client.client_secret.as_deref(), Some("s3cret"));
        assert_eq!(
            gateway.load().await.unwrap().unwrap().token_received_at,
            Some(7)
        );
        let mut refreshed = credentials("c1");
        refreshed.token_received_at = Some(9);
        gateway.save(refreshed).await.unwrap();
        assert_eq!(
            TokenFile::open(path)
                .unwrap()
                .0
                .last()
                .unwrap()
                .token_received_at,
            Some(9)
        );
        // Only the file itself is left: no temporary beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_file_that_is_not_a_token_file_is_refused_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, "{\"version\": 1, \"secret\": \"s3cret\"}").unwrap();
        let error = TokenFile::open(path.clone()).err().unwrap().to_string();
        assert!(
            error.contains("not a token file") && !error.contains("s3cret"),
            "{error}"
        );
        std::fs::write(&path, "x".repeat(300 * 1024)).unwrap();
        let error = TokenFile::open(path).err().unwrap().to_string();
        assert!(error.contains("too large"), "{error}");
    }
}
