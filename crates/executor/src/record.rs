//! The durable record of applied writes: what makes effect keys hold across retries,
//! concurrent requests and restarts.
//!
//! The executor owns the data, so *it* is the one that knows whether the change for an
//! effect key was applied; the orchestrator's effect ledger only knows what it sent.
//! The record is an append-only file of JSON lines ([`RECORD_FILE_NAME`] in a data
//! directory), one [`AppliedEffect`] per line, keyed by (tool, effect key). Two rules
//! make it the ground truth:
//!
//! 1. **Recorded before acknowledged.** A write's result is appended as one line and
//!    `fsync`ed before the reply is sent. So a key that is *not* in the record was never
//!    acknowledged, and `Reconcile` may answer NOT_APPLIED.
//! 2. **Check and append under one lock.** [`Record::append`] looks the key up and
//!    appends under the same mutex, so the record never holds a key twice; the executor
//!    also holds a per-key lock around the tool's call, so two concurrent requests with
//!    one key call the tool once.
//!
//! A crash can leave a torn last line (written, not `fsync`ed, never acknowledged). It is
//! dropped with a warning and cut off the file at [`Record::open`], so the next append
//! starts on a clean line. A bad line *before* the last one is real damage and stops the
//! start: starting anyway could forget an applied effect.
//!
//! It is *not* a database: every entry is held in memory, so the record is bounded by
//! [`MAX_RECORDS`] entries of at most [`MAX_RECORD_LINE_BYTES`] each. One process opens a
//! data directory at a time; two executors over one directory would not see each
//! other's appends.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// File name of the record inside its data directory.
pub const RECORD_FILE_NAME: &str = "effects.jsonl";

/// Longest line the record accepts, newline included. An entry holds at most
/// [`MAX_ARGUMENTS_BYTES`](crate::MAX_ARGUMENTS_BYTES) of arguments and
/// [`MAX_RECORDED_OUTPUT_BYTES`](crate::MAX_RECORDED_OUTPUT_BYTES) of output, both
/// escaped as JSON strings; a longer line means damage.
pub const MAX_RECORD_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Most entries the record holds; beyond it, new writes are refused rather than letting
/// memory grow without bound.
pub const MAX_RECORDS: usize = 1_000_000;

/// One applied write, as stored on one line of the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppliedEffect {
    /// The tool that applied it.
    pub tool: String,
    /// The effect key it was applied under; unique per tool in the record.
    pub effect_key: String,
    /// The invocation that asked for it (for audit, and for verifiers).
    pub invocation_id: String,
    /// The call that asked for it (for audit).
    pub call_id: String,
    /// The dispatch attempt that applied it.
    pub attempt: u32,
    /// The call's arguments as received (JSON text). A later request with the same key
    /// but other arguments is a conflict, not a duplicate.
    pub arguments_json: String,
    /// The tool's identifier of the change, returned as the call's receipt; empty when
    /// the tool gives none. Unique per tool when not empty.
    pub receipt: String,
    /// The call's output as JSON text, returned again on a duplicate and by Reconcile.
    pub output_json: String,
}

/// Why the record cannot be opened, read or appended to. Exhaustive, so that a new kind
/// fails to compile where callers map it.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The data directory or the record file could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (e.g. "cannot open the effect record").
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A complete line of the record is not a valid entry, or repeats a key or a receipt.
    #[error("effect record {} is corrupt at line {line}: {reason}", path.display())]
    Corrupt {
        /// The record file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The record holds [`MAX_RECORDS`] entries; nothing more is applied.
    #[error("the effect record is full ({MAX_RECORDS} entries)")]
    Full,
    /// The entry's line would exceed [`MAX_RECORD_LINE_BYTES`]; nothing was appended.
    #[error("an entry of {bytes} bytes exceeds the record's line limit")]
    EntryTooLarge {
        /// Its encoded size.
        bytes: usize,
    },
    /// Another entry of the same tool already has this receipt: a receipt must name one
    /// change. Nothing was appended.
    #[error("tool {tool:?} already recorded receipt {receipt:?} for another effect key")]
    ReceiptTaken {
        /// The tool.
        tool: String,
        /// The receipt.
        receipt: String,
    },
    /// The append failed and was rolled back: nothing was applied.
    #[error("cannot append to the effect record: {0}; nothing was applied")]
    AppendFailed(String),
    /// A failed append could not be rolled back (or a thread panicked mid-append): the
    /// file may hold a line that was never acknowledged, so the record can promise
    /// neither "applied" nor "not applied" until the executor restarts.
    #[error("the effect record is in doubt: {0}")]
    InDoubt(String),
}

/// What [`Record::append`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// The entry was new and is now recorded durably.
    New(AppliedEffect),
    /// Its (tool, effect key) was already recorded; this is the original entry.
    Existing(AppliedEffect),
}

/// The open record: cheap to clone (every clone is the same record).
#[derive(Clone)]
pub struct Record {
    inner: Arc<Mutex<State>>,
    path: Arc<Path>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("path", &self.path)
            .field("entries", &self.len())
            .finish()
    }
}

/// The file, positioned for appends, and its entries with their indexes.
#[derive(Debug)]
struct State {
    file: File,
    /// Bytes of complete lines in the file; the rollback point if an append fails.
    len: u64,
    /// Every entry, in file order.
    entries: Vec<AppliedEffect>,
    /// Tool -> effect key -> index into `entries`.
    by_key: HashMap<String, HashMap<String, usize>>,
    /// Tool -> receipt -> index into `entries`, for the receipts that are not empty.
    by_receipt: HashMap<String, HashMap<String, usize>>,
    /// Set when a failed append could not be rolled back.
    in_doubt: Option<String>,
}

impl State {
    fn index(&self, tool: &str, key: &str) -> Option<usize> {
        self.by_key.get(tool)?.get(key).copied()
    }

    fn receipt_index(&self, tool: &str, receipt: &str) -> Option<usize> {
        self.by_receipt.get(tool)?.get(receipt).copied()
    }

    /// Adds `entry` to the indexes; `Err` names what it repeats.
    fn insert(&mut self, entry: AppliedEffect) -> Result<(), String> {
        let index = self.entries.len();
        if self.index(&entry.tool, &entry.effect_key).is_some() {
            return Err(format!(
                "tool {:?} recorded effect key {:?} twice",
                entry.tool, entry.effect_key
            ));
        }
        if !entry.receipt.is_empty() && self.receipt_index(&entry.tool, &entry.receipt).is_some() {
            return Err(format!(
                "tool {:?} recorded receipt {:?} twice",
                entry.tool, entry.receipt
            ));
        }
        self.by_key
            .entry(entry.tool.clone())
            .or_default()
            .insert(entry.effect_key.clone(), index);
        if !entry.receipt.is_empty() {
            self.by_receipt
                .entry(entry.tool.clone())
                .or_default()
                .insert(entry.receipt.clone(), index);
        }
        self.entries.push(entry);
        Ok(())
    }
}

/// What parsing the bytes of a record file found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parsed {
    /// The entries of every complete line, in file order.
    entries: Vec<AppliedEffect>,
    /// Length in bytes of the complete lines; anything after it is a torn tail.
    valid_len: u64,
    /// Length of the torn tail (0 when the file ends with a newline).
    torn_bytes: u64,
}

/// Parses the bytes of a record file (pure, so it is easy to test).
fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed, RecordError> {
    let corrupt = |line: usize, reason: String| RecordError::Corrupt {
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
        if entries.len() == MAX_RECORDS {
            return Err(corrupt(line_no, format!("more than {MAX_RECORDS} entries")));
        }
        let line = rest.get(..newline).unwrap_or_default();
        let entry: AppliedEffect =
            serde_json::from_slice(line).map_err(|e| corrupt(line_no, e.to_string()))?;
        entries.push(entry);
        offset += newline + 1;
    }
    Ok(Parsed {
        entries,
        valid_len: offset as u64,
        torn_bytes: (bytes.len() - offset) as u64,
    })
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RecordError {
    let path = path.to_owned();
    move |source| RecordError::Io {
        action,
        path,
        source,
    }
}

impl Record {
    /// Opens (creating if needed) the record in `data_dir`, loads it and cuts off a torn
    /// last line.
    ///
    /// # Errors
    ///
    /// [`RecordError::Io`] when the directory or file cannot be created, read or cut;
    /// [`RecordError::Corrupt`] when a complete line is damaged or repeats a key or a
    /// receipt.
    pub fn open(data_dir: &Path) -> Result<Record, RecordError> {
        std::fs::create_dir_all(data_dir)
            .map_err(io_error("cannot create the data directory", data_dir))?;
        let path = data_dir.join(RECORD_FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io_error("cannot open the effect record", &path))?;
        // The file's directory entry must be durable too, or a crash right after the
        // first acknowledged append could lose the whole file.
        File::open(data_dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error("cannot sync the data directory", data_dir))?;
        let bytes =
            std::fs::read(&path).map_err(io_error("cannot read the effect record", &path))?;
        let parsed = parse(&path, &bytes)?;
        if parsed.torn_bytes > 0 {
            tracing::warn!(
                path = %path.display(),
                torn_bytes = parsed.torn_bytes,
                "ignoring a torn last line of the effect record (a crash during an unacknowledged append)"
            );
            file.set_len(parsed.valid_len)
                .and_then(|()| file.sync_all())
                .map_err(io_error(
                    "cannot cut the torn tail of the effect record",
                    &path,
                ))?;
        }
        let mut state = State {
            file,
            len: parsed.valid_len,
            entries: Vec::with_capacity(parsed.entries.len()),
            by_key: HashMap::new(),
            by_receipt: HashMap::new(),
            in_doubt: None,
        };
        for (index, entry) in parsed.entries.into_iter().enumerate() {
            state.insert(entry).map_err(|reason| RecordError::Corrupt {
                path: path.clone(),
                line: index + 1,
                reason,
            })?;
        }
        Ok(Record {
            inner: Arc::new(Mutex::new(state)),
            path: path.into(),
        })
    }

    /// Reads the entries of the record in `data_dir` without opening it for writing (a
    /// torn tail is skipped, not cut off): for tests and checks that compare what
    /// clients were told with the ground truth, while the executor runs.
    ///
    /// # Errors
    ///
    /// [`RecordError::Io`] if the file cannot be read (a missing file is an empty
    /// record), [`RecordError::Corrupt`] if a complete line is damaged.
    pub fn read(data_dir: &Path) -> Result<Vec<AppliedEffect>, RecordError> {
        let path = data_dir.join(RECORD_FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(parse(&path, &bytes)?.entries),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(RecordError::Io {
                action: "cannot read the effect record",
                path,
                source,
            }),
        }
    }

    /// The record file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The state, unless it is in doubt. A poisoned lock means a thread panicked while
    /// holding it, possibly mid-append: that is a record in doubt too.
    fn state(&self) -> Result<MutexGuard<'_, State>, RecordError> {
        let state = self.inner.lock().map_err(|_| {
            RecordError::InDoubt("a thread panicked while holding the record".to_owned())
        })?;
        match &state.in_doubt {
            Some(reason) => Err(RecordError::InDoubt(reason.clone())),
            None => Ok(state),
        }
    }

    /// The entry of `tool` under `effect_key`, or why the record cannot tell.
    ///
    /// # Errors
    ///
    /// [`RecordError::InDoubt`] after a failed rollback.
    pub fn get(&self, tool: &str, effect_key: &str) -> Result<Option<AppliedEffect>, RecordError> {
        let state = self.state()?;
        Ok(state
            .index(tool, effect_key)
            .and_then(|i| state.entries.get(i))
            .cloned())
    }

    /// The entry of `tool` with `receipt`, or why the record cannot tell: how a verifier
    /// confirms a receipt that a cited result carries.
    ///
    /// # Errors
    ///
    /// [`RecordError::InDoubt`] after a failed rollback.
    pub fn get_by_receipt(
        &self,
        tool: &str,
        receipt: &str,
    ) -> Result<Option<AppliedEffect>, RecordError> {
        let state = self.state()?;
        Ok(state
            .receipt_index(tool, receipt)
            .and_then(|i| state.entries.get(i))
            .cloned())
    }

    /// Every entry, in the order applied (a copy).
    ///
    /// # Errors
    ///
    /// [`RecordError::InDoubt`] after a failed rollback.
    pub fn entries(&self) -> Result<Vec<AppliedEffect>, RecordError> {
        Ok(self.state()?.entries.clone())
    }

    /// Number of entries (0 when the record is in doubt).
    pub fn len(&self) -> usize {
        self.state().map_or(0, |state| state.entries.len())
    }

    /// Whether the record has no entries (or is in doubt).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether another entry can be appended: checked before a write's tool is called,
    /// so a full record refuses the call before anything is applied.
    pub(crate) fn has_room(&self) -> Result<bool, RecordError> {
        Ok(self.state()?.entries.len() < MAX_RECORDS)
    }

    /// Appends `entry` durably unless its (tool, effect key) is already recorded: the
    /// dedupe check and the append are one step under the record's mutex. Blocks on
    /// `fsync`: async code calls it from `spawn_blocking` (the executor does).
    ///
    /// The executor appends every applied write itself; this is public for tests,
    /// imports and migrations.
    ///
    /// # Errors
    ///
    /// [`RecordError::Full`], [`RecordError::EntryTooLarge`] and
    /// [`RecordError::ReceiptTaken`] refuse the entry; [`RecordError::AppendFailed`]
    /// says the write failed and was rolled back; [`RecordError::InDoubt`] that it could
    /// not be. In every case the entry is not recorded.
    pub fn append(&self, entry: AppliedEffect) -> Result<Appended, RecordError> {
        let mut state = self.state()?;
        if let Some(existing) = state
            .index(&entry.tool, &entry.effect_key)
            .and_then(|i| state.entries.get(i))
        {
            return Ok(Appended::Existing(existing.clone()));
        }
        if state.entries.len() >= MAX_RECORDS {
            return Err(RecordError::Full);
        }
        if !entry.receipt.is_empty() && state.receipt_index(&entry.tool, &entry.receipt).is_some() {
            return Err(RecordError::ReceiptTaken {
                tool: entry.tool,
                receipt: entry.receipt,
            });
        }
        let mut line = serde_json::to_vec(&entry)
            .map_err(|e| RecordError::AppendFailed(format!("cannot encode the entry: {e}")))?;
        line.push(b'\n');
        if line.len() > MAX_RECORD_LINE_BYTES {
            return Err(RecordError::EntryTooLarge { bytes: line.len() });
        }
        // One write of the whole line, then fsync: only a durable line counts.
        if let Err(error) = state
            .file
            .write_all(&line)
            .and_then(|()| state.file.sync_data())
        {
            return Err(roll_back(&mut state, &self.path, &error));
        }
        state.len += line.len() as u64;
        // The indexes change only after the line is durable, so memory never claims more
        // than the file does. The checks above make `insert` succeed.
        let appended = entry.clone();
        if let Err(reason) = state.insert(entry) {
            state.in_doubt = Some(reason.clone());
            return Err(RecordError::InDoubt(reason));
        }
        Ok(Appended::New(appended))
    }
}

/// Undoes a failed append by cutting the file back to its last complete line. If even
/// that fails, the record is in doubt until the executor restarts (the loader then
/// decides from what actually reached the disk).
fn roll_back(state: &mut State, path: &Path, error: &std::io::Error) -> RecordError {
    match state
        .file
        .set_len(state.len)
        .and_then(|()| state.file.sync_all())
    {
        Ok(()) => RecordError::AppendFailed(format!("{}: {error}", path.display())),
        Err(rollback) => {
            let reason = format!(
                "append to {} failed ({error}) and could not be rolled back ({rollback}); restart the executor",
                path.display()
            );
            tracing::error!(%reason, "effect record in doubt");
            state.in_doubt = Some(reason.clone());
            RecordError::InDoubt(reason)
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn entry(tool: &str, key: &str, receipt: &str) -> AppliedEffect {
        AppliedEffect {
            tool: tool.to_owned(),
            effect_key: key.to_owned(),
            invocation_id: "inv".into(),
            call_id: "c1".into(),
            attempt: 1,
            arguments_json: r#"{"n":1}"#.into(),
            receipt: receipt.to_owned(),
            output_json: "{}".into(),
        }
    }

    fn line(entry: &AppliedEffect) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(entry).unwrap();
        bytes.push(b'\n');
        bytes
    }

    #[test]
    fn parse_keeps_complete_lines_and_reports_a_torn_tail() {
        let mut bytes = line(&entry("t", "k1", "r1"));
        let good = bytes.len() as u64;
        let tail = br#"{"tool":"t","effect_key":"k2","invoc"#;
        bytes.extend_from_slice(tail);
        let parsed = parse(Path::new("r"), &bytes).unwrap();
        assert_eq!(parsed.entries, vec![entry("t", "k1", "r1")]);
        assert_eq!(parsed.valid_len, good);
        assert_eq!(parsed.torn_bytes, tail.len() as u64);
    }

    #[test]
    fn parse_refuses_a_damaged_line_before_the_last() {
        let mut bytes = b"not json\n".to_vec();
        bytes.extend(line(&entry("t", "k1", "")));
        let error = parse(Path::new("r"), &bytes).unwrap_err();
        assert!(
            matches!(error, RecordError::Corrupt { line: 1, .. }),
            "{error}"
        );
    }

    #[test]
    fn parse_refuses_an_overlong_line() {
        let mut bytes = vec![b' '; MAX_RECORD_LINE_BYTES + 1];
        bytes.push(b'\n');
        assert!(matches!(
            parse(Path::new("r"), &bytes),
            Err(RecordError::Corrupt { line: 1, .. })
        ));
    }

    #[test]
    fn append_dedupes_per_tool_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record::open(dir.path()).unwrap();
        let first = record.append(entry("t", "k1", "r1")).unwrap();
        assert_eq!(first, Appended::New(entry("t", "k1", "r1")));
        let again = record.append(entry("t", "k1", "r2")).unwrap();
        assert_eq!(again, Appended::Existing(entry("t", "k1", "r1")));
        // The same key of another tool is another effect; receipts are per tool too.
        let other = record.append(entry("u", "k1", "r1")).unwrap();
        assert!(matches!(other, Appended::New(_)));
        assert!(matches!(
            record.append(entry("t", "k2", "r1")),
            Err(RecordError::ReceiptTaken { .. })
        ));
        drop(record);

        let record = Record::open(dir.path()).unwrap();
        assert_eq!(record.len(), 2);
        assert_eq!(record.get("t", "k1").unwrap(), Some(entry("t", "k1", "r1")));
        assert_eq!(record.get("t", "k2").unwrap(), None);
        assert_eq!(
            record.get_by_receipt("u", "r1").unwrap(),
            Some(entry("u", "k1", "r1"))
        );
        assert_eq!(record.get_by_receipt("u", "r9").unwrap(), None);
        assert_eq!(
            Record::read(dir.path()).unwrap(),
            vec![entry("t", "k1", "r1"), entry("u", "k1", "r1")]
        );
        assert_eq!(record.entries().unwrap(), Record::read(dir.path()).unwrap());
    }

    #[test]
    fn a_torn_tail_is_cut_off_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RECORD_FILE_NAME);
        let mut bytes = line(&entry("t", "k1", ""));
        let clean = bytes.len();
        bytes.extend_from_slice(b"{\"tool\":");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(Record::read(dir.path()).unwrap().len(), 1);
        let record = Record::open(dir.path()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap().len(), clean);
        record.append(entry("t", "k2", "")).unwrap();
        assert_eq!(Record::read(dir.path()).unwrap().len(), 2);
    }

    #[test]
    fn repeated_keys_or_receipts_in_the_file_are_corruption() {
        for (a, b) in [
            (entry("t", "k1", ""), entry("t", "k1", "")),
            (entry("t", "k1", "r1"), entry("t", "k2", "r1")),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(
                dir.path().join(RECORD_FILE_NAME),
                [line(&a), line(&b)].concat(),
            )
            .unwrap();
            assert!(matches!(
                Record::open(dir.path()),
                Err(RecordError::Corrupt { line: 2, .. })
            ));
        }
    }

    #[test]
    fn a_missing_record_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Record::read(dir.path()).unwrap().is_empty());
        assert!(Record::open(&dir.path().join("new")).unwrap().is_empty());
    }
}
