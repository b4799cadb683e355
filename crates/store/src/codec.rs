//! What every SQL backend does the same way: checking an append before it touches the
//! database, and turning stored columns back into records.
//!
//! Both backends keep counters and times in signed 64-bit columns and events, totals and
//! end records as serde JSON text, so the conversions (and their error messages) live here
//! once. Versions, seqs and epochs beyond `i64::MAX` are refused as malformed; times beyond
//! it are clamped (they are 292 million years away).

use agentloop_engine::{EndRecord, Event, EventBody, Totals, UnixMillis};
use uuid::Uuid;

use crate::{
    Append, Created, InvocationRecord, InvocationState, ListRequest, NewInvocation, StoreError,
    StoredEvent,
};

/// Most events one `events()` call returns, whatever the caller asks for.
pub(crate) const MAX_EVENTS_PAGE: u32 = 10_000;

/// Most events one append may carry (an engine commit has one or two).
pub(crate) const MAX_EVENTS_PER_APPEND: usize = 1_024;

/// How often `create` looks the idempotency key up again after losing an insert race.
pub(crate) const CREATE_ATTEMPTS: u32 = 3;

/// The columns of an invocation row, as both backends store them.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct InvocationColumns {
    pub(crate) invocation_id: String,
    pub(crate) tenant: String,
    /// The key as stored: [`scoped_key`].
    pub(crate) idempotency_key: Option<String>,
    pub(crate) request_digest: String,
    pub(crate) spec: String,
    pub(crate) state: String,
    pub(crate) version: i64,
    pub(crate) lease_epoch: i64,
    pub(crate) totals: String,
    pub(crate) end_record: Option<String>,
    pub(crate) cancel_requested_at: Option<i64>,
    pub(crate) cancel_reason: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
}

impl InvocationColumns {
    /// The record these columns hold, or `Corrupt` naming the invocation and the column.
    pub(crate) fn into_record(self) -> Result<InvocationRecord, StoreError> {
        let invocation_id = parse_id(&self.invocation_id)?;
        let corrupt = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Corrupt(format!("invocation {invocation_id}: {what}: {e}"))
        };
        let totals: Totals =
            serde_json::from_str(&self.totals).map_err(|e| corrupt("totals", &e))?;
        let end = self
            .end_record
            .map(|text| serde_json::from_str::<EndRecord>(&text))
            .transpose()
            .map_err(|e| corrupt("end record", &e))?;
        let idempotency_key = self
            .idempotency_key
            .map(|stored| {
                unscoped_key(&self.tenant, &stored)
                    .map(str::to_owned)
                    .ok_or_else(|| corrupt("idempotency key", &"not scoped to its tenant"))
            })
            .transpose()?;
        Ok(InvocationRecord {
            invocation_id,
            tenant: self.tenant,
            idempotency_key,
            request_digest: self.request_digest,
            spec: self.spec,
            state: parse_state(&self.state, invocation_id)?,
            version: stored_u64(self.version, "version", invocation_id)?,
            lease_epoch: stored_u64(self.lease_epoch, "lease_epoch", invocation_id)?,
            totals,
            end,
            cancel_requested_at: self
                .cancel_requested_at
                .map(|at| stored_u64(at, "cancel_requested_at", invocation_id).map(UnixMillis))
                .transpose()?,
            cancel_reason: self.cancel_reason.unwrap_or_default(),
            created_at: UnixMillis(stored_u64(self.created_at, "created_at", invocation_id)?),
            updated_at: UnixMillis(stored_u64(self.updated_at, "updated_at", invocation_id)?),
        })
    }
}

/// The columns of an event row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventColumns {
    pub(crate) seq: i64,
    pub(crate) committed_at: i64,
    pub(crate) body: String,
}

impl EventColumns {
    /// The stored event, or `Corrupt` naming the invocation and the seq.
    pub(crate) fn into_event(self, invocation_id: Uuid) -> Result<StoredEvent, StoreError> {
        let seq = stored_u64(self.seq, "seq", invocation_id)?;
        let committed_at = stored_u64(self.committed_at, "committed_at", invocation_id)?;
        let body: EventBody = serde_json::from_str(&self.body).map_err(|e| {
            StoreError::Corrupt(format!("invocation {invocation_id} event {seq}: {e}"))
        })?;
        Ok(StoredEvent {
            committed_at: UnixMillis(committed_at),
            event: Event { seq, body },
        })
    }
}

/// An idempotency key as stored: prefixed with its tenant, so the column's one unique
/// index makes keys unique per tenant. The prefix is `<chars>:<tenant>:` with the tenant's
/// length in characters (what SQL's `length()` counts, so a migration can write it too):
/// no tenant name, whatever its characters, makes one tenant's key another's.
pub(crate) fn scoped_key(tenant: &str, key: &str) -> String {
    format!("{}:{tenant}:{key}", tenant.chars().count())
}

/// The caller's key inside a stored one; `None` if it is not `tenant`'s.
fn unscoped_key<'a>(tenant: &str, stored: &'a str) -> Option<&'a str> {
    let (count, rest) = stored.split_once(':')?;
    if count != tenant.chars().count().to_string() {
        return None;
    }
    rest.strip_prefix(tenant)?.strip_prefix(':')
}

/// The SQL dialects [`ListQuery`] writes for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// The filter and order of one `list` page: `WHERE ... ORDER BY` built from fixed
/// fragments (never from the request's text, which is bound), and the values to bind in
/// order, the limit after them. Tenant and state have indexes that serve them; the reason
/// and the creation time filter the rows the ID order walks.
#[derive(Debug)]
pub(crate) struct ListQuery {
    pub(crate) clauses: String,
    pub(crate) values: Vec<String>,
}

impl ListQuery {
    pub(crate) fn new(request: &ListRequest, dialect: Dialect) -> ListQuery {
        let mut conditions = Vec::new();
        let mut values = Vec::new();
        let mut bind = |condition: &str, value: String| {
            values.push(value);
            let placeholder = match dialect {
                Dialect::Sqlite => "?".to_owned(),
                Dialect::Postgres => format!("${}", values.len()),
            };
            conditions.push(condition.replace('?', &placeholder));
        };
        if let Some(tenant) = &request.tenant {
            bind("tenant = ?", tenant.clone());
        }
        if let Some(state) = request.state {
            bind("state = ?", state_text(state).to_owned());
        }
        if let Some(reason) = request.reason {
            let condition = match dialect {
                Dialect::Sqlite => "json_extract(end_record, '$.reason') = ?",
                Dialect::Postgres => "end_record::jsonb ->> 'reason' = ?",
            };
            bind(condition, reason.as_str().to_owned());
        }
        // `created_at` has no index of its own: a bound far in the past walks the newer
        // invocations in ID order until the page is full.
        let created = |bound: UnixMillis| bound.0.min(i64::MAX as u64).to_string();
        let cast = match dialect {
            Dialect::Sqlite => "",
            Dialect::Postgres => "::bigint",
        };
        if let Some(from) = request.created_from {
            bind(&format!("created_at >= ?{cast}"), created(from));
        }
        if let Some(before) = request.created_before {
            bind(&format!("created_at < ?{cast}"), created(before));
        }
        if let Some(before) = request.before {
            let condition = match dialect {
                Dialect::Sqlite => "invocation_id < ?",
                Dialect::Postgres => "invocation_id < ?::uuid",
            };
            bind(condition, before.hyphenated().to_string());
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        let limit = match dialect {
            Dialect::Sqlite => "?".to_owned(),
            Dialect::Postgres => format!("${}", values.len() + 1),
        };
        ListQuery {
            clauses: format!("{filter} ORDER BY invocation_id DESC LIMIT {limit}"),
            values,
        }
    }
}

/// The record a fresh `create` stored: running, version 0, no epoch yet.
pub(crate) fn fresh_record(new: NewInvocation) -> InvocationRecord {
    let created_at = UnixMillis(u64::try_from(time_to_i64(new.created_at)).unwrap_or(0));
    InvocationRecord {
        invocation_id: new.invocation_id,
        tenant: new.tenant,
        idempotency_key: new.idempotency_key,
        request_digest: new.request_digest,
        spec: new.spec,
        state: InvocationState::Running,
        version: 0,
        lease_epoch: 0,
        totals: Totals::default(),
        end: None,
        cancel_requested_at: None,
        cancel_reason: String::new(),
        created_at,
        updated_at: created_at,
    }
}

/// The answer to a create whose key is taken: the same request gets the same invocation.
pub(crate) fn idempotent_answer(
    new: &NewInvocation,
    existing: InvocationRecord,
) -> Result<Created, StoreError> {
    if existing.request_digest == new.request_digest {
        Ok(Created::Existing(existing))
    } else {
        Err(StoreError::IdempotencyConflict {
            key: existing.idempotency_key.unwrap_or_default(),
            existing: existing.invocation_id,
        })
    }
}

/// Checks the events continue the log from `expected_version` and encodes them as
/// `(seq, body JSON)`.
pub(crate) fn encode_events(append: &Append<'_>) -> Result<Vec<(i64, String)>, StoreError> {
    if append.events.is_empty() {
        return Err(StoreError::MalformedAppend(
            "an append needs at least one event".into(),
        ));
    }
    if append.events.len() > MAX_EVENTS_PER_APPEND {
        return Err(StoreError::MalformedAppend(format!(
            "{} events in one append; at most {MAX_EVENTS_PER_APPEND} are allowed",
            append.events.len()
        )));
    }
    let mut rows = Vec::with_capacity(append.events.len());
    let mut expected = append.expected_version;
    for event in append.events {
        expected = expected
            .checked_add(1)
            .ok_or_else(|| StoreError::MalformedAppend("seq overflows".into()))?;
        if event.seq != expected {
            return Err(StoreError::MalformedAppend(format!(
                "event seq {} where {expected} was expected (the append extends version {})",
                event.seq, append.expected_version
            )));
        }
        rows.push((counter_to_i64(event.seq, "seq")?, to_json(&event.body)?));
    }
    Ok(rows)
}

/// The answer to a write whose writer has stopped.
pub(crate) fn closed() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

/// What every write of a group gets when the group's statement or commit failed: its own
/// copy of the error, which is not `Clone`.
pub(crate) fn group_failure(error: &dyn std::fmt::Display) -> StoreError {
    StoreError::Database(sqlx::Error::Io(std::io::Error::other(format!(
        "the group commit failed: {error}"
    ))))
}

/// An invocation row's protocol state as read: state, version and lease epoch.
pub(crate) type StoredState = (String, i64, i64);

/// A [`StoredState`] decoded, or `Corrupt` naming the invocation, so a damaged row fails
/// only the writes to that invocation.
pub(crate) fn decode_state(
    (state, version, lease_epoch): &StoredState,
    invocation_id: Uuid,
) -> Result<(InvocationState, u64, u64), StoreError> {
    Ok((
        parse_state(state, invocation_id)?,
        stored_u64(*version, "version", invocation_id)?,
        stored_u64(*lease_epoch, "lease_epoch", invocation_id)?,
    ))
}

/// One append, encoded and checked for form before any connection is taken: what both
/// backends' writers bind, so they spend their time on SQL only.
pub(crate) struct EncodedAppend {
    pub(crate) invocation_id: Uuid,
    pub(crate) id_text: String,
    pub(crate) expected_version: u64,
    pub(crate) lease_epoch: u64,
    pub(crate) epoch_column: i64,
    /// `(seq, body JSON)`, seq `expected_version + 1` onwards.
    pub(crate) rows: Vec<(i64, String)>,
    pub(crate) new_version: i64,
    pub(crate) totals: String,
    /// The row's state, end and wait after this append.
    pub(crate) after: After,
    pub(crate) committed_at: i64,
}

impl EncodedAppend {
    pub(crate) fn new(invocation_id: Uuid, append: &Append<'_>) -> Result<Self, StoreError> {
        let rows = encode_events(append)?;
        Ok(EncodedAppend {
            invocation_id,
            id_text: invocation_id.hyphenated().to_string(),
            expected_version: append.expected_version,
            lease_epoch: append.lease_epoch,
            epoch_column: counter_to_i64(append.lease_epoch, "lease epoch")?,
            new_version: rows.last().map_or(0, |(seq, _)| *seq),
            rows,
            totals: to_json(&append.totals)?,
            after: after_append(append.events)?,
            committed_at: time_to_i64(append.committed_at),
        })
    }

    /// The checks of `EventStore::append` against the row as stored, in their order:
    /// ended, lease epoch (fencing), version.
    pub(crate) fn check(
        &self,
        state: InvocationState,
        version: u64,
        lease_epoch: u64,
    ) -> Result<(), StoreError> {
        let invocation_id = self.invocation_id;
        match state {
            InvocationState::Ended => return Err(StoreError::Ended(invocation_id)),
            InvocationState::Running | InvocationState::Waiting => {}
        }
        if self.lease_epoch < lease_epoch {
            return Err(StoreError::StaleEpoch {
                invocation_id,
                presented: self.lease_epoch,
                current: lease_epoch,
            });
        }
        if self.expected_version != version {
            return Err(StoreError::VersionConflict {
                invocation_id,
                expected: self.expected_version,
                actual: version,
            });
        }
        Ok(())
    }
}

/// What an append leaves the invocation row saying.
pub(crate) struct After {
    /// Its state.
    pub(crate) state: InvocationState,
    /// The end it stores (a waiting or a final one), as JSON.
    pub(crate) end: Option<String>,
    /// Until when it waits, for a waiting end.
    pub(crate) wait_until: Option<i64>,
}

/// The row's state, end and wait after appending `events`.
pub(crate) fn after_append(events: &[Event]) -> Result<After, StoreError> {
    Ok(match ended_record(events)? {
        None => After {
            state: InvocationState::Running,
            end: None,
            wait_until: None,
        },
        Some(end) => After {
            state: if end.waits() {
                InvocationState::Waiting
            } else {
                InvocationState::Ended
            },
            end: Some(to_json(end)?),
            wait_until: end.wait.map(|wait| time_to_i64(wait.until)),
        },
    })
}

/// The end record among the events, which may only be the last one.
fn ended_record(events: &[Event]) -> Result<Option<&EndRecord>, StoreError> {
    let mut end = None;
    for (index, event) in events.iter().enumerate() {
        match &event.body {
            EventBody::Ended(record) if index + 1 == events.len() => end = Some(record),
            EventBody::Ended(_) => {
                return Err(StoreError::MalformedAppend(format!(
                    "event {} is Ended but not the last event of the append",
                    event.seq
                )));
            }
            EventBody::Turn(_)
            | EventBody::BatchStarted(_)
            | EventBody::ApprovalResolved(_)
            | EventBody::ClarificationAnswered(_) => {}
        }
    }
    Ok(end)
}

pub(crate) fn parse_id(text: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(text)
        .map_err(|e| StoreError::Corrupt(format!("invocation ID {text:?} is not a UUID: {e}")))
}

pub(crate) fn parse_state(text: &str, invocation_id: Uuid) -> Result<InvocationState, StoreError> {
    match text {
        "running" => Ok(InvocationState::Running),
        "waiting" => Ok(InvocationState::Waiting),
        "ended" => Ok(InvocationState::Ended),
        other => Err(StoreError::Corrupt(format!(
            "invocation {invocation_id}: unknown state {other:?}"
        ))),
    }
}

pub(crate) const fn state_text(state: InvocationState) -> &'static str {
    match state {
        InvocationState::Running => "running",
        InvocationState::Waiting => "waiting",
        InvocationState::Ended => "ended",
    }
}

pub(crate) fn stored_u64(value: i64, column: &str, invocation_id: Uuid) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| {
        StoreError::Corrupt(format!(
            "invocation {invocation_id}: {column} is negative ({value})"
        ))
    })
}

pub(crate) fn counter_to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::MalformedAppend(format!("{what} {value} is out of range")))
}

/// Times past i64::MAX milliseconds are clamped rather than refused: see the module doc.
pub(crate) fn time_to_i64(time: UnixMillis) -> i64 {
    i64::try_from(time.0).unwrap_or(i64::MAX)
}

/// A `from_seq` past i64::MAX is past every stored seq.
pub(crate) fn from_seq_to_i64(from_seq: u64) -> i64 {
    i64::try_from(from_seq).unwrap_or(i64::MAX)
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    // Serializing the engine's plain data types cannot fail; mapped rather than unwrapped.
    serde_json::to_string(value)
        .map_err(|e| StoreError::MalformedAppend(format!("cannot encode as JSON: {e}")))
}

/// What a claim must do to the stored invocation.
pub(crate) enum Claim {
    /// Nothing: it does not run (ended, or waiting), or the epoch is already the one
    /// stored.
    Unchanged,
    /// Raise the stored epoch to the claimed one.
    Raise,
}

/// The rule of [`crate::EventStore::claim`], shared by both backends.
pub(crate) fn claim_check(
    record: &InvocationRecord,
    lease_epoch: u64,
) -> Result<Claim, StoreError> {
    // Nothing to run: over, or waiting for a human.
    if record.state != InvocationState::Running {
        return Ok(Claim::Unchanged);
    }
    match record.lease_epoch.cmp(&lease_epoch) {
        std::cmp::Ordering::Greater => Err(StoreError::StaleEpoch {
            invocation_id: record.invocation_id,
            presented: lease_epoch,
            current: record.lease_epoch,
        }),
        std::cmp::Ordering::Equal => Ok(Claim::Unchanged),
        std::cmp::Ordering::Less => Ok(Claim::Raise),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_keys_read_back_only_under_their_tenant() {
        for (tenant, key) in [("acme", "k"), ("", "k"), ("a:b", "c"), ("ü", "x:y")] {
            let stored = scoped_key(tenant, key);
            assert_eq!(unscoped_key(tenant, &stored), Some(key), "{tenant:?}");
        }
        assert_eq!(unscoped_key("other", &scoped_key("acme", "k")), None);
        assert_eq!(
            unscoped_key("acme", "k"),
            None,
            "an unscoped key is corrupt"
        );
    }

    #[test]
    fn no_two_tenants_share_a_stored_key() {
        // Without the length, tenant "a:b" with key "c" and tenant "a" with key "b:c"
        // would be stored alike.
        assert_ne!(scoped_key("a:b", "c"), scoped_key("a", "b:c"));
        assert_ne!(scoped_key("", "1::k"), scoped_key("1", "k"));
    }
}
