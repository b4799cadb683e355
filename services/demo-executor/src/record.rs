//! The transfer tool's own durable record of applied effects.
//!
//! This is the heart of the executor contract. The executor owns the data, so *it* is
//! the one that knows whether the change for an effect key was applied; the
//! orchestrator's effect ledger only knows what it sent. The record is an append-only
//! file of JSON lines, one [`AppliedTransfer`] per line, and two rules make it the
//! ground truth:
//!
//! 1. **Recorded before acknowledged.** A transfer is applied by appending its line and
//!    `fsync`ing the file; only then is the reply sent. So a key that is *not* in the
//!    record was never acknowledged, and `Reconcile` may answer NOT_APPLIED.
//! 2. **Check and append under one lock.** Looking the key up and appending it happen
//!    under the same mutex, so two concurrent requests with one key apply it once.
//!
//! A crash can leave a torn last line (written, not `fsync`ed, never acknowledged).
//! It is dropped with a warning and cut off the file, so the next append starts on a
//! clean line. A bad line *before* the last one is real damage and stops the start.
//!
//! The same record answers `Verify` (see [`crate::verifier`]): a transfer the ledger
//! says was committed, or a receipt a cited result carries, is confirmed only if its
//! line is here.
//!
//! It is *not* a database: the whole record is held in memory, so it is bounded by
//! [`MAX_RECORDS`] entries of at most [`MAX_RECORD_LINE_BYTES`] each.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::DemoError;

/// File name of the record inside the data directory.
pub const RECORD_FILE_NAME: &str = "transfers.jsonl";

/// Longest line the record accepts, newline included. Entries are far smaller (every
/// field is bounded by the request checks); a longer line means damage.
pub const MAX_RECORD_LINE_BYTES: usize = 16 * 1024;

/// Most transfers the record holds; beyond it, new transfers are refused (with a
/// structured error) rather than letting memory grow without bound.
pub const MAX_RECORDS: usize = 1_000_000;

/// One applied transfer, as stored on one line of the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppliedTransfer {
    /// The effect key the transfer was applied under; unique in the record.
    pub effect_key: String,
    /// The invocation that asked for it (for audit only).
    pub invocation_id: String,
    /// The call that asked for it (for audit only).
    pub call_id: String,
    /// The dispatch attempt that applied it.
    pub attempt: u32,
    /// Source account.
    pub from: String,
    /// Destination account.
    pub to: String,
    /// Amount moved, in minor units.
    pub amount: u64,
    /// The executor's identifier of the change, returned as the call's receipt.
    pub receipt: String,
    /// The call's output as JSON text, returned again on a duplicate and by Reconcile.
    pub output_json: String,
}

/// What parsing the bytes of a record file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// The entries of every complete line, in file order.
    pub(crate) entries: Vec<AppliedTransfer>,
    /// Length in bytes of the complete lines; anything after it is a torn tail.
    pub(crate) valid_len: u64,
    /// Length of the torn tail (0 when the file ends with a newline).
    pub(crate) torn_bytes: u64,
}

/// Parses the bytes of a record file (pure, so it is easy to test).
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed, DemoError> {
    let corrupt = |line: usize, reason: String| DemoError::CorruptRecord {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut entries = Vec::new();
    let mut offset = 0usize;
    let mut line_no = 0usize;
    while offset < bytes.len() {
        line_no += 1;
        let rest = bytes.get(offset..).unwrap_or_default();
        let Some(newline) = rest.iter().position(|b| *b == b'\n') else {
            // No newline: the last append was cut short by a crash. It was never
            // fsynced, so never acknowledged: forgetting it is correct.
            break;
        };
        if newline + 1 > MAX_RECORD_LINE_BYTES {
            return Err(corrupt(
                line_no,
                format!("line longer than {MAX_RECORD_LINE_BYTES} bytes"),
            ));
        }
        let line = rest.get(..newline).unwrap_or_default();
        let entry: AppliedTransfer =
            serde_json::from_slice(line).map_err(|e| corrupt(line_no, e.to_string()))?;
        entries.push(entry);
        offset += newline + 1;
    }
    if entries.len() > MAX_RECORDS {
        return Err(corrupt(line_no, format!("more than {MAX_RECORDS} entries")));
    }
    Ok(Parsed {
        entries,
        valid_len: offset as u64,
        torn_bytes: (bytes.len() - offset) as u64,
    })
}

/// Reads the applied transfers of the record in `data_dir` without opening it for
/// writing (a torn tail is skipped, not cut off). For tests and chaos checks that
/// compare what clients were told with the ground truth.
///
/// # Errors
///
/// [`DemoError::Io`] if the file cannot be read (a missing file is an empty record),
/// [`DemoError::CorruptRecord`] if a complete line is damaged.
pub fn read_record(data_dir: &Path) -> Result<Vec<AppliedTransfer>, DemoError> {
    let path = data_dir.join(RECORD_FILE_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(parse(&path, &bytes)?.entries),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(DemoError::Io {
            action: "cannot read the effect record",
            path,
            source,
        }),
    }
}

/// What [`EffectRecord::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The transfer was new and is now recorded durably.
    New(AppliedTransfer),
    /// The effect key was already recorded; this is the original entry, unchanged.
    Existing(AppliedTransfer),
}

/// The open record: the file, positioned for appends, and its entries by effect key.
#[derive(Debug)]
pub(crate) struct EffectRecord {
    path: PathBuf,
    file: File,
    /// Bytes of complete lines in the file; the rollback point if an append fails.
    len: u64,
    by_key: HashMap<String, AppliedTransfer>,
    /// Effect key of each receipt, so a verifier can confirm a receipt a result cites.
    by_receipt: HashMap<String, String>,
    /// Set when a failed append could not be rolled back: the file may hold a line we
    /// never acknowledged, so neither "applied" nor "not applied" can be promised.
    in_doubt: Option<String>,
}

impl EffectRecord {
    /// Opens (creating if needed) the record in `data_dir`, loads it and cuts off a
    /// torn last line.
    pub(crate) fn open(data_dir: &Path) -> Result<EffectRecord, DemoError> {
        std::fs::create_dir_all(data_dir).map_err(|source| DemoError::Io {
            action: "cannot create the data directory",
            path: data_dir.to_owned(),
            source,
        })?;
        let path = data_dir.join(RECORD_FILE_NAME);
        let io = |action: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| DemoError::Io {
                action,
                path,
                source,
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io("cannot open the effect record", &path))?;
        let bytes = std::fs::read(&path).map_err(io("cannot read the effect record", &path))?;
        let parsed = parse(&path, &bytes)?;
        if parsed.torn_bytes > 0 {
            tracing::warn!(
                path = %path.display(),
                torn_bytes = parsed.torn_bytes,
                "ignoring a torn last line of the effect record (a crash during an unacknowledged append)"
            );
            file.set_len(parsed.valid_len)
                .and_then(|()| file.sync_all())
                .map_err(io("cannot cut the torn tail of the effect record", &path))?;
        }
        let mut by_key = HashMap::with_capacity(parsed.entries.len());
        let mut by_receipt = HashMap::with_capacity(parsed.entries.len());
        for (index, entry) in parsed.entries.into_iter().enumerate() {
            let key = entry.effect_key.clone();
            let receipt = entry.receipt.clone();
            if by_key.insert(key.clone(), entry).is_some() {
                return Err(DemoError::CorruptRecord {
                    path,
                    line: index + 1,
                    reason: format!("effect key {key:?} recorded twice"),
                });
            }
            // Receipts are numbered by this record, so one given twice is damage too: a
            // verifier could not tell which transfer it names.
            if let Some(earlier) = by_receipt.insert(receipt.clone(), key.clone()) {
                return Err(DemoError::CorruptRecord {
                    path,
                    line: index + 1,
                    reason: format!(
                        "receipt {receipt:?} recorded for effect keys {earlier:?} and {key:?}"
                    ),
                });
            }
        }
        Ok(EffectRecord {
            path,
            file,
            len: parsed.valid_len,
            by_key,
            by_receipt,
            in_doubt: None,
        })
    }

    /// The recorded transfer for `effect_key`, or why the record cannot tell.
    pub(crate) fn lookup(&self, effect_key: &str) -> Result<Option<&AppliedTransfer>, String> {
        match &self.in_doubt {
            Some(reason) => Err(reason.clone()),
            None => Ok(self.by_key.get(effect_key)),
        }
    }

    /// The recorded transfer with `receipt`, or why the record cannot tell.
    pub(crate) fn lookup_receipt(&self, receipt: &str) -> Result<Option<&AppliedTransfer>, String> {
        match &self.in_doubt {
            Some(reason) => Err(reason.clone()),
            None => Ok(self
                .by_receipt
                .get(receipt)
                .and_then(|key| self.by_key.get(key))),
        }
    }

    /// Number of recorded transfers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Applies `make(sequence)` under `effect_key` unless the key is already recorded:
    /// the dedupe check and the durable append are one step, done by the caller under
    /// the record's mutex. `sequence` is the 1-based number of the new transfer.
    pub(crate) fn apply(
        &mut self,
        effect_key: &str,
        make: impl FnOnce(usize) -> AppliedTransfer,
    ) -> Result<Applied, DemoError> {
        if let Some(reason) = &self.in_doubt {
            return Err(DemoError::RecordUnavailable(reason.clone()));
        }
        if let Some(existing) = self.by_key.get(effect_key) {
            return Ok(Applied::Existing(existing.clone()));
        }
        if self.by_key.len() >= MAX_RECORDS {
            return Err(DemoError::RecordUnavailable(format!(
                "the record is full ({MAX_RECORDS} transfers)"
            )));
        }
        let entry = make(self.by_key.len() + 1);
        let mut line = serde_json::to_vec(&entry)
            .map_err(|e| DemoError::RecordUnavailable(format!("cannot encode the entry: {e}")))?;
        line.push(b'\n');
        if line.len() > MAX_RECORD_LINE_BYTES {
            return Err(DemoError::RecordUnavailable(format!(
                "entry of {} bytes exceeds the line limit",
                line.len()
            )));
        }
        // One write of the whole line, then fsync: only a durable line counts.
        if let Err(error) = self
            .file
            .write_all(&line)
            .and_then(|()| self.file.sync_data())
        {
            return Err(self.roll_back(&error));
        }
        self.len += line.len() as u64;
        // The maps change only after the line is durable, so memory never claims more
        // than the file does.
        self.by_receipt
            .insert(entry.receipt.clone(), entry.effect_key.clone());
        self.by_key.insert(entry.effect_key.clone(), entry.clone());
        Ok(Applied::New(entry))
    }

    /// Undoes a failed append by cutting the file back to its last complete line. If
    /// even that fails, the record is in doubt until the executor restarts (the loader
    /// then decides from what actually reached the disk).
    fn roll_back(&mut self, error: &std::io::Error) -> DemoError {
        match self
            .file
            .set_len(self.len)
            .and_then(|()| self.file.sync_all())
        {
            Ok(()) => DemoError::RecordUnavailable(format!(
                "cannot append to {}: {error}; nothing was applied",
                self.path.display()
            )),
            Err(rollback) => {
                let reason = format!(
                    "append to {} failed ({error}) and could not be rolled back ({rollback}); restart the executor",
                    self.path.display()
                );
                tracing::error!(%reason, "effect record in doubt");
                self.in_doubt = Some(reason.clone());
                DemoError::RecordUnavailable(reason)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn entry(key: &str, n: usize) -> AppliedTransfer {
        AppliedTransfer {
            effect_key: key.to_owned(),
            invocation_id: "inv".into(),
            call_id: "c1".into(),
            attempt: 1,
            from: "a".into(),
            to: "b".into(),
            amount: 5,
            receipt: format!("txn-{n:08}"),
            output_json: "{}".into(),
        }
    }

    #[test]
    fn parse_keeps_complete_lines_and_reports_a_torn_tail() {
        let mut bytes = serde_json::to_vec(&entry("k1", 1)).unwrap();
        bytes.push(b'\n');
        let good = bytes.len() as u64;
        bytes.extend_from_slice(br#"{"effect_key":"k2","invoc"#);
        let parsed = parse(Path::new("r"), &bytes).unwrap();
        assert_eq!(parsed.entries, vec![entry("k1", 1)]);
        assert_eq!(parsed.valid_len, good);
        assert_eq!(parsed.torn_bytes, 25);
    }

    #[test]
    fn parse_refuses_a_damaged_line_before_the_last() {
        let mut bytes = b"not json\n".to_vec();
        bytes.extend(serde_json::to_vec(&entry("k1", 1)).unwrap());
        bytes.push(b'\n');
        let error = parse(Path::new("r"), &bytes).unwrap_err();
        assert!(
            matches!(error, DemoError::CorruptRecord { line: 1, .. }),
            "{error}"
        );
    }

    #[test]
    fn parse_refuses_an_overlong_line() {
        let mut bytes = vec![b' '; MAX_RECORD_LINE_BYTES + 1];
        bytes.push(b'\n');
        assert!(matches!(
            parse(Path::new("r"), &bytes),
            Err(DemoError::CorruptRecord { line: 1, .. })
        ));
    }

    #[test]
    fn apply_dedupes_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = EffectRecord::open(dir.path()).unwrap();
        let first = record.apply("k1", |n| entry("k1", n)).unwrap();
        assert_eq!(first, Applied::New(entry("k1", 1)));
        let again = record.apply("k1", |n| entry("k1", n + 100)).unwrap();
        assert_eq!(again, Applied::Existing(entry("k1", 1)));
        drop(record);
        let record = EffectRecord::open(dir.path()).unwrap();
        assert_eq!(record.lookup("k1").unwrap(), Some(&entry("k1", 1)));
        assert_eq!(
            record.lookup_receipt("txn-00000001").unwrap(),
            Some(&entry("k1", 1))
        );
        assert_eq!(record.lookup_receipt("txn-00000002").unwrap(), None);
        assert_eq!(record.len(), 1);
        assert_eq!(read_record(dir.path()).unwrap(), vec![entry("k1", 1)]);
    }

    #[test]
    fn a_receipt_given_twice_in_the_file_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = Vec::new();
        for key in ["k1", "k2"] {
            lines.extend(serde_json::to_vec(&entry(key, 1)).unwrap());
            lines.push(b'\n');
        }
        std::fs::write(dir.path().join(RECORD_FILE_NAME), lines).unwrap();
        assert!(matches!(
            EffectRecord::open(dir.path()),
            Err(DemoError::CorruptRecord { line: 2, .. })
        ));
    }

    #[test]
    fn duplicate_keys_in_the_file_are_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let mut line = serde_json::to_vec(&entry("k1", 1)).unwrap();
        line.push(b'\n');
        let twice = [line.clone(), line].concat();
        std::fs::write(dir.path().join(RECORD_FILE_NAME), twice).unwrap();
        assert!(matches!(
            EffectRecord::open(dir.path()),
            Err(DemoError::CorruptRecord { line: 2, .. })
        ));
    }
}
