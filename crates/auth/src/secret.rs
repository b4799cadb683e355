//! Reading secret, token and JWKS files: bounded, and errors that name the file only.

use std::io::Read;
use std::path::Path;

use crate::{AuthConfigError, FileProblem};

/// Largest secret or token file, in bytes. A secret is tens of bytes: a larger file is
/// the wrong file (a key bundle, a log), and reading it whole would be the only cost.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Reads a token or secret file: the text trimmed of surrounding whitespace (the newline
/// editors and `echo` add), at most 64 KiB, and not empty.
///
/// The error names the path, never the content.
pub fn read_secret_file(path: &Path) -> Result<String, AuthConfigError> {
    read_secret("secret file", path)
}

/// [`read_secret_file`], with the configuration key the error should name.
pub(crate) fn read_secret(key: &str, path: &Path) -> Result<String, AuthConfigError> {
    let bytes = read_bounded(key, path, MAX_SECRET_FILE_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|_| file_error(key, path, FileProblem::NotUtf8))?;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(file_error(key, path, FileProblem::Empty));
    }
    Ok(trimmed.to_owned())
}

/// [`read_secret`], refusing a secret shorter than `min_bytes`.
pub(crate) fn read_secret_at_least(
    key: &str,
    path: &Path,
    min_bytes: usize,
) -> Result<String, AuthConfigError> {
    let secret = read_secret(key, path)?;
    if secret.len() < min_bytes {
        return Err(file_error(key, path, FileProblem::TooShort(min_bytes)));
    }
    Ok(secret)
}

/// The bytes of `path`, refusing a file larger than `limit` bytes. The bound holds even if
/// the file grows between the size check and the read.
pub(crate) fn read_bounded(key: &str, path: &Path, limit: u64) -> Result<Vec<u8>, AuthConfigError> {
    let unreadable = |e| file_error(key, path, FileProblem::Unreadable(e));
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > limit {
        return Err(file_error(key, path, FileProblem::TooLarge(limit)));
    }
    Ok(bytes)
}

pub(crate) fn file_error(key: &str, path: &Path, problem: FileProblem) -> AuthConfigError {
    AuthConfigError::File {
        key: key.to_owned(),
        path: path.to_owned(),
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");

        std::fs::write(&path, "  hunter2-secret\n").unwrap();
        assert_eq!(read_secret_file(&path).unwrap(), "hunter2-secret");

        std::fs::write(&path, " \n\t").unwrap();
        let error = read_secret_file(&path).unwrap_err();
        assert!(matches!(
            error,
            AuthConfigError::File {
                problem: FileProblem::Empty,
                ..
            }
        ));
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );

        std::fs::write(&path, vec![b'a'; 64 * 1024 + 1]).unwrap();
        let error = read_secret_file(&path).unwrap_err();
        assert!(matches!(
            error,
            AuthConfigError::File {
                problem: FileProblem::TooLarge(_),
                ..
            }
        ));
        std::fs::write(&path, vec![b'a'; 64 * 1024]).unwrap();
        assert_eq!(read_secret_file(&path).unwrap().len(), 64 * 1024);

        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let error = read_secret_file(&path).unwrap_err();
        assert!(matches!(
            error,
            AuthConfigError::File {
                problem: FileProblem::NotUtf8,
                ..
            }
        ));

        let missing = dir.path().join("missing");
        let error = read_secret_file(&missing).unwrap_err();
        assert!(matches!(
            error,
            AuthConfigError::File {
                problem: FileProblem::Unreadable(_),
                ..
            }
        ));
        assert!(error.to_string().contains("missing"), "{error}");
    }

    #[test]
    fn short_secret_message_names_key_and_path_not_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "tooshort-SECRETVALUE").unwrap();
        let error = read_secret_at_least("auth.hs256_secret_file", &path, 32).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("auth.hs256_secret_file "), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(!message.contains("SECRETVALUE"), "{message}");
    }
}
