//! What a human may write to an invocation that waits: the events a reply, a cancel or
//! the end of the wait bound commit after a waiting end, checked against that end.
//!
//! The shell appends the event with the waiting end's version as the expected one, so of
//! two replies to the same wait exactly one is committed; a restore applies it with the
//! same rules as [`crate::Invocation::restore`].

use crate::canonical::Fingerprint;
use crate::event::{Answer, EndRecord, EventBody, Resolution};
use crate::outcome::InputAction;
use crate::terminal::TerminalReason;
use crate::time::UnixMillis;

/// A human's reply to a waiting invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Approve or deny the pending proposal, named by its digest.
    Resolve {
        /// The digest the human saw; it must be the pending one.
        proposal: Fingerprint,
        /// Run the calls (`true`) or not.
        approved: bool,
        /// Who resolves it.
        actor: String,
        /// Optional words for the model.
        comment: String,
    },
    /// Answer the pending question.
    Answer {
        /// The answer: words for the model, or the content a tool asked for (a JSON
        /// object, as text, that the shell checked against the requested schema; empty
        /// unless accepted).
        answer: String,
        /// Who answers.
        actor: String,
        /// For a tool's question, what the person did with it; `None` answers the
        /// model's.
        action: Option<InputAction>,
    },
}

/// How a wait ends without a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitEnd {
    /// A caller cancelled it, with this reason (empty: none given).
    Cancelled(String),
    /// Its wait bound passed.
    Expired,
}

/// Why a reply or a wait end does not fit the invocation's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The invocation does not wait for a human (it runs, or it has ended for good).
    #[error("the invocation does not wait for a human")]
    NotWaiting,
    /// It waits for the other kind of reply.
    #[error("the invocation waits for {waits_for}, not for {given}")]
    OtherKind {
        /// What it waits for.
        waits_for: &'static str,
        /// What was given.
        given: &'static str,
    },
    /// The digest is not the pending proposal's.
    #[error("proposal {given} is not the pending one ({pending})")]
    WrongProposal {
        /// The pending proposal.
        pending: Fingerprint,
        /// The digest given.
        given: Fingerprint,
    },
    /// Content given with a decline or a cancel, or none with an accept.
    #[error("{0}")]
    Content(&'static str),
    /// The wait bound has not passed yet.
    #[error("the wait bound has not passed: it passes at {0:?}")]
    NotExpired(UnixMillis),
}

/// The event that commits `reply` to an invocation whose last event is `end`.
pub fn reply(end: &EndRecord, reply: Reply, now: UnixMillis) -> Result<EventBody, ReplyError> {
    let wait = end.wait.ok_or(ReplyError::NotWaiting)?;
    let waited_ms = now.0.saturating_sub(wait.since.0);
    match (end.reason, reply) {
        (
            TerminalReason::ApprovalRequired,
            Reply::Resolve {
                proposal,
                approved,
                actor,
                comment,
            },
        ) => match end.proposal {
            Some(pending) if pending == proposal => Ok(EventBody::ApprovalResolved(Resolution {
                proposal,
                approved,
                actor,
                comment,
                waited_ms,
            })),
            Some(pending) => Err(ReplyError::WrongProposal {
                pending,
                given: proposal,
            }),
            None => Err(ReplyError::NotWaiting),
        },
        (
            TerminalReason::ClarificationRequired,
            Reply::Answer {
                answer,
                actor,
                action,
            },
        ) => {
            match (end.input.is_some(), action) {
                (true, None) => {
                    return Err(ReplyError::OtherKind {
                        waits_for: "a tool's input",
                        given: "an answer for the model",
                    });
                }
                (false, Some(_)) => {
                    return Err(ReplyError::OtherKind {
                        waits_for: "an answer for the model",
                        given: "a tool's input",
                    });
                }
                (true, Some(InputAction::Accept)) if answer.is_empty() => {
                    return Err(ReplyError::Content("an accepted input needs its content"));
                }
                (true, Some(InputAction::Decline | InputAction::Cancel)) if !answer.is_empty() => {
                    return Err(ReplyError::Content(
                        "a declined or cancelled input has no content",
                    ));
                }
                (true, Some(_)) | (false, None) => {}
            }
            Ok(EventBody::ClarificationAnswered(Answer {
                answer,
                actor,
                waited_ms,
                action,
            }))
        }
        (TerminalReason::ApprovalRequired, Reply::Answer { .. }) => Err(ReplyError::OtherKind {
            waits_for: "an approval",
            given: "an answer",
        }),
        (TerminalReason::ClarificationRequired, Reply::Resolve { .. }) => {
            Err(ReplyError::OtherKind {
                waits_for: "an answer",
                given: "an approval",
            })
        }
        (_, Reply::Resolve { .. } | Reply::Answer { .. }) => Err(ReplyError::NotWaiting),
    }
}

/// The final end that `why` commits to an invocation whose last event is the waiting
/// `end`.
pub fn end_wait(end: &EndRecord, why: WaitEnd, now: UnixMillis) -> Result<EventBody, ReplyError> {
    let wait = end.wait.ok_or(ReplyError::NotWaiting)?;
    let (reason, detail) = match why {
        WaitEnd::Cancelled(reason) if reason.is_empty() => (
            TerminalReason::Cancelled,
            crate::machine::CANCELLED.to_owned(),
        ),
        WaitEnd::Cancelled(reason) => (TerminalReason::Cancelled, reason),
        WaitEnd::Expired if now < wait.until => return Err(ReplyError::NotExpired(wait.until)),
        WaitEnd::Expired => {
            let what = match (end.reason, end.proposal) {
                (TerminalReason::ApprovalRequired, Some(proposal)) => {
                    format!("an approval of proposal {proposal}")
                }
                _ => format!("an answer to {:?}", end.detail),
            };
            let waited = wait.until.0.saturating_sub(wait.since.0);
            (
                TerminalReason::DeadlineExceeded,
                format!(
                    "waited for {what} longer than the wait bound of {} s",
                    waited.div_ceil(1000)
                ),
            )
        }
    };
    Ok(EventBody::Ended(EndRecord {
        reason,
        detail,
        answer: None,
        proposal: None,
        wait: None,
        accepted_by: Vec::new(),
        input: None,
    }))
}
